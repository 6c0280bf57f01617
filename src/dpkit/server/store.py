"""The service's own tables — principals, API keys, datasets and the audit log — kept in the
same database as the ledger (one SQLite file, or one PostgreSQL database).

The SQL is written once with ``?`` placeholders; :class:`_Postgres` rewrites them for psycopg.
Writes that must be serialised (appending to the audit chain) take the database's write lock:
``BEGIN IMMEDIATE`` on SQLite, a transaction-scoped advisory lock on PostgreSQL.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import urllib.parse
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Protocol

from dpkit.errors import InvalidParameterError, LedgerError

__all__ = ["ServiceStore", "open_store", "SQLITE_DEFAULT"]

SQLITE_DEFAULT = "sqlite:///.dpkit/ledger.sqlite"
# 2: the audit chain is keyed (HMAC), grants and debits are chain entries written in the ledger's
# own transactions. A version-1 database's unkeyed chain cannot be extended under a key.
_SCHEMA_VERSION = 2
AUDIT_LOCK = 0x64706B61  # advisory-lock key of the audit chain ("dpka")

_TABLES = (
    """CREATE TABLE IF NOT EXISTS dpkit_service (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        application TEXT NOT NULL,
        version INTEGER NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS principals (
        name TEXT PRIMARY KEY,
        role TEXT NOT NULL CHECK (role IN ('curator', 'analyst')),
        created_at TEXT NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS api_keys (
        key_id TEXT PRIMARY KEY,
        key_hash TEXT NOT NULL UNIQUE,
        principal TEXT NOT NULL REFERENCES principals (name),
        created_at TEXT NOT NULL,
        revoked_at TEXT
    )""",
    """CREATE TABLE IF NOT EXISTS datasets (
        name TEXT PRIMARY KEY,
        source TEXT NOT NULL,
        metadata TEXT NOT NULL,
        neighbours TEXT NOT NULL,
        created_at TEXT NOT NULL,
        source_table TEXT
    )""",
    """CREATE TABLE IF NOT EXISTS audit_log (
        seq BIGINT PRIMARY KEY,
        at TEXT NOT NULL,
        actor TEXT,
        action TEXT NOT NULL,
        dataset TEXT,
        status INTEGER NOT NULL,
        outcome TEXT NOT NULL,
        epsilon TEXT,
        delta TEXT,
        detail TEXT NOT NULL,
        prev_hash TEXT NOT NULL,
        hash TEXT NOT NULL
    )""",
    "CREATE INDEX IF NOT EXISTS audit_by_actor ON audit_log (actor, seq)",
)


def now() -> str:
    return datetime.now(timezone.utc).isoformat()


class ServiceStore(Protocol):
    """A database the service reads and writes through short transactions."""

    url: str

    def transaction(self, *, write: bool = False, audit: bool = False) -> contextlib.AbstractContextManager[Any]:
        """A cursor-like object with ``execute(sql, params)`` → rows (list of tuples)."""
        ...

    def close(self) -> None: ...


class _Rows:
    """What ``transaction()`` yields: ``run(sql, params)`` returns all rows."""

    def __init__(self, conn: Any, rewrite: bool) -> None:
        self._conn = conn
        self._rewrite = rewrite
        self.dialect = "postgres" if rewrite else "sqlite"

    def run(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        if self._rewrite:
            sql = sql.replace("?", "%s")
        cur = self._conn.execute(sql, params)
        return list(cur.fetchall()) if cur.description is not None else []


class _SQLite:
    def __init__(self, path: Path, url: str, timeout: float, lock: Callable[[], contextlib.AbstractContextManager[Any]] | None = None) -> None:
        self.url = url
        self._shared_lock = lock
        self._path = path
        self._timeout = timeout
        self._local = threading.local()
        self._all: list[sqlite3.Connection] = []
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()
        with self.transaction(write=True) as tx:
            for statement in _TABLES:
                tx.run(statement)
            _claim(tx)

    def _conn(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None or getattr(self._local, "pid", None) != os.getpid():
            try:
                conn = sqlite3.connect(self._path, timeout=self._timeout, isolation_level=None, check_same_thread=False)
                conn.execute("PRAGMA journal_mode = WAL")
                conn.execute("PRAGMA synchronous = FULL")
                conn.execute("PRAGMA foreign_keys = ON")
            except sqlite3.Error as exc:
                raise LedgerError(f"cannot open the service database {self._path}: {exc}") from exc
            self._local.conn, self._local.pid = conn, os.getpid()
            with self._lock:
                self._all.append(conn)
        return conn

    @contextlib.contextmanager
    def transaction(self, *, write: bool = False, audit: bool = False) -> Iterator[_Rows]:
        if write or audit:
            # Writers queue on the ledger's write lock (threads of this process, then the file's
            # writer queue across processes): left to SQLite's busy handler, which sleeps with
            # growing back-off, writers would wait milliseconds each for a lock held for a
            # fraction of one.
            with self._shared_lock() if self._shared_lock is not None else self._write_lock:
                yield from self._transaction(write=True)
        else:
            yield from self._transaction(write=False)

    def _transaction(self, *, write: bool) -> Iterator[_Rows]:
        conn = self._conn()
        try:
            conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
            try:
                yield _Rows(conn, rewrite=False)
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
        except sqlite3.Error as exc:
            raise LedgerError(f"service database {self._path}: {exc}") from exc

    def close(self) -> None:
        with self._lock:
            for conn in self._all:
                with contextlib.suppress(sqlite3.Error):
                    conn.close()
            self._all.clear()


class _Postgres:
    def __init__(self, url: str, timeout: float) -> None:
        try:
            import psycopg
        except ImportError as exc:  # pragma: no cover - depends on the installation
            raise LedgerError("a postgresql:// ledger needs psycopg: pip install 'dpkit[postgres]'") from exc
        self._psycopg = psycopg
        self.url = url
        self._timeout = timeout
        self._local = threading.local()
        self._all: list[Any] = []
        self._lock = threading.Lock()
        with self.transaction(write=True) as tx:
            tx.run("SELECT pg_advisory_xact_lock(?)", (AUDIT_LOCK,))
            for statement in _TABLES:
                tx.run(statement)
            _claim(tx)

    def _conn(self) -> Any:
        conn = getattr(self._local, "conn", None)
        if conn is None or conn.closed or getattr(self._local, "pid", None) != os.getpid():
            try:
                conn = self._psycopg.connect(self.url, autocommit=True, connect_timeout=max(1, int(self._timeout)))
            except self._psycopg.Error as exc:
                raise LedgerError(f"cannot connect to the service database {masked_url(self.url)}: {exc}") from exc
            self._local.conn, self._local.pid = conn, os.getpid()
            with self._lock:
                self._all.append(conn)
        return conn

    @contextlib.contextmanager
    def transaction(self, *, write: bool = False, audit: bool = False) -> Iterator[_Rows]:
        conn = self._conn()
        try:
            if not (write or audit):
                # Reads run in autocommit, statement by statement: every read here is one
                # statement (or tolerates separate snapshots), and BEGIN/COMMIT would double the
                # round trips of every request.
                yield _Rows(conn, rewrite=True)
                return
            with conn.transaction():
                rows = _Rows(conn, rewrite=True)
                if audit:
                    rows.run("SELECT pg_advisory_xact_lock(?)", (AUDIT_LOCK,))
                yield rows
        except self._psycopg.Error as exc:
            raise LedgerError(f"service database {masked_url(self.url)}: {exc}") from exc

    def close(self) -> None:
        with self._lock:
            for conn in self._all:
                with contextlib.suppress(Exception):
                    conn.close()
            self._all.clear()


def _claim(tx: _Rows) -> None:
    rows = tx.run("SELECT application, version FROM dpkit_service")
    if not rows:
        tx.run("INSERT INTO dpkit_service (id, application, version) VALUES (1, ?, ?)", ("dpkit-server", _SCHEMA_VERSION))
    elif tuple(rows[0]) != ("dpkit-server", _SCHEMA_VERSION):
        older = rows[0][0] == "dpkit-server" and isinstance(rows[0][1], int) and rows[0][1] < _SCHEMA_VERSION
        raise LedgerError(
            f"the service tables have version {rows[0][1]!r}; this dpkit reads version {_SCHEMA_VERSION}"
            + ("; they were written by an earlier dpkit whose audit chain was not keyed: keep that database as the "
               "record of its period (dpkit admin verify-log with that dpkit) and start a new ledger" if older else "")
        )


def masked_url(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(":" + parts.password + "@", ":***@")
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


def sqlite_path(url: str) -> Path:
    """The file of a ``sqlite:///relative`` or ``sqlite:////absolute`` URL."""
    path = url[len("sqlite:///"):]
    if not path:
        raise InvalidParameterError("ledger", url, "sqlite:///PATH with a file path")
    return Path(path).expanduser().absolute()


def normalise_url(value: object) -> str:
    """A ledger URL from a URL or a plain path."""
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str) or not value:
        raise InvalidParameterError("ledger", value, "sqlite:///PATH, postgresql://... or a file path")
    if value.startswith(("postgresql://", "postgres://")):
        return value
    if value.startswith("sqlite:///"):
        return value
    if "://" in value:
        raise InvalidParameterError("ledger", value, "sqlite:///PATH, postgresql://... or a file path")
    return "sqlite:///" + str(Path(value).expanduser().absolute())


def open_store(url: str, *, timeout: float = 30.0, lock: Callable[[], contextlib.AbstractContextManager[Any]] | None = None) -> ServiceStore:
    """Open (creating the tables if needed) the service tables at a ledger URL. On SQLite,
    ``lock`` returns the lock every writer of the file takes (the ledger's ``write_lock``: this
    process's thread lock and the file's writer queue across processes)."""
    url = normalise_url(url)
    if url.startswith("sqlite:///"):
        path = sqlite_path(url)
        return _SQLite(path, url, timeout, lock)
    return _Postgres(url, timeout)
