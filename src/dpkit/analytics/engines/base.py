"""The interface every engine implements, and what is shared between engines.

An engine owns a table and runs :class:`~dpkit.analytics.plan.AggregationPlan` s on it: the
filter, the contribution bounding, the group-by and the exact integer sums all run inside the
engine; only noise and accounting run in dpkit (docs/architecture.md, "Analytics").
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Literal, Protocol, runtime_checkable

import pandas as pd

from dpkit.analytics.plan import AggregationPlan

__all__ = [
    "is_uri",
    "default_table",
    "is_spark_frame",
    "Engine",
    "ColumnKind",
    "ReadType",
    "quote_identifier",
    "sql_string",
    "ROW_SALT_MASK",
    "SUM_LIMIT",
    "EXACT_INTEGER_LIMIT",
]

#: A source column's physical kind, from the source's own schema (never from its rows).
#: ``nested`` (LIST, STRUCT, MAP, arrays, …) cannot be declared.
ColumnKind = Literal["numeric", "string", "boolean", "nested", "other"]

#: The declared type a column is read as. ``double`` and ``integer`` take finite numbers
#: (integers within ±2**53) and make anything else NULL; ``string`` is the value as text
#: (surrounding whitespace removed when the metadata says ``strip_strings``); ``boolean`` takes
#: true/false (and their usual spellings) and makes anything else NULL; ``unit`` is the privacy
#: unit's value as stored when it is a number or a boolean (it is only compared and hashed), else
#: its text.
ReadType = Literal["double", "integer", "string", "boolean", "unit"]

#: Exact integer sums are clamped to ±SUM_LIMIT grid steps inside the engine (clamping is
#: 1-Lipschitz, so no sensitivity grows) instead of failing on an overflow after the debit.
SUM_LIMIT = 2**62
#: The largest magnitude below which every integer is an exact double: integers read from a
#: source must lie within it (else NULL), and sums released with Gaussian noise are clamped to it.
EXACT_INTEGER_LIMIT = 2**53

#: The row priority is keyed by a second salt derived from the plan's (62-bit) salt.
ROW_SALT_MASK = 0x2545F4914F6CDD1D


#: A URI with a scheme (hdfs://, s3a://, file://): Spark's file systems list and read it; it is
#: never a local path.
_URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]+://")


def is_uri(path: str) -> bool:
    """Whether ``path`` is a URI with a scheme rather than a local path."""
    return _URI.match(path) is not None


def default_table(path: str) -> str:
    """The table a Parquet file, directory or glob is named after when ``table=`` is not given:
    the file's or the directory's name up to its first dot (``events.parquet``, ``events/`` and
    Spark's ``events.parquet/`` are ``events``), for a glob the last directory before its first
    wildcard (``events/**/*.parquet`` is ``events``); ``data`` when that leaves no name
    (``*.parquet``, ``.``). Only the path the caller gave is read, never the data."""
    parts = re.split(r"[/\\]+", path.rstrip("/\\"))
    for i, part in enumerate(parts):
        if any(c in part for c in "*?["):
            parts = parts[:i]
            break
    name = parts[-1].split(".")[0] if parts else ""
    return name if name and not name.endswith(":") else "data"


def is_spark_frame(data: object) -> bool:
    """Whether ``data`` comes from pyspark (a classic or Spark Connect DataFrame): decided by its
    type's module, without importing pyspark."""
    return type(data).__module__.startswith("pyspark.")


def quote_identifier(name: str) -> str:
    """A column name as a double-quoted SQL identifier (embedded quotes doubled)."""
    return '"' + name.replace('"', '""') + '"'


def sql_string(text: str) -> str:
    """``text`` as a single-quoted SQL string literal (embedded quotes doubled)."""
    return "'" + text.replace("'", "''") + "'"


@runtime_checkable
class Engine(Protocol):
    name: str

    def schema(self) -> dict[str, ColumnKind]:
        """Column name → physical kind, from the source's schema (no row is read)."""
        ...

    def bind(self, types: Mapping[str, ReadType], *, strip_strings: bool) -> None:
        """From now on, plans run over the declared columns only, each read as its declared type
        by a total rule (a value that does not conform becomes NULL; nothing can fail)."""
        ...

    def aggregate(self, plan: AggregationPlan) -> pd.DataFrame:
        """The plan's pre-noise aggregates: columns g0.., rows, units, <sum>, <sum>_n (int64)."""
        ...

    def compute(self, plan: AggregationPlan) -> tuple[pd.DataFrame, pd.DataFrame | None]:
        """The aggregates and, when the plan has ``values``, the quantiles' cell counts (columns
        g0.., __k, __cell, rows; int64 counts, occupied cells only), from one bounding pass. Only
        counts leave the engine: their number is bounded by groups × cells, never by rows."""
        ...
