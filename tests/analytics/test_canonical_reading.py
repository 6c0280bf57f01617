"""Values are read by the declared type whatever the physical type: dtypes, −0.0, NaN, surrogates.

Each test puts one person into a table and checks, with exact engine aggregates (no noise), that the
rows and keys change only by that person's own bounded contribution; each names the broken reading it
catches (the power check is the old expression, run beside the new one). Deterministic.
"""

from __future__ import annotations

import dataclasses

import duckdb
import numpy as np
import pandas as pd
import pytest

import dpkit as dp
import dpkit.analytics.execute as execute
from dpkit.analytics import Categorical, Metadata, Numeric
from dpkit.analytics.engines.duckdb import DuckDBEngine, _read
from dpkit.analytics.engines.pandas_source import text_column
from dpkit.analytics.plan import AggregationPlan, GroupKey


def plan(unit: str | None, groups: tuple[str, ...] = (), *, portable: bool = False, salt: int = 7) -> AggregationPlan:
    return AggregationPlan(
        unit=unit,
        where=None,
        groups=tuple(GroupKey(g) for g in groups),
        key_filter=tuple(None for _ in groups),
        max_groups=1,
        max_rows=1,
        sums=(),
        values=(),
        salt=salt,
        portable=portable,
    )


@pytest.mark.parametrize("portable", [False, True])
def test_minus_zero_is_one_unit_under_bounding(portable: bool) -> None:
    """Item 7 of the reading issue: a person whose unit is written 0.0 in one row and −0.0 in
    another is one person: with max_rows=1 they keep one row, whatever the salt (100 salts)."""
    frame = pd.DataFrame({"u": [0.0, -0.0, 1.0, float("nan")], "k": ["x", "x", "y", "z"]})
    engine = DuckDBEngine(frame)
    engine.bind({"u": "unit", "k": "string"}, strip_strings=False)
    for salt in range(100):
        out = engine.aggregate(plan("u", ("k",), portable=portable, salt=salt))
        got = dict(zip(out["g0"], out["rows"], strict=True))
        assert got == {"x": 1, "y": 1}, got  # the NaN unit is no one: its row is dropped


def test_the_old_unit_read_split_minus_zero_in_portable_mode() -> None:
    """The power check: kept native, −0.0 and 0.0 hash to different md5 texts."""
    with duckdb.connect() as con:
        old = con.sql(
            "SELECT count(DISTINCT md5(concat_ws('|', 1, x))) FROM (VALUES (0.0::DOUBLE), ('-0.0'::DOUBLE)) t(x)"
        )
        new = _read("x", "unit", "numeric", False, "DOUBLE")
        now = con.sql(
            f"SELECT count(DISTINCT md5(concat_ws('|', 1, {new}))) FROM (VALUES (0.0::DOUBLE), ('-0.0'::DOUBLE)) t(x)"
        )
        assert old.fetchall() == [(2,)] and now.fetchall() == [(1,)]


def no_noise(monkeypatch: pytest.MonkeyPatch) -> None:
    """The internal hook: releases the exact integers (the rest of the release path unchanged)."""
    original = execute._release

    def exact(mech, ints, beta, src):  # type: ignore[no-untyped-def]
        return dataclasses.replace(original(mech, ints, beta, src), values=np.asarray(ints, dtype=np.float64))

    monkeypatch.setattr(execute, "_release", exact)


META = Metadata(columns={"code": Categorical(("1", "2")), "age": Numeric(0, 100)}, row_level=True)


def counts(frame: pd.DataFrame) -> dict[str, int]:
    s = dp.Session(frame, metadata=META, budget=dp.Budget(epsilon=1e9))
    r = s.sql("SELECT code, COUNT(*) AS n FROM data GROUP BY code", epsilon=1e6)
    return {str(k): int(v) for k, v in zip(r.table["code"], r.table["n"], strict=True)}


def test_a_nan_that_turns_a_column_float_changes_no_other_row(monkeypatch: pytest.MonkeyPatch) -> None:
    """Item 6: int64 codes declared as string categories; one more row with NaN makes the column
    float64. Every other row still reads "1" or "2" (before: "1.0", and the counts fell to 0)."""
    no_noise(monkeypatch)
    d = pd.DataFrame({"code": np.repeat([1, 2], 200), "age": 30})
    d_plus = pd.concat([d, pd.DataFrame({"code": [np.nan], "age": [30]})], ignore_index=True)
    assert d_plus["code"].dtype == np.float64
    assert counts(d) == counts(d_plus) == {"1": 200, "2": 200}
    # the text of a float column as DuckDB writes it is what the old rule read: the power check
    with duckdb.connect() as con:
        assert con.sql("SELECT CAST(CAST(1 AS DOUBLE) AS VARCHAR)").fetchall() == [("1.0",)]


def test_numbers_read_as_text_are_canonical() -> None:
    with duckdb.connect() as con:
        for sql_type, value, text in [
            ("DOUBLE", "1.0", "1"),
            ("DOUBLE", "'-0.0'", "0"),
            ("DOUBLE", "1.5", "1.5"),
            ("DOUBLE", "'nan'", None),
            ("DOUBLE", "'inf'", None),
            ("FLOAT", "2.0", "2"),
            ("DECIMAL(10,2)", "3.00", "3"),
            ("BIGINT", "-4", "-4"),
        ]:
            expr = _read("x", "string", "numeric", False, sql_type)
            assert con.sql(f"SELECT {expr} FROM (SELECT CAST({value} AS {sql_type}) AS x)").fetchall() == [(text,)]


def test_a_lone_surrogate_is_decoded_not_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    """Item 10: a pandas object column holding a lone surrogate used to fail (pyarrow's
    UnicodeEncodeError) for every query; now that value alone is decoded (U+FFFD)."""
    no_noise(monkeypatch)
    col = pd.Series(["1", "\ud800x", None], dtype=object)
    assert text_column(col).tolist()[0] == "1" and "\ufffd" in text_column(col).tolist()[1]
    with pytest.raises(UnicodeEncodeError):  # the power check: the plain conversion fails
        col.astype(pd.StringDtype("pyarrow"))
    d = pd.DataFrame({"code": pd.Series(["1"] * 5 + ["2"] * 5, dtype=object), "age": 30})
    d_plus = pd.concat([d, pd.DataFrame({"code": pd.Series(["\ud800"], dtype=object), "age": [30]})], ignore_index=True)
    assert counts(d) == counts(d_plus) == {"1": 5, "2": 5}
