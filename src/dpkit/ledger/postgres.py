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
PostgreSQL 11 or newer. The connections are the driver's (:mod:`dpkit.ledger._postgres_driver`);
the operations are :class:`~dpkit.ledger.sql.SQLLedger`'s, shared with the SQLite ledger.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from fractions import Fraction
from typing import Any

from dpkit._validate import short_repr as _short
from dpkit.errors import InvalidParameterError, LedgerError
from dpkit.ledger._driver import Runner, Wording, check_timeout
from dpkit.ledger._postgres_driver import ACCEPTED_URL, PostgresDriver, import_psycopg, mask_url
from dpkit.ledger.base import check_name, fraction_to_text
from dpkit.ledger.sql import BUDGET_COLUMNS, SQLLedger

__all__ = ["PostgresLedger", "SCHEMA_VERSION"]

#: The version of the tables below; bumped (with a migration) whenever they change.
SCHEMA_VERSION = 1
_APPLICATION = "dpkit-ledger"
# First key of the advisory lock taken while a ledger's tables are checked or created ("dpkt",
# as SQLite's application_id); the second key is a hash of the schema's name.
_LOCK_KEY = 0x64706B74

#: TEST ONLY — never set this in production code. When not None, :meth:`PostgresLedger.debit`
#: calls it inside the debit transaction, after the spend row is inserted and before the totals
#: are updated and the transaction commits. The crash-consistency tests set it in a child process
#: to hold a debit half-done and kill the process there.
_after_insert_hook: Callable[[], None] | None = None

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
_TRIGGERS = frozenset(
    {"spends_append_only", "spends_no_truncate", "budgets_keep", "budgets_no_truncate", "budgets_fixed"}
)
_WORDING = Wording(
    noun="the ledger",
    locked="could not {action} in {where}: another session held the ledger for more than {timeout} s ({detail})",
    slow="could not {action} in {where}: the server did not finish within {timeout} s ({detail})",
    conflict="could not {action} in {where}: a concurrent transaction conflicted with it and nothing was written; try again ({detail})",
    unknown_commit=(
        "could not {action} in {where}: the connection failed while committing, so whether it was recorded is unknown; "
        "check with list_spends() ({detail})"
    ),
)
_MISSING_PSYCOPG = "the PostgreSQL ledger needs psycopg 3, which is not installed ({reason}); install it with: pip install 'dpkit[postgres]'"


def _quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _encodable(name: str, value: str) -> None:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidParameterError(name, _short(value), "valid Unicode text (no lone surrogates)") from None


class PostgresLedger(SQLLedger):
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

    # Code-point order, as SQLite and Python order strings, whatever the database's collation.
    _ORDER = 'dataset COLLATE "C", analyst COLLATE "C"'

    def __init__(self, url: str, *, timeout: float = 30.0) -> None:
        if not isinstance(url, str):
            raise InvalidParameterError("url", _short(url), ACCEPTED_URL)
        scheme = re.match(r"(?i)(postgres(?:ql)?)://", url)
        if scheme is None or "\x00" in url:
            raise InvalidParameterError("url", mask_url(url), ACCEPTED_URL)
        self._timeout = check_timeout(timeout)
        # libpq recognises the scheme in lower case only.
        url = scheme.group(1).lower() + url[scheme.end(1) :]
        self._masked = mask_url(url)
        self._where: object = self._masked
        self._schema = ""
        self._pg = import_psycopg(_MISSING_PSYCOPG)
        self._driver = PostgresDriver(url, self._pg, timeout=self._timeout, wording=_WORDING, application=_APPLICATION)
        try:
            self._schema = self._open()
        except BaseException:
            self.close()
            raise
        s = _quote_ident(self._schema)
        self._budgets, self._spends, self._meta = f"{s}.budgets", f"{s}.spends", f"{s}.dpkit_schema"
        self._where = self._driver.where = f"{self._masked} (schema {self._schema!r})"

    # -- opening --------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        """The ledger's URL, with any password shown as ``***``."""
        return self._masked

    @property
    def schema(self) -> str:
        """The PostgreSQL schema holding the ledger's tables."""
        return self._schema

    def _open(self) -> str:
        """Check the ledger's tables in the current schema, creating them if none exist; return
        the schema. Everything happens under an advisory lock in one transaction, so a refused
        schema is left exactly as it was."""
        advice = "refusing to use or change it; pass the URL of another database or schema (e.g. ?options=-csearch_path%3Dmy_ledger)"
        with self._transaction("open the ledger", write=True) as tx:
            schema: str | None = tx.run("SELECT current_schema()")[0][0]
            if schema is None:
                path = tx.run("SELECT current_setting('search_path')")[0][0]
                raise LedgerError(
                    f"cannot open the ledger in {self._masked}: no schema of the connection's search_path ({path}) exists; "
                    "create the schema first, or name an existing one with ?options=-csearch_path%3DSCHEMA"
                )
            where = f"the schema {schema!r} of {self._masked}"
            tx.run("SELECT pg_advisory_xact_lock(CAST(? AS int4), hashtext(?))", (_LOCK_KEY, schema))
            present = {
                row[0]
                for row in tx.run(
                    "SELECT c.relname FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
                    "WHERE n.nspname = ? AND c.relname = ANY(?)",
                    (schema, sorted(_TABLES)),
                )
            }
            s = _quote_ident(schema)
            if not present:
                for statement in _SCHEMA:
                    tx.run(statement.format(s=s))
                tx.run(
                    f"INSERT INTO {s}.dpkit_schema (id, application, version, created_at) VALUES (1, ?, ?, statement_timestamp())",
                    (_APPLICATION, SCHEMA_VERSION),
                )
                return schema
            if "dpkit_schema" not in present:
                raise LedgerError(
                    f"{where} already holds {', '.join(sorted(present))}, not a dpkit ledger (it has no dpkit_schema table); {advice}"
                )
            try:
                rows = tx.run(f"SELECT application, version FROM {s}.dpkit_schema")
            except self._pg.errors.UndefinedColumn:
                rows = []
            if len(rows) != 1 or rows[0][0] != _APPLICATION or present != _TABLES:
                raise LedgerError(
                    f"{where} is not a dpkit ledger (its dpkit_schema table or ledger tables are missing); {advice}"
                )
            version = rows[0][1]
            if version != SCHEMA_VERSION:
                newer = isinstance(version, int) and version > SCHEMA_VERSION
                raise LedgerError(
                    f"{where} has ledger schema version {version!r} but this dpkit reads version {SCHEMA_VERSION}"
                    + ("; upgrade dpkit to use it" if newer else "; it cannot be read by this dpkit")
                )
        return schema

    # -- connections --------------------------------------------------------------------------------

    @property
    def _idle(self) -> list[Any]:
        """The idle pooled connections (white-box: the fork-safety test checks the parent's)."""
        return self._driver._idle

    def __enter__(self) -> PostgresLedger:
        return self

    def __repr__(self) -> str:
        return f"PostgresLedger({self._masked!r})"

    # -- the steps of SQLLedger that are PostgreSQL's -------------------------------------------------

    def _name(self, name: str, value: object) -> str:
        """A dataset or analyst name PostgreSQL can store: check_name's rules, and valid Unicode."""
        text = check_name(name, value)
        _encodable(name, text)
        return text

    def _check_query_text(self, query_text: str) -> None:
        if "\x00" in query_text:
            raise InvalidParameterError(
                "query_text",
                _short(query_text),
                "a string without NUL characters",
                "PostgreSQL cannot store NUL in text",
            )
        _encodable("query_text", query_text)

    def _claim_budget(
        self, tx: Runner, dataset: str, analyst: str, eps: Fraction, dlt: Fraction
    ) -> tuple[tuple[Any, ...], bool]:
        # ON CONFLICT waits for a concurrent insert of the same budget to commit, so the SELECT
        # below (a new snapshot under READ COMMITTED) then sees it.
        row = tx.one(
            f"INSERT INTO {self._budgets} (dataset, analyst, epsilon, delta, spent_epsilon, spent_delta, created_at) "
            "VALUES (?, ?, ?, ?, '0/1', '0/1', statement_timestamp()) "
            f"ON CONFLICT (dataset, analyst) DO NOTHING RETURNING {BUDGET_COLUMNS}",
            (dataset, analyst, fraction_to_text(eps), fraction_to_text(dlt)),
        )
        if row is not None:
            return row, True
        row = tx.one(
            f"SELECT {BUDGET_COLUMNS} FROM {self._budgets} WHERE dataset = ? AND analyst = ?", (dataset, analyst)
        )
        if row is None:  # pragma: no cover - budgets cannot be deleted
            raise LedgerError(
                f"the budget of analyst {analyst!r} on dataset {dataset!r} changed while it was created in {self._where}; try again"
            )
        return row, False

    def _lock_budget(self, tx: Runner, dataset: str, analyst: str) -> tuple[Any, ...] | None:
        # The row lock serialises debits of one budget, from any session; others run in parallel.
        return tx.one(
            f"SELECT epsilon, delta, spent_epsilon, spent_delta, neighbours FROM {self._budgets} "
            "WHERE dataset = ? AND analyst = ? FOR UPDATE",
            (dataset, analyst),
        )

    def _insert_spend(self, tx: Runner, values: tuple[Any, ...], stamp: str | None) -> tuple[int, object]:
        # The spend's time is the server's.
        spend_id, created = tx.run(
            f"INSERT INTO {self._spends} (dataset, analyst, event, query_text, epsilon_cost, delta_cost, created_at) "
            "VALUES (?, ?, ?, ?, ?, ?, statement_timestamp()) RETURNING id, created_at",
            values,
        )[0]
        return int(spend_id), created

    def _after_insert(self) -> None:
        hook = _after_insert_hook
        if hook is not None:
            hook()

    def _read_integrity(self, tx: Runner) -> Any:
        meta = tx.run(f"SELECT application, version FROM {self._meta}")
        triggers = {
            row[0]
            for row in tx.run(
                "SELECT t.tgname FROM pg_catalog.pg_trigger t JOIN pg_catalog.pg_class c ON c.oid = t.tgrelid "
                "JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
                "WHERE n.nspname = ? AND c.relname IN ('budgets', 'spends') AND NOT t.tgisinternal AND t.tgenabled <> 'D'",
                (self._schema,),
            )
        }
        return meta, triggers

    def _integrity_problems(self, found: Any) -> list[str]:
        # The ledger's dpkit_schema row and its append-only triggers must be in place.
        meta, triggers = found
        problems = []
        if meta != [(_APPLICATION, SCHEMA_VERSION)]:
            problems.append(f"its dpkit_schema row is {meta!r}, not [({_APPLICATION!r}, {SCHEMA_VERSION})]")
        if not triggers >= _TRIGGERS:
            problems.append(
                f"the append-only triggers {', '.join(sorted(_TRIGGERS - triggers))} are missing or disabled"
            )
        return problems
