"""Requests refused at the edge: throttled per client address, counted in bounded form.

Anyone who can reach the service can send requests without a key. Those are refused 401 before
the service does any work for them, and they are *not* entries of the hash-chained audit log
(one chained row per unauthenticated request would let anyone grow the permanent log without
bound and slow every authenticated request that waits on the chain's lock). Nor is a
principal's own 429 (its rate exceeded): a flood of them would grow the chain just as fast.
Instead:

* :class:`AddressLimiter` keeps a token bucket per client address, charged by each request
  refused for its key (missing, malformed, unknown or revoked). An address whose bucket is empty
  gets 429 for such requests until it refills. A *valid* key is never refused for its address's
  bucket: a request with a well-formed key is authenticated first, so others' failures at a
  shared address (a NAT, an office) cannot lock its holder out. It tracks at most
  ``max_addresses`` addresses (least recently seen forgotten first), so its memory is bounded
  whatever the number of addresses a client uses.
* :class:`KnownKeys` keeps that bounded for well-formed keys too: once an address is throttled,
  its well-formed keys are looked up in an in-memory set of the valid keys' hashes, reloaded at
  most once per ``refresh_every`` seconds, instead of one database lookup each.
* :class:`RefusalCounter` counts refusals per hour and reason in memory and adds the counts to
  the small table ``edge_refusals`` of the service database at most once per ``flush_every``
  seconds (one upsert per reason and hour, pruned after ``keep_days`` days): a table of at most
  a few rows per hour per reason, whatever the traffic. A principal's 429s are counted under
  ``principal_rate_limited:<name>`` — as many reasons as there are principals, no more.

Behind a reverse proxy every client has the proxy's address: run uvicorn with
``--forwarded-allow-ips`` set to the proxy, or give the limiter a larger burst.
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from dpkit import _validate as v
from dpkit.server.store import ServiceStore

__all__ = ["TokenBuckets", "AddressLimiter", "KnownKeys", "RefusalCounter", "REASONS", "PRINCIPAL_RATE_LIMITED"]

#: Why a request was refused at the edge (the last per principal: ``principal_rate_limited:<name>``).
REASONS = ("unauthenticated", "address_rate_limited", "ledger_unavailable", "principal_rate_limited")
#: The reason of a principal's own 429, followed by ``:`` and its name (names hold no ``:``).
PRINCIPAL_RATE_LIMITED = "principal_rate_limited"

_TABLE = """CREATE TABLE IF NOT EXISTS edge_refusals (
    period TEXT NOT NULL,
    reason TEXT NOT NULL,
    count BIGINT NOT NULL,
    PRIMARY KEY (period, reason)
)"""


class TokenBuckets:
    """A token bucket per key: ``burst`` tokens at once, ``rate`` per second after. At most
    ``max_keys`` buckets are kept (the least recently used is dropped: a forgotten key starts
    again with a full bucket), so memory is bounded whatever the number of keys.

    :meth:`take` spends a token if there is one (a request that may go ahead); :meth:`wait`
    looks without spending; :meth:`charge` spends one even from an empty bucket (a refusal)."""

    def __init__(
        self,
        rate: float,
        burst: int,
        max_keys: int = 10_000,
        *,
        names: tuple[str, str, str] = ("rate", "burst", "max_keys"),
    ) -> None:
        self.rate = v.positive(rate, names[0])
        self.burst = float(v.positive_int(burst, names[1]))
        self.max_keys = v.positive_int(max_keys, names[2])
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()
        self._lock = threading.Lock()

    def _level(self, key: str, t: float) -> float:
        tokens, last = self._buckets.get(key, (self.burst, t))
        return min(self.burst, tokens + (t - last) * self.rate)

    def _set(self, key: str, tokens: float, t: float) -> None:
        self._buckets[key] = (tokens, t)
        self._buckets.move_to_end(key)
        while len(self._buckets) > self.max_keys:
            self._buckets.popitem(last=False)

    def _delay(self, tokens: float) -> float:
        return 0.0 if tokens >= 1.0 else (1.0 - tokens) / self.rate

    def wait(self, key: str) -> float:
        """0 if ``key`` may go ahead, else the seconds until it may (nothing is spent)."""
        t = time.monotonic()
        with self._lock:
            if key not in self._buckets:
                return 0.0
            return self._delay(self._level(key, t))

    def take(self, key: str) -> float:
        """0 and one token spent if ``key`` may go ahead, else the seconds until it may."""
        t = time.monotonic()
        with self._lock:
            tokens = self._level(key, t)
            self._set(key, tokens - 1.0 if tokens >= 1.0 else tokens, t)
            return self._delay(tokens)

    def charge(self, key: str) -> None:
        """Spend one token of ``key``'s bucket, down to empty (a request from it was refused)."""
        t = time.monotonic()
        with self._lock:
            self._set(key, max(0.0, self._level(key, t) - 1.0), t)

    def __len__(self) -> int:
        return len(self._buckets)


class AddressLimiter(TokenBuckets):
    """:class:`TokenBuckets` per client address, charged by each refused request: ``burst``
    refusals at once, ``rate`` per second after; at most ``max_addresses`` addresses."""

    def __init__(self, rate: float, burst: int, max_addresses: int = 10_000) -> None:
        super().__init__(rate, burst, max_addresses, names=("address_rate", "address_burst", "max_addresses"))


class KnownKeys:
    """The hashes of the unrevoked keys, as ``load`` reads them, reloaded at most once per
    ``refresh_every`` seconds: what a well-formed key from a throttled address is checked
    against before the database is asked.

    Without it, a flood of well-formed random keys costs one indexed lookup each (a thread and
    a database read), throttled or not. With it, such a flood from a throttled address costs a
    SHA-256 and a set lookup per request, and at most one ``load`` per ``refresh_every`` seconds
    in all. A key in the set is still authenticated against the database (so a key revoked
    since the load is refused as ever); a key not in it is refused only by a load that began
    *after* its request arrived (:meth:`settled`), so a key issued a moment ago — by another
    worker — is found by the next load instead of being throttled: its request waits for that
    load (at most ``refresh_every`` seconds) and goes ahead."""

    def __init__(self, load: Callable[[], Iterable[str]], *, refresh_every: float = 1.0) -> None:
        self._load = load
        self.refresh_every = v.positive(refresh_every, "refresh_every")
        self._hashes: frozenset[str] = frozenset()
        self._started = -math.inf  # (time.monotonic) when the last load began
        self._lock = threading.Lock()

    @classmethod
    def of(cls, store: ServiceStore, *, refresh_every: float = 1.0) -> KnownKeys:
        """The unrevoked keys of the service database ``store`` (its ``api_keys`` table)."""

        def load() -> list[str]:
            with store.transaction() as tx:
                return [str(r[0]) for r in tx.run("SELECT key_hash FROM api_keys WHERE revoked_at IS NULL")]

        return cls(load, refresh_every=refresh_every)

    def __contains__(self, digest: str) -> bool:
        return digest in self._hashes

    def settled(self, arrived: float) -> bool:
        """Whether a load began at or after ``arrived`` (monotonic): its set is then the answer."""
        return self._started >= arrived

    def wait(self) -> float:
        """Seconds until the next load may begin (0: now)."""
        return max(0.0, self._started + self.refresh_every - time.monotonic())

    def holds(self, digest: str, arrived: float) -> bool:
        """Whether ``digest`` is a valid key's hash, by a load that began at or after
        ``arrived`` (this one, if none has; call it off the event loop and after :meth:`wait`).
        A failed load leaves the set as it was and raises."""
        with self._lock:
            if digest in self._hashes or self.settled(arrived):
                return digest in self._hashes
            before, self._started = self._started, time.monotonic()
            try:
                self._hashes = frozenset(self._load())
            except BaseException:
                self._started = before  # (a failed load settles nothing: the next request tries again)
                raise
            return digest in self._hashes


@dataclass(frozen=True)
class RefusalCount:
    """Refusals of one reason in one hour (``period``: ``YYYY-MM-DDTHH`` UTC). A principal's
    429s have the reason ``principal_rate_limited:<name>``; :meth:`to_dict` shows it as the
    reason ``principal_rate_limited`` and the ``principal``."""

    period: str
    reason: str
    count: int

    def to_dict(self) -> dict[str, Any]:
        reason, _, principal = self.reason.partition(":")
        out: dict[str, Any] = {"period": self.period, "reason": reason, "count": self.count}
        if principal:
            out["principal"] = principal
        return out


def _period(at: datetime | None = None) -> str:
    return (at or datetime.now(UTC)).strftime("%Y-%m-%dT%H")


class RefusalCounter:
    """Counts of refused requests per hour and reason: in memory, added to the service database
    at most once per ``flush_every`` seconds. :meth:`counts` returns the stored and pending
    counts together."""

    def __init__(self, store: ServiceStore, *, flush_every: float = 1.0, keep_days: int = 90) -> None:
        self._store = store
        self._flush_every = float(flush_every)
        self._keep_days = int(keep_days)
        self._pending: dict[tuple[str, str], int] = {}
        self._lock = threading.Lock()
        self._flush_lock = threading.Lock()
        self._last_flush = time.monotonic()
        with store.transaction(write=True) as tx:
            tx.run(_TABLE)

    def add(self, reason: str) -> bool:
        """Count one refusal; True when a flush is due (call :meth:`flush` off the event loop)."""
        key = (_period(), reason)
        with self._lock:
            self._pending[key] = self._pending.get(key, 0) + 1
            return time.monotonic() - self._last_flush >= self._flush_every

    def flush(self) -> None:
        """Add the pending counts to the table (one upsert per hour and reason) and drop counts
        older than ``keep_days``. A failed write keeps the counts pending for the next flush."""
        with self._flush_lock:
            with self._lock:
                pending, self._pending = self._pending, {}
                self._last_flush = time.monotonic()
            if not pending:
                return
            cutoff = _period(datetime.now(UTC) - timedelta(days=self._keep_days))
            try:
                with self._store.transaction(write=True) as tx:
                    for (period, reason), n in sorted(pending.items()):
                        tx.run(
                            "INSERT INTO edge_refusals (period, reason, count) VALUES (?, ?, ?) "
                            "ON CONFLICT (period, reason) DO UPDATE SET count = edge_refusals.count + excluded.count",
                            (period, reason, n),
                        )
                    tx.run("DELETE FROM edge_refusals WHERE period < ?", (cutoff,))
            except Exception:
                with self._lock:
                    for key, n in pending.items():
                        self._pending[key] = self._pending.get(key, 0) + n
                raise

    def counts(self) -> list[RefusalCount]:
        """Every stored count plus those not yet flushed, oldest hour first."""
        with self._store.transaction() as tx:
            rows = tx.run("SELECT period, reason, count FROM edge_refusals")
        with self._lock:
            pending = dict(self._pending)
        merged: dict[tuple[str, str], int] = {(p, r): int(n) for p, r, n in rows}
        for key, n in pending.items():
            merged[key] = merged.get(key, 0) + n
        return [RefusalCount(p, r, n) for (p, r), n in sorted(merged.items())]

    def total(self, reason: str | None = None) -> int:
        """All refusals counted (of ``reason`` only, when given: ``principal_rate_limited`` counts
        every principal's, ``principal_rate_limited:<name>`` one principal's)."""
        return sum(
            c.count for c in self.counts() if reason is None or c.reason == reason or c.reason.startswith(reason + ":")
        )
