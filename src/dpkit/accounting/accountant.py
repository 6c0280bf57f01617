"""The base class every accountant derives from.

An accountant turns a sequence of events into an (ε, δ) guarantee. :meth:`Accountant.compose`
is written once, here, and always runs in the same order:

1. the count check (an integer >= 1);
2. the dry pass: the whole event tree, everything nested in it included, is checked and priced
   without touching the accountant's state, so an unsupported event or a neighbour-relation
   mismatch raises :class:`~dpkit.errors.InvalidParameterError` before anything is recorded
   (as dp_accounting's ``PrivacyAccountant.compose`` does);
3. the recording, which cannot fail.

Subclasses implement three small hooks: :meth:`Accountant._check` (the dry pass; raise on what
cannot be accounted), :meth:`Accountant._price` (the cost of one run of the event, computed after
the check) and :meth:`Accountant._record` (add ``count`` runs of that cost to the state). Composite
events are walked by :mod:`dpkit.accounting.walk`, shared by all accountants.

Accountants are plain objects the caller owns, never module state. ``isinstance(x, Accountant)``
is also true for any object with ``supports``, ``compose``, ``get_epsilon`` and ``get_delta``
methods, so a duck-typed accountant can still be handed to a :class:`~dpkit.budget.Budget`.

ε = 0 is a valid argument of every ``get_delta``: it asks for the δ of a pure-DP statement and
gets a sound upper bound (1.0 when nothing tighter can be proved).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from typing import Any

from dpkit import _validate as v
from dpkit.accounting.events import DPEvent
from dpkit.errors import InvalidParameterError

__all__ = ["Accountant", "check_epsilon"]

_METHODS = ("supports", "compose", "get_epsilon", "get_delta")


def check_epsilon(epsilon: object) -> float:
    """The ε argument of ``get_delta``: a finite number >= 0 (ε = 0 is valid everywhere)."""
    if not v._is_real(epsilon) or not math.isfinite(float(epsilon)) or float(epsilon) < 0:  # type: ignore[arg-type]
        raise InvalidParameterError("epsilon", epsilon, "a finite number >= 0")
    return float(epsilon)  # type: ignore[arg-type]


class Accountant(ABC):
    """An accountant: ``compose(event, count)``, ``get_epsilon(delta)``, ``get_delta(epsilon)``,
    ``supports(event)``."""

    __slots__ = ()

    @classmethod
    def __subclasshook__(cls, other: type) -> bool:
        # Structural, like the collections.abc interfaces: any class with the four methods is an
        # accountant for isinstance/issubclass (user-written accountants need not inherit).
        if cls is Accountant and all(any(m in base.__dict__ for base in other.__mro__) for m in _METHODS):
            return True
        return NotImplemented

    # -- the template ----------------------------------------------------------------------------

    def supports(self, event: DPEvent) -> bool:
        """Whether :meth:`compose` can account for ``event`` (and everything nested in it)."""
        try:
            self._check(event)
        except InvalidParameterError:
            return False
        return True

    def compose(self, event: DPEvent, count: int = 1) -> Any:
        """Record ``count`` adaptive repetitions of ``event``; returns self. Raises
        :class:`~dpkit.errors.InvalidParameterError` (recording nothing) for a ``count`` that is
        not an integer >= 1 or an event this accountant cannot account for."""
        count = v.positive_int(count, "count")
        self._check(event)  # the dry pass: raises before anything is recorded
        cost = self._price(event)
        self._record(cost, count)  # cannot raise
        return self

    # -- the hooks -------------------------------------------------------------------------------

    @abstractmethod
    def _check(self, event: DPEvent) -> None:
        """Raise :class:`~dpkit.errors.InvalidParameterError` if ``event`` (or anything nested in
        it) cannot be accounted here; change nothing."""

    @abstractmethod
    def _price(self, event: DPEvent) -> Any:
        """The cost of one run of a checked ``event``; changes nothing."""

    @abstractmethod
    def _record(self, cost: Any, count: int) -> None:
        """Add ``count`` runs of ``cost`` to the state. Must not raise."""

    @abstractmethod
    def get_epsilon(self, delta: float) -> float:
        """The smallest ε this accountant can prove for the events so far at this δ (rounded up)."""

    @abstractmethod
    def get_delta(self, epsilon: float) -> float:
        """The smallest δ this accountant can prove at this ε (rounded up); ε = 0 is valid."""
