"""The service's audit log: appending entries to the keyed chain, group-committed, and reading
and verifying it against the ledger.

The chain itself — an entry's keyed hash, its verification, the cross-check with the ledger — is
:mod:`dpkit.server.audit`. This module writes it: every text is made storable first, entries
are chained under the chain's write lock in the caller's transaction (a debit's or a grant's own,
so the amount and its entry commit together or not at all, in the spirit of a write-ahead audit
trail), and concurrent request entries are group-committed — one transaction, one fsync, for all
the entries waiting at that moment (the leader/follower commit of database logs; see
https://www.sqlite.org/atomiccommit.html for why one fsync per transaction is the cost to share).
"""

from __future__ import annotations

import json
import math
import os
import threading
from collections.abc import Callable, Sequence
from fractions import Fraction
from pathlib import Path
from typing import Any

from dpkit._validate import short_repr as _short
from dpkit.errors import InvalidParameterError, LedgerError
from dpkit.ledger.base import LedgerBackend, SQLRunner, fraction_to_text
from dpkit.server.audit import (
    GENESIS,
    KEY_BYTES,
    AuditEntry,
    ChainReport,
    cross_check,
    default_key_path,
    load_key,
    verify_chain,
)
from dpkit.server.release_audit import read_releases, release_problems
from dpkit.server.store import AUDIT_LOCK, ServiceStore, now

__all__ = ["AUDIT_KEY_ENV", "AuditLog", "Chain", "entry_fields", "load_audit_key"]

#: The audit key file's location when none is passed (``--audit-key``); else beside the ledger.
AUDIT_KEY_ENV = "DPKIT_AUDIT_KEY"

#: Chains a batch of entries' fields in an open transaction: the chained entries.
Chain = Callable[[SQLRunner, list[dict[str, Any]]], list[AuditEntry]]

_COLUMNS = "seq, at, actor, action, dataset, status, outcome, epsilon, delta, detail, prev_hash, hash"


def load_audit_key(store: ServiceStore, url: str, source: str | os.PathLike[str] | bytes | None) -> bytes:
    """The chain's key: given as bytes, or read from a file (created with a fresh key only while
    the log is still empty — a log with entries and no key is refused)."""
    if isinstance(source, (bytes, bytearray)):
        if len(source) != KEY_BYTES:
            raise InvalidParameterError(
                "audit_key", f"<{len(source)} bytes>", f"{KEY_BYTES} random bytes, or the path of a key file"
            )
        return bytes(source)
    if source is None and os.environ.get(AUDIT_KEY_ENV):
        source = os.environ[AUDIT_KEY_ENV]
    if source is None:
        path = default_key_path(url)
    elif isinstance(source, (str, os.PathLike)) and os.fspath(source):
        path = Path(os.fspath(source)).expanduser().absolute()
    else:
        raise InvalidParameterError(
            "audit_key", _short(source), f"{KEY_BYTES} random bytes, the path of a key file, or None"
        )
    with store.transaction() as tx:
        empty = not tx.run("SELECT 1 FROM audit_log LIMIT 1")
    return load_key(path, create=empty)


def entry_fields(
    *,
    actor: str | None,
    action: str,
    status: int,
    outcome: str,
    dataset: str | None = None,
    detail: dict[str, Any] | None = None,
    epsilon: Fraction | None = None,
    delta: Fraction | None = None,
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


class AuditLog:
    """The ``audit_log`` table of one service store, chained with ``key``.

    ``chain`` is what every write of this log goes through (default: :meth:`chain`); the
    service passes its own, so that one seam covers request entries, debits and grants alike.
    """

    def __init__(self, store: ServiceStore, ledger: LedgerBackend, key: bytes, *, chain: Chain | None = None) -> None:
        self._store = store
        self._ledger = ledger
        self._key = key
        self._write: Chain = self.chain if chain is None else chain
        self._batcher: _GroupCommit | None = None

    def append(self, fields: dict[str, Any]) -> AuditEntry:
        """Append one entry (fields from :func:`entry_fields`) and return it once committed.

        Concurrent appends are group-committed: the first caller writes every entry waiting at
        that moment in one transaction while the others wait for it; if that batch fails, its
        entries are retried one by one, so one bad entry cannot take the others down with it."""
        return self._group_commit().append(fields)

    def _group_commit(self) -> _GroupCommit:
        if self._batcher is None or self._batcher.pid != os.getpid():
            self._batcher = _GroupCommit(self._append_batch)  # (a forked child gets its own)
        return self._batcher

    def _append_batch(self, batch: list[dict[str, Any]]) -> list[AuditEntry]:
        with self._store.transaction(audit=True) as tx:
            return self._write(tx, batch)

    def chain(self, tx: SQLRunner, batch: list[dict[str, Any]]) -> list[AuditEntry]:
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
                f"INSERT INTO audit_log ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    entry.seq,
                    entry.at,
                    entry.actor,
                    entry.action,
                    entry.dataset,
                    entry.status,
                    entry.outcome,
                    entry.epsilon,
                    entry.delta,
                    json.dumps(entry.detail, sort_keys=True),
                    entry.prev_hash,
                    entry.hash,
                ),
            )
            prev = entry.hash
            entries.append(entry)
        return entries

    def entries(
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
        sql = f"SELECT {_COLUMNS} FROM audit_log WHERE seq > ?"
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

    def _snapshot(self) -> tuple[list[AuditEntry], list[tuple[Any, ...]], list[tuple[Any, ...]], list[tuple[Any, ...]]]:
        """The whole chain, the budgets, the spends and the releases' rows, read together under
        the chain's lock (a debit writes its spend and its entry in one transaction, a publication
        its release and its entry, so they are seen together)."""
        with self._store.transaction(audit=True) as tx:  # (the store takes the chain's lock)
            rows = tx.run(f"SELECT {_COLUMNS} FROM audit_log ORDER BY seq")
            budgets = tx.run("SELECT dataset, analyst, epsilon, delta, spent_epsilon, spent_delta FROM budgets")
            spends = tx.run(
                "SELECT id, dataset, analyst, epsilon_cost, delta_cost, event, query_text FROM spends ORDER BY id"
            )
            releases = read_releases(tx)
        return [_entry(r) for r in rows], budgets, spends, releases

    def verify(self, *, head: str | None = None) -> ChainReport:
        """Verify the ledger, the keyed chain, and each against the other (see
        :meth:`dpkit.server.service.Service.verify_log`); LedgerError saying what was found."""
        self._ledger.verify()
        entries, budgets, spends, releases = self._snapshot()
        report = verify_chain(entries, key=self._key, head=head)
        problems = cross_check(entries, budgets, spends) + release_problems(entries, releases, spends, self._store)
        if problems:
            more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
            raise LedgerError("the audit log and the ledger disagree: " + "; ".join(problems[:5]) + more)
        return report

    def unlogged_spends(self) -> list[int]:
        """Ledger spends with no paying entry (see :meth:`dpkit.server.service.Service.unlogged_spends`)."""
        entries, _, spends, _ = self._snapshot()
        logged = {e.detail.get("spend_id") for e in entries if e.epsilon is not None}
        return [int(r[0]) for r in spends if int(r[0]) not in logged]


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
                    for s, e in zip(batch, entries, strict=False):
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
