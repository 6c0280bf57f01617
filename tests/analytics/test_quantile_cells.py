"""Quantiles computed from in-engine counts: no value leaves the engine, one bounding pass.

A median or quantile is the exponential mechanism over a candidate grid taken from the declared
bounds (plan.quantile_grid), scored from per-group cell counts the engine returns
(Engine.compute). These tests check what reaches dpkit from DuckDB — counts whose number is
bounded by groups × cells whatever the number of rows, from one statement per query — that the
grid comes from the bounds alone, and that the answers are accurate. (The Spark engine's counts
are compared with DuckDB's cell for cell in test_spark_engine.py, and its collected frame is
bounded the same way there.)
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import pytest

import dpkit as dp
from dpkit.analytics import Categorical, Metadata, Numeric
from dpkit.analytics.engines.duckdb import DuckDBEngine
from dpkit.analytics.plan import QUANTILE_GRID, ValueSpec, grid_points, quantile_grid

META = Metadata(
    columns={"age": Numeric(0, 100), "income": Numeric(0.0, 250_000.0), "g": Categorical((0, 1, 2))}, privacy_unit="pid"
)


def people(n: int, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame(
        {
            "pid": rng.integers(0, max(n // 3, 1), n),
            "age": rng.integers(18, 90, n),
            "income": rng.lognormal(10.5, 0.6, n),
            "g": rng.integers(0, 3, n),
        }
    )


@pytest.fixture
def fetched(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The number of result rows of every statement the DuckDB engine runs."""
    sizes: list[int] = []
    original = DuckDBEngine._run

    def counted(self: DuckDBEngine, sql: str, params: list[Any]) -> pd.DataFrame:
        frame = original(self, sql, params)
        sizes.append(len(frame))
        return frame

    monkeypatch.setattr(DuckDBEngine, "_run", counted)
    return sizes


@pytest.mark.parametrize("rows", [3_000, 60_000])
def test_a_median_fetches_counts_not_rows(fetched: list[int], rows: int) -> None:
    """One statement per query (aggregates and cell counts together), returning at most
    groups·(2m + 1) + groups rows however many rows the table has."""
    s = dp.Session(people(rows), metadata=META, budget=dp.Budget(epsilon=10.0), rng=np.random.default_rng(1))
    r = s.sql("SELECT g, MEDIAN(income), AVG(age), COUNT(*) FROM data GROUP BY g", epsilon=1.0)
    assert len(r.table) == 3
    assert len(fetched) == 1  # one bounding pass
    m = quantile_grid(0.0, 250_000.0)
    assert fetched[0] <= 3 * (2 * m + 1) + 3
    if rows > 3 * (2 * m + 1) + 3:
        assert fetched[0] < rows  # fewer than the rows: the per-row path would have fetched them all


def test_the_statement_materialises_one_bounding() -> None:
    from dpkit.analytics.plan import AggregationPlan, GroupKey, quantize_spec

    plan = AggregationPlan(
        unit="pid", where=None, groups=(GroupKey("g"),), key_filter=(None,), max_groups=1, max_rows=2,
        sums=(quantize_spec("s0", "age", 0.0, 100.0, centered=True),),
        values=(ValueSpec("income", 0.0, 250_000.0, 4096), ValueSpec("age", 0.0, 100.0, 100)), salt=3,
    )  # fmt: skip
    sql, _ = DuckDBEngine(people(100)).aggregate_sql(plan)
    assert sql.count("r AS MATERIALIZED") == 1 and sql.count("UNION ALL BY NAME") == 2
    frame, cells = DuckDBEngine(people(2_000)).compute(plan)
    assert cells is not None and set(cells["__k"]) == {0, 1}
    for k, spec in enumerate(plan.values):
        mine = cells[cells["__k"] == k]
        assert mine["__cell"].between(0, 2 * spec.cells).all()
        # every kept row with a value is in exactly one cell of each value spec
        assert mine.groupby("g0")["rows"].sum().to_dict() == frame.set_index("g0")["rows"].to_dict()


def test_the_grid_comes_from_the_bounds_alone() -> None:
    assert quantile_grid(0.0, 100.0) == 100  # integer bounds: the integers
    assert quantile_grid(18.0, 90.0) == 72
    assert quantile_grid(0.0, 250_000.0) == QUANTILE_GRID
    assert quantile_grid(0.0, 1.0) == 1 and quantile_grid(-0.5, 0.5) == QUANTILE_GRID
    pts = grid_points(0.0, 100.0, 100)
    assert pts[0] == 0.0 and pts[-1] == 100.0 and np.array_equal(pts, np.arange(101.0))
    # two grid points that would coincide in floating point halve the grid until they do not
    m = quantile_grid(2.0**52, 2.0**52 + 64.5)
    assert m <= 128 and np.unique(grid_points(2.0**52, 2.0**52 + 64.5, m)).size == m + 1


def test_cells_count_candidates_and_gaps_apart() -> None:
    """x exactly on a candidate is in the even cell 2j, strictly between c_j and c_(j+1) in 2j + 1;
    values clipped to the bounds land on the end candidates; NULL and NaN are not counted."""
    from dpkit.analytics.plan import AggregationPlan

    df = pd.DataFrame({"x": [0.0, 3.0, 3.5, 10.0, -7.0, 99.0, None, float("nan")]})
    plan = AggregationPlan(unit=None, where=None, groups=(), key_filter=(), max_groups=1, max_rows=1, sums=(),
                           values=(ValueSpec("x", 0.0, 10.0, 10),), salt=1)  # fmt: skip
    frame, cells = DuckDBEngine(df).compute(plan)
    assert cells is not None
    got = dict(zip(cells["__cell"], cells["rows"], strict=True))
    assert got == {0: 2, 6: 1, 7: 1, 20: 2} and int(frame["rows"][0]) == 8


def test_medians_are_accurate() -> None:
    """Integer ages over integer bounds: the median is one of the integers, within 1 of the true
    one at ε = 1 on 20,000 rows (its exponential mechanism puts mass below 1e-9 further away:
    false-failure rate below 1e-9 per query, fixed seed); incomes within 1 % of the range."""
    df = people(20_000, seed=4)
    s = dp.Session(
        df.assign(pid=np.arange(len(df))), metadata=META, budget=dp.Budget(epsilon=10.0), rng=np.random.default_rng(5)
    )
    r = s.sql("SELECT MEDIAN(age) AS m, QUANTILE(income, 0.9) AS p90 FROM data", epsilon=2.0)
    m = float(r.table["m"][0])
    assert m == round(m) and abs(m - float(np.median(df["age"]))) <= 1
    assert abs(float(r.table["p90"][0]) - float(np.quantile(df["income"], 0.9))) < 0.01 * 250_000


def test_an_empty_group_still_gets_a_draw() -> None:
    s = dp.Session(people(500), metadata=META, budget=dp.Budget(epsilon=10.0), rng=np.random.default_rng(2))
    r = s.sql("SELECT MEDIAN(age) FROM data WHERE age > 1000", epsilon=1.0)
    value = float(r.table.iloc[0, 0])
    assert 0.0 <= value <= 100.0 and value == round(value)
