"""The default ledger: one SQLite file, safe for many threads and processes.

``SQLiteLedger(path)`` opens the ledger at ``path`` (default ``.dpkit/ledger.sqlite`` under the
current directory), creating it — and its parent directory — if no file is there. An existing file
is used only if it is a dpkit ledger: the SQLite header, the ``application_id``, a
``PRAGMA quick_check`` and the ``dpkit_schema`` table (application and version) are all checked
before anything is written. A corrupt, truncated, foreign or unreadable file raises
:class:`~dpkit.errors.LedgerError` naming the path and is never reset or overwritten.

Guarantees:

* **Atomic check-and-debit.** :meth:`SQLiteLedger.debit` runs ``BEGIN IMMEDIATE`` (the write lock),
  reads the totals, compares exactly (fractions), inserts the spend, updates the totals and
  commits — one transaction. Other processes wait (busy timeout, default 30 s) rather than fail.
* **Crash consistency.** The database runs in WAL mode with ``synchronous=FULL``: a process killed
  at any point leaves each debit wholly recorded (spend row and totals) or wholly absent, and a
  committed debit survives power loss.
* **Writers queue, readers do not wait.** Write transactions of every process queue on an
  ``flock`` of ``PATH.write-lock`` (a companion file, like SQLite's ``-wal``), which hands over
  at once; read transactions use a connection per thread and never wait for a writer (WAL).
  The connections are the driver's (:mod:`dpkit.ledger._sqlite_driver`); the operations are
  :class:`~dpkit.ledger.sql.SQLLedger`'s, shared with the PostgreSQL ledger.
* **Append-only.** Triggers refuse UPDATE or DELETE of spends, DELETE of budgets and any change of
  a budget's (ε, δ), so a budget cannot grow through SQL by mistake either.

Creating a ledger is atomic too: the schema is written to a temporary file that is then hard-linked
into place, so two processes creating the same ledger at once both end up with the same valid file.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import sqlite3
import stat
from collections.abc import Callable
from datetime import UTC, datetime
from fractions import Fraction
from pathlib import Path
from typing import Any

from dpkit.errors import InvalidParameterError, LedgerError
from dpkit.ledger._driver import Runner, Wording, check_timeout
from dpkit.ledger._sqlite_driver import SQLiteDriver
from dpkit.ledger.base import fraction_to_text
from dpkit.ledger.sql import BUDGET_COLUMNS, SPEND_COLUMNS, SQLLedger

__all__ = ["SQLiteLedger", "DEFAULT_LEDGER_PATH", "SCHEMA_VERSION", "APPLICATION_ID"]

#: The default ledger location, relative to the current directory when the ledger is opened.
DEFAULT_LEDGER_PATH = Path(".dpkit") / "ledger.sqlite"
#: The version of the tables below; bumped (with a migration) whenever they change.
SCHEMA_VERSION = 1
#: ``PRAGMA application_id`` of a dpkit ledger ("dpkt"), stored in the SQLite file header.
APPLICATION_ID = 0x64706B74
_APPLICATION = "dpkit-ledger"
_MAGIC = b"SQLite format 3\x00"

#: TEST ONLY — never set this in production code. When not None, :meth:`SQLiteLedger.debit` calls
#: it inside the debit transaction, after the spend row is inserted and before the totals are
#: updated and the transaction commits. The crash-consistency tests set it in a child process to
#: hold a debit half-done and kill the process there.
_after_insert_hook: Callable[[], None] | None = None

_SCHEMA = (
    """CREATE TABLE dpkit_schema (
        id          INTEGER PRIMARY KEY CHECK (id = 1),
        application TEXT    NOT NULL,
        version     INTEGER NOT NULL,
        created_at  TEXT    NOT NULL
    )""",
    # Amounts are exact fractions, stored as text "numerator/denominator".
    """CREATE TABLE budgets (
        dataset       TEXT NOT NULL,
        analyst       TEXT NOT NULL,
        epsilon       TEXT NOT NULL,
        delta         TEXT NOT NULL,
        spent_epsilon TEXT NOT NULL,
        spent_delta   TEXT NOT NULL,
        neighbours    TEXT,
        created_at    TEXT NOT NULL,
        PRIMARY KEY (dataset, analyst)
    )""",
    """CREATE TABLE spends (
        id           INTEGER PRIMARY KEY AUTOINCREMENT,
        dataset      TEXT NOT NULL,
        analyst      TEXT NOT NULL,
        event        TEXT NOT NULL,
        query_text   TEXT NOT NULL,
        epsilon_cost TEXT NOT NULL,
        delta_cost   TEXT NOT NULL,
        created_at   TEXT NOT NULL,
        FOREIGN KEY (dataset, analyst) REFERENCES budgets (dataset, analyst)
    )""",
    "CREATE INDEX spends_by_budget ON spends (dataset, analyst, id)",
    """CREATE TRIGGER spends_append_only_update BEFORE UPDATE ON spends
       BEGIN SELECT RAISE(ABORT, 'dpkit ledger: spends are append-only'); END""",
    """CREATE TRIGGER spends_append_only_delete BEFORE DELETE ON spends
       BEGIN SELECT RAISE(ABORT, 'dpkit ledger: spends are append-only'); END""",
    """CREATE TRIGGER budgets_keep BEFORE DELETE ON budgets
       BEGIN SELECT RAISE(ABORT, 'dpkit ledger: budgets cannot be deleted'); END""",
    """CREATE TRIGGER budgets_fixed BEFORE UPDATE OF dataset, analyst, epsilon, delta ON budgets
       BEGIN SELECT RAISE(ABORT, 'dpkit ledger: a budget''s epsilon and delta cannot change'); END""",
)
_TABLES = frozenset({"dpkit_schema", "budgets", "spends"})

_WORDING = Wording(
    noun="the ledger",
    connect="cannot open the ledger {where}: {detail}",
    locked="could not {action} in {where}: another process held the ledger for more than {timeout} s ({detail})",
)


def _now() -> str:
    return datetime.now(UTC).isoformat()


class SQLiteLedger(SQLLedger):
    """A persistent budget ledger in one SQLite file (see the module docstring for guarantees).

    >>> import tempfile, pathlib
    >>> from dpkit.accounting import LaplaceEvent
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "ledger.sqlite"
    >>> with SQLiteLedger(path) as ledger:
    ...     _ = ledger.create_budget("census", "alice", epsilon=1.0)
    ...     spend = ledger.debit("census", "alice", LaplaceEvent(noise_multiplier=4), "SELECT COUNT(*) FROM t")
    ...     ledger.get_budget("census", "alice").remaining_epsilon
    0.75

    One object may be shared by threads (writes are serialised on a lock) and survives
    ``fork()`` (the child opens its own connection). ``timeout`` is how long, in seconds, an
    operation waits for another process's transaction before raising LedgerError.
    """

    def __init__(self, path: str | os.PathLike[str] = DEFAULT_LEDGER_PATH, *, timeout: float = 30.0) -> None:
        try:
            raw = os.fspath(path)
        except TypeError:
            raise InvalidParameterError("path", path, "a str or os.PathLike path to the ledger file") from None
        if not isinstance(raw, str) or not raw or "\x00" in raw:
            raise InvalidParameterError("path", path, "a non-empty str or os.PathLike path to the ledger file")
        self._timeout = check_timeout(timeout)
        self._path = Path(raw).expanduser().absolute()
        self._where = self._path
        if not os.path.lexists(self._path):
            self._create()
        self._check_file()
        self._driver = SQLiteDriver(self._path, timeout=self._timeout, wording=_WORDING, check=self._check_contents)

    # -- opening --------------------------------------------------------------------------------

    @property
    def path(self) -> Path:
        """The absolute path of the ledger file."""
        return self._path

    def _create(self) -> None:
        """Write a fresh ledger to a temporary file, then hard-link it into place (atomic: if
        another process created the ledger first, its file is kept and this one discarded)."""
        parent = self._path.parent
        try:
            parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise LedgerError(f"cannot create the ledger directory {parent}: {exc.strerror or exc}") from exc
        tmp = parent / f".{self._path.name}.{os.getpid()}.{secrets.token_hex(6)}.creating"
        try:
            conn = sqlite3.connect(tmp, isolation_level=None)
            try:
                conn.execute("PRAGMA journal_mode = WAL")
                conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
                conn.execute("BEGIN IMMEDIATE")
                for statement in _SCHEMA:
                    conn.execute(statement)
                conn.execute(
                    "INSERT INTO dpkit_schema (id, application, version, created_at) VALUES (1, ?, ?, ?)",
                    (_APPLICATION, SCHEMA_VERSION, _now()),
                )
                conn.execute("COMMIT")
            finally:
                conn.close()  # the last connection checkpoints the WAL into the file
            try:
                os.link(tmp, self._path)
            except FileExistsError:
                pass  # created meanwhile by someone else: use theirs
            except OSError:
                # No hard links on this file system: create exclusively and copy.
                try:
                    with open(self._path, "xb") as out:
                        out.write(tmp.read_bytes())
                        out.flush()
                        os.fsync(out.fileno())
                except FileExistsError:
                    pass
        except (OSError, sqlite3.Error) as exc:
            raise LedgerError(f"cannot create the ledger {self._path}: {exc}") from exc
        finally:
            for leftover in (tmp, Path(f"{tmp}-wal"), Path(f"{tmp}-shm"), Path(f"{tmp}-journal")):
                with contextlib.suppress(OSError):
                    leftover.unlink()

    def _check_file(self) -> None:
        """Checks made on the raw bytes, before SQLite opens (and could change) the file."""
        path = self._path
        try:
            st = os.stat(path)
        except OSError as exc:
            raise LedgerError(f"cannot open the ledger {path}: {exc.strerror or exc}") from exc
        if stat.S_ISDIR(st.st_mode):
            raise LedgerError(f"the ledger path {path} is a directory, not a ledger file")
        if not stat.S_ISREG(st.st_mode):
            raise LedgerError(f"the ledger path {path} is not a regular file")
        try:
            with open(path, "rb") as f:
                header = f.read(100)
        except OSError as exc:
            raise LedgerError(f"cannot read the ledger {path}: {exc.strerror or exc}") from exc
        advice = "refusing to use or change it; restore it from a backup or pass another path"
        if not header:
            raise LedgerError(
                f"{path} is an empty file, not a dpkit ledger; {advice} (delete it to start a new ledger)"
            )
        if len(header) < 100 or not header.startswith(_MAGIC):
            raise LedgerError(
                f"{path} is not a SQLite database, so not a dpkit ledger (corrupt or foreign file); {advice}"
            )
        app_id = int.from_bytes(header[68:72], "big")
        if app_id != APPLICATION_ID:
            raise LedgerError(
                f"{path} is a SQLite database but not a dpkit ledger (application_id {app_id:#x}, "
                f"a dpkit ledger has {APPLICATION_ID:#x}); {advice}"
            )
        page_size = int.from_bytes(header[16:18], "big")
        page_size = 65536 if page_size == 1 else page_size
        if page_size < 512 or page_size & (page_size - 1):
            raise LedgerError(f"{path} has a corrupt header (page size {page_size}); {advice}")
        pages = int.from_bytes(header[28:32], "big")
        pages_valid = pages > 0 and header[24:28] == header[92:96]
        wal = Path(f"{path}-wal")
        wal_pending = wal.exists() and wal.stat().st_size > 0
        if st.st_size % page_size or (pages_valid and not wal_pending and st.st_size < pages * page_size):
            raise LedgerError(
                f"{path} is truncated ({st.st_size} bytes; its header describes {pages} pages of {page_size} bytes); {advice}"
            )
        if not os.access(path, os.R_OK | os.W_OK):
            raise LedgerError(
                f"the ledger {path} is not writable by this process; a ledger must be writable to debit it"
            )

    def _check_contents(self, conn: sqlite3.Connection) -> None:
        path = self._path
        advice = "refusing to use or change it; restore it from a backup or pass another path"
        try:
            problems = [row[0] for row in conn.execute("PRAGMA quick_check").fetchall()]
        except sqlite3.Error as exc:
            raise LedgerError(f"{path} is corrupt ({exc}); {advice}") from exc
        if problems != ["ok"]:
            raise LedgerError(f"{path} is corrupt (quick_check: {'; '.join(map(str, problems[:3]))}); {advice}")
        try:
            tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            rows = (
                conn.execute("SELECT application, version FROM dpkit_schema").fetchall()
                if "dpkit_schema" in tables
                else []
            )
        except sqlite3.Error as exc:
            raise LedgerError(f"cannot read the ledger {path}: {exc}") from exc
        if len(rows) != 1 or rows[0][0] != _APPLICATION or not tables >= _TABLES:
            raise LedgerError(
                f"{path} is not a dpkit ledger (its dpkit_schema table or ledger tables are missing); {advice}"
            )
        version = rows[0][1]
        if version != SCHEMA_VERSION:
            newer = isinstance(version, int) and version > SCHEMA_VERSION
            raise LedgerError(
                f"{path} has ledger schema version {version!r} but this dpkit reads version {SCHEMA_VERSION}"
                + ("; upgrade dpkit to use it" if newer else "; it cannot be read by this dpkit")
            )

    # -- connections --------------------------------------------------------------------------------

    def write_lock(self) -> contextlib.AbstractContextManager[None]:
        """The lock held around every write transaction of this file — the ledger's and, through
        this, the curator service's: this process's thread lock, then the file's writer queue
        across processes (see :meth:`dpkit.ledger._sqlite_driver.SQLiteDriver.write_lock`).
        Waiting is bounded by ``timeout``, after which LedgerError."""
        return self._driver.write_lock()

    def __enter__(self) -> SQLiteLedger:
        return self

    def __repr__(self) -> str:
        return f"SQLiteLedger({str(self._path)!r})"

    # -- the steps of SQLLedger that are SQLite's -----------------------------------------------------

    def _claim_budget(
        self, tx: Runner, dataset: str, analyst: str, eps: Fraction, dlt: Fraction
    ) -> tuple[tuple[Any, ...], bool]:
        # The write lock is held from BEGIN IMMEDIATE: no one can insert between these statements.
        row = tx.one(f"SELECT {BUDGET_COLUMNS} FROM budgets WHERE dataset = ? AND analyst = ?", (dataset, analyst))
        if row is not None:
            return row, False
        row = (dataset, analyst, fraction_to_text(eps), fraction_to_text(dlt), "0/1", "0/1", _now(), None)
        tx.run(f"INSERT INTO budgets ({BUDGET_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)", row)
        return row, True

    def _lock_budget(self, tx: Runner, dataset: str, analyst: str) -> tuple[Any, ...] | None:
        # BEGIN IMMEDIATE already holds the file's write lock, so a plain read locks the row.
        return tx.one(
            "SELECT epsilon, delta, spent_epsilon, spent_delta, neighbours FROM budgets WHERE dataset = ? AND analyst = ?",
            (dataset, analyst),
        )

    def _stamp(self) -> str:
        return _now()

    def _insert_spend(self, tx: Runner, values: tuple[Any, ...], stamp: str | None) -> tuple[int, object]:
        cur = tx.conn.execute(
            f"INSERT INTO spends ({SPEND_COLUMNS}) VALUES (NULL, ?, ?, ?, ?, ?, ?, ?)", (*values, stamp)
        )
        return int(cur.lastrowid), stamp

    def _after_insert(self) -> None:
        hook = _after_insert_hook
        if hook is not None:
            hook()

    def _read_integrity(self, tx: Runner) -> Any:
        return [row[0] for row in tx.run("PRAGMA integrity_check")]

    def _integrity_problems(self, found: Any) -> list[str]:
        if found != ["ok"]:
            raise LedgerError(f"{self._path} is corrupt (integrity_check: {'; '.join(map(str, found[:3]))})")
        return []
