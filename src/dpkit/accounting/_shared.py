"""Pieces every accountant needs: the neighbour-relation check, rule lookup by event type, and
the exact ε of randomized response."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from numbers import Integral
from typing import Generic, TypeVar

from dpkit._validate import Neighbours
from dpkit.accounting.events import DPEvent, RandomizedResponseEvent
from dpkit.accounting.rounding import log_up
from dpkit.accounting.walk import COMPOSITES, leaves
from dpkit.errors import InvalidParameterError

__all__ = ["check_leaf_neighbours", "rule_for", "rr_epsilon", "Registry", "Rule", "CheckFunction"]

_COMPOSITE_NAMES = tuple(c.__name__ for c in COMPOSITES)
R = TypeVar("R")
F = TypeVar("F")
CheckFunction = Callable[[DPEvent, Neighbours], None]


def check_leaf_neighbours(event: DPEvent, neighbours: Neighbours) -> None:
    """Refuse an event calibrated for the other neighbour relation than the accountant's."""
    own = getattr(event, "neighbours", neighbours)
    if own != neighbours:
        raise InvalidParameterError(
            "neighbours",
            own,
            f"{neighbours!r}, the accountant's neighbouring relation",
            f"{type(event).__name__} was calibrated for {own!r} neighbours; accounting it under "
            f"{neighbours!r} would misstate the guarantee. Use an accountant with neighbours={own!r}",
        )


def rule_for(
    rules: dict[type[DPEvent], R], event: DPEvent, accountant: str, hint: str = "", also: tuple[str, ...] = ()
) -> R:
    """The registered rule for the event's type (or its nearest registered base class); ``also``
    names further supported types for the error message (the composites the walker expands)."""
    for cls in type(event).__mro__:
        rule = rules.get(cls)
        if rule is not None:
            return rule
    supported = ", ".join(sorted({c.__name__ for c in rules} | set(also)))
    raise InvalidParameterError("event", event, f"an event the {accountant} accountant supports ({supported})", hint)


def rr_epsilon(event: RandomizedResponseEvent) -> Fraction:
    """|ln(p·(k − 1)/(1 − p))|, rounded up (the absolute value covers p < 1/k, where the
    mechanism favours the lie: the likelihood ratio is then bounded by its reciprocal)."""
    p, k = event.p_truth, event.k
    ok_p = isinstance(p, (int, float, Fraction)) and not isinstance(p, bool) and 0 < p < 1
    ok_k = isinstance(k, Integral) and not isinstance(k, bool) and k >= 2
    if not (ok_p and ok_k):
        raise InvalidParameterError(
            "event", event, "a RandomizedResponseEvent with 0 < p_truth < 1 and an integer k >= 2"
        )
    ratio = Fraction(p) * (int(k) - 1) / (1 - Fraction(p))
    if ratio == 1:
        return Fraction(0)
    return Fraction(log_up(ratio if ratio >= 1 else 1 / ratio))


@dataclass(frozen=True)
class Rule(Generic[F]):
    """How an accountant handles one event type: what it computes, and the neighbour check."""

    compute: F
    check: CheckFunction


class Registry(Generic[F]):
    """Leaf event type → :class:`Rule`, looked up along the event's class hierarchy (a table, not
    an if/elif ladder, so a new event type is one registration). Each accountant module holds one.

    Composite events (:data:`dpkit.accounting.walk.COMPOSITES`) have no rule: :meth:`check` walks
    them with :func:`dpkit.accounting.walk.leaves` and checks every leaf, in order."""

    def __init__(self, accountant: str, hint: str = "") -> None:
        self.rules: dict[type[DPEvent], Rule[F]] = {}
        self._accountant = accountant
        self._hint = hint

    def register(self, event_type: type[DPEvent], compute: F, check: CheckFunction | None = None) -> None:
        self.rules[event_type] = Rule(compute, check or check_leaf_neighbours)

    def rule_for(self, event: DPEvent) -> Rule[F]:
        return rule_for(self.rules, event, self._accountant, self._hint, _COMPOSITE_NAMES)

    def check(self, event: DPEvent, neighbours: Neighbours) -> None:
        """The dry pass: raise InvalidParameterError for the first leaf (depth first) that is not
        supported or not valid under ``neighbours``."""
        for leaf, _ in leaves(event):
            self.rule_for(leaf).check(leaf, neighbours)  # type: ignore[arg-type]

    def supports(self, event: DPEvent, neighbours: Neighbours) -> bool:
        try:
            self.check(event, neighbours)
        except InvalidParameterError:
            return False
        return True
