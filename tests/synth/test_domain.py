"""A numeric column's cells in the synthetic domain: each value's bin by a binary search over the
edges (dpkit.analytics.engines.bins) — values below the first edge in the first bin, above the
last in the last, NULL and non-numbers (NaN, ±inf: NULL by the declared reading) in the missing
cell — equal to numpy's at every edge, on DuckDB and on Spark; and the counting statement does not
grow with the bins. Deterministic (fixed seeds)."""

from __future__ import annotations

from typing import Any

import duckdb
import numpy as np
import pytest

import _bins
from dpkit.analytics import Categorical, Metadata, Numeric
from dpkit.errors import InvalidParameterError
from dpkit.synth import Domain
from dpkit.synth.domain import MAX_CELLS
from dpkit.synth.measure import TableCounts

# pyspark's own warnings under pandas 3 (as in test_spark_engine.py)
pytestmark = [
    pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas:FutureWarning"),
    pytest.mark.filterwarnings("ignore:The copy keyword is deprecated"),
]

META = Metadata(columns={"x": Numeric(), "c": Categorical(("a", "b"))}, row_level=True)

N_BINS = [1, 2, 7, 1000, MAX_CELLS - 1]


def _reference(edges: np.ndarray, x: np.ndarray, nulls: int = 3) -> np.ndarray:
    """Rows per cell by numpy: finite values clipped into the edge bins, the rest missing."""
    n = len(edges) - 1
    finite = x[np.isfinite(x)]
    cells = np.clip(np.searchsorted(edges, finite, side="right") - 1, 0, n - 1)
    out = np.bincount(cells, minlength=n + 1)
    out[n] += len(x) - len(finite) + nulls
    return out


def _duckdb_counts(table: Any, domain: Domain) -> tuple[TableCounts, list[str]]:
    """The DuckDB counts of ``table``, prepared, and the statements they ran."""
    con = duckdb.connect()
    con.register("src", table)
    con.execute("CREATE TABLE t AS SELECT * FROM src")
    counts = TableCounts((con, "t"), META, domain)
    statements: list[str] = []
    counts._con = _Recording(counts._con, statements)
    counts.prepare(salt=1)
    return counts, statements


class _Recording:
    """A DuckDB connection that records the statements it runs."""

    def __init__(self, con: Any, statements: list[str]) -> None:
        self._con, self._statements = con, statements

    def execute(self, sql: str, *args: Any) -> Any:
        self._statements.append(sql)
        return self._con.execute(sql, *args)


@pytest.mark.parametrize("n", N_BINS)
def test_duckdb_cells_are_numpys_at_every_edge(n: int) -> None:
    edges = _bins.edges(n)
    x = _bins.values(edges)
    domain = Domain.from_metadata(META, bins={"x": edges.tolist()})
    counts, _ = _duckdb_counts(_bins.table(x, c=["a"] * (len(x) + 3)), domain)
    np.testing.assert_array_equal(counts.counts((0,)), _reference(edges, x))


def test_the_counting_statement_does_not_grow_with_the_bins() -> None:
    """One search step per doubling of the bins, the edges one parameter: 9,999 bins cost 10
    steps more than 10 (a CASE with one WHEN per bin made the statement 1,000 times longer)."""
    sizes = {}
    for n in (10, MAX_CELLS - 1):
        domain = Domain.from_metadata(META, bins={"x": np.linspace(0.0, 100.0, n + 1).tolist()})
        _, statements = _duckdb_counts(_bins.table(np.array([1.0]), c=["a"] * 4), domain)
        sizes[n] = len(next(s for s in statements if s.startswith("CREATE OR REPLACE TEMP TABLE")))
    assert sizes[MAX_CELLS - 1] - sizes[10] <= 150 * 10


@pytest.fixture(scope="module")
def spark():  # type: ignore[no-untyped-def]
    from dpkit.analytics.engines.spark import spark_session

    return spark_session()


@pytest.mark.parametrize("n", N_BINS)
def test_spark_cells_are_numpys_at_every_edge(spark, n: int) -> None:  # type: ignore[no-untyped-def]
    from dpkit.synth.spark_counts import SparkTableCounts

    edges = _bins.edges(n)
    x = _bins.values(edges)
    domain = Domain.from_metadata(META, bins={"x": edges.tolist()})
    frame = spark.createDataFrame(_bins.table(x, c=["a"] * (len(x) + 3)))
    assert frame.where("isnan(x)").count() == 1  # a real NaN, not NULL
    counts = SparkTableCounts(frame, META, domain)
    counts.prepare(salt=1)
    np.testing.assert_array_equal(counts.counts((0,)), _reference(edges, x))


@pytest.mark.parametrize(
    ("bins", "columns"),
    [
        ({"x": [-1e308, 1e308]}, None),  # finite edges, an infinite width: sampling would draw ±inf
        ({"x": [-1.7e308, 5e307]}, None),
        ({"x": [0.0, 1.0]}, ["x", "c", "x"]),  # a column twice
    ],
)
def test_bins_whose_widths_overflow_and_repeated_columns_are_refused(bins: Any, columns: Any) -> None:
    """Refused from the request alone (the synthesiser's constructor, before anything is paid),
    naming what to change."""
    with pytest.raises(InvalidParameterError) as err:
        Domain.from_metadata(META, bins=bins, columns=columns)
    assert err.value.name == ("columns" if columns else "bins.x")
    assert Domain.from_metadata(META, bins={"x": [-1e308, 0.0, 1e308]}).columns[0].size == 3  # widths of 1e308 are fine


def test_integer_bins_beyond_exact_doubles_are_refused() -> None:
    from dpkit.synth import Synthesizer

    meta = Metadata(columns={"x": Numeric(), "c": Categorical(("a", "b"))}, row_level=True)
    with pytest.raises(InvalidParameterError) as err:
        Synthesizer(epsilon=1.0, delta=1e-6, metadata=meta, bins={"x": [-1e300, 0.0, 1e300]}, integers=["x"])
    assert err.value.name == "bins.x" and "2**53" in str(err.value)
    Synthesizer(epsilon=1.0, delta=1e-6, metadata=meta, bins={"x": [-(2.0**53), 0.0, 2.0**53]}, integers=["x"])
