"""A column declared never missing (``"nullable": false``): the metadata, its JSON Schema and the
curator's check learn the key; a synthetic table has no missing cell for it, so it never invents a
missing value there; NULLs the data holds anyway are counted, row by row, in the column's first
cell (first category, or the first bin) — never an error after payment.

Every test here fails on the code before the key existed (``Numeric(..., nullable=False)`` and
``{"nullable": false}`` were refused). Deterministic: fixed seeds; no assertion on a noisy value
beyond the absence of missing values, which does not depend on the noise."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import dpkit as dp
from dpkit.analytics import Categorical, Metadata, Numeric
from dpkit.analytics.check import check_data
from dpkit.errors import InvalidParameterError
from dpkit.synth import Domain, Synthesizer
from dpkit.synth.measure import TableCounts
from synth._frames import correlated_frame

jsonschema = pytest.importorskip("jsonschema")

SCHEMA = json.loads((Path(__file__).resolve().parents[2] / "docs" / "metadata.schema.json").read_text(encoding="utf-8"))

STRICT = Metadata(
    columns={
        "sex": Categorical(("F", "M"), nullable=False),
        "age": Numeric(0, 100, nullable=False),
        "city": Categorical(("a", "b", "c"), nullable=False),
    },
    row_level=True,
)


# -- the metadata, its schema, the check -------------------------------------------------------------


def test_the_key_is_read_written_and_validated() -> None:
    doc = {
        "row_level": True,
        "columns": {
            "age": {"type": "numeric", "lower": 0, "upper": 100, "nullable": False},
            "sex": {"type": "categorical", "categories": ["F", "M"], "nullable": False},
            "zip": {"type": "categorical", "nullable": True},
        },
    }
    assert list(jsonschema.Draft202012Validator(SCHEMA).iter_errors(doc)) == []
    meta = Metadata.from_dict(doc)
    assert meta.columns["age"] == Numeric(0, 100, nullable=False) and not meta.columns["sex"].nullable
    assert meta.columns["zip"].nullable and meta.columns["zip"] == Categorical()  # the default, unsaid
    out = meta.to_dict()["columns"]
    assert out["age"]["nullable"] is False and out["sex"]["nullable"] is False and "nullable" not in out["zip"]
    assert Metadata.from_dict(meta.to_dict()) == meta
    assert repr(meta.columns["age"]) == "Numeric(lower=0.0, upper=100.0, nullable=False)"
    assert repr(Numeric(0, 1)) == "Numeric(lower=0.0, upper=1.0)"


@pytest.mark.parametrize("bad", ["no", 0, 1, None, [False]])
@pytest.mark.parametrize("kind", ["numeric", "categorical"])
def test_a_bad_value_is_refused_by_the_schema_and_the_loader_naming_nullable(kind: str, bad: object) -> None:
    doc = {"columns": {"a": {"type": kind, "nullable": bad}}}
    assert list(jsonschema.Draft202012Validator(SCHEMA).iter_errors(doc)) != []
    with pytest.raises(InvalidParameterError) as err:
        Metadata.from_dict(doc)
    assert err.value.name == "columns.a.nullable", err.value
    with pytest.raises(InvalidParameterError) as err:
        (Numeric if kind == "numeric" else Categorical)(nullable=bad)  # type: ignore[arg-type]
    assert err.value.name == "nullable"


def test_the_check_counts_the_nulls_of_a_column_declared_never_missing() -> None:
    frame = pd.DataFrame({"age": [30.0, None, 50.0, None], "sex": ["F", "M", None, "F"]})
    meta = Metadata(columns={"age": Numeric(0, 100, nullable=False), "sex": Categorical(("F", "M"))}, row_level=True)
    report = check_data(frame, meta)
    age, sex = report.columns
    assert (age.null, age.nullable, age.ok) == (2, False, False)  # its NULLs contradict the declaration
    assert (sex.null, sex.nullable, sex.ok) == (1, True, True)  # a legitimate missing value
    assert not report.ok and report.to_dict()["columns"][0]["nullable"] is False
    assert "age: declared nullable: false, but 2 rows are NULL" in report.to_text()


def test_a_session_reads_the_column_as_before() -> None:
    """Queries ignore the key: the same answers, from the same seed, as without it."""
    frame = correlated_frame(500)
    frame.loc[:9, "age"] = np.nan
    answers = []
    for meta in (STRICT, Metadata(columns={k: Numeric(0, 100) if k == "age" else Categorical(v.categories)  # type: ignore[union-attr]
                                           for k, v in STRICT.columns.items()}, row_level=True)):  # fmt: skip
        s = dp.Session(frame, metadata=meta, budget=dp.Budget(epsilon=2.0), rng=np.random.default_rng(3))
        answers.append(s.sql("SELECT COUNT(*) AS n, SUM(age) AS total, AVG(age) AS mean FROM data", epsilon=1.0))
    assert answers[0].to_dict() == answers[1].to_dict()


# -- the synthetic table ------------------------------------------------------------------------------


def test_a_column_declared_never_missing_has_no_missing_cell() -> None:
    d = Domain.from_metadata(STRICT, bins={"age": [0, 20, 40, 100]})
    assert d.shape == (2, 3, 3)
    assert d.columns[1].labels() == ["[0, 20)", "[20, 40)", "[40, 100]"]
    assert [c.missing for c in d.columns] == [None, None, None] and [c.null_cell for c in d.columns] == [0, 0, 0]
    mixed = Domain.from_metadata(Metadata(columns={**STRICT.columns, "kids": Numeric(0, 6)}, row_level=True))
    assert mixed.columns[3].missing == mixed.columns[3].size - 1  # the default keeps its missing cell


@pytest.mark.parametrize("method", ["aim", "mst"])
def test_the_synthetic_table_invents_no_missing_value(method: str) -> None:
    syn = Synthesizer(
        epsilon=0.5, delta=1e-9, metadata=STRICT, bins={"age": 10}, method=method, rng=np.random.default_rng(1)
    ).fit(correlated_frame(2_000))
    rows = syn.sample(20_000)
    assert not rows.isna().any().any(), rows.isna().sum()
    assert set(rows["sex"]) <= {"F", "M"} and set(rows["city"]) <= {"a", "b", "c"}
    assert syn.report is not None
    ones = {m.columns[0]: m.cells for m in syn.report.measurements if m.how == "one-way"}
    assert ones == {"sex": 2, "age": 10, "city": 3}


def test_integers_of_a_column_never_missing_are_never_na() -> None:
    syn = Synthesizer(
        epsilon=1.0, delta=1e-9, metadata=STRICT, bins={"age": 5}, integers=["age"], rng=np.random.default_rng(2)
    ).fit(correlated_frame(1_000))
    ages = syn.sample(5_000)["age"]
    assert str(ages.dtype) == "Int64" and not ages.isna().any()


def _with_nulls(frame: pd.DataFrame) -> pd.DataFrame:
    out = frame.copy()
    out.loc[:4, "age"] = np.nan  # NULL in a column declared never missing
    out.loc[5:9, "sex"] = None
    out.loc[10:12, "city"] = "z"  # not a declared category either
    return out


def test_nulls_in_a_column_declared_never_missing_go_to_its_first_cell() -> None:
    """The curator was wrong: the data hold NULLs there. Each such row is counted in the
    column's first cell (first category / first bin), by itself; reading never fails."""
    frame = correlated_frame(300)
    domain = Domain.from_metadata(STRICT, bins={"age": [0, 20, 40, 100]})
    clean = TableCounts(frame, STRICT, domain)
    clean.prepare(salt=1)
    dirty = TableCounts(_with_nulls(frame), STRICT, domain)
    dirty.prepare(salt=1)
    age = np.bincount(np.clip(np.searchsorted([20, 40], frame["age"].to_numpy(), side="right"), 0, 2), minlength=3)
    assert clean.counts((1,)).tolist() == age.tolist()
    moved = np.bincount(
        np.clip(np.searchsorted([20, 40], frame["age"][:5].to_numpy(), side="right"), 0, 2), minlength=3
    )
    assert dirty.counts((1,)).tolist() == (age - moved + np.array([5, 0, 0])).tolist()
    sex = np.delete(frame["sex"].to_numpy(), range(5, 10))  # rows 5–9 are NULL in the dirty copy
    assert dirty.counts((0,)).tolist() == [int((sex == "F").sum()) + 5, int((sex == "M").sum())]
    city = frame["city"].to_numpy()
    expected_city = [int((city == c).sum()) - int((city[10:13] == c).sum()) for c in ("a", "b", "c")]
    expected_city[0] += 3
    assert dirty.counts((2,)).tolist() == expected_city
    for t in (clean, dirty):
        t.close()


def test_neighbours_with_and_without_a_person_of_nulls_both_synthesize() -> None:
    """D and D plus one person whose values are all NULL (in columns declared never missing):
    both fit and sample without error, and that person changes each marginal by one count in
    one cell (the sensitivity the noise is calibrated to)."""
    d = correlated_frame(1_000)
    plus = pd.concat([d, pd.DataFrame({"sex": [None], "age": [np.nan], "city": [None]})], ignore_index=True)
    domain = Domain.from_metadata(STRICT, bins={"age": 4})
    counts = []
    for data in (d, plus):
        syn = Synthesizer(epsilon=1.0, delta=1e-9, metadata=STRICT, bins={"age": 4}, rng=np.random.default_rng(5))
        rows = syn.fit(data).sample(500)
        assert len(rows) == 500 and not rows.isna().any().any()
        t = TableCounts(data, STRICT, domain)
        t.prepare(salt=1)
        counts.append([t.counts(c) for c in [(0,), (1,), (2,), (0, 1), (0, 2), (1, 2)]])
        t.close()
    for a, b in zip(*counts, strict=True):
        diff = b - a
        assert diff.sum() == 1 and diff.max() == 1 and diff.min() == 0 and diff.flat[0] == 1  # the first cell
