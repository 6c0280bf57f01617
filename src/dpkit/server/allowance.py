"""Hourly allowances per principal: a bucket of ``per_hour`` units, refilled at that many an hour.

Two of the service's per-principal limits are allowances of this kind, both kept per server
process (``dpkit serve --workers N`` gives a principal N of them) and both refused with 429 and
``Retry-After`` before anything is read or paid:

* ``downloads_per_hour`` — release downloads started (:mod:`dpkit.server.routes.releases`): a
  download spends no budget, but it reads the database and holds a connection while it streams;
* ``cpu_seconds_per_hour`` — seconds of answer time (:mod:`dpkit.server.pacing`), charged with
  each paid request's *budget*, which is public, never with the time its work took.

A principal who waited an hour may use the whole allowance at once; over any long period the
average is at most ``per_hour`` an hour. At most ``max_keys`` principals are remembered; the
least recently seen is forgotten first (and starts again with a full bucket).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable

from dpkit import _validate as v
from dpkit.server.problems import Problem

__all__ = ["HourlyAllowance"]


class HourlyAllowance:
    """Token buckets of ``per_hour`` units per principal (see the module's docstring); ``setting``
    names the limit in refusals, ``unit`` what is counted ("downloads", "s of answer time")."""

    def __init__(
        self,
        per_hour: float,
        setting: str,
        unit: str,
        *,
        max_keys: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.per_hour = float(v.positive(per_hour, setting))
        self.setting, self.unit = setting, unit
        self._rate = self.per_hour / 3600.0
        self._levels: OrderedDict[str, tuple[float, float]] = OrderedDict()
        self._max_keys = max_keys
        self._clock = clock
        self._lock = threading.Lock()

    def charge(self, principal: str, amount: float = 1.0) -> None:
        """Spend ``amount`` of ``principal``'s allowance; Problem 429 (``Retry-After``) when not
        that much is left (nothing is spent then)."""
        t = self._clock()
        with self._lock:
            level, last = self._levels.pop(principal, (self.per_hour, t))
            level = min(self.per_hour, level + (t - last) * self._rate)
            if level < amount:
                self._levels[principal] = (level, t)
                wait = (amount - level) / self._rate
                raise Problem(
                    429,
                    "rate_limited",
                    f"{principal!r} has used its {self.per_hour:,g} {self.unit} of this hour; retry in {wait:.0f} s",
                    headers={"Retry-After": str(max(1, int(wait + 0.999)))},
                    setting=self.setting,
                )
            self._levels[principal] = (level - amount, t)
            while len(self._levels) > self._max_keys:
                self._levels.popitem(last=False)
