"""The small interface every accountant implements.

An accountant turns a sequence of events into an (ε, δ) guarantee. ``compose`` first checks that
the event is supported (a dry pass that raises before anything changes, as dp_accounting does)
and only then records it; accountants are plain objects the caller owns, never module state.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from dpkit.accounting.events import DPEvent

__all__ = ["Accountant"]


@runtime_checkable
class Accountant(Protocol):
    def supports(self, event: DPEvent) -> bool:
        """Whether :meth:`compose` can account for ``event`` (and everything nested in it)."""
        ...

    def compose(self, event: DPEvent, count: int = 1) -> Accountant:
        """Record ``count`` adaptive repetitions of ``event``; returns self. Raises
        :class:`~dpkit.errors.InvalidParameterError` (recording nothing) for unsupported events."""
        ...

    def get_epsilon(self, delta: float) -> float:
        """The smallest ε this accountant can prove for the events so far at this δ (rounded up)."""
        ...

    def get_delta(self, epsilon: float) -> float:
        """The smallest δ this accountant can prove at this ε (rounded up)."""
        ...
