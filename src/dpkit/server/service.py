"""The trusted curator, without HTTP: principals and keys, datasets, grants, queries, audit.

:class:`Service` is what ``dpkit serve`` exposes over HTTP and ``dpkit admin`` drives from the
command line. It owns one ledger (the budgets and spends, :mod:`dpkit.ledger`) and the service
tables beside it (:mod:`dpkit.server.store`), both in the database named by one URL.

The rules it enforces (seed 004 ch. 1–2: a trusted curator answers analysts' queries, and only
a budgeted, noised interface stops reconstruction):

* **Roles.** A *curator* registers datasets, creates analysts and grants budgets; an *analyst*
  queries the datasets they were granted and sees only their own budgets and history. Nobody
  sees rows: the only way data leaves is a noised, paid-for query.
* **Pay before the data is touched** (DESIGN core idea 1). A query is validated and priced
  against the declared metadata only; refused early if the budget obviously cannot pay; debited
  atomically in the ledger (the arbiter under concurrency); only then aggregated and noised
  (:class:`dpkit.analytics.Session`). A refusal never reaches the engine. A failure after the
  debit keeps the debit and answers one generic :class:`~dpkit.errors.QueryFailedError`; no
  analyst ever sees an engine message, a file path or a data value (details go to the curator's
  log, the ``dpkit.curator`` logger).
* **Declared schema, read by fixed rules.** A dataset's metadata declares every usable column
  and the privacy unit (``privacy_unit`` or ``row_level``); a CSV is copied with the same fixed,
  non-sniffing read as :class:`~dpkit.analytics.engines.duckdb.DuckDBEngine` (every column as
  text, cast to its declared type when queried), so no row can fail a load or change a type.
  At registration the curator (only) gets the data check (:func:`dpkit.analytics.check.check_data`).
* **Secure noise only.** The service draws every answer's noise from the OS CSPRNG; a seeded
  generator is refused (its noise could be replayed and subtracted, and the ledger would charge
  for privacy that was not given).
* **Everything is logged** in the hash-chained audit log (:mod:`dpkit.server.audit`): the HTTP
  layer appends one entry per request before its answer leaves the service, and the command
  line one per administrative action.

>>> import tempfile, pathlib, pandas as pd
>>> d = pathlib.Path(tempfile.mkdtemp())
>>> pd.DataFrame({"age": [30, 40, 50] * 100}).to_csv(d / "people.csv", index=False)
>>> svc = Service(f"sqlite:///{d / 'ledger.sqlite'}")
>>> info = svc.register_dataset("people", d / "people.csv", {"row_level": True, "columns": {"age": {"type": "numeric", "lower": 0, "upper": 100}}})
>>> info.check.ok  # the curator's data check (never shown to an analyst)
True
>>> alice, key = svc.create_principal("alice", "analyst")
>>> _ = svc.grant("alice", "people", epsilon=1.0)
>>> who = svc.authenticate(key)
>>> answer = svc.query(who, "people", QueryRequest(epsilon=0.5, sql="SELECT COUNT(*) FROM people"))
>>> answer["budget"]["remaining_epsilon"]
0.5
>>> [(e.action, e.outcome) for e in svc.audit_entries()]  # the grant and the debit, each chained in its own transaction
[('grant', 'granted'), ('query', 'paid')]
>>> svc.verify_log().entries
2
>>> svc.close()
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import re
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from fractions import Fraction
from pathlib import Path
from typing import Any, Literal

from dpkit import _validate as v
from dpkit._validate import short_repr as _short
from dpkit.analytics import aggregates as A
from dpkit.analytics.check import DataCheck, check_data
from dpkit.analytics.limits import QueryLimits
from dpkit.analytics.metadata import Metadata
from dpkit.analytics.results import QueryCost
from dpkit.analytics.session import Query, Session
from dpkit.budget import Budget
from dpkit.accounting.rounding import up
from dpkit.errors import (
    AuthError, BudgetExceededError, DPError, InvalidDataError, InvalidParameterError, LedgerError, LimitExceededError, QueryFailedError,
)
from dpkit.ledger.base import BudgetRecord, DebitFacts, GrantFacts, LedgerBackend, OnDebit, SpendRecord, SQLRunner, fraction_to_text
from dpkit.noise.source import RNG, is_seeded
from dpkit.server.datasets import DatasetCopies, SourceReadError, check_declared_columns, default_dataset_dir, resolve_source, source_kind
from dpkit.server.audit import GENESIS, KEY_BYTES, AuditEntry, ChainReport, cross_check, default_key_path, load_key, verify_chain
from dpkit.server.keys import KEY_ID, key_hash, key_id, looks_like_key, new_key
from dpkit.server.store import AUDIT_LOCK, ServiceStore, normalise_url, now, open_store, sqlite_path

__all__ = [
    "Service", "Principal", "DatasetInfo", "QueryRequest", "QuerySpec", "NotFoundError", "DatasetUnavailableError",
    "PaidQueryFailedError", "Role", "check_service_rng",
]

#: Where details that must not reach an analyst go (load failures, failures after a debit).
_curator_log = logging.getLogger("dpkit.curator")

Role = Literal["curator", "analyst"]
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")
_PRINCIPAL = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}")
_TABLE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}(\.[A-Za-z_][A-Za-z0-9_]{0,62})?")
_DATASET_COLUMNS = "name, source, metadata, neighbours, created_at, source_table"
#: The largest ε a curator may grant one analyst on one dataset unless the administrator sets
#: another maximum (``--max-grant-epsilon``): a guard against a typo or a stolen curator key.
DEFAULT_MAX_GRANT_EPSILON = 10.0
#: The audit key file's location when none is passed (``--audit-key``); else beside the ledger.
AUDIT_KEY_ENV = "DPKIT_AUDIT_KEY"
_DETAIL_LIMIT = 4096  # characters of query text kept in the audit log per request
_IDLE_ENGINES = 32  # bound engines kept per dataset and process (about one per concurrent query)
_AGGREGATES: dict[str, type] = {
    "count": A.Count,
    "count_units": A.CountUnits,
    "sum": A.Sum,
    "mean": A.Mean,
    "variance": A.Variance,
    "std": A.Std,
    "quantile": A.Quantile,
}


class NotFoundError(DPError, LookupError):
    """A dataset, principal or key that does not exist (or that the caller may not see)."""


class DatasetUnavailableError(DPError):
    """A registered dataset could not be opened for an analyst's query (its file was moved,
    changed or became unreadable since registration). Nothing was spent. The message is fixed:
    it names no file, engine message or value; the details go to the ``dpkit.curator`` log."""

    MESSAGE = "the dataset could not be opened; nothing was spent (the curator has been told why)"

    def __init__(self) -> None:
        super().__init__(self.MESSAGE)


class PaidQueryFailedError(QueryFailedError):
    """:class:`~dpkit.errors.QueryFailedError` raised by :meth:`Service.query`, with the
    ``cost`` that was debited (for the audit log). Same fixed message."""

    def __init__(self, spend_id: int | None, cost: QueryCost) -> None:
        super().__init__(spend_id)
        self.cost = cost


def check_service_rng(rng: object) -> None:
    """The service's randomness must be the OS CSPRNG: None (the default) or a
    :class:`~dpkit.noise.source.SecureSource`. A seeded generator is refused."""
    if not is_seeded(rng):
        return
    raise InvalidParameterError(
        "rng", _short(rng), "None (the service's secure default, the OS CSPRNG) or a dpkit.noise.source.SecureSource",
        "seeded noise can be replayed and subtracted, so the ledger would charge for privacy that was not given; "
        "use dpkit.Session with an in-memory dp.Budget for reproducible tests and teaching",
    )


@dataclass(frozen=True)
class Principal:
    """An authenticated caller: a curator or an analyst, and the id of the key they used."""

    name: str
    role: Role
    key_id: str | None = None


@dataclass(frozen=True)
class DatasetInfo:
    """A registered dataset: where its rows are, its curator-declared metadata, its neighbours.

    ``source`` is the file it was registered from, relative to the service's data root when
    there is one (an absolute path otherwise); queries read the shared copy made from it at
    registration (:mod:`dpkit.server.datasets`), named by ``name`` and ``created_at``.

    ``check`` is the curator's data check made at registration (how well the rows conform to the
    metadata; :class:`~dpkit.analytics.check.DataCheck`). It holds exact counts and raw values:
    curator only — it is not stored, and :meth:`public` never includes it.
    """

    name: str
    source: str
    metadata: Metadata
    neighbours: str
    created_at: str
    table: str | None = None  # the table inside a DuckDB database file; None for CSV / Parquet
    check: DataCheck | None = field(default=None, compare=False, repr=False)

    def public(self) -> dict[str, Any]:
        """What an analyst may see: the schema the curator declared, never the source or rows."""
        return {"name": self.name, "neighbours": self.neighbours, **self.metadata.to_dict()}


@dataclass(frozen=True)
class QuerySpec:
    """A query without SQL: ``aggregates`` like ``[{"kind": "mean", "column": "age"}]``,
    optional ``where`` (a predicate of the SQL subset), ``group_by``, ``bins``, ``keys`` and
    contribution bounds."""

    aggregates: tuple[dict[str, Any], ...]
    where: str | None = None
    group_by: tuple[str, ...] = ()
    bins: dict[str, tuple[float, ...]] | None = None
    keys: tuple[tuple[Any, ...], ...] | None = None
    max_groups: int | None = None
    max_rows: int | None = None


@dataclass(frozen=True)
class QueryRequest:
    """One query: SQL of the analytics subset *or* a :class:`QuerySpec`, and what to spend."""

    epsilon: float
    delta: float = 0.0
    sql: str | None = None
    spec: QuerySpec | None = None
    noise: str = "laplace"
    confidence: float = 0.95
    key_selection: str = "truncated_geometric"
    split: tuple[float, ...] | None = None

    def text(self) -> str:
        """The query as the ledger and the audit log record it ("" before validation when the
        request has neither SQL nor a spec)."""
        if isinstance(self.sql, str):
            return self.sql
        if self.spec is None:
            return ""
        return json.dumps(_spec_dict(self.spec), sort_keys=True, default=str)


def _spec_dict(spec: QuerySpec) -> dict[str, Any]:
    out: dict[str, Any] = {"aggregates": list(spec.aggregates)}
    for name in ("where", "group_by", "bins", "keys", "max_groups", "max_rows"):
        value = getattr(spec, name)
        if value not in (None, ()):
            out[name] = value
    return out


def _check_name(kind: str, value: object, pattern: re.Pattern[str], accepted: str) -> str:
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise InvalidParameterError(kind, value, accepted)
    return value


def check_dataset_name(value: object) -> str:
    return _check_name("dataset", value, _NAME, "a name of letters, digits and '_' (1–63 characters, not starting with a digit)")


def check_principal_name(value: object) -> str:
    return _check_name("name", value, _PRINCIPAL, "a name of letters, digits and '_.@-' (1–64 characters)")


@dataclass
class _Loaded:
    """One process's read-only connection to a dataset's shared copy, and its idle engines: each
    a cursor of that connection with the declared schema already read and its typed view
    already bound, so a query does not redo either (they never change for a registered dataset).
    An engine serves one query at a time."""

    connection: Any
    lock: threading.Lock = field(default_factory=threading.Lock)
    idle: list[Any] = field(default_factory=list)

    def take(self, table: str) -> Any:
        from dpkit.analytics.engines.duckdb import DuckDBEngine

        with self.lock:
            if self.idle:
                return self.idle.pop()
            cursor = self.connection.cursor()  # cursors are created one at a time
        return DuckDBEngine(None, connection=cursor, table=table)

    def give_back(self, engine: Any) -> None:
        with self.lock:
            if len(self.idle) < _IDLE_ENGINES:
                self.idle.append(engine)


class Service:
    """The curator service over one ledger URL (``sqlite:///PATH`` or ``postgresql://...``).

    Every answer's noise comes from the OS CSPRNG. ``rng`` accepts only None or a
    :class:`~dpkit.noise.source.SecureSource`: a seeded generator is refused with
    InvalidParameterError, because seeded noise can be replayed and subtracted and the ledger
    would charge for privacy that was not given (DESIGN, "Declared schema").
    """

    def __init__(
        self,
        ledger: str | os.PathLike[str] = "sqlite:///.dpkit/ledger.sqlite",
        *,
        timeout: float = 30.0,
        rng: RNG = None,
        data_root: str | os.PathLike[str] | None = None,
        limits: QueryLimits | None = None,
        max_grant_epsilon: float = DEFAULT_MAX_GRANT_EPSILON,
        audit_key: str | os.PathLike[str] | bytes | None = None,
        dataset_dir: str | os.PathLike[str] | None = None,
        engine_threads: int | None = None,
    ) -> None:
        check_service_rng(rng)
        if limits is not None and not isinstance(limits, QueryLimits):
            raise InvalidParameterError("limits", _short(limits), "a dpkit.analytics.limits.QueryLimits or None")
        v.positive(max_grant_epsilon, "max_grant_epsilon")
        #: Datasets are registered only from under this directory (None: anywhere — the
        #: in-process API is the administrator's own; the HTTP service always sets one).
        self._data_root = None if data_root is None else Path(os.fspath(data_root)).expanduser().resolve()
        self._limits = limits if limits is not None else QueryLimits()
        self._max_grant_epsilon = float(max_grant_epsilon)
        if engine_threads is not None:
            v.positive_int(engine_threads, "engine_threads")
        #: DuckDB threads per query in this process: several server processes share the cores,
        #: and threads beyond a process's share only contend (``dpkit serve --workers N`` sets
        #: cores / N).
        self._engine_threads = engine_threads
        self._audit_key_source = audit_key
        #: Where registered datasets are kept as read-only DuckDB files shared by every worker
        #: (None: derived from the ledger URL; see dpkit.server.datasets).
        self._dataset_dir_source = dataset_dir
        url = normalise_url(ledger)
        self.url = url
        self._ledger: LedgerBackend = _open_ledger(url, timeout)
        try:
            shared = getattr(self._ledger, "write_lock", None)
            self._store: ServiceStore = open_store(url, timeout=timeout, lock=shared)
        except BaseException:
            self._ledger.close()
            raise
        try:
            self._key = self._audit_key(url, audit_key)
        except BaseException:
            self._store.close()
            self._ledger.close()
            raise
        self._rng = rng
        self._known: dict[str, DatasetInfo] = {}  # registered datasets read so far (immutable rows)
        self._data: dict[str, _Loaded] = {}  # this process's read-only connections to dataset copies
        self._data_lock = threading.Lock()
        self._data_pid = os.getpid()  # a forked child opens its own connections
        try:
            self._copies = DatasetCopies(default_dataset_dir(url) if dataset_dir is None else dataset_dir)
        except BaseException:
            self.close()
            raise
        self._batcher: _GroupCommit | None = None

    @property
    def ledger(self) -> LedgerBackend:
        return self._ledger

    @property
    def store(self) -> ServiceStore:
        """The service's own tables (principals, keys, datasets, the audit log, refusal counts)."""
        return self._store

    def _audit_key(self, url: str, source: str | os.PathLike[str] | bytes | None) -> bytes:
        """The audit chain's key: given as bytes, or read from a file (created with a fresh key
        only while the log is still empty — a log with entries and no key is refused)."""
        if isinstance(source, (bytes, bytearray)):
            if len(source) != KEY_BYTES:
                raise InvalidParameterError("audit_key", f"<{len(source)} bytes>", f"{KEY_BYTES} random bytes, or the path of a key file")
            return bytes(source)
        if source is None and os.environ.get(AUDIT_KEY_ENV):
            source = os.environ[AUDIT_KEY_ENV]
        if source is None:
            path = default_key_path(url)
        elif isinstance(source, (str, os.PathLike)) and os.fspath(source):
            path = Path(os.fspath(source)).expanduser().absolute()
        else:
            raise InvalidParameterError("audit_key", _short(source), f"{KEY_BYTES} random bytes, the path of a key file, or None")
        with self._store.transaction() as tx:
            empty = not tx.run("SELECT 1 FROM audit_log LIMIT 1")
        return load_key(path, create=empty)

    def close(self) -> None:
        self._store.close()
        self._ledger.close()
        with self._data_lock:
            if self._data_pid == os.getpid():  # a forked child leaves its parent's connections alone
                for loaded in self._data.values():
                    loaded.connection.close()
            self._data.clear()

    def __enter__(self) -> Service:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- principals and keys ---------------------------------------------------------------------

    def create_principal(self, name: str, role: Role) -> tuple[Principal, str]:
        """Create a curator or analyst and its first key; the key is returned once and only its
        hash is stored."""
        check_principal_name(name)
        if role not in ("curator", "analyst"):
            raise InvalidParameterError("role", role, "'curator' or 'analyst'")
        key = new_key()
        with self._store.transaction(write=True) as tx:
            if tx.run("SELECT 1 FROM principals WHERE name = ?", (name,)):
                raise InvalidParameterError("name", name, "a name not already taken", "principals are never renamed or reused")
            tx.run("INSERT INTO principals (name, role, created_at) VALUES (?, ?, ?)", (name, role, now()))
            tx.run("INSERT INTO api_keys (key_id, key_hash, principal, created_at) VALUES (?, ?, ?, ?)", (key_id(key), key_hash(key), name, now()))
        return Principal(name, role, key_id(key)), key

    def issue_key(self, name: str) -> str:
        """A new key for an existing principal (older keys stay valid until revoked)."""
        check_principal_name(name)
        key = new_key()
        with self._store.transaction(write=True) as tx:
            if not tx.run("SELECT 1 FROM principals WHERE name = ?", (name,)):
                raise NotFoundError(f"there is no principal named {name!r}")
            tx.run("INSERT INTO api_keys (key_id, key_hash, principal, created_at) VALUES (?, ?, ?, ?)", (key_id(key), key_hash(key), name, now()))
        return key

    def revoke_key(self, key_id: str) -> list[str]:
        """Revoke the key with id ``key_id`` (16 lower-case hex digits, as listed; never a
        principal's name): ``[key_id]``, or ``[]`` if it was already revoked."""
        if not isinstance(key_id, str) or not KEY_ID.fullmatch(key_id):
            raise InvalidParameterError("key_id", key_id, "a key id: 16 lower-case hex digits (see the key listing)")
        with self._store.transaction(write=True) as tx:
            rows = tx.run("SELECT revoked_at FROM api_keys WHERE key_id = ?", (key_id,))
            if not rows:
                raise NotFoundError(f"there is no key with id {key_id!r}")
            if rows[0][0] is not None:
                return []
            tx.run("UPDATE api_keys SET revoked_at = ? WHERE key_id = ?", (now(), key_id))
        return [key_id]

    def revoke_principal(self, name: str) -> list[str]:
        """Revoke every key of the principal ``name``: the ids revoked now (``[]`` if all
        were already revoked)."""
        check_principal_name(name)
        stamp = now()
        with self._store.transaction(write=True) as tx:
            if not tx.run("SELECT 1 FROM principals WHERE name = ?", (name,)):
                raise NotFoundError(f"there is no principal named {name!r}")
            ids = [r[0] for r in tx.run("SELECT key_id FROM api_keys WHERE principal = ? AND revoked_at IS NULL ORDER BY key_id", (name,))]
            for kid in ids:
                tx.run("UPDATE api_keys SET revoked_at = ? WHERE key_id = ?", (stamp, kid))
        return ids

    def authenticate(self, key: object) -> Principal:
        """The principal holding ``key``; :class:`~dpkit.errors.AuthError` for a missing,
        malformed, unknown or revoked key (the message does not say which)."""
        if not isinstance(key, str) or not looks_like_key(key):
            raise AuthError("a valid API key is required (Authorization: Bearer dpk_...)")
        with self._store.transaction() as tx:
            rows = tx.run(
                "SELECT p.name, p.role, k.key_id FROM api_keys k JOIN principals p ON p.name = k.principal "
                "WHERE k.key_hash = ? AND k.revoked_at IS NULL",
                (key_hash(key),),
            )
        if not rows:
            raise AuthError("a valid API key is required (this key is unknown or revoked)")
        name, role, kid = rows[0]
        return Principal(name, role, kid)

    def principals(self) -> list[dict[str, Any]]:
        """Every principal with its keys' ids and states (never the keys)."""
        with self._store.transaction() as tx:
            people = tx.run("SELECT name, role, created_at FROM principals ORDER BY name")
            keys = tx.run("SELECT principal, key_id, created_at, revoked_at FROM api_keys ORDER BY created_at")
        out = {n: {"name": n, "role": r, "created_at": c, "keys": []} for n, r, c in people}
        for p, kid, c, rev in keys:
            if p in out:  # (a principal created between the two reads shows next time)
                out[p]["keys"].append({"id": kid, "created_at": c, "revoked_at": rev})
        return list(out.values())

    # -- datasets and grants ---------------------------------------------------------------------

    def register_dataset(
        self,
        name: str,
        source: str | os.PathLike[str],
        metadata: Metadata | dict[str, Any] | str | os.PathLike[str],
        *,
        neighbours: str = "add_remove",
        table: str | None = None,
    ) -> DatasetInfo:
        """Register a CSV or Parquet file, or a ``table`` of a DuckDB database file (.duckdb),
        under ``name`` with the curator's metadata: every usable column declared, and the privacy
        unit (``privacy_unit``, or ``row_level: true`` when every row is a different person —
        metadata declaring neither is refused). Analysts write ``FROM <name>`` whatever the source.

        With a data root (``data_root``), ``source`` is a file under it, given relative to it or
        as an absolute path inside it; a path with ``..``, one whose real path (symlinks
        followed) leaves the root, anything but a regular .csv/.parquet/.duckdb file is refused
        with InvalidParameterError naming ``source`` (see
        :func:`dpkit.server.datasets.resolve_source`), and the source is stored and shown
        relative to the root. Without one, any such file is taken (the administrator's own use).

        The source is copied, as queries will read it (a CSV with the fixed, non-sniffing rules
        of :func:`~dpkit.analytics.engines.duckdb.csv_source_sql`; Parquet and DuckDB tables
        with their own schema), into the dataset's shared read-only copy (a DuckDB file in the
        dataset directory that every worker process opens; :mod:`dpkit.server.datasets`); the
        metadata is checked against its schema (a missing declared column is named, the
        source's other columns only counted), and the curator's data check
        (:func:`~dpkit.analytics.check.check_data`) is run. The check is returned in
        :attr:`DatasetInfo.check` — for the curator only: it is neither stored nor shown to
        analysts (None, with the reason in the ``dpkit.curator`` log, if the check itself could
        not be made). A source that cannot be read is refused with a description that names no data
        value or engine message (the details go to the ``dpkit.curator`` log)."""
        check_dataset_name(name)
        located = resolve_source(source, self._data_root)
        if (source_kind(located.path) == "duckdb") != (table is not None):
            raise InvalidParameterError("table", table, "a table name with a .duckdb source, and no table otherwise")
        if table is not None and not _TABLE.fullmatch(table):
            raise InvalidParameterError("table", table, "a table name ('people' or 'schema.people')")
        meta = Session._check_metadata(str(metadata) if isinstance(metadata, os.PathLike) else metadata)
        if meta.privacy_unit is None and not meta.row_level:
            raise InvalidParameterError(
                "metadata.privacy_unit", None,
                "the column naming the person ({\"privacy_unit\": \"person_id\"}), or {\"row_level\": true} when every row is a different person",
                "the service answers every analyst with the metadata's privacy unit, so the metadata must say who is protected",
            )
        v.neighbours(neighbours)
        if self._registered(name):  # before copying the data; the insert below re-checks under its lock
            raise _already_registered(name)
        info = DatasetInfo(name, located.stored, meta, neighbours, now(), table)

        def inspect(conn: Any) -> DataCheck | None:
            # Validates the metadata against the copy's schema: nothing is released, nothing is
            # paid. Missing declared columns are named; the source's other columns only counted.
            check_declared_columns(conn, name, meta)
            Session.from_duckdb(conn.cursor(), name, metadata=meta, neighbours=neighbours, budget=Budget(epsilon=1.0))  # type: ignore[arg-type]
            return self._check(info, conn)

        report = self._copy(info, lambda: self._copies.build(name, info.created_at, located.path, table, inspect))
        info = replace(info, check=report)
        try:
            with self._store.transaction(write=True) as tx:
                if tx.run("SELECT 1 FROM datasets WHERE name = ?", (name,)):
                    raise _already_registered(name)
                tx.run(
                    f"INSERT INTO datasets ({_DATASET_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?)",
                    (name, info.source, json.dumps(meta.to_dict(), sort_keys=True), neighbours, info.created_at, table),
                )
        except BaseException:
            self._copies.discard(name, info.created_at)  # a copy nobody will ever read
            raise
        return info

    def _registered(self, name: str) -> bool:
        with self._store.transaction() as tx:
            return bool(tx.run("SELECT 1 FROM datasets WHERE name = ?", (name,)))

    @staticmethod
    def _check(info: DatasetInfo, conn: Any) -> DataCheck | None:
        """The curator's data check of the loaded copy (exactly what queries will read), or None
        when the check itself fails: it is a report, and the metadata has already been checked
        against the table, so its failure is logged for the curator and does not block the
        registration."""
        try:
            return check_data((conn.cursor(), info.name), info.metadata)
        except Exception:
            _curator_log.exception("the data check of dataset %r (%s) could not be made", info.name, info.source)
            return None

    def datasets(self) -> list[DatasetInfo]:
        with self._store.transaction() as tx:
            rows = tx.run(f"SELECT {_DATASET_COLUMNS} FROM datasets ORDER BY name")
        return [_dataset(r) for r in rows]

    def dataset(self, name: object, principal: Principal | None = None) -> DatasetInfo:
        """The dataset ``name``; for an analyst, only one they were granted (else NotFoundError —
        the same answer as for a dataset that does not exist)."""
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise NotFoundError(f"there is no dataset named {name!r}")
        # A registered dataset is never changed or replaced, so once read it is kept (no store
        # read and no metadata parsing per query); a name not found is always looked up again.
        info = self._known.get(name)
        if info is None:
            with self._store.transaction() as tx:
                rows = tx.run(f"SELECT {_DATASET_COLUMNS} FROM datasets WHERE name = ?", (name,))
            info = _dataset(rows[0]) if rows else None
            if info is not None:
                self._known[name] = info
        if info is None or (principal is not None and principal.role == "analyst" and self._grant(principal.name, name) is None):
            raise NotFoundError(f"there is no dataset named {name!r} that you may query")
        return info

    def _grant(self, analyst: str, dataset: str) -> BudgetRecord | None:
        try:
            return self._ledger.get_budget(dataset, analyst)
        except LedgerError:
            return None

    def grant(self, analyst: str, dataset: str, *, epsilon: float, delta: float = 0.0, actor: str | None = None) -> BudgetRecord:
        """Give ``analyst`` an (ε, δ) budget on ``dataset`` (budgets are never changed later).

        ε above the administrator's maximum (``max_grant_epsilon``) is refused with
        LimitExceededError. The budget and its ``grant`` entry in the audit chain (by ``actor``,
        the curator) are written in one transaction, so every budget in the ledger has exactly
        one chained grant and :meth:`verify_log` can check the two against each other."""
        check_principal_name(analyst)
        if isinstance(epsilon, (int, float)) and not isinstance(epsilon, bool) and math.isfinite(epsilon) and epsilon > self._max_grant_epsilon:
            raise LimitExceededError("epsilon", epsilon, self._max_grant_epsilon, "max_grant_epsilon")
        self.dataset(dataset)
        with self._store.transaction() as tx:
            rows = tx.run("SELECT role FROM principals WHERE name = ?", (analyst,))
        if not rows:
            raise NotFoundError(f"there is no analyst named {analyst!r}")
        if rows[0][0] != "analyst":
            raise InvalidParameterError("analyst", analyst, "an analyst (curators do not query)")
        if self._grant(analyst, dataset) is not None:
            raise InvalidParameterError(
                "analyst", analyst, f"an analyst without a budget on {dataset!r}",
                "a granted budget is never changed or replaced: every answer already released was paid from it",
            )
        def chain_grant(tx: SQLRunner, facts: GrantFacts) -> None:
            self._chain(tx, [self._fields(
                actor=actor, action="grant", status=201, outcome="granted", dataset=facts.dataset,
                detail={"analyst": facts.analyst, "budget_epsilon": fraction_to_text(facts.epsilon), "budget_delta": fraction_to_text(facts.delta)},
            )])

        return self._ledger.create_budget(dataset, analyst, epsilon=epsilon, delta=delta, on_create=chain_grant)

    def budgets(self, principal: Principal | None = None) -> list[BudgetRecord]:
        """Every budget (curator, or the command line), or the analyst's own."""
        records = self._ledger.list_budgets()
        if principal is not None and principal.role == "analyst":
            records = [r for r in records if r.analyst == principal.name]
        return records

    def spending(self) -> list[dict[str, Any]]:
        """Each budget's spends over time (for the curator's chart): cumulative ε after each."""
        out = []
        for b in self._ledger.list_budgets():
            total = 0.0
            points = []
            for s in self._ledger.list_spends(b.dataset, b.analyst):
                total += s.epsilon_cost
                points.append({"at": s.created_at.isoformat(), "epsilon": total})
            out.append({"dataset": b.dataset, "analyst": b.analyst, "budget_epsilon": b.epsilon, "points": points})
        return out

    # -- queries -----------------------------------------------------------------------------------

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
                "source", f"{_describe_source(info)} could not be read ({why}; details in the dpkit.curator log)",
                "a UTF-8 CSV file whose first line names every column once, a Parquet file, or a table of a DuckDB database file",
            ) from None
        except OSError:
            _curator_log.exception("dataset %r: its copy could not be written in %s", info.name, self._copies.directory)
            raise InvalidDataError(
                "source", f"{_describe_source(info)} could not be copied into the service's dataset directory (details in the dpkit.curator log)",
                "a dataset directory the service can write (dataset_dir)",
            ) from None

    def _source_path(self, info: DatasetInfo) -> Path:
        """The file a dataset is re-read from, checked again as at registration (the data root's
        rules: a link may have been changed since)."""
        if self._data_root is None and not Path(info.source).is_absolute():
            raise InvalidParameterError("source", info.source, "an absolute path, or a service with the data root it was registered under")
        return resolve_source(info.source, self._data_root).path

    def _load(self, info: DatasetInfo) -> Path:
        """The path of the dataset's shared, read-only copy (a DuckDB database file holding the
        dataset as table ``info.name``; see :mod:`dpkit.server.datasets`).

        The copy is made at registration. One that is missing (a dataset registered before
        copies were kept, or a deleted file) is re-created from the source, read by the same
        fixed rules (a CSV by :func:`~dpkit.analytics.engines.duckdb.csv_source_sql`: the header's names, every column as text,
        nothing sniffed; Parquet files and DuckDB tables with their own schema), under a file
        lock so that several workers never write it at once.

        Raises InvalidDataError for the curator (see :meth:`_copy`); a source that is no longer
        a file under the data root is InvalidParameterError naming ``source``. Analysts never
        see either: see :meth:`_opened`."""
        return self._copy(info, lambda: self._copies.ensure(info.name, info.created_at, lambda: self._source_path(info), info.table))

    def _opened(self, info: DatasetInfo) -> _Loaded:
        """The dataset's shared copy, opened read-only once per process (any number
        of worker processes read the same file; none holds the rows in its own memory). For
        analysts: a copy that cannot be opened or re-created is one fixed
        DatasetUnavailableError, before any spend (the reason is in the curator's log)."""
        with self._data_lock:
            if self._data_pid != os.getpid():
                # A forked child: the parent's connections are not safe to use (or close) here.
                self._data, self._data_pid = {}, os.getpid()
            loaded = self._data.get(info.name)
            if loaded is None:
                try:
                    connection = self._copies.open(self._load(info), self._engine_threads)
                except InvalidDataError:  # _load has told the curator why
                    raise DatasetUnavailableError() from None
                except DPError as exc:
                    _curator_log.warning("dataset %r: its copy is missing and cannot be re-made: %s", info.name, exc)
                    raise DatasetUnavailableError() from None
                except Exception:
                    _curator_log.exception("dataset %r: its copy could not be opened", info.name)
                    raise DatasetUnavailableError() from None
                loaded = self._data[info.name] = _Loaded(connection)
        return loaded

    @contextlib.contextmanager
    def _session(self, principal: Principal, dataset: str) -> Iterator[tuple[Session, DatasetInfo, _QueryLedger]]:
        """A session for the analyst on a dataset they were granted, over a view of the ledger
        for this one query (its budget read once; its debit chained in the audit log in the
        same transaction), on an engine borrowed from the dataset's pool for the block.
        NotFoundError (404) for a dataset that does not exist or was not granted."""
        if principal.role != "analyst":
            raise AuthError("only analysts run queries")
        info = self.dataset(dataset)
        budget = self._grant(principal.name, info.name)
        if budget is None:
            raise NotFoundError(f"there is no dataset named {dataset!r} that you may query")
        view = _QueryLedger(self, budget, principal)
        loaded = self._opened(info)
        try:
            engine = loaded.take(info.name)
            session = Session(
                None, engine=engine, table=info.name, metadata=info.metadata, neighbours=info.neighbours,  # type: ignore[arg-type]
                ledger=view, dataset=info.name, analyst=principal.name, rng=self._rng, limits=self._limits,
            )
        except (InvalidParameterError, InvalidDataError):
            # The metadata was checked against this table at registration: a mismatch now means
            # the source changed since. The analyst passed nothing here, so nothing is theirs to fix.
            _curator_log.warning("dataset %r no longer matches its metadata", info.name, exc_info=True)
            raise DatasetUnavailableError() from None
        except Exception:
            _curator_log.exception("dataset %r: its copy could not be read", info.name)
            raise DatasetUnavailableError() from None
        try:
            yield session, info, view
        finally:
            loaded.give_back(engine)

    @staticmethod
    def _compile(session: Session, request: QueryRequest) -> tuple[Query, list[A.Aggregate]]:
        from dpkit.analytics.sql import compile_sql, parse_predicate

        if (request.sql is None) == (request.spec is None):
            raise InvalidParameterError("query", None, "exactly one of 'sql' and 'query' (a JSON query spec)")
        if request.sql is not None:
            if not isinstance(request.sql, str) or not request.sql.strip():
                raise InvalidParameterError("sql", request.sql, "a SELECT of the analytics SQL subset")
            return compile_sql(session, request.sql)
        spec = request.spec
        assert spec is not None
        q = session.query()
        if spec.where is not None:
            q = q.where(parse_predicate(spec.where, limits=session.limits))
        if spec.group_by:
            q = q.group_by(*spec.group_by, keys=spec.keys, bins=spec.bins)
        elif spec.keys is not None or spec.bins is not None:
            raise InvalidParameterError("keys", spec.keys if spec.keys is not None else spec.bins, "keys and bins only with group_by")
        if spec.max_groups is not None or spec.max_rows is not None:
            q = q.bound(max_groups=spec.max_groups, max_rows=spec.max_rows)
        aggs: list[A.Aggregate] = []
        for i, item in enumerate(spec.aggregates):
            kind = item.get("kind")
            if kind not in _AGGREGATES:
                raise InvalidParameterError(f"aggregates[{i}].kind", kind, ", ".join(map(repr, _AGGREGATES)))
            extra = set(item) - {"kind", "column", "q", "name"}
            if extra:
                raise InvalidParameterError(f"aggregates[{i}]", sorted(extra)[0], "only the fields kind, column, q and name")
            name = item.get("name")
            if kind in ("count", "count_units"):
                if "column" in item or "q" in item:
                    raise InvalidParameterError(f"aggregates[{i}]", kind, f"{kind} without column or q")
                aggs.append(_AGGREGATES[kind](name))
            elif kind == "quantile":
                aggs.append(A.Quantile(item.get("column"), item.get("q"), name=name))  # type: ignore[arg-type]
            else:
                if "q" in item:
                    raise InvalidParameterError(f"aggregates[{i}].q", item["q"], f"no q for {kind}")
                aggs.append(_AGGREGATES[kind](item.get("column"), name=name))
        return q, aggs

    @staticmethod
    def _options(request: QueryRequest) -> dict[str, Any]:
        out: dict[str, Any] = {"epsilon": request.epsilon, "delta": request.delta, "noise": request.noise, "confidence": request.confidence, "key_selection": request.key_selection}
        if request.split is not None:
            out["split"] = request.split
        return out

    def cost(self, principal: Principal, dataset: str, request: QueryRequest) -> QueryCost:
        """What ``request`` would debit — validated exactly like :meth:`query`, without reading
        the data or spending."""
        with self._session(principal, dataset) as (session, _, _):
            q, aggs = self._compile(session, request)
            return q.cost(aggs, _text=_clip(request.text()), **self._options(request))

    def query(self, principal: Principal, dataset: str, request: QueryRequest) -> dict[str, Any]:
        """Answer ``request`` for an analyst: validate and price against the declared metadata,
        refuse early if the budget cannot pay, debit atomically, then aggregate and noise; the
        answer with its cost and the remaining budget.

        Raises BudgetExceededError (nothing released, nothing debited, the engine not called),
        and :class:`PaidQueryFailedError` — a QueryFailedError with the fixed message, the
        ``spend_id`` and the ``cost`` — when anything fails after the debit (the debit stands;
        the details go to the ``dpkit.curator`` log)."""
        return self.query_encoded(principal, dataset, request)[0]

    def query_encoded(self, principal: Principal, dataset: str, request: QueryRequest) -> tuple[dict[str, Any], str]:
        """:meth:`query`, with the answer also as the JSON text the HTTP layer sends (encoded
        once, here, where its failure is still a failure after the debit)."""
        with self._session(principal, dataset) as (session, info, view):
            return self._answer(principal, session, info, view, request)

    def _answer(self, principal: Principal, session: Session, info: DatasetInfo, view: _QueryLedger, request: QueryRequest) -> tuple[dict[str, Any], str]:
        before = view.budget
        q, aggs = self._compile(session, request)
        options = self._options(request)
        text = _clip(request.text())
        cost = q.cost(aggs, _text=text, **options)
        # An early refusal spares the engine a query that cannot be paid for. The slack keeps it
        # from refusing what the exact ledger would accept (remaining amounts are rounded
        # down); the atomic debit inside Query.aggregate stays the one that decides.
        if cost.epsilon > before.remaining_epsilon * (1 + 1e-9) + 1e-300 or cost.delta > before.remaining_delta * (1 + 1e-9) + 1e-300:
            raise _exceeded(cost, text, before, principal.name, info.name)
        try:
            result = q.aggregate(aggs, _text=text, **options)
        except QueryFailedError as exc:  # paid, then failed: the session logged the details
            raise PaidQueryFailedError(exc.spend_id, cost) from None
        except BudgetExceededError:
            # Refused by the atomic debit (the early check above let it through, or a concurrent
            # query spent first). The ledger's own message names its database: the analyst gets
            # the same refusal as the early one, from the budget as it now stands.
            raise _exceeded(cost, text, self._ledger.get_budget(info.name, principal.name), principal.name, info.name) from None
        # Paid and computed: from here on nothing may fail on data either.
        try:
            after = view.budget  # the totals the debit wrote: no second read
            answer = result.to_dict()
            answer.pop("remaining_epsilon", None)
            answer["dataset"] = info.name
            answer["cost"] = {"epsilon": cost.epsilon, "delta": cost.delta}
            answer["budget"] = budget_dict(after)
            encoded = json.dumps(answer, allow_nan=False)  # what the HTTP layer sends
        except Exception:
            _curator_log.exception("query %r on %r by %r failed after its debit (spend %s)", text[:200], info.name, principal.name, result.spend_id)
            raise PaidQueryFailedError(result.spend_id, cost) from None
        return answer, encoded

    # -- audit -------------------------------------------------------------------------------------

    def audit(
        self,
        *,
        actor: str | None,
        action: str,
        status: int,
        outcome: str,
        dataset: str | None = None,
        detail: dict[str, Any] | None = None,
    ) -> AuditEntry:
        """Append one entry to the keyed chain and return it once it is committed.

        Every text is made storable first (a lone surrogate or NUL from a hostile client
        becomes U+FFFD), so no request's entry can fail another's. Concurrent appends are
        group-committed: the first caller writes every entry waiting at that moment in one
        transaction (one fsync) while the others wait for it; if that batch fails, its entries
        are retried one by one, so one bad entry cannot take the others down with it.

        Entries written here record no amount: an amount debited is recorded only by the entry
        the debit itself writes, in its own transaction (:class:`_QueryLedger`), and a grant by
        the entry written with the budget (:meth:`grant`)."""
        return self._group_commit().append(self._fields(actor=actor, action=action, status=status, outcome=outcome, dataset=dataset, detail=detail))

    @staticmethod
    def _fields(
        *, actor: str | None, action: str, status: int, outcome: str, dataset: str | None = None, detail: dict[str, Any] | None = None,
        epsilon: Fraction | None = None, delta: Fraction | None = None,
    ) -> dict[str, Any]:
        """An entry's fields, every text storable (see :func:`_storable`)."""
        return {
            "at": now(),
            "actor": None if actor is None else _storable(str(actor))[:200],
            "action": _storable(str(action))[:200],
            "dataset": None if dataset is None else _storable(str(dataset))[:200],
            "status": int(status),
            "outcome": _storable(str(outcome))[:1000],
            "epsilon": None if epsilon is None else fraction_to_text(epsilon),
            "delta": None if delta is None else fraction_to_text(delta),
            "detail": _jsonable(detail or {}),
        }

    def _group_commit(self) -> _GroupCommit:
        if self._batcher is None or self._batcher.pid != os.getpid():
            self._batcher = _GroupCommit(self._append_batch)  # (a forked child gets its own)
        return self._batcher

    def _append_batch(self, batch: list[dict[str, Any]]) -> list[AuditEntry]:
        with self._store.transaction(audit=True) as tx:
            return self._chain(tx, batch)

    def _chain(self, tx: SQLRunner, batch: list[dict[str, Any]]) -> list[AuditEntry]:
        """Chain and insert entries in the open transaction ``tx`` — the service's own, or the
        ledger's debit or grant — under the chain's write lock (SQLite: the transaction's
        ``BEGIN IMMEDIATE``; PostgreSQL: the chain's advisory lock, held to COMMIT)."""
        if tx.dialect == "postgres":
            tx.run("SELECT pg_advisory_xact_lock(?)", (AUDIT_LOCK,))
        last = tx.run("SELECT seq, hash FROM audit_log ORDER BY seq DESC LIMIT 1")
        seq, prev = (int(last[0][0]), str(last[0][1])) if last else (0, GENESIS)
        entries = []
        for fields in batch:
            seq += 1
            entry = AuditEntry.new(seq, prev, self._key, **fields)
            tx.run(
                "INSERT INTO audit_log (seq, at, actor, action, dataset, status, outcome, epsilon, delta, detail, prev_hash, hash) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (entry.seq, entry.at, entry.actor, entry.action, entry.dataset, entry.status, entry.outcome, entry.epsilon, entry.delta,
                 json.dumps(entry.detail, sort_keys=True), entry.prev_hash, entry.hash),
            )
            prev = entry.hash
            entries.append(entry)
        return entries

    def audit_entries(
        self, *, actor: str | None = None, actions: Sequence[str] | None = None, after: int = 0, limit: int = 1000, newest: bool = False
    ) -> list[AuditEntry]:
        """Entries in order (``actor``: only theirs; ``after``: sequence numbers above it;
        ``newest``: the latest ``limit`` entries, newest first)."""
        sql = "SELECT seq, at, actor, action, dataset, status, outcome, epsilon, delta, detail, prev_hash, hash FROM audit_log WHERE seq > ?"
        params: list[Any] = [int(after)]
        if actor is not None:
            sql += " AND actor = ?"
            params.append(actor)
        if actions:
            sql += " AND action IN (" + ", ".join("?" for _ in actions) + ")"
            params.extend(actions)
        sql += " ORDER BY seq DESC LIMIT ?" if newest else " ORDER BY seq LIMIT ?"
        params.append(int(limit))
        with self._store.transaction() as tx:
            rows = tx.run(sql, tuple(params))
        return [_entry(r) for r in rows]

    def _snapshot(self) -> tuple[list[AuditEntry], list[tuple[Any, ...]], list[tuple[Any, ...]]]:
        """The whole chain, the budgets and the spends, read together under the chain's lock
        (a debit writes its spend and its entry in one transaction, so they are seen together)."""
        with self._store.transaction(audit=True) as tx:  # (the store takes the chain's lock)
            rows = tx.run("SELECT seq, at, actor, action, dataset, status, outcome, epsilon, delta, detail, prev_hash, hash FROM audit_log ORDER BY seq")
            budgets = tx.run("SELECT dataset, analyst, epsilon, delta, spent_epsilon, spent_delta FROM budgets")
            spends = tx.run("SELECT id, dataset, analyst, epsilon_cost, delta_cost FROM spends ORDER BY id")
        return [_entry(r) for r in rows], budgets, spends

    def verify_log(self, *, head: str | None = None) -> ChainReport:
        """Verify the ledger, the keyed audit chain, and each against the other; raise
        LedgerError saying what was found.

        * the ledger: integrity, and every budget's totals equal the exact sum of its spends;
        * the chain (:func:`dpkit.server.audit.verify_chain`): every entry's keyed hash, in
          order from the first, and with ``head`` that the recorded head is still in it;
        * both ways (:func:`dpkit.server.audit.cross_check`): every spend has exactly one paying
          entry with the same analyst, dataset and exact (ε, δ), and every paying entry a
          spend; every budget exactly one chained grant with its (ε, δ); every budget's spent
          totals equal the sum of its chained spends."""
        self._ledger.verify()
        entries, budgets, spends = self._snapshot()
        report = verify_chain(entries, key=self._key, head=head)
        problems = cross_check(entries, budgets, spends)
        if problems:
            more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
            raise LedgerError("the audit log and the ledger disagree: " + "; ".join(problems[:5]) + more)
        return report

    def unlogged_spends(self) -> list[int]:
        """Ledger spends with no paying audit entry. A debit and its entry commit in one
        transaction, so this is empty unless someone wrote the ledger outside the service
        (:meth:`verify_log` reports each)."""
        entries, _, spends = self._snapshot()
        logged = {e.detail.get("spend_id") for e in entries if e.epsilon is not None}
        return [int(r[0]) for r in spends if int(r[0]) not in logged]


class _QueryLedger:
    """The ledger as one analyst's query sees it: the budget read once when the query arrives,
    and the debit — the only write — chained in the audit log in the ledger's own transaction,
    so the spend and its entry commit together or not at all. After the debit it reports the
    totals the debit wrote, so answering needs no second read.

    Only ``get_budget`` and ``debit`` of this budget are used by a session; the rest forward
    to the ledger (or refuse: a query's view never creates budgets)."""

    def __init__(self, service: Service, budget: BudgetRecord, principal: Principal) -> None:
        self._service = service
        self._ledger = service.ledger
        self.budget = budget
        self._principal = principal

    def _mine(self, dataset: str, analyst: str) -> bool:
        return (dataset, analyst) == (self.budget.dataset, self.budget.analyst)

    def get_budget(self, dataset: str, analyst: str) -> BudgetRecord:
        return self.budget if self._mine(dataset, analyst) else self._ledger.get_budget(dataset, analyst)

    def debit(
        self, dataset: str, analyst: str, event: Any, query_text: str = "", *,
        epsilon_cost: float | Fraction | None = None, delta_cost: float | Fraction | None = None, on_debit: OnDebit | None = None,
    ) -> SpendRecord:
        if not self._mine(dataset, analyst) or on_debit is not None:
            raise LedgerError("a query's ledger view debits only its own budget")
        service, who = self._service, self._principal

        def chain_spend(tx: SQLRunner, facts: DebitFacts) -> None:
            detail = {"spend_id": facts.spend_id, "query": facts.query_text, "key_id": who.key_id}
            service._chain(tx, [service._fields(
                actor=facts.analyst, action="query", status=200, outcome="paid", dataset=facts.dataset, detail=detail,
                epsilon=facts.epsilon, delta=facts.delta,
            )])
            self._after = (facts.spent_epsilon, facts.spent_delta)

        spend = self._ledger.debit(dataset, analyst, event, query_text, epsilon_cost=epsilon_cost, delta_cost=delta_cost, on_debit=chain_spend)
        spent_eps, spent_dlt = self._after
        self.budget = replace(self.budget, spent_epsilon=up(spent_eps), spent_delta=up(spent_dlt))
        return spend

    def create_budget(self, *args: Any, **kwargs: Any) -> BudgetRecord:
        raise LedgerError("a query's ledger view does not create budgets")

    def list_spends(self, dataset: str, analyst: str) -> list[SpendRecord]:
        return self._ledger.list_spends(dataset, analyst)

    def list_budgets(self) -> list[BudgetRecord]:
        return self._ledger.list_budgets()

    def verify(self) -> None:
        self._ledger.verify()

    def close(self) -> None:
        """Nothing to close: the service owns the ledger."""

    def __enter__(self) -> _QueryLedger:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


class _Slot:
    __slots__ = ("fields", "entry", "error", "done")

    def __init__(self, fields: dict[str, Any]) -> None:
        self.fields = fields
        self.entry: AuditEntry | None = None
        self.error: BaseException | None = None
        self.done = False


class _GroupCommit:
    """Leader/follower batching of audit appends within one process: a caller that finds no
    write in progress takes every pending entry and writes them in one transaction; callers
    arriving meanwhile wait and are written by the next leader. Each caller returns only after
    its own entry is committed (or raises the batch's error)."""

    def __init__(self, write: Any) -> None:
        self.pid = os.getpid()
        self._write = write
        self._cond = threading.Condition()
        self._pending: list[_Slot] = []
        self._writing = False

    def append(self, fields: dict[str, Any]) -> AuditEntry:
        slot = _Slot(fields)
        with self._cond:
            self._pending.append(slot)
            while self._writing and not slot.done:
                self._cond.wait()
            if not slot.done:
                batch, self._pending = self._pending, []
                self._writing = True
        if not slot.done:
            try:
                try:
                    entries = self._write([s.fields for s in batch])
                    for s, e in zip(batch, entries):
                        s.entry = e
                except Exception:
                    if len(batch) == 1:
                        raise
                    # One bad entry must not fail the others: write each on its own.
                    for s in batch:
                        try:
                            s.entry = self._write([s.fields])[0]
                        except Exception as exc:
                            s.error = exc
            except BaseException as exc:
                for s in batch:
                    s.error = exc
            finally:
                with self._cond:
                    for s in batch:
                        s.done = True
                    self._writing = False
                    self._cond.notify_all()
        if slot.error is not None:
            raise slot.error
        assert slot.entry is not None
        return slot.entry


def _already_registered(name: str) -> InvalidParameterError:
    return InvalidParameterError("dataset", name, "a name not already registered", "a registered dataset is never replaced (its budgets refer to it)")


def _exceeded(cost: QueryCost, text: str, budget: BudgetRecord, analyst: str, dataset: str) -> BudgetExceededError:
    """The analyst's refusal: the request and the budget, in the same words however it was
    refused (no ledger path, nothing about the data)."""
    return BudgetExceededError(
        f"ε={cost.epsilon!r}, δ={cost.delta!r} for {text[:80]!r}",
        f"ε={budget.remaining_epsilon!r}, δ={budget.remaining_delta!r} of the budget of analyst {analyst!r} on dataset {dataset!r}",
    )


def _describe_source(info: DatasetInfo) -> str:
    """The source in words for the curator: the file's name (and table), no path, no content."""
    kind = "DuckDB table" if info.table is not None else "Parquet file" if source_kind(info.source) == "parquet" else "CSV file"
    return f"{kind} {Path(info.source).name}" + ("" if info.table is None else f" {info.table}")


def _dataset(row: tuple[Any, ...]) -> DatasetInfo:
    n, s, m, nb, c, t = row
    return DatasetInfo(n, s, Metadata.from_dict(json.loads(m)), nb, c, t)


def budget_dict(b: BudgetRecord) -> dict[str, Any]:
    return {
        "dataset": b.dataset,
        "analyst": b.analyst,
        "epsilon": b.epsilon,
        "delta": b.delta,
        "spent_epsilon": b.spent_epsilon,
        "spent_delta": b.spent_delta,
        "remaining_epsilon": b.remaining_epsilon,
        "remaining_delta": b.remaining_delta,
    }


def _clip(text: str) -> str:
    return text if len(text) <= _DETAIL_LIMIT else text[:_DETAIL_LIMIT] + "…"


def _storable(text: str) -> str:
    """``text`` as every database stores it: a lone surrogate (not UTF-8) becomes '?' and NUL
    (refused by PostgreSQL) U+FFFD. What a client sent is still recognisable; it can no longer
    make an entry — or the batch it was written in — fail."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-8", "replace").decode("utf-8")
    return text.replace("\x00", "\ufffd")


def _jsonable(value: Any, depth: int = 0) -> Any:
    """A JSON-safe, storable copy: non-finite floats and unknown objects become strings, texts
    are made storable, and nesting is cut at 16 levels."""
    if depth > 16:
        return "…"
    if isinstance(value, dict):
        return {_storable(str(k)): _jsonable(x, depth + 1) for k, x in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(x, depth + 1) for x in value]
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if isinstance(value, str):
        return _storable(value)
    if value is None or isinstance(value, (int, float, bool)):
        return value
    return _storable(str(value))


def _entry(row: tuple[Any, ...]) -> AuditEntry:
    seq, at, actor, action, dataset, status, outcome, eps, dlt, detail, prev, h = row
    try:
        parsed = json.loads(detail)
    except (TypeError, ValueError):
        parsed = {"unreadable": str(detail)}
    return AuditEntry(int(seq), at, actor, action, dataset, int(status), outcome, eps, dlt, parsed, prev, h)


def _open_ledger(url: str, timeout: float) -> LedgerBackend:
    if url.startswith("sqlite:///"):
        from dpkit.ledger.sqlite import SQLiteLedger

        return SQLiteLedger(sqlite_path(url), timeout=timeout)
    from dpkit.ledger import postgres

    return postgres.PostgresLedger(url, timeout=timeout)
