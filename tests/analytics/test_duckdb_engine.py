"""The DuckDB engine: exact pre-noise aggregates, and contribution bounding that really bounds.

The bounding tests are deterministic (fixed seeds, fixed salts): for random tables D and an
adversarial privacy unit u, D' = D + u's rows, the aggregates of D and D' computed with the same
salt differ by at most the sensitivities the session charges for (max_groups groups, max_rows
rows per group, values clipped). Other units' kept rows must not change at all, because their
priorities depend only on their own rows and the salt.
"""

from __future__ import annotations

import duckdb
import numpy as np
import pandas as pd
import pytest

from dpkit.analytics.engines.duckdb import DuckDBEngine
from dpkit.analytics.plan import (
    AggregationPlan,
    And,
    Between,
    Compare,
    GroupKey,
    InList,
    IsNull,
    Not,
    Or,
    ValueSpec,
    quantize_spec,
)
from dpkit.errors import InvalidParameterError

SEED = 20261126


def table(n_units: int = 200, seed: int = SEED) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    rows = rng.integers(1, 9, n_units)
    uid = np.repeat(np.arange(n_units), rows)
    n = uid.size
    return pd.DataFrame(
        {
            "uid": uid,
            "cat": rng.choice(np.array(["a", "b", "c", "d", "e"]), n),
            "k2": rng.integers(0, 3, n),
            "x": rng.uniform(-20, 120, n),
        }
    )


def plan(**kw):  # type: ignore[no-untyped-def]
    base = dict(
        unit="uid",
        where=None,
        groups=(GroupKey("cat"),),
        key_filter=(None,),
        max_groups=2,
        max_rows=3,
        sums=(
            quantize_spec("s0", "x", 0.0, 100.0, centered=False),
            quantize_spec("s1", "x", 0.0, 100.0, centered=True),
            quantize_spec("s2", "x", 0.0, 100.0, centered=True, square=True),
        ),
        values=(),
        salt=12345,
    )
    base.update(kw)
    return AggregationPlan(**base)


def reference_unbounded(df: pd.DataFrame, p: AggregationPlan) -> pd.DataFrame:
    """numpy/pandas reference for plans without a unit: clip, quantise, group, sum."""
    out = df.copy()
    for s in p.sums:
        x = np.clip(out[s.column].to_numpy(float), s.lower, s.upper)
        v = np.clip(np.round((x - s.center) * 2.0**-s.grid_exp), -s.bound, s.bound).astype(np.int64)
        # DuckDB rounds half away from zero; numpy to even: no exact halves occur for uniform floats
        if s.square:
            v = (v * v + (1 << s.shift >> 1)) >> s.shift
        out[s.name] = v
    g = out.groupby("cat")
    res = pd.DataFrame({"rows": g.size(), "units": g.size()})
    for s in p.sums:
        res[s.name] = g[s.name].sum()
        res[f"{s.name}_n"] = g[s.name].count()
    return res.reset_index().rename(columns={"cat": "g0"})


def sorted_frame(f: pd.DataFrame) -> pd.DataFrame:
    gcols = [c for c in f.columns if c.startswith("g")]
    return f.sort_values(gcols).reset_index(drop=True) if gcols else f


def test_unbounded_aggregates_equal_a_numpy_reference() -> None:
    df = table()
    p = plan(unit=None, max_groups=1, max_rows=1)
    got = sorted_frame(DuckDBEngine(df).aggregate(p))
    want = sorted_frame(reference_unbounded(df, p))
    pd.testing.assert_frame_equal(got[want.columns], want, check_dtype=False)
    assert (got[["rows", "units", "s0", "s1", "s2"]].dtypes == np.int64).all()


def test_sum_is_exact_and_its_grid_matches_the_declared_bounds() -> None:
    s = quantize_spec("s0", "x", 0.0, 100.0, centered=True)
    assert s.center == 50.0 and s.bound * s.grid >= 50.0 and s.bound <= 2**24
    sq = quantize_spec("s1", "x", 0.0, 100.0, centered=True, square=True)
    assert sq.max_summand * sq.unit >= 50.0**2 * (1 - 2**-20)
    df = pd.DataFrame({"x": [0.0, 100.0, 50.0, 1e9, -1e9]})  # clipped to the bounds
    got = DuckDBEngine(df).aggregate(plan(unit=None, groups=(), key_filter=(), sums=(s,), max_groups=1, max_rows=1))
    assert int(got["s0"][0]) == 0  # −50, +50, 0, +50, −50 in grid units: exactly zero


def test_nan_and_null_values_are_skipped_not_clipped() -> None:
    df = pd.DataFrame({"x": [1.0, np.nan, None, 3.0], "cat": ["a", "a", "a", None]})
    s = quantize_spec("s0", "x", 0.0, 10.0, centered=False)
    got = DuckDBEngine(df).aggregate(plan(unit=None, groups=(), key_filter=(), sums=(s,), max_groups=1, max_rows=1))
    assert int(got["rows"][0]) == 4 and int(got["s0_n"][0]) == 2
    assert int(got["s0"][0]) * s.grid == 4.0


def test_empty_table_gives_one_zero_row_without_groups_and_no_rows_with_groups() -> None:
    df = table().iloc[:0]
    e = DuckDBEngine(df)
    ungrouped = e.aggregate(plan(groups=(), key_filter=()))
    assert ungrouped[["rows", "units", "s0", "s0_n"]].iloc[0].tolist() == [0, 0, 0, 0]
    assert len(e.aggregate(plan())) == 0


def test_predicates_compile_with_sql_semantics() -> None:
    df = table()
    pred = And(
        (
            Or((Compare("x", ">", 50.0), InList("cat", ("a", "b")))),
            Not(Between("k2", 1, 1)),
            IsNull("x", negated=True),
        )
    )
    got = DuckDBEngine(df).aggregate(plan(unit=None, where=pred, max_groups=1, max_rows=1))
    mask = ((df.x > 50) | df.cat.isin(["a", "b"])) & ~df.k2.between(1, 1) & df.x.notna()
    assert int(got["rows"].sum()) == int(mask.sum())


def test_literals_are_parameters_not_sql() -> None:
    df = pd.DataFrame({"cat": ["a'; DROP TABLE t; --", "b"], 'we"ird': [1.0, 2.0]})
    e = DuckDBEngine(df)
    p = plan(
        unit=None,
        groups=(),
        key_filter=(),
        sums=(quantize_spec("s0", 'we"ird', 0, 10, centered=False),),
        max_groups=1,
        max_rows=1,
        where=Compare("cat", "=", "a'; DROP TABLE t; --"),
    )
    got = e.aggregate(p)
    assert int(got["rows"][0]) == 1 and int(got["s0"][0]) * p.sums[0].grid == 1.0


def test_bins_and_key_filters() -> None:
    df = pd.DataFrame({"x": [0.0, 5.0, 10.0, 15.0, 20.0, 25.0, np.nan], "cat": list("aabbcca")})
    p = plan(
        unit=None, groups=(GroupKey("x", (0.0, 10.0, 20.0)),), key_filter=((0, 1),), sums=(), max_groups=1, max_rows=1
    )
    got = sorted_frame(DuckDBEngine(df).aggregate(p))
    assert got["g0"].tolist() == [0, 1] and got["rows"].tolist() == [
        2,
        3,
    ]  # 20 is in the last (closed) bin; 25 and NaN dropped
    p2 = plan(unit=None, key_filter=(("a", "c"),), sums=(), max_groups=1, max_rows=1)
    got2 = sorted_frame(DuckDBEngine(df).aggregate(p2))
    assert got2["g0"].tolist() == ["a", "c"]


def test_bounding_keeps_at_most_max_groups_and_max_rows_per_unit() -> None:
    df = table()
    p = plan(values=(ValueSpec("x", 0.0, 100.0, 100),))
    e = DuckDBEngine(df)
    agg, cells = e.compute(p)
    assert cells is not None and cells["__cell"].between(0, 200).all() and (cells["__k"] == 0).all()
    # per group, every kept unit has between 1 and max_rows rows
    assert (agg["rows"] <= agg["units"] * p.max_rows).all() and (agg["units"] <= agg["rows"]).all()
    # the cells are counted from the same kept rows (no x is NULL in this table)
    per_group = cells.groupby("g0")["rows"].sum()
    assert per_group.to_dict() == agg.set_index("g0")["rows"].to_dict()
    per_unit_groups = df.groupby("uid")["cat"].nunique().clip(upper=p.max_groups)
    assert int(agg["units"].sum()) == int(per_unit_groups.sum())  # every unit keeps min(#groups, G) groups


def test_bounding_rows_are_exactly_min_of_count_and_max_rows() -> None:
    df = table()
    p = plan(groups=(), key_filter=(), max_groups=1)
    agg = DuckDBEngine(df).aggregate(p)
    assert int(agg["rows"][0]) == int(df.groupby("uid").size().clip(upper=p.max_rows).sum())
    assert int(agg["units"][0]) == df["uid"].nunique()


def _adversary(seed: int, n_rows: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame(
        {
            "uid": np.full(n_rows, 10_000),
            "cat": rng.choice(np.array(["a", "b", "c", "d", "e", "z"]), n_rows),
            "k2": rng.integers(0, 3, n_rows),
            "x": rng.choice(np.array([-1e6, 1e6, 50.0]), n_rows),
        }
    )


@pytest.mark.parametrize("portable", [False, True])
@pytest.mark.parametrize("groups", ["one", "two", "none"])
def test_adding_a_unit_changes_the_aggregates_by_at_most_the_sensitivity(portable: bool, groups: str) -> None:
    """The sensitivity the session charges is an upper bound on the real change, for 12
    random tables and adversaries each (0 false failures: the property is deterministic)."""
    gk = {
        "one": ((GroupKey("cat"),), (None,)),
        "two": ((GroupKey("cat"), GroupKey("k2")), (None, None)),
        "none": ((), ()),
    }[groups]
    for trial in range(12):
        df = table(60, seed=SEED + trial)
        adv = _adversary(SEED + 100 + trial, n_rows=int(np.random.default_rng(trial).integers(1, 40)))
        p = plan(groups=gk[0], key_filter=gk[1], portable=portable, salt=777 + trial)
        gcols = [f"g{i}" for i in range(len(gk[0]))]
        a = DuckDBEngine(df).aggregate(p)
        b = DuckDBEngine(pd.concat([df, adv], ignore_index=True)).aggregate(p)
        if gcols:
            m = a.merge(b, on=gcols, how="outer", suffixes=("_a", "_b")).fillna(0)
        else:
            m = a.add_suffix("_a").join(b.add_suffix("_b"))
        G = p.max_groups if gcols else 1
        R = p.max_rows
        d_rows = (m["rows_b"] - m["rows_a"]).abs()
        d_units = (m["units_b"] - m["units_a"]).abs()
        assert (d_rows > 0).sum() <= G and d_rows.sum() <= G * R and d_rows.max() <= R
        assert d_units.sum() <= G and d_units.max() <= 1
        for s in p.sums:
            d = (m[f"{s.name}_b"] - m[f"{s.name}_a"]).abs()
            assert d.sum() <= G * R * s.max_summand
            assert (m[f"{s.name}_n_b"] - m[f"{s.name}_n_a"]).abs().sum() <= G * R


def test_other_units_keep_the_same_rows_when_a_unit_is_added() -> None:
    df = table(80)
    p = plan(values=(ValueSpec("x", 0.0, 100.0, 100),))
    before = DuckDBEngine(df).compute(p)[1]
    after = DuckDBEngine(pd.concat([df, _adversary(1, 30)], ignore_index=True)).compute(p)[1]
    assert before is not None and after is not None
    # every (group, cell) count of the others stays or grows, by at most max_groups·max_rows in all
    m = before.merge(after, on=["g0", "__k", "__cell"], how="outer", suffixes=("_a", "_b")).fillna(0)
    grow = m["rows_b"] - m["rows_a"]
    assert (grow >= 0).all() and 0 < grow.sum() <= p.max_groups * p.max_rows


def test_bad_sources_are_refused() -> None:
    with pytest.raises(InvalidParameterError, match="data"):
        DuckDBEngine(object())
    with pytest.raises(InvalidParameterError, match="existing CSV"):
        DuckDBEngine("/nonexistent/file.csv")


def test_values_that_break_the_declared_type_become_null() -> None:
    """Bound to its declared types, the engine cannot fail on a value: text in a numeric column,
    NaN and ±inf become NULL (skipped by the sum, not counted by ``_n``)."""
    df = pd.DataFrame({"s": ["x", "0.5", "inf", "nan", " 1 ", None]})
    p = plan(
        unit=None,
        groups=(),
        key_filter=(),
        sums=(quantize_spec("s0", "s", 0, 1, centered=False),),
        max_groups=1,
        max_rows=1,
    )
    engine = DuckDBEngine(df)
    engine.bind({"s": "double"}, strip_strings=True)
    got = engine.aggregate(p)
    assert got["rows"].tolist() == [6] and got["s0_n"].tolist() == [2]
    assert got["s0"].tolist() == [round(1.5 * 2 ** -p.sums[0].grid_exp)]
    unbound = DuckDBEngine(pd.DataFrame({"s": ["x", "y"]}))
    with pytest.raises(duckdb.Error):  # the power of the rule above: without bind the cast fails
        unbound.aggregate(p)
