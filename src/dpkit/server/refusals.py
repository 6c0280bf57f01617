"""Requests refused before authentication: throttled per client address, counted in bounded form.

Anyone who can reach the service can send requests without a key. Those are refused 401 before
the service does any work for them, and they are *not* entries of the hash-chained audit log
(one chained row per unauthenticated request would let anyone grow the permanent log without
bound and slow every authenticated request that waits on the chain's lock). Instead:

* :class:`AddressLimiter` keeps a token bucket per client address, charged by each refused
  request. An address whose bucket is empty gets 429 for every request (with or without a key)
  until it refills, before its key is even looked up. It tracks at most ``max_addresses``
  addresses (least recently seen forgotten first), so its memory is bounded whatever the number
  of addresses a client uses.
* :class:`RefusalCounter` counts refusals per hour and reason in memory and adds the counts to
  the small table ``edge_refusals`` of the service database at most once per ``flush_every``
  seconds (one upsert per reason and hour, pruned after ``keep_days`` days): a table of at most
  a few rows per hour, whatever the traffic.

Behind a reverse proxy every client has the proxy's address: run uvicorn with
``--forwarded-allow-ips`` set to the proxy, or give the limiter a larger burst.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from dpkit import _validate as v
from dpkit.server.store import ServiceStore

__all__ = ["TokenBuckets", "AddressLimiter", "RefusalCounter", "REASONS"]

#: Why a request was refused before authentication.
REASONS = ("unauthenticated", "address_rate_limited", "ledger_unavailable")

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


@dataclass(frozen=True)
class RefusalCount:
    """Refusals of one reason in one hour (``period``: ``YYYY-MM-DDTHH`` UTC)."""

    period: str
    reason: str
    count: int

    def to_dict(self) -> dict[str, Any]:
        return {"period": self.period, "reason": self.reason, "count": self.count}


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
        """All refusals counted (of ``reason`` only, when given)."""
        return sum(c.count for c in self.counts() if reason is None or c.reason == reason)
