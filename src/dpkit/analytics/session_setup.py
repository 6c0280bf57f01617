"""What a :class:`~dpkit.analytics.session.Session` does once, when it is made: check its
arguments (the randomness, the privacy unit, the budget or ledger), open the engine for its data,
and bind the declared columns to the source.

Apart from the session, which is the front of every query (its state, the builder's entry
points, SQL, paying), because none of this runs again after construction and all of it is
decided from the arguments and the source's schema — never a row: a bad argument is an
:class:`~dpkit.errors.InvalidParameterError` before anything is read or spent.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from dpkit._validate import short_repr as _short
from dpkit.analytics.dataset_metadata import DatasetMetadata, is_dataset_metadata
from dpkit.analytics.declared import ColumnKind
from dpkit.analytics.engines.base import Engine, ReadType, is_spark_frame
from dpkit.analytics.metadata import Metadata
from dpkit.budget import Budget
from dpkit.errors import InvalidParameterError
from dpkit.ledger.base import LedgerBackend
from dpkit.noise.source import is_seeded, resolve_rng

__all__ = ["bind_columns", "check_budget", "check_rng", "check_unit", "duckdb_only", "load_metadata", "make_engine"]


def load_metadata(metadata: object) -> Any:
    """The declared schema: a :class:`Metadata` (one table) or a :class:`DatasetMetadata` (several
    tables), from itself, its dict or its JSON file (None: nothing declared)."""
    if metadata is None:
        return Metadata()
    if isinstance(metadata, (Metadata, DatasetMetadata)):
        return metadata
    if isinstance(metadata, dict):
        return DatasetMetadata.from_dict(metadata) if is_dataset_metadata(metadata) else Metadata.from_dict(metadata)
    if isinstance(metadata, (str, os.PathLike)):
        try:
            raw = json.loads(Path(metadata).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return Metadata.from_json(metadata)  # its refusal, naming the file
        return DatasetMetadata.from_dict(raw) if is_dataset_metadata(raw) else Metadata.from_dict(raw)
    raise InvalidParameterError(
        "metadata", _short(metadata), "a Metadata, a DatasetMetadata, a dict, a JSON file path, or None"
    )


def check_rng(rng: object, ledger: object) -> None:
    """``rng`` must be randomness; a seeded one never meets a ledger (tests and teaching use an
    in-memory Budget)."""
    if rng is None:
        return
    resolve_rng(rng)  # a clear error for anything that is not randomness
    if is_seeded(rng) and ledger is not None:
        raise InvalidParameterError(
            "rng",
            _short(rng),
            "None (the secure default) when spending from a ledger",
            "seeded noise can be replayed and subtracted, so a ledger would charge for privacy that was not given; use budget=dp.Budget(...) for tests and teaching",
        )


def duckdb_only(memory_limit: object, temp_directory: object, engine: str) -> None:
    """``memory_limit`` and ``temp_directory`` are settings of a connection dpkit opens; refused
    with any other engine."""
    for name, value in (("memory_limit", memory_limit), ("temp_directory", temp_directory)):
        if value is not None:
            raise InvalidParameterError(
                name,
                _short(value),
                f"None with {engine}",
                "memory_limit and temp_directory are settings of the DuckDB connection a session opens; "
                "configure other engines (and connections of your own) directly",
            )


def make_engine(data: Any, engine: object, memory_limit: object = None, temp_directory: object = None) -> Engine:
    """The engine for ``data``: the instance given, Spark for a pyspark DataFrame (or
    ``engine="spark"``), else a DuckDB connection of the session's own (with its memory settings)."""
    if engine is not None and not isinstance(engine, str):
        if isinstance(engine, Engine):
            duckdb_only(memory_limit, temp_directory, "an engine instance")
            return engine
        raise InvalidParameterError(
            "engine", _short(engine), "'duckdb', 'spark', an Engine instance, or None (chosen from the data)"
        )
    if engine not in (None, "duckdb", "spark"):
        raise InvalidParameterError(
            "engine", engine, "'duckdb', 'spark', an Engine instance, or None (chosen from the data)"
        )
    is_spark = is_spark_frame(data)
    if engine == "spark" or (engine is None and is_spark):
        if not is_spark:
            raise InvalidParameterError(
                "engine",
                engine,
                "'spark' only with a pyspark DataFrame as data",
                "read Parquet files on Spark with Session.from_parquet(path, engine='spark')",
            )
        duckdb_only(memory_limit, temp_directory, "engine='spark'")
        from dpkit.analytics.engines.spark import SparkEngine

        return SparkEngine(data)
    from dpkit.analytics.engines.duckdb import DuckDBEngine

    return DuckDBEngine(data, memory_limit=memory_limit, temp_directory=temp_directory)  # type: ignore[arg-type]  # checked there


def check_unit(meta: Metadata, privacy_unit: object, row_level: object) -> str | None:
    """The privacy unit, stated explicitly (a column) or row-level by declaration."""
    if row_level is not None and not isinstance(row_level, bool):
        raise InvalidParameterError("row_level", row_level, "True, False or None (the metadata's)")
    if privacy_unit is not None:
        if not isinstance(privacy_unit, str) or not privacy_unit:
            raise InvalidParameterError("privacy_unit", _short(privacy_unit), "a column name")
        if row_level:
            raise InvalidParameterError(
                "row_level",
                row_level,
                "False or None with a privacy_unit",
                "a session protects either the unit column's people or rows, not both",
            )
        return privacy_unit
    if row_level:
        if meta.privacy_unit is not None:
            raise InvalidParameterError(
                "row_level",
                True,
                f"False or None: the metadata declares the privacy unit {meta.privacy_unit!r}",
                "protecting rows would give a person with several rows several times the budget",
            )
        return None
    if meta.privacy_unit is not None:
        return meta.privacy_unit
    if meta.row_level and row_level is None:
        return None
    raise InvalidParameterError(
        "privacy_unit",
        None,
        "the column naming the person (privacy_unit='user_id'), or row_level=True when every row is a different person",
        "with several rows per person, protecting rows protects nobody: say who the unit is (here or in the metadata)",
    )


def check_budget(
    budget: object, ledger: object, dataset: object, analyst: object, table: str
) -> tuple[Any, Any, str | None, str | None]:
    """Where the session pays: (budget, None, None, None) for an in-memory :class:`dpkit.Budget`,
    or (None, ledger, dataset, analyst) for a ledger (opened from its path) whose budget for
    (dataset — default ``table`` —, analyst) must already exist."""
    if (budget is None) == (ledger is None):
        raise InvalidParameterError(
            "budget",
            _short(budget),
            "exactly one of budget= (a dpkit.Budget) and ledger= (a ledger or its path)",
            "every release is paid for, so a session needs somewhere to pay",
        )
    if budget is not None:
        if not isinstance(budget, Budget):
            raise InvalidParameterError("budget", _short(budget), "a dpkit.Budget (e.g. Budget(epsilon=1.0))")
        return budget, None, None, None
    if isinstance(ledger, (str, os.PathLike)):
        from dpkit.ledger import open_ledger

        ledger = open_ledger(ledger)
    if not isinstance(ledger, LedgerBackend):
        raise InvalidParameterError("ledger", _short(ledger), "a ledger (dpkit.open_ledger(path)) or the path of one")
    dataset = table if dataset is None else dataset
    for name, value in (("dataset", dataset), ("analyst", analyst)):
        if not isinstance(value, str) or not value:
            raise InvalidParameterError(name, value, "a non-empty name of a budget in the ledger")
    ledger.get_budget(dataset, analyst)  # type: ignore[arg-type]  # LedgerError if there is none
    return None, ledger, dataset, analyst  # type: ignore[return-value]


def bind_columns(engine: Engine, meta: Metadata, unit: str | None) -> dict[str, ColumnKind]:
    """Check the declared schema against the source's own schema (no row is read) and read
    every declared column as its declared type from now on; the declared columns' kinds."""
    physical = engine.schema()
    names = list(meta.columns) + ([unit] if unit is not None and unit not in meta.columns else [])
    for name in names:
        what = "privacy_unit" if name == unit and name not in meta.columns else f"metadata.columns.{name}"
        if name not in physical:
            raise InvalidParameterError(what, name, "a column of the source", "the declared column is not in the table")
        if physical[name] == "nested":
            raise InvalidParameterError(
                what,
                name,
                "a column of a scalar type (number, text or boolean)",
                "LIST, STRUCT, MAP and array columns cannot be declared",
            )
    types: dict[str, ReadType] = {}
    kinds: dict[str, ColumnKind] = {}
    for name in meta.columns:
        types[name] = meta.read_type(name)
        kinds[name] = meta.kind(name)
    if unit is not None and unit not in meta.columns:
        types[unit] = "unit"
        kinds[unit] = "unit"
    engine.bind(types, strip_strings=meta.strip_strings)
    return kinds
