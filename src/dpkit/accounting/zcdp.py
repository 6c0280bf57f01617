"""Zero-concentrated differential privacy (zCDP) accounting.

A mechanism is ρ-zCDP (Bun & Steinke 2016, Def 1.1) if D_α(M(x) ‖ M(x')) <= ρα for every
α > 1 and all neighbours x, x'. zCDP composes by adding ρ, and one number describes the whole
RDP curve, so the accountant keeps the total ρ as an exact rational and rounds up only once.

Per-event ρ (registered in a table keyed by event type):

* ``GaussianEvent(σ)``: ρ = 1/(2σ²) (Bun & Steinke 2016, Prop 1.6; discrete Gaussian:
  Canonne–Kamath–Steinke 2020, Thm 14).
* ``PureDPEvent(ε)``, ``LaplaceEvent(b)`` (ε = 1/b), ``RandomizedResponseEvent`` (its ε) and
  ``ApproxDPEvent(ε, 0)``: ρ = min(ε²/2, ε). ε²/2 is Bun & Steinke 2016 Prop 1.4; ρ = ε also
  holds since D_α <= ε <= εα for α > 1, and is smaller once ε > 2.
* ``ExponentialEvent(ε)``: ρ = min(ε²/8, ε) — ε-bounded range (Cesar & Rogers 2021, Lemma 3.2).
* ``ComposedEvent`` / ``SelfComposedEvent``: sums (count multiplies).
* Unsupported (raise :class:`~dpkit.errors.InvalidParameterError` naming ``event``):
  ``ApproxDPEvent`` with δ > 0 and the subsampled events (subsampling does not amplify zCDP in
  closed form; use :class:`~dpkit.accounting.rdp.RDPAccountant`).

Conversion to (ε, δ): the smaller of the classic ε = ρ + 2√(ρ ln(1/δ)) (Bun & Steinke 2016,
Prop 1.3) and the improved bound of Canonne–Kamath–Steinke 2020, Prop 12, applied to the RDP
curve αρ and minimised over α numerically:

    ε = inf_{α>1}  αρ + [ln(1/δ) + (α − 1) ln(1 − 1/α) − ln α] / (α − 1),

and ε = 0 when δ >= √(1 − e^{−ρ}) (KL <= ρ, then Bretagnolle–Huber). Any α gives a valid bound,
so the numerical minimiser only affects tightness; the value at the chosen α is evaluated with an
allowance for its floating-point error and rounded up. δ = 0 gives ε = ∞ unless ρ = 0.

>>> acc = ZCDPAccountant().compose(GaussianEvent(1.0), count=2)
>>> acc.rho
1.0
>>> round(zcdp_to_approx_dp(0.5, 1e-5, conversion="classic"), 6)
5.298526
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from fractions import Fraction

import numpy as np

from dpkit import _validate as v
from dpkit._validate import Neighbours, decimal_fraction
from dpkit.accounting._shared import CheckFunction, Registry, check_leaf_neighbours, rr_epsilon
from dpkit.accounting.accountant import Accountant, check_epsilon
from dpkit.accounting.events import (
    ApproxDPEvent,
    DPEvent,
    ExponentialEvent,
    GaussianEvent,
    LaplaceEvent,
    PureDPEvent,
    RandomizedResponseEvent,
)
from dpkit.accounting.rounding import to_float_up
from dpkit.accounting.walk import fold
from dpkit.errors import InvalidParameterError

__all__ = [
    "ZCDPAccountant",
    "register_zcdp",
    "event_rho",
    "rho_from_gaussian",
    "rho_from_pure",
    "rho_from_bounded_range",
    "zcdp_to_approx_dp",
    "zcdp_to_delta",
    "rho_for_approx_dp",
]

_U = 2.0**-52
_GRID_T = np.linspace(-25.0, 30.0, 221)  # α − 1 = e^t, step 0.25 in t
_GRID_A1 = np.exp(_GRID_T)


# --------------------------------------------------------------------------------------------
# ρ of single mechanisms (exact rationals)
# --------------------------------------------------------------------------------------------


def _rho_pure_exact(eps: Fraction) -> Fraction:
    return min(eps * eps / 2, eps)


def _rho_bounded_range_exact(eps: Fraction) -> Fraction:
    return min(eps * eps / 8, eps)


def rho_from_gaussian(noise_multiplier: float) -> float:
    """ρ = 1/(2σ²) for Gaussian noise σ = noise_multiplier × ℓ2 sensitivity, rounded up.

    >>> rho_from_gaussian(1.0)
    0.5
    """
    s = Fraction(v.positive(noise_multiplier, "noise_multiplier"))
    return to_float_up(1 / (2 * s * s))


def rho_from_pure(epsilon: float) -> float:
    """ρ = min(ε²/2, ε) for an ε-DP mechanism, rounded up (ε²/2 whenever ε <= 2).

    >>> rho_from_pure(1.0)
    0.5
    """
    return to_float_up(_rho_pure_exact(Fraction(v.epsilon(epsilon))))


def rho_from_bounded_range(epsilon: float) -> float:
    """ρ = min(ε²/8, ε) for an ε-bounded-range mechanism (the exponential mechanism), rounded up."""
    return to_float_up(_rho_bounded_range_exact(Fraction(v.epsilon(epsilon))))


# --------------------------------------------------------------------------------------------
# Conversions
# --------------------------------------------------------------------------------------------


def _improved_eps(a1: np.ndarray | float, rho: float, log_delta: float) -> np.ndarray | float:
    """CKS 2020 Prop 12 at α = 1 + a1 on the curve αρ."""
    l1p = np.log1p(a1)
    return (1.0 + a1) * rho + np.log(a1) - l1p - (log_delta + l1p) / a1


def _improved_eps_up(a1: float, rho: float, log_delta: float) -> float:
    l1p = math.log1p(a1)
    terms = ((1.0 + a1) * rho, math.log(a1), -l1p, -(log_delta + l1p) / a1)
    value = math.fsum(terms)
    return value + 16.0 * _U * sum(abs(t) for t in terms)


def _improved_log_delta(a1: np.ndarray | float, rho: float, eps: float) -> np.ndarray | float:
    """CKS 2020 Prop 12 solved for δ: ln δ = (α − 1)(αρ − ε + ln(1 − 1/α)) − ln α."""
    l1p = np.log1p(a1)
    return a1 * ((1.0 + a1) * rho - eps + np.log(a1) - l1p) - l1p


def _improved_log_delta_up(a1: float, rho: float, eps: float) -> float:
    l1p = math.log1p(a1)
    inner = ((1.0 + a1) * rho, -eps, math.log(a1), -l1p)
    value = a1 * math.fsum(inner) - l1p
    return value + 16.0 * _U * (a1 * sum(abs(t) for t in inner) + l1p)


def _argmin_a1(f: Callable[[np.ndarray | float], np.ndarray | float]) -> float:
    """α − 1 minimising ``f``: a grid in t = ln(α − 1), then golden-section search on the grid
    cell either side of the best point (any α gives a valid bound; this only buys tightness)."""
    with np.errstate(over="ignore", invalid="ignore"):
        values = np.asarray(f(_GRID_A1), dtype=np.float64)
    values = np.where(np.isnan(values), np.inf, values)
    i = int(np.argmin(values))
    lo, hi = float(_GRID_T[max(i - 1, 0)]), float(_GRID_T[min(i + 1, _GRID_T.size - 1)])
    g = (math.sqrt(5.0) - 1.0) / 2.0
    a, b = hi - g * (hi - lo), lo + g * (hi - lo)
    fa, fb = float(f(math.exp(a))), float(f(math.exp(b)))
    for _ in range(80):  # the bracket shrinks to 0.5 × 0.618^80 ≈ 1e-17
        if fa < fb:
            hi, b, fb = b, a, fa
            a = hi - g * (hi - lo)
            fa = float(f(math.exp(a)))
        else:
            lo, a, fa = a, b, fb
            b = lo + g * (hi - lo)
            fb = float(f(math.exp(b)))
    t_best, f_best = (a, fa) if fa < fb else (b, fb)
    return math.exp(t_best) if f_best <= float(values[i]) else float(_GRID_A1[i])


def _kl_suffices(rho: float, delta: float) -> bool:
    """δ >= √(1 − e^{−ρ}) with a margin: then the total variation distance is <= δ and ε = 0."""
    return delta * delta * (1.0 - 8.0 * _U) > -math.expm1(-rho)


def _classic_eps_up(rho: float, log_delta: float) -> float:
    """Bun & Steinke 2016 Prop 1.3: ε = ρ + 2√(ρ ln(1/δ)), rounded up."""
    value = rho + 2.0 * math.sqrt(rho * -log_delta)
    return math.nextafter(value * (1.0 + 8.0 * _U), math.inf)


def _epsilon(rho: float, delta: float, conversion: str) -> float:
    fn = _EPS_CONVERSIONS.get(conversion) if isinstance(conversion, str) else None
    if fn is None:
        raise InvalidParameterError("conversion", conversion, "'improved' or 'classic'")
    if rho == 0.0:
        return 0.0
    if delta == 0.0:
        return math.inf
    return fn(rho, delta)


def _eps_classic(rho: float, delta: float) -> float:
    return _classic_eps_up(rho, math.log(delta))


def _eps_improved(rho: float, delta: float) -> float:
    if _kl_suffices(rho, delta):
        return 0.0
    log_delta = math.log(delta)
    a1 = _argmin_a1(lambda x: _improved_eps(x, rho, log_delta))
    improved = max(math.nextafter(_improved_eps_up(a1, rho, log_delta), math.inf), 0.0)
    return min(improved, _classic_eps_up(rho, log_delta))


def _delta_classic(rho: float, eps: float) -> float:
    """min over α of e^{(α−1)(αρ−ε)}: at α = (ε + ρ)/(2ρ) > 1, δ = exp(−(ε − ρ)²/(4ρ))."""
    if eps <= rho:
        return 1.0
    log_d = -((eps - rho) ** 2) / (4.0 * rho)
    log_d += 16.0 * _U * abs(log_d)
    return min(math.nextafter(math.nextafter(math.exp(log_d), math.inf), math.inf), 1.0)


def _delta_improved(rho: float, eps: float) -> float:
    a1 = _argmin_a1(lambda x: _improved_log_delta(x, rho, eps))
    log_d = _improved_log_delta_up(a1, rho, eps)
    log_kl = 0.5 * math.log(-math.expm1(-rho))  # ρ > 0 here
    log_d = min(log_d, log_kl + 16.0 * _U * abs(log_kl))
    d = min(math.nextafter(math.nextafter(math.exp(log_d), math.inf), math.inf), 1.0)
    return min(d, _delta_classic(rho, eps))


_EPS_CONVERSIONS: dict[str, Callable[[float, float], float]] = {"improved": _eps_improved, "classic": _eps_classic}
_DELTA_CONVERSIONS: dict[str, Callable[[float, float], float]] = {
    "improved": _delta_improved,
    "classic": _delta_classic,
}


def _check_rho(rho: object) -> float:
    if isinstance(rho, bool) or not isinstance(rho, (int, float, Fraction)) or not math.isfinite(float(rho)) or rho < 0:
        raise InvalidParameterError("rho", rho, "a finite number >= 0")
    return float(rho)


def zcdp_to_approx_dp(rho: float, delta: float, conversion: str = "improved") -> float:
    """The ε for which ρ-zCDP implies (ε, δ)-DP, rounded up (see the module docstring).

    >>> zcdp_to_approx_dp(0.5, 1e-5) <= zcdp_to_approx_dp(0.5, 1e-5, conversion="classic")
    True
    """
    return _epsilon(_check_rho(rho), v.delta(delta), conversion)


def rho_for_approx_dp(epsilon: float, delta: float) -> float:
    """The largest ρ whose (ε, δ) conversion (:func:`zcdp_to_approx_dp`) is at most ``epsilon``
    at ``delta``, by bisection, slightly reduced so that rounding never overspends; 0.0 when even
    the smallest ρ would (an ε far too small for this δ).

    >>> rho = rho_for_approx_dp(1.0, 1e-9)
    >>> zcdp_to_approx_dp(rho, 1e-9) <= 1.0 < zcdp_to_approx_dp(rho * 1.001, 1e-9)
    True
    """
    lo, hi = 0.0, max(epsilon, 1.0)
    while zcdp_to_approx_dp(hi, delta) <= epsilon:
        hi *= 2
    for _ in range(200):
        mid = (lo + hi) / 2
        if zcdp_to_approx_dp(mid, delta) <= epsilon:
            lo = mid
        else:
            hi = mid
    return lo * (1 - 1e-9)


def zcdp_to_delta(rho: float, epsilon: float, conversion: str = "improved") -> float:
    """The δ for which ρ-zCDP implies (ε, δ)-DP, rounded up and capped at 1."""
    rho = _check_rho(rho)
    epsilon = check_epsilon(epsilon)
    fn = _DELTA_CONVERSIONS.get(conversion) if isinstance(conversion, str) else None
    if fn is None:
        raise InvalidParameterError("conversion", conversion, "'improved' or 'classic'")
    if rho == 0.0:
        return 0.0
    return fn(rho, epsilon)


# --------------------------------------------------------------------------------------------
# The registry: event type -> (neighbour check, exact ρ)
# --------------------------------------------------------------------------------------------

RhoFunction = Callable[[DPEvent], Fraction]

_REGISTRY: Registry[RhoFunction] = Registry(
    "zCDP",
    "Subsampled events need the RDPAccountant; (ε, δ) events with δ > 0 need the PLD or a composition accountant",
)


def register_zcdp(event_type: type[DPEvent], rho: RhoFunction, check: CheckFunction | None = None) -> None:
    """Teach the zCDP accountant a new event type: ``rho(event)`` returns its ρ as a Fraction."""
    _REGISTRY.register(event_type, rho, check)


def event_rho(event: DPEvent) -> float:
    """ρ of ``event`` (no neighbour checks), rounded up."""
    return to_float_up(_rho(event))


def _rho(event: DPEvent) -> Fraction:
    # ρ adds up under composition (Bun & Steinke 2016, Lemma 2.3); a repeated event's ρ is
    # multiplied by its count. Exact Fraction arithmetic: the order of the sum does not matter.
    return fold(
        event,
        lambda e: _REGISTRY.rule_for(e).compute(e),  # type: ignore[arg-type]
        zero=Fraction,
        add=operator.add,
        scale=operator.mul,
    )


def _gaussian_rho(event: DPEvent) -> Fraction:
    assert isinstance(event, GaussianEvent)
    s = Fraction(event.noise_multiplier)
    return 1 / (2 * s * s)


def _pure_rho(event: DPEvent) -> Fraction:
    assert isinstance(event, (PureDPEvent, ApproxDPEvent))
    return _rho_pure_exact(decimal_fraction(event.epsilon))


def _laplace_rho(event: DPEvent) -> Fraction:
    assert isinstance(event, LaplaceEvent)
    return _rho_pure_exact(1 / Fraction(event.noise_multiplier))


def _exponential_rho(event: DPEvent) -> Fraction:
    assert isinstance(event, ExponentialEvent)
    return _rho_bounded_range_exact(decimal_fraction(event.epsilon))


def _rr_rho(event: DPEvent) -> Fraction:
    assert isinstance(event, RandomizedResponseEvent)
    return _rho_pure_exact(rr_epsilon(event))


def _check_rr(event: DPEvent, neighbours: Neighbours) -> None:
    assert isinstance(event, RandomizedResponseEvent)
    v.positive_int(event.k, "k", minimum=2)
    v.probability(event.p_truth, "p_truth")  # p = 0 or 1 releases the answer: no finite ρ
    check_leaf_neighbours(event, neighbours)


def _check_approx(event: DPEvent, neighbours: Neighbours) -> None:
    assert isinstance(event, ApproxDPEvent)
    if event.delta > 0:
        raise InvalidParameterError(
            "event",
            event,
            "an event the zCDP accountant supports (ApproxDPEvent only with delta = 0)",
            "An (ε, δ)-DP guarantee with δ > 0 implies no finite ρ; use the PLD or a composition accountant",
        )
    check_leaf_neighbours(event, neighbours)


register_zcdp(GaussianEvent, _gaussian_rho)
register_zcdp(PureDPEvent, _pure_rho)
register_zcdp(ApproxDPEvent, _pure_rho, _check_approx)
register_zcdp(LaplaceEvent, _laplace_rho)
register_zcdp(ExponentialEvent, _exponential_rho)
register_zcdp(RandomizedResponseEvent, _rr_rho, _check_rr)


# --------------------------------------------------------------------------------------------
# The accountant
# --------------------------------------------------------------------------------------------


class ZCDPAccountant(Accountant):
    """Adds up ρ exactly (as a Fraction) and converts to (ε, δ) at the end.

    >>> acc = ZCDPAccountant().compose(PureDPEvent(1.0), count=4)
    >>> acc.rho
    2.0
    """

    __slots__ = ("_rho", "_neighbours")

    def __init__(self, neighbours: Neighbours = "add_remove") -> None:
        self._neighbours: Neighbours = v.neighbours(neighbours)
        self._rho = Fraction(0)

    def __repr__(self) -> str:
        return f"ZCDPAccountant(neighbours={self._neighbours!r}, rho={self.rho!r})"

    @property
    def rho(self) -> float:
        """The total ρ so far, rounded up."""
        return to_float_up(self._rho)

    @property
    def neighbours(self) -> Neighbours:
        return self._neighbours

    # -- the Accountant hooks: check every leaf, price ρ exactly, add it up ----------------------

    def _check(self, event: DPEvent) -> None:
        _REGISTRY.check(event, self._neighbours)

    def _price(self, event: DPEvent) -> Fraction:
        return _rho(event)

    def _record(self, cost: Fraction, count: int) -> None:
        self._rho += count * cost

    def compose(self, event: DPEvent, count: int = 1) -> ZCDPAccountant:
        """Record ``count`` repetitions of ``event``; a raise records nothing."""
        return super().compose(event, count)

    def get_epsilon(self, delta: float, conversion: str = "improved") -> float:
        """ε at this δ, rounded up: the smaller of the classic and CKS conversions."""
        return _epsilon(self.rho, v.delta(delta), conversion)

    def get_delta(self, epsilon: float, conversion: str = "improved") -> float:
        """δ at this ε >= 0, rounded up and capped at 1."""
        return zcdp_to_delta(self.rho, epsilon, conversion)
