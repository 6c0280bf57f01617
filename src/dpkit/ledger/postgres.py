"""A ledger in a PostgreSQL database, shared by every process and machine that can reach it.

``PostgresLedger(url)`` opens the ledger in the connection's current schema (the first existing
schema of its ``search_path``: ``public`` unless the URL says otherwise, e.g.
``postgresql://host/db?options=-csearch_path%3Dledger``), creating its tables on first use. The
tables ``dpkit_schema``, ``budgets`` and ``spends`` mirror :mod:`dpkit.ledger.sqlite`; amounts are
exact fractions stored as text ``"numerator/denominator"``. Existing tables are used only if they
are a dpkit ledger of this version: a schema holding other tables of those names, or a newer
ledger, raises :class:`~dpkit.errors.LedgerError` and nothing is created or changed. Creation
takes a transaction-scoped advisory lock, so processes opening a new ledger at once all end up
with the same, complete tables.

Guarantees:

* **Atomic check-and-debit.** :meth:`PostgresLedger.debit` is one transaction: it locks the
  budget's row (``SELECT … FOR UPDATE``), compares the new totals with the budget exactly
  (fractions), inserts the spend, updates the totals and commits. Debits of one budget are
  serialised by the row lock, from threads, processes or machines alike; debits of different
  budgets run in parallel. Other sessions wait for a lock (``timeout``, default 30 s) rather
  than fail.
* **Crash consistency.** A debit is a PostgreSQL transaction: a client killed at any point leaves
  it wholly recorded (spend row and totals) or wholly absent, and a committed debit survives a
  server crash as long as the server runs with ``fsync=on`` (its default). Sessions ask for
  ``synchronous_commit=on`` when the server's default is ``off``, and a client frozen inside a
  transaction loses it after ``idle_in_transaction_session_timeout``, so it cannot hold a budget
  locked for ever.
* **Append-only.** Triggers refuse UPDATE, DELETE or TRUNCATE of spends, DELETE or TRUNCATE of
  budgets and any change of a budget's dataset, analyst or (ε, δ), so a budget cannot grow
  through SQL by mistake either.

A password in the URL is never shown: ``repr()``, :attr:`PostgresLedger.url` and every error
message show ``***`` instead.

>>> from dpkit.accounting import LaplaceEvent
>>> with PostgresLedger("postgresql://dpkit@127.0.0.1:55432/dpkit_test") as ledger:  # doctest: +SKIP
...     _ = ledger.create_budget("census", "alice", epsilon=1.0, exist_ok=True)
...     _ = ledger.debit("census", "alice", LaplaceEvent(noise_multiplier=4), "SELECT COUNT(*) FROM t")

Needs psycopg 3 (``pip install 'dpkit[postgres]'``), imported only when a ledger is opened, and
PostgreSQL 11 or newer.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import threading
import weakref
from collections.abc import Callable, Iterator
from fractions import Fraction
from types import ModuleType
from typing import TYPE_CHECKING, Any

from dpkit._validate import short_repr as _short
from dpkit.accounting.events import DPEvent
from dpkit.accounting.rounding import up
from dpkit.errors import InvalidParameterError, LedgerError
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

if TYPE_CHECKING:
    import psycopg

__all__ = ["PostgresLedger", "SCHEMA_VERSION", "mask_url"]

#: The version of the tables below; bumped (with a migration) whenever they change.
SCHEMA_VERSION = 1
_APPLICATION = "dpkit-ledger"
# First key of the advisory lock taken while a ledger's tables are checked or created ("dpkt",
# as SQLite's application_id); the second key is a hash of the schema's name.
_LOCK_KEY = 0x64706B74
# Idle connections kept per ledger object; threads beyond that connect for each operation.
_MAX_IDLE = 16
# Grace given to any one statement beyond ``timeout`` (which bounds lock waits), so a lock wait
# reports itself as such rather than as a slow statement.
_STATEMENT_GRACE_MS = 10_000
_MAX_MS = 2**31 - 1  # PostgreSQL's limit for timeout settings
_ACCEPTED_URL = "a PostgreSQL URL: postgresql://user[:password]@host[:port]/database[?param=value&...]"

#: TEST ONLY — never set this in production code. When not None, :meth:`PostgresLedger.debit`
#: calls it inside the debit transaction, after the spend row is inserted and before the totals
#: are updated and the transaction commits. The crash-consistency tests set it in a child process
#: to hold a debit half-done and kill the process there.
_after_insert_hook: Callable[[], None] | None = None

# Connections inherited through fork(): the parent still uses them, and closing them in the child
# would end the parent's sessions (libpq says goodbye to the server on close), so the child keeps
# them here, unused and never closed, to be dropped silently when it exits.
_INHERITED: list[Any] = []
_LEDGERS: weakref.WeakSet[PostgresLedger] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for ledger in list(_LEDGERS):
        ledger._forget_parent_connections()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)

# {s} is the ledger's schema, quoted. The trigger function and index live in it too, so a schema
# holds one complete ledger and dropping the schema drops it all.
_SCHEMA = (
    """CREATE TABLE {s}.dpkit_schema (
        id          INTEGER     PRIMARY KEY CHECK (id = 1),
        application TEXT        NOT NULL,
        version     INTEGER     NOT NULL,
        created_at  TIMESTAMPTZ NOT NULL
    )""",
    # Amounts are exact fractions, stored as text "numerator/denominator".
    """CREATE TABLE {s}.budgets (
        dataset       TEXT        NOT NULL,
        analyst       TEXT        NOT NULL,
        epsilon       TEXT        NOT NULL,
        delta         TEXT        NOT NULL,
        spent_epsilon TEXT        NOT NULL,
        spent_delta   TEXT        NOT NULL,
        neighbours    TEXT,
        created_at    TIMESTAMPTZ NOT NULL,
        PRIMARY KEY (dataset, analyst)
    )""",
    """CREATE TABLE {s}.spends (
        id           BIGINT      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        dataset      TEXT        NOT NULL,
        analyst      TEXT        NOT NULL,
        event        TEXT        NOT NULL,
        query_text   TEXT        NOT NULL,
        epsilon_cost TEXT        NOT NULL,
        delta_cost   TEXT        NOT NULL,
        created_at   TIMESTAMPTZ NOT NULL,
        FOREIGN KEY (dataset, analyst) REFERENCES {s}.budgets (dataset, analyst)
    )""",
    "CREATE INDEX spends_by_budget ON {s}.spends (dataset, analyst, id)",
    # One function for every refusal; the message comes from the trigger's argument.
    """CREATE FUNCTION {s}.dpkit_ledger_refuse() RETURNS trigger LANGUAGE plpgsql AS $$
       BEGIN RAISE EXCEPTION USING MESSAGE = TG_ARGV[0]; END $$""",
    """CREATE TRIGGER spends_append_only BEFORE UPDATE OR DELETE ON {s}.spends
       FOR EACH ROW EXECUTE FUNCTION {s}.dpkit_ledger_refuse('dpkit ledger: spends are append-only')""",
    # TRUNCATE bypasses row triggers, so it needs its own.
    """CREATE TRIGGER spends_no_truncate BEFORE TRUNCATE ON {s}.spends
       FOR EACH STATEMENT EXECUTE FUNCTION {s}.dpkit_ledger_refuse('dpkit ledger: spends are append-only')""",
    """CREATE TRIGGER budgets_keep BEFORE DELETE ON {s}.budgets
       FOR EACH ROW EXECUTE FUNCTION {s}.dpkit_ledger_refuse('dpkit ledger: budgets cannot be deleted')""",
    """CREATE TRIGGER budgets_no_truncate BEFORE TRUNCATE ON {s}.budgets
       FOR EACH STATEMENT EXECUTE FUNCTION {s}.dpkit_ledger_refuse('dpkit ledger: budgets cannot be deleted')""",
    """CREATE TRIGGER budgets_fixed BEFORE UPDATE OF dataset, analyst, epsilon, delta ON {s}.budgets
       FOR EACH ROW EXECUTE FUNCTION {s}.dpkit_ledger_refuse('dpkit ledger: a budget''s epsilon and delta cannot change')""",
)
_TABLES = frozenset({"dpkit_schema", "budgets", "spends"})
_TRIGGERS = frozenset({"spends_append_only", "spends_no_truncate", "budgets_keep", "budgets_no_truncate", "budgets_fixed"})

_BUDGET_COLUMNS = "dataset, analyst, epsilon, delta, spent_epsilon, spent_delta, created_at, neighbours"
_SPEND_COLUMNS = "id, dataset, analyst, event, query_text, epsilon_cost, delta_cost, created_at"

# Explicit isolation levels, whatever the server's default: writes lock the rows they read and
# see the latest committed versions once the lock is theirs (READ COMMITTED); reads of several
# statements see one snapshot (REPEATABLE READ).
_BEGIN_WRITE = "BEGIN ISOLATION LEVEL READ COMMITTED"
_BEGIN_READ = "BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY"

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


def _quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _import_psycopg() -> ModuleType:
    try:
        import psycopg
    except ImportError as exc:
        raise LedgerError(
            f"the PostgreSQL ledger needs psycopg 3, which is not installed ({exc}); "
            "install it with: pip install 'dpkit[postgres]'"
        ) from exc
    return psycopg


def _text(name: str, value: object) -> str:
    """A dataset or analyst name PostgreSQL can store: check_name's rules, and valid Unicode."""
    text = check_name(name, value)
    _encodable(name, text)
    return text


def _encodable(name: str, value: str) -> None:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidParameterError(name, _short(value), "valid Unicode text (no lone surrogates)") from None


class _Runner:
    """The debit's open transaction, for ``on_debit`` / ``on_create`` (see dpkit.ledger.base.SQLRunner):
    ``?`` placeholders become psycopg's ``%s``."""

    dialect = "postgres"

    def __init__(self, conn: Any) -> None:
        self._conn = conn

    def run(self, sql: str, params: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
        cur = self._conn.execute(sql.replace("?", "%s"), params)
        return list(cur.fetchall()) if cur.description is not None else []


class PostgresLedger:
    """A persistent budget ledger in a PostgreSQL database (see the module docstring for
    guarantees).

    >>> from dpkit.accounting import LaplaceEvent
    >>> url = "postgresql://dpkit@127.0.0.1:55432/dpkit_test?options=-csearch_path%3Dledger"
    >>> with PostgresLedger(url) as ledger:  # doctest: +SKIP
    ...     _ = ledger.create_budget("census", "alice", epsilon=1.0)
    ...     spend = ledger.debit("census", "alice", LaplaceEvent(noise_multiplier=4), "SELECT COUNT(*) FROM t")
    ...     ledger.get_budget("census", "alice").remaining_epsilon
    0.75

    ``url`` is a libpq URL (``postgresql://`` or ``postgres://``; parameters such as ``sslmode``
    or ``options`` pass through). One object may be shared by threads: each operation borrows a
    connection of its own, so threads debiting different budgets run in parallel on the server
    and those debiting one budget queue on its row lock. It survives ``fork()``: the child opens
    its own connections and never closes the parent's. ``timeout`` (seconds) bounds how long an
    operation waits for a lock held by another session (``lock_timeout``) and for the server to
    accept a connection (``connect_timeout``, at least 2 s as libpq requires); any one statement
    gets 10 s more (``statement_timeout``). Past these, LedgerError.

    Unlike SQLite, PostgreSQL cannot store NUL characters in text: a query text containing one
    raises InvalidParameterError.
    """

    def __init__(self, url: str, *, timeout: float = 30.0) -> None:
        if not isinstance(url, str):
            raise InvalidParameterError("url", _short(url), _ACCEPTED_URL)
        scheme = re.match(r"(?i)(postgres(?:ql)?)://", url)
        if scheme is None or "\x00" in url:
            raise InvalidParameterError("url", mask_url(url), _ACCEPTED_URL)
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not (math.isfinite(timeout) and timeout >= 0):
            raise InvalidParameterError("timeout", timeout, "a finite number of seconds >= 0")
        # libpq recognises the scheme in lower case only.
        self._url = scheme.group(1).lower() + url[scheme.end(1) :]
        self._masked = mask_url(self._url)
        self._secrets = _secrets(self._url)
        self._where = self._masked
        self._timeout = float(timeout)
        lock_ms = min(max(1, round(self._timeout * 1000)), _MAX_MS - _STATEMENT_GRACE_MS)
        self._lock_ms = lock_ms
        self._statement_ms = lock_ms + _STATEMENT_GRACE_MS
        self._connect_timeout = min(max(2, math.ceil(self._timeout)), _MAX_MS // 1000)
        self._pg = _import_psycopg()
        self._lock = threading.Lock()
        self._idle: list[psycopg.Connection[Any]] = []
        self._closed = False
        self._schema = ""
        try:
            self._schema = self._open()
        except BaseException:
            self.close()
            raise
        s = _quote_ident(self._schema)
        self._budgets, self._spends, self._meta = f"{s}.budgets", f"{s}.spends", f"{s}.dpkit_schema"
        self._where = f"{self._masked} (schema {self._schema!r})"
        _LEDGERS.add(self)

    # -- opening --------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        """The ledger's URL, with any password shown as ``***``."""
        return self._masked

    @property
    def schema(self) -> str:
        """The PostgreSQL schema holding the ledger's tables."""
        return self._schema

    def _connect(self) -> psycopg.Connection[Any]:
        pg = self._pg
        try:
            conn: psycopg.Connection[Any] = pg.connect(
                self._url,
                autocommit=True,  # transactions are explicit: BEGIN … COMMIT
                connect_timeout=self._connect_timeout,
                client_encoding="UTF8",
                fallback_application_name=_APPLICATION,
            )
        except pg.ProgrammingError as exc:  # libpq could not parse the URL
            raise InvalidParameterError("url", self._masked, _ACCEPTED_URL, self._scrub(exc)) from None
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

    def _open(self) -> str:
        """Check the ledger's tables in the current schema, creating them if none exist; return
        the schema. Everything happens under an advisory lock in one transaction, so a refused
        schema is left exactly as it was."""
        advice = "refusing to use or change it; pass the URL of another database or schema (e.g. ?options=-csearch_path%3Dmy_ledger)"
        with self._transaction("open the ledger", write=True) as conn:
            schema: str | None = conn.execute("SELECT current_schema()").fetchone()[0]  # type: ignore[index]
            if schema is None:
                path = conn.execute("SELECT current_setting('search_path')").fetchone()[0]  # type: ignore[index]
                raise LedgerError(
                    f"cannot open the ledger in {self._masked}: no schema of the connection's search_path ({path}) exists; "
                    "create the schema first, or name an existing one with ?options=-csearch_path%3DSCHEMA"
                )
            where = f"the schema {schema!r} of {self._masked}"
            conn.execute("SELECT pg_advisory_xact_lock(%s::int4, hashtext(%s))", (_LOCK_KEY, schema))
            present = {
                row[0]
                for row in conn.execute(
                    "SELECT c.relname FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
                    "WHERE n.nspname = %s AND c.relname = ANY(%s)",
                    (schema, sorted(_TABLES)),
                )
            }
            s = _quote_ident(schema)
            if not present:
                for statement in _SCHEMA:
                    conn.execute(statement.format(s=s))
                conn.execute(
                    f"INSERT INTO {s}.dpkit_schema (id, application, version, created_at) VALUES (1, %s, %s, statement_timestamp())",
                    (_APPLICATION, SCHEMA_VERSION),
                )
                return schema
            if "dpkit_schema" not in present:
                raise LedgerError(
                    f"{where} already holds {', '.join(sorted(present))}, not a dpkit ledger (it has no dpkit_schema table); {advice}"
                )
            try:
                rows = conn.execute(f"SELECT application, version FROM {s}.dpkit_schema").fetchall()
            except self._pg.errors.UndefinedColumn:
                rows = []
            if len(rows) != 1 or rows[0][0] != _APPLICATION or present != _TABLES:
                raise LedgerError(f"{where} is not a dpkit ledger (its dpkit_schema table or ledger tables are missing); {advice}")
            version = rows[0][1]
            if version != SCHEMA_VERSION:
                newer = isinstance(version, int) and version > SCHEMA_VERSION
                raise LedgerError(
                    f"{where} has ledger schema version {version!r} but this dpkit reads version {SCHEMA_VERSION}"
                    + ("; upgrade dpkit to use it" if newer else "; it cannot be read by this dpkit")
                )
        return schema

    # -- connection handling ----------------------------------------------------------------------

    def _forget_parent_connections(self) -> None:
        """Run in a child right after fork(): the parent's connections and lock stay the parent's."""
        self._lock = threading.Lock()
        _INHERITED.extend(self._idle)
        self._idle = []

    def _acquire(self) -> tuple[psycopg.Connection[Any], bool]:
        """A connection for this operation alone, and whether it was idle in the pool: an idle
        one, else a new one (opened outside the lock, so threads connect in parallel)."""
        with self._lock:
            if self._closed:
                raise LedgerError(f"the ledger {self._where} is closed")
            if self._idle:
                return self._idle.pop(), True
        return self._connect(), False

    def _begin(self, write: bool) -> psycopg.Connection[Any]:
        """A borrowed connection with a transaction begun. A pooled connection the server has
        dropped meanwhile (restart, idle timeout of a proxy) is replaced: nothing was sent yet."""
        while True:
            conn, pooled = self._acquire()
            try:
                conn.execute(_BEGIN_WRITE if write else _BEGIN_READ)
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
        reusable = not conn.closed and not conn.broken and conn.info.transaction_status == self._pg.pq.TransactionStatus.IDLE
        with self._lock:
            if reusable and not self._closed and len(self._idle) < _MAX_IDLE:
                self._idle.append(conn)
                return
        with contextlib.suppress(self._pg.Error):
            conn.close()

    def _scrub(self, exc: BaseException) -> str:
        """A driver or server message, without the URL's password should it quote it."""
        text = str(exc).strip().replace("\n", " ")
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return text

    @contextlib.contextmanager
    def _db(self, action: str) -> Iterator[None]:
        """Turn psycopg errors into LedgerError naming the (masked) URL and the action."""
        errors = self._pg.errors
        try:
            yield
        except errors.LockNotAvailable as exc:
            raise LedgerError(
                f"could not {action} in {self._where}: another session held the ledger for more than {self._timeout} s "
                f"({self._scrub(exc)})"
            ) from exc
        except errors.QueryCanceled as exc:
            raise LedgerError(
                f"could not {action} in {self._where}: the server did not finish within {self._statement_ms / 1000} s "
                f"({self._scrub(exc)})"
            ) from exc
        except (errors.SerializationFailure, errors.DeadlockDetected) as exc:
            raise LedgerError(
                f"could not {action} in {self._where}: a concurrent transaction conflicted with it and nothing was "
                f"written; try again ({self._scrub(exc)})"
            ) from exc
        except self._pg.Error as exc:
            raise LedgerError(f"could not {action} in {self._where}: {self._scrub(exc)}") from exc

    @contextlib.contextmanager
    def _transaction(self, action: str, *, write: bool) -> Iterator[psycopg.Connection[Any]]:
        """One transaction on a borrowed connection: COMMIT on success, ROLLBACK on any exception."""
        with self._db(action):
            conn = self._begin(write)
            try:
                try:
                    yield conn
                except BaseException:
                    if not conn.closed and not conn.broken and conn.info.transaction_status != self._pg.pq.TransactionStatus.IDLE:
                        with contextlib.suppress(self._pg.Error):
                            conn.execute("ROLLBACK")
                    raise
                try:
                    conn.execute("COMMIT")
                except self._pg.OperationalError as exc:
                    if not (write and conn.broken):
                        raise
                    # The COMMIT may have reached the server before the connection failed.
                    raise LedgerError(
                        f"could not {action} in {self._where}: the connection failed while committing, so whether it "
                        f"was recorded is unknown; check with list_spends() ({self._scrub(exc)})"
                    ) from exc
            finally:
                self._release(conn)

    def close(self) -> None:
        """Close the connections; later calls raise LedgerError. Safe to call twice. Connections
        in use by other threads close when their operation ends."""
        with self._lock:
            idle, self._idle = self._idle, []
            self._closed = True
        for conn in idle:
            with contextlib.suppress(Exception):
                conn.close()

    def __enter__(self) -> PostgresLedger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"PostgresLedger({self._masked!r})"

    # -- decoding -----------------------------------------------------------------------------------

    def _fraction(self, text: object, what: str) -> Fraction:
        return decode_amount(text, self._where, what)

    def _budget(self, row: tuple) -> BudgetRecord:  # type: ignore[type-arg]
        return budget_from_row(row, self._where)

    def _spend(self, row: tuple) -> SpendRecord:  # type: ignore[type-arg]
        return spend_from_row(row, self._where)

    def _missing(self, dataset: str, analyst: str) -> LedgerError:
        return LedgerError(
            f"there is no budget for analyst {analyst!r} on dataset {dataset!r} in {self._where}; "
            "create it first with create_budget(dataset, analyst, epsilon=..., delta=...)"
        )

    # -- the LedgerBackend interface ----------------------------------------------------------------

    def create_budget(
        self, dataset: str, analyst: str, *, epsilon: float, delta: float = 0.0, exist_ok: bool = False, on_create: OnCreate | None = None
    ) -> BudgetRecord:
        """Create the (ε, δ) budget of ``analyst`` on ``dataset`` and return it.

        If it already exists: with ``exist_ok=True`` and the same (ε, δ), the stored budget is
        returned; otherwise LedgerError (a stored budget is never changed or reset). Sessions
        creating the same budget at once agree: one inserts it, the others find it."""
        _text("dataset", dataset)
        _text("analyst", analyst)
        eps, dlt = budget_amounts(epsilon, delta)
        if not isinstance(exist_ok, bool):
            raise InvalidParameterError("exist_ok", exist_ok, "True or False")
        with self._transaction("create the budget", write=True) as conn:
            # ON CONFLICT waits for a concurrent insert of the same budget to commit, so the
            # SELECT below (a new snapshot under READ COMMITTED) then sees it.
            row = conn.execute(
                f"INSERT INTO {self._budgets} (dataset, analyst, epsilon, delta, spent_epsilon, spent_delta, created_at) "
                "VALUES (%s, %s, %s, %s, '0/1', '0/1', statement_timestamp()) "
                f"ON CONFLICT (dataset, analyst) DO NOTHING RETURNING {_BUDGET_COLUMNS}",
                (dataset, analyst, fraction_to_text(eps), fraction_to_text(dlt)),
            ).fetchone()
            if row is not None and on_create is not None:
                on_create(_Runner(conn), GrantFacts(dataset, analyst, eps, dlt, row[6].isoformat()))
            if row is None:
                row = conn.execute(
                    f"SELECT {_BUDGET_COLUMNS} FROM {self._budgets} WHERE dataset = %s AND analyst = %s",
                    (dataset, analyst),
                ).fetchone()
                if row is None:  # pragma: no cover - budgets cannot be deleted
                    raise LedgerError(f"the budget of analyst {analyst!r} on dataset {dataset!r} changed while it was created in {self._where}; try again")
                same = (self._fraction(row[2], "epsilon"), self._fraction(row[3], "delta")) == (eps, dlt)
                if not (exist_ok and same):
                    stored = self._budget(row)
                    raise LedgerError(
                        f"a budget for analyst {analyst!r} on dataset {dataset!r} already exists in {self._where} "
                        f"(epsilon={stored.epsilon!r}, delta={stored.delta!r})"
                        + ("" if same else f", not epsilon={float(epsilon)!r}, delta={float(delta)!r}; a stored budget is never changed")
                        + ("" if exist_ok else "; pass exist_ok=True to reuse it")
                    )
        return self._budget(row)

    def get_budget(self, dataset: str, analyst: str) -> BudgetRecord:
        """The budget of ``analyst`` on ``dataset``; LedgerError if there is none."""
        _text("dataset", dataset)
        _text("analyst", analyst)
        with self._transaction("read the budget", write=False) as conn:
            row = conn.execute(
                f"SELECT {_BUDGET_COLUMNS} FROM {self._budgets} WHERE dataset = %s AND analyst = %s", (dataset, analyst)
            ).fetchone()
        if row is None:
            raise self._missing(dataset, analyst)
        return self._budget(row)

    def list_budgets(self) -> list[BudgetRecord]:
        """Every budget, ordered by dataset then analyst (by code point, as SQLite and Python
        order strings, whatever the database's collation)."""
        with self._transaction("list the budgets", write=False) as conn:
            rows = conn.execute(
                f'SELECT {_BUDGET_COLUMNS} FROM {self._budgets} ORDER BY dataset COLLATE "C", analyst COLLATE "C"'
            ).fetchall()
        return [self._budget(row) for row in rows]

    def list_spends(self, dataset: str, analyst: str) -> list[SpendRecord]:
        """Every spend debited from this budget, oldest first; LedgerError if there is no budget."""
        _text("dataset", dataset)
        _text("analyst", analyst)
        with self._transaction("list the spends", write=False) as conn:
            exists = conn.execute(
                f"SELECT 1 FROM {self._budgets} WHERE dataset = %s AND analyst = %s", (dataset, analyst)
            ).fetchone()
            rows = conn.execute(
                f"SELECT {_SPEND_COLUMNS} FROM {self._spends} WHERE dataset = %s AND analyst = %s ORDER BY id",
                (dataset, analyst),
            ).fetchall()
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
        when both are given. In one transaction the budget's row is locked
        (``SELECT … FOR UPDATE``), the new totals compared exactly with the budget, the spend
        inserted and the totals updated. A debit that would exceed the budget raises
        :class:`~dpkit.errors.BudgetExceededError`. All events of one budget must share one
        neighbour relation (the first debit fixes it). The spend's time is the server's.
        """
        _text("dataset", dataset)
        _text("analyst", analyst)
        if not isinstance(query_text, str):
            raise InvalidParameterError("query_text", _short(query_text), "a string (may be empty)")
        if "\x00" in query_text:
            raise InvalidParameterError(
                "query_text", _short(query_text), "a string without NUL characters", "PostgreSQL cannot store NUL in text"
            )
        _encodable("query_text", query_text)
        eps, dlt, relation = debit_cost(event, epsilon_cost, delta_cost)
        event_json = encode_event(event)
        with self._transaction("debit the budget", write=True) as conn:
            row = conn.execute(
                f"SELECT epsilon, delta, spent_epsilon, spent_delta, neighbours FROM {self._budgets} "
                "WHERE dataset = %s AND analyst = %s FOR UPDATE",
                (dataset, analyst),
            ).fetchone()
            if row is None:
                raise self._missing(dataset, analyst)
            what = f"analyst {analyst!r} on dataset {dataset!r}"
            new_eps, new_dlt = check_debit(row, eps, dlt, relation, event, what, self._where)
            spend_id, created = conn.execute(  # type: ignore[misc]
                f"INSERT INTO {self._spends} (dataset, analyst, event, query_text, epsilon_cost, delta_cost, created_at) "
                "VALUES (%s, %s, %s, %s, %s, %s, statement_timestamp()) RETURNING id, created_at",
                (dataset, analyst, event_json, query_text, fraction_to_text(eps), fraction_to_text(dlt)),
            ).fetchone()
            hook = _after_insert_hook
            if hook is not None:
                hook()
            conn.execute(
                f"UPDATE {self._budgets} SET spent_epsilon = %s, spent_delta = %s, neighbours = COALESCE(neighbours, %s::text) "
                "WHERE dataset = %s AND analyst = %s",
                (fraction_to_text(new_eps), fraction_to_text(new_dlt), relation, dataset, analyst),
            )
            if on_debit is not None:
                on_debit(_Runner(conn), DebitFacts(int(spend_id), dataset, analyst, query_text, eps, dlt, new_eps, new_dlt, created.isoformat()))
        return SpendRecord(
            id=int(spend_id),
            dataset=dataset,
            analyst=analyst,
            event=event,
            query_text=query_text,
            epsilon_cost=up(eps),
            delta_cost=up(dlt),
            created_at=created,
        )

    def verify(self) -> None:
        """Check, in one REPEATABLE READ snapshot, that the ledger's ``dpkit_schema`` row and
        append-only triggers are in place, that every budget's spent totals equal the exact sum
        of its spends and stay within the budget, and that no spend lacks a budget. Raises
        LedgerError describing the first problems found."""
        with self._transaction("verify the ledger", write=False) as conn:
            meta = conn.execute(f"SELECT application, version FROM {self._meta}").fetchall()
            triggers = {
                row[0]
                for row in conn.execute(
                    "SELECT t.tgname FROM pg_catalog.pg_trigger t JOIN pg_catalog.pg_class c ON c.oid = t.tgrelid "
                    "JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
                    "WHERE n.nspname = %s AND c.relname IN ('budgets', 'spends') AND NOT t.tgisinternal AND t.tgenabled <> 'D'",
                    (self._schema,),
                )
            }
            budgets = conn.execute(
                f"SELECT dataset, analyst, epsilon, delta, spent_epsilon, spent_delta FROM {self._budgets}"
            ).fetchall()
            # Equal costs are counted by the server, so Python adds one product per distinct cost.
            spends = conn.execute(
                f"SELECT dataset, analyst, epsilon_cost, delta_cost, count(*) FROM {self._spends} "
                "GROUP BY dataset, analyst, epsilon_cost, delta_cost"
            ).fetchall()
        problems = []
        if meta != [(_APPLICATION, SCHEMA_VERSION)]:
            problems.append(f"its dpkit_schema row is {meta!r}, not [({_APPLICATION!r}, {SCHEMA_VERSION})]")
        if not _TRIGGERS <= triggers:
            problems.append(f"the append-only triggers {', '.join(sorted(_TRIGGERS - triggers))} are missing or disabled")
        problems.extend(total_problems(budgets, spends, self._where))
        if problems:
            raise LedgerError(f"{self._where} is inconsistent: " + "; ".join(problems[:3]))

