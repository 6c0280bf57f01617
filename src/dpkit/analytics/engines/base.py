"""The interface every engine implements, and what is shared between engines.

An engine owns a table and runs :class:`~dpkit.analytics.plan.AggregationPlan` s on it: the
filter, the contribution bounding, the group-by and the exact integer sums all run inside the
engine; only noise and accounting run in dpkit (DESIGN core idea 7).
"""

from __future__ import annotations

from typing import Literal, Protocol, runtime_checkable

import pandas as pd

from dpkit.analytics.plan import AggregationPlan

__all__ = ["Engine", "ColumnKind", "quote_identifier", "ROW_SALT_MASK"]

ColumnKind = Literal["numeric", "string", "boolean", "other"]

#: The row priority is keyed by a second salt derived from the plan's (62-bit) salt.
ROW_SALT_MASK = 0x2545F4914F6CDD1D


def quote_identifier(name: str) -> str:
    """A column name as a double-quoted SQL identifier (embedded quotes doubled)."""
    return '"' + name.replace('"', '""') + '"'


@runtime_checkable
class Engine(Protocol):
    name: str

    def schema(self) -> dict[str, ColumnKind]:
        """Column name → kind, from the table's declared types (no data is read)."""
        ...

    def aggregate(self, plan: AggregationPlan) -> pd.DataFrame:
        """The plan's pre-noise aggregates: columns g0.., rows, units, <sum>, <sum>_n (int64)."""
        ...

    def values(self, plan: AggregationPlan) -> pd.DataFrame:
        """The kept rows' clipped values: columns g0.., x0.. (float64, NaN for NULL)."""
        ...
