"""The connections and transactions of one PostgreSQL database, through psycopg 3.

* **A small pool.** Each transaction borrows a connection of its own (an idle one, else a new
  one), so threads run in parallel on the server; up to 16 idle connections are kept.
* **Explicit isolation.** ``"write"`` transactions run READ COMMITTED: the caller locks what it
  reads (``SELECT … FOR UPDATE``, an advisory lock) and then sees the latest committed rows;
  ``"read"`` ones REPEATABLE READ, READ ONLY: one snapshot for several statements
  (https://www.postgresql.org/docs/current/transaction-iso.html).
* **Bounded waits.** Sessions set ``lock_timeout`` (the caller's ``timeout``),
  ``statement_timeout`` and ``idle_in_transaction_session_timeout`` (10 s more), so a client
  frozen inside a transaction loses it instead of holding a lock for ever, and ask for
  ``synchronous_commit=on`` when the server's default is off.
* **Fork safety.** A child of ``fork()`` forgets the pooled connections of its parent (closing
  them would end the parent's sessions: libpq says goodbye to the server on close) and opens its
  own (https://www.psycopg.org/psycopg3/docs/advanced/pool.html).
* **No password in messages.** :func:`mask_url` hides the URL's password, and any server message
  quoting it is scrubbed.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import threading
import weakref
from collections.abc import Iterator
from types import ModuleType
from typing import TYPE_CHECKING, Any

from dpkit.errors import InvalidParameterError, LedgerError
from dpkit.ledger._driver import Runner, TransactionKind, Wording

if TYPE_CHECKING:
    import psycopg

__all__ = ["PostgresDriver", "mask_url", "ACCEPTED_URL", "import_psycopg"]

ACCEPTED_URL = "a PostgreSQL URL: postgresql://user[:password]@host[:port]/database[?param=value&...]"
# Idle connections kept per driver by default; threads beyond that connect for each transaction.
MAX_IDLE = 16
# Grace given to any one statement beyond ``timeout`` (which bounds lock waits), so a lock wait
# reports itself as such rather than as a slow statement.
_STATEMENT_GRACE_MS = 10_000
_MAX_MS = 2**31 - 1  # PostgreSQL's limit for timeout settings

_BEGIN = {
    "write": "BEGIN ISOLATION LEVEL READ COMMITTED",
    "read": "BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY",
}

# Connections inherited through fork(): the parent still uses them, and closing them in the child
# would end the parent's sessions, so the child keeps them here, unused and never closed, to be
# dropped silently when it exits.
_INHERITED: list[Any] = []
_DRIVERS: weakref.WeakSet[PostgresDriver] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for driver in list(_DRIVERS):
        driver._forget_parent_connections()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)

# The password of a URL's user info, and (ssl)password=... in a query string or a key=value
# connection string. The user info runs to the first '@' even across a '/' (which libpq would
# refuse): masking too much is harmless, showing a mistyped password in a log is not.
_USERINFO = re.compile(r"^(?P<head>[A-Za-z][A-Za-z0-9+.\-]*://[^@/:]*):(?P<secret>[^@]*)@")
_PASSWORD_PARAM = re.compile(r"(?P<head>\b(?:ssl)?password\s*=\s*)(?P<secret>'(?:[^'\\]|\\.)*'|[^&\s]*)", re.IGNORECASE)


def mask_url(url: str) -> str:
    """``url`` with its password (in the user info or a ``password=`` parameter) shown as ``***``.

    >>> mask_url("postgresql://alice:s3cret@db.example.org:5432/ledger?sslmode=require")
    'postgresql://alice:***@db.example.org:5432/ledger?sslmode=require'
    >>> mask_url("postgresql://db/ledger?user=alice&password=s3cret")
    'postgresql://db/ledger?user=alice&password=***'
    """
    return _PASSWORD_PARAM.sub(r"\g<head>***", _USERINFO.sub(r"\g<head>:***@", url))


def _secrets(url: str) -> list[str]:
    """The passwords written in ``url`` (raw and percent-decoded), to scrub from server messages."""
    from urllib.parse import unquote

    found = [m.group("secret") for m in (_USERINFO.match(url), *_PASSWORD_PARAM.finditer(url)) if m is not None]
    return sorted({v for s in found for v in (s, unquote(s), s.strip("'")) if v}, key=len, reverse=True)


def import_psycopg(missing: str) -> ModuleType:
    """psycopg, imported on first use; LedgerError ``missing`` + the reason when it is absent."""
    try:
        import psycopg
    except ImportError as exc:
        raise LedgerError(missing.format(reason=exc)) from exc
    return psycopg


class PostgresDriver:
    """The connections of the database at ``url`` (a libpq URL, scheme in lower case).

    ``timeout`` (seconds) bounds lock waits (``lock_timeout``) and connecting
    (``connect_timeout``, at least 2 s as libpq requires); any one statement gets 10 s more.
    With ``configure=False`` sessions keep the server's settings for these. ``application`` is
    the ``application_name`` the server shows unless the URL names one; ``max_idle`` how many
    idle connections are kept for reuse."""

    dialect = "postgres"

    def __init__(
        self,
        url: str,
        pg: ModuleType,
        *,
        timeout: float,
        wording: Wording,
        application: str,
        configure: bool = True,
        max_idle: int = MAX_IDLE,
    ) -> None:
        self.url = url
        self.masked = mask_url(url)
        self.where: object = self.masked
        self._secrets = _secrets(url)
        self._pg = pg
        self._wording = wording
        self._application = application
        self._configure = configure
        self._max_idle = max_idle
        self._timeout = timeout
        self._lock_ms = min(max(1, round(timeout * 1000)), _MAX_MS - _STATEMENT_GRACE_MS)
        self._statement_ms = self._lock_ms + _STATEMENT_GRACE_MS
        self._connect_timeout = min(max(2, math.ceil(timeout)), _MAX_MS // 1000)
        self._lock = threading.Lock()
        self._idle: list[psycopg.Connection[Any]] = []
        self._closed = False
        _DRIVERS.add(self)

    # -- connections --------------------------------------------------------------------------------

    def _connect(self) -> psycopg.Connection[Any]:
        pg = self._pg
        try:
            conn: psycopg.Connection[Any] = pg.connect(
                self.url,
                autocommit=True,  # transactions are explicit: BEGIN … COMMIT
                connect_timeout=self._connect_timeout,
                client_encoding="UTF8",
                fallback_application_name=self._application,
            )
        except pg.ProgrammingError as exc:  # libpq could not parse the URL
            raise InvalidParameterError("url", self.masked, ACCEPTED_URL, self.scrub(exc)) from None
        except pg.Error as exc:
            if self._wording.connect is None:
                raise
            raise LedgerError(
                self._wording.say(self._wording.connect, where=self.where, detail=self.scrub(exc))
            ) from exc
        if not self._configure:
            return conn
        try:
            conn.execute(
                "SELECT set_config('lock_timeout', %s, false), set_config('statement_timeout', %s, false), "
                "set_config('idle_in_transaction_session_timeout', %s, false), set_config('TimeZone', 'UTC', false), "
                "CASE WHEN current_setting('synchronous_commit') = 'off' THEN set_config('synchronous_commit', 'on', false) END",
                (f"{self._lock_ms}ms", f"{self._statement_ms}ms", f"{self._statement_ms}ms"),
            )
        except BaseException:
            conn.close()
            raise
        return conn

    def _forget_parent_connections(self) -> None:
        """Run in a child right after fork(): the parent's connections and lock stay the parent's."""
        self._lock = threading.Lock()
        _INHERITED.extend(self._idle)
        self._idle = []

    def _acquire(self) -> tuple[psycopg.Connection[Any], bool]:
        """A connection for this transaction alone, and whether it was idle in the pool: an idle
        one, else a new one (opened outside the lock, so threads connect in parallel)."""
        with self._lock:
            if self._closed:
                raise LedgerError(f"{self._wording.noun} {self.where} is closed")
            if self._idle:
                return self._idle.pop(), True
        return self._connect(), False

    def _begin(self, kind: TransactionKind) -> psycopg.Connection[Any]:
        """A borrowed connection with a transaction begun. A pooled connection the server has
        dropped meanwhile (restart, idle timeout of a proxy) is replaced: nothing was sent yet."""
        while True:
            conn, pooled = self._acquire()
            if kind == "autocommit":
                if not (pooled and conn.broken):
                    return conn
                self._release(conn)
                continue
            try:
                conn.execute(_BEGIN[kind])
                return conn
            except self._pg.OperationalError:
                dropped = pooled and conn.broken
                self._release(conn)
                if not dropped:
                    raise
            except BaseException:
                self._release(conn)
                raise

    def _release(self, conn: psycopg.Connection[Any]) -> None:
        reusable = (
            not conn.closed and not conn.broken and conn.info.transaction_status == self._pg.pq.TransactionStatus.IDLE
        )
        with self._lock:
            if reusable and not self._closed and len(self._idle) < self._max_idle:
                self._idle.append(conn)
                return
        with contextlib.suppress(self._pg.Error):
            conn.close()

    # -- errors and transactions --------------------------------------------------------------------

    def scrub(self, exc: BaseException) -> str:
        """A driver or server message, without the URL's password should it quote it."""
        text = str(exc).strip().replace("\n", " ")
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return text

    @contextlib.contextmanager
    def _errors(self, action: str) -> Iterator[None]:
        """Turn psycopg errors into LedgerError naming the (masked) URL and the action."""
        errors, w = self._pg.errors, self._wording
        try:
            yield
        except self._pg.Error as exc:
            timeout: float = self._timeout
            if isinstance(exc, errors.LockNotAvailable):
                template = w.locked
            elif isinstance(exc, errors.QueryCanceled):
                template, timeout = w.slow, self._statement_ms / 1000
            elif isinstance(exc, (errors.SerializationFailure, errors.DeadlockDetected)):
                template = w.conflict
            else:
                template = w.failed
            raise LedgerError(
                w.say(template, action=action, where=self.where, detail=self.scrub(exc), timeout=timeout)
            ) from exc

    @contextlib.contextmanager
    def transaction(self, action: str, kind: TransactionKind) -> Iterator[Runner]:
        """One transaction on a borrowed connection: COMMIT on success, ROLLBACK on any
        exception (``"autocommit"``: statements commit one by one)."""
        with self._errors(action):
            conn = self._begin(kind)
            try:
                try:
                    yield Runner(conn, "postgres")
                except BaseException:
                    if (
                        not conn.closed
                        and not conn.broken
                        and conn.info.transaction_status != self._pg.pq.TransactionStatus.IDLE
                    ):
                        with contextlib.suppress(self._pg.Error):
                            conn.execute("ROLLBACK")
                    raise
                if kind != "autocommit":
                    self._commit(conn, action, write=kind == "write")
            finally:
                self._release(conn)

    def _commit(self, conn: psycopg.Connection[Any], action: str, *, write: bool) -> None:
        try:
            conn.execute("COMMIT")
        except self._pg.OperationalError as exc:
            if not (write and conn.broken and self._wording.unknown_commit):
                raise
            # The COMMIT may have reached the server before the connection failed.
            raise LedgerError(
                self._wording.say(self._wording.unknown_commit, action=action, where=self.where, detail=self.scrub(exc))
            ) from exc

    def close(self) -> None:
        """Close the idle connections; later transactions raise LedgerError. Safe to call twice.
        Connections in use by other threads close when their transaction ends."""
        with self._lock:
            idle, self._idle = self._idle, []
            self._closed = True
        for conn in idle:
            with contextlib.suppress(Exception):
                conn.close()
