"""Marginal counts computed on Spark: a synthetic table of a DataFrame that never leaves the cluster.

:class:`SparkTableCounts` is :class:`~dpkit.synth.measure.TableCounts` for a
``pyspark.sql.DataFrame`` (a Parquet directory on a cluster, a table, Spark Connect). It binds the
declared types with the Spark engine's total reading rules — the schema only, before payment —
and, once the release is paid for, runs one job: every row's cells (one row per privacy unit,
chosen by a keyed hash), counted by distinct cell tuple, then every one- and two-way marginal
summed from those tuples. What reaches the driver is the marginals' counts: at most the sum of
their cells, a bound the metadata sets (the synthesizer's cell cap), whatever the row count.

The cells are the same as DuckDB's (:meth:`~dpkit.synth.domain.Column.code_sql`): a category
compared for equality, a number placed by ``x < edge`` tests, NULL in the missing cell. Which row
a multi-row unit keeps differs between the engines (each uses its own keyed hash); both keep one
uniformly chosen by a salt drawn after payment.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from dpkit.analytics.metadata import Metadata
from dpkit.synth.domain import Column, Domain
from dpkit.synth.measure import bind_declared

__all__ = ["SparkTableCounts", "is_spark_frame"]


def is_spark_frame(data: object) -> bool:
    """True for a ``pyspark.sql.DataFrame`` (classic or Spark Connect), without importing pyspark."""
    return any(c.__name__ == "DataFrame" and c.__module__.startswith("pyspark.sql") for c in type(data).__mro__)


class SparkTableCounts:
    """The cells of a Spark DataFrame over ``domain``, counted on the cluster.

    Construction reads the schema only (a declared column the frame lacks is refused, naming
    it, before anything is paid); :meth:`prepare` (after paying) runs the one counting job;
    :meth:`counts` returns a marginal's dense count array."""

    def __init__(self, frame: Any, metadata: Metadata, domain: Domain) -> None:
        from dpkit.analytics.engines.spark import SparkEngine

        self.domain = domain
        self._unit = metadata.privacy_unit
        engine = SparkEngine(frame)
        bind_declared(engine, metadata, domain)
        self._engine = engine
        self._counts: dict[tuple[int, ...], NDArray[np.int64]] = {}

    def prepare(self, salt: int) -> None:
        """Count every one- and two-way marginal in one Spark job."""
        from pyspark.sql import Window
        from pyspark.sql import functions as F

        engine, columns = self._engine, self.domain.columns
        names = [f"c{i}" for i in range(len(columns))]
        cells = [_code(c, engine._c(c.name)).alias(n) for c, n in zip(columns, names, strict=True)]
        if self._unit is None:
            rows = engine._df.select(*cells)
        else:
            u = engine._c(self._unit)
            keyed = engine._df.where(u.isNotNull()).select(u.alias("__u"), *cells)
            order = F.xxhash64(F.col("__u"), *[F.col(n) for n in names], F.lit(int(salt)).cast("long"))
            rows = (
                keyed.select("*", F.row_number().over(Window.partitionBy("__u").orderBy(order)).alias("__r"))
                .where(F.col("__r") == 1)
                .select(*names)
            )
        # Rows → distinct cell tuples (map-side combined), then each tuple's count added to the
        # cell it falls in on every marginal: the explode runs over tuples, not rows.
        tuples = rows.groupBy(*names).agg(F.count(F.lit(1)).alias("__n"))
        cliques = self._cliques()
        keys = []
        for k, clique in enumerate(cliques):
            key = F.lit(0).cast("long")
            for i in clique:
                key = key * F.lit(columns[i].size) + F.col(names[i]).cast("long")
            keys.append(F.struct(F.lit(k).alias("k"), key.alias("cell")))
        marginals: Any = (
            tuples.select(F.col("__n"), F.explode(F.array(*keys)).alias("__t"))
            .groupBy(F.col("__t.k").alias("k"), F.col("__t.cell").alias("cell"))
            .agg(F.sum("__n").alias("n"))
            .toPandas()
        )
        k = marginals["k"].to_numpy(dtype=np.int64)
        cell = marginals["cell"].to_numpy(dtype=np.int64)
        n = marginals["n"].to_numpy(dtype=np.int64)
        for i, clique in enumerate(cliques):
            shape = [columns[j].size for j in clique]
            flat = np.zeros(int(np.prod(shape)), dtype=np.int64)
            mine = k == i
            flat[cell[mine]] = n[mine]
            self._counts[clique] = flat.reshape(shape)

    def _cliques(self) -> list[tuple[int, ...]]:
        d = len(self.domain.columns)
        return [(i,) for i in range(d)] + [(i, j) for i in range(d) for j in range(i + 1, d)]

    def counts(self, clique: Sequence[int]) -> NDArray[np.int64]:
        """The exact counts of the marginal over ``clique`` (one or two domain indices)."""
        return self._counts[tuple(clique)]

    def close(self) -> None:
        self._counts = {}


def _code(column: Column, x: Any) -> Any:
    """The Spark twin of :meth:`Column.code_sql`: the cell of the bound value ``x``, never NULL."""
    from pyspark.sql import functions as F

    if column.categories is not None:
        e = None
        for i, c in enumerate(column.categories):
            e = (F if e is None else e).when(x == F.lit(c), F.lit(i))
        return F.lit(column.missing) if e is None else e.otherwise(F.lit(column.missing))
    edges = column.edges or ()
    e = F.when(x.isNull(), F.lit(column.missing))
    for i in range(len(edges) - 2):
        e = e.when(x < F.lit(float(edges[i + 1])), F.lit(i))
    return e.otherwise(F.lit(len(edges) - 2))
