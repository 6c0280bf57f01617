"""Datasets of several tables on Spark: each table's Parquet data read in place, pinned, joined.

A dataset whose metadata declares ``tables`` and whose engine is ``"spark"`` gets, table by table,
exactly what a Spark dataset of one table gets (:mod:`dpkit.server.catalog`, :mod:`dpkit.server.spark_pins`):

* **The sources.** One per declared table, each Parquet data (a file, a directory or a glob)
  checked by :func:`~dpkit.server.datasets.resolve_parquet_source` (a refusal names
  ``source.<table>``); ``table`` must be None (there is no database file to pick a table from).
* **The pins.** Each table's files are pinned at registration (:func:`pin_tables`; the
  ``files`` column holds a JSON object from table to its pins, null for a URI) and checked
  before every query pays and again once Spark has read them: a change in *any* table makes the
  whole dataset unavailable before the debit, or fails the paid query after it — a join reads
  every table, so an answer about other rows of one table is not an answer about the dataset.
* **The frames.** Every table is read by the same reading rules
  (:func:`~dpkit.analytics.engines.spark_parquet.read_parquet`) on the service's one
  SparkSession, and a query's session is opened over all of them (a dict of engines, one per
  table), so a join is one Spark job over frames of one session.
* **The checks.** Each table's metadata is checked against its Parquet schema (a missing column
  is named ``metadata.tables.<table>.columns.<column>``), a session over all the frames checks the
  declarations as a whole (nothing is paid), and the curator's data check is made per table by
  DuckDB reading the same files on this machine (:class:`~dpkit.analytics.check_tables.DatasetCheck`;
  None when a table is a URI, which only Spark reads, or when a table's check fails).

The catalog reads each table through a *view*: the one-table Spark dataset the table would be
(:func:`table_views`), so every rule of one table — listing, pins, the curator's log — applies to
each table unchanged; a view is named ``dataset.table`` in the curator's log.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

from dpkit._validate import Neighbours
from dpkit._validate import short_repr as _short
from dpkit.analytics.check import check_data
from dpkit.analytics.check_report import DataCheck
from dpkit.analytics.check_tables import DatasetCheck
from dpkit.analytics.dataset_metadata import DatasetMetadata
from dpkit.analytics.engines.base import is_uri
from dpkit.errors import InvalidDataError, InvalidParameterError
from dpkit.server.dataset_info import DatasetInfo
from dpkit.server.datasets import SourcePath, check_columns, resolve_parquet_source
from dpkit.server.spark_pins import pin_files

__all__ = ["resolve_parquet_sources", "pin_tables", "table_views", "pins_after", "inspect_spark_tables"]

_curator_log = logging.getLogger("dpkit.curator")

_SOURCES = (
    "a mapping from each declared table's name to its Parquet data (a file, a directory or a glob, as for "
    "one table; on the command line: TABLE=PATH arguments)"
)


def resolve_parquet_sources(
    source: object, table: object, meta: DatasetMetadata, data_root: Path | None, fingerprint: str | None
) -> dict[str, SourcePath]:
    """Check the sources of a Spark dataset of several tables and list each table's files.
    InvalidParameterError names ``source``, ``source.<table>``, ``table`` or ``fingerprint``."""
    if table is not None:
        raise InvalidParameterError("table", _short(table), "None with engine='spark' (the sources are Parquet data)")
    if not isinstance(source, Mapping) or not source:
        raise InvalidParameterError("source", _short(source), _SOURCES, "the metadata declares several tables")
    meta.sources(source, "source")  # exactly the declared tables
    declared = list(meta.tables)
    located: dict[str, SourcePath] = {}
    for name in declared:
        try:
            located[name] = resolve_parquet_source(source[name], data_root)
        except InvalidParameterError as exc:
            raise InvalidParameterError(f"source.{name}", exc.value, exc.accepted, exc.why) from None
        if fingerprint is not None and located[name].listing is None:
            raise InvalidParameterError(
                "fingerprint", fingerprint, "None with a URI source (Spark alone lists it)", f"table {name!r}"
            )
    return located


def pin_tables(located: Mapping[str, SourcePath], fingerprint: str | None) -> str:
    """The ``files`` column of a Spark dataset of several tables: each table's pins
    (:func:`~dpkit.server.spark_pins.pin_files`; null for a URI), as a JSON object."""
    pins: dict[str, Any] = {}
    for name, found in located.items():
        try:
            pins[name] = None if found.listing is None else json.loads(pin_files(found.listing, fingerprint))
        except OSError:
            raise InvalidParameterError(
                f"source.{name}",
                found.stored,
                "Parquet files that stay in place",
                "a file vanished while it was listed",
            ) from None
    return json.dumps(pins, separators=(",", ":"))


def table_views(info: DatasetInfo) -> dict[str, DatasetInfo]:
    """Each table of a Spark dataset as the one-table Spark dataset it is read as: its source, its
    pins, its metadata, named ``dataset.table`` (dataset names have no dot: no view is mistaken
    for a dataset). A dataset of one table is its own only view."""
    if not isinstance(info.metadata, DatasetMetadata):
        return {info.name: info}
    pins: dict[str, Any] = {} if info.files is None else json.loads(info.files)
    views: dict[str, DatasetInfo] = {}
    for name, source in info.sources.items():
        files = None if pins.get(name) is None else json.dumps(pins[name], separators=(",", ":"))
        views[name] = replace(
            info, name=f"{info.name}.{name}", source=source, metadata=info.metadata.tables[name], table=None,
            files=files, check=None,
        )  # fmt: skip
    return views


def pins_after(
    views: Mapping[str, DatasetInfo], change: Callable[[DatasetInfo], str | None]
) -> Callable[[], str | None] | None:
    """The check a :class:`~dpkit.server.spark_pins.PinnedSparkEngine` makes once Spark has read
    the files: every pinned view listed again (``change``: what changed, logged for the curator;
    None: nothing), and the first change found. None when no table is pinned (URIs)."""
    pinned = [view for view in views.values() if view.files is not None]
    if not pinned:
        return None
    return lambda: next((c for c in [change(view) for view in pinned] if c is not None), None)


def inspect_spark_tables(
    info: DatasetInfo,
    located: Mapping[str, SourcePath],
    frame: Callable[[DatasetInfo, SourcePath], Any],
) -> DatasetCheck | None:
    """Read every table of a Spark dataset of several tables (``frame``: the view's DataFrame,
    InvalidDataError for the curator when Spark cannot read it), check each table's metadata
    against its schema (no row is read), open a session over all the frames (the declarations
    as a whole; nothing is paid), then make the curator's data check of each table."""
    from dpkit.analytics.session import Session
    from dpkit.budget import Budget

    meta = cast(DatasetMetadata, info.metadata)
    frames: dict[str, Any] = {}
    for name, view in table_views(info).items():
        try:
            frames[name] = frame(view, located[name])
        except InvalidDataError as exc:
            raise InvalidDataError(f"source.{name}", exc.problem, exc.accepted) from None
        try:
            check_columns(list(frames[name].columns), meta.tables[name])
        except InvalidParameterError as exc:
            inner = exc.name.removeprefix("metadata.")
            raise InvalidParameterError(f"metadata.tables.{name}.{inner}", exc.value, exc.accepted, exc.why) from None
    neighbours: Neighbours = info.neighbours
    Session(frames, metadata=meta, neighbours=neighbours, engine="spark", budget=Budget(epsilon=1.0))
    checks: dict[str, DataCheck] = {}
    for name, found in located.items():
        if is_uri(found.stored):
            return None
        try:
            checks[name] = check_data(found.path, meta.tables[name], table=name)
        except Exception:
            _curator_log.exception("the data check of dataset %r (table %s) could not be made", info.name, name)
            return None
    return DatasetCheck(checks)
