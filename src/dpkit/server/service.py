"""The trusted curator, without HTTP: principals and keys, datasets, grants, queries, audit.

:class:`Service` is what ``dpkit serve`` exposes over HTTP and ``dpkit admin`` drives from the
command line. It owns one ledger (the budgets and spends, :mod:`dpkit.ledger`) and the service
tables beside it (:mod:`dpkit.server.store`), both in the database named by one URL, and
composes one component per concern:

* :mod:`dpkit.server.principals` — curators, analysts and their API keys;
* :mod:`dpkit.server.catalog` — registered datasets and their read-only copies;
* :mod:`dpkit.server.grants` — the budgets granted on them;
* :mod:`dpkit.server.queries` — analysts' queries, priced, paid and answered;
* :mod:`dpkit.server.audit_log` — the group-committed, keyed audit chain.

The rules it enforces (a trusted curator answers analysts' queries, and only a budgeted, noised
interface stops reconstruction: Dinur and Nissim, "Revealing Information while Preserving
Privacy", PODS 2003; Dwork and Roth, "The Algorithmic Foundations of Differential Privacy", 2014):

* **Roles.** A *curator* registers datasets, creates analysts and grants budgets; an *analyst*
  queries the datasets they were granted and sees only their own budgets and history. Nobody
  sees rows: the only way data leaves is a noised, paid-for query.
* **Pay before the data is touched.** A query is validated and priced against the declared
  metadata only; refused early if the budget obviously cannot pay; debited atomically in the
  ledger (the arbiter under concurrency); only then aggregated and noised
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

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dpkit import _validate as v
from dpkit._validate import Neighbours
from dpkit._validate import short_repr as _short
from dpkit.analytics.dataset_metadata import DatasetMetadata
from dpkit.analytics.limits import QueryLimits
from dpkit.analytics.metadata import Metadata
from dpkit.analytics.results import QueryCost
from dpkit.errors import InvalidParameterError
from dpkit.ledger.base import BudgetRecord, LedgerBackend, SQLRunner
from dpkit.noise.source import RNG, is_seeded
from dpkit.server.audit import AuditEntry, ChainReport
from dpkit.server.audit_log import AuditLog, entry_fields, load_audit_key
from dpkit.server.catalog import Catalog, DatasetInfo, _Loaded
from dpkit.server.datasets import DatasetCopies, default_dataset_dir
from dpkit.server.errors import NotFoundError
from dpkit.server.grants import DEFAULT_MAX_GRANT_EPSILON, Grants
from dpkit.server.names import check_release_name
from dpkit.server.principals import Principal, Principals, Role
from dpkit.server.publishers import Publishers
from dpkit.server.queries import Queries, QueryRequest, compile_request
from dpkit.server.releases import Download, Release, Releases
from dpkit.server.store import ServiceStore, normalise_url, open_store, sqlite_path
from dpkit.server.synthetic import SynthRequest, answer_synthetic

if TYPE_CHECKING:
    from dpkit.server.pacing import AnswerTimes, Ticket

__all__ = ["Service", "check_service_rng"]


def check_service_rng(rng: object) -> None:
    """The service's randomness must be the OS CSPRNG: None (the default) or a
    :class:`~dpkit.noise.source.SecureSource`. A seeded generator is refused."""
    if not is_seeded(rng):
        return
    raise InvalidParameterError(
        "rng",
        _short(rng),
        "None (the service's secure default, the OS CSPRNG) or a dpkit.noise.source.SecureSource",
        "seeded noise can be replayed and subtracted, so the ledger would charge for privacy that was not given; "
        "use dpkit.Session with an in-memory dp.Budget for reproducible tests and teaching",
    )


class Service:
    """The curator service over one ledger URL (``sqlite:///PATH`` or ``postgresql://...``).

    Every answer's noise comes from the OS CSPRNG. ``rng`` accepts only None or a
    :class:`~dpkit.noise.source.SecureSource`: a seeded generator is refused with
    InvalidParameterError, because seeded noise can be replayed and subtracted and the ledger
    would charge for privacy that was not given (Mironov, "On Significance of the Least
    Significant Bits for Differential Privacy", CCS 2012, shows what predictable noise costs).

    Everything is validated before anything is opened, so a refused setting creates no file.
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
        spark_master: str | None = None,
        spark_conf: Mapping[str, str] | None = None,
    ) -> None:
        check_service_rng(rng)
        from dpkit.analytics.engines.spark import check_spark_settings, spark_session

        # Spark datasets are read by one SparkSession per server process, started when one is first
        # registered or queried there (never before a worker process forks).
        spark_settings = check_spark_settings(spark_master, spark_conf)
        if limits is not None and not isinstance(limits, QueryLimits):
            raise InvalidParameterError("limits", _short(limits), "a dpkit.analytics.limits.QueryLimits or None")
        v.positive(max_grant_epsilon, "max_grant_epsilon")
        #: Datasets are registered only from under this directory (None: anywhere — the
        #: in-process API is the administrator's own; the HTTP service always sets one).
        root = None if data_root is None else Path(os.fspath(data_root)).expanduser().resolve()
        if engine_threads is not None:
            v.positive_int(engine_threads, "engine_threads")
        # DuckDB threads per query in this process: several server processes share the cores,
        # and threads beyond a process's share only contend (``dpkit serve --workers N`` sets
        # cores / N). Registered datasets are kept as read-only DuckDB files shared by every
        # worker (dataset_dir None: derived from the ledger URL; see dpkit.server.datasets).
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
            key = load_audit_key(self._store, url, audit_key)
        except BaseException:
            self._store.close()
            self._ledger.close()
            raise
        # Every chained write (request entries, debits, grants) goes through self._chain, looked
        # up at each call: one seam where a failing audit write can be simulated.
        self._audit_log = AuditLog(self._store, self._ledger, key, chain=self._chain_late)
        self._principals = Principals(self._store)
        self._releases = Releases(
            self._store, chain=self._chain_late, metadata=lambda dataset: self._live_catalog().get(dataset).metadata
        )
        self._publishers = Publishers(self._store, self._principals, chain=self._chain_late)
        self._catalog: Catalog | None = None
        try:
            copies = DatasetCopies(default_dataset_dir(url) if dataset_dir is None else dataset_dir)
        except BaseException:
            self.close()
            raise
        self._catalog = Catalog(
            self._store,
            copies,
            data_root=root,
            engine_threads=engine_threads,
            spark=lambda: spark_session(spark_master, spark_settings, app_name="dpkit-server"),
        )
        self._grants = Grants(
            self._ledger, self._principals, self._catalog, max_epsilon=float(max_grant_epsilon), chain=self._chain_late
        )
        self._queries = Queries(
            self._ledger,
            self._catalog,
            self._grants,
            rng=rng,
            limits=limits if limits is not None else QueryLimits(),
            chain=self._chain_late,
            compile=lambda session, request: self._compile(session, request),
        )

    @property
    def ledger(self) -> LedgerBackend:
        return self._ledger

    @property
    def store(self) -> ServiceStore:
        """The service's own tables (principals, keys, datasets, the audit log, refusal counts)."""
        return self._store

    def close(self) -> None:
        self._store.close()
        self._ledger.close()
        if self._catalog is not None:
            self._catalog.close()

    def __enter__(self) -> Service:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- principals and keys ---------------------------------------------------------------------

    def create_principal(self, name: str, role: Role) -> tuple[Principal, str]:
        """Create a curator or analyst and its first key; the key is returned once and only its
        hash is stored."""
        return self._principals.create(name, role)

    def issue_key(self, name: str) -> str:
        """A new key for an existing principal (older keys stay valid until revoked)."""
        return self._principals.issue_key(name)

    def revoke_key(self, key_id: str) -> list[str]:
        """Revoke the key with id ``key_id`` (16 lower-case hex digits, as listed; never a
        principal's name): ``[key_id]``, or ``[]`` if it was already revoked."""
        return self._principals.revoke_key(key_id)

    def revoke_principal(self, name: str) -> list[str]:
        """Revoke every key of the principal ``name``: the ids revoked now (``[]`` if all
        were already revoked)."""
        return self._principals.revoke_principal(name)

    def authenticate(self, key: object) -> Principal:
        """The principal holding ``key``; :class:`~dpkit.errors.AuthError` for a missing,
        malformed, unknown or revoked key (the message does not say which)."""
        return self._principals.authenticate(key)

    def principals(self) -> list[dict[str, Any]]:
        """Every principal with its keys' ids and states (never the keys)."""
        return self._principals.listing()

    # -- datasets and grants ---------------------------------------------------------------------

    def register_dataset(
        self,
        name: str,
        source: str | os.PathLike[str] | Mapping[str, str | os.PathLike[str]],
        metadata: Metadata | DatasetMetadata | dict[str, Any] | str | os.PathLike[str],
        *,
        neighbours: Neighbours = "add_remove",
        table: str | Mapping[str, str] | None = None,
        engine: str = "duckdb",
        size_class: str = "medium",
        fingerprint: str | None = None,
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
        The checked file is opened once and read from the open file
        (:mod:`dpkit.server.opened_source`): a name swapped for a link out of the root while the
        registration runs is refused, never read.

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
        value or engine message (the details go to the ``dpkit.curator`` log).

        ``engine="spark"``: the source is Parquet data — a file, a directory of Parquet files
        (Hive-partitioned too) or a glob, under the data root by the same rules; without a data
        root also a URI Spark reads (``hdfs://…``, ``s3a://…``) — that the service's SparkSession
        (``spark_master``, ``spark_conf``) reads in place at every query: nothing is copied, and
        the aggregates run on the cluster (only per-group sums and counts reach the server). The
        metadata is checked against the files' schema, and the data check is made by DuckDB on
        this machine (none for a URI). The files are pinned at registration (each one's path,
        size and modification time; with ``fingerprint="sha256"`` also its content's SHA-256,
        hashed again at every query — about a second per GB) and checked before every query
        pays and after Spark has read them (:mod:`dpkit.server.spark_pins`): a dataset whose
        files changed is unavailable to analysts (nothing spent) until they are put back, and a
        query during which they changed fails after its debit — publish new data by
        registering a new dataset. A URI is listed by Spark alone and not pinned.

        ``size_class`` (``small``, ``medium``, ``large``, ``huge``: at most 10⁵ … 10⁸ rows) is a
        public declaration that scales the time budget of every paid answer on the dataset
        (:mod:`dpkit.server.pacing`); the curator's data check says whether the rows fit it.

        **Several tables**: with a :class:`~dpkit.analytics.DatasetMetadata` (JSON with
        ``tables``), ``source`` maps each declared table to its file (``table`` maps a table whose
        file is a ``.duckdb`` database to the table in it). Every file is checked, opened and read
        by the rules above and copied into one shared copy, one table per declared table; the
        data check is made per table (:class:`~dpkit.analytics.check_tables.DatasetCheck`), and
        the size class bounds the rows of each table. Analysts write the declared table names in
        ``FROM`` and ``JOIN`` (:mod:`dpkit.server.catalog_tables`). With ``engine="spark"`` each
        source is Parquet data read in place, pinned and checked as for one table, all tables on
        the service's one SparkSession (:mod:`dpkit.server.spark_tables`)."""
        return self._live_catalog().register(
            name, source, metadata, neighbours=neighbours, table=table, engine=engine, size_class=size_class,
            fingerprint=fingerprint,
        )  # fmt: skip

    def datasets(self) -> list[DatasetInfo]:
        return self._live_catalog().listing()

    def dataset(self, name: object, principal: Principal | None = None) -> DatasetInfo:
        """The dataset ``name``; for an analyst, only one they were granted (else NotFoundError —
        the same answer as for a dataset that does not exist)."""
        info = self._live_catalog().get(name)
        if (
            principal is not None
            and principal.role == "analyst"
            and self._grants.find(principal.name, info.name) is None
        ):
            raise NotFoundError(f"there is no dataset named {name!r} that you may query")
        return info

    def grant(
        self, analyst: str, dataset: str, *, epsilon: float, delta: float = 0.0, actor: str | None = None
    ) -> BudgetRecord:
        """Give ``analyst`` an (ε, δ) budget on ``dataset`` (budgets are never changed later).

        ε above the administrator's maximum (``max_grant_epsilon``) is refused with
        LimitExceededError. The budget and its ``grant`` entry in the audit chain (by ``actor``,
        the curator) are written in one transaction, so every budget in the ledger has exactly
        one chained grant and :meth:`verify_log` can check the two against each other."""
        return self._grants.grant(analyst, dataset, epsilon=epsilon, delta=delta, actor=actor)

    def budgets(self, principal: Principal | None = None) -> list[BudgetRecord]:
        """Every budget (curator, or the command line), or the analyst's own."""
        return self._grants.budgets(principal)

    def spending(self) -> list[dict[str, Any]]:
        """Each budget's spends over time (for the curator's chart): cumulative ε after each."""
        return self._grants.spending()

    def _live_catalog(self) -> Catalog:
        assert self._catalog is not None  # (None only while __init__ fails)
        return self._catalog

    def _load(self, info: DatasetInfo) -> Path:
        """The path of the dataset's shared, read-only copy (see :meth:`Catalog.load`)."""
        return self._live_catalog().load(info)

    @property
    def _data(self) -> dict[str, _Loaded]:
        """This process's read-only connections to dataset copies, by dataset name."""
        return self._live_catalog().data

    # -- queries -----------------------------------------------------------------------------------

    #: Turns a session and a request into the query (looked up at each query: a seam for tests).
    _compile = staticmethod(compile_request)

    def cost(self, principal: Principal, dataset: str, request: QueryRequest) -> QueryCost:
        """What ``request`` would debit — validated exactly like :meth:`query`, without reading
        the data or spending."""
        return self._queries.cost(principal, dataset, request)

    def cost_and_time(
        self, principal: Principal, dataset: str, request: QueryRequest, times: AnswerTimes
    ) -> tuple[QueryCost, float]:
        """:meth:`cost`, and the time budget of the answer under ``times`` (seconds after the
        debit; :mod:`dpkit.server.pacing`)."""
        cost, seconds = self._queries.cost_and_time(principal, dataset, request, times)
        assert seconds is not None
        return cost, seconds

    def query(self, principal: Principal, dataset: str, request: QueryRequest) -> dict[str, Any]:
        """Answer ``request`` for an analyst: validate and price against the declared metadata,
        refuse early if the budget cannot pay, debit atomically, then aggregate and noise; the
        answer with its cost and the remaining budget.

        Raises BudgetExceededError (nothing released, nothing debited, the engine not called),
        and :class:`PaidQueryFailedError` — a QueryFailedError with the fixed message, the
        ``spend_id`` and the ``cost`` — when anything fails after the debit (the debit stands;
        the details go to the ``dpkit.curator`` log)."""
        return self.query_encoded(principal, dataset, request)[0]

    def synthesize(
        self,
        principal: Principal,
        dataset: str,
        request: SynthRequest,
        *,
        ticket: Ticket | None = None,
        max_release_bytes: int | None = None,
    ) -> tuple[dict[str, Any], str]:
        """A differentially private synthetic table of ``dataset`` for an analyst, paid from their
        budget on it like a query (:mod:`dpkit.server.synthetic`): the answer (columns, rows, the
        measurement report, cost and budget) and its JSON. Refusals before the debit: bad
        settings or a domain too large (InvalidParameterError), more rows than the limits
        (LimitExceededError), a budget that cannot pay (BudgetExceededError); after it,
        PaidQueryFailedError. A Spark dataset is counted by the cluster. With
        ``request.publish`` the table is also stored as a release under that name, by a publisher
        (:meth:`allow_publish`), within ``max_release_bytes`` stored per publisher (None: 64 MiB);
        the name is reserved before the debit (:mod:`dpkit.server.releases`). ``ticket``: the
        request's clock when the HTTP service paces it (:mod:`dpkit.server.pacing`)."""
        releases = self._releases.with_quota(max_release_bytes)
        return answer_synthetic(self._queries, principal, dataset, request, releases, ticket)

    def allow_publish(self, name: str, *, actor: str | None = None, revoke: bool = False) -> bool:
        """Name the analyst ``name`` a publisher (``revoke``: no longer one); the change and its
        chained entry by ``actor`` commit together. Whether anything changed."""
        return self._publishers.allow(name, actor=actor, revoke=revoke)

    def publishers(self) -> list[dict[str, Any]]:
        """The analysts who may publish releases."""
        return self._publishers.listing()

    def releases(self, principal: Principal | None = None) -> list[Release]:
        """The published synthetic tables, oldest first: all of them for the curator (or the
        command line), for an analyst those of the datasets they were granted."""
        found = self._releases.listing()
        if principal is None or principal.role != "analyst":
            return found
        granted = {b.dataset for b in self._grants.budgets(principal)}
        return [r for r in found if r.dataset in granted]

    def release_download(self, name: object, principal: Principal | None = None) -> Download:
        """A published table to stream (:class:`~dpkit.server.releases.Download`); NotFoundError
        for a name never published and, for an analyst, for a release of a dataset they were not
        granted (the same answer). Downloading spends nothing: the table was paid for once."""
        name = check_release_name(name)
        download = self._releases.download(name)
        analyst = None if principal is None or principal.role != "analyst" else principal.name
        if analyst is not None and self._grants.find(analyst, download.info.dataset) is None:
            raise NotFoundError(f"there is no release named {name!r}")
        return download

    def release(self, name: str, principal: Principal | None = None) -> tuple[Release, list[list[Any]], dict[str, Any]]:
        """A published table read whole: its record, its rows and its measurement report (see
        :meth:`release_download`, which the HTTP service streams)."""
        download = self.release_download(name, principal)
        return (download.info, *download.whole())

    def query_encoded(
        self, principal: Principal, dataset: str, request: QueryRequest, *, ticket: Ticket | None = None
    ) -> tuple[dict[str, Any], str]:
        """:meth:`query`, with the answer also as the JSON text the HTTP layer sends (encoded
        once, here, where its failure is still a failure after the debit). ``ticket``: the
        request's clock when the HTTP service paces it (:mod:`dpkit.server.pacing`)."""
        return self._queries.answer(principal, dataset, request, ticket)

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
        the debit itself writes, in its own transaction (:class:`~dpkit.server.query_ledger.QueryLedger`),
        and a grant by the entry written with the budget (:meth:`grant`)."""
        return self._audit_log.append(
            entry_fields(actor=actor, action=action, status=status, outcome=outcome, dataset=dataset, detail=detail)
        )

    def _chain(self, tx: SQLRunner, batch: list[dict[str, Any]]) -> list[AuditEntry]:
        """Chain and insert entries in the open transaction ``tx`` (see :meth:`AuditLog.chain`)."""
        return self._audit_log.chain(tx, batch)

    def _chain_late(self, tx: SQLRunner, batch: list[dict[str, Any]]) -> list[AuditEntry]:
        return self._chain(tx, batch)

    def audit_entries(
        self,
        *,
        actor: str | None = None,
        actions: Sequence[str] | None = None,
        after: int = 0,
        limit: int = 1000,
        newest: bool = False,
    ) -> list[AuditEntry]:
        """Entries in order (``actor``: only theirs; ``after``: sequence numbers above it;
        ``newest``: the latest ``limit`` entries, newest first)."""
        return self._audit_log.entries(actor=actor, actions=actions, after=after, limit=limit, newest=newest)

    def verify_log(self, *, head: str | None = None) -> ChainReport:
        """Verify the ledger, the keyed audit chain, and each against the other; raise
        LedgerError saying what was found.

        * the ledger: integrity, and every budget's totals equal the exact sum of its spends;
        * the chain (:func:`dpkit.server.audit.verify_chain`): every entry's keyed hash, in
          order from the first, and with ``head`` that the recorded head is still in it;
        * both ways (:func:`dpkit.server.audit.cross_check`): every spend has exactly one paying
          entry with the same analyst, dataset and exact (ε, δ), and every paying entry a
          spend, vouching for the SHA-256 of the spend's stored event and query text; every
          budget exactly one chained grant with its (ε, δ); every budget's spent totals equal
          the sum of its chained spends;
        * every release (:mod:`dpkit.server.release_audit`): exactly one ``publish`` entry with
          its publisher, dataset, spend, (ε, δ) and the hashes of its stored parts and report."""
        return self._audit_log.verify(head=head)

    def unlogged_spends(self) -> list[int]:
        """Ledger spends with no paying audit entry. A debit and its entry commit in one
        transaction, so this is empty unless someone wrote the ledger outside the service
        (:meth:`verify_log` reports each)."""
        return self._audit_log.unlogged_spends()


def _open_ledger(url: str, timeout: float) -> LedgerBackend:
    if url.startswith("sqlite:///"):
        from dpkit.ledger.sqlite import SQLiteLedger

        return SQLiteLedger(sqlite_path(url), timeout=timeout)
    from dpkit.ledger import postgres

    return postgres.PostgresLedger(url, timeout=timeout)
