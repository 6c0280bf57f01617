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
* **Append-only.** Triggers refuse UPDATE or DELETE of spends, DELETE of budgets and any change of
  a budget's (ε, δ), so a budget cannot grow through SQL by mistake either.

Creating a ledger is atomic too: the schema is written to a temporary file that is then hard-linked
into place, so two processes creating the same ledger at once both end up with the same valid file.
"""

from __future__ import annotations

import contextlib
import math

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX
    fcntl = None  # type: ignore[assignment]
import os
import secrets
import sqlite3
import stat
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from fractions import Fraction
from pathlib import Path

from dpkit.accounting.events import DPEvent
from dpkit._validate import short_repr as _short
from dpkit.errors import InvalidParameterError, LedgerError
from dpkit.accounting.rounding import up
from dpkit.ledger.base import (
    BudgetRecord,
    DebitFacts,
    GrantFacts,
    OnCreate,
    OnDebit,
    SpendRecord,
    budget_amounts,
    budget_from_row,
    check_debit,
    check_name,
    debit_cost,
    decode_amount,
    encode_event,
    fraction_to_text,
    spend_from_row,
    total_problems,
)

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

# Connections inherited through fork(): SQLite forbids using them in the child, and closing them
# there could disturb the parent's, so the child drops them here and never closes them.
_INHERITED: list[sqlite3.Connection] = []

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

_BUDGET_COLUMNS = "dataset, analyst, epsilon, delta, spent_epsilon, spent_delta, created_at, neighbours"
_SPEND_COLUMNS = "id, dataset, analyst, event, query_text, epsilon_cost, delta_cost, created_at"


def _now() -> str:
    return datetime.now(timezone.utc).isoformat()


class _Runner:
    """The debit's open transaction, for ``on_debit`` / ``on_create`` (see dpkit.ledger.base.SQLRunner)."""

    dialect = "sqlite"

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    def run(self, sql: str, params: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
        return list(self._conn.execute(sql, params).fetchall())


class SQLiteLedger:
    """A persistent budget ledger in one SQLite file (see the module docstring for guarantees).

    >>> import tempfile, pathlib
    >>> from dpkit.accounting import LaplaceEvent
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "ledger.sqlite"
    >>> with SQLiteLedger(path) as ledger:
    ...     _ = ledger.create_budget("census", "alice", epsilon=1.0)
    ...     spend = ledger.debit("census", "alice", LaplaceEvent(noise_multiplier=4), "SELECT COUNT(*) FROM t")
    ...     ledger.get_budget("census", "alice").remaining_epsilon
    0.75

    One object may be shared by threads (operations are serialised on a lock) and survives
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
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not (math.isfinite(timeout) and timeout >= 0):
            raise InvalidParameterError("timeout", timeout, "a finite number of seconds >= 0")
        self._path = Path(raw).expanduser().absolute()
        self._timeout = float(timeout)
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._queue_fd: int | None = None
        self._queue_pid = 0
        # Read-only transactions run on a connection per thread, without the write lock: in WAL
        # mode readers see the last committed state and never wait for a writer.
        self._readers = threading.local()
        self._reader_conns: list[tuple[int, sqlite3.Connection]] = []
        if not os.path.lexists(self._path):
            self._create()
        self._conn: sqlite3.Connection | None = self._open()

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
            raise LedgerError(f"{path} is an empty file, not a dpkit ledger; {advice} (delete it to start a new ledger)")
        if len(header) < 100 or not header.startswith(_MAGIC):
            raise LedgerError(f"{path} is not a SQLite database, so not a dpkit ledger (corrupt or foreign file); {advice}")
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
            raise LedgerError(f"the ledger {path} is not writable by this process; a ledger must be writable to debit it")

    def _connect(self) -> sqlite3.Connection:
        uri = "file:" + urllib.parse.quote(str(self._path), safe="/") + "?mode=rw"
        try:
            conn = sqlite3.connect(uri, uri=True, timeout=self._timeout, isolation_level=None, check_same_thread=False)
            conn.execute("PRAGMA foreign_keys = ON")
            conn.execute("PRAGMA synchronous = FULL")
        except sqlite3.Error as exc:
            raise LedgerError(f"cannot open the ledger {self._path}: {exc}") from exc
        return conn

    def _open(self) -> sqlite3.Connection:
        self._check_file()
        conn = self._connect()
        try:
            self._check_contents(conn)
        except BaseException:
            conn.close()
            raise
        return conn

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
            rows = conn.execute("SELECT application, version FROM dpkit_schema").fetchall() if "dpkit_schema" in tables else []
        except sqlite3.Error as exc:
            raise LedgerError(f"cannot read the ledger {path}: {exc}") from exc
        if len(rows) != 1 or rows[0][0] != _APPLICATION or not _TABLES <= tables:
            raise LedgerError(f"{path} is not a dpkit ledger (its dpkit_schema table or ledger tables are missing); {advice}")
        version = rows[0][1]
        if version != SCHEMA_VERSION:
            newer = isinstance(version, int) and version > SCHEMA_VERSION
            raise LedgerError(
                f"{path} has ledger schema version {version!r} but this dpkit reads version {SCHEMA_VERSION}"
                + ("; upgrade dpkit to use it" if newer else "; it cannot be read by this dpkit")
            )

    # -- connection handling ----------------------------------------------------------------------

    def _connection(self) -> sqlite3.Connection:
        """This process's connection (the caller holds the lock)."""
        if self._conn is None:
            raise LedgerError(f"the ledger {self._path} is closed")
        if os.getpid() != self._pid:
            _INHERITED.append(self._conn)
            self._conn = self._connect()
            self._pid = os.getpid()
        return self._conn

    def _reader(self) -> sqlite3.Connection:
        """This thread's read connection (opened on first use; a forked child opens its own)."""
        if self._conn is None:
            raise LedgerError(f"the ledger {self._path} is closed")
        conn = getattr(self._readers, "conn", None)
        if conn is None or getattr(self._readers, "pid", None) != os.getpid():
            conn = self._connect()
            self._readers.conn, self._readers.pid = conn, os.getpid()
            with self._locked():
                self._reader_conns.append((os.getpid(), conn))
        return conn

    @contextlib.contextmanager
    def write_lock(self) -> Iterator[None]:
        """This process's lock, then the file's writer queue: held around every write
        transaction of this file — the ledger's and, through this, the curator service's.
        Writers of one process queue on the thread lock; writers of several processes (``dpkit
        serve --workers N``) on an ``flock`` of ``PATH.write-lock``, which hands over the moment
        it is released — SQLite's own busy handler sleeps 1, 2, 5, … 100 ms between tries, and
        under contention that sleeping, not the work, would bound throughput. Waiting is bounded
        by ``timeout``, after which LedgerError."""
        with self._locked():
            with self._writer_queue():
                yield

    def _writer_queue(self) -> contextlib.AbstractContextManager[None]:
        if fcntl is None:  # pragma: no cover - not POSIX: SQLite's busy handler alone
            return contextlib.nullcontext()
        return self._flocked()

    @contextlib.contextmanager
    def _flocked(self) -> Iterator[None]:
        if self._queue_fd is None or self._queue_pid != os.getpid():
            # (an inherited descriptor would share the parent's lock: each process opens its own)
            try:
                self._queue_fd = os.open(f"{self._path}.write-lock", os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o600)
            except OSError as exc:
                raise LedgerError(f"cannot open the writer queue of {self._path}: {exc}") from exc
            self._queue_pid = os.getpid()
        fd = self._queue_fd
        deadline = time.monotonic() + self._timeout
        pause = 0.0
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise LedgerError(f"another process held the ledger {self._path} for more than {self._timeout} s") from None
                # Short, growing pauses: hand-over within tens of microseconds under load.
                pause = min(0.001, pause * 2 + 0.00002)
                time.sleep(pause)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)

    def _locked(self) -> threading.Lock:
        if os.getpid() != self._pid:
            # A lock copied by fork() may have been held by a thread that does not exist here.
            self._lock = threading.Lock()
        return self._lock

    @contextlib.contextmanager
    def _db(self, action: str) -> Iterator[None]:
        """Turn SQLite errors into LedgerError naming the path and the action."""
        try:
            yield
        except sqlite3.Error as exc:
            if isinstance(exc, sqlite3.OperationalError) and "locked" in str(exc):
                raise LedgerError(
                    f"could not {action} in {self._path}: another process held the ledger for more than {self._timeout} s ({exc})"
                ) from exc
            raise LedgerError(f"could not {action} in {self._path}: {exc}") from exc

    @contextlib.contextmanager
    def _transaction(self, action: str, *, write: bool) -> Iterator[sqlite3.Connection]:
        """One transaction: BEGIN IMMEDIATE (write) or BEGIN (a consistent read); COMMIT on
        success, ROLLBACK on any exception."""
        with self.write_lock() if write else contextlib.nullcontext(), self._db(action):
            conn = self._connection() if write else self._reader()
            conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
            try:
                yield conn
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    with contextlib.suppress(sqlite3.Error):
                        conn.execute("ROLLBACK")
                raise

    def close(self) -> None:
        """Close the connection; later calls raise LedgerError. Safe to call twice."""
        with self._locked():
            if self._conn is not None and os.getpid() == self._pid:
                self._conn.close()
            for pid, conn in self._reader_conns:
                if pid == os.getpid():  # (never a connection inherited through fork())
                    with contextlib.suppress(sqlite3.Error):
                        conn.close()
            self._reader_conns = []
            self._conn = None

    def __enter__(self) -> SQLiteLedger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"SQLiteLedger({str(self._path)!r})"

    # -- decoding -----------------------------------------------------------------------------------

    def _fraction(self, text: object, what: str) -> Fraction:
        return decode_amount(text, self._path, what)

    def _budget(self, row: tuple) -> BudgetRecord:  # type: ignore[type-arg]
        return budget_from_row(row, self._path)

    def _spend(self, row: tuple) -> SpendRecord:  # type: ignore[type-arg]
        return spend_from_row(row, self._path)

    def _missing(self, dataset: str, analyst: str) -> LedgerError:
        return LedgerError(
            f"there is no budget for analyst {analyst!r} on dataset {dataset!r} in {self._path}; "
            "create it first with create_budget(dataset, analyst, epsilon=..., delta=...)"
        )

    # -- the LedgerBackend interface ----------------------------------------------------------------

    def create_budget(
        self, dataset: str, analyst: str, *, epsilon: float, delta: float = 0.0, exist_ok: bool = False, on_create: OnCreate | None = None
    ) -> BudgetRecord:
        """Create the (ε, δ) budget of ``analyst`` on ``dataset`` and return it.

        If it already exists: with ``exist_ok=True`` and the same (ε, δ), the stored budget is
        returned; otherwise LedgerError (a stored budget is never changed or reset)."""
        check_name("dataset", dataset)
        check_name("analyst", analyst)
        eps, dlt = budget_amounts(epsilon, delta)
        if not isinstance(exist_ok, bool):
            raise InvalidParameterError("exist_ok", exist_ok, "True or False")
        with self._transaction("create the budget", write=True) as conn:
            row = conn.execute(f"SELECT {_BUDGET_COLUMNS} FROM budgets WHERE dataset = ? AND analyst = ?", (dataset, analyst)).fetchone()
            if row is None:
                row = (dataset, analyst, fraction_to_text(eps), fraction_to_text(dlt), "0/1", "0/1", _now(), None)
                conn.execute(f"INSERT INTO budgets ({_BUDGET_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)", row)
                if on_create is not None:
                    on_create(_Runner(conn), GrantFacts(dataset, analyst, eps, dlt, row[6]))
            else:
                same = (self._fraction(row[2], "epsilon"), self._fraction(row[3], "delta")) == (eps, dlt)
                if not (exist_ok and same):
                    stored = self._budget(row)
                    raise LedgerError(
                        f"a budget for analyst {analyst!r} on dataset {dataset!r} already exists in {self._path} "
                        f"(epsilon={stored.epsilon!r}, delta={stored.delta!r})"
                        + ("" if same else f", not epsilon={float(epsilon)!r}, delta={float(delta)!r}; a stored budget is never changed")
                        + ("" if exist_ok else "; pass exist_ok=True to reuse it")
                    )
        return self._budget(row)

    def get_budget(self, dataset: str, analyst: str) -> BudgetRecord:
        """The budget of ``analyst`` on ``dataset``; LedgerError if there is none."""
        check_name("dataset", dataset)
        check_name("analyst", analyst)
        with self._transaction("read the budget", write=False) as conn:
            row = conn.execute(f"SELECT {_BUDGET_COLUMNS} FROM budgets WHERE dataset = ? AND analyst = ?", (dataset, analyst)).fetchone()
        if row is None:
            raise self._missing(dataset, analyst)
        return self._budget(row)

    def list_budgets(self) -> list[BudgetRecord]:
        """Every budget, ordered by dataset then analyst."""
        with self._transaction("list the budgets", write=False) as conn:
            rows = conn.execute(f"SELECT {_BUDGET_COLUMNS} FROM budgets ORDER BY dataset, analyst").fetchall()
        return [self._budget(row) for row in rows]

    def list_spends(self, dataset: str, analyst: str) -> list[SpendRecord]:
        """Every spend debited from this budget, oldest first; LedgerError if there is no budget."""
        check_name("dataset", dataset)
        check_name("analyst", analyst)
        with self._transaction("list the spends", write=False) as conn:
            exists = conn.execute("SELECT 1 FROM budgets WHERE dataset = ? AND analyst = ?", (dataset, analyst)).fetchone()
            rows = conn.execute(f"SELECT {_SPEND_COLUMNS} FROM spends WHERE dataset = ? AND analyst = ? ORDER BY id", (dataset, analyst)).fetchall()
        if exists is None:
            raise self._missing(dataset, analyst)
        return [self._spend(row) for row in rows]

    def debit(
        self,
        dataset: str,
        analyst: str,
        event: DPEvent,
        query_text: str = "",
        *,
        epsilon_cost: float | Fraction | None = None,
        delta_cost: float | Fraction | None = None,
        on_debit: OnDebit | None = None,
    ) -> SpendRecord:
        """Pay for ``event`` from the budget of ``analyst`` on ``dataset``, or raise and write nothing.

        The cost is the event's basic-composition cost (ε's and δ's add; Gaussian and subsampled
        events raise InvalidParameterError naming ``event``), or ``(epsilon_cost, delta_cost)``
        when both are given. In one ``BEGIN IMMEDIATE`` transaction the totals are read, the new
        totals compared exactly with the budget, the spend inserted and the totals updated. A
        debit that would exceed the budget raises :class:`~dpkit.errors.BudgetExceededError`.
        All events of one budget must share one neighbour relation (the first debit fixes it).
        """
        check_name("dataset", dataset)
        check_name("analyst", analyst)
        if not isinstance(query_text, str):
            raise InvalidParameterError("query_text", _short(query_text), "a string (may be empty)")
        eps, dlt, relation = debit_cost(event, epsilon_cost, delta_cost)
        event_json = encode_event(event)
        created = _now()
        with self._transaction("debit the budget", write=True) as conn:
            row = conn.execute(
                "SELECT epsilon, delta, spent_epsilon, spent_delta, neighbours FROM budgets WHERE dataset = ? AND analyst = ?",
                (dataset, analyst),
            ).fetchone()
            if row is None:
                raise self._missing(dataset, analyst)
            what = f"analyst {analyst!r} on dataset {dataset!r}"
            new_eps, new_dlt = check_debit(row, eps, dlt, relation, event, what, self._path)
            spend_id = conn.execute(
                f"INSERT INTO spends ({_SPEND_COLUMNS}) VALUES (NULL, ?, ?, ?, ?, ?, ?, ?)",
                (dataset, analyst, event_json, query_text, fraction_to_text(eps), fraction_to_text(dlt), created),
            ).lastrowid
            hook = _after_insert_hook
            if hook is not None:
                hook()
            conn.execute(
                "UPDATE budgets SET spent_epsilon = ?, spent_delta = ?, neighbours = COALESCE(neighbours, ?) "
                "WHERE dataset = ? AND analyst = ?",
                (fraction_to_text(new_eps), fraction_to_text(new_dlt), relation, dataset, analyst),
            )
            if on_debit is not None:
                on_debit(_Runner(conn), DebitFacts(int(spend_id), dataset, analyst, query_text, eps, dlt, new_eps, new_dlt, created))  # type: ignore[arg-type]
        return SpendRecord(
            id=int(spend_id),  # type: ignore[arg-type]
            dataset=dataset,
            analyst=analyst,
            event=event,
            query_text=query_text,
            epsilon_cost=up(eps),
            delta_cost=up(dlt),
            created_at=datetime.fromisoformat(created),
        )

    def verify(self) -> None:
        """Run ``PRAGMA integrity_check`` and check, in one consistent snapshot, that every
        budget's spent totals equal the exact sum of its spends and stay within the budget.
        Raises LedgerError describing the first problems found."""
        with self._transaction("verify the ledger", write=False) as conn:
            integrity = [row[0] for row in conn.execute("PRAGMA integrity_check").fetchall()]
            budgets = conn.execute("SELECT dataset, analyst, epsilon, delta, spent_epsilon, spent_delta FROM budgets").fetchall()
            # Equal costs are counted by SQLite, so Python adds one product per distinct cost.
            spends = conn.execute(
                "SELECT dataset, analyst, epsilon_cost, delta_cost, count(*) FROM spends GROUP BY dataset, analyst, epsilon_cost, delta_cost"
            ).fetchall()
        if integrity != ["ok"]:
            raise LedgerError(f"{self._path} is corrupt (integrity_check: {'; '.join(map(str, integrity[:3]))})")
        problems = total_problems(budgets, spends, self._path)
        if problems:
            raise LedgerError(f"{self._path} is inconsistent: " + "; ".join(problems[:3]))
