"""The keyed hash chain of the audit log: every request, who made it, what it cost, how it ended.

Entry ``n`` stores ``hash_n = HMAC-SHA256(key, hash_{n-1} ‖ canonical JSON of entry n)`` with
``hash_0 = 0…0`` (64 zeros). The key is 32 random bytes kept *outside* the database (a file only
the service reads, :func:`load_key`): someone who can write the database but not read the key
cannot write a single entry that verifies, so changing, deleting, inserting, reordering or
re-chaining entries is found by :func:`verify_chain`, which names the first entry that does not
match. Removing entries from the *end* leaves a shorter valid chain: the curator closes that gap
by keeping the head hash that ``dpkit admin verify-log`` prints somewhere the server cannot
write, and passing it back with ``--head`` next time.

The canonical JSON is ASCII (``ensure_ascii``), so any text — including a lone surrogate sent by
a hostile client — has exactly one encoding and can never make an entry unwritable.

>>> key = bytes(32)
>>> e1 = AuditEntry.new(1, GENESIS, key, at="2026-01-01T00:00:00+00:00", actor="alice", action="query",
...                     dataset="census", status=200, outcome="ok", epsilon="1/2", delta="0/1", detail={})
>>> verify_chain([e1], key=key).head == e1.hash
True
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from fractions import Fraction
from pathlib import Path
from typing import Any

from dpkit.errors import LedgerError

__all__ = [
    "GENESIS",
    "AuditEntry",
    "ChainReport",
    "verify_chain",
    "cross_check",
    "text_digest",
    "load_key",
    "default_key_path",
    "KEY_BYTES",
]

GENESIS = "0" * 64


KEY_BYTES = 32


def canonical(body: list[Any]) -> str:
    """The one text of an entry's fields that its hash covers (ASCII JSON, sorted keys)."""
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)


def _digest(key: bytes, prev: str, body: list[Any]) -> str:
    return hmac.new(key, (prev + canonical(body)).encode("ascii"), hashlib.sha256).hexdigest()


def text_digest(text: str) -> str:
    """SHA-256 (hex) of a stored text's UTF-8 bytes: what a paying entry records of its spend's
    ``event`` and ``query_text``, exactly as the ledger wrote them (a text the database stored is
    valid UTF-8; ``surrogatepass`` only keeps a check from ever raising on one that is not)."""
    return hashlib.sha256(str(text).encode("utf-8", "surrogatepass")).hexdigest()


def load_key(path: Path, *, create: bool) -> bytes:
    """The chain's key from ``path`` (64 hex digits). With ``create``, a missing file is created
    with a fresh key from the OS CSPRNG, readable by its owner only (``O_EXCL``: processes
    starting at once agree on one key). LedgerError when the file is missing (and not to be
    created) or is not a key; the message names the file, never its contents."""
    try:
        text = path.read_text(encoding="ascii").strip()
    except FileNotFoundError:
        if not create:
            raise LedgerError(
                f"the audit log's key file {path} is missing: the log has entries, and without the key they can be "
                "neither verified nor extended; restore the file (or pass --audit-key with its location)"
            ) from None
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            return load_key(path, create=False)
        with os.fdopen(fd, "w", encoding="ascii") as out:
            out.write(secrets.token_hex(KEY_BYTES) + "\n")
            out.flush()
            os.fsync(out.fileno())
        return load_key(path, create=False)
    except (OSError, UnicodeDecodeError) as exc:
        raise LedgerError(f"the audit log's key file {path} cannot be read ({type(exc).__name__})") from None
    try:
        key = bytes.fromhex(text)
    except ValueError:
        key = b""
    if len(key) != KEY_BYTES:
        raise LedgerError(f"the audit log's key file {path} does not hold a key ({2 * KEY_BYTES} hexadecimal digits)")
    return key


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
        return [
            self.seq,
            self.at,
            self.actor,
            self.action,
            self.dataset,
            self.status,
            self.outcome,
            self.epsilon,
            self.delta,
            self.detail,
        ]

    def expected_hash(self, key: bytes) -> str:
        return _digest(key, self.prev_hash, self.body())

    @classmethod
    def new(cls, seq: int, prev_hash: str, key: bytes, **fields: Any) -> AuditEntry:
        entry = cls(seq=seq, prev_hash=prev_hash, **fields)
        return replace(entry, hash=entry.expected_hash(key))

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


def verify_chain(entries: Iterable[AuditEntry], *, key: bytes, head: str | None = None) -> ChainReport:
    """Check the chain from the first entry with the chain's ``key``; raise
    :class:`~dpkit.errors.LedgerError` naming the first entry that was changed, removed,
    inserted, reordered or written without the key. With ``head`` (a hash the curator recorded
    earlier), also check that the entry with that hash is still in the chain, which detects
    entries cut from the end."""
    prev, n, seen_head = GENESIS, 0, head is None or head == GENESIS
    for entry in entries:
        n += 1
        if entry.seq != n:
            raise LedgerError(f"audit log: entry {n} is missing or out of order (found sequence number {entry.seq})")
        if entry.prev_hash != prev:
            raise LedgerError(
                f"audit log: entry {n} does not follow entry {n - 1} (its previous-hash field was changed)"
            )
        if not hmac.compare_digest(entry.hash, entry.expected_hash(key)):
            raise LedgerError(
                f"audit log: entry {n} does not match its keyed hash: it was changed after it was written, or written "
                "without the log's key (by someone re-chaining the log)"
            )
        prev = entry.hash
        seen_head = seen_head or entry.hash == head
    if not seen_head:
        raise LedgerError(
            f"audit log: the recorded head {head} is not among its {n} entries, all of which verify: entries were "
            "removed from its end after that head was recorded, or the log was rewritten by someone holding its key "
            "(or the head belongs to another log)"
        )
    return ChainReport(n, prev)


def default_key_path(url: str) -> Path:
    """Where the chain's key lives unless the administrator names a file (``--audit-key``):
    beside a SQLite ledger (``ledger.sqlite`` → ``ledger.sqlite.audit-key``), and for a
    PostgreSQL ledger in ``.dpkit/`` under the working directory, named by a digest of the URL
    without its password — on the service's host, outside the database either way."""
    if url.startswith("sqlite:///"):
        from dpkit.server.store import sqlite_path

        db = sqlite_path(url)
        return db.with_name(db.name + ".audit-key")
    from dpkit.ledger._postgres_driver import mask_url

    digest = hashlib.sha256(mask_url(url).encode("utf-8")).hexdigest()[:16]
    return (Path(".dpkit") / f"audit-{digest}.key").absolute()


def _amount(text: object) -> Fraction | None:
    try:
        return Fraction(str(text)) if text is not None else None
    except (ValueError, ZeroDivisionError):
        return None


def _texts_differ(entry: AuditEntry, event: object, query_text: object) -> list[str] | None:
    """Which of the spend's stored texts differ from the digests its paying entry chained
    (``[]``: none); None when the entry chained no digests to compare with."""
    chained = (entry.detail.get("event_sha256"), entry.detail.get("query_sha256"))
    if not all(isinstance(h, str) for h in chained):
        return None
    stored = (text_digest(str(event)), text_digest(str(query_text)))
    names = ("event", "query text")
    return [n for n, c, s in zip(names, chained, stored, strict=True) if not hmac.compare_digest(str(c), s)]


def _show(value: Fraction | None) -> str:
    return "?" if value is None else f"{float(value):.6g}"


def cross_check(
    entries: list[AuditEntry], budgets: Iterable[tuple[Any, ...]], spends: Iterable[tuple[Any, ...]]
) -> list[str]:
    """What the chain and the ledger disagree on, in words (empty when they agree).

    ``budgets``: rows (dataset, analyst, ε, δ, spent ε, spent δ); ``spends``: rows (id,
    dataset, analyst, ε, δ, event, query text), amounts as exact fractions ``"n/d"`` and the
    texts as stored. A *paying* entry is one that records an amount (``epsilon``/``delta``): the
    debit's entry, written in the debit's own transaction, naming its ``spend_id`` and the
    :func:`text_digest` of the spend's stored event (``event_sha256``) and query text
    (``query_sha256``). A *grant* entry records a budget's (ε, δ).

    * every spend has exactly one paying entry, with its analyst, dataset and exact cost, and
      the digests of its stored event and query text (a rewritten text is found; a paying entry
      without the digests — a log chained before they were recorded — cannot vouch for the texts
      and is reported as such, once for all of them);
    * every paying entry names a spend that exists;
    * every budget has exactly one grant entry, with its exact (ε, δ), and every grant entry
      a budget;
    * every budget's spent totals equal the sum of its chained spends.
    """
    problems: list[str] = []
    paying: dict[int, AuditEntry] = {}
    chained: dict[tuple[Any, Any], list[Fraction]] = {}
    grants: dict[tuple[Any, Any], list[AuditEntry]] = {}
    for e in entries:
        if e.epsilon is not None or e.delta is not None:
            sid = e.detail.get("spend_id")
            eps, dlt = _amount(e.epsilon), _amount(e.delta)
            if e.action != "query" or not isinstance(sid, int) or isinstance(sid, bool) or eps is None or dlt is None:
                problems.append(f"audit entry {e.seq} records a payment (ε={e.epsilon}) but names no spend")
                continue
            if sid in paying:
                problems.append(f"audit entries {paying[sid].seq} and {e.seq} both record spend {sid}")
                continue
            paying[sid] = e
            total = chained.setdefault((e.dataset, e.actor), [Fraction(0), Fraction(0)])
            total[0] += eps
            total[1] += dlt
        elif e.action == "grant" and e.status < 400:
            grants.setdefault((e.dataset, e.detail.get("analyst")), []).append(e)
    unhashed: list[int] = []
    for sid, dataset, analyst, eps, dlt, event, query_text in spends:
        entry = paying.pop(int(sid), None)
        if entry is None:
            problems.append(
                f"spend {sid} (analyst {analyst!r} on dataset {dataset!r}, ε={_show(_amount(eps))}) has no audit entry"
            )
            continue
        texts = _texts_differ(entry, event, query_text)
        if texts is None:
            unhashed.append(int(sid))
        elif texts:
            verb = "differs" if len(texts) == 1 else "differ"
            problems.append(
                f"spend {sid} (analyst {analyst!r} on dataset {dataset!r}): its stored {' and '.join(texts)} {verb} from "
                f"what its audit entry {entry.seq} vouches for (rewritten in the ledger after the debit)"
            )
        if (entry.dataset, entry.actor, _amount(entry.epsilon), _amount(entry.delta)) != (
            dataset,
            analyst,
            _amount(eps),
            _amount(dlt),
        ):
            problems.append(
                f"spend {sid} (analyst {analyst!r} on dataset {dataset!r}, ε={_show(_amount(eps))}, δ={_show(_amount(dlt))}) differs from "
                f"its audit entry {entry.seq} (analyst {entry.actor!r} on dataset {entry.dataset!r}, ε={_show(_amount(entry.epsilon))}, "
                f"δ={_show(_amount(entry.delta))})"
            )
    if unhashed:
        shown = ", ".join(str(sid) for sid in unhashed[:10]) + (", …" if len(unhashed) > 10 else "")
        problems.append(
            f"{len(unhashed)} spend(s) ({shown}) have paying audit entries without the SHA-256 of the spend's event and "
            "query text (entries chained before spends' texts were recorded, or forged without them): whether those "
            "texts were rewritten in the ledger cannot be checked"
        )
    for sid, entry in sorted(paying.items()):
        problems.append(
            f"audit entry {entry.seq} records spend {sid} (analyst {entry.actor!r} on dataset {entry.dataset!r}, "
            f"ε={_show(_amount(entry.epsilon))}), which is not in the ledger"
        )
    for dataset, analyst, eps, dlt, spent_eps, spent_dlt in budgets:
        what = f"the budget of analyst {analyst!r} on dataset {dataset!r}"
        granted = grants.pop((dataset, analyst), [])
        if len(granted) != 1:
            problems.append(
                f"{what} has {len(granted)} grant entries in the audit log (a budget is granted exactly once)"
            )
        else:
            g = granted[0]
            chained_grant = (_amount(g.detail.get("budget_epsilon")), _amount(g.detail.get("budget_delta")))
            if chained_grant != (_amount(eps), _amount(dlt)):
                problems.append(
                    f"{what} is ε={_show(_amount(eps))}, δ={_show(_amount(dlt))} in the ledger but its grant (audit entry {g.seq}) "
                    f"says ε={_show(chained_grant[0])}, δ={_show(chained_grant[1])}"
                )
        total = chained.get((dataset, analyst), [Fraction(0), Fraction(0)])
        if [_amount(spent_eps), _amount(spent_dlt)] != total:
            problems.append(
                f"{what} has spent ε={_show(_amount(spent_eps))}, δ={_show(_amount(spent_dlt))} in the ledger, but its chained "
                f"spends add up to ε={_show(total[0])}, δ={_show(total[1])}"
            )
    for (dataset, analyst), granted in sorted(grants.items(), key=lambda kv: kv[1][0].seq):
        problems.append(
            f"audit entry {granted[0].seq} grants analyst {analyst!r} a budget on dataset {dataset!r}, which is not in the ledger"
        )
    return problems
