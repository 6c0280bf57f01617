"""Registered datasets of several tables: their sources, their shared copy, their checks.

A dataset whose metadata is a :class:`~dpkit.analytics.DatasetMetadata` (JSON with ``tables``)
is registered from one source per declared table, and everything a one-table dataset gets, each
table gets the same way:

* **The sources.** Each is a file under the data root, checked by
  :func:`~dpkit.server.datasets.resolve_source` (a refusal names ``source.<table>``), opened once
  and read from the open file (:mod:`dpkit.server.opened_source`). A ``.duckdb`` source names
  the table to serve in ``table`` (a mapping from declared table to its table in the file). The
  sources must name exactly the declared tables, and a declared table's name is a SQL name
  (letters, digits and ``_``): analysts write it after ``FROM`` and ``JOIN``.
* **One shared copy.** The sources are copied by the service's fixed reading rules into one
  read-only DuckDB file (:meth:`~dpkit.server.datasets.DatasetCopies.build_tables`), one table
  per declared table under its declared name, so that a join reads every table on one
  connection. Each table's metadata is checked against its copy (a missing declared column is
  named as ``metadata.tables.<table>.columns.<column>``), and a session over all of them is
  opened once, which checks the declarations of the dataset as a whole.
* **The curator's data check** (:class:`~dpkit.analytics.check_tables.DatasetCheck`) is made per
  table; the declared size class bounds the rows of *each* table (a table above it is a problem
  of its check), and a join query's time budget grows with the tables it reads
  (:class:`~dpkit.server.pacing.AnswerTimes`).
* **Stored** in the same ``datasets`` row as a one-table dataset: ``source`` is a JSON object
  from table to source (relative to the data root) and ``source_table`` one from table to its
  table in a ``.duckdb`` file (NULL when there is none).

With ``engine="spark"`` nothing is copied: each table is Parquet data read in place, pinned and
checked as a Spark dataset of one table is (:mod:`dpkit.server.spark_tables`).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, cast

from dpkit._validate import short_repr as _short
from dpkit.analytics.check import check_data
from dpkit.analytics.check_report import DataCheck
from dpkit.analytics.check_tables import DatasetCheck
from dpkit.analytics.dataset_metadata import DatasetMetadata
from dpkit.analytics.dataset_metadata import declares_tables as metadata_declares_tables
from dpkit.analytics.metadata import Metadata
from dpkit.errors import InvalidParameterError
from dpkit.server.datasets import (
    SourcePath,
    TableSource,
    check_declared_columns,
    resolve_source,
    source_kind,
)
from dpkit.server.names import DATASET_NAME, TABLE_NAME

__all__ = [
    "TableSources",
    "declares_tables",
    "resolve_table_sources",
    "stored_sources",
    "stored_tables",
    "private_sources",
    "inspect_tables",
    "table_check",
    "check_table_names",
]

_SOURCES = (
    "a mapping from each declared table's name to its file (a .csv, .parquet or .duckdb file, as for one table; "
    "on the command line: TABLE=PATH arguments)"
)


def declares_tables(metadata: object, source: object = None) -> bool:
    """Whether a registration is of several tables: ``source`` is a mapping, or the metadata (a
    :class:`DatasetMetadata`, its dict, or a JSON file) declares ``tables``. A metadata file that
    cannot be read says no: the one-table path refuses it in its own words."""
    return isinstance(source, Mapping) or metadata_declares_tables(metadata)


def check_table_names(meta: DatasetMetadata) -> None:
    """A served table's name is a SQL name: analysts write it after FROM and JOIN, unquoted."""
    for name in meta.tables:
        if not DATASET_NAME.fullmatch(name):
            raise InvalidParameterError(
                "metadata.tables",
                name,
                "table names of letters, digits and '_' (1–63 characters, not starting with a digit)",
                "analysts write them after FROM and JOIN",
            )


@dataclass(frozen=True)
class TableSources:
    """The checked sources of a dataset of several tables: each declared table's file
    (``located``) and, for a ``.duckdb`` file, the table in it (``inner``)."""

    located: Mapping[str, SourcePath]
    inner: Mapping[str, str | None]

    def stored(self) -> str:
        """The ``source`` column: a JSON object from table to its source as stored."""
        return json.dumps({t: s.stored for t, s in self.located.items()})

    def stored_tables(self) -> str | None:
        """The ``source_table`` column: a JSON object from table to its table in a .duckdb file."""
        inner = {t: x for t, x in self.inner.items() if x is not None}
        return json.dumps(inner) if inner else None


def resolve_table_sources(source: object, table: object, meta: DatasetMetadata, data_root: Path | None) -> TableSources:
    """Check the sources of a dataset of several tables (see the module docstring) and locate
    each file. InvalidParameterError names ``source``, ``source.<table>`` or ``table.<table>``."""
    if not isinstance(source, Mapping) or not source:
        raise InvalidParameterError("source", _short(source), _SOURCES, "the metadata declares several tables")
    meta.sources(source, "source")  # exactly the declared tables
    declared = list(meta.tables)
    if table is not None and (not isinstance(table, Mapping) or not set(map(str, table)) <= set(declared)):
        raise InvalidParameterError(
            "table",
            _short(table),
            "None, or a mapping from a declared table whose source is a .duckdb file to the table to serve from it",
        )
    inner_given: Mapping[str, Any] = table or {}
    located: dict[str, SourcePath] = {}
    inner: dict[str, str | None] = {}
    for name in declared:
        try:
            located[name] = resolve_source(source[name], data_root)
        except InvalidParameterError as exc:
            raise InvalidParameterError(f"source.{name}", exc.value, exc.accepted, exc.why) from None
        wanted = inner_given.get(name)
        if (source_kind(located[name].path) == "duckdb") != (wanted is not None):
            raise InvalidParameterError(
                f"table.{name}", wanted, "a table name with a .duckdb source, and no table otherwise"
            )
        if wanted is not None and (not isinstance(wanted, str) or not TABLE_NAME.fullmatch(wanted)):
            raise InvalidParameterError(f"table.{name}", _short(wanted), "a table name ('people' or 'schema.people')")
        inner[name] = wanted
    return TableSources(located, inner)


def stored_sources(text: str) -> dict[str, str]:
    """Each table's stored source, from the ``source`` column of a dataset of several tables."""
    found: dict[str, str] = json.loads(text)
    return found


def stored_tables(text: str | None) -> dict[str, str | None]:
    """Each table's table in a .duckdb source (absent: None), from the ``source_table`` column."""
    found: dict[str, str | None] = {} if text is None else json.loads(text)
    return found


def relocate(sources: Mapping[str, str], inner: Mapping[str, str | None], data_root: Path | None) -> TableSources:
    """A registered dataset's sources located again, by the same rules as at registration (a
    link may have been changed since)."""
    located: dict[str, SourcePath] = {}
    for name, stored in sources.items():
        if data_root is None and not Path(stored).is_absolute():
            raise InvalidParameterError(
                f"source.{name}", stored, "an absolute path, or a service with the data root it was registered under"
            )
        located[name] = resolve_source(stored, data_root)
    return TableSources(located, {t: inner.get(t) for t in sources})


@contextlib.contextmanager
def private_sources(
    sources: TableSources, private: Callable[[SourcePath], contextlib.AbstractContextManager[Path]]
) -> Iterator[dict[str, TableSource]]:
    """Each table's private copy of its opened source (``private``, as for one table), for the
    block: what :meth:`~dpkit.server.datasets.DatasetCopies.build_tables` copies."""
    with contextlib.ExitStack() as stack:
        yield {t: (stack.enter_context(private(s)), sources.inner[t]) for t, s in sources.located.items()}


def _within(table: str, exc: InvalidParameterError) -> InvalidParameterError:
    """A one-table refusal about the metadata, named inside its table's declaration."""
    name = exc.name.removeprefix("metadata.")
    return InvalidParameterError(f"metadata.tables.{table}.{name}", exc.value, exc.accepted, exc.why)


def inspect_tables(
    conn: Any,
    meta: DatasetMetadata,
    neighbours: Any,
    sources: Mapping[str, TableSource],
    report: Callable[[Callable[[], DataCheck]], DataCheck | None],
) -> DatasetCheck | None:
    """Check the metadata against the copy's tables (nothing read but their schemas), open a
    session over all of them (which checks the declarations as a whole; nothing is paid), then
    make each table's data check (``report`` runs one and logs its failure for the curator; a
    table whose check failed leaves the whole check None)."""
    from dpkit.analytics.engines.duckdb import DuckDBEngine
    from dpkit.analytics.session import Session
    from dpkit.budget import Budget

    for name, table_meta in meta.tables.items():
        try:
            check_declared_columns(conn, name, table_meta)
        except InvalidParameterError as exc:
            raise _within(name, exc) from None
    cursor = conn.cursor()
    engines = {name: DuckDBEngine(None, connection=cursor, table=name) for name in meta.tables}
    Session(engines, metadata=cast(Any, meta), neighbours=neighbours, budget=Budget(epsilon=1.0))
    checks: dict[str, DataCheck] = {}
    for name, table_meta in meta.tables.items():
        path = sources[name][0]
        found = report(lambda n=name, m=table_meta, p=path: table_check(conn, n, m, p))  # type: ignore[misc]
        if found is None:
            return None
        checks[name] = found
    return DatasetCheck(checks)


def table_check(conn: Any, table: str, meta: Metadata, source: Path) -> DataCheck:
    """The curator's data check of one table of a copy (exactly what queries read); for a CSV
    source, with the lines its reader dropped counted from the file."""
    check = check_data((conn.cursor(), table), meta)
    if source_kind(source) == "csv":
        from dpkit.analytics.check_reading import csv_reading_check
        from dpkit.analytics.engines.csv_source import CsvFile, CsvOptions

        check = replace(check, reading=csv_reading_check(CsvFile(source, CsvOptions())))
    return check
