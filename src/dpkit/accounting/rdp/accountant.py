"""The RDP accountant: the table of per-event RDP rules and :class:`RDPAccountant`.

Every leaf event type has a rule (a neighbour check and its RDP curve); composite events are
walked by :mod:`dpkit.accounting.walk` and add up order by order (Mironov 2017, Prop 1).
Subsampled Gaussians are priced by the amplification bounds of Mironov, Talwar & Zhang 2019
(Poisson, add/remove neighbours) and Wang, Balle & Kasiviswanathan 2019, Thm 9 (sampling without
replacement, replace-one neighbours).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Sequence
from fractions import Fraction

import numpy as np

from dpkit import _validate as v
from dpkit._validate import Neighbours
from dpkit.accounting._shared import CheckFunction, Registry, check_leaf_neighbours
from dpkit.accounting.accountant import Accountant, check_epsilon
from dpkit.accounting.events import (
    ApproxDPEvent,
    DPEvent,
    ExponentialEvent,
    GaussianEvent,
    LaplaceEvent,
    PoissonSampledEvent,
    PureDPEvent,
    RandomizedResponseEvent,
    SampledWithoutReplacementEvent,
)
from dpkit.accounting.rdp.conversion import _delta_and_order, _epsilon_and_order
from dpkit.accounting.rdp.curves import (
    FloatArray,
    Orders,
    _laplace_rdp,
    _poisson_gaussian_rdp_cached,
    _pure_rdp,
    _readonly,
    _rr_rdp,
    _swor_gaussian_rdp_cached,
    _validate_orders,
)
from dpkit.accounting.rounding import decimal_up, to_float_up
from dpkit.accounting.walk import fold
from dpkit.errors import InvalidParameterError

__all__ = ["RDPAccountant", "register_rdp", "event_rdp"]


# --------------------------------------------------------------------------------------------
# The registry: event type -> (neighbour check, RDP curve)
# --------------------------------------------------------------------------------------------

RDPFunction = Callable[[DPEvent, Orders], FloatArray]

_REGISTRY: Registry[RDPFunction] = Registry("RDP")


def register_rdp(event_type: type[DPEvent], rdp: RDPFunction, check: CheckFunction | None = None) -> None:
    """Teach the RDP accountant a new event type: ``rdp(event, orders)`` returns the RDP at each
    order; ``check(event, neighbours)`` raises InvalidParameterError when the event cannot be
    accounted under ``neighbours`` (default: the event's own ``neighbours`` field must match)."""
    _REGISTRY.register(event_type, rdp, check)


def event_rdp(event: DPEvent, orders: Sequence[float] | None = None) -> FloatArray:
    """The RDP curve of ``event`` at ``orders`` (no neighbour checks; see RDPAccountant)."""
    return _event_rdp(event, _validate_orders(orders))


def _event_rdp(event: DPEvent, orders: Orders) -> FloatArray:
    # RDP composes by addition at every order (Mironov 2017, Prop 1); a repeated event's curve
    # is multiplied by its count. The walker sums children in order, as this always did.
    return fold(
        event,
        lambda e: _REGISTRY.rule_for(e).compute(e, orders),  # type: ignore[arg-type]
        zero=lambda: np.zeros(len(orders)),
        add=operator.add,
        scale=operator.mul,
    )


def _check_approx(event: DPEvent, neighbours: Neighbours) -> None:
    assert isinstance(event, ApproxDPEvent)
    if event.delta > 0:
        raise InvalidParameterError(
            "event",
            event,
            "an event the RDP accountant supports (ApproxDPEvent only with delta = 0)",
            "An (ε, δ)-DP mechanism with δ > 0 may have infinite Rényi divergence at every order; "
            "account it with the PLD or a basic/advanced composition accountant",
        )
    check_leaf_neighbours(event, neighbours)


def _effective_noise_multiplier(event: DPEvent, neighbours: Neighbours, outer: str) -> float:
    """σ of the single Gaussian equivalent to a nest of Gaussians (Σ σ_i^{-2} = σ^{-2};
    Mironov, Talwar & Zhang 2019, Sec 3), checking each leaf's neighbours."""
    inv = _inverse_variance(event, neighbours, outer)
    return 1.0 / math.sqrt(inv)


def _inverse_variance(event: DPEvent, neighbours: Neighbours, outer: str) -> float:
    def refuse(e: object) -> float:
        raise InvalidParameterError(
            "event",
            e,
            f"a GaussianEvent (or a ComposedEvent / SelfComposedEvent of GaussianEvents) inside {outer}",
            "Subsampling amplification is implemented for the Gaussian mechanism only",
        )

    def leaf(e: object) -> float:
        if not isinstance(e, GaussianEvent):
            return refuse(e)
        check_leaf_neighbours(e, neighbours)
        return 1.0 / (e.noise_multiplier * e.noise_multiplier)

    # Σ count/σ_i² over the Gaussians (an empty composition has no noise to amplify: refused).
    return fold(event, leaf, zero=float, add=operator.add, scale=operator.mul, empty=refuse)


def _check_poisson(event: DPEvent, neighbours: Neighbours) -> None:
    assert isinstance(event, PoissonSampledEvent)
    if neighbours != "add_remove":
        raise InvalidParameterError(
            "neighbours",
            neighbours,
            "'add_remove' for PoissonSampledEvent",
            "Poisson subsampling amplification (Mironov, Talwar & Zhang 2019) is proved for "
            "add/remove neighbours; under replace use SampledWithoutReplacementEvent",
        )
    _effective_noise_multiplier(event.event, neighbours, "PoissonSampledEvent")


def _poisson_rdp(event: DPEvent, orders: Orders) -> FloatArray:
    assert isinstance(event, PoissonSampledEvent)
    sigma = _effective_noise_multiplier(event.event, "add_remove", "PoissonSampledEvent")
    return _poisson_gaussian_rdp_cached(float(event.sampling_probability), sigma, orders)


def _check_swor(event: DPEvent, neighbours: Neighbours) -> None:
    assert isinstance(event, SampledWithoutReplacementEvent)
    if neighbours != "replace":
        raise InvalidParameterError(
            "neighbours",
            neighbours,
            "'replace' for SampledWithoutReplacementEvent",
            "Its bound (Wang, Balle & Kasiviswanathan 2019, Thm 9) is for replace-one neighbours on "
            "a dataset of public size; create RDPAccountant(neighbours='replace')",
        )
    _effective_noise_multiplier(event.event, neighbours, "SampledWithoutReplacementEvent")


def _swor_rdp(event: DPEvent, orders: Orders) -> FloatArray:
    assert isinstance(event, SampledWithoutReplacementEvent)
    sigma = _effective_noise_multiplier(event.event, "replace", "SampledWithoutReplacementEvent")
    return _swor_gaussian_rdp_cached(event.sample_size / event.population_size, sigma, orders)


def _gaussian_event_rdp(event: DPEvent, orders: Orders) -> FloatArray:
    assert isinstance(event, GaussianEvent)
    s = float(event.noise_multiplier)
    return np.asarray(orders) / (2.0 * s * s)


def _laplace_event_rdp(event: DPEvent, orders: Orders) -> FloatArray:
    assert isinstance(event, LaplaceEvent)
    return _laplace_rdp(to_float_up(1 / Fraction(event.noise_multiplier)), orders)


def _rr_event_rdp(event: DPEvent, orders: Orders) -> FloatArray:
    assert isinstance(event, RandomizedResponseEvent)
    p = v.probability(event.p_truth, "p_truth", low_open=False, high_open=False)
    k = v.positive_int(event.k, "k", minimum=2)
    return _rr_rdp(p, k, orders)


def _check_rr(event: DPEvent, neighbours: Neighbours) -> None:
    assert isinstance(event, RandomizedResponseEvent)
    v.probability(event.p_truth, "p_truth", low_open=False, high_open=False)
    v.positive_int(event.k, "k", minimum=2)
    check_leaf_neighbours(event, neighbours)


def _pure_event_rdp(event: DPEvent, orders: Orders) -> FloatArray:
    assert isinstance(event, (PureDPEvent, ApproxDPEvent))
    return _pure_rdp(decimal_up(event.epsilon), orders)


def _exponential_event_rdp(event: DPEvent, orders: Orders) -> FloatArray:
    assert isinstance(event, ExponentialEvent)
    eps = decimal_up(event.epsilon)
    return np.minimum(_pure_rdp(eps, orders), np.asarray(orders) * eps * eps / 8.0)


register_rdp(GaussianEvent, _gaussian_event_rdp)
register_rdp(LaplaceEvent, _laplace_event_rdp)
register_rdp(RandomizedResponseEvent, _rr_event_rdp, _check_rr)
register_rdp(PureDPEvent, _pure_event_rdp)
register_rdp(ExponentialEvent, _exponential_event_rdp)
register_rdp(ApproxDPEvent, _pure_event_rdp, _check_approx)
register_rdp(PoissonSampledEvent, _poisson_rdp, _check_poisson)
register_rdp(SampledWithoutReplacementEvent, _swor_rdp, _check_swor)


# --------------------------------------------------------------------------------------------
# The accountant
# --------------------------------------------------------------------------------------------


class RDPAccountant(Accountant):
    """The moments accountant: keeps R(α) per order, composes by addition, converts to (ε, δ).

    Parameters
    ----------
    orders:
        Rényi orders α > 1 (default :data:`DEFAULT_RDP_ORDERS`); stored sorted and deduplicated.
    neighbours:
        ``"add_remove"`` (default; what Poisson subsampling needs) or ``"replace"`` (what sampling
        without replacement and randomized response need). Every event must carry the same
        relation.

    >>> acc = RDPAccountant().compose(GaussianEvent(1.0), count=10)
    >>> acc.get_epsilon(1e-5) < acc.get_epsilon(1e-5, conversion="classic")
    True
    """

    __slots__ = ("_orders", "_alphas", "_rdp", "_neighbours")

    def __init__(self, orders: Sequence[float] | None = None, neighbours: Neighbours = "add_remove") -> None:
        self._orders = _validate_orders(orders)
        self._alphas = _readonly(np.asarray(self._orders, dtype=np.float64))
        self._rdp = np.zeros(len(self._orders))
        self._neighbours: Neighbours = v.neighbours(neighbours)

    def __repr__(self) -> str:
        return f"RDPAccountant(neighbours={self._neighbours!r}, orders={len(self._orders)})"

    @property
    def orders(self) -> FloatArray:
        return np.array(self._alphas)

    @property
    def rdp(self) -> FloatArray:
        """The composed RDP at each order (a copy)."""
        return np.array(self._rdp)

    @property
    def neighbours(self) -> Neighbours:
        return self._neighbours

    # -- the Accountant hooks: check every leaf, price the curve, add it up ---------------------

    def _check(self, event: DPEvent) -> None:
        _REGISTRY.check(event, self._neighbours)

    def _price(self, event: DPEvent) -> FloatArray:
        return _event_rdp(event, self._orders)

    def _record(self, cost: FloatArray, count: int) -> None:
        total = self._rdp + count * cost
        self._rdp = np.where(total > 0, np.nextafter(total, np.inf), total)

    def compose(self, event: DPEvent, count: int = 1) -> RDPAccountant:
        """Record ``count`` repetitions of ``event``. Everything is checked and computed before the
        state changes, so a raise records nothing."""
        return super().compose(event, count)

    def get_epsilon(self, delta: float, conversion: str = "improved") -> float:
        """The smallest ε over the orders at this δ, rounded up; δ = 0 gives ∞ once anything is
        spent (see the module docstring)."""
        return self.get_epsilon_and_order(delta, conversion)[0]

    def get_epsilon_and_order(self, delta: float, conversion: str = "improved") -> tuple[float, float]:
        """(ε, the order that attains it); the order is ∞ when δ = 0."""
        return _epsilon_and_order(self._alphas, self._rdp, v.delta(delta), conversion)

    def get_delta(self, epsilon: float, conversion: str = "improved") -> float:
        """The smallest δ over the orders at this ε >= 0, rounded up and capped at 1."""
        return self.get_delta_and_order(epsilon, conversion)[0]

    def get_delta_and_order(self, epsilon: float, conversion: str = "improved") -> tuple[float, float]:
        return _delta_and_order(self._alphas, self._rdp, check_epsilon(epsilon), conversion)
