"""Idempotency keys of paid requests: a retry gets the first answer and is never paid twice.

A client whose connection dropped after it sent a paid request (a query, a synthetic table)
cannot tell whether it was paid. It sends each paid POST with an ``Idempotency-Key`` header (the
IETF HTTPAPI working group's draft "The Idempotency-Key HTTP Header Field") and retries with the
same key. Here, in the ``idempotency_keys`` table of the service's database:

* **Claim before paying.** The first request with a key claims it — a ``pending`` row with the
  request's fingerprint (SHA-256 of the endpoint, the dataset's name and the canonical JSON of
  the parsed body) and a token of its own — in a transaction of its own, before anything is
  paid. Keys are scoped per principal and per endpoint: two analysts may use the same key.
* **The debit takes the claim with it.** The debit writes its spend id into the claim *in the
  debit's own transaction*, and only while the claim is still this request's; otherwise it
  raises and the debit rolls back. A debit and its claim commit together or not at all, so two
  requests with one key never both pay — even when a retry took over a claim abandoned before
  paying (``CLAIM_SECONDS``): the request that abandoned it is refused at its debit.
* **Store the answer.** Once the answer is encoded, its status and exact bytes are stored with
  the key (``done``). A failure after the debit (the fixed ``query_failed``) is stored too.
  A refusal decided before the debit (400, 404, 409 ``budget_exceeded``, 429, a limit) is not:
  the claim is released, and a retry is a new attempt.
* **Retries.** The same key and fingerprint after completion: the stored status and bytes,
  with ``Idempotent-Replayed: true`` — no debit, no spend entry in the audit chain (the request's
  entry is ``query_replayed``/``synthesize_replayed`` with the spend id, no amount). A different
  fingerprint: 422 ``idempotency_key_reused``. The first still in progress: 409
  ``idempotency_key_in_progress``. A claim that paid but whose answer was never stored (the
  server stopped in between), once past its answer's time: the fixed ``query_failed`` naming that
  spend, stored and replayed from then on — never a second run.
* **Bounded.** A key is kept ``seconds`` (24 h) after its claim; a principal holds at most
  ``max_keys`` (1,000), the oldest completed dropped first to make room (a principal whose every
  key is in progress is refused with 429). Stored bodies are bounded by the answers' own limits
  (``max_response_bytes``; a synthetic table's rows by ``max_result_rows``).

**Timing.** A replay leaves as soon as its row is read, not at a paid answer's fixed time
(:mod:`dpkit.server.pacing`): it reveals nothing new. Its bytes are those of an answer already
given for this principal's own request, and how long reading them takes depends on the stored
row, not on the data; the one thing a replay's speed tells is that the key was stored, which the
client knows already.
"""

from __future__ import annotations

import hashlib
import json
import logging
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from dpkit._validate import short_repr
from dpkit.errors import InvalidParameterError
from dpkit.ledger.base import SQLRunner
from dpkit.server.problems import Problem
from dpkit.server.store import ServiceStore

__all__ = [
    "HEADER",
    "REPLAYED_HEADER",
    "CLAIM_SECONDS",
    "Claim",
    "Stored",
    "Unanswered",
    "IdempotencyKeys",
    "parse_key",
    "fingerprint",
]

_curator_log = logging.getLogger("dpkit.curator")

HEADER = "Idempotency-Key"
REPLAYED_HEADER = "Idempotent-Replayed"
_MAX_LENGTH = 255
#: A claim that has not paid this long after it was made is abandoned (its server stopped, or
#: its request never reached a thread): a retry may take it over. Safety does not rest on it —
#: a request whose claim was taken over is refused at its debit — only how long a retry after a
#: crash before the debit waits.
CLAIM_SECONDS = 300.0
#: How long past its answer's time budget a paid claim may take to store its answer before a
#: retry answers ``query_failed`` for it (the answer leaves at its deadline plus a small grace).
_PAID_GRACE_SECONDS = 60.0
#: Advisory-lock key (PostgreSQL, with the principal's hash) serialising one principal's claims
#: across processes ("dpki"). On SQLite every write transaction is already serialised.
_LOCK = 0x64706B69
_PK = "principal = ? AND endpoint = ? AND idem_key = ?"


def parse_key(values: list[str]) -> str | None:
    """The key of a request's ``Idempotency-Key`` header values (None: no header): 1 to 255
    printable ASCII characters (0x21-0x7E), or the same in double quotes (the draft's string
    form; the quotes are not part of the key). InvalidParameterError naming the header for
    anything else, and for the header given twice."""
    if not values:
        return None
    if len(values) > 1:
        raise InvalidParameterError(HEADER, f"{len(values)} headers", "given once", "nothing was spent")
    value = values[0]
    quoted = len(value) >= 2 and value[0] == value[-1] == '"'
    key = value[1:-1] if quoted else value
    if not 1 <= len(key) <= _MAX_LENGTH or any(not 0x21 <= ord(c) <= 0x7E or (quoted and c in '"\\') for c in key):
        raise InvalidParameterError(
            HEADER,
            short_repr(value, 80),
            f"1 to {_MAX_LENGTH} printable ASCII characters (0x21-0x7E: no space, no control or non-ASCII "
            "character), optionally in double quotes",
            "nothing was spent",
        )
    return key


def fingerprint(dataset: str, endpoint: str, body: Mapping[str, Any]) -> str:
    """SHA-256 (hex) of the request: the endpoint, the dataset's name and the canonical JSON
    (sorted keys, no spaces, ASCII) of its parsed body — the fields the client set, after
    validation, so ``1`` and ``1.0`` or a reordered object are the same request."""
    canonical = json.dumps([endpoint, dataset, body], sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(canonical.encode("ascii")).hexdigest()


@dataclass(frozen=True)
class Claim:
    """A key claimed by one request: its principal, endpoint, key and the request's own token."""

    principal: str
    endpoint: str
    key: str
    token: str

    def pk(self) -> tuple[str, str, str]:
        return (self.principal, self.endpoint, self.key)


@dataclass(frozen=True)
class Stored:
    """A completed key: the first answer's status and exact bytes, and the spend that paid it."""

    status: int
    body: bytes
    spend_id: int | None


@dataclass(frozen=True)
class Unanswered:
    """A key whose request paid (``spend_id``) and never stored its answer, past its time: the
    answer to store for it (with ``claim``) is the fixed ``query_failed`` naming the spend."""

    claim: Claim
    spend_id: int


OnDebit = Callable[[SQLRunner, int], None]


class IdempotencyKeys:
    """The ``idempotency_keys`` table of a service store: keys kept ``seconds`` after their
    claim, at most ``max_keys`` per principal. ``clock``: seconds since the epoch."""

    def __init__(
        self,
        store: ServiceStore,
        *,
        max_keys: int = 1000,
        seconds: float = 86_400.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._store = store
        self.max_keys = int(max_keys)
        self.seconds = float(seconds)
        self._clock = clock

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)

    def claim(self, principal: str, endpoint: str, key: str, print_: str) -> Claim | Stored | Unanswered:
        """Claim ``key`` for a request with fingerprint ``print_``, or what a retry gets: the
        stored answer, or the claim of a paid request that never stored one. Problem 422 for a
        key used for another request, 409 while the first is in progress, 429 when every one of
        the principal's ``max_keys`` is in progress."""
        token = secrets.token_hex(16)
        now = self._now_ms()
        with self._store.transaction(write=True) as tx:
            if tx.dialect == "postgres":
                tx.run("SELECT pg_advisory_xact_lock(CAST(? AS INTEGER), hashtext(?))", (_LOCK, principal))
            tx.run(
                "DELETE FROM idempotency_keys WHERE principal = ? AND created_ms < ?",
                (principal, now - int(self.seconds * 1000)),
            )
            row = _one(
                tx,
                f"SELECT fingerprint, token, state, spend_id, status, body, expires_ms FROM idempotency_keys WHERE {_PK}",
                (principal, endpoint, key),
            )
            if row is None:
                self._make_room(tx, principal)
                tx.run(
                    "INSERT INTO idempotency_keys (principal, endpoint, idem_key, fingerprint, token, state, created_ms, "
                    "expires_ms) VALUES (?, ?, ?, ?, ?, 'pending', ?, ?)",
                    (principal, endpoint, key, print_, token, now, now + int(CLAIM_SECONDS * 1000)),
                )
                return Claim(principal, endpoint, key, token)
            stored_print, old_token, state, spend_id, status, body, expires_ms = row
            if stored_print != print_:
                raise Problem(
                    422,
                    "idempotency_key_reused",
                    f"this {HEADER} was already used for a different request to this endpoint; use a new key for a "
                    "new request; nothing was spent",
                    parameter=HEADER,
                )
            if state == "done":
                return Stored(int(status), str(body).encode("utf-8"), None if spend_id is None else int(spend_id))
            if int(expires_ms) > now:
                raise _in_progress()
            old = Claim(principal, endpoint, key, str(old_token))
            if spend_id is not None:
                return Unanswered(old, int(spend_id))
            # Abandoned before it paid: a fresh attempt. (Its request, if it still runs, is refused
            # at its debit: the claim's token is no longer its own.)
            tx.run(
                "UPDATE idempotency_keys SET token = ?, created_ms = ?, expires_ms = ? "
                f"WHERE {_PK} AND token = ? AND state = 'pending' AND spend_id IS NULL",
                (token, now, now + int(CLAIM_SECONDS * 1000), *old.pk(), old.token),
            )
            taken = _one(tx, f"SELECT token FROM idempotency_keys WHERE {_PK}", old.pk())
            if taken is None or taken[0] != token:  # it paid meanwhile (PostgreSQL: a debit's row lock)
                raise _in_progress()
            return Claim(principal, endpoint, key, token)

    def _make_room(self, tx: SQLRunner, principal: str) -> None:
        """Drop the principal's oldest completed keys until one more fits in ``max_keys``."""
        (count,) = _one(tx, "SELECT COUNT(*) FROM idempotency_keys WHERE principal = ?", (principal,)) or (0,)
        over = int(count) - self.max_keys + 1
        if over <= 0:
            return
        oldest = tx.run(
            "SELECT endpoint, idem_key FROM idempotency_keys WHERE principal = ? AND state = 'done' "
            "ORDER BY created_ms, endpoint, idem_key LIMIT ?",
            (principal, over),
        )
        for endpoint, key in oldest:
            tx.run(f"DELETE FROM idempotency_keys WHERE {_PK}", (principal, endpoint, key))
        if len(oldest) < over:
            raise Problem(
                429,
                "rate_limited",
                f"{principal!r} has {self.max_keys} requests with an {HEADER} in progress (the limit); retry when one is "
                "answered; nothing was spent",
                headers={"Retry-After": "1"},
                setting="max_idempotency_keys",
            )

    def on_debit(self, claim: Claim, answer_seconds: Callable[[], float]) -> OnDebit:
        """What the debit runs in its own transaction (``ticket.on_debit``): write its spend id
        into ``claim``, which must still be this request's — else raise, and the debit rolls
        back. ``answer_seconds``: the answer's time budget, read when paying."""

        def attach(tx: SQLRunner, spend_id: int) -> None:
            expires = self._now_ms() + int((answer_seconds() + _PAID_GRACE_SECONDS) * 1000)
            tx.run(
                f"UPDATE idempotency_keys SET spend_id = ?, expires_ms = ? WHERE {_PK} AND token = ? "
                "AND state = 'pending' AND spend_id IS NULL",
                (spend_id, expires, *claim.pk(), claim.token),
            )
            mine = _one(
                tx, f"SELECT spend_id FROM idempotency_keys WHERE {_PK} AND token = ?", (*claim.pk(), claim.token)
            )
            if mine is None or mine[0] is None or int(mine[0]) != spend_id:
                raise _in_progress("a retry with this key took it over while this request waited to be paid")

        return attach

    def spend_of(self, claim: Claim) -> int | None:
        """The spend attached to ``claim`` (None: it has not paid, or is no longer this request's)."""
        with self._store.transaction() as tx:
            row = _one(
                tx, f"SELECT spend_id FROM idempotency_keys WHERE {_PK} AND token = ?", (*claim.pk(), claim.token)
            )
        return None if row is None or row[0] is None else int(row[0])

    def release(self, claim: Claim) -> None:
        """Free an unpaid claim (a refusal before the debit): a retry is a new attempt. Never
        raises: a claim it cannot free is abandoned after ``CLAIM_SECONDS``."""
        try:
            with self._store.transaction(write=True) as tx:
                tx.run(
                    f"DELETE FROM idempotency_keys WHERE {_PK} AND token = ? AND state = 'pending' AND spend_id IS NULL",
                    (*claim.pk(), claim.token),
                )
        except Exception:
            _curator_log.exception("the claim of an idempotency key of %r could not be released", claim.principal)

    def complete(self, claim: Claim, status: int, body: bytes) -> None:
        """Store the answer of ``claim``'s request. Never raises: the answer is sent whatever
        happens here (a paid answer that could not be stored is replayed as ``query_failed``)."""
        try:
            with self._store.transaction(write=True) as tx:
                tx.run(
                    f"UPDATE idempotency_keys SET state = 'done', status = ?, body = ? WHERE {_PK} AND token = ? "
                    "AND state = 'pending'",
                    (int(status), body.decode("utf-8"), *claim.pk(), claim.token),
                )
        except Exception:
            _curator_log.exception("the answer to an idempotency key of %r could not be stored", claim.principal)


def _one(tx: SQLRunner, sql: str, params: tuple[Any, ...]) -> tuple[Any, ...] | None:
    rows = tx.run(sql, params)
    return tuple(rows[0]) if rows else None


def _in_progress(why: str = "the first request with this key is still in progress") -> Problem:
    return Problem(
        409,
        "idempotency_key_in_progress",
        f"{why}; retry once it is answered; nothing was spent",
        headers={"Retry-After": "1"},
        parameter=HEADER,
    )
