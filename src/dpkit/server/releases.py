"""Published synthetic tables: released once, then downloaded by anyone the service knows.

A synthetic table requested with ``publish`` (:mod:`dpkit.server.synthetic`) is stored here under
that name, after the analyst's budget paid for it: its rows, its measurement report, what it
cost and which spend paid. Every authenticated principal may list and download releases
(``GET /v1/releases``, ``GET /v1/releases/{name}``): a downloaded table is post-processing of an
answer already paid for, so downloading spends nothing, and each download is an entry of the
audit log like any authenticated request. A release is never changed or deleted through the
service; its name is taken for good.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from dpkit.server.errors import NotFoundError
from dpkit.server.names import check_release_name
from dpkit.server.store import ServiceStore, now

__all__ = ["Release", "Releases", "check_release_name"]


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

    def public(self) -> dict[str, Any]:
        """What every principal sees (not the ledger's spend id: that is the curator's, in the
        audit log)."""
        return {
            "name": self.name,
            "dataset": self.dataset,
            "published_by": self.analyst,
            "epsilon": self.epsilon,
            "delta": self.delta,
            "created_at": self.created_at,
            "columns": list(self.columns),
            "rows": self.rows,
        }


_FIELDS = "name, dataset, analyst, spend_id, epsilon, delta, created_at, columns, row_count"


class Releases:
    """The ``releases`` table of a service store."""

    def __init__(self, store: ServiceStore) -> None:
        self._store = store

    def taken(self, name: str) -> bool:
        with self._store.transaction() as tx:
            return bool(tx.run("SELECT 1 FROM releases WHERE name = ?", (name,)))

    def add(
        self,
        name: str,
        dataset: str,
        analyst: str,
        spend_id: int | None,
        epsilon: float,
        delta: float,
        columns: list[str],
        rows_json: str,
        count: int,
        report: dict[str, Any],
    ) -> Release:
        """Store a release: ``rows_json`` holds its ``count`` rows (the caller has checked the
        name; a name taken meanwhile fails here)."""
        created = now()
        with self._store.transaction(write=True) as tx:
            tx.run(
                f"INSERT INTO releases ({_FIELDS}, rows_json, report) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    name, dataset, analyst, spend_id, repr(float(epsilon)), repr(float(delta)), created,
                    json.dumps(columns), count, rows_json, json.dumps(report, allow_nan=False),
                ),
            )  # fmt: skip
        return Release(name, dataset, analyst, spend_id, epsilon, delta, created, tuple(columns), count)

    def listing(self) -> list[Release]:
        with self._store.transaction() as tx:
            rows = tx.run(f"SELECT {_FIELDS} FROM releases ORDER BY created_at, name")
        return [_release(r) for r in rows]

    def get(self, name: str) -> tuple[Release, list[list[Any]], dict[str, Any]]:
        """The release, its rows and its report; NotFoundError (404) for a name never published."""
        with self._store.transaction() as tx:
            rows = tx.run(f"SELECT {_FIELDS}, rows_json, report FROM releases WHERE name = ?", (name,))
        if not rows:
            raise NotFoundError(f"there is no release named {name!r}")
        row = rows[0]
        return _release(row[:9]), json.loads(row[9]), json.loads(row[10])


def _release(row: Any) -> Release:
    name, dataset, analyst, spend_id, eps, delta, created, columns, count = row
    return Release(
        name, dataset, analyst, None if spend_id is None else int(spend_id), float(eps), float(delta), created,
        tuple(json.loads(columns)), int(count),
    )  # fmt: skip
