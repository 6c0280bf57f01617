"""The hash-chained audit log: every request, who made it, what it cost, how it ended.

Entry ``n`` stores ``hash_n = SHA-256(hash_{n-1} ‖ canonical JSON of entry n)`` with
``hash_0 = 0…0`` (64 zeros). Changing, deleting, inserting or reordering any entry changes every
later hash, so :func:`verify_chain` finds the first entry that does not match. Removing entries
from the *end* leaves a shorter valid chain: the curator closes that gap by keeping the head hash
that ``dpkit admin verify-log`` prints somewhere the server cannot write, and passing it back
with ``--head`` next time.

>>> e1 = AuditEntry.new(1, GENESIS, at="2026-01-01T00:00:00+00:00", actor="alice", action="query",
...                     dataset="census", status=200, outcome="ok", epsilon="1/2", delta="0/1", detail={})
>>> verify_chain([e1]).head == e1.hash
True
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from dpkit.errors import LedgerError

__all__ = ["GENESIS", "AuditEntry", "ChainReport", "verify_chain"]

GENESIS = "0" * 64


def _digest(prev: str, body: list[Any]) -> str:
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return hashlib.sha256((prev + text).encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class AuditEntry:
    """One request as recorded. ``epsilon``/``delta`` are the exact amounts debited ("n/d"
    fractions; None when nothing was debited); ``detail`` holds the query text or spec, the
    error message and other request facts."""

    seq: int
    at: str
    actor: str | None
    action: str
    dataset: str | None
    status: int
    outcome: str
    epsilon: str | None
    delta: str | None
    detail: dict[str, Any] = field(default_factory=dict)
    prev_hash: str = GENESIS
    hash: str = ""

    def body(self) -> list[Any]:
        return [self.seq, self.at, self.actor, self.action, self.dataset, self.status, self.outcome, self.epsilon, self.delta, self.detail]

    def expected_hash(self) -> str:
        return _digest(self.prev_hash, self.body())

    @classmethod
    def new(cls, seq: int, prev_hash: str, **fields: Any) -> AuditEntry:
        entry = cls(seq=seq, prev_hash=prev_hash, **fields)
        return replace(entry, hash=entry.expected_hash())

    def to_dict(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "at": self.at,
            "actor": self.actor,
            "action": self.action,
            "dataset": self.dataset,
            "status": self.status,
            "outcome": self.outcome,
            "epsilon": self.epsilon,
            "delta": self.delta,
            "detail": self.detail,
            "hash": self.hash,
        }


@dataclass(frozen=True)
class ChainReport:
    """A verified log: how many entries and the hash of the last (``GENESIS`` when empty)."""

    entries: int
    head: str


def verify_chain(entries: Iterable[AuditEntry], *, head: str | None = None) -> ChainReport:
    """Check the chain from the first entry; raise :class:`~dpkit.errors.LedgerError` naming the
    first entry that was changed, removed, inserted or reordered. With ``head`` (a hash the
    curator recorded earlier), also check that the entry with that hash is still in the chain,
    which detects entries cut from the end."""
    prev, n, seen_head = GENESIS, 0, head is None or head == GENESIS
    for entry in entries:
        n += 1
        if entry.seq != n:
            raise LedgerError(f"audit log: entry {n} is missing or out of order (found sequence number {entry.seq})")
        if entry.prev_hash != prev:
            raise LedgerError(f"audit log: entry {n} does not follow entry {n - 1} (its previous-hash field was changed)")
        if entry.hash != entry.expected_hash():
            raise LedgerError(f"audit log: entry {n} was changed after it was written (its hash does not match its contents)")
        prev = entry.hash
        seen_head = seen_head or entry.hash == head
    if not seen_head:
        raise LedgerError(f"audit log: the recorded head {head} is not in the log: entries were removed from its end")
    return ChainReport(n, prev)
