"""Composition theorems for (ε, δ)-DP and the :class:`BasicAccountant`.

Each function states its theorem and source, validates its arguments (an
:class:`~dpkit.errors.InvalidParameterError` names the parameter, the value and what is accepted)
and rounds against itself: sums are exact :class:`fractions.Fraction` arithmetic rounded up once,
and every transcendental step (exp, log, sqrt) is followed by :func:`math.nextafter` towards +∞
on an argument that was itself rounded up, so a returned ε or δ is never below the true bound.
A δ that reaches 1 is returned as 1.0 (a vacuous guarantee).

Sources: Dwork & Roth, *The Algorithmic Foundations of Differential Privacy* (2014) — "DR"
(Prop. 2.1 post-processing, Thm 2.2 group privacy, Thm 3.16 composition, §3.5.2 advanced
composition); Dwork, Rothblum & Vadhan (FOCS 2010) — "DRV"; McSherry (SIGMOD 2009, PINQ);
Kairouz, Oh & Viswanath (ICML 2015) — "KOV".
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import Any, TypeGuard

import numpy as np
from scipy.special import gammaln, logsumexp

from dpkit import _validate as v
from dpkit._validate import Neighbours
from dpkit.accounting._shared import rr_epsilon
from dpkit.accounting.accountant import Accountant, check_epsilon
from dpkit.accounting.events import (
    ApproxDPEvent,
    DPEvent,
    ExponentialEvent,
    LaplaceEvent,
    PureDPEvent,
    RandomizedResponseEvent,
)
from dpkit.accounting.rounding import exp_up, expm1_up, log_down, log_up, sqrt_up, to_float_up, up, up2
from dpkit.accounting.walk import fold
from dpkit.errors import InvalidParameterError

__all__ = [
    "basic_composition",
    "parallel_composition",
    "post_processing",
    "group_privacy",
    "advanced_composition",
    "advanced_composition_simple",
    "optimal_homogeneous_composition",
    "BasicAccountant",
    "basic_cost",
]


def _cap(delta: Fraction) -> float:
    """δ rounded up, capped at 1 (a vacuous guarantee)."""
    return 1.0 if delta >= 1 else to_float_up(delta)


# ------------------------------------------------------------------------------------------------
# validation
# ------------------------------------------------------------------------------------------------


def _is_sequence(value: object) -> TypeGuard[Sequence[Any] | np.ndarray]:
    return isinstance(value, (Sequence, np.ndarray)) and not isinstance(value, (str, bytes))


def _pair(value: object, name: str) -> tuple[float, float]:
    """One (ε, δ) guarantee: ε a finite number > 0, δ in [0, 1)."""
    if not _is_sequence(value) or len(value) != 2:
        raise InvalidParameterError(name, value, "an (epsilon, delta) pair")
    eps = v.epsilon(value[0], f"{name}.epsilon")
    dlt = v.delta(value[1], f"{name}.delta")
    return eps, dlt


def _pairs(guarantees: object) -> list[tuple[float, float]]:
    if not _is_sequence(guarantees) or len(guarantees) == 0:
        raise InvalidParameterError("guarantees", guarantees, "a non-empty sequence of (epsilon, delta) pairs")
    return [_pair(g, f"guarantees[{i}]") for i, g in enumerate(guarantees)]


# ------------------------------------------------------------------------------------------------
# the theorems
# ------------------------------------------------------------------------------------------------


def basic_composition(guarantees: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """Sequential (adaptive) composition: the ε's add and the δ's add.

    If M_i is (ε_i, δ_i)-DP for i = 1..k, and each M_i may see the data and the outputs of
    M_1..M_{i−1}, then (M_1, …, M_k) is (Σ ε_i, Σ δ_i)-DP — Dwork, McSherry, Nissim & Smith 2006;
    Dwork, Kenthapadi et al. 2006; DR Thm 3.16.
    Holds for either neighbour relation, provided all guarantees are for the same one.

    Both sums are exact (:class:`~fractions.Fraction`) and rounded up once; δ is capped at 1.

    >>> basic_composition([(0.5, 1e-6), (0.25, 0.0), (0.25, 1e-6)])
    (1.0, 2e-06)
    >>> basic_composition([(0.1, 0.0)] * 10)  # float summing would give 0.9999999999999999
    (1.0000000000000002, 0.0)
    """
    pairs = _pairs(guarantees)
    eps = sum((Fraction(e) for e, _ in pairs), Fraction(0))
    dlt = sum((Fraction(d) for _, d in pairs), Fraction(0))
    return up(eps), _cap(dlt)


def parallel_composition(guarantees: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """Parallel composition over disjoint parts of the data: the largest ε and the largest δ.

    If the data set is split into disjoint parts D_1..D_k by a rule that does not depend on the
    private data (a public function of each record, e.g. its age band), and M_i, which is
    (ε_i, δ_i)-DP, sees only D_i, then (M_1(D_1), …, M_k(D_k)) is (max ε_i, max δ_i)-DP —
    McSherry 2009 (PINQ), Thm 4 (并行组合性, parallel composition).

    **Requirement: under the neighbour relation, one record changes at most one part.** This holds
    for ``add_remove`` neighbours (the added or removed record lands in exactly one part). Under
    ``replace`` neighbours it holds only if a record's part cannot change (the partition key is not
    something a changed record can alter); otherwise the changed record leaves one part and joins
    another, two parts change, and this theorem does not apply — compose those two with
    :func:`basic_composition` instead. Nothing here can check the requirement: it is the caller's
    promise.

    >>> parallel_composition([(0.5, 1e-6), (1.0, 0.0), (0.25, 1e-5)])
    (1.0, 1e-05)
    """
    pairs = _pairs(guarantees)
    return max(e for e, _ in pairs), max(d for _, d in pairs)


def post_processing(guarantee: tuple[float, float]) -> tuple[float, float]:
    """Post-processing: any data-independent (possibly random) map f of an (ε, δ)-DP output is
    (ε, δ)-DP, so the guarantee is returned unchanged.

    DR Prop 2.1 (命题2.1). f must not read the private data again;
    if it does, it is a new mechanism to be composed, not post-processing.

    >>> post_processing((1.0, 1e-6))
    (1.0, 1e-06)
    """
    return _pair(guarantee, "guarantee")


def group_privacy(epsilon: float, delta: float, k: int) -> tuple[float, float]:
    """The guarantee of an (ε, δ)-DP mechanism for data sets that differ in k records.

    (kε, k·e^{(k−1)ε}·δ) — DR Thm 2.2 (pure case, δ = 0 gives kε) and the approximate-DP version
    after it. Proof: a chain of k neighbours.
    "Differ in k records" is k steps of the same neighbour relation the guarantee is stated for.
    (δ·Σ_{j<k} e^{jε} is a slightly tighter δ from the same chain; this follows DR's statement.)

    kε is exact and rounded up; e^{(k−1)ε} is evaluated on an upward-rounded exponent and stepped
    up, the products are exact; δ is capped at 1.

    >>> group_privacy(epsilon=0.5, delta=0.0, k=3)
    (1.5, 0.0)
    >>> group_privacy(epsilon=0.5, delta=1e-6, k=3)  # 3·e·1e-6 = 8.1548454853771353…e-06
    (1.5, 8.154845485377138e-06)
    """
    epsilon = v.epsilon(epsilon)
    delta = v.delta(delta)
    k = v.positive_int(k, "k")
    eps_g = up(k * Fraction(epsilon))
    if delta == 0:
        return eps_g, 0.0
    exponent = (k - 1) * Fraction(epsilon)
    if exponent <= 700:  # e^{(k−1)ε} is a finite double: multiply exactly
        return eps_g, _cap(k * Fraction(exp_up(exponent)) * Fraction(delta))
    # Otherwise work with ln δ_g = ln k + (k−1)ε + ln δ (each term an upper bound).
    log_bound = exponent + Fraction(log_up(Fraction(k))) + Fraction(log_up(Fraction(delta)))
    if log_bound >= 0:
        return eps_g, 1.0
    return eps_g, min(exp_up(log_bound), 1.0)


def _check_k_delta_prime(
    epsilon: object, delta: object, k: object, delta_prime: object
) -> tuple[float, float, int, float]:
    return (
        v.epsilon(epsilon),
        v.delta(delta),
        v.positive_int(k, "k"),
        v.delta(delta_prime, "delta_prime", allow_zero=False),
    )


def _drv_sqrt_term(k: int, delta_prime: float) -> float:
    """A double >= √(2k·ln(1/δ'))."""
    log_inv = -log_down(delta_prime)  # >= ln(1/δ') = −ln δ'
    return sqrt_up(2 * k * Fraction(log_inv))


def _drv_epsilon(epsilon: float, k: int, delta_prime: float) -> float:
    """√(2k ln(1/δ'))·ε + k·ε·(e^ε − 1), rounded up."""
    root = _drv_sqrt_term(k, delta_prime)
    growth = expm1_up(epsilon)
    if math.isinf(root) or math.isinf(growth):
        return math.inf
    return up(Fraction(root) * Fraction(epsilon) + k * Fraction(epsilon) * Fraction(growth))


def advanced_composition(epsilon: float, delta: float, k: int, delta_prime: float) -> tuple[float, float]:
    """The advanced composition theorem: k adaptive (ε, δ)-DP mechanisms are (ε', kδ + δ')-DP for

        ε' = √(2k·ln(1/δ'))·ε + k·ε·(e^ε − 1)

    for every δ' in (0, 1) — Dwork, Rothblum & Vadhan 2010; DR Thm 3.20 (all ε > 0, no small-ε
    condition). Seed 004 §4.4 quotes the simplified form 2ε√(2k ln(1/δ')); see
    :func:`advanced_composition_simple` for when that form is implied by this one.

    It beats basic composition (kε) only for large k, k > 2 ln(1/δ')/(2 − e^ε)²: for ε = 0.1 and
    δ' = 1e-5 that is k >= 29, and at k = 100 it gives 5.85 against 10. (The simplified form
    needs k > 8 ln(1/δ') = 92.1 there, and below k ≈ 70 basic composition wins.)

    ε' is rounded up term by term (ln, √ and e^ε − 1 each on safely rounded arguments, sums
    exact); kδ + δ' is exact, rounded up, capped at 1.

    >>> advanced_composition(epsilon=0.1, delta=0.0, k=100, delta_prime=1e-5)
    (5.85023509294456, 1e-05)
    >>> advanced_composition(epsilon=0.1, delta=1e-7, k=100, delta_prime=1e-5)[1]  # 100·1e-7 + 1e-5
    2e-05
    """
    epsilon, delta, k, delta_prime = _check_k_delta_prime(epsilon, delta, k, delta_prime)
    return _drv_epsilon(epsilon, k, delta_prime), _cap(k * Fraction(delta) + Fraction(delta_prime))


def advanced_composition_simple(epsilon: float, delta: float, k: int, delta_prime: float) -> tuple[float, float]:
    """The notes' simplified advanced composition: (ε', kδ + δ') with ε' = 2ε·√(2k·ln(1/δ')).

    Seed 004 §4.4.1–4.4.2 (from DR Cor 3.21). This is a valid bound only because it is at least
    the exact DRV bound of :func:`advanced_composition`, ε√(2k ln(1/δ')) + kε(e^ε − 1), i.e. when

        e^ε − 1 <= √(2·ln(1/δ')/k),   equivalently   ε <= ln(1 + √(2 ln(1/δ')/k)).

    (DR Cor 3.21 gets there by assuming the *total* ε' < 1.) For larger ε — few mechanisms with
    large ε each — the simplified formula understates the privacy loss, and this function raises
    :class:`~dpkit.errors.InvalidParameterError` (naming ``epsilon``) rather than return it. The
    check compares the two bounds after both are rounded up, so a returned value is always at
    least the exact bound.

    >>> advanced_composition_simple(epsilon=0.1, delta=0.0, k=100, delta_prime=1e-5)
    (9.597051824376168, 1e-05)
    >>> advanced_composition_simple(epsilon=1.0, delta=0.0, k=100, delta_prime=1e-5)
    Traceback (most recent call last):
    ...
    dpkit.errors.InvalidParameterError: epsilon=1.0 is not accepted: ...
    """
    epsilon, delta, k, delta_prime = _check_k_delta_prime(epsilon, delta, k, delta_prime)
    root = _drv_sqrt_term(k, delta_prime)
    simple = up(2 * Fraction(epsilon) * Fraction(root)) if math.isfinite(root) else math.inf
    exact = _drv_epsilon(epsilon, k, delta_prime)
    if simple < exact:
        limit = math.log1p(math.sqrt(2.0 * -math.log(delta_prime) / k))
        raise InvalidParameterError(
            "epsilon",
            epsilon,
            f"at most ln(1 + √(2 ln(1/δ')/k)) ≈ {limit:.6g} for k={k}, delta_prime={delta_prime!r} "
            "for the simplified bound",
            f"2ε√(2k ln(1/δ')) = {simple!r} would be below the exact Dwork–Rothblum–Vadhan bound "
            f"ε√(2k ln(1/δ')) + kε(e^ε − 1) = {exact!r} (Dwork & Roth 2014, Thm 3.20), so it would "
            "understate the privacy loss; use advanced_composition() for these parameters",
        )
    return simple, _cap(k * Fraction(delta) + Fraction(delta_prime))


# ------------------------------------------------------------------------------------------------
# optimal homogeneous composition (Kairouz, Oh & Viswanath 2015)
# ------------------------------------------------------------------------------------------------

_ULP = 2.0**-52


class _KOV:
    """δ_i of KOV Thm 3.3 for one (ε, k), in log space, with a rigorous upward margin.

    δ_i = Σ_{l<i} C(k,l)·(e^{(k−l)ε} − e^{(k−2i+l)ε}) / (1+e^ε)^k, and each summand is evaluated as
    exp(ln C(k,l) + (k−2i+l)ε + ln(e^{2(i−l)ε} − 1) − k·ln(1+e^ε)), summed with logsumexp, so
    nothing overflows for k up to millions. Every quantity in the exponent is at most M in
    magnitude and takes a bounded number of correctly-rounded-or-1-ulp operations (gammaln is
    within a few ulps), so the exponent's absolute error is far below 64·2^-52·M; that margin is
    added before exponentiating.
    """

    def __init__(self, epsilon: float, k: int) -> None:
        self.eps = epsilon
        self.k = k
        half = k // 2
        ls = np.arange(half + 1, dtype=np.float64)
        lg_k = float(gammaln(k + 1.0))
        self.ln_c = lg_k - gammaln(ls + 1.0) - gammaln(k - ls + 1.0)
        self.ln_norm = float(np.logaddexp(0.0, epsilon))  # ln(1 + e^ε)
        magnitude = 16.0 + 3.0 * lg_k + 4.0 * k * (epsilon + 1.0)
        self.margin = 64.0 * _ULP * magnitude

    def delta_i_up(self, i: int) -> float:
        if i == 0:
            return 0.0
        eps, k = self.eps, self.k
        ls = np.arange(i, dtype=np.float64)
        gap = 2.0 * (i - ls) * eps  # (k−l)ε − (k−2i+l)ε > 0
        log_diff = gap + np.log(-np.expm1(-gap))  # ln(e^gap − 1), stable for small and large gap
        terms = self.ln_c[:i] + (k - 2 * i + ls) * eps + log_diff - k * self.ln_norm
        log_delta = float(logsumexp(terms)) + self.margin
        return min(up2(math.exp(log_delta)) if log_delta < 709.0 else math.inf, 1.0)


def optimal_homogeneous_composition(epsilon: float, delta: float, k: int, delta_total: float) -> float:
    """The smallest ε_g of the optimal composition theorem (Kairouz, Oh & Viswanath 2015, Thm 3.3)
    for which k adaptive (ε, δ)-DP mechanisms are (ε_g, delta_total)-DP.

    KOV Thm 3.3: for every i = 0, 1, …, ⌊k/2⌋ the k-fold adaptive composition of (ε, δ)-DP
    mechanisms is ((k − 2i)ε, 1 − (1 − δ)^k·(1 − δ_i))-DP, where

        δ_i = Σ_{l=0}^{i−1} C(k, l)·(e^{(k−l)ε} − e^{(k−2i+l)ε}) / (1 + e^ε)^k,

    and no better δ is possible at these ε_g (the k-fold composition of one 4-outcome mechanism,
    randomized response with a δ escape, attains it). The total δ grows with i, so this returns
    (k − 2i)ε for the largest i whose total δ, rounded up, is at most ``delta_total``. i = 0
    gives basic composition's kε with δ_total = 1 − (1 − δ)^k; if ``delta_total`` is below that,
    no ε_g exists and :class:`~dpkit.errors.InvalidParameterError` is raised. Valid under either
    neighbour relation (the one the per-mechanism guarantees are stated for). Only the grid values
    (k − 2i)ε are returned, as in the theorem and in dp_accounting's ``advanced_composition``.

    Evaluated in log space (gammaln, logsumexp), stable for k up to 10^4 and beyond; each δ_i is
    rounded up with an explicit margin, and ε_g = (k − 2i)ε is exact, rounded up.

    >>> optimal_homogeneous_composition(epsilon=0.1, delta=0.0, k=100, delta_total=1e-5)
    4.4
    >>> optimal_homogeneous_composition(epsilon=1.0, delta=0.0, k=3, delta_total=1e-9)  # = 3ε
    3.0
    """
    epsilon = v.epsilon(epsilon)
    delta = v.delta(delta)
    k = v.positive_int(k, "k")
    delta_total = v.delta(delta_total, "delta_total")

    # a = 1 − (1 − δ)^k, the chance that some mechanism uses its δ; rounded up with a margin
    # covering log1p, the product and expm1 (a few ulps each, relative).
    a = -math.expm1(k * math.log1p(-delta)) if delta > 0 else 0.0
    a_up = min(up2(a * (1.0 + 64.0 * _ULP)), 1.0) if a > 0 else 0.0
    target = Fraction(delta_total)

    def total_up(b_up: float) -> Fraction:  # 1 − (1 − a)(1 − b) = a + b − ab, increasing in a, b
        fa, fb = Fraction(a_up), Fraction(b_up)
        return fa + fb - fa * fb

    if total_up(0.0) > target:
        raise InvalidParameterError(
            "delta_total",
            delta_total,
            f"at least 1 − (1 − delta)^k ≈ {a_up!r} for delta={delta!r}, k={k}",
            "With that probability some mechanism may use its δ and reveal everything, so no ε "
            "holds for a smaller total δ (Kairouz, Oh & Viswanath 2015, Thm 3.3 with i = 0)",
        )
    kov = _KOV(epsilon, k)
    lo, hi = 0, k // 2  # total(lo) <= target; find the largest such i (total grows with i)
    if total_up(kov.delta_i_up(hi)) <= target:
        lo = hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if total_up(kov.delta_i_up(mid)) <= target:
            lo = mid
        else:
            hi = mid
    return up((k - 2 * lo) * Fraction(epsilon))


# ------------------------------------------------------------------------------------------------
# BasicAccountant
# ------------------------------------------------------------------------------------------------


def _exact(name: str, value: object, *, positive: bool = True, decimal: bool = False) -> Fraction:
    """An event field, re-validated: events are frozen, but a budget must never grow by spending
    even if one was tampered with (negative, NaN or infinite values). An ε is read as the decimal
    it prints as (``decimal``), as the mechanism that recorded it calibrated to."""
    return v.exact_amount(f"event.{name}", value, positive=positive, decimal=decimal)


def _leaf_pure(event: PureDPEvent | ExponentialEvent) -> tuple[Fraction, Fraction]:
    return _exact("epsilon", event.epsilon, decimal=True), Fraction(0)


def _leaf_approx(event: ApproxDPEvent) -> tuple[Fraction, Fraction]:
    delta = _exact("delta", event.delta, positive=False)
    if delta >= 1:
        raise InvalidParameterError("event.delta", event.delta, "a number in [0, 1)")
    return _exact("epsilon", event.epsilon, decimal=True), delta


def _leaf_laplace(event: LaplaceEvent) -> tuple[Fraction, Fraction]:
    # ε = 1/noise_multiplier exactly (event.epsilon is this value rounded up); rounding happens
    # once, on the total.
    return 1 / _exact("noise_multiplier", event.noise_multiplier), Fraction(0)


def _leaf_rr(event: RandomizedResponseEvent) -> tuple[Fraction, Fraction]:
    return rr_epsilon(event), Fraction(0)


# The dispatch table (a table, not an if/elif ladder): exact event type → (ε, δ) as exact fractions.
_LEAVES: dict[type, Callable[..., tuple[Fraction, Fraction]]] = {
    PureDPEvent: _leaf_pure,
    ExponentialEvent: _leaf_pure,
    ApproxDPEvent: _leaf_approx,
    LaplaceEvent: _leaf_laplace,
    RandomizedResponseEvent: _leaf_rr,
}

_SUPPORTED = "PureDPEvent, ApproxDPEvent, LaplaceEvent, RandomizedResponseEvent, ExponentialEvent, or a ComposedEvent / SelfComposedEvent of them"


class _Unsupported(Exception):
    def __init__(self, event: object) -> None:
        self.event = event


def _cost(event: object, relations: set[str]) -> tuple[Fraction, Fraction]:
    """(Σε, Σδ) of an event tree, exactly; collects the neighbour relations of its leaves."""

    def leaf(e: object) -> tuple[Fraction, Fraction]:
        rule = _LEAVES.get(type(e))
        if rule is None:
            raise _Unsupported(e)
        relations.add(v.neighbours(e.neighbours, "event.neighbours"))  # type: ignore[attr-defined]
        return rule(e)

    return fold(event, leaf, zero=_ZERO, add=_add, scale=_scale)


def _ZERO() -> tuple[Fraction, Fraction]:
    return Fraction(0), Fraction(0)


def _add(a: tuple[Fraction, Fraction], b: tuple[Fraction, Fraction]) -> tuple[Fraction, Fraction]:
    return a[0] + b[0], a[1] + b[1]


def _scale(count: int, c: tuple[Fraction, Fraction]) -> tuple[Fraction, Fraction]:
    return count * c[0], count * c[1]


def basic_cost(event: DPEvent) -> tuple[Fraction, Fraction, str | None]:
    """(ε, δ, neighbour relation) of an event tree under basic composition, as exact fractions.

    Raises :class:`~dpkit.errors.InvalidParameterError` exactly as :meth:`BasicAccountant.compose`
    does (unsupported events, mixed neighbour relations).
    """
    acc = BasicAccountant().compose(event)
    return acc._epsilon, acc._delta, acc._neighbours


class BasicAccountant(Accountant):
    """Sequential composition of pure and approximate DP events: ε and δ add (DR Thm 3.16).

    Supports :class:`PureDPEvent`, :class:`ApproxDPEvent`, :class:`LaplaceEvent`
    (ε = 1/noise_multiplier), :class:`RandomizedResponseEvent` (ε = |ln(p(k−1)/(1−p))|),
    :class:`ExponentialEvent` (ε) and :class:`ComposedEvent` / :class:`SelfComposedEvent` trees of
    them. Gaussian and subsampled events have no single (ε, δ) worth adding up; ``compose``
    refuses them and names the accountants that can (RDPAccountant or PLDAccountant).

    All events must share one neighbour relation: the first composed event fixes it (or pass
    ``neighbours=``), and a later event with the other relation raises — a guarantee for
    ``replace`` neighbours is not one for ``add_remove`` neighbours, or the reverse.

    Totals are exact fractions; :attr:`epsilon`, :attr:`delta` and the getters round up once.
    ``compose`` evaluates the whole event first and changes nothing if it raises.

    >>> acc = BasicAccountant()
    >>> acc.compose(LaplaceEvent.for_epsilon(0.5)).compose(ApproxDPEvent(0.25, 1e-6), count=2)
    BasicAccountant(epsilon=1.0, delta=2e-06, neighbours='add_remove')
    >>> acc.get_epsilon(delta=1e-5), acc.get_epsilon(delta=1e-7)
    (1.0, inf)
    >>> acc.get_delta(epsilon=1.0), acc.get_delta(epsilon=0.5)
    (2e-06, 1.0)
    """

    def __init__(self, *, neighbours: Neighbours | None = None) -> None:
        self._neighbours: str | None = None if neighbours is None else v.neighbours(neighbours)
        self._epsilon = Fraction(0)
        self._delta = Fraction(0)

    # -- the Accountant protocol ------------------------------------------------------------------

    def supports(self, event: DPEvent) -> bool:
        """Whether every event in the tree is of a supported type with valid parameters. (A
        neighbour-relation mismatch is an error that :meth:`compose` raises, not a lack of
        support.)"""
        try:
            _cost(event, set())
        except (_Unsupported, InvalidParameterError):
            return False
        return True

    def compose(self, event: DPEvent, count: int = 1) -> BasicAccountant:
        """Record ``count`` adaptive repetitions of ``event``; returns self.

        Raises :class:`~dpkit.errors.InvalidParameterError`, recording nothing, for a ``count``
        that is not an integer >= 1, an unsupported event, or a neighbour-relation mismatch.
        """
        return super().compose(event, count)

    # -- the Accountant hooks ----------------------------------------------------------------------

    def _check(self, event: DPEvent) -> None:
        self._price(event)  # pricing is exact and cheap: the check is the price, discarded

    def _price(self, event: DPEvent) -> tuple[Fraction, Fraction, set[str]]:
        """(ε, δ, neighbour relations) of one run; raises for unsupported or mixed events."""
        relations: set[str] = set()
        try:
            eps, dlt = _cost(event, relations)
        except _Unsupported as exc:
            bad = type(exc.event).__name__
            raise InvalidParameterError(
                "event",
                event,
                _SUPPORTED,
                f"BasicAccountant cannot account for {bad}: it has no single (ε, δ) to add up; "
                "use RDPAccountant or PLDAccountant",
            ) from None
        wanted = relations | ({self._neighbours} if self._neighbours else set())
        if len(wanted) > 1:
            fixed = self._neighbours or sorted(relations)[0]
            raise InvalidParameterError(
                "event",
                event,
                f"events whose neighbours is {fixed!r}"
                if self._neighbours
                else "events that all share one neighbour relation",
                (
                    f"this accountant already holds {self._neighbours!r} events"
                    if self._neighbours
                    else f"the event mixes {sorted(relations)}"
                )
                + "; a guarantee for one relation is not a guarantee for the other, so they cannot be added up",
            )
        return eps, dlt, relations

    def _record(self, cost: tuple[Fraction, Fraction, set[str]], count: int) -> None:
        eps, dlt, relations = cost
        if relations and self._neighbours is None:
            self._neighbours = next(iter(relations))
        self._epsilon += count * eps
        self._delta += count * dlt

    def get_epsilon(self, delta: float) -> float:
        """The total ε, rounded up, if the total δ is at most ``delta``; otherwise ``inf``
        (basic composition proves nothing at a smaller δ)."""
        delta = v.delta(delta)
        return self.epsilon if self._delta <= Fraction(delta) else math.inf

    def get_delta(self, epsilon: float) -> float:
        """The total δ, rounded up, if the total ε is at most ``epsilon``; otherwise 1.0."""
        epsilon = check_epsilon(epsilon)
        return self.delta if self._epsilon <= v.decimal_fraction(epsilon) else 1.0

    def _exact_epsilon(self, delta: float) -> Fraction | None:
        """The total ε as an exact fraction if the total δ is at most ``delta`` (None: unbounded);
        a :class:`~dpkit.budget.Budget` compares it with its limit without rounding."""
        return self._epsilon if self._delta <= Fraction(v.delta(delta)) else None

    # -- totals -----------------------------------------------------------------------------------

    @property
    def epsilon(self) -> float:
        """Σε so far, rounded up."""
        return up(self._epsilon)

    @property
    def delta(self) -> float:
        """Σδ so far, rounded up, capped at 1."""
        return _cap(self._delta)

    @property
    def neighbours(self) -> str | None:
        """The neighbour relation fixed by the first event (or the constructor); None before."""
        return self._neighbours

    def __repr__(self) -> str:
        return f"BasicAccountant(epsilon={self.epsilon!r}, delta={self.delta!r}, neighbours={self._neighbours!r})"
