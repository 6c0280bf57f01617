"""What a :class:`~dpkit.analytics.Session` over several tables opens once: one engine per table,
all on one connection (DuckDB) or one SparkSession, each bound to its table's declared columns;
each table's declared facts; and the joined tables queries ask for (:mod:`dpkit.analytics.joins`).

Everything is decided from the arguments, the metadata and the sources' schemas — no private row
is read. A public table's values are read when a query asks for them (its categorical columns'
keys, a key table's rows): they are public, so reading them reveals nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dpkit._validate import Neighbours
from dpkit._validate import short_repr as _short
from dpkit.analytics.dataset_metadata import DatasetMetadata
from dpkit.analytics.declared import DeclaredTable
from dpkit.analytics.engines.base import Engine, is_spark_frame
from dpkit.analytics.joins import join_table, keys_from_table
from dpkit.analytics.limits import QueryLimits
from dpkit.analytics.session_setup import bind_columns, duckdb_only
from dpkit.analytics.spec import Join
from dpkit.errors import InvalidParameterError

__all__ = ["TableSet", "check_tables_arguments", "open_tables"]


@dataclass
class TableSet:
    """The tables of one session: engines and declared facts by table name."""

    dataset: DatasetMetadata
    engines: dict[str, Engine]
    facts: dict[str, DeclaredTable]
    _keys: dict[tuple[str, tuple[str, ...]], tuple[tuple[Any, ...], ...]] = field(default_factory=dict)

    @property
    def default(self) -> str | None:
        """The table a query reads when it names none: the dataset's only private table."""
        private = self.dataset.private_tables
        return private[0] if len(private) == 1 else None

    def table(self, name: object) -> str:
        return self.dataset.table(name, "from")

    def public_keys(self, table: str, columns: tuple[str, ...]) -> tuple[tuple[Any, ...], ...]:
        """The distinct rows of public ``table`` over ``columns`` (read once per session)."""
        assert self.dataset.tables[table].public  # only public values are ever read before paying
        key = (table, columns)
        if key not in self._keys:
            self._keys[key] = self.engines[table].distinct_rows(columns)  # type: ignore[attr-defined]
        return self._keys[key]

    def declared(self, table: str) -> DeclaredTable:
        """The declared facts of one table, read alone."""
        name = self.table(table)
        if self.dataset.tables[name].public:
            raise InvalidParameterError(
                "from",
                name,
                "a private table of the dataset (" + ", ".join(map(repr, self.dataset.private_tables)) + ")",
                "a public table's rows belong to nobody: read a private table and join the public one to it",
            )
        return self.facts[name]

    def joined(self, base: str, joins: Sequence[Join]) -> DeclaredTable:
        return join_table(self.dataset, self.facts, base, joins, public_keys=self.public_keys)

    def keys(self, table: object, columns: Sequence[str]) -> tuple[tuple[Any, ...], ...]:
        return keys_from_table(table, columns, self.public_keys, self.dataset)


def check_tables_arguments(
    meta: object, privacy_unit: object, row_level: object, table: object, engine: object
) -> None:
    """The arguments of a session over several tables that a one-table session takes otherwise."""
    if not isinstance(meta, DatasetMetadata):
        raise InvalidParameterError(
            "metadata",
            _short(meta),
            "a DatasetMetadata (or its dict, with 'tables') for a dict of tables",
            "each table is declared by name, with who it protects",
        )
    for name, value in (("privacy_unit", privacy_unit), ("row_level", row_level)):
        if value is not None:
            raise InvalidParameterError(
                name, _short(value), "None with several tables", "each table's metadata declares who it protects"
            )
    if table != "data":
        raise InvalidParameterError(
            "table", _short(table), "'data' (unset) with several tables: they are named by the dict"
        )
    if engine is not None and not isinstance(engine, str):
        raise InvalidParameterError("engine", _short(engine), "'duckdb', 'spark' or None with several tables")


def _engines(
    data: Mapping[str, Any], engine: object, memory_limit: object, temp_directory: object
) -> dict[str, Engine]:
    if engine not in (None, "duckdb", "spark"):
        raise InvalidParameterError(
            "engine", _short(engine), "'duckdb' or 'spark' (or None: chosen from the data) for several tables"
        )
    # (a Spark Connect DataFrame answers every attribute with a column: it passes for an Engine)
    given = [isinstance(d, Engine) and not is_spark_frame(d) for d in data.values()]
    if any(given):  # engines already open on one connection (the curator service's shared copy)
        if not all(given):
            raise InvalidParameterError(
                "data", sorted(n for n, g in zip(data, given, strict=True) if not g), "Engine instances for every table"
            )
        duckdb_only(memory_limit, temp_directory, "Engine instances")
        return dict(data)
    spark = [is_spark_frame(d) for d in data.values()]
    if engine == "spark" or any(spark):
        if not all(spark):
            raise InvalidParameterError(
                "data",
                sorted(n for n, s in zip(data, spark, strict=True) if not s),
                "pyspark DataFrames for every table (the tables of one session are on one engine)",
            )
        duckdb_only(memory_limit, temp_directory, "engine='spark'")
        from dpkit.analytics.engines.spark import SparkEngine

        return {name: SparkEngine(frame) for name, frame in data.items()}
    import duckdb

    from dpkit.analytics.engines.duckdb import DuckDBEngine

    con = duckdb.connect()
    return {
        name: DuckDBEngine(d, connection=con, memory_limit=memory_limit, temp_directory=temp_directory)  # type: ignore[arg-type]
        for name, d in data.items()
    }


def open_tables(
    data: object,
    meta: DatasetMetadata,
    *,
    engine: object,
    memory_limit: object,
    temp_directory: object,
    neighbours: Neighbours,
    limits: QueryLimits,
    portable: bool,
    max_groups: int,
    max_rows: int,
) -> TableSet:
    """Open and bind every table of ``data`` (name → source: a DataFrame, a CSV or Parquet path, a
    pyspark DataFrame) against ``meta``: the tables must be exactly the declared ones."""
    engines = _engines(meta.sources(data), engine, memory_limit, temp_directory)
    facts: dict[str, DeclaredTable] = {}
    tables = TableSet(meta, engines, facts)
    for name, table_meta in meta.tables.items():
        unit = table_meta.privacy_unit
        kinds = bind_columns(engines[name], table_meta, unit)
        facts[name] = DeclaredTable(
            table=name,
            columns=kinds,
            metadata=table_meta,
            unit=unit,
            neighbours=neighbours,
            max_groups=max_groups,
            max_rows=max_rows,
            limits=limits,
            portable=portable,
            public_keys=tables.public_keys,
            tables=(name,),
        )
    for e in engines.values():
        e.attach(engines)  # type: ignore[attr-defined]
    return tables
