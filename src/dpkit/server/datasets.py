"""Where the service's datasets come from and where their shared copies live.

Two things are kept here, apart from the rest of the service:

* **The data root.** The administrator names one directory (``dpkit serve --data-root``) and
  datasets are registered only from files under it (:func:`resolve_source`). A source is given
  relative to the root or as an absolute path inside it; a path with a ``..`` segment, a path
  whose real location (every symlink followed) is outside the root, anything that is not a
  regular file and any other suffix than ``.csv``, ``.parquet``/``.pq`` or ``.duckdb`` are
  refused. The refusal names the parameter and what is accepted, never where a path led: a
  curator key must not be a way to learn what exists on the server. A symlink whose target stays
  inside the root is allowed — the check is made on the real path, which is also the file that
  is read, so what is read is always a file under the root; refusing every symlink would refuse
  the common layouts where the root itself, or a data directory in it, is a link to another
  disk. (Whoever can write inside the root is trusted like the administrator: they choose
  what the service reads.) The source is stored relative to the root, so neither the
  curator's listing nor any error shows an absolute server path. The checked file is opened
  once, checked again through the open file and copied from it
  (:mod:`dpkit.server.opened_source`): a name swapped for a link out of the root after the
  check is never read.

* **Shared read-only copies.** At registration the source is copied once, with the fixed reading
  rules of the service, into a DuckDB database file in the dataset directory
  (:class:`DatasetCopies`), written under a temporary name and renamed into place, so a
  reader sees either no copy or a complete one. Its name is derived from the dataset's name and
  registration time (:func:`copy_name`): datasets are never replaced, so the name is a version
  tag and needs no column of its own. Every worker process opens the copy with
  ``read_only=True``: the rows stay in the file, paged in by DuckDB's buffer manager and the
  operating system's page cache, which all processes share, instead of one private in-memory
  copy per process. A copy that is missing (a dataset registered before copies were kept, or a
  deleted file) is re-created from the source under a file lock, so two workers never write
  the same copy at once.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePath
from typing import Any, TypeVar

from dpkit._validate import short_repr
from dpkit.analytics.engines.base import is_uri, quote_identifier, sql_string
from dpkit.analytics.engines.csv_source import csv_source_sql
from dpkit.analytics.engines.parquet_source import ParquetFiles, duckdb_parquet, parquet_layout
from dpkit.analytics.metadata import Metadata
from dpkit.errors import InvalidParameterError

try:  # POSIX; elsewhere the atomic rename alone keeps a copy whole (two writers may both build it)
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "SOURCE_SUFFIXES",
    "SourcePath",
    "resolve_source",
    "source_kind",
    "default_dataset_dir",
    "copy_name",
    "DatasetCopies",
    "SourceReadError",
    "resolve_parquet_source",
    "copy_table",
    "check_declared_columns",
    "check_columns",
    "TableSource",
]

SOURCE_SUFFIXES = (".csv", ".parquet", ".pq", ".duckdb")
_ACCEPTED = "a .csv, .parquet or .duckdb file"
_UNDER_ROOT = (
    "a .csv, .parquet or .duckdb regular file under the service's data root: a path relative to the root, "
    "or an absolute path inside it, without '..' segments (a symlink is followed and must stay inside the root)"
)
T = TypeVar("T")
#: One table of a copy: the file it is copied from, and the table inside a .duckdb file (else None).
TableSource = tuple[Path, str | None]


@dataclass(frozen=True)
class SourcePath:
    """A checked source: ``path`` is the file to read (absolute; with a data root, its real path),
    ``stored`` what the service records and shows (relative to the data root when there is one)."""

    path: Path
    stored: str
    #: For Parquet data read in place: the files listed when the source was checked (None for a
    #: single CSV / Parquet / DuckDB file and for a URI).
    listing: ParquetFiles | None = None


def source_kind(path: str | PurePath) -> str:
    """``"csv"``, ``"parquet"`` or ``"duckdb"``, from the file name's suffix."""
    suffix = PurePath(path).suffix.lower()
    return "parquet" if suffix in (".parquet", ".pq") else suffix.lstrip(".")


def resolve_source(source: object, data_root: Path | None) -> SourcePath:
    """Check a dataset source given by a curator and locate the file to read.

    With ``data_root`` (an absolute, resolved directory): ``source`` relative to the root or
    absolute inside it; refused with InvalidParameterError naming ``source`` when it has a
    ``..`` segment, when its real path (symlinks followed) is not inside the root, when it is
    not a regular file, or when its name or its real file's name has another suffix. The
    message shows the value only as the curator wrote it relative to the root (an absolute path
    outside the root, or where a link led, is never repeated). Without a data root (the
    administrator's own in-process and command-line use) any existing file with an accepted
    suffix is taken, and stored as its absolute path.
    """
    if not isinstance(source, (str, os.PathLike)) or not os.fspath(source) or "\x00" in os.fspath(source):
        raise InvalidParameterError("source", short_repr(source), _ACCEPTED if data_root is None else _UNDER_ROOT)
    given = Path(os.fspath(source)).expanduser()
    if data_root is None:
        path = given.absolute()
        if not path.is_file() or path.suffix.lower() not in SOURCE_SUFFIXES:
            raise InvalidParameterError("source", str(source), f"an existing {_ACCEPTED[2:]}")
        return SourcePath(path, str(path))
    shown = _shown(given, data_root)
    if ".." in given.parts:
        raise InvalidParameterError("source", shown, _UNDER_ROOT, "a path with '..' segments is refused")
    if given.suffix.lower() not in SOURCE_SUFFIXES:
        raise InvalidParameterError("source", shown, _UNDER_ROOT)
    candidate = given if given.is_absolute() else data_root / given
    try:
        real = Path(os.path.realpath(candidate, strict=True))
        mode = os.stat(real).st_mode
    except (OSError, ValueError, RuntimeError):
        # Missing, unreadable, a link loop: said the same way as a path outside the root, so the
        # answer does not tell which files exist where.
        raise InvalidParameterError("source", shown, _UNDER_ROOT, "there is no such file under the data root") from None
    if not real.is_relative_to(data_root):
        raise InvalidParameterError("source", shown, _UNDER_ROOT, "there is no such file under the data root")
    if not stat.S_ISREG(mode) or real.suffix.lower() not in SOURCE_SUFFIXES or source_kind(real) != source_kind(given):
        raise InvalidParameterError("source", shown, _UNDER_ROOT, "not a regular data file of that kind")
    return SourcePath(real, real.relative_to(data_root).as_posix())


_PARQUET_UNDER_ROOT = (
    "Parquet data under the service's data root: a .parquet file, a directory of Parquet files or a glob "
    "('events/**/*.parquet'), relative to the root or absolute inside it, without '..' segments "
    "(symlinks are followed and must stay inside the root)"
)


def resolve_parquet_source(source: object, data_root: Path | None) -> SourcePath:
    """Check the source of a dataset Spark reads in place: a Parquet file, a directory of Parquet
    files (Hive-partitioned too) or a glob, listed by
    :func:`~dpkit.analytics.engines.parquet_source.parquet_files` (the files Spark and DuckDB read alike).

    With ``data_root``: the path is relative to the root or absolute inside it, has no ``..``
    segment, and the real path of the directory (or glob's fixed part) and of every file it names
    is inside the root; the source is stored as given, relative to the root. Refusals name
    ``source`` and never say where a path led (as :func:`resolve_source`). Without a data root
    (the administrator's own in-process use) a URI Spark reads (``hdfs://…``, ``s3a://…``) is
    also taken, as given; a local path is stored absolute. ``path`` is what Spark is given."""
    from dpkit.analytics.engines.parquet_source import parquet_files

    if not isinstance(source, (str, os.PathLike)) or not os.fspath(source) or "\x00" in os.fspath(source):
        raise InvalidParameterError("source", short_repr(source), _PARQUET_UNDER_ROOT)
    text = os.fspath(source)
    if data_root is None and is_uri(text):
        return SourcePath(Path(text), text)
    given = Path(text).expanduser()
    shown = text if data_root is None else _shown(given, data_root)
    if is_uri(text):
        raise InvalidParameterError(
            "source", shown, _PARQUET_UNDER_ROOT, "a URI is read only by a service without a data root"
        )
    if ".." in given.parts:
        raise InvalidParameterError("source", shown, _PARQUET_UNDER_ROOT, "a path with '..' segments is refused")
    candidate = given if given.is_absolute() or data_root is None else data_root / given
    candidate = candidate if candidate.is_absolute() else candidate.absolute()
    try:
        found = parquet_files(candidate)
    except InvalidParameterError:
        found = None
    missing = "there is no Parquet data there under the data root" if data_root is not None else "no Parquet data there"
    if found is None:
        raise InvalidParameterError("source", shown, _PARQUET_UNDER_ROOT, missing)
    if data_root is None:
        return SourcePath(candidate, str(candidate), found)
    if not candidate.is_relative_to(data_root):
        raise InvalidParameterError("source", shown, _PARQUET_UNDER_ROOT, missing)
    for path in (str(found.base), *found.files):
        try:
            real = Path(os.path.realpath(path, strict=True))
        except (OSError, ValueError, RuntimeError):
            raise InvalidParameterError("source", shown, _PARQUET_UNDER_ROOT, missing) from None
        if not real.is_relative_to(data_root):
            raise InvalidParameterError("source", shown, _PARQUET_UNDER_ROOT, missing)
    return SourcePath(candidate, candidate.relative_to(data_root).as_posix(), found)


def _shown(given: Path, data_root: Path) -> str:
    """The source as it may be repeated to the curator: as written when relative, relative to
    the root when absolute inside it (lexically), else a placeholder."""
    if not given.is_absolute():
        text = given.as_posix()
        return text if len(text) <= 200 else text[:197] + "..."
    try:
        return given.relative_to(data_root).as_posix()
    except ValueError:
        return "(an absolute path outside the data root)"


def default_dataset_dir(url: str) -> Path:
    """Where copies are kept when the administrator names no directory: beside a SQLite ledger
    (``X/ledger.sqlite`` → ``X/ledger.sqlite.datasets``), else ``.dpkit/datasets`` under the
    working directory."""
    if url.startswith("sqlite:///"):
        from dpkit.server.store import sqlite_path

        ledger = sqlite_path(url)
        return ledger.with_name(ledger.name + ".datasets")
    return Path(".dpkit", "datasets").absolute()


def copy_name(name: str, created_at: str) -> str:
    """The copy's file name: the dataset's name and a tag of its registration time (a name is
    registered once, so the pair names one version of one dataset)."""
    tag = hashlib.sha256(f"{name}\x00{created_at}".encode()).hexdigest()[:16]
    return f"{name}-{tag}.duckdb"


def copy_table(conn: Any, target: str, source: Path, table: str | None) -> None:
    """Create table ``target`` in ``conn`` from ``source`` as every query will read it: a CSV by
    the fixed, non-sniffing rules of :func:`csv_source_sql` (every column as text, so no row can
    fail the copy or change a type), a Parquet file with its own schema (as
    :mod:`~dpkit.analytics.engines.parquet_source` reads it) or a ``table`` of a DuckDB file. Raises whatever the reader raises (the caller words it for the curator)."""
    quoted = quote_identifier(target)
    kind = source_kind(source)
    if kind == "duckdb":
        if table is None:
            raise InvalidParameterError("table", table, "a table name with a .duckdb source")
        # Attached read-only just long enough to copy the table.
        conn.execute(f"ATTACH {sql_string(str(source))} AS dpkit_source (READ_ONLY)")
        try:
            qualified = ".".join(quote_identifier(part) for part in ("dpkit_source", *table.split(".")))
            conn.execute(f"CREATE TABLE {quoted} AS SELECT * FROM {qualified}")
        finally:
            conn.execute("DETACH dpkit_source")
    elif kind == "parquet":  # read as a session reads it: text that is not UTF-8 repaired, no partition
        layout = parquet_layout(ParquetFiles((str(source),), source.parent, False), source.name)
        conn.execute(f"CREATE TABLE {quoted} AS {duckdb_parquet(conn, layout).sql}")
    else:
        conn.execute(f"CREATE TABLE {quoted} AS SELECT * FROM {csv_source_sql(source)}")


def check_declared_columns(conn: Any, table: str, metadata: Metadata) -> None:
    """Refuse metadata declaring a column (or privacy unit) the table does not have.

    The message names the declared columns that are missing — the curator's own words — and
    only counts the table's other columns: a source's column names can be its contents (a
    headerless file's first line), and a registration error must not read them out."""
    description = conn.execute(f"SELECT * FROM {quote_identifier(table)} LIMIT 0").description
    check_columns([d[0] for d in description], metadata)


def check_columns(columns: list[str], metadata: Metadata) -> None:
    """:func:`check_declared_columns` given the source's column names."""
    physical = set(columns)
    declared = list(metadata.columns)
    if metadata.privacy_unit is not None and metadata.privacy_unit not in metadata.columns:
        declared.append(metadata.privacy_unit)
    missing = [c for c in declared if c not in physical]
    if missing:
        # Named like the session's own check: the first missing declaration, then all of them.
        first = missing[0]
        parameter = f"metadata.columns.{first}" if first in metadata.columns else "privacy_unit"
        others = len(physical - set(declared))
        raise InvalidParameterError(
            parameter,
            first,
            "a column of the source",
            f"the declared column(s) {', '.join(map(repr, missing))} are not in the source, "
            f"which has {others} other column(s) (not named here)",
        )


class SourceReadError(Exception):
    """The source could not be copied (the reader's own exception is the ``__cause__``; its
    message may quote the file, so it is for the administrator's log only). ``table``: the
    table of the copy whose source it was (None: the copy file itself)."""

    def __init__(self, what: str, table: str | None = None) -> None:
        super().__init__(what)
        self.table = table


class DatasetCopies:
    """The directory of shared, read-only dataset copies (one DuckDB file per dataset version).

    :meth:`build` writes a copy under a temporary name, lets the caller inspect it, and renames
    it into place; :meth:`ensure` re-creates a missing copy under a per-copy file lock; readers
    open copies with :meth:`open`. Files are only ever replaced by an atomic rename, so a reader
    that has a copy open keeps reading the file it opened."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        if not isinstance(directory, (str, os.PathLike)) or not os.fspath(directory):
            raise InvalidParameterError(
                "dataset_dir", short_repr(directory), "a directory path, or None for the default beside the ledger"
            )
        self.directory = Path(os.fspath(directory)).expanduser().absolute()

    def path(self, name: str, created_at: str) -> Path:
        return self.directory / copy_name(name, created_at)

    def build(self, name: str, created_at: str, source: Path, table: str | None, inspect: Callable[[Any], T]) -> T:
        """Copy ``source`` into table ``name`` of a new copy file, call ``inspect`` with a
        connection to it (its exceptions abandon the copy), and put the copy in place (an atomic
        rename). Returns what ``inspect`` returned. Raises :class:`SourceReadError` when the
        source cannot be read, OSError when the directory cannot be written."""
        return self.build_tables(name, created_at, {name: (source, table)}, inspect)

    def build_tables(
        self, name: str, created_at: str, sources: Mapping[str, TableSource], inspect: Callable[[Any], T]
    ) -> T:
        """:meth:`build` for a dataset of several tables: each ``sources`` entry (the table's name
        in the copy → its file, and the table inside a .duckdb file) copied into one copy file,
        by the same rules. :class:`SourceReadError` names the table that could not be read."""
        import duckdb

        self.directory.mkdir(parents=True, exist_ok=True)
        final = self.path(name, created_at)
        temporary = final.with_name(f".{final.name}.{os.getpid()}.{uuid.uuid4().hex}.tmp")
        try:
            conn = duckdb.connect(str(temporary))
            try:
                for target, (source, table) in sources.items():
                    try:
                        copy_table(conn, target, source, table)
                    except Exception as exc:
                        raise SourceReadError(type(exc).__name__, target) from exc
                try:
                    conn.execute("CHECKPOINT")  # every row in the file before it is renamed
                except Exception as exc:
                    raise SourceReadError(type(exc).__name__) from exc
                result = inspect(conn)
            finally:
                conn.close()
            os.replace(temporary, final)
            return result
        finally:
            for leftover in (temporary, temporary.with_name(temporary.name + ".wal")):
                with contextlib.suppress(FileNotFoundError):
                    leftover.unlink()

    def ensure(
        self,
        name: str,
        created_at: str,
        source: Callable[[], contextlib.AbstractContextManager[Path]],
        table: str | None,
    ) -> Path:
        """The copy's path, re-created if it is missing from the file ``source()`` gives for the
        block (called only when needed: the service gives a private copy of the opened source,
        :mod:`dpkit.server.opened_source`). Several processes may call this at once: the first
        re-creates it under a file lock, the others wait and find it done."""

        @contextlib.contextmanager
        def one() -> Iterator[Mapping[str, TableSource]]:
            with source() as path:
                yield {name: (path, table)}

        return self.ensure_tables(name, created_at, one)

    def ensure_tables(
        self,
        name: str,
        created_at: str,
        sources: Callable[[], contextlib.AbstractContextManager[Mapping[str, TableSource]]],
    ) -> Path:
        """:meth:`ensure` for a dataset of several tables (``sources()`` gives every table's
        file for the block, as :meth:`build_tables` takes them)."""
        final = self.path(name, created_at)
        if final.is_file():
            return final
        self.directory.mkdir(parents=True, exist_ok=True)
        with self._lock(final):
            if not final.is_file():
                with sources() as found:
                    self.build_tables(name, created_at, found, lambda conn: None)
        return final

    def discard(self, name: str, created_at: str) -> None:
        """Remove a copy that was never registered (its registration failed after the copy)."""
        with contextlib.suppress(FileNotFoundError):
            self.path(name, created_at).unlink()

    @staticmethod
    def open(path: Path, threads: int | None = None) -> Any:
        """A read-only DuckDB connection to a copy (any number of processes may hold one),
        running each query on ``threads`` threads (None: DuckDB's default, one per core)."""
        import duckdb

        config: dict[str, str | bool | int | float | list[str]] = {} if threads is None else {"threads": threads}
        return duckdb.connect(str(path), read_only=True, config=config)

    @contextlib.contextmanager
    def _lock(self, final: Path) -> Iterator[None]:
        if fcntl is None:  # pragma: no cover
            yield
            return
        with open(final.with_name(f".{final.name}.lock"), "a+b") as handle:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
