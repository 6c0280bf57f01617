"""The curator's data check of a dataset of several tables: one :class:`DataCheck` per table.

**Curator only — this is not a private release** (see :mod:`dpkit.analytics.check`). Each
table is read as a query reads it and checked against its own declared
:class:`~dpkit.analytics.Metadata` from the dataset's
:class:`~dpkit.analytics.DatasetMetadata`; a public table is checked the same way, without a
privacy unit.

>>> import pandas as pd
>>> from dpkit.analytics.dataset_metadata import DatasetMetadata
>>> meta = DatasetMetadata.from_dict({"tables": {
...     "visits": {"privacy_unit": "pid", "columns": {"zip": {"type": "categorical"}}},
...     "zips": {"public": True, "max_matches": 1, "columns": {"zip": {"type": "categorical"}}}}})
>>> report = check_dataset({"visits": pd.DataFrame({"pid": [1, 2], "zip": ["a", "b"]}),
...                         "zips": pd.DataFrame({"zip": ["a", "b", "c"]})}, meta)
>>> report.ok, report.table("zips").rows
(True, 3)
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from dpkit._validate import short_repr as _short
from dpkit.analytics.check import check_data
from dpkit.analytics.check_report import DataCheck
from dpkit.analytics.dataset_metadata import DatasetMetadata
from dpkit.analytics.session_setup import load_metadata
from dpkit.errors import InvalidParameterError

__all__ = ["DatasetCheck", "check_dataset", "dataset_metadata"]


@dataclass(frozen=True)
class DatasetCheck:
    """The curator's report of how each table of a dataset conforms to its metadata: ``tables``
    maps each declared table's name to its :class:`~dpkit.analytics.check_report.DataCheck`.
    Curator only: it holds exact counts and raw values of the private data."""

    tables: Mapping[str, DataCheck]

    def __post_init__(self) -> None:
        object.__setattr__(self, "tables", MappingProxyType(dict(self.tables)))

    @property
    def ok(self) -> bool:
        """Every table conforms (:attr:`DataCheck.ok` of each)."""
        return all(c.ok for c in self.tables.values())

    @property
    def problems(self) -> tuple[str, ...]:
        """Every table's problems, each prefixed with its table's name."""
        return tuple(f"{name}: {p}" for name, c in self.tables.items() for p in c.problems)

    def table(self, name: str) -> DataCheck:
        """The check of one table, by name."""
        if name not in self.tables:
            raise InvalidParameterError("table", _short(name), "one of " + ", ".join(map(repr, self.tables)))
        return self.tables[name]

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict: ``ok`` and each table's :meth:`DataCheck.to_dict`."""
        return {"curator_only": True, "ok": self.ok, "tables": {n: c.to_dict() for n, c in self.tables.items()}}

    def to_text(self) -> str:
        """Each table's report, one after the other, as plain text for the terminal."""
        return "\n\n".join(c.to_text() for c in self.tables.values())

    def __str__(self) -> str:
        return self.to_text()


def dataset_metadata(metadata: object) -> DatasetMetadata:
    """A :class:`DatasetMetadata` from itself, its dict or the path of its JSON file
    (InvalidParameterError naming ``metadata`` otherwise)."""
    if isinstance(metadata, (DatasetMetadata, Mapping, str, os.PathLike)):
        meta = load_metadata(metadata)
        if isinstance(meta, DatasetMetadata):
            return meta
        raise InvalidParameterError(
            "metadata", _short(metadata), "the metadata of a dataset of several tables (a JSON object with 'tables')"
        )
    raise InvalidParameterError(
        "metadata", _short(metadata), "a DatasetMetadata, a dict with 'tables', or the path of its JSON file"
    )


def check_dataset(
    sources: Mapping[str, Any], metadata: DatasetMetadata | Mapping[str, Any] | str | os.PathLike[str]
) -> DatasetCheck:
    """Check how well each table of a dataset conforms to its declared metadata — a report for
    the curator only.

    ``sources`` maps each declared table's name to its data, in any form
    :func:`~dpkit.analytics.check.check_data` takes (a CSV or Parquet path, a
    :class:`~dpkit.analytics.engines.duckdb.CsvFile`, a DataFrame, a ``(duckdb connection,
    table name)`` pair …); it must name exactly the declared tables. ``metadata``: a
    :class:`DatasetMetadata`, its dict or its JSON file. Each report is named by its table."""
    meta = dataset_metadata(metadata)
    sources = meta.sources(sources)
    reports: dict[str, DataCheck] = {}
    for name, table_meta in meta.tables.items():
        source = sources[name]
        inner = isinstance(source, tuple)  # a (connection, table) pair names its own table
        reports[name] = check_data(source, table_meta, table=None if inner else name)
    return DatasetCheck(reports)
