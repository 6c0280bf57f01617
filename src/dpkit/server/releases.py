"""Published synthetic tables: released once by a publisher, then downloaded by those granted
the dataset they came from.

A synthetic table requested with ``publish`` (:mod:`dpkit.server.synthetic`) is stored here
under that name after its publisher's budget paid for it. The rules, each decided before the
debit on the request and the declared metadata alone:

* **Publishers.** Only analysts the curator named (:mod:`dpkit.server.publishers`) may publish;
  anyone else is refused (403) before anything is paid.
* **Names are reserved before the debit.** The name is checked (its shape, then whether it is
  taken, compared case-insensitively: ``Race_1`` and ``race_1`` are one name) and *reserved* — a
  row of ``release_names`` keyed by the lower-cased name, inserted in its own transaction — before
  the debit. Of publishes racing for one name exactly one reserves it; the others are refused
  (400, ``publish``) with nothing spent, and nobody can take a name reserved by a publish still
  running. A publish refused before its debit (a budget that cannot pay, its time run out) frees
  its name again. A publish that **paid and then failed keeps its name for good** (state
  ``failed``): a failed publish cannot be retried under the same name, and nobody else can take
  the name of a paid table either.
* **Quota.** A publisher stores at most ``max_release_bytes`` bytes of releases in total. A new
  release counts with an upper bound of its size (:meth:`TableShape.bound`: the widest row the
  declared metadata allows, times the rows asked for, as CSV and JSON, plus the report) until it
  is stored, and with its stored size after; a failed one with nothing. The check and the
  reservation are one transaction of the database (serialised across processes), so the quota
  holds whatever number of servers share it.
* **Stored in parts.** The rows are stored as parts of at most 64 KiB, each once as CSV (text
  cells escaped against spreadsheet formulas) and once as JSON (:mod:`dpkit.server.release_parts`),
  in the same transaction as the release's row and its chained ``publish`` entry: the action,
  the publisher, the dataset, and in its detail the release's name, ``spend_id``, (ε, δ),
  columns, rows, and the SHA-256 of its stored content and report. ``verify-log`` checks every
  release against its entry (:mod:`dpkit.server.release_audit`).
* **Downloads stream.** A download reads one part per short read transaction and holds at most
  one part in memory (:class:`Download`).

Who sees what (:meth:`dpkit.server.service.Service.releases`): an analyst lists and downloads
only releases of datasets they were granted (another is 404, like an ungranted dataset), and
never sees who published one or what it cost; the curator sees everything. Downloading spends
nothing: a release is post-processing of one paid answer. A release is never changed or deleted
through the service.

A release published before releases were stored in parts (a database of schema version 4) keeps
its rows in ``releases.rows_json``: it is downloaded in one piece, and ``verify-log`` reports it
as not vouched for by the chain (its publication was not chained).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dpkit.errors import AuthError, InvalidParameterError, LimitExceededError
from dpkit.ledger.base import SQLRunner
from dpkit.server.audit import text_digest
from dpkit.server.audit_log import Chain, entry_fields
from dpkit.server.errors import NotFoundError
from dpkit.server.names import check_release_name
from dpkit.server.release_parts import TableShape, build_parts, content_digest
from dpkit.server.store import ServiceStore, now

__all__ = [
    "DEFAULT_MAX_RELEASE_BYTES",
    "Download",
    "Release",
    "Releases",
    "Reservation",
]

_curator_log = logging.getLogger("dpkit.curator")

#: A publisher's bytes of stored releases when no setting is given (``max_release_bytes``).
DEFAULT_MAX_RELEASE_BYTES = 64 * 1024 * 1024
#: Advisory-lock key (PostgreSQL) serialising reservations, so that two processes cannot both
#: find room in one publisher's quota ("dpkr").
RELEASE_LOCK = 0x64706B72


@dataclass(frozen=True)
class Release:
    """A published table's record: its ``name``, the ``dataset`` it was synthesised from, the
    ``analyst`` whose budget paid (``spend_id``: the ledger's entry), the (ε, δ) spent, when,
    its columns and number of rows."""

    name: str
    dataset: str
    analyst: str
    spend_id: int | None
    epsilon: float
    delta: float
    created_at: str
    columns: tuple[str, ...]
    rows: int

    def public(self, *, curator: bool = True) -> dict[str, Any]:
        """What a principal sees: the curator everything but the spend id (that is in the audit
        log); an analyst neither who published it nor what it cost (another tenant's spending)."""
        shown: dict[str, Any] = {"name": self.name, "dataset": self.dataset}
        if curator:
            shown.update(published_by=self.analyst, epsilon=self.epsilon, delta=self.delta)
        return {**shown, "created_at": self.created_at, "columns": list(self.columns), "rows": self.rows}


@dataclass(frozen=True)
class Reservation:
    """A release name held for a publish in progress: the ``name`` as asked, its ``folded``
    key, the ``publisher``, the ``dataset``, the table's ``shape`` and the ``bound`` of its
    stored bytes counted against the publisher's quota."""

    name: str
    folded: str
    publisher: str
    dataset: str
    shape: TableShape
    bound: int


_FIELDS = "name, dataset, analyst, spend_id, epsilon, delta, created_at, columns, row_count"


class Releases:
    """The releases of a service store; publications chained with ``chain``; at most
    ``max_bytes`` stored per publisher. ``metadata`` returns a dataset's declared metadata (for
    releases stored before parts existed)."""

    def __init__(
        self,
        store: ServiceStore,
        *,
        chain: Chain | None = None,
        metadata: Callable[[str], Any] | None = None,
        max_bytes: int = DEFAULT_MAX_RELEASE_BYTES,
    ) -> None:
        self._store = store
        self._chain = chain
        self._metadata = metadata
        self.max_bytes = int(max_bytes)

    def with_quota(self, max_bytes: int | None) -> Releases:
        """These releases with another quota per publisher (None: this one)."""
        if max_bytes is None:
            return self
        return Releases(self._store, chain=self._chain, metadata=self._metadata, max_bytes=max_bytes)

    # -- publishing ---------------------------------------------------------------------------------

    def taken(self, name: str) -> bool:
        """Whether ``name`` (compared case-insensitively) is reserved or published."""
        with self._store.transaction() as tx:
            return bool(tx.run("SELECT 1 FROM release_names WHERE folded = ?", (name.lower(),)))

    def plan(self, publisher: str, name: object, dataset: str, domain: Any, rows: int) -> Reservation:
        """Check a publish before anything is paid: the publisher, the name's shape, that it is
        free and that the bound of the table's size fits the publisher's quota. The reservation
        to make (:meth:`reserve`) — which checks all of it again, atomically."""
        name = check_release_name(name)
        shape = TableShape.of_domain(domain)
        plan = Reservation(name, name.lower(), publisher, dataset, shape, shape.bound(rows))
        with self._store.transaction() as tx:
            self._check(tx, plan)
        return plan

    def reserve(self, plan: Reservation) -> Reservation:
        """Reserve the name of ``plan`` in a transaction of its own (serialised with every other
        reservation): refused as in :meth:`plan` if anything changed meanwhile."""
        with self._store.transaction(write=True) as tx:
            if tx.dialect == "postgres":
                tx.run("SELECT pg_advisory_xact_lock(?)", (RELEASE_LOCK,))
            self._check(tx, plan)
            tx.run(
                "INSERT INTO release_names (folded, name, publisher, dataset, bytes, state, created_at) "
                "VALUES (?, ?, ?, ?, ?, 'reserved', ?)",
                (plan.folded, plan.name, plan.publisher, plan.dataset, plan.bound, now()),
            )
        return plan

    def _check(self, tx: SQLRunner, plan: Reservation) -> None:
        if not tx.run("SELECT 1 FROM publishers WHERE name = ?", (plan.publisher,)):
            raise AuthError(
                f"{plan.publisher!r} may not publish releases: only analysts the curator names as publishers may "
                "(dpkit admin allow-publish NAME); nothing was spent"
            )
        if tx.run("SELECT 1 FROM release_names WHERE folded = ?", (plan.folded,)):
            raise InvalidParameterError(
                "publish",
                plan.name,
                "a release name not yet taken (names are compared ignoring case)",
                "That name is taken: a release is never replaced, and a name reserved or paid for is never given to "
                "another; nothing was spent",
            )
        used = int(tx.run(
            "SELECT COALESCE(SUM(bytes), 0) FROM release_names WHERE publisher = ? AND state <> 'failed'",
            (plan.publisher,),
        )[0][0])  # fmt: skip
        if used + plan.bound > self.max_bytes:
            raise LimitExceededError(
                "publish",
                f"a release of up to {plan.bound:,} bytes beside {used:,} stored",
                self.max_bytes,
                "max_release_bytes",
            )

    def settle(self, plan: Reservation, *, paid: bool) -> None:
        """A publish that stored nothing: unpaid, its name is free again; paid, the name stays
        taken for good (marked failed, counting no bytes). Never raises: it runs while another
        failure is being answered (a reservation it cannot settle stays reserved, and the curator
        is told)."""
        try:
            with self._store.transaction(write=True) as tx:
                if paid:
                    tx.run(
                        "UPDATE release_names SET state = 'failed', bytes = 0 WHERE folded = ? AND state = 'reserved'",
                        (plan.folded,),
                    )
                else:
                    tx.run("DELETE FROM release_names WHERE folded = ? AND state = 'reserved'", (plan.folded,))
        except Exception:
            _curator_log.exception("the reservation of release name %r could not be settled", plan.name)

    def publish(
        self,
        plan: Reservation,
        *,
        spend_id: int | None,
        epsilon: float,
        delta: float,
        columns: Sequence[str],
        rows: list[list[Any]],
        report: dict[str, Any],
    ) -> Release:
        """Store a reserved release — its row, its parts and its chained ``publish`` entry in
        one transaction — and count its stored bytes against the quota."""
        parts = build_parts(plan.shape, columns, rows)
        report_text = json.dumps(report, allow_nan=False)
        stored = sum(len(c.encode("utf-8")) + len(j) for c, j in parts) + len(report_text)
        created = now()
        eps, dlt = repr(float(epsilon)), repr(float(delta))
        detail = {
            "release": plan.name,
            "spend_id": spend_id,
            "epsilon": eps,
            "delta": dlt,
            "columns": list(columns),
            "rows": len(rows),
            "parts": len(parts),
            "content_sha256": content_digest(parts),
            "report_sha256": text_digest(report_text),
        }
        with self._store.transaction(write=True) as tx:
            tx.run(
                f"INSERT INTO releases ({_FIELDS}, rows_json, report) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, '', ?)",
                (plan.name, plan.dataset, plan.publisher, spend_id, eps, dlt, created, json.dumps(list(columns)),
                 len(rows), report_text),
            )  # fmt: skip
            for i, (csv_part, json_part) in enumerate(parts):
                tx.run(
                    "INSERT INTO release_parts (name, part, csv, json) VALUES (?, ?, ?, ?)",
                    (plan.name, i, csv_part, json_part),
                )
            tx.run("UPDATE release_names SET state = 'published', bytes = ? WHERE folded = ?", (stored, plan.folded))
            if self._chain is not None:  # (the chain takes its lock last: held only to COMMIT)
                fields = entry_fields(
                    actor=plan.publisher, action="publish", status=200, outcome="published", dataset=plan.dataset, detail=detail
                )  # fmt: skip
                self._chain(tx, [fields])
        return Release(
            plan.name,
            plan.dataset,
            plan.publisher,
            spend_id,
            float(eps),
            float(dlt),
            created,
            tuple(columns),
            len(rows),
        )

    # -- reading ------------------------------------------------------------------------------------

    def listing(self) -> list[Release]:
        with self._store.transaction() as tx:
            rows = tx.run(f"SELECT {_FIELDS} FROM releases ORDER BY created_at, name")
        return [_release(r) for r in rows]

    def download(self, name: str) -> Download:
        """The release ``name`` (exactly as published), to stream; NotFoundError when there is none."""
        with self._store.transaction() as tx:
            rows = tx.run(f"SELECT {_FIELDS}, report, rows_json <> '' FROM releases WHERE name = ?", (name,))
        if not rows:
            raise NotFoundError(f"there is no release named {name!r}")
        return Download(self, _release(rows[0][:9]), str(rows[0][9]), bool(rows[0][10]))

    def parts(self, name: str, column: str) -> Iterator[bytes]:
        """The ``column`` (``csv`` or ``json``) of each stored part in order, as UTF-8, one part
        per short read transaction (the text read is dropped once encoded: while the stream
        waits for its reader, it holds one part once)."""
        assert column in ("csv", "json")
        part = 0
        while True:
            with self._store.transaction() as tx:
                found = tx.run(f"SELECT {column} FROM release_parts WHERE name = ? AND part = ?", (name, part))
            if not found:
                return
            data = str(found[0][0]).encode("utf-8")
            del found
            yield data
            part += 1

    def legacy_parts(self, info: Release) -> list[tuple[str, str]]:
        """The parts of a release stored in one piece before parts existed (held whole)."""
        with self._store.transaction() as tx:
            rows = json.loads(tx.run("SELECT rows_json FROM releases WHERE name = ?", (info.name,))[0][0])
        metadata = self._metadata(info.dataset) if self._metadata is not None else None
        columns: Mapping[str, Any] = getattr(metadata, "columns", {}) or {}
        categories = {n: getattr(columns.get(n), "categories", None) for n in info.columns}
        known = {n: c for n, c in categories.items() if c is not None}
        return build_parts(TableShape.of(info.columns, known), info.columns, rows)


@dataclass(frozen=True)
class Download:
    """One release to send: its record and report; :meth:`csv` and :meth:`json` yield the body
    in pieces, reading one stored part at a time."""

    releases: Releases
    info: Release
    report: str
    legacy: bool = False

    def _parts(self, column: str) -> Iterator[bytes]:
        if self.legacy:
            i = 0 if column == "csv" else 1
            yield from (p[i].encode("utf-8") for p in self.releases.legacy_parts(self.info))
        else:
            yield from self.releases.parts(self.info.name, column)

    def csv(self) -> Iterator[bytes]:
        """The header, then the rows (text cells escaped against formulas), part by part."""
        yield TableShape.of(self.info.columns, {}).header().encode("utf-8")
        yield from self._parts("csv")

    def json(self, *, curator: bool) -> Iterator[bytes]:
        """``{...public fields, "row_count", "report", "rows": [...]}``, the rows part by part
        (each part as stored: no copy joined to a separator)."""
        head = {**self.info.public(curator=curator), "row_count": self.info.rows}
        del head["rows"]
        yield (json.dumps(head)[:-1] + ',"report":' + self.report + ',"rows":[').encode("utf-8")
        first = True
        for part in self._parts("json"):
            if part:
                if not first:
                    yield b","
                yield part
                first = False
        yield b"]}"

    def whole(self) -> tuple[list[list[Any]], dict[str, Any]]:
        """The rows and the report, read whole (for in-process use; HTTP streams)."""
        rows = json.loads(b"[" + b",".join(p for p in self._parts("json") if p) + b"]")
        return rows, json.loads(self.report)


def _release(row: Any) -> Release:
    name, dataset, analyst, spend_id, eps, delta, created, columns, count = row
    return Release(
        name, dataset, analyst, None if spend_id is None else int(spend_id), float(eps), float(delta), created,
        tuple(json.loads(columns)), int(count),
    )  # fmt: skip
