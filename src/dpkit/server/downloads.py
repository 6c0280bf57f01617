"""How many release downloads each principal may start: ``downloads_per_hour``.

A download spends no budget, but it reads the database and holds a connection while it streams,
so each principal has an allowance: a bucket of ``downloads_per_hour`` downloads, refilled at
that many an hour (a principal who waited an hour may start that many at once; over any long
period the average is at most that many an hour). A download over the allowance is refused with
429 and ``Retry-After`` before any byte of the release is read.

The allowance is kept per server process (``dpkit serve --workers N`` gives a principal N such
allowances): it bounds the load one principal puts on one process, and the budget is not
involved, so nothing needs the database's agreement. At most ``max_keys`` principals are
remembered; the least recently seen is forgotten first (and starts again with a full bucket).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable

from dpkit import _validate as v
from dpkit.server.problems import Problem

__all__ = ["DownloadAllowance"]


class DownloadAllowance:
    """Token buckets of ``per_hour`` downloads per principal (see the module's docstring)."""

    def __init__(self, per_hour: int, *, max_keys: int = 10_000, clock: Callable[[], float] = time.monotonic) -> None:
        self.per_hour = v.positive_int(per_hour, "downloads_per_hour")
        self._rate = self.per_hour / 3600.0
        self._levels: OrderedDict[str, tuple[float, float]] = OrderedDict()
        self._max_keys = max_keys
        self._clock = clock
        self._lock = threading.Lock()

    def take(self, principal: str) -> None:
        """Count one download by ``principal``; Problem 429 (``Retry-After``) when none is left."""
        t = self._clock()
        with self._lock:
            level, last = self._levels.pop(principal, (float(self.per_hour), t))
            level = min(float(self.per_hour), level + (t - last) * self._rate)
            if level < 1.0:
                self._levels[principal] = (level, t)
                wait = (1.0 - level) / self._rate
                raise Problem(
                    429,
                    "rate_limited",
                    f"{principal!r} has started its {self.per_hour:,} downloads of this hour; retry in {wait:.0f} s",
                    headers={"Retry-After": str(max(1, int(wait + 0.999)))},
                    setting="downloads_per_hour",
                )
            self._levels[principal] = (level - 1.0, t)
            while len(self._levels) > self._max_keys:
                self._levels.popitem(last=False)
