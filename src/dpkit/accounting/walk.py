"""The one walker over composite events, shared by every accountant.

Two events only combine other events: :class:`~dpkit.accounting.events.ComposedEvent` (adaptive
sequential composition of different events) and
:class:`~dpkit.accounting.events.SelfComposedEvent` (``count`` adaptive repetitions of one event).
Every other event — a mechanism, a stated guarantee, or a sampled event such as
:class:`~dpkit.accounting.events.PoissonSampledEvent`, whose amplification theorem needs to see
its inner event whole — is a *leaf* that an accountant prices with its own rule.

All accountants here are additive over adaptive composition (ε and δ under basic composition,
Dwork & Roth 2014, Thm 3.16; Rényi divergence per order, Mironov 2017, Prop. 1; ρ under zCDP,
Bun & Steinke 2016, Lemma 2.3; privacy loss distributions by convolution, Dwork & Rothblum 2016),
so walking a tree comes down to: visit the leaves in order (the dry pass), sum what the children
cost, and multiply a repeated event's cost by its count.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TypeVar

from dpkit.accounting.events import ComposedEvent, SelfComposedEvent
from dpkit.errors import InvalidParameterError

__all__ = ["COMPOSITES", "is_composite", "leaves", "fold"]

T = TypeVar("T")

#: The event types the walker expands; every accountant supports them when it supports their leaves.
COMPOSITES: tuple[type, ...] = (ComposedEvent, SelfComposedEvent)


def _count(event: SelfComposedEvent) -> int:
    """The repetition count, re-checked: events are frozen and validated when built, but a count
    that got past that (e.g. by ``object.__setattr__``) must not price as 0 repetitions."""
    count = event.count
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        raise InvalidParameterError("event.count", count, "an integer >= 1")
    return count


def is_composite(event: object) -> bool:
    """Whether ``event`` is one the walker expands (a ComposedEvent or SelfComposedEvent)."""
    return isinstance(event, COMPOSITES)


def leaves(event: object, count: int = 1) -> Iterator[tuple[object, int]]:
    """Every leaf of ``event`` with the number of times it is composed, depth first, in order.

    A leaf is anything that is not a composite, including objects that are not events at all:
    the accountant's leaf rule decides what to refuse, and with which message.

    >>> from dpkit.accounting.events import ComposedEvent, LaplaceEvent, PureDPEvent, SelfComposedEvent
    >>> tree = SelfComposedEvent(ComposedEvent([PureDPEvent(1.0), LaplaceEvent(2.0)]), 3)
    >>> [(type(e).__name__, n) for e, n in leaves(tree, 2)]
    [('PureDPEvent', 6), ('LaplaceEvent', 6)]
    """
    if isinstance(event, ComposedEvent):
        for inner in event.events:
            yield from leaves(inner, count)
    elif isinstance(event, SelfComposedEvent):
        yield from leaves(event.event, _count(event) * count)
    else:
        yield event, count


def fold(
    event: object,
    leaf: Callable[[object], T],
    *,
    zero: Callable[[], T],
    add: Callable[[T, T], T],
    scale: Callable[[int, T], T],
    empty: Callable[[ComposedEvent], T] | None = None,
) -> T:
    """The cost of ``event``: ``leaf(e)`` for a leaf, ``zero()`` plus each of a ComposedEvent's
    children's costs (``add``, in order), and ``scale(count, cost)`` for a SelfComposedEvent.
    ``empty(event)``, when given, replaces ``zero()`` for a ComposedEvent with no children (an
    accountant that cannot price an empty composition raises there).

    Evaluating the tree bottom-up (rather than multiplying counts down to the leaves) keeps the
    floating-point operations of accountants that sum floats in the order they always had.

    >>> from fractions import Fraction
    >>> from dpkit.accounting.events import ComposedEvent, PureDPEvent, SelfComposedEvent
    >>> tree = SelfComposedEvent(ComposedEvent([PureDPEvent(0.5), PureDPEvent(0.25)]), 4)
    >>> fold(tree, lambda e: Fraction(e.epsilon), zero=Fraction, add=lambda a, b: a + b, scale=lambda n, c: n * c)
    Fraction(3, 1)
    """
    if isinstance(event, ComposedEvent):
        if empty is not None and not event.events:
            return empty(event)
        total = zero()
        for inner in event.events:
            total = add(total, fold(inner, leaf, zero=zero, add=add, scale=scale, empty=empty))
        return total
    if isinstance(event, SelfComposedEvent):
        return scale(_count(event), fold(event.event, leaf, zero=zero, add=add, scale=scale, empty=empty))
    return leaf(event)
