"""The joined relation of a query over several tables, as DuckDB SQL (:class:`~dpkit.analytics.plan.JoinPlan`).

Each table is read through its typed view (the declared columns, by the declared types), truncated
when the plan says so — at most ``keep`` rows per value of ``partition``, ranked by a keyed hash of
the row's own columns (``QUALIFY row_number() ...``) — and joined in order; the result exposes
every column under its joined name, and the engine's bounded aggregation reads it in place of its
table (:mod:`dpkit.analytics.engines.duckdb`). The rules are written down before any row is read,
so no row can change how another is read or joined: a NULL key matches nothing, and two privacy-unit
columns stored as different types are compared as their canonical text.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from dpkit.analytics.engines.base import quote_identifier as q
from dpkit.analytics.plan import JoinPlan, JoinSource, join_salt

__all__ = ["Relation", "join_sql"]


@dataclass(frozen=True)
class Relation:
    """A table of the dataset as a join reads it: its typed view, and per column the SQL type it
    is stored as and the expression of its canonical text."""

    sql: str
    types: Mapping[str, str]
    text: Callable[[str, str], str]  # (column, expression) -> the expression's canonical text


def _priority(cols: list[str], salt: str, portable: bool) -> str:
    if portable:
        return f"md5(concat_ws('|', {salt}, {', '.join(cols)}))"
    return f"hash({', '.join([*cols, salt])})"


def _source(src: JoinSource, index: int, rel: Relation, salt: int, portable: bool, add: Callable[[object], str]) -> str:
    if src.keep is None:
        return f"{rel.sql} AS t{index}"
    part = ", ".join(q(c) for c in src.partition)
    order = _priority([q(c) for c in src.hashed], add(join_salt(salt, index)), portable)
    # rows with equal priorities (concat_ws skips NULLs: (a, NULL) and (NULL, a) hash alike) are
    # ordered by their values, as the Spark engine orders them, so both keep the same rows
    order += "".join(f", {q(c)} ASC NULLS LAST" for c in src.hashed)
    return (
        f"(SELECT * FROM {rel.sql} QUALIFY row_number() OVER (PARTITION BY {part} ORDER BY {order}) "
        f"<= {add(src.keep)}) AS t{index}"
    )


def join_sql(
    plan: JoinPlan, relations: Mapping[str, Relation], salt: int, portable: bool, add: Callable[[object], str]
) -> str:
    """``(SELECT <every source's columns under their joined names> FROM <sources joined>)``."""
    sources = plan.sources
    out = [f"t{i}.{q(c)} AS {q(name)}" for i, s in enumerate(sources) for c, name in s.columns]
    text = _source(plan.base, 0, relations[plan.base.table], salt, portable, add)
    for i, step in enumerate(plan.steps, start=1):
        rel = relations[step.source.table]
        conds = []
        for li, lc, rc in step.on:
            left, right = f"t{li}.{q(lc)}", f"t{i}.{q(rc)}"
            lrel = relations[sources[li].table]
            if step.as_text and lrel.types.get(lc) != rel.types.get(rc):
                left, right = lrel.text(lc, left), rel.text(rc, right)
            conds.append(f"{left} = {right}")
        kind = "LEFT JOIN" if step.how == "left" else "JOIN"
        text += f" {kind} {_source(step.source, i, rel, salt, portable, add)} ON {' AND '.join(conds)}"
    return f"(SELECT {', '.join(out)} FROM {text})"
