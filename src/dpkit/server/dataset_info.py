"""A registered dataset's record: :class:`DatasetInfo`, as stored in the ``datasets`` table.

What an analyst sees of it (:meth:`DatasetInfo.public`: the declared schema, never the source or
the rows) and what the curator sees (:meth:`DatasetInfo.curator`) are decided here. A dataset of
several tables keeps its per-table sources in the same columns as JSON objects
(:mod:`dpkit.server.catalog_tables`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from dpkit._validate import Neighbours
from dpkit.analytics.check_report import DataCheck
from dpkit.analytics.check_tables import DatasetCheck
from dpkit.analytics.dataset_metadata import DatasetMetadata, is_dataset_metadata
from dpkit.analytics.metadata import Metadata
from dpkit.server import catalog_tables as several
from dpkit.server.size_class import DEFAULT_SIZE_CLASS

__all__ = ["DatasetInfo", "DATASET_COLUMNS", "dataset_from_row"]

#: The columns of the ``datasets`` table, in the order :func:`dataset_from_row` reads them.
DATASET_COLUMNS = "name, source, metadata, neighbours, created_at, source_table, engine, files, size_class"


@dataclass(frozen=True)
class DatasetInfo:
    """A registered dataset: where its rows are, its curator-declared metadata, its neighbours.

    ``source`` is the file it was registered from, relative to the service's data root when
    there is one (an absolute path otherwise). ``engine`` says what reads it: ``"duckdb"``
    (queries read the shared copy made from the source at registration,
    :mod:`dpkit.server.datasets`, named by ``name`` and ``created_at``) or ``"spark"`` (the
    source is Parquet data — a file, a directory or a glob — that the service's SparkSession
    reads in place; nothing is copied; its files are pinned at registration: ``files``).

    ``check`` is the curator's data check made at registration (how well the rows conform to the
    metadata; :class:`~dpkit.analytics.check_report.DataCheck`). It holds exact counts and raw values:
    curator only — it is not stored, and :meth:`public` never includes it.

    A dataset of several tables (:attr:`several`) has a
    :class:`~dpkit.analytics.DatasetMetadata`; ``source`` and ``table`` are then JSON objects by
    table (:attr:`sources`, :attr:`source_tables`) and ``check`` a
    :class:`~dpkit.analytics.check_tables.DatasetCheck` (:mod:`dpkit.server.catalog_tables`).
    """

    name: str
    source: str
    metadata: Metadata | DatasetMetadata
    neighbours: Neighbours
    created_at: str
    table: str | None = None  # the table inside a DuckDB database file; None for CSV / Parquet
    engine: str = "duckdb"
    check: DataCheck | DatasetCheck | None = field(default=None, compare=False, repr=False)
    #: A Spark dataset's Parquet files as registered (:func:`~dpkit.server.spark_pins.pin_files`):
    #: every process reads exactly these, unchanged, or the dataset is unavailable. None for a
    #: DuckDB dataset, a URI, and a Spark dataset registered before files were pinned. Several
    #: tables: a JSON object from table to its pins (null for a URI; :mod:`dpkit.server.spark_tables`).
    files: str | None = field(default=None, repr=False)
    #: The declared size class (:data:`dpkit.server.pacing.SIZE_CLASSES`): public, it scales the
    #: time budget of every paid answer on the dataset.
    size_class: str = "medium"

    @property
    def several(self) -> bool:
        """Whether the dataset has several tables (its metadata declares ``tables``)."""
        return isinstance(self.metadata, DatasetMetadata)

    @property
    def sources(self) -> dict[str, str]:
        """Each table's source as stored (one table: the dataset's name → ``source``)."""
        return several.stored_sources(self.source) if self.several else {self.name: self.source}

    @property
    def source_tables(self) -> dict[str, str | None]:
        """Each table's table in a .duckdb source (None for other sources)."""
        return several.stored_tables(self.table) if self.several else {self.name: self.table}

    def public(self) -> dict[str, Any]:
        """What an analyst may see: the schema the curator declared, never the source or rows. For
        several tables, each says whether it is public (a public table protects nobody)."""
        declared = self.metadata.to_dict()
        if isinstance(self.metadata, DatasetMetadata):
            declared["tables"] = {n: {"public": m.public, **m.to_dict()} for n, m in self.metadata.tables.items()}
        return {"name": self.name, "neighbours": self.neighbours, "size_class": self.size_class, **declared}

    def curator(self) -> dict[str, Any]:
        """What the curator sees: :meth:`public`, the source (for several tables, an object from
        table to source), the engine and when it was registered."""
        source: Any = self.sources if self.several else self.source
        return {**self.public(), "source": source, "engine": self.engine, "created_at": self.created_at}


def dataset_from_row(row: tuple[Any, ...]) -> DatasetInfo:
    """A ``datasets`` row (the columns of :data:`DATASET_COLUMNS`) as a :class:`DatasetInfo`."""
    n, s, m, nb, c, t, e, f, z = row
    raw = json.loads(m)
    meta = DatasetMetadata.from_dict(raw) if is_dataset_metadata(raw) else Metadata.from_dict(raw)
    return DatasetInfo(n, s, meta, nb, c, t, e, files=f, size_class=z or DEFAULT_SIZE_CLASS)
