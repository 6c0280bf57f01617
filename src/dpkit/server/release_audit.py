"""``verify-log`` for releases: every stored release against the ``publish`` entry chained with it.

A release's row, its parts and its ``publish`` entry are written in one transaction
(:meth:`dpkit.server.releases.Releases.publish`); the entry records the publisher (its actor),
the dataset, and in its detail the release's name, ``spend_id``, (ε, δ), columns, number of
rows, and the SHA-256 of its stored parts (:func:`~dpkit.server.release_parts.content_digest`)
and of its stored report. Someone who can write the database but does not hold the chain's key
cannot change a release without :func:`release_problems` finding it: rows replaced, a cost
rewritten, a release deleted and inserted again under another publisher, a release with no
entry, or an entry whose release is gone.

The release rows (small) are read with the chain, under its lock, so that every release
committed is seen with its entry; the parts are hashed afterwards, one release at a time in
short read transactions, so the chain is not held while a large release is read (a release
is never changed by the service, so reading it later reads the same bytes).
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Iterable, Iterator
from typing import Any

from dpkit.ledger.base import SQLRunner
from dpkit.server.audit import AuditEntry, text_digest
from dpkit.server.release_parts import content_digest
from dpkit.server.store import ServiceStore

__all__ = ["read_releases", "release_problems"]

_PAGE = 16  # parts per read transaction while hashing


def read_releases(tx: SQLRunner) -> list[tuple[Any, ...]]:
    """Every release's row as verification reads it: (name, dataset, publisher, spend id, ε, δ,
    columns, rows, report, stored in one piece before parts existed)."""
    return tx.run(
        "SELECT name, dataset, analyst, spend_id, epsilon, delta, columns, row_count, report, rows_json <> '' "
        "FROM releases ORDER BY name"
    )


def _stored_parts(store: ServiceStore, name: str) -> Iterator[tuple[str, str]]:
    start = 0
    while True:
        with store.transaction() as tx:
            page = tx.run(
                "SELECT csv, json FROM release_parts WHERE name = ? AND part >= ? ORDER BY part LIMIT ?",
                (name, start, _PAGE),
            )
        yield from ((str(c), str(j)) for c, j in page)
        if len(page) < _PAGE:
            return
        start += _PAGE


def _same_number(chained: object, stored: object) -> bool:
    try:
        return float(str(chained)) == float(str(stored))
    except ValueError:
        return False


def release_problems(
    entries: Iterable[AuditEntry],
    releases: Iterable[tuple[Any, ...]],
    spends: Iterable[tuple[Any, ...]],
    store: ServiceStore,
) -> list[str]:
    """What the stored releases and the chain disagree on, in words (empty when they agree).
    ``spends``: the ledger's rows (id, dataset, analyst, …), whose spend each release names."""
    problems: list[str] = []
    chained: dict[str, AuditEntry] = {}
    for e in entries:
        if e.action != "publish" or e.status >= 400:
            continue
        name = e.detail.get("release")
        if not isinstance(name, str):
            problems.append(f"audit entry {e.seq} records a publication but names no release")
        elif name in chained:
            problems.append(
                f"audit entries {chained[name].seq} and {e.seq} both record the publication of release {name!r}"
            )
        else:
            chained[name] = e
    paid = {int(s[0]): (s[1], s[2]) for s in spends}
    for name, dataset, publisher, spend_id, eps, dlt, columns, count, report, legacy in releases:
        what = f"release {name!r} (dataset {dataset!r}, published by {publisher!r})"
        entry = chained.pop(name, None)
        if entry is None:
            why = "it was stored before publications were chained" if legacy else "it was not published by the service"
            problems.append(f"{what} has no publish entry in the audit log ({why}): its content cannot be vouched for")
            continue
        d = entry.detail
        differ = [
            label
            for label, same in (
                ("publisher", entry.actor == publisher),
                ("dataset", entry.dataset == dataset),
                ("spend", d.get("spend_id") == (None if spend_id is None else int(spend_id))),
                ("ε", _same_number(d.get("epsilon"), eps)),
                ("δ", _same_number(d.get("delta"), dlt)),
                ("columns", d.get("columns") == json.loads(columns)),
                ("number of rows", d.get("rows") == int(count)),
                ("report", hmac.compare_digest(str(d.get("report_sha256")), text_digest(str(report)))),
            )
            if not same
        ]
        if not legacy:
            digest = content_digest(_stored_parts(store, name))
            if not hmac.compare_digest(str(d.get("content_sha256")), digest):
                differ.append("rows")
        else:
            differ.append("rows (stored in one piece, not in the parts its entry vouches for)")
        if differ:
            problems.append(
                f"{what} differs from its publish entry {entry.seq} in its {', '.join(differ)} "
                "(changed in the database after it was published)"
            )
        if spend_id is not None and paid.get(int(spend_id)) != (dataset, publisher):
            problems.append(f"{what} names spend {spend_id}, which is not a spend of its publisher on its dataset")
    for name, entry in sorted(chained.items(), key=lambda kv: kv[1].seq):
        problems.append(
            f"audit entry {entry.seq} records the publication of release {name!r} by {entry.actor!r}, which is not in "
            "the database"
        )
    return problems
