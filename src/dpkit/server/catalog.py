"""The registered datasets: registration, lookup, and each process's read-only connections.

A dataset's metadata declares every usable column and the privacy unit (``privacy_unit`` or
``row_level``); the source is copied once, at registration, with the same fixed, non-sniffing
read as :class:`~dpkit.analytics.engines.duckdb.DuckDBEngine` (every CSV column as text, cast to
its declared type when queried), so no row can fail a load or change a type
(:mod:`dpkit.server.datasets` holds the copies). A registered dataset is never changed or
replaced: its budgets refer to it. At registration the curator (only) gets the data check
(:func:`dpkit.analytics.check.check_data`). A dataset of several tables (metadata with
``tables``) gets all of this table by table, in one shared copy (:mod:`dpkit.server.catalog_tables`),
or on Spark read in place, each table pinned (:mod:`dpkit.server.spark_tables`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePath
from typing import Any

from dpkit import _validate as v
from dpkit._validate import Neighbours
from dpkit._validate import short_repr as _short
from dpkit.analytics.check import check_data
from dpkit.analytics.check_report import DataCheck
from dpkit.analytics.check_tables import DatasetCheck, dataset_metadata
from dpkit.analytics.dataset_metadata import DatasetMetadata
from dpkit.analytics.engines.base import is_uri
from dpkit.analytics.metadata import Metadata
from dpkit.analytics.session import Session
from dpkit.analytics.session_setup import load_metadata
from dpkit.budget import Budget
from dpkit.errors import DPError, InvalidDataError, InvalidParameterError
from dpkit.server import catalog_tables as several
from dpkit.server.dataset_info import DATASET_COLUMNS, DatasetInfo, dataset_from_row
from dpkit.server.datasets import (
    DatasetCopies,
    SourcePath,
    SourceReadError,
    check_columns,
    check_declared_columns,
    resolve_parquet_source,
    resolve_source,
    source_kind,
)
from dpkit.server.errors import DatasetUnavailableError, NotFoundError
from dpkit.server.names import DATASET_NAME, TABLE_NAME, check_dataset_name
from dpkit.server.opened_source import open_source, snapshot
from dpkit.server.size_class import DEFAULT_SIZE_CLASS, check_size_class, fits_size_class
from dpkit.server.spark_pins import PinnedSparkEngine, check_fingerprint, pin_files, pinned_change
from dpkit.server.spark_tables import inspect_spark_tables, pin_tables, pins_after, resolve_parquet_sources, table_views
from dpkit.server.store import ServiceStore, now

__all__ = ["DatasetInfo", "Catalog"]

#: Where details that must not reach an analyst go (load failures, the data check's failures).
_curator_log = logging.getLogger("dpkit.curator")

ENGINES = ("duckdb", "spark")
_IDLE_ENGINES = 32  # bound engines kept per dataset and process (about one per concurrent query)


@dataclass
class _Loaded:
    """One process's read-only connection to a dataset's shared copy, and its idle engines: each
    a cursor of that connection with the declared schema already read and its typed view
    already bound, so a query does not redo either (they never change for a registered dataset).
    An engine serves one query at a time.

    For a Spark dataset ``connection`` is None and ``frame`` the DataFrame over its Parquet data
    (exactly the files pinned at registration); each engine is a
    :class:`~dpkit.analytics.engines.spark.SparkEngine` over it, and Spark runs the queries of
    several engines at once."""

    connection: Any
    lock: threading.Lock = field(default_factory=threading.Lock)
    idle: list[Any] = field(default_factory=list)
    frame: Any = None
    #: A pinned Spark dataset's check after each job (:class:`~dpkit.server.spark_pins.PinnedSparkEngine`).
    after: Callable[[], str | None] | None = None
    #: A dataset of several tables: their names in the copy. Each taken item is then a dict of
    #: engines, one per table, all on one cursor (a join reads them together); on Spark ``frame``
    #: is then a dict of DataFrames by table, all on one SparkSession.
    tables: tuple[str, ...] | None = None

    def take(self, table: str) -> Any:
        with self.lock:
            if self.idle:
                return self.idle.pop()
            if self.frame is not None:
                from dpkit.analytics.engines.spark import SparkEngine

                def one(f: Any) -> Any:
                    return SparkEngine(f) if self.after is None else PinnedSparkEngine(f, self.after)

                return one(self.frame) if self.tables is None else {t: one(self.frame[t]) for t in self.tables}
            cursor = self.connection.cursor()  # cursors are created one at a time
        from dpkit.analytics.engines.duckdb import DuckDBEngine

        if self.tables is not None:
            return {t: DuckDBEngine(None, connection=cursor, table=t) for t in self.tables}
        return DuckDBEngine(None, connection=cursor, table=table)

    def close(self) -> None:
        if self.connection is not None:
            self.connection.close()

    def give_back(self, engine: Any) -> None:
        with self.lock:
            if len(self.idle) < _IDLE_ENGINES:
                self.idle.append(engine)


class Catalog:
    """The ``datasets`` table of one service store, the shared copies in ``copies``, and this
    process's connections to them.

    ``data_root``: datasets are registered only from under this directory (None: anywhere — the
    in-process API is the administrator's own; the HTTP service always sets one).
    ``engine_threads``: DuckDB threads per query in this process (None: DuckDB's default).
    ``spark``: returns this process's SparkSession, for Spark datasets (called when one is first
    registered or read in a process; None: :func:`~dpkit.analytics.engines.spark.spark_session`,
    a local one)."""

    def __init__(
        self,
        store: ServiceStore,
        copies: DatasetCopies,
        *,
        data_root: Path | None,
        engine_threads: int | None,
        spark: Callable[[], Any] | None = None,
    ) -> None:
        self._spark = spark
        self._store = store
        self._copies = copies
        self._data_root = data_root
        self._engine_threads = engine_threads
        self._known: dict[str, DatasetInfo] = {}  # registered datasets read so far (immutable rows)
        self.data: dict[str, _Loaded] = {}  # this process's read-only connections to dataset copies
        self._data_lock = threading.Lock()
        self._data_pid = os.getpid()  # a forked child opens its own connections

    def close(self) -> None:
        with self._data_lock:
            if self._data_pid == os.getpid():  # a forked child leaves its parent's connections alone
                for loaded in self.data.values():
                    loaded.close()
            self.data.clear()

    # -- registration ----------------------------------------------------------------------------

    def register(
        self,
        name: str,
        source: str | os.PathLike[str] | Mapping[str, str | os.PathLike[str]],
        metadata: Metadata | DatasetMetadata | dict[str, Any] | str | os.PathLike[str],
        *,
        neighbours: Neighbours = "add_remove",
        table: str | Mapping[str, str] | None = None,
        engine: str = "duckdb",
        size_class: str = DEFAULT_SIZE_CLASS,
        fingerprint: str | None = None,
    ) -> DatasetInfo:
        """See :meth:`dpkit.server.service.Service.register_dataset`."""
        check_dataset_name(name)
        check_size_class(size_class)
        if not isinstance(engine, str) or engine not in ENGINES:
            raise InvalidParameterError(
                "engine", engine, "'duckdb' (a shared copy, the default) or 'spark' (Parquet read in place)"
            )
        check_fingerprint(fingerprint, engine)
        if several.declares_tables(metadata, source):
            return self._register_tables(name, source, metadata, neighbours, table, engine, size_class, fingerprint)
        if isinstance(table, Mapping):
            raise InvalidParameterError("table", _short(table), "a table name with a .duckdb source, else None")
        if engine == "spark":
            if table is not None:
                raise InvalidParameterError("table", table, "None with engine='spark' (the source is Parquet data)")
            located = resolve_parquet_source(source, self._data_root)
            if fingerprint is not None and located.listing is None:
                raise InvalidParameterError("fingerprint", fingerprint, "None with a URI source (Spark alone lists it)")
        else:
            located = resolve_source(source, self._data_root)
        if engine == "duckdb" and (source_kind(located.path) == "duckdb") != (table is not None):
            raise InvalidParameterError("table", table, "a table name with a .duckdb source, and no table otherwise")
        if table is not None and not TABLE_NAME.fullmatch(table):
            raise InvalidParameterError("table", table, "a table name ('people' or 'schema.people')")
        meta = load_metadata(str(metadata) if isinstance(metadata, os.PathLike) else metadata)
        if meta.privacy_unit is None and not meta.row_level:
            raise InvalidParameterError(
                "metadata.privacy_unit",
                None,
                'the column naming the person ({"privacy_unit": "person_id"}), or {"row_level": true} when every row is a different person',
                "the service answers every analyst with the metadata's privacy unit, so the metadata must say who is protected",
            )
        v.neighbours(neighbours)
        if self._registered(name):  # before copying the data; the insert below re-checks under its lock
            raise _already_registered(name)
        info = DatasetInfo(name, located.stored, meta, neighbours, now(), table, engine, size_class=size_class)
        if engine == "spark":
            if located.listing is not None:  # local files (a URI is listed by Spark alone)
                try:
                    info = replace(info, files=pin_files(located.listing, fingerprint))
                except OSError:
                    raise InvalidParameterError(
                        "source",
                        located.stored,
                        "Parquet files that stay in place",
                        "a file vanished while it was listed",
                    ) from None
            return self._insert(replace(info, check=fits_size_class(self._inspect_spark(info, located), size_class)))

        def make() -> DataCheck | None:
            # The source is opened once and read from the open file (dpkit.server.opened_source).
            with self._private_source(located) as private:

                def inspect(conn: Any) -> DataCheck | None:
                    # Validates the metadata against the copy's schema: nothing is released, nothing
                    # is paid. Missing declared columns are named; the source's other columns counted.
                    check_declared_columns(conn, name, meta)
                    Session.from_duckdb(
                        conn.cursor(), name, metadata=meta, neighbours=neighbours, budget=Budget(epsilon=1.0)
                    )
                    return _check(info, conn, private)

                return self._copies.build(name, info.created_at, private, table, inspect)

        return self._insert_copied(info, self._copy(info, make))

    def _insert_copied(self, info: DatasetInfo, report: DataCheck | DatasetCheck | None) -> DatasetInfo:
        """Register a dataset whose copy is made (discarded if the registration fails)."""
        if isinstance(report, DatasetCheck):
            fit = {n: fits_size_class(c, info.size_class) for n, c in report.tables.items()}
            report = DatasetCheck({n: c for n, c in fit.items() if c is not None})
        else:
            report = fits_size_class(report, info.size_class)
        try:
            return self._insert(replace(info, check=report))
        except BaseException:
            self._copies.discard(info.name, info.created_at)  # a copy nobody will ever read
            raise

    def _register_tables(
        self, name: str, source: object, metadata: object, neighbours: Neighbours, table: object, engine: str,
        size_class: str, fingerprint: str | None,
    ) -> DatasetInfo:  # fmt: skip
        """Register a dataset of several tables (:mod:`dpkit.server.catalog_tables`; on Spark
        :mod:`dpkit.server.spark_tables`)."""
        if isinstance(metadata, Metadata):
            raise InvalidParameterError(
                "metadata", "a Metadata", "a DatasetMetadata (or JSON with 'tables') for one source per table"
            )
        meta = dataset_metadata(str(metadata) if isinstance(metadata, os.PathLike) else metadata)
        several.check_table_names(meta)
        if engine == "spark":
            located = resolve_parquet_sources(source, table, meta, self._data_root, fingerprint)
            v.neighbours(neighbours)
            if self._registered(name):  # before reading the data; the insert re-checks under its lock
                raise _already_registered(name)
            stored, files = json.dumps({t: s.stored for t, s in located.items()}), pin_tables(located, fingerprint)
            info = DatasetInfo(name, stored, meta, neighbours, now(), None, engine, files=files, size_class=size_class)
            frame = lambda view, at: self._spark_frame(view, at.path, at.listing)  # noqa: E731
            return self._insert_copied(info, inspect_spark_tables(info, located, frame))
        sources = several.resolve_table_sources(source, table, meta, self._data_root)
        v.neighbours(neighbours)
        if self._registered(name):  # before copying the data; the insert re-checks under its lock
            raise _already_registered(name)
        info = DatasetInfo(
            name, sources.stored(), meta, neighbours, now(), sources.stored_tables(), engine, size_class=size_class
        )

        def report(make: Callable[[], DataCheck]) -> DataCheck | None:
            try:
                return make()
            except Exception:
                _curator_log.exception("the data check of dataset %r (%s) could not be made", name, info.source)
                return None

        def make() -> DatasetCheck | None:
            with several.private_sources(sources, self._private_source) as private:
                return self._copies.build_tables(
                    name, info.created_at, private,
                    lambda conn: several.inspect_tables(conn, meta, neighbours, private, report),
                )  # fmt: skip

        return self._insert_copied(info, self._copy(info, make))

    def _insert(self, info: DatasetInfo) -> DatasetInfo:
        with self._store.transaction(write=True) as tx:
            if tx.run("SELECT 1 FROM datasets WHERE name = ?", (info.name,)):
                raise _already_registered(info.name)
            meta = json.dumps(info.metadata.to_dict(), sort_keys=True)
            tx.run(
                f"INSERT INTO datasets ({DATASET_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    info.name,
                    info.source,
                    meta,
                    info.neighbours,
                    info.created_at,
                    info.table,
                    info.engine,
                    info.files,
                    info.size_class,
                ),  # fmt: skip
            )
        return info

    def _inspect_spark(self, info: DatasetInfo, located: SourcePath) -> DataCheck | None:
        """Check a Spark dataset's metadata against its Parquet schema (read by Spark from the
        files' footers: no row is read), then make the curator's data check (DuckDB reading
        the same files on this machine; None for a URI, which only Spark reads)."""
        from dpkit.analytics.engines.spark import SparkEngine

        assert isinstance(info.metadata, Metadata)  # (several tables: spark_tables.inspect_spark_tables)
        path = located.path
        frame = self._spark_frame(info, path, located.listing)
        check_columns(frame.columns, info.metadata)
        Session(
            None, engine=SparkEngine(frame), table=info.name, metadata=info.metadata,
            neighbours=info.neighbours, budget=Budget(epsilon=1.0),
        )  # fmt: skip
        if is_uri(info.source):
            return None
        try:
            return check_data(path, info.metadata, table=info.name)
        except Exception:
            _curator_log.exception("the data check of dataset %r (%s) could not be made", info.name, info.source)
            return None

    def _spark_frame(self, info: DatasetInfo, path: Path | str, listing: Any = None) -> Any:
        """The DataFrame over a Spark dataset's Parquet data (exactly the files of ``listing``;
        None: listed now), on this process's SparkSession. Spark failing to start, or to read the files, is InvalidDataError worded
        for the curator (Spark's own message goes to the ``dpkit.curator`` log)."""
        from dpkit.analytics.engines.spark import spark_session
        from dpkit.analytics.engines.spark_parquet import read_parquet

        try:
            spark = self._spark() if self._spark is not None else spark_session()
        except DPError:
            raise
        except Exception:
            _curator_log.exception("dataset %r: the service's SparkSession did not start", info.name)
            raise InvalidDataError(
                "source", f"{_describe_source(info)}: Spark did not start (details in the dpkit.curator log)",
                "a service whose Spark settings (spark_master, spark_conf) start a SparkSession",
            ) from None  # fmt: skip
        try:
            return read_parquet(spark, info.source if is_uri(info.source) else path, listing)
        except InvalidParameterError as exc:
            _curator_log.warning("dataset %r: Spark could not read %s: %s", info.name, info.source, exc)
            raise InvalidDataError(
                "source", f"{_describe_source(info)} could not be read by Spark (details in the dpkit.curator log)",
                "Parquet files Spark can read",
            ) from None  # fmt: skip

    def _registered(self, name: str) -> bool:
        with self._store.transaction() as tx:
            return bool(tx.run("SELECT 1 FROM datasets WHERE name = ?", (name,)))

    # -- lookup ----------------------------------------------------------------------------------

    def listing(self) -> list[DatasetInfo]:
        with self._store.transaction() as tx:
            rows = tx.run(f"SELECT {DATASET_COLUMNS} FROM datasets ORDER BY name")
        return [dataset_from_row(r) for r in rows]

    def get(self, name: object) -> DatasetInfo:
        """The dataset ``name``; NotFoundError when there is none."""
        if not isinstance(name, str) or not DATASET_NAME.fullmatch(name):
            raise NotFoundError(f"there is no dataset named {name!r}")
        # A registered dataset is never changed or replaced, so once read it is kept (no store
        # read and no metadata parsing per query); a name not found is always looked up again.
        info = self._known.get(name)
        if info is None:
            with self._store.transaction() as tx:
                rows = tx.run(f"SELECT {DATASET_COLUMNS} FROM datasets WHERE name = ?", (name,))
            info = dataset_from_row(rows[0]) if rows else None
            if info is not None:
                self._known[name] = info
        if info is None:
            raise NotFoundError(f"there is no dataset named {name!r} that you may query")
        return info

    # -- the shared copies -----------------------------------------------------------------------

    def _copy(self, info: DatasetInfo, make: Callable[[], Any]) -> Any:
        """Run ``make`` (which copies the dataset's source into its shared copy) with its failures
        worded for the curator: a source that cannot be read is InvalidDataError naming the kind
        and file name and what it should be, never the engine's message (which may quote a row)
        nor a server path; the details go to the ``dpkit.curator`` log."""
        try:
            return make()
        except SourceReadError as exc:
            _curator_log.warning("dataset %r: %s could not be read", info.name, info.source, exc_info=exc.__cause__)
            cause = exc.__cause__
            why = cause.accepted if isinstance(cause, InvalidParameterError) else str(exc)
            raise InvalidDataError(
                "source" if not info.several or exc.table is None else f"source.{exc.table}",
                f"{_describe_source(info, exc.table)} could not be read ({why}; details in the dpkit.curator log)",
                "a UTF-8 CSV file whose first line names every column once, a Parquet file, or a table of a DuckDB database file",
            ) from None
        except OSError:
            _curator_log.exception("dataset %r: its copy could not be written in %s", info.name, self._copies.directory)
            raise InvalidDataError(
                "source",
                f"{_describe_source(info)} could not be copied into the service's dataset directory (details in the dpkit.curator log)",
                "a dataset directory the service can write (dataset_dir)",
            ) from None

    def _source_path(self, info: DatasetInfo) -> SourcePath:
        """The file (or, for a Spark dataset, the Parquet data, listed now) a dataset is re-read
        from, checked again as at registration (the data root's rules: a link may have been
        changed since)."""
        if self._data_root is None and not Path(info.source).is_absolute():
            raise InvalidParameterError(
                "source", info.source, "an absolute path, or a service with the data root it was registered under"
            )
        resolve = resolve_parquet_source if info.engine == "spark" else resolve_source
        return resolve(info.source, self._data_root)

    def load(self, info: DatasetInfo) -> Path:
        """The path of the dataset's shared, read-only copy (a DuckDB database file holding the
        dataset as table ``info.name``; see :mod:`dpkit.server.datasets`).

        The copy is made at registration. One that is missing (a dataset registered before
        copies were kept, or a deleted file) is re-created from the source, read by the same
        fixed rules (a CSV by :func:`~dpkit.analytics.engines.duckdb.csv_source_sql`: the header's names, every column as text,
        nothing sniffed; Parquet files and DuckDB tables with their own schema), under a file
        lock so that several workers never write it at once.

        Raises InvalidDataError for the curator (see :meth:`_copy`); a source that is no longer
        a file under the data root is InvalidParameterError naming ``source``. Analysts never
        see either: see :meth:`opened`. A dataset of several tables is re-created whole."""
        if info.several:
            return self._copy(
                info,
                lambda: self._copies.ensure_tables(
                    info.name, info.created_at,
                    lambda: several.private_sources(
                        several.relocate(info.sources, info.source_tables, self._data_root), self._private_source
                    ),
                ),
            )  # fmt: skip
        return self._copy(
            info,
            lambda: self._copies.ensure(
                info.name, info.created_at, lambda: self._private_source(self._source_path(info)), info.table
            ),
        )

    @contextlib.contextmanager
    def _private_source(self, located: SourcePath) -> Iterator[Path]:
        """A private copy of the checked source, made from the file opened once
        (:mod:`dpkit.server.opened_source`), for the block: what DuckDB reads instead of the
        curator's path."""
        with open_source(located, self._data_root) as opened, snapshot(opened, self._copies.directory) as private:
            yield private

    def opened(self, info: DatasetInfo) -> _Loaded:
        """The dataset's shared copy, opened read-only once per process (any number
        of worker processes read the same file; none holds the rows in its own memory). For
        analysts: a copy that cannot be opened or re-created is one fixed
        DatasetUnavailableError, before any spend (the reason is in the curator's log).

        A Spark dataset's files are listed and checked against their pins here, at every call —
        every query and synthetic table, before it pays (:mod:`dpkit.server.spark_pins`) — and its
        engines check them again once Spark has read them (every table's, for several tables)."""
        views = table_views(info) if info.engine == "spark" else {}
        located = {t: self._checked_spark(view) for t, view in views.items()}
        with self._data_lock:
            if self._data_pid != os.getpid():
                # A forked child: the parent's connections are not safe to use (or close) here.
                self.data, self._data_pid = {}, os.getpid()
            loaded = self.data.get(info.name)
            if loaded is None and views:
                after = pins_after(views, lambda view: self._spark_change(view, after_debit=True)[1])
                frames = {t: self._opened_spark(view, located[t]) for t, view in views.items()}
                tables = tuple(views) if info.several else None
                frame = frames if info.several else frames[info.name]
                loaded = self.data[info.name] = _Loaded(None, frame=frame, after=after, tables=tables)
            if loaded is None:
                try:
                    connection = self._copies.open(self.load(info), self._engine_threads)
                except InvalidDataError:  # load has told the curator why
                    raise DatasetUnavailableError() from None
                except DPError as exc:
                    _curator_log.warning("dataset %r: its copy is missing and cannot be re-made: %s", info.name, exc)
                    raise DatasetUnavailableError() from None
                except Exception:
                    _curator_log.exception("dataset %r: its copy could not be opened", info.name)
                    raise DatasetUnavailableError() from None
                tables = tuple(info.sources) if info.several else None
                loaded = self.data[info.name] = _Loaded(connection, tables=tables)
        return loaded

    def _checked_spark(self, info: DatasetInfo) -> SourcePath | None:
        """A Spark dataset's files, listed and checked against the data root and their pins (None
        for a URI, which Spark alone lists); DatasetUnavailableError, before any spend, when they
        changed or cannot be listed (the reason is in the curator's log)."""
        if is_uri(info.source):
            return None
        try:
            located, change = self._spark_change(info, after_debit=False)
        except Exception:
            _curator_log.exception("dataset %r: its Parquet data could not be listed", info.name)
            raise DatasetUnavailableError() from None
        if located is None or change is not None:
            raise DatasetUnavailableError()
        return located

    def _spark_change(self, info: DatasetInfo, *, after_debit: bool) -> tuple[SourcePath | None, str | None]:
        """A Spark dataset's files listed now, and what changed since registration (None:
        nothing, or a dataset registered before files were pinned), logged for the curator."""
        located: SourcePath | None = None
        change: str | None = None
        try:
            located = self._source_path(info)
        except DPError as exc:  # no longer Parquet data under the data root
            change = f"they cannot be listed under the data root ({exc.__class__.__name__})"
        if located is not None and info.files is not None:
            change = pinned_change(info.files, located.listing)
        if change is not None:
            _curator_log.warning(
                "dataset %r: its Parquet files changed since registration (%s)%s; it is unavailable until "
                "they are put back (register new data as a new dataset)",
                info.name, change, " while a paid query read them: that query failed, its spend stands" if after_debit else "",
            )  # fmt: skip
        return located, change

    def _opened_spark(self, info: DatasetInfo, located: SourcePath | None) -> Any:
        """A Spark dataset's DataFrame for this process, over the files ``located`` lists
        (checked by :meth:`_checked_spark`; None: a URI); for analysts, any failure is the one
        fixed DatasetUnavailableError, before any spend (the reason is in the curator's log)."""
        try:
            if located is None:
                return self._spark_frame(info, info.source)
            return self._spark_frame(info, located.path, located.listing)
        except DPError as exc:
            _curator_log.warning("dataset %r: its Parquet data cannot be read: %s", info.name, exc)
            raise DatasetUnavailableError() from None
        except Exception:
            _curator_log.exception("dataset %r: its Parquet data could not be opened", info.name)
            raise DatasetUnavailableError() from None


def _check(info: DatasetInfo, conn: Any, source: Path) -> DataCheck | None:
    """The curator's data check of the loaded copy (exactly what queries will read), or None
    when the check itself fails: it is a report, and the metadata has already been checked
    against the table, so its failure is logged for the curator and does not block the
    registration. For a CSV source, the lines its reader dropped are counted from the file."""
    try:
        assert isinstance(info.metadata, Metadata)  # (several tables: catalog_tables.inspect_tables)
        check = check_data((conn.cursor(), info.name), info.metadata)
        if source_kind(source) == "csv":
            from dpkit.analytics.check_reading import csv_reading_check
            from dpkit.analytics.engines.csv_source import CsvFile, CsvOptions

            check = replace(check, reading=csv_reading_check(CsvFile(source, CsvOptions())))
        return check
    except Exception:
        _curator_log.exception("the data check of dataset %r (%s) could not be made", info.name, info.source)
        return None


def _already_registered(name: str) -> InvalidParameterError:
    return InvalidParameterError(
        "dataset",
        name,
        "a name not already registered",
        "a registered dataset is never replaced (its budgets refer to it)",
    )


def _describe_source(info: DatasetInfo, table: str | None = None) -> str:
    """The source in words for the curator: the file's name (and table), no path, no content. For
    several tables: ``table``'s source (None: all of them)."""
    if info.several:
        if table is None:
            return "the sources of tables " + ", ".join(info.sources)
        source, inner = info.sources[table], info.source_tables.get(table)
        return f"table {table}'s " + _describe_source(replace(info, metadata=Metadata(), source=source, table=inner))
    if info.engine == "spark":
        return f"Parquet data {PurePath(info.source).name}" if not is_uri(info.source) else "Parquet data (a URI)"
    kind = (
        "DuckDB table"
        if info.table is not None
        else "Parquet file"
        if source_kind(info.source) == "parquet"
        else "CSV file"
    )
    return f"{kind} {Path(info.source).name}" + ("" if info.table is None else f" {info.table}")
