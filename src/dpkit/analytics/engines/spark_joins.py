"""The joined relation of a query over several tables, on Spark (:class:`~dpkit.analytics.plan.JoinPlan`).

The same relation as DuckDB's (:mod:`dpkit.analytics.engines.duckdb_joins`), rule for rule, with
the DataFrame API: each table is read through its typed frame (the declared columns, by the declared
types), truncated when the plan says so — at most ``keep`` rows per value of ``partition``, ranked
by a keyed hash of the row's own columns (``row_number()`` over a window) — and joined in order; the
result exposes every column under its joined name, and the engine's bounded aggregation reads it in
place of its table (:mod:`dpkit.analytics.engines.spark`). A NULL key matches nothing, and two
privacy-unit columns stored as different types are compared as their canonical text.

Column names: every column gets a positional name of its own (``__dpkit_t<source>_<k>`` inside the
join, ``__dpkit_j<k>`` in the result), so no joined name — ``visits.cost`` has a dot — is ever
parsed by Spark, and the two sides of a join never share a name.

With ``portable=True`` a truncation priority is the md5 of the same text DuckDB hashes: the salt
and each value as DuckDB writes it (``concat_ws`` skips NULLs in both engines; a double's text is
rewritten into DuckDB's, :mod:`dpkit.analytics.engines.spark_text`), so both engines keep the same
rows. Without it, the priority is Spark's ``xxhash64`` of the values and the salt: other rows than
DuckDB keeps, as many.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dpkit.analytics.engines.base import ReadType
from dpkit.analytics.engines.spark_text import with_texts
from dpkit.analytics.plan import JoinPlan, JoinSource, join_salt

__all__ = ["SparkRelation", "JoinedFrame", "joined_frame", "same_session"]


@dataclass(frozen=True)
class SparkRelation:
    """A table of the dataset as a join reads it: its typed frame (positional column names), and per
    declared column the frame's column, the type it is stored as (the source's schema) and the type
    it is read as."""

    frame: Any
    names: Mapping[str, str]
    types: Mapping[str, str]
    reads: Mapping[str, ReadType]
    data_types: Mapping[str, Any]  # declared column -> the Spark type of its typed column


@dataclass(frozen=True)
class JoinedFrame:
    """The joined relation: ``frame``, with the column of each joined name in ``names`` and the
    type it was read as in ``reads``."""

    frame: Any
    names: Mapping[str, str]
    reads: Mapping[str, ReadType]

    def column(self, name: str) -> Any:
        """A column by its joined name; an unknown name fails in Spark's analysis."""
        from pyspark.sql import functions as F

        from dpkit.analytics.engines.spark_expressions import column_by_name

        return F.col(self.names[name]) if name in self.names else column_by_name(name)


def _truncated(
    src: JoinSource, index: int, rel: SparkRelation, salt: int, portable: bool
) -> tuple[Any, dict[str, str]]:
    """The source's typed frame, its columns renamed ``__dpkit_t<index>_<k>``, truncated when
    ``src.keep`` says so; returns it and its declared column → name."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    names = {c: f"__dpkit_t{index}_{k}" for k, c in enumerate(rel.names)}
    frame = rel.frame.select(*[F.col(rel.names[c]).alias(n) for c, n in names.items()])
    if src.keep is None:
        return frame, names
    key = join_salt(salt, index)
    if portable:
        texts = {names[c]: (rel.data_types[c], f"__dpkit_h{k}", False) for k, c in enumerate(src.hashed)}
        frame = with_texts(frame, texts)
        priority = F.md5(F.concat_ws("|", F.lit(str(key)), *[F.col(n) for _, n, _ in texts.values()]))
        temps = [n for _, n, _ in texts.values()]
    else:
        priority = F.xxhash64(*[F.col(names[c]) for c in src.hashed], F.lit(key).cast("long"))
        temps = []
    # rows whose hashed texts coincide (concat_ws skips NULLs) are ranked by their values: the
    # same rows on every run, whatever order the rows are read in
    ties = [F.col(names[c]).asc_nulls_last() for c in src.hashed]
    window = Window.partitionBy(*[F.col(names[c]) for c in src.partition]).orderBy(priority, *ties)
    ranked = frame.select("*", F.row_number().over(window).alias("__dpkit_rank"))
    return ranked.where(F.col("__dpkit_rank") <= F.lit(int(src.keep))).drop("__dpkit_rank", *temps), names


def joined_frame(plan: JoinPlan, relations: Mapping[str, SparkRelation], salt: int, portable: bool) -> JoinedFrame:
    """The sources of ``plan`` truncated and joined in order, every source's columns under their
    joined names (:attr:`JoinedFrame.names`)."""
    from pyspark.sql import functions as F

    sources = plan.sources
    frame, first = _truncated(plan.base, 0, relations[plan.base.table], salt, portable)
    names = [first]
    for i, step in enumerate(plan.steps, start=1):
        rel = relations[step.source.table]
        right, own = _truncated(step.source, i, rel, salt, portable)
        left_text: dict[str, tuple[Any, str, bool]] = {}
        right_text: dict[str, tuple[Any, str, bool]] = {}
        conds = []
        for j, (li, lc, rc) in enumerate(step.on):
            lrel = relations[sources[li].table]
            if step.as_text and lrel.types.get(lc) != rel.types.get(rc):
                # two units stored as different types: equal when their canonical texts are
                left_text[names[li][lc]] = (lrel.data_types[lc], f"__dpkit_a{i}_{j}", True)
                right_text[own[rc]] = (rel.data_types[rc], f"__dpkit_b{i}_{j}", True)
                conds.append(F.col(f"__dpkit_a{i}_{j}") == F.col(f"__dpkit_b{i}_{j}"))
            else:
                conds.append(F.col(names[li][lc]) == F.col(own[rc]))
        frame, right = with_texts(frame, left_text), with_texts(right, right_text)
        frame = frame.join(
            right, on=functools.reduce(operator.and_, conds), how="left" if step.how == "left" else "inner"
        )
        names.append(own)
    out: dict[str, str] = {}
    reads: dict[str, ReadType] = {}
    select: list[Any] = []
    for i, s in enumerate(sources):
        rel = relations[s.table]
        for c, joined in s.columns:
            out[joined] = f"__dpkit_j{len(select)}"
            reads[joined] = rel.reads[c]
            select.append(F.col(names[i][c]).alias(out[joined]))
    return JoinedFrame(frame.select(*select), out, reads)


def same_session(a: Any, b: Any) -> bool:
    """Whether two SparkSessions are one (the same object, or two handles on one JVM session)."""
    if a is b:
        return True
    ja, jb = getattr(a, "_jsparkSession", None), getattr(b, "_jsparkSession", None)
    return ja is not None and jb is not None and bool(ja.equals(jb))
