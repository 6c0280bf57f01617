"""The :class:`PLDAccountant`: records leaf events as dominating-pair keys and evaluates lazily.

``compose`` walks the event (:mod:`dpkit.accounting.walk`), checks every leaf and counts it under
a key naming its dominating pair; ``get_epsilon`` / ``get_delta`` turn the counts into PMFs
(:mod:`~dpkit.accounting.pld.mechanisms`), compose them (:mod:`~dpkit.accounting.pld.compose`)
and read the answer, caching the result until the next ``compose``. See
:mod:`dpkit.accounting.pld` for the theorem and its proof.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from fractions import Fraction
from numbers import Integral, Real
from typing import Any

from dpkit import _validate as v
from dpkit._validate import Neighbours
from dpkit.accounting.accountant import Accountant
from dpkit.accounting.events import (
    ApproxDPEvent,
    DPEvent,
    ExponentialEvent,
    GaussianEvent,
    LaplaceEvent,
    PoissonSampledEvent,
    PureDPEvent,
    RandomizedResponseEvent,
)
from dpkit.accounting.pld.compose import (
    _delta_of,
    _epsilon_of,
    _evaluate_at,
    _Evaluation,
    _Spectral,
    _top_loss,
)
from dpkit.accounting.pld.mechanisms import (
    _gaussian_delta_up,
    _gaussian_epsilon_up,
)
from dpkit.accounting.pld.pmf import (
    _PMF,
    _Coarsen,
)
from dpkit.accounting.rounding import decimal_up, down2, to_float_down, to_float_up, up2
from dpkit.accounting.walk import leaves
from dpkit.errors import InvalidParameterError

# ---------------------------------------------------------------------------- accountant

# A handler takes the event of the type it is registered under (``_walk`` dispatches on the
# event's type), so each one names its own event class and the table's value type leaves it open.
_Handler = Callable[["PLDAccountant", Any, int, Counter], None]
_HANDLERS: dict[type, _Handler] = {}


def _handles(*types: type) -> Callable[[_Handler], _Handler]:
    def deco(fn: _Handler) -> _Handler:
        for t in types:
            _HANDLERS[t] = fn
        return fn

    return deco


_SUPPORTED = (
    "GaussianEvent, LaplaceEvent, RandomizedResponseEvent, PureDPEvent, ApproxDPEvent, "
    "ExponentialEvent, PoissonSampledEvent of a GaussianEvent or LaplaceEvent, ComposedEvent, "
    "SelfComposedEvent"
)


def _unsupported(event: object, why: str) -> InvalidParameterError:
    return InvalidParameterError("event", event, f"an event the PLD accountant supports ({_SUPPORTED})", why)


class PLDAccountant(Accountant):
    """Privacy loss distribution accountant: near-exact (ε, δ) for compositions, always an
    upper bound (see the module docstring for the theorem and its proof).

    ``value_discretization_interval`` h is the loss grid (smaller: tighter and slower; the
    discretisation error of connect-the-dots is second order in h). ``neighbours`` is the
    relation every composed event must carry.

    >>> from dpkit.accounting.events import LaplaceEvent
    >>> acc = PLDAccountant().compose(LaplaceEvent(1.0), count=10)
    >>> round(acc.get_epsilon(0.0), 12)   # pure DP: ten Laplace(1) releases are exactly 10-DP
    10.0
    >>> acc.get_epsilon(1e-6) < 10.0
    True
    """

    def __init__(self, value_discretization_interval: float = 1e-4, neighbours: Neighbours = "add_remove") -> None:
        h = value_discretization_interval
        if not isinstance(h, Real) or isinstance(h, bool) or not math.isfinite(float(h)) or not 0 < float(h) <= 1:
            raise InvalidParameterError("value_discretization_interval", h, "a finite number in (0, 1]")
        self._h: float = float(h)
        self._neighbours: Neighbours = v.neighbours(neighbours)
        self._counts: Counter = Counter()
        self._cache: _Evaluation | None = None

    # -- public ---------------------------------------------------------------------

    @property
    def value_discretization_interval(self) -> float:
        return self._h

    @property
    def neighbours(self) -> Neighbours:
        return self._neighbours

    def compose(self, event: DPEvent, count: int = 1) -> PLDAccountant:
        """Record ``count`` adaptive repetitions of ``event``; returns self.

        The whole event tree is checked first; an unsupported or mismatched event raises
        :class:`~dpkit.errors.InvalidParameterError` naming ``event`` and records nothing.
        """
        return super().compose(event, count)

    # -- the Accountant hooks: count every leaf under its dominating pair's key ----------------

    def _check(self, event: DPEvent) -> None:
        self._walk(event, Counter())

    def _price(self, event: DPEvent) -> Counter:
        found: Counter = Counter()
        self._walk(event, found)
        return found

    def _record(self, cost: Counter, count: int) -> None:
        self._counts.update({key: n * count for key, n in cost.items()})
        self._cache = None

    def get_delta(self, epsilon: float) -> float:
        """The smallest δ this accountant proves at ``epsilon`` (an upper bound on the true δ)."""
        if (
            not isinstance(epsilon, Real)
            or isinstance(epsilon, bool)
            or not math.isfinite(float(epsilon))
            or float(epsilon) < 0
        ):
            raise InvalidParameterError("epsilon", epsilon, "a finite number >= 0")
        eps = float(epsilon)
        ev = self._evaluate()
        if not ev.pmfs:
            return 0.0 if ev.mu == 0 else _gaussian_delta_up(ev.mu, eps)
        return max(_delta_of(p, ev.h, eps) for p in ev.pmfs)

    def get_epsilon(self, delta: float) -> float:
        """The smallest ε this accountant proves at ``delta`` (an upper bound on the true ε);
        ``math.inf`` when the recorded mechanisms themselves put more than δ on infinite loss."""
        delta = v.delta(delta)
        ev = self._evaluate()
        if not ev.pmfs:
            if ev.mu == 0:
                return 0.0
            return math.inf if delta == 0 else _gaussian_epsilon_up(ev.mu, delta)
        return max(self._epsilon_one(p, ev.h, delta) for p in ev.pmfs)

    def __repr__(self) -> str:
        return (
            f"PLDAccountant(value_discretization_interval={self._h!r}, neighbours={self._neighbours!r}, "
            f"events={sum(self._counts.values())})"
        )

    # -- internals --------------------------------------------------------------------

    @staticmethod
    def _epsilon_one(p: _PMF | _Spectral, h: float, delta: float) -> float:
        exact_top = _top_loss(p, h)
        if delta == 0:
            return math.inf if exact_top is None else exact_top
        eps = _epsilon_of(p, h, delta)
        if eps is not None:
            return eps if exact_top is None else min(eps, exact_top)
        if exact_top is not None:
            return exact_top
        if p.inf_mech >= delta:
            return math.inf
        floor = p.inf + p.err
        raise InvalidParameterError(
            "delta",
            delta,
            f"a number above {floor:.3g} for the events recorded",
            "Below that, this accountant's numerical floor (tail truncation of at most 1e-15 plus a "
            "proven bound on floating-point error, which grows with the number of compositions) "
            "dominates, so no sound ε can be given",
        )

    def _check_neighbours(self, event: DPEvent) -> None:
        nb = getattr(event, "neighbours", None)
        if nb != self._neighbours:
            raise InvalidParameterError(
                "event",
                event,
                f"an event with neighbours={self._neighbours!r} (this accountant's relation)",
                f"The event was calibrated for {nb!r} neighbours; accounting it under {self._neighbours!r} would "
                f"misstate its privacy (the dp_accounting #464 bug class). Use PLDAccountant(neighbours={nb!r})",
            )

    def _walk(self, event: object, out: Counter) -> None:
        """Count every leaf of ``event`` (with its multiplicity) under its key in ``out``."""
        for leaf, count in leaves(event):
            if not isinstance(leaf, DPEvent):
                raise InvalidParameterError("event", leaf, "a DPEvent (see dpkit.accounting.events)")
            for cls in type(leaf).__mro__:
                handler = _HANDLERS.get(cls)
                if handler is not None:
                    handler(self, leaf, count, out)
                    break
            else:
                raise _unsupported(leaf, f"{type(leaf).__name__} has no privacy loss distribution here")

    def _evaluate(self) -> _Evaluation:
        if self._cache is not None:
            return self._cache
        mu2 = Fraction(0)
        parts = []
        for key, c in self._counts.items():
            if key[0] == "gauss":
                mu2 += c / Fraction(key[1]) ** 2
            else:
                parts.append((key, c))
        mu = up2(math.sqrt(to_float_up(mu2))) if mu2 else 0.0
        if not parts:
            self._cache = _Evaluation(self._h, (), mu)
            return self._cache
        if mu:
            parts.append((("gauss", down2(1.0 / mu)), 1))
        h = self._h
        for _ in range(200):
            try:
                self._cache = _evaluate_at(h, parts)
                return self._cache
            except _Coarsen as c:
                h *= 2.0 ** max(1, math.ceil(math.log2(c.factor)))
        raise AssertionError("grid coarsening did not converge")  # pragma: no cover


@_handles(GaussianEvent)
def _walk_gaussian(acc: PLDAccountant, event: GaussianEvent, count: int, out: Counter) -> None:
    acc._check_neighbours(event)
    out[("gauss", float(event.noise_multiplier))] += count


def _laplace_scale(event: LaplaceEvent) -> float:
    b = event.noise_multiplier
    return to_float_down(b) if isinstance(b, Fraction) else float(b)


@_handles(LaplaceEvent)
def _walk_laplace(acc: PLDAccountant, event: LaplaceEvent, count: int, out: Counter) -> None:
    acc._check_neighbours(event)
    out[("lap", _laplace_scale(event), 1.0)] += count


@_handles(PoissonSampledEvent)
def _walk_poisson(acc: PLDAccountant, event: PoissonSampledEvent, count: int, out: Counter) -> None:
    q = Fraction(event.sampling_probability)
    inner: DPEvent = event.event
    while isinstance(inner, PoissonSampledEvent):  # independent subsampling composes: q·q'
        q *= Fraction(inner.sampling_probability)
        inner = inner.event
    if not isinstance(inner, (GaussianEvent, LaplaceEvent)):
        raise _unsupported(
            event, f"Poisson subsampling is supported for GaussianEvent and LaplaceEvent, not {type(inner).__name__}"
        )
    if acc.neighbours != "add_remove":
        raise _unsupported(
            event,
            "Poisson subsampling is accounted under 'add_remove' neighbours (the relation its "
            "amplification theorem uses); this accountant uses 'replace'",
        )
    acc._check_neighbours(inner)
    qf = to_float_up(q)
    if isinstance(inner, GaussianEvent):
        key = ("gauss", float(inner.noise_multiplier)) if qf >= 1 else ("sgauss", float(inner.noise_multiplier), qf)
    else:
        key = ("lap", _laplace_scale(inner), min(qf, 1.0))
    out[key] += count


@_handles(RandomizedResponseEvent)
def _walk_rr(acc: PLDAccountant, event: RandomizedResponseEvent, count: int, out: Counter) -> None:
    p, k = event.p_truth, event.k
    if not isinstance(p, (Real, Fraction)) or isinstance(p, bool) or not math.isfinite(float(p)) or not 0 <= p <= 1:
        raise _unsupported(event, f"p_truth={p!r} must be a probability in [0, 1]")
    if not isinstance(k, Integral) or isinstance(k, bool) or k < 2:
        raise _unsupported(event, f"k={k!r} must be an integer >= 2")
    acc._check_neighbours(event)
    if acc.neighbours != "replace":  # pragma: no cover - the check above already raised
        raise _unsupported(event, "randomized response is accounted under 'replace' neighbours")
    out[("rr", p, int(k))] += count


@_handles(PureDPEvent, ExponentialEvent)
def _walk_pure(acc: PLDAccountant, event: PureDPEvent | ExponentialEvent, count: int, out: Counter) -> None:
    acc._check_neighbours(event)
    out[("pure", decimal_up(event.epsilon))] += count


@_handles(ApproxDPEvent)
def _walk_approx(acc: PLDAccountant, event: ApproxDPEvent, count: int, out: Counter) -> None:
    acc._check_neighbours(event)
    eps = decimal_up(event.epsilon)
    key = ("pure", eps) if event.delta == 0 else ("approx", eps, float(event.delta))
    out[key] += count
