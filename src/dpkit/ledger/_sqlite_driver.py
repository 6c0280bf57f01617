"""The connections and transactions of one SQLite file, safe for many threads and processes.

* **Writers queue, readers do not wait.** Write transactions (``BEGIN IMMEDIATE``) run on one
  connection per process, behind :meth:`SQLiteDriver.write_lock`: this process's thread lock,
  then an ``flock`` of ``PATH.write-lock`` (a companion file, like SQLite's ``-wal``) that every
  process writing the file queues on. Read transactions (``BEGIN``) run on a connection per
  thread and, the file being in WAL mode, see the last committed state without waiting for a
  writer (https://www.sqlite.org/wal.html).
* **Durable commits.** Every connection runs with ``synchronous=FULL``: a committed transaction
  survives power loss, and a process killed mid-transaction leaves it wholly absent.
* **Fork safety.** SQLite forbids using a connection in a child process that was opened by its
  parent (https://www.sqlite.org/howtocorrupt.html, section 2.6); a forked child opens its own
  connections, lock and writer-queue descriptor, and never closes the parent's.
"""

from __future__ import annotations

import contextlib

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX
    fcntl = None  # type: ignore[assignment]
import os
import sqlite3
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path

from dpkit.errors import LedgerError
from dpkit.ledger._driver import Runner, TransactionKind, Wording

__all__ = ["SQLiteDriver"]

# Connections inherited through fork(): SQLite forbids using them in the child, and closing them
# there could disturb the parent's, so the child drops them here and never closes them.
_INHERITED: list[sqlite3.Connection] = []

LockFactory = Callable[[], contextlib.AbstractContextManager[object]]


class SQLiteDriver:
    """The connections of the SQLite file at ``path`` (which must exist).

    ``check`` runs on the first connection before anything else uses it (the ledger checks its
    tables there) and closes it if it raises. ``timeout`` bounds every wait for another
    process's lock; past it, LedgerError worded by ``wording``."""

    dialect = "sqlite"

    def __init__(
        self, path: Path, *, timeout: float, wording: Wording, check: Callable[[sqlite3.Connection], None] | None = None
    ) -> None:
        self.path = path
        self.where: object = path
        self._timeout = timeout
        self._wording = wording
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._queue_fd: int | None = None
        self._queue_pid = 0
        self._readers = threading.local()
        self._reader_conns: list[tuple[int, sqlite3.Connection]] = []
        conn = self.connect()
        if check is not None:
            try:
                check(conn)
            except BaseException:
                conn.close()
                raise
        self._conn: sqlite3.Connection | None = conn

    def connect(self) -> sqlite3.Connection:
        """A new connection to the existing file (``mode=rw``: never creates one)."""
        uri = "file:" + urllib.parse.quote(str(self.path), safe="/") + "?mode=rw"
        try:
            conn = sqlite3.connect(uri, uri=True, timeout=self._timeout, isolation_level=None, check_same_thread=False)
            conn.execute("PRAGMA foreign_keys = ON")
            conn.execute("PRAGMA synchronous = FULL")
        except sqlite3.Error as exc:
            raise LedgerError(self._wording.say(self._wording.connect, where=self.where, detail=exc)) from exc
        return conn

    # -- connections --------------------------------------------------------------------------------

    def _closed(self) -> LedgerError:
        return LedgerError(f"{self._wording.noun} {self.where} is closed")

    def _writer(self) -> sqlite3.Connection:
        """This process's write connection (the caller holds the write lock)."""
        if self._conn is None:
            raise self._closed()
        if os.getpid() != self._pid:
            _INHERITED.append(self._conn)
            self._conn = self.connect()
            self._pid = os.getpid()
        return self._conn

    def _reader(self) -> sqlite3.Connection:
        """This thread's read connection (opened on first use; a forked child opens its own)."""
        if self._conn is None:
            raise self._closed()
        conn = getattr(self._readers, "conn", None)
        if conn is None or getattr(self._readers, "pid", None) != os.getpid():
            conn = self.connect()
            self._readers.conn, self._readers.pid = conn, os.getpid()
            with self._locked():
                self._reader_conns.append((os.getpid(), conn))
        return conn

    def _locked(self) -> threading.Lock:
        if os.getpid() != self._pid:
            # A lock copied by fork() may have been held by a thread that does not exist here.
            self._lock = threading.Lock()
        return self._lock

    # -- the write lock -----------------------------------------------------------------------------

    @contextlib.contextmanager
    def write_lock(self) -> Iterator[None]:
        """This process's lock, then the file's writer queue: held around every write
        transaction of the file — the ledger's and, through it, the curator service's. Writers
        of one process queue on the thread lock; writers of several processes (``dpkit serve
        --workers N``) on an ``flock`` of ``PATH.write-lock``, which hands over the moment it is
        released — SQLite's own busy handler sleeps 1, 2, 5, … 100 ms between tries, and under
        contention that sleeping, not the work, would bound throughput. Waiting is bounded by
        ``timeout``, after which LedgerError."""
        with self._locked(), self._writer_queue():
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
                self._queue_fd = os.open(
                    f"{self.path}.write-lock", os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o600
                )
            except OSError as exc:
                raise LedgerError(f"cannot open the writer queue of {self.where}: {exc}") from exc
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
                    raise LedgerError(
                        f"another process held {self._wording.noun} {self.where} for more than {self._timeout} s"
                    ) from None
                # Short, growing pauses: hand-over within tens of microseconds under load.
                pause = min(0.001, pause * 2 + 0.00002)
                time.sleep(pause)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)

    # -- transactions -------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _errors(self, action: str) -> Iterator[None]:
        """Turn SQLite errors into LedgerError naming the file and the action."""
        try:
            yield
        except sqlite3.Error as exc:
            w = self._wording
            locked = isinstance(exc, sqlite3.OperationalError) and "locked" in str(exc)
            template = (w.locked or w.failed) if locked else w.failed
            raise LedgerError(
                w.say(template, action=action, where=self.where, detail=exc, timeout=self._timeout)
            ) from exc

    @contextlib.contextmanager
    def transaction(self, action: str, kind: TransactionKind, *, lock: LockFactory | None = None) -> Iterator[Runner]:
        """One transaction: ``"write"`` takes ``lock`` (default :meth:`write_lock`) and runs
        BEGIN IMMEDIATE on the write connection; ``"read"`` (and ``"autocommit"``, which a
        BEGIN costs nothing here) a consistent BEGIN on this thread's read connection. COMMIT
        on success, ROLLBACK on any exception."""
        write = kind == "write"
        guard = (lock or self.write_lock)() if write else contextlib.nullcontext()
        with guard, self._errors(action):
            conn = self._writer() if write else self._reader()
            conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
            try:
                yield Runner(conn, "sqlite")
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    with contextlib.suppress(sqlite3.Error):
                        conn.execute("ROLLBACK")
                raise

    def close(self) -> None:
        """Close this process's connections; later transactions raise LedgerError. Safe to call twice."""
        with self._locked():
            if self._conn is not None and os.getpid() == self._pid:
                self._conn.close()
            for pid, conn in self._reader_conns:
                if pid == os.getpid():  # (never a connection inherited through fork())
                    with contextlib.suppress(sqlite3.Error):
                        conn.close()
            self._reader_conns = []
            self._conn = None
