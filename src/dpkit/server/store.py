"""The service's own tables — principals, API keys, datasets, the audit log, published
releases and idempotency keys — kept in the
same database as the ledger (one SQLite file, or one PostgreSQL database).

The connections, transactions and error handling are the ledger's drivers
(:mod:`dpkit.ledger._sqlite_driver`, :mod:`dpkit.ledger._postgres_driver`), so the SQL is written
once with ``?`` placeholders. Writes that must be serialised (appending to the audit chain) take
the database's write lock: on SQLite the ledger's (``BEGIN IMMEDIATE`` behind the file's writer
queue), on PostgreSQL a transaction-scoped advisory lock.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from dpkit.errors import InvalidParameterError, LedgerError
from dpkit.ledger._driver import Runner, TransactionKind, Wording
from dpkit.ledger._postgres_driver import PostgresDriver, import_psycopg, mask_url
from dpkit.ledger._sqlite_driver import SQLiteDriver

__all__ = ["ServiceStore", "open_store", "SQLITE_DEFAULT"]

SQLITE_DEFAULT = "sqlite:///.dpkit/ledger.sqlite"
# 2: the audit chain is keyed (HMAC), grants and debits are chain entries written in the ledger's
# own transactions. A version-1 database's unkeyed chain cannot be extended under a key.
# 3: a dataset names the engine that reads it (``duckdb``: a shared copy; ``spark``: its Parquet
# files read in place by Spark). A version-2 database is upgraded in place (see _claim).
# 4: a Spark dataset pins its Parquet files (``datasets.files``: each file's path, size and
# modification time at registration). Version 2 and 3 databases are upgraded in place; their
# Spark datasets stay unpinned.
# 5: the multi-tenant service: publishers, reserved release names, release quotas and the
# statements of _UPGRADE_TO_5 (new tables are created by _TABLES itself).
# 6: idempotency keys of paid requests (dpkit.server.idempotency): a new table only, so a
# version-5 database is upgraded in place by creating it.
_SCHEMA_VERSION = 6
AUDIT_LOCK = 0x64706B61  # advisory-lock key of the audit chain ("dpka")
_FAILED = "service database {where}: {detail}"
_ACTION = "use the service tables"  # (the messages above do not name it)

#: Changes to existing tables that bring a version-4 database to version 5 (new tables need none:
#: ``CREATE TABLE IF NOT EXISTS`` in _TABLES creates them).
_UPGRADE_TO_5: tuple[str, ...] = (
    "ALTER TABLE datasets ADD COLUMN size_class TEXT",
    # Releases of version 4 keep their names, case-folded (the first of two names differing only
    # in case keeps the reservation; both stay downloadable), and count towards their
    # publishers' quotas. (WHERE: SQLite's parser needs it before ON CONFLICT in INSERT … SELECT.)
    "INSERT INTO release_names (folded, name, publisher, dataset, bytes, state, created_at) "
    "SELECT lower(name), name, analyst, dataset, length(rows_json) + length(report), 'published', created_at "
    "FROM releases WHERE 1 = 1 ORDER BY created_at, name ON CONFLICT (folded) DO NOTHING",
)

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
        source_table TEXT,
        engine TEXT NOT NULL DEFAULT 'duckdb',
        files TEXT,
        size_class TEXT
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
    # Published synthetic tables (dpkit.server.releases): a table created when missing.
    """CREATE TABLE IF NOT EXISTS releases (
        name TEXT PRIMARY KEY,
        dataset TEXT NOT NULL,
        analyst TEXT NOT NULL,
        spend_id BIGINT,
        epsilon TEXT NOT NULL,
        delta TEXT NOT NULL,
        created_at TEXT NOT NULL,
        columns TEXT NOT NULL,
        row_count BIGINT NOT NULL,
        rows_json TEXT NOT NULL,
        report TEXT NOT NULL
    )""",
    # Publishing (dpkit.server.publishers, dpkit.server.releases): the analysts the curator named
    # publishers; every release name reserved or taken, keyed case-insensitively, with the bytes
    # it counts against its publisher's quota; the stored parts of each release.
    """CREATE TABLE IF NOT EXISTS publishers (
        name TEXT PRIMARY KEY,
        allowed_by TEXT,
        created_at TEXT NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS release_names (
        folded TEXT PRIMARY KEY,
        name TEXT NOT NULL,
        publisher TEXT NOT NULL,
        dataset TEXT NOT NULL,
        bytes BIGINT NOT NULL,
        state TEXT NOT NULL CHECK (state IN ('reserved', 'published', 'failed')),
        created_at TEXT NOT NULL
    )""",
    "CREATE INDEX IF NOT EXISTS release_names_by_publisher ON release_names (publisher, state)",
    """CREATE TABLE IF NOT EXISTS release_parts (
        name TEXT NOT NULL,
        part INTEGER NOT NULL,
        csv TEXT NOT NULL,
        json TEXT NOT NULL,
        PRIMARY KEY (name, part)
    )""",
    # Idempotency keys of paid requests (dpkit.server.idempotency): a key claimed before the
    # debit, the spend written by the debit's own transaction, the answer's exact status and
    # bytes once sent. Times in milliseconds since the epoch (compared, not shown).
    """CREATE TABLE IF NOT EXISTS idempotency_keys (
        principal TEXT NOT NULL,
        endpoint TEXT NOT NULL,
        idem_key TEXT NOT NULL,
        fingerprint TEXT NOT NULL,
        token TEXT NOT NULL,
        state TEXT NOT NULL CHECK (state IN ('pending', 'done')),
        spend_id BIGINT,
        status INTEGER,
        body TEXT,
        created_ms BIGINT NOT NULL,
        expires_ms BIGINT NOT NULL,
        PRIMARY KEY (principal, endpoint, idem_key)
    )""",
    "CREATE INDEX IF NOT EXISTS idempotency_keys_by_age ON idempotency_keys (principal, created_ms)",
)


def now() -> str:
    return datetime.now(UTC).isoformat()


class ServiceStore(Protocol):
    """A database the service reads and writes through short transactions."""

    url: str

    def transaction(self, *, write: bool = False, audit: bool = False) -> contextlib.AbstractContextManager[Any]:
        """A cursor-like object with ``execute(sql, params)`` → rows (list of tuples)."""
        ...

    def close(self) -> None: ...


LockFactory = Callable[[], contextlib.AbstractContextManager[Any]]


class _Store:
    """The service tables over a driver. ``transaction()`` yields a :class:`~dpkit.ledger._driver.Runner`:
    reads one snapshot (PostgreSQL: statement by statement in autocommit — every read here is
    one statement or tolerates separate snapshots, and BEGIN/COMMIT would double the round
    trips of every request); ``write=True`` the database's write lock; ``audit=True`` also the
    audit chain's lock."""

    def __init__(self, url: str, driver: SQLiteDriver | PostgresDriver, lock: LockFactory | None = None) -> None:
        self.url = url
        self._driver = driver
        # Writers of a SQLite file queue on the ledger's write lock (threads of this process,
        # then the file's writer queue across processes): left to SQLite's busy handler, which
        # sleeps with growing back-off, writers would wait milliseconds each for a lock held for
        # a fraction of one.
        self._lock = lock
        try:
            with self.transaction(audit=True) as tx:
                for statement in _TABLES:
                    tx.run(statement)
                _claim(tx)
        except BaseException:
            driver.close()
            raise

    @contextlib.contextmanager
    def transaction(self, *, write: bool = False, audit: bool = False) -> Iterator[Runner]:
        if isinstance(self._driver, SQLiteDriver):
            kind: TransactionKind = "write" if write or audit else "read"
            with self._driver.transaction(_ACTION, kind, lock=self._lock) as tx:
                yield tx
            return
        with self._driver.transaction(_ACTION, "write" if write or audit else "autocommit") as tx:
            if audit:
                tx.run("SELECT pg_advisory_xact_lock(?)", (AUDIT_LOCK,))
            yield tx

    def close(self) -> None:
        self._driver.close()


def _claim(tx: Runner) -> None:
    rows = tx.run("SELECT application, version FROM dpkit_service")
    if not rows:
        tx.run(
            "INSERT INTO dpkit_service (id, application, version) VALUES (1, ?, ?)", ("dpkit-server", _SCHEMA_VERSION)
        )
    elif tuple(rows[0]) == ("dpkit-server", 5):
        # Version 6 added a table only, created above.
        tx.run("UPDATE dpkit_service SET version = ? WHERE id = 1", (_SCHEMA_VERSION,))
    elif tuple(rows[0]) == ("dpkit-server", 4):
        for statement in _UPGRADE_TO_5:
            tx.run(statement)
        tx.run("UPDATE dpkit_service SET version = ? WHERE id = 1", (_SCHEMA_VERSION,))
    elif tuple(rows[0]) in (("dpkit-server", 2), ("dpkit-server", 3)):
        # Every dataset of a version-2 database was read through a DuckDB copy; no Spark dataset
        # of a version-3 one pinned its files. The upgrade runs in the caller's write transaction,
        # so a second process opening the database at the same time waits and then finds the
        # current version.
        if rows[0][1] == 2:
            tx.run("ALTER TABLE datasets ADD COLUMN engine TEXT NOT NULL DEFAULT 'duckdb'")
        tx.run("ALTER TABLE datasets ADD COLUMN files TEXT")
        for statement in _UPGRADE_TO_5:
            tx.run(statement)
        tx.run("UPDATE dpkit_service SET version = ? WHERE id = 1", (_SCHEMA_VERSION,))
    elif tuple(rows[0]) != ("dpkit-server", _SCHEMA_VERSION):
        older = rows[0][0] == "dpkit-server" and isinstance(rows[0][1], int) and rows[0][1] < _SCHEMA_VERSION
        raise LedgerError(
            f"the service tables have version {rows[0][1]!r}; this dpkit reads version {_SCHEMA_VERSION}"
            + (
                "; they were written by an earlier dpkit whose audit chain was not keyed: keep that database as the "
                "record of its period (dpkit admin verify-log with that dpkit) and start a new ledger"
                if older
                else ""
            )
        )


def masked_url(url: str) -> str:
    """``url`` with its password shown as ``***`` (see :func:`dpkit.ledger._postgres_driver.mask_url`)."""
    return mask_url(url)


def sqlite_path(url: str) -> Path:
    """The file of a ``sqlite:///relative`` or ``sqlite:////absolute`` URL."""
    path = url[len("sqlite:///") :]
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


def open_store(url: str, *, timeout: float = 30.0, lock: LockFactory | None = None) -> ServiceStore:
    """Open (creating the tables if needed) the service tables at a ledger URL. On SQLite,
    ``lock`` returns the lock every writer of the file takes (the ledger's ``write_lock``: this
    process's thread lock and the file's writer queue across processes); without it, the
    store's own driver's."""
    url = normalise_url(url)
    timeout = float(timeout)
    if url.startswith("sqlite:///"):
        path = sqlite_path(url)
        if not path.exists():
            # Normally the ledger created the file; alone, the store creates it in WAL mode.
            try:
                sqlite3.connect(path, isolation_level=None).execute("PRAGMA journal_mode = WAL").connection.close()
            except sqlite3.Error as exc:
                raise LedgerError(f"cannot open the service database {path}: {exc}") from exc
        wording = Wording(
            noun="the service database", failed=_FAILED, connect="cannot open the service database {where}: {detail}"
        )
        return _Store(url, SQLiteDriver(path, timeout=timeout, wording=wording), lock)
    pg = import_psycopg("a postgresql:// ledger needs psycopg: pip install 'dpkit[postgres]'")
    wording = Wording(
        noun="the service database", failed=_FAILED, connect="cannot connect to the service database {where}: {detail}"
    )
    # configure=False: the service's sessions keep the server's timeouts, as they always have.
    # Every request reads these tables, so each of the web server's threads (Starlette runs
    # handlers on a pool of 40) keeps a connection rather than opening one per transaction.
    driver = PostgresDriver(
        url, pg, timeout=timeout, wording=wording, application="dpkit-server", configure=False, max_idle=64
    )
    return _Store(url, driver)
