"""Marginal counts computed on Spark: a synthetic table of a DataFrame that never leaves the cluster.

:class:`SparkTableCounts` is :class:`~dpkit.synth.measure.TableCounts` for a
``pyspark.sql.DataFrame`` (a Parquet directory on a cluster, a table, Spark Connect). It binds the
declared types with the Spark engine's total reading rules — the schema only, before payment —
and, once the release is paid for, runs one job: every row's cells (one row per privacy unit,
chosen by a keyed hash), counted by distinct cell tuple, then every one- and two-way marginal
summed from those tuples. What reaches the driver is the marginals' counts: at most the sum of
their cells, a bound the metadata sets (the synthesizer's cell cap), whatever the row count.

The cells are the same as DuckDB's (:meth:`~dpkit.synth.domain.Column.code_sql`): a category
compared for equality, a number placed by a binary search over its bin edges
(:mod:`dpkit.analytics.engines.bins`), NULL in the missing cell (or, for a column declared never
missing, its first cell). Which row a multi-row unit keeps differs between the engines (each uses
its own keyed hash); both keep one uniformly chosen by a salt drawn after payment.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from dpkit.analytics.engines.bins import Search, spark_edges, spark_stages
from dpkit.analytics.metadata import Metadata
from dpkit.synth.domain import Column, Domain
from dpkit.synth.measure import bind_declared

__all__ = ["SparkTableCounts"]


class SparkTableCounts:
    """The cells of a Spark DataFrame over ``domain``, counted on the cluster.

    Construction reads the schema only (a declared column the frame lacks is refused, naming
    it, before anything is paid); :meth:`prepare` (after paying) runs the one counting job;
    :meth:`counts` returns a marginal's dense count array."""

    def __init__(self, frame: Any, metadata: Metadata, domain: Domain) -> None:
        from pyspark.sql import functions as F

        from dpkit.analytics.engines.spark import SparkEngine

        self.domain = domain
        self._unit = metadata.privacy_unit
        engine = SparkEngine(frame)
        bind_declared(engine, metadata, domain)
        self._engine = engine
        self._counts: dict[tuple[int, ...], NDArray[np.int64]] = {}
        # Every expression is built here, before payment: a mistake in one fails now, not after
        # the debit. Each expression built in Python is a round trip to the JVM (thousands for a
        # wide domain), so a category's cell is SQL text, one expression per column; a number's
        # bin comes from a binary search over its edges (engines.bins, ⌈log2 bins⌉ steps), whose
        # edges frame is built here too.
        columns = domain.columns
        self._names = [f"c{i}" for i in range(len(columns))]
        self._read: list[Any] = []
        self._searches: list[Search] = []
        self._cells: list[Any] = []
        for c, n in zip(columns, self._names, strict=True):
            if c.categories is not None:
                self._read.append(F.expr(_code_sql(c, engine._names[c.name])).alias(n))
                self._cells.append(F.col(n))
            else:
                self._read.append(F.col(engine._names[c.name]).alias(n))
                self._searches.append(c.search(n))
                self._cells.append(F.coalesce(F.col(n), F.lit(c.null_cell)).alias(n))
        self._edges = spark_edges(engine._df.sparkSession, self._searches)
        # Every marginal's cells numbered in one flat index: the marginal's offset plus its
        # mixed-radix cell, so each distinct cell tuple explodes into plain longs.
        self._cliques = [(i,) for i in range(len(columns))] + [
            (i, j) for i in range(len(columns)) for j in range(i + 1, len(columns))
        ]
        self._shapes = [[columns[j].size for j in clique] for clique in self._cliques]
        self._offsets = np.concatenate([[0], np.cumsum([int(np.prod(s)) for s in self._shapes])]).astype(np.int64)
        keys = []
        for clique, offset in zip(self._cliques, self._offsets[:-1], strict=True):
            terms, stride = [f"{int(offset)}L"], 1
            for i in reversed(clique):
                terms.append(f"CAST({self._names[i]} AS BIGINT) * {stride}L")
                stride *= columns[i].size
            keys.append(" + ".join(terms))
        self._explode = F.expr(f"explode(array({', '.join(keys)}))").alias("__k")

    def prepare(self, salt: int) -> None:
        """Count every one- and two-way marginal in one Spark job."""
        from pyspark.sql import Window
        from pyspark.sql import functions as F

        engine, names = self._engine, self._names
        if self._unit is None:
            rows = self._coded(engine._df.select(*self._read))
        else:
            u = engine._c(self._unit)
            keyed = self._coded(engine._df.where(u.isNotNull()).select(u.alias("__u"), *self._read), "__u")
            order = F.xxhash64(F.col("__u"), *[F.col(n) for n in names], F.lit(int(salt)).cast("long"))
            rows = (
                keyed.select("*", F.row_number().over(Window.partitionBy("__u").orderBy(order)).alias("__r"))
                .where(F.col("__r") == 1)
                .select(*names)
            )
        # Rows → distinct cell tuples (map-side combined), then each tuple's count added to the
        # cell it falls in on every marginal: the explode runs over tuples, not rows.
        tuples = rows.groupBy(*names).agg(F.count(F.lit(1)).alias("__n"))
        marginals: Any = (
            tuples.select(F.col("__n"), self._explode).groupBy("__k").agg(F.sum("__n").alias("n")).toPandas()
        )
        flat = np.zeros(int(self._offsets[-1]), dtype=np.int64)
        flat[marginals["__k"].to_numpy(dtype=np.int64)] = marginals["n"].to_numpy(dtype=np.int64)
        for clique, shape, lo, hi in zip(
            self._cliques, self._shapes, self._offsets[:-1], self._offsets[1:], strict=True
        ):
            self._counts[clique] = flat[lo:hi].reshape(shape)

    def _coded(self, frame: Any, *keep: str) -> Any:
        """The rows of ``frame`` (as read) as cells: the bins searched, NULL numbers in their cell."""
        if self._searches:
            frame = spark_stages(frame, self._searches, self._edges)
        return frame.select(*keep, *self._cells)

    def counts(self, clique: Sequence[int]) -> NDArray[np.int64]:
        """The exact counts of the marginal over ``clique`` (one or two domain indices)."""
        return self._counts[tuple(clique)]

    def close(self) -> None:
        self._counts = {}


def _code_sql(column: Column, name: str) -> str:
    """A categorical column's :meth:`Column.code_sql` in Spark SQL over the bound column ``name``
    (the engine's internal name, ``__dpkit_c<i>``): the cell of the value, never NULL. (A
    numeric column's cell comes from its bin search.)"""
    x = f"`{name}`"
    whens = " ".join(f"WHEN {x} = {_sql_literal(c)} THEN {i}" for i, c in enumerate(column.categories or ()))
    return f"CASE {whens} ELSE {column.null_cell} END" if whens else str(column.null_cell)


def _sql_literal(value: Any) -> str:
    """A Spark SQL literal of ``value`` whose meaning does not depend on the session's parser
    settings: a string that is not plain printable text without quotes or backslashes is
    written as its UTF-8 bytes in hex (``spark.sql.parser.escapedStringLiterals`` changes what a
    backslash means)."""
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, int):
        return f"{value}L" if -(2**63) <= value < 2**63 else f"{value}BD"
    if isinstance(value, float):
        if math.isfinite(value):
            return f"{value!r}D"
        return f"CAST('{'NaN' if math.isnan(value) else 'Infinity' if value > 0 else '-Infinity'}' AS DOUBLE)"
    text = str(value)
    if text.isprintable() and "'" not in text and "\\" not in text:
        return f"'{text}'"
    return f"CAST(unhex('{text.encode('utf-8').hex()}') AS STRING)"
