"""A number of equal-width bins over a numeric column's declared bounds (``bins=10``): the edges
come from the metadata alone, and the result is the one the explicit edges give. Each row's bin
(engines.bins: a binary search over the edges) is numpy's, at every edge, on both engines, and
neither the statement nor the Spark plan grows with the number of bins."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import pytest

import _bins
import dpkit as dp
from dpkit.analytics import Metadata, Numeric, QueryLimits
from dpkit.analytics.engines import bins
from dpkit.analytics.engines.duckdb import DuckDBEngine
from dpkit.analytics.plan import AggregationPlan, GroupKey
from dpkit.errors import InvalidParameterError, LimitExceededError

# pyspark's own warnings under pandas 3 (as in test_spark_engine.py)
pytestmark = [
    pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas:FutureWarning"),
    pytest.mark.filterwarnings("ignore:The copy keyword is deprecated"),
]


def _session(limits: QueryLimits | None = None) -> dp.Session:
    rng = np.random.default_rng(3)
    frame = pd.DataFrame({"hours": rng.integers(0, 101, 500).astype(float), "free": rng.normal(size=500)})
    meta = Metadata(columns={"hours": Numeric(0, 100), "free": Numeric()}, row_level=True)
    return dp.Session(
        frame, metadata=meta, budget=dp.Budget(epsilon=100.0), rng=np.random.default_rng(0), limits=limits
    )


def test_a_number_of_bins_is_the_equal_width_edges_over_the_declared_bounds() -> None:
    by_count = _session().histogram("hours", bins=4, epsilon=1.0)
    by_edges = _session().histogram("hours", bins=[0, 25, 50, 75, 100], epsilon=1.0)
    pd.testing.assert_frame_equal(by_count.table, by_edges.table)  # same keys, same seeded noise
    assert list(by_count.table["hours"]) == list(by_edges.table["hours"]) and len(by_count.table) == 4
    other = _session().histogram("hours", bins=[0, 20, 50, 75, 100], epsilon=1.0)
    assert list(other.table["hours"]) != list(by_count.table["hours"])  # the comparison can tell


def test_group_by_takes_a_number_of_bins_too() -> None:
    r = _session().query().group_by("hours", bins={"hours": 10}).count(epsilon=1.0)
    assert len(r.table) == 10


@pytest.mark.parametrize("bins", [0, -3])
def test_a_bad_number_of_bins_is_refused(bins: int) -> None:
    with pytest.raises(InvalidParameterError) as info:
        _session().histogram("hours", bins=bins, epsilon=1.0)
    assert info.value.name == "bins['hours']"


def test_a_column_without_declared_bounds_needs_explicit_edges() -> None:
    s = _session()
    with pytest.raises(InvalidParameterError) as info:
        s.histogram("free", bins=5, epsilon=1.0)
    assert info.value.name == "bins['free']" and "declared bounds" in str(info.value)
    assert s.spent == (0.0, 0.0)  # refused before paying


def test_too_many_bins_is_over_the_key_limit_before_any_edge_is_built() -> None:
    s = _session(QueryLimits(max_keys=100))
    with pytest.raises(LimitExceededError):
        s.histogram("hours", bins=10**12, epsilon=1.0)
    assert s.spent == (0.0, 0.0)


# -- the bin search (engines.bins): exact at every edge, on both engines -----------------------------
#
# Bins are [e_i, e_{i+1}), the last one closed; values outside every bin, NaN and NULL are dropped.
# The reference is numpy's searchsorted on the same doubles. Deterministic (fixed seeds).


def _reference(edges: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Rows per bin by numpy: x in [e_0, e_n] (NaN never is), the last bin closed."""
    inside = x[(x >= edges[0]) & (x <= edges[-1])]
    index = np.minimum(np.searchsorted(edges, inside, side="right") - 1, len(edges) - 2)
    return np.bincount(index, minlength=len(edges) - 1)


def _bin_plan(edges: np.ndarray, allowed: tuple[int, ...] | None = None, unit: str | None = None) -> AggregationPlan:
    n = len(edges) - 1
    return AggregationPlan(
        unit=unit,
        where=None,
        groups=(GroupKey("x", tuple(float(e) for e in edges)),),
        key_filter=(tuple(range(n)) if allowed is None else allowed,),  # what the planner writes
        max_groups=1,
        max_rows=1_000_000,
        sums=(),
        values=(),
        salt=7,
    )


def _per_bin(frame: pd.DataFrame, n: int) -> np.ndarray:
    g = frame["g0"].to_numpy()
    assert np.issubdtype(g.dtype, np.integer) and g.min() >= 0 and g.max() < n and len(set(g)) == len(g)
    out = np.zeros(n, dtype=np.int64)
    out[g] = frame["rows"].to_numpy()
    return out


def _duckdb(table: Any, bind: bool) -> DuckDBEngine:
    import duckdb

    con = duckdb.connect()
    con.register("src", table)
    con.execute("CREATE TABLE t AS SELECT * FROM src")
    engine = DuckDBEngine(None, connection=con, table="t")
    if bind:
        engine.bind({"x": "double"}, strip_strings=False)
    return engine


BIN_COUNTS = [1, 2, 7, 1000, 100_000]


@pytest.mark.parametrize("n", BIN_COUNTS)
@pytest.mark.parametrize("bind", [True, False])
def test_duckdb_bins_are_numpys_at_every_edge(n: int, bind: bool) -> None:
    edges = _bins.edges(n)
    x = _bins.values(edges)
    engine = _duckdb(_bins.table(x), bind)
    assert engine._con.execute("SELECT count(*) FROM t WHERE isnan(x)").fetchone()[0] == 1  # a real NaN
    got = _per_bin(engine.aggregate(_bin_plan(edges)), n)
    np.testing.assert_array_equal(got, _reference(edges, x))


def test_a_key_filter_short_of_every_bin_keeps_only_its_bins() -> None:
    edges = _bins.edges(7)
    x = _bins.values(edges)
    frame = _duckdb(_bins.table(x), True).aggregate(_bin_plan(edges, allowed=(0, 2, 6)))
    want = _reference(edges, x)
    assert sorted(frame["g0"]) == [0, 2, 6]
    assert dict(zip(frame["g0"], frame["rows"], strict=True)) == {k: want[k] for k in (0, 2, 6)}


def test_two_binned_columns_and_a_privacy_unit() -> None:
    import duckdb

    rng = np.random.default_rng(5)
    e1, e2 = _bins.edges(7), _bins.edges(1000)
    x1, x2 = rng.choice(_bins.values(e1), 5000), rng.choice(_bins.values(e2), 5000)
    con = duckdb.connect()
    con.register("src", pd.DataFrame({"u": np.arange(5000), "x": x1, "y": x2}))
    con.execute("CREATE TABLE t AS SELECT * FROM src")
    engine = DuckDBEngine(None, connection=con, table="t")
    groups = (GroupKey("x", tuple(e1)), GroupKey("y", tuple(e2)))
    plan = AggregationPlan("u", None, groups, (tuple(range(7)), None), 1, 1, (), (), 7)
    frame = engine.aggregate(plan)
    inside = (x1 >= e1[0]) & (x1 <= e1[-1]) & (x2 >= e2[0]) & (x2 <= e2[-1])
    b1 = np.minimum(np.searchsorted(e1, x1[inside], side="right") - 1, 6)
    b2 = np.minimum(np.searchsorted(e2, x2[inside], side="right") - 1, 999)
    want = pd.Series(1, index=pd.MultiIndex.from_arrays([b1, b2])).groupby(level=[0, 1]).sum()
    got = frame.set_index(["g0", "g1"])["rows"].sort_index()
    assert list(got.index) == list(want.index) and list(got) == list(want)


# -- item: BIN's cost did not depend on the table but grew with the bins ---------------------------


def test_the_duckdb_statement_does_not_grow_with_the_bins() -> None:
    """One search step per doubling of the bins, the edges one parameter: the statement for
    100,000 bins is the one for 10 plus 13 steps (a CASE with one WHEN per bin, and the key
    filter IN (0, …, n − 1), made it megabytes long, with 500,004 parameters)."""
    engine = _duckdb(_bins.table(np.array([1.0])), True)
    small, big = (engine.aggregate_sql(_bin_plan(np.linspace(0.0, 100.0, n + 1), unit="x")) for n in (10, 100_000))
    steps = bins.Search.of_edges("x", range(100_001)).depth - bins.Search.of_edges("x", range(11)).depth
    assert steps == 13
    assert len(big[1]) == len(small[1])
    assert len(big[0]) - len(small[0]) <= 150 * steps
    assert big[0].count("CASE") - small[0].count("CASE") == steps


def test_a_histogram_of_100_000_bins_is_answered() -> None:
    r = _session(QueryLimits(max_keys=100_000)).histogram("hours", bins=100_000, epsilon=1.0)
    assert len(r.table) == 100_000 and r.table["hours"].iloc[-1] == "[99.999, 100]"


# -- the same on Spark -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def spark():  # type: ignore[no-untyped-def]
    from dpkit.analytics.engines.spark import spark_session

    return spark_session()


def _spark_engine(spark, x: np.ndarray, bind: bool) -> Any:  # type: ignore[no-untyped-def]
    from dpkit.analytics.engines.spark import SparkEngine

    frame = spark.createDataFrame(_bins.table(x))
    assert frame.where("isnan(x)").count() == int(np.isnan(x).sum()) and frame.where("x IS NULL").count() == 3
    engine = SparkEngine(frame)
    if bind:
        engine.bind({"x": "double"}, strip_strings=False)
    return engine


@pytest.mark.parametrize("n", BIN_COUNTS)
def test_spark_bins_are_numpys_at_every_edge(spark, n: int) -> None:  # type: ignore[no-untyped-def]
    edges = _bins.edges(n)
    x = _bins.values(edges)
    for bind in (True, False):
        got = _per_bin(_spark_engine(spark, x, bind).aggregate(_bin_plan(edges)), n)
        np.testing.assert_array_equal(got, _reference(edges, x), err_msg=f"bind={bind}")


def test_spark_keeps_a_key_filter_short_of_every_bin(spark) -> None:  # type: ignore[no-untyped-def]
    edges = _bins.edges(7)
    frame = _spark_engine(spark, _bins.values(edges), True).aggregate(_bin_plan(edges, allowed=(0, 2, 6)))
    assert sorted(frame["g0"]) == [0, 2, 6]


def test_the_spark_plan_does_not_grow_with_the_bins(spark) -> None:  # type: ignore[no-untyped-def]
    """The analysed plan for 100,000 bins is the one for 10 plus 13 search steps: the edges are
    one row of a local relation, not 100,000 branches of a CASE (nor 100,000 literals of an
    IN)."""
    engine = _spark_engine(spark, np.array([1.0]), True)
    sizes = {}
    for n in (10, 100_000):
        frame = engine._base(_bin_plan(np.linspace(0.0, 100.0, n + 1), unit="x"))[0]
        tree = frame._jdf.queryExecution().analyzed().toString()
        sizes[n] = sum(len(line.strip()) for line in tree.splitlines())  # without the indentation
    assert sizes[100_000] - sizes[10] <= 250 * 13
