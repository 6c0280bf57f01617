"""Binned group keys in SQL: ``BIN(c, n)`` (n equal-width bins over the declared bounds) and
``BIN(c, e0, e1, ...)`` (explicit edges) are exactly ``group_by(c, bins=...)`` — the same spec,
the same labels, the same seeded release — and every malformed BIN is refused before anything is
paid. The JSON form of the spec carries the same bins."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

import dpkit as dp
from dpkit.analytics import Categorical, Count, Mean, Metadata, Numeric, QueryLimits, QueryOptions, QuerySpec
from dpkit.analytics.building import build
from dpkit.analytics.pricing import price
from dpkit.analytics.sql import compile_spec
from dpkit.errors import InvalidParameterError, LimitExceededError

META = Metadata(
    columns={"hours": Numeric(0, 100), "age": Numeric(18, 90), "sex": Categorical(("F", "M")), "free": Numeric()},
    row_level=True,
)
QUARTERS = ["[0, 25)", "[25, 50)", "[50, 75)", "[75, 100]"]


def frame() -> pd.DataFrame:
    rng = np.random.default_rng(3)
    n = 600
    return pd.DataFrame(
        {
            "hours": rng.integers(0, 101, n).astype(float),
            "age": rng.integers(18, 91, n).astype(float),
            "sex": rng.choice(np.array(["F", "M"]), n),
            "free": rng.normal(size=n),
        }
    )


def session(limits: QueryLimits | None = None) -> dp.Session:
    return dp.Session(
        frame(), metadata=META, budget=dp.Budget(epsilon=100.0), rng=np.random.default_rng(0), limits=limits
    )


# -- the same spec as group_by(bins=) --------------------------------------------------------------


@pytest.mark.parametrize(
    "sql, bins",
    [
        ("SELECT BIN(hours, 4) AS b, COUNT(*) FROM data GROUP BY b", 4),
        ("SELECT BIN(hours, 4), COUNT(*) FROM data GROUP BY BIN(hours, 4)", 4),
        ("SELECT COUNT(*) FROM data GROUP BY BIN(hours, 4)", 4),
        ("select bin(HOURS, 4) as B, count(*) from data group by b", 4),
        ("SELECT BIN(hours, 0, 25, 50.0, 7.5e1, 100) AS b, COUNT(*) FROM data GROUP BY b", [0, 25, 50, 75, 100]),
        ("SELECT BIN(hours, -10, 0, 12.5, 100) AS b, COUNT(*) FROM data GROUP BY b", [-10, 0, 12.5, 100]),
    ],
)
def test_bin_compiles_to_the_spec_of_group_by_bins(sql: str, bins: int | list[float]) -> None:
    s = session()
    spec = compile_spec(s, sql)
    want = bins if isinstance(bins, int) else tuple(float(e) for e in bins)
    assert spec == QuerySpec(aggregates=(Count(),), group_by=("hours",), bins={"hours": want})
    # the JSON form of the same query is the same spec
    assert spec == QuerySpec.from_json(
        {"aggregates": [{"kind": "count"}], "group_by": ["hours"], "bins": {"hours": bins}}
    )
    # and it checks to the builder's query, priced the same
    query = s.query().group_by("hours", bins={"hours": bins})
    assert build(spec, s._declared) == query._built()
    assert price(
        QuerySpec(**{**spec.__dict__, "options": QueryOptions(epsilon=1.0)}), s._declared
    ).cost() == query.cost([Count()], epsilon=1.0)


def test_bin_beside_a_categorical_group_column_keeps_the_group_by_order() -> None:
    s = session()
    spec = compile_spec(s, "SELECT sex, BIN(age, 18, 30, 50, 90) AS a, COUNT(*) FROM data GROUP BY sex, a")
    assert spec.group_by == ("sex", "age") and spec.bins == {"age": (18.0, 30.0, 50.0, 90.0)}
    spec = compile_spec(s, "SELECT COUNT(*) FROM data GROUP BY BIN(age, 3), sex")
    assert spec.group_by == ("age", "sex") and spec.bins == {"age": 3}


# -- the same release -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT BIN(hours, 4) AS b, COUNT(*) FROM data GROUP BY b",
        "SELECT BIN(hours, 4), COUNT(*) FROM data GROUP BY BIN(hours, 4)",
        "SELECT COUNT(*) FROM data GROUP BY BIN(hours, 4)",
        "SELECT BIN(hours, 0, 25, 50, 75, 100) AS b, COUNT(*) FROM data GROUP BY b",
    ],
)
def test_sql_bins_release_what_the_builder_releases(sql: str) -> None:
    by_sql = session().sql(sql, epsilon=1.0, rng=np.random.default_rng(42))
    by_builder = session().histogram("hours", bins=4, epsilon=1.0, rng=np.random.default_rng(42))
    pd.testing.assert_frame_equal(by_sql.table, by_builder.table)  # same keys, labels and seeded noise
    assert list(by_sql.table["hours"]) == QUARTERS
    assert by_sql.epsilon == by_builder.epsilon == 1.0
    # the comparison can tell: another seed, or other bins, give another table
    other_seed = session().sql(sql, epsilon=1.0, rng=np.random.default_rng(43))
    assert not other_seed.table["count"].equals(by_sql.table["count"])
    other_bins = session().sql(
        "SELECT BIN(hours, 5) AS b, COUNT(*) FROM data GROUP BY b", epsilon=1.0, rng=np.random.default_rng(42)
    )
    assert list(other_bins.table["hours"]) != QUARTERS


def test_a_binned_and_a_categorical_group_with_several_aggregates() -> None:
    sql = "SELECT sex, BIN(hours, 2) AS h, COUNT(*) AS n, AVG(age) FROM data GROUP BY sex, h"
    by_sql = session().sql(sql, epsilon=2.0, rng=np.random.default_rng(7))
    by_builder = (
        session()
        .group_by("sex", "hours", bins={"hours": 2})
        .aggregate([Count(name="n"), Mean("age")], epsilon=2.0, rng=np.random.default_rng(7))
    )
    pd.testing.assert_frame_equal(by_sql.table, by_builder.table)
    assert list(zip(by_sql.table["sex"], by_sql.table["hours"], strict=True)) == [
        ("F", "[0, 50)"),
        ("F", "[50, 100]"),
        ("M", "[0, 50)"),
        ("M", "[50, 100]"),
    ]
    assert list(by_sql.table.columns) == [
        "sex",
        "hours",
        "n",
        "n_low",
        "n_high",
        "mean_age",
        "mean_age_low",
        "mean_age_high",
    ]


def test_the_true_counts_fall_in_their_bins() -> None:
    """A check on the data, not only against the builder: with ε = 50 the noise is below 1 with
    probability 1 − e^-50 per bin, so the released counts round to the true ones."""
    f = frame()
    r = session().sql(
        "SELECT BIN(hours, 4) AS b, COUNT(*) FROM data GROUP BY b", epsilon=50.0, rng=np.random.default_rng(1)
    )
    true = [
        int(((f.hours >= lo) & ((f.hours < lo + 25) if lo < 75 else (f.hours <= 100))).sum()) for lo in (0, 25, 50, 75)
    ]
    assert [round(x) for x in r.table["count"]] == true


def test_the_cost_of_a_bin_query_is_its_epsilon_and_spends_nothing() -> None:
    s = session()
    cost = s.sql_cost("SELECT BIN(hours, 4) AS b, COUNT(*) FROM data GROUP BY b", epsilon=0.7)
    assert cost.epsilon == pytest.approx(0.7) and s.spent == (0.0, 0.0)


# -- refusals, before any payment -----------------------------------------------------------------


@pytest.mark.parametrize(
    "sql, fragment, why",
    [
        ("SELECT BIN(hours, 0) AS b, COUNT(*) FROM data GROUP BY b", "BIN(hours, 0)", "whole number >= 1, not 0"),
        ("SELECT BIN(hours, -3) AS b, COUNT(*) FROM data GROUP BY b", "BIN(hours, -3)", "whole number >= 1, not -3"),
        ("SELECT BIN(hours, 2.5) AS b, COUNT(*) FROM data GROUP BY b", "BIN(hours, 2.5)", "whole number >= 1, not 2.5"),
        ("SELECT BIN(hours, 4.0) AS b, COUNT(*) FROM data GROUP BY b", "BIN(hours, 4.0)", "whole number >= 1, not 4.0"),
        ("SELECT BIN(hours, 'ten') AS b, COUNT(*) FROM data GROUP BY b", "BIN(hours, 'ten')", "finite number literals"),
        ("SELECT BIN(hours, TRUE) AS b, COUNT(*) FROM data GROUP BY b", "BIN(hours, TRUE)", "finite number literals"),
        ("SELECT BIN(hours, 1e400) AS b, COUNT(*) FROM data GROUP BY b", "BIN(hours, 1e400)", "finite number literals"),
        ("SELECT BIN(hours, age) AS b, COUNT(*) FROM data GROUP BY b", "BIN(hours, age)", "finite number literals"),
        ("SELECT BIN(hours) AS b, COUNT(*) FROM data GROUP BY b", "BIN(hours)", "a column, then a number of bins"),
        ("SELECT BIN(hours, 50, 10) AS b, COUNT(*) FROM data GROUP BY b", "BIN(hours, 50, 10)", "increasing"),
        ("SELECT BIN(hours, 10, 10) AS b, COUNT(*) FROM data GROUP BY b", "BIN(hours, 10, 10)", "increasing"),
        (f"SELECT BIN(hours, 0, {10**400}) AS b, COUNT(*) FROM data GROUP BY b", "BIN(hours, 0, 1000", "finite number"),
        (
            "SELECT BIN(sex, 3) AS b, COUNT(*) FROM data GROUP BY b",
            "BIN(sex, 3)",
            "numeric column; 'sex' is a string column",
        ),
        ("SELECT BIN(free, 5) AS b, COUNT(*) FROM data GROUP BY b", "BIN(free, 5)", "declared bounds of 'free'"),
        ("SELECT BIN(nope, 5) AS b, COUNT(*) FROM data GROUP BY b", "nope", "unknown column"),
        ("SELECT BIN(data.hours, 5) AS b, COUNT(*) FROM data GROUP BY b", "data.hours", "plain column names"),
        (
            "SELECT COUNT(*) FROM data WHERE BIN(hours, 4) = 1",
            "BIN(hours, 4)",
            "only as a SELECT item or a GROUP BY item",
        ),
        ("SELECT SUM(BIN(hours, 4)) FROM data", "BIN(hours, 4)", "only as a SELECT item or a GROUP BY item"),
        (
            "SELECT COUNT(*) FROM data GROUP BY BIN(BIN(hours, 4), 2)",
            "BIN(hours, 4)",
            "only as a SELECT item or a GROUP BY item",
        ),
        ("SELECT BIN(hours, 4), COUNT(*) FROM data", "BIN(hours, 4)", "not grouped (it is not in GROUP BY)"),
        ("SELECT BIN(hours, 4), COUNT(*) FROM data GROUP BY hours", "BIN(hours, 4)", "grouped as it is"),
        ("SELECT BIN(hours, 5), COUNT(*) FROM data GROUP BY BIN(hours, 4)", "BIN(hours, 5)", "two different BINs"),
        ("SELECT BIN(hours, 4) AS a, BIN(hours, 5) AS b, COUNT(*) FROM data GROUP BY a, b", "b", "two different BINs"),
        (
            "SELECT COUNT(*) FROM data GROUP BY BIN(hours, 4), BIN(hours, 0, 50, 100)",
            "BIN(hours, 0, 50, 100)",
            "two different BINs",
        ),
        ("SELECT COUNT(*) FROM data GROUP BY BIN(hours, 4), BIN(hours, 4)", "BIN(hours, 4)", "the same BIN twice"),
        (
            "SELECT COUNT(*) FROM data GROUP BY hours, BIN(hours, 4)",
            "BIN(hours, 4)",
            "both as it is and by BIN(hours, 4)",
        ),
        ("SELECT COUNT(*) FROM data GROUP BY BIN(hours, 4), hours", "hours", "both by BIN(hours, 4) and as it is"),
        ("SELECT hours, COUNT(*) FROM data GROUP BY BIN(hours, 4)", "hours", "grouped by BIN(hours, 4), not as it is"),
        (
            "SELECT BIN(hours, 4) AS b, BIN(hours, 4) AS c, COUNT(*) FROM data GROUP BY b",
            "BIN(hours, 4) AS c",
            "selected twice",
        ),
        ("SELECT BIN(hours, 4) AS age, COUNT(*) FROM data GROUP BY age", "BIN(hours, 4) AS age", "is a column's name"),
        (
            "SELECT BIN(hours, 4) AS b, BIN(age, 3) AS B, COUNT(*) FROM data GROUP BY b",
            "BIN(age, 3) AS B",
            "two BINs are aliased",
        ),
        (
            "SELECT WIDTH_BUCKET(hours, 0, 100, 4) AS w, COUNT(*) FROM data",
            "WIDTH_BUCKET(hours, 0, 100, 4)",
            "use BIN(c, n)",
        ),
    ],
)
def test_a_bad_bin_is_refused_before_anything_is_paid(sql: str, fragment: str, why: str) -> None:
    s = session()
    for call in (s.sql, s.sql_cost):
        with pytest.raises(InvalidParameterError) as info:
            call(sql, epsilon=1.0)
        err = info.value
        assert err.name == "sql" and fragment in str(err.value), (err.value, fragment)
        assert why in str(err), str(err)
    assert s.spent == (0.0, 0.0) and s.remaining == 100.0


def test_an_alias_only_names_the_bin_for_group_by() -> None:
    """The result's column is the binned column's name, as with group_by(bins=): an alias is
    not an output name (so it cannot collide with one)."""
    r = session().sql("SELECT BIN(hours, 4) AS count_low, COUNT(*) FROM data GROUP BY count_low", epsilon=1.0)
    assert list(r.table.columns) == ["hours", "count", "count_low", "count_high"] and list(r.table["hours"]) == QUARTERS
    with pytest.raises(InvalidParameterError, match="two output columns would be named 'hours'"):
        session().sql("SELECT BIN(hours, 4) AS b, COUNT(*) AS hours FROM data GROUP BY b", epsilon=1.0)


def test_the_refusal_says_what_a_bin_may_be() -> None:
    with pytest.raises(InvalidParameterError) as info:
        session().sql("SELECT BIN(hours, 0) AS b, COUNT(*) FROM data GROUP BY b", epsilon=1.0)
    assert (
        "BIN(<numeric column>, n)" in info.value.accepted
        and "BIN(<numeric column>, e0, e1, ...)" in info.value.accepted
    )


def test_too_many_bins_is_over_the_key_limit_before_any_payment() -> None:
    s = session(QueryLimits(max_keys=100))
    with pytest.raises(LimitExceededError):
        s.sql("SELECT BIN(hours, 101) AS b, COUNT(*) FROM data GROUP BY b", epsilon=1.0)
    with pytest.raises(LimitExceededError):
        s.sql(f"SELECT COUNT(*) FROM data GROUP BY BIN(hours, {', '.join(map(str, range(102)))})", epsilon=1.0)
    assert s.spent == (0.0, 0.0)
    assert len(s.sql("SELECT BIN(hours, 100) AS b, COUNT(*) FROM data GROUP BY b", epsilon=1.0).table) == 100


def test_a_bin_of_the_privacy_unit_is_refused() -> None:
    f = frame().assign(uid=np.arange(600) % 50)
    s = dp.Session(
        f, metadata=Metadata(columns={"hours": Numeric(0, 100)}, privacy_unit="uid"), budget=dp.Budget(epsilon=1.0)
    )
    with pytest.raises(InvalidParameterError, match="numeric column; 'uid' is the privacy unit"):
        s.sql("SELECT COUNT(*) FROM data GROUP BY BIN(uid, 5)", epsilon=1.0)
    assert s.spent == (0.0, 0.0)


# -- the JSON form ------------------------------------------------------------------------------


@pytest.mark.parametrize("bins", [{"hours": 10}, {"hours": [0, 50, 100]}, {"hours": [-1.5, 2]}])
def test_bins_round_trip_through_the_json_form(bins: dict[str, object]) -> None:
    spec = QuerySpec.from_json({"aggregates": [{"kind": "count"}], "group_by": ["hours"], "bins": bins})
    text = spec.to_json()
    assert json.loads(text)["bins"] == bins
    assert QuerySpec.from_json(json.loads(text)) == spec
    again = QuerySpec.from_json(json.loads(text))
    assert build(again, session()._declared).groups[0].edges is not None


@pytest.mark.parametrize(
    "bins, why",
    [
        ({"hours": 0}, ">= 1"),
        ({"hours": 2.5}, "increasing finite numbers"),
        ({"hours": True}, "increasing finite numbers"),
        ({"free": 3}, "declared bounds"),
    ],
)
def test_a_bad_json_number_of_bins_is_refused_when_checked(bins: dict[str, object], why: str) -> None:
    col = next(iter(bins))
    spec = QuerySpec.from_json({"aggregates": [{"kind": "count"}], "group_by": [col], "bins": bins})
    with pytest.raises(InvalidParameterError, match=why) as info:
        build(spec, session()._declared)
    assert info.value.name == f"bins[{col!r}]"
