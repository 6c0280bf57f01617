"""Rényi differential privacy (RDP) accounting — the moments accountant.

A mechanism M is (α, R)-RDP (Mironov 2017) if D_α(M(x) ‖ M(x')) <= R for all neighbours x, x',
where D_α(P ‖ Q) = 1/(α − 1) · ln E_Q[(P/Q)^α]. RDP composes by addition at every order
(seed 003: "T 次 (α, ε_t(α))-RDP 机制的组合是 (α, Σ ε_t(α))-RDP"), so the accountant keeps one
number per order α and converts to (ε, δ) at the end, minimising over the orders.

Per-event RDP curves (each registered in a table keyed by event type — no if/elif ladder):

* ``GaussianEvent(σ)``: α / (2σ²) (Mironov 2017, Prop 7), exact.
* ``LaplaceEvent(b)``: with ε = 1/b, for α > 1
  R(α) = 1/(α − 1) · ln(α/(2α − 1) · e^{(α−1)ε} + (α − 1)/(2α − 1) · e^{−αε})
  (Mironov 2017, Table II), exact; evaluated as ε + log1p((α−1)/(2α−1) · expm1(−(2α−1)ε))/(α−1).
* ``RandomizedResponseEvent(p, k)`` (replace neighbours): the exact divergence between the
  output distributions for two different true answers, P = (p, q, …, q), Q = (q, p, q, …, q),
  q = (1 − p)/(k − 1).
* ``PureDPEvent(ε)``: the tight bound for ε-DP, R(α) = 1/(α−1) · ln[(sinh(αε) − sinh((α−1)ε))
  / sinh(ε)] (Bun & Steinke 2016, Prop 3.3 and its proof). It is the divergence of binary
  randomized response at e^ε, which every ε-DP pair post-processes (Kairouz, Oh & Viswanath 2015),
  and it is <= min(ε, αε²/2), the bound usually quoted.
* ``ExponentialEvent(ε)``: min(pure-DP bound above, αε²/8) — ε-bounded range gives ε²/8-zCDP
  (Cesar & Rogers 2021, Lemma 3.2).
* ``ApproxDPEvent(ε, δ)``: δ = 0 is pure DP; δ > 0 is unsupported (an (ε, δ)-DP mechanism may
  have D_α = ∞ at every α).
* ``PoissonSampledEvent(q, Gaussian…)``: Mironov, Talwar & Zhang 2019 (add/remove neighbours).
  Integer α: A_α = Σ_i C(α, i) q^i (1 − q)^{α−i} e^{(i² − i)/(2σ²)}; we sum A_α − 1 (terms
  i >= 2 only, each weight times expm1(·)) in log space, so tiny q keeps full relative precision.
  Fractional α: the two series of their Sec 3.3 (split at z₀ = σ² ln(1/q − 1) + 1/2) with the
  generalised binomial coefficients in absolute value, summed until both terms decrease and fall
  30 nats below the running total, as dp_accounting does (values agree to ~1e-9). For k > ⌈α⌉
  the true coefficients alternate in sign, so the absolute-value sum over-counts every negative
  term it has summed, while the omitted alternating tail is at most its first term (< e^{-30} of
  the total); the tests check the result lies above a 40-digit quadrature of A_α. Where a
  series has not converged after 2,048 terms (q large, σ small, α near 1 — dp_accounting then
  drops the order) we use the convex interpolation of the integer orders around α (ln A_α is a
  cumulant generating function, hence convex in α), an upper bound. Every order is also capped by the unsampled
  Gaussian's α/(2σ²) (quasi-convexity of Rényi divergence).
* ``SampledWithoutReplacementEvent(n, m, Gaussian…)``: Wang, Balle & Kasiviswanathan 2019,
  Theorem 9 with γ = m/n, for integer α >= 2, with the Gaussian's ε(j) = j/(2σ²) and
  ε(∞) = ∞; capped by α/(2σ²). A fractional α takes the smaller of the bound at ⌈α⌉ (RDP is
  non-decreasing in α) and the convex interpolation between ⌊α⌋ and ⌈α⌉ (their Corollary 10;
  at ⌊α⌋ = 1 the cumulant is 0). The theorem is for replace-one neighbours on a dataset of
  public size n, so it needs an accountant with ``neighbours="replace"``.
* ``ComposedEvent`` / ``SelfComposedEvent``: sums (count multiplies).

Neighbours: the accountant has one relation; every leaf event must carry the same one (a
GaussianEvent calibrated to add/remove sensitivity is *not* accounted under replace).
Poisson subsampling needs add_remove, sampling without replacement needs replace.

Conversion to (ε, δ) (``conversion="improved"``, the default): per order the smaller of
Canonne–Kamath–Steinke 2020 Prop 12 / Balle et al. 2020 Thm 21,
ε = R(α) + ln((α − 1)/α) − (ln δ + ln α)/(α − 1), and Mironov 2017 Prop 3,
ε = R(α) + ln(1/δ)/(α − 1); plus ε = 0 when δ >= √(1 − e^{−R(α)}) (KL <= R(α), then
Bretagnolle–Huber bounds the total variation). The improved bound is always the smaller of the
first two; ``conversion="classic"`` uses Mironov's alone. The minimum over orders is rounded up.
δ = 0 gives ε = ∞ (unless nothing has been spent): RDP at a finite order bounds the privacy
loss only in the tail-probability sense, and δ → 0 needs α → ∞.

Rounding: composition rounds each sum up by one ulp; conversions add a bound on their own
floating-point error before rounding up. The RDP curves themselves are double-precision
evaluations (relative error well below 1e-9 in the tested ranges), not interval arithmetic.

>>> acc = RDPAccountant()
>>> acc.compose(SelfComposedEvent(PoissonSampledEvent(256 / 60000, GaussianEvent(1.1)), 23400))
RDPAccountant(neighbours='add_remove', orders=173)
>>> round(acc.get_epsilon(1e-5), 2)
3.43
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from numbers import Real

import numpy as np
from numpy.typing import NDArray
from scipy.special import gammaln, log_ndtr

from dpkit import _validate as v
from dpkit._validate import Neighbours
from dpkit.accounting.events import (
    ApproxDPEvent,
    ComposedEvent,
    DPEvent,
    ExponentialEvent,
    GaussianEvent,
    LaplaceEvent,
    PoissonSampledEvent,
    PureDPEvent,
    RandomizedResponseEvent,
    SampledWithoutReplacementEvent,
    SelfComposedEvent,
)
from dpkit.accounting._shared import CheckFunction, Registry, check_leaf_neighbours
from dpkit.errors import InvalidParameterError

__all__ = [
    "RDPAccountant",
    "DEFAULT_RDP_ORDERS",
    "register_rdp",
    "event_rdp",
    "gaussian_rdp",
    "laplace_rdp",
    "randomized_response_rdp",
    "pure_dp_rdp",
    "poisson_subsampled_gaussian_rdp",
    "sampled_without_replacement_gaussian_rdp",
    "rdp_to_epsilon",
    "rdp_to_delta",
]

Orders = tuple[float, ...]
FloatArray = NDArray[np.float64]

#: The default orders: 1.05–1.95 by 0.05 (large compositions, ε in the hundreds), 2.0–9.9 by 0.1
#: and every integer 10–64 (DP-SGD's usual optimum), then 72 … 256 and 320 … 4096 (small
#: per-step RDP, small δ). 173 orders; dp_accounting's default is similar (1.1–10.9, 11–63,
#: 128, 256, 512, 1024).
DEFAULT_RDP_ORDERS: Orders = tuple(
    [round(1 + k / 20, 2) for k in range(1, 20)]
    + [round(2 + k / 10, 1) for k in range(0, 80)]
    + [float(a) for a in range(10, 65)]
    + [72.0, 80.0, 96.0, 112.0, 128.0, 160.0, 192.0, 224.0, 256.0]
    + [320.0, 384.0, 448.0, 512.0, 640.0, 768.0, 1024.0, 1536.0, 2048.0, 4096.0]
)

_U = 2.0**-52  # unit roundoff bound used for the conversions' error allowance
_LOG2 = math.log(2.0)
_LOG4 = math.log(4.0)
_FRAC_STOP_NATS = 30.0  # a fractional-order series stops when its terms are this far below the total
_FRAC_CHUNK = 128
_FRAC_MAX_TERMS = 2048
_MAX_EXACT_ORDER = 1 << 16  # above this, subsampled Gaussians use the unsampled α/(2σ²) (sound)


# --------------------------------------------------------------------------------------------
# Orders
# --------------------------------------------------------------------------------------------


def _order_values(orders: object) -> list[float]:
    """The orders as floats, in the given order; each a finite number > 1."""
    accepted = "a non-empty sequence of finite numbers > 1"
    if isinstance(orders, (str, bytes)) or not isinstance(orders, (Sequence, np.ndarray)):
        raise InvalidParameterError("orders", orders, accepted)
    values = list(orders)
    if not values:
        raise InvalidParameterError("orders", orders, accepted, "An accountant needs at least one order")
    out = []
    for a in values:
        if isinstance(a, (bool, np.bool_)) or not isinstance(a, (Real, np.floating, np.integer)):
            raise InvalidParameterError("orders", orders, accepted, f"{a!r} is not a number")
        f = float(a)
        if not math.isfinite(f) or f <= 1.0:
            raise InvalidParameterError("orders", orders, accepted, f"{a!r} is not a finite number > 1")
        out.append(f)
    return out


def _validate_orders(orders: object) -> Orders:
    """None → the defaults; otherwise validated, sorted and deduplicated."""
    if orders is None:
        return DEFAULT_RDP_ORDERS
    return tuple(sorted(set(_order_values(orders))))


# --------------------------------------------------------------------------------------------
# Per-mechanism RDP curves (pure functions of numbers; cached where expensive)
# --------------------------------------------------------------------------------------------


def _logsumexp(x: FloatArray, axis: int | None = None) -> FloatArray:
    """ln Σ e^x along ``axis`` (numpy only: scipy's version costs ~0.1 ms per call)."""
    m = np.max(x, axis=axis, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    with np.errstate(divide="ignore"):
        out = np.log(np.sum(np.exp(x - m), axis=axis, keepdims=True)) + m
    return np.squeeze(out, axis=axis) if axis is not None else out.reshape(())


def _readonly(a: FloatArray) -> FloatArray:
    a.setflags(write=False)
    return a


def gaussian_rdp(noise_multiplier: float, orders: Sequence[float] | None = None) -> FloatArray:
    """RDP of the Gaussian mechanism with σ = noise_multiplier × sensitivity: α/(2σ²) (exact).

    >>> gaussian_rdp(1.0, [2.0, 4.0]).tolist()
    [1.0, 2.0]
    """
    sigma = v.positive(noise_multiplier, "noise_multiplier")
    a = np.asarray(_validate_orders(orders))
    return a / (2.0 * sigma * sigma)


def laplace_rdp(noise_multiplier: float, orders: Sequence[float] | None = None) -> FloatArray:
    """RDP of the Laplace mechanism with scale b = noise_multiplier × ℓ1 sensitivity (Mironov 2017,
    Table II), exact: ε + log1p((α−1)/(2α−1)·expm1(−(2α−1)ε))/(α−1), ε = 1/b, clipped to [0, ε]."""
    b = v.positive(float(noise_multiplier), "noise_multiplier")
    return _laplace_rdp(1.0 / b, _validate_orders(orders))


def _laplace_rdp(eps: float, orders: Orders) -> FloatArray:
    a = np.asarray(orders)
    am1 = a - 1.0
    r = eps + np.log1p(am1 / (2.0 * a - 1.0) * np.expm1(-(2.0 * a - 1.0) * eps)) / am1
    return np.clip(r, 0.0, eps)


def _two_point_rdp(log_p: float, log_q: float, log_rest: float, orders: Orders) -> FloatArray:
    """D_α between P = (p, q, rest) and Q = (q, p, rest) (symmetric in P, Q), p + q + rest = 1.

    Where (α − 1)|ln(p/q)| <= 1: S − 1 = p·expm1((α−1)L) + q·expm1(−(α−1)L), L = ln(p/q), with
    full relative precision near p = q; elsewhere ln S by log-sum-exp."""
    a = np.asarray(orders)
    am1 = a - 1.0
    if log_p == log_q:
        return np.zeros_like(a)
    if math.isinf(log_p) or math.isinf(log_q):
        return np.full_like(a, np.inf)
    lr = log_p - log_q
    y = am1 * lr
    out = np.empty_like(a)
    small = np.abs(y) <= 1.0
    if small.any():
        ys = y[small]
        s_minus_1 = math.exp(log_p) * np.expm1(ys) + math.exp(log_q) * np.expm1(-ys)
        out[small] = np.log1p(np.maximum(s_minus_1, 0.0)) / am1[small]
    big = ~small
    if big.any():
        ab = a[big]
        t1 = ab * log_p + (1.0 - ab) * log_q
        t2 = ab * log_q + (1.0 - ab) * log_p
        terms = [t1, t2] if log_rest == -math.inf else [t1, t2, np.full_like(ab, log_rest)]
        out[big] = _logsumexp(np.stack(terms), axis=0) / am1[big]
    return np.maximum(out, 0.0)


def randomized_response_rdp(p_truth: float, k: int = 2, orders: Sequence[float] | None = None) -> FloatArray:
    """RDP of k-ary randomized response (replace neighbours): D_α(P ‖ Q) for P = (p, q, …, q),
    Q = (q, p, q, …, q), q = (1 − p)/(k − 1) — the two answers' output distributions; exact.
    p = 1 (or p = 0 with k = 2) releases the answer: ∞."""
    k = v.positive_int(k, "k", minimum=2)
    p = v.probability(p_truth, "p_truth", low_open=False, high_open=False)
    return _rr_rdp(p, k, _validate_orders(orders))


@functools.lru_cache(maxsize=256)
def _rr_rdp(p: float, k: int, orders: Orders) -> FloatArray:
    q = (1.0 - p) / (k - 1)
    log_p = math.log(p) if p > 0 else -math.inf
    log_q = math.log(q) if q > 0 else -math.inf
    log_rest = math.log((k - 2) * q) if (k > 2 and q > 0) else -math.inf
    return _readonly(_two_point_rdp(log_p, log_q, log_rest, orders))


def pure_dp_rdp(epsilon: float, orders: Sequence[float] | None = None) -> FloatArray:
    """The tight RDP of an ε-DP mechanism (Bun & Steinke 2016, Prop 3.3):
    1/(α−1)·ln[(sinh(αε) − sinh((α−1)ε))/sinh(ε)] <= min(ε, αε²/2).

    >>> r = pure_dp_rdp(1.0, [2.0])
    >>> bool(r[0] <= min(1.0, 2 * 1.0**2 / 2))
    True
    """
    return _pure_rdp(v.epsilon(epsilon), _validate_orders(orders))


@functools.lru_cache(maxsize=256)
def _pure_rdp(eps: float, orders: Orders) -> FloatArray:
    # Binary randomized response with p/q = e^ε: ln p = −log1p(e^{−ε}), ln q = −ε + ln p.
    log_p = -math.log1p(math.exp(-eps))
    r = _two_point_rdp(log_p, log_p - eps, -math.inf, orders)
    a = np.asarray(orders)
    return _readonly(np.minimum(r, np.minimum(eps, a * eps * eps / 2.0)))


# -- Poisson-subsampled Gaussian (Mironov, Talwar & Zhang 2019) ------------------------------


def _log_comb(n: float | FloatArray, k: FloatArray) -> FloatArray:
    """ln |C(n, k)| via log-gamma (generalised binomial coefficients for fractional n)."""
    return gammaln(n + 1.0) - gammaln(k + 1.0) - gammaln(n - k + 1.0)


def _log_expm1(c: FloatArray) -> FloatArray:
    """ln(e^c − 1) for c > 0, stable for tiny and huge c."""
    return c + np.log(-np.expm1(-c))


def _poisson_log_a_int(q: float, sigma: float, alpha: int) -> float:
    """ln A_α for integer α >= 2 and 0 < q < 1, as log1p(A_α − 1)."""
    i = np.arange(2, alpha + 1, dtype=np.float64)
    log_w = _log_comb(float(alpha), i) + i * math.log(q) + (alpha - i) * math.log1p(-q)
    log_am1 = float(_logsumexp(log_w + _log_expm1((i * i - i) / (2.0 * sigma * sigma))))
    return float(np.logaddexp(0.0, log_am1))


def _poisson_log_a_frac(q: float, sigma: float, alphas: FloatArray) -> FloatArray:
    """ln A_α for fractional α (MTZ 2019, Sec 3.3), all orders at once; ∞ where not converged."""
    n = alphas.size
    out = np.full(n, np.inf)
    if n == 0:
        return out
    log_q, log_1mq = math.log(q), math.log1p(-q)
    z0 = sigma * sigma * (log_1mq - log_q) + 0.5
    inv2s2 = 1.0 / (2.0 * sigma * sigma)
    lg_a1 = gammaln(alphas + 1.0)
    active = np.arange(n)
    total = np.full(n, -np.inf)
    last0 = np.full(n, -np.inf)
    last1 = np.full(n, -np.inf)
    for start in range(0, _FRAC_MAX_TERMS, _FRAC_CHUNK):
        a = alphas[active][:, None]
        k = np.arange(start, start + _FRAC_CHUNK, dtype=np.float64)[None, :]
        j = a - k
        log_coef = lg_a1[active][:, None] - gammaln(k + 1.0) - gammaln(j + 1.0)
        s0 = log_coef + k * log_q + j * log_1mq + (k * k - k) * inv2s2 + log_ndtr((z0 - k) / sigma)
        s1 = log_coef + j * log_q + k * log_1mq + (j * j - j) * inv2s2 + log_ndtr((j - z0) / sigma)
        prev0 = np.concatenate([last0[active][:, None], s0[:, :-1]], axis=1)
        prev1 = np.concatenate([last1[active][:, None], s1[:, :-1]], axis=1)
        steps = np.concatenate([total[active][:, None], np.logaddexp(s0, s1)], axis=1)
        cum = np.logaddexp.accumulate(steps, axis=1)[:, 1:]
        stop = (s0 < prev0) & (s1 < prev1) & (np.maximum(s0, s1) < cum - _FRAC_STOP_NATS)
        done = stop.any(axis=1)
        first = stop.argmax(axis=1)
        out[active[done]] = cum[done, first[done]]
        total[active] = cum[:, -1]
        last0[active] = s0[:, -1]
        last1[active] = s1[:, -1]
        active = active[~done]
        if active.size == 0:
            break
    return out


@functools.lru_cache(maxsize=512)
def _poisson_gaussian_rdp_cached(q: float, sigma: float, orders: Orders) -> FloatArray:
    a = np.asarray(orders)
    full = a / (2.0 * sigma * sigma)
    if q == 1.0:
        return _readonly(full)
    out = np.array(full)
    is_int = (a == np.floor(a)) & (a <= _MAX_EXACT_ORDER)
    int_cache: dict[int, float] = {1: 0.0}

    def log_a_int(alpha: int) -> float:  # ln A_α, memoised within this call
        if alpha not in int_cache:
            int_cache[alpha] = _poisson_log_a_int(q, sigma, alpha)
        return int_cache[alpha]

    for idx in np.flatnonzero(is_int):
        alpha = int(a[idx])
        out[idx] = log_a_int(alpha) / (alpha - 1)
    frac = np.flatnonzero(~is_int & (a <= _MAX_EXACT_ORDER))
    if frac.size:
        log_a = _poisson_log_a_frac(q, sigma, a[frac])
        for pos, idx in enumerate(frac):
            alpha = float(a[idx])
            if math.isfinite(log_a[pos]):
                out[idx] = log_a[pos] / (alpha - 1.0)
            else:  # convexity of ln A_α between the neighbouring integers
                lo, hi = math.floor(alpha), math.ceil(alpha)
                t = alpha - lo
                out[idx] = ((1.0 - t) * log_a_int(lo) + t * log_a_int(hi)) / (alpha - 1.0)
    return _readonly(np.clip(out, 0.0, full))


def poisson_subsampled_gaussian_rdp(
    sampling_probability: float, noise_multiplier: float, orders: Sequence[float] | None = None
) -> FloatArray:
    """RDP of the Gaussian mechanism on a Poisson subsample with rate q (add/remove neighbours),
    Mironov, Talwar & Zhang 2019; q = 1 is the Gaussian. Cached per (q, σ, orders)."""
    q = v.probability(sampling_probability, "sampling_probability", high_open=False)
    sigma = v.positive(noise_multiplier, "noise_multiplier")
    return np.array(_poisson_gaussian_rdp_cached(q, sigma, _validate_orders(orders)))


# -- Sampling without replacement (Wang, Balle & Kasiviswanathan 2019) ------------------------


def _swor_log_bound_int(gamma: float, sigma: float, alpha: int) -> float:
    """(α − 1) × the Theorem 9 bound at integer α >= 2 for the Gaussian (ε(∞) = ∞)."""
    eps2 = 1.0 / (sigma * sigma)  # ε(2) = 2/(2σ²)
    log_g = math.log(gamma)
    term2 = (
        2.0 * log_g
        + float(_log_comb(float(alpha), np.float64(2.0)))
        + min(_LOG4 + float(_log_expm1(np.float64(eps2))), eps2 + _LOG2)
    )
    if alpha >= 3:
        j = np.arange(3, alpha + 1, dtype=np.float64)
        rest = j * log_g + _log_comb(float(alpha), j) + (j - 1.0) * j / (2.0 * sigma * sigma) + _LOG2
        log_sum = float(_logsumexp(np.concatenate([[term2], rest])))
    else:
        log_sum = term2
    return float(np.logaddexp(0.0, log_sum))


@functools.lru_cache(maxsize=256)
def _swor_gaussian_rdp_cached(gamma: float, sigma: float, orders: Orders) -> FloatArray:
    a = np.asarray(orders)
    full = a / (2.0 * sigma * sigma)
    if gamma == 1.0:
        return _readonly(full)
    cache: dict[int, float] = {1: 0.0}

    def cgf(alpha: int) -> float:
        if alpha not in cache:
            cache[alpha] = _swor_log_bound_int(gamma, sigma, alpha)
        return cache[alpha]

    out = np.array(full)
    for idx, alpha in enumerate(orders):
        if alpha > _MAX_EXACT_ORDER:
            continue
        lo, hi = math.floor(alpha), math.ceil(alpha)
        if lo == hi:
            out[idx] = cgf(lo) / (alpha - 1.0)
        else:
            t = alpha - lo
            at_ceil = cgf(hi) / (hi - 1.0)
            interp = ((1.0 - t) * cgf(lo) + t * cgf(hi)) / (alpha - 1.0)
            out[idx] = min(at_ceil, interp)
    return _readonly(np.clip(out, 0.0, full))


def sampled_without_replacement_gaussian_rdp(
    population_size: int, sample_size: int, noise_multiplier: float, orders: Sequence[float] | None = None
) -> FloatArray:
    """An upper bound on the RDP of the Gaussian mechanism (σ relative to the replace-one
    sensitivity) on a uniformly random size-m subset of n records (Wang, Balle &
    Kasiviswanathan 2019, Thm 9, γ = m/n; fractional α as in the module docstring)."""
    n = v.positive_int(population_size, "population_size")
    m = v.positive_int(sample_size, "sample_size")
    if m > n:
        raise InvalidParameterError("sample_size", m, f"an integer in [1, {n}]")
    sigma = v.positive(noise_multiplier, "noise_multiplier")
    return np.array(_swor_gaussian_rdp_cached(m / n, sigma, _validate_orders(orders)))


# --------------------------------------------------------------------------------------------
# The registry: event type -> (neighbour check, RDP curve)
# --------------------------------------------------------------------------------------------

RDPFunction = Callable[[DPEvent, Orders], FloatArray]

_REGISTRY: Registry[RDPFunction] = Registry("RDP")
_RULES = _REGISTRY.rules


def register_rdp(event_type: type[DPEvent], rdp: RDPFunction, check: CheckFunction | None = None) -> None:
    """Teach the RDP accountant a new event type: ``rdp(event, orders)`` returns the RDP at each
    order; ``check(event, neighbours)`` raises InvalidParameterError when the event cannot be
    accounted under ``neighbours`` (default: the event's own ``neighbours`` field must match)."""
    _REGISTRY.register(event_type, rdp, check)


_check_leaf = check_leaf_neighbours
_check_event = _REGISTRY.check


def event_rdp(event: DPEvent, orders: Sequence[float] | None = None) -> FloatArray:
    """The RDP curve of ``event`` at ``orders`` (no neighbour checks; see RDPAccountant)."""
    return _event_rdp(event, _validate_orders(orders))


def _event_rdp(event: DPEvent, orders: Orders) -> FloatArray:
    return _REGISTRY.rule_for(event).compute(event, orders)


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
    _check_leaf(event, neighbours)


def _check_composed(event: DPEvent, neighbours: Neighbours) -> None:
    assert isinstance(event, ComposedEvent)
    for e in event.events:
        _check_event(e, neighbours)


def _check_self_composed(event: DPEvent, neighbours: Neighbours) -> None:
    assert isinstance(event, SelfComposedEvent)
    _check_event(event.event, neighbours)


def _composed_rdp(event: DPEvent, orders: Orders) -> FloatArray:
    assert isinstance(event, ComposedEvent)
    total = np.zeros(len(orders))
    for e in event.events:
        total = total + _event_rdp(e, orders)
    return total


def _self_composed_rdp(event: DPEvent, orders: Orders) -> FloatArray:
    assert isinstance(event, SelfComposedEvent)
    return event.count * _event_rdp(event.event, orders)


def _effective_noise_multiplier(event: DPEvent, neighbours: Neighbours, outer: str) -> float:
    """σ of the single Gaussian equivalent to a nest of Gaussians (Σ σ_i^{-2} = σ^{-2};
    Mironov, Talwar & Zhang 2019, Sec 3), checking each leaf's neighbours."""
    inv = _inverse_variance(event, neighbours, outer)
    return 1.0 / math.sqrt(inv)


def _inverse_variance(event: DPEvent, neighbours: Neighbours, outer: str) -> float:
    if isinstance(event, GaussianEvent):
        _check_leaf(event, neighbours)
        return 1.0 / (event.noise_multiplier * event.noise_multiplier)
    if isinstance(event, SelfComposedEvent):
        return event.count * _inverse_variance(event.event, neighbours, outer)
    if isinstance(event, ComposedEvent) and event.events:
        return sum(_inverse_variance(e, neighbours, outer) for e in event.events)
    raise InvalidParameterError(
        "event",
        event,
        f"a GaussianEvent (or a ComposedEvent / SelfComposedEvent of GaussianEvents) inside {outer}",
        "Subsampling amplification is implemented for the Gaussian mechanism only",
    )


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
    return _laplace_rdp(1.0 / float(event.noise_multiplier), orders)


def _rr_event_rdp(event: DPEvent, orders: Orders) -> FloatArray:
    assert isinstance(event, RandomizedResponseEvent)
    p = v.probability(event.p_truth, "p_truth", low_open=False, high_open=False)
    k = v.positive_int(event.k, "k", minimum=2)
    return _rr_rdp(p, k, orders)


def _check_rr(event: DPEvent, neighbours: Neighbours) -> None:
    assert isinstance(event, RandomizedResponseEvent)
    v.probability(event.p_truth, "p_truth", low_open=False, high_open=False)
    v.positive_int(event.k, "k", minimum=2)
    _check_leaf(event, neighbours)


def _pure_event_rdp(event: DPEvent, orders: Orders) -> FloatArray:
    assert isinstance(event, (PureDPEvent, ApproxDPEvent))
    return _pure_rdp(float(event.epsilon), orders)


def _exponential_event_rdp(event: DPEvent, orders: Orders) -> FloatArray:
    assert isinstance(event, ExponentialEvent)
    eps = float(event.epsilon)
    return np.minimum(_pure_rdp(eps, orders), np.asarray(orders) * eps * eps / 8.0)


register_rdp(GaussianEvent, _gaussian_event_rdp)
register_rdp(LaplaceEvent, _laplace_event_rdp)
register_rdp(RandomizedResponseEvent, _rr_event_rdp, _check_rr)
register_rdp(PureDPEvent, _pure_event_rdp)
register_rdp(ExponentialEvent, _exponential_event_rdp)
register_rdp(ApproxDPEvent, _pure_event_rdp, _check_approx)
register_rdp(ComposedEvent, _composed_rdp, _check_composed)
register_rdp(SelfComposedEvent, _self_composed_rdp, _check_self_composed)
register_rdp(PoissonSampledEvent, _poisson_rdp, _check_poisson)
register_rdp(SampledWithoutReplacementEvent, _swor_rdp, _check_swor)


# --------------------------------------------------------------------------------------------
# Conversions RDP -> (ε, δ)
# --------------------------------------------------------------------------------------------

# Each returns (value, allowance): the allowance bounds the floating-point error of the value.
EpsilonConversion = Callable[[FloatArray, FloatArray, float, float], tuple[FloatArray, FloatArray]]
DeltaConversion = Callable[[FloatArray, FloatArray, float], tuple[FloatArray, FloatArray]]


def _eps_classic(a: FloatArray, r: FloatArray, delta: float, log_delta: float) -> tuple[FloatArray, FloatArray]:
    """Mironov 2017, Prop 3: ε = R(α) + ln(1/δ)/(α − 1)."""
    t = -log_delta / (a - 1.0)
    return r + t, 8.0 * _U * (np.abs(r) + t)


def _eps_improved(a: FloatArray, r: FloatArray, delta: float, log_delta: float) -> tuple[FloatArray, FloatArray]:
    """Canonne–Kamath–Steinke 2020 Prop 12 (= Balle et al. 2020 Thm 21), the smaller of it and
    Mironov's per order, and 0 where δ >= √(1 − e^{−R}) (KL <= R, Bretagnolle–Huber)."""
    with np.errstate(invalid="ignore"):  # ∞ − ∞ cannot occur: R = ∞ only adds to finite terms
        t2 = np.log1p(-1.0 / a)
        t3 = -(log_delta + np.log(a)) / (a - 1.0)
        eps = r + t2 + t3
        err = 8.0 * _U * (np.abs(r) + np.abs(t2) + np.abs(t3))
        classic, classic_err = _eps_classic(a, r, delta, log_delta)
        use_classic = classic + classic_err < eps + err
        eps = np.where(use_classic, classic, eps)
        err = np.where(use_classic, classic_err, err)
        kl_zero = delta * delta * (1.0 - 8.0 * _U) > -np.expm1(-r)
    return np.where(kl_zero, 0.0, eps), np.where(kl_zero, 0.0, err)


def _log_delta_classic(a: FloatArray, r: FloatArray, eps: float) -> tuple[FloatArray, FloatArray]:
    """Mironov 2017, Prop 3 solved for δ: ln δ = (α − 1)(R − ε)."""
    with np.errstate(invalid="ignore"):
        ld = (a - 1.0) * (r - eps)
    return ld, 8.0 * _U * (a - 1.0) * (np.abs(r) + eps)


def _log_delta_improved(a: FloatArray, r: FloatArray, eps: float) -> tuple[FloatArray, FloatArray]:
    """CKS 2020 Prop 12: ln δ = (α − 1)(R − ε + ln(1 − 1/α)) − ln α; with Mironov's and the
    KL/Bretagnolle–Huber bound ln δ = ½ ln(1 − e^{−R}), the smallest per order."""
    t = np.log1p(-1.0 / a)
    la = np.log(a)
    with np.errstate(invalid="ignore", divide="ignore"):
        ld = (a - 1.0) * (r - eps + t) - la
        err = 8.0 * _U * ((a - 1.0) * (np.abs(r) + eps + np.abs(t)) + la)
        ld_c, err_c = _log_delta_classic(a, r, eps)
        ld_kl = 0.5 * np.log(-np.expm1(-r))
        err_kl = 8.0 * _U * np.abs(ld_kl)
    best, best_err = ld, err
    for cand, cand_err in ((ld_c, err_c), (ld_kl, err_kl)):
        better = cand + cand_err < best + best_err
        best = np.where(better, cand, best)
        best_err = np.where(better, cand_err, best_err)
    return best, best_err


_EPSILON_CONVERSIONS: dict[str, EpsilonConversion] = {"improved": _eps_improved, "classic": _eps_classic}
_DELTA_CONVERSIONS: dict[str, DeltaConversion] = {
    "improved": _log_delta_improved,
    "classic": _log_delta_classic,
}


def _conversion(table: dict[str, object], conversion: object) -> object:
    fn = table.get(conversion) if isinstance(conversion, str) else None
    if fn is None:
        raise InvalidParameterError("conversion", conversion, " or ".join(repr(k) for k in table))
    return fn


def _epsilon_and_order(a: FloatArray, r: FloatArray, delta: float, conversion: str) -> tuple[float, float]:
    fn = _conversion(_EPSILON_CONVERSIONS, conversion)
    if not np.any(r):  # nothing spent
        return 0.0, float(a[0])
    if delta == 0.0:
        return math.inf, math.inf
    eps, err = fn(a, r, delta, math.log(delta))  # type: ignore[operator]
    up = eps + err
    i = int(np.argmin(up))
    best = float(up[i])
    if best <= 0.0:
        return 0.0, float(a[i])
    return math.nextafter(best, math.inf), float(a[i])


def _delta_and_order(a: FloatArray, r: FloatArray, epsilon: float, conversion: str) -> tuple[float, float]:
    fn = _conversion(_DELTA_CONVERSIONS, conversion)
    if not np.any(r):
        return 0.0, float(a[0])
    ld, err = fn(a, r, epsilon)  # type: ignore[operator]
    up = ld + err
    i = int(np.argmin(up))
    best = float(up[i])
    if best >= 0.0:
        return 1.0, float(a[i])
    d = math.nextafter(math.nextafter(math.exp(best), math.inf), math.inf)
    return min(d, 1.0), float(a[i])


def _validate_rdp_curve(orders: Sequence[float], rdp: Sequence[float]) -> tuple[FloatArray, FloatArray]:
    a = np.asarray(_order_values(orders), dtype=np.float64)
    try:
        r = np.asarray(rdp, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise InvalidParameterError("rdp", rdp, "numbers >= 0 (∞ allowed)") from exc
    if r.shape != a.shape:
        raise InvalidParameterError("rdp", rdp, f"one value per order ({a.size})")
    if np.any(np.isnan(r)) or np.any(r < 0):
        raise InvalidParameterError("rdp", rdp, "numbers >= 0 (∞ allowed)")
    return a, r


def rdp_to_epsilon(
    orders: Sequence[float], rdp: Sequence[float], delta: float, conversion: str = "improved"
) -> tuple[float, float]:
    """(ε, best order) from an RDP curve at δ, rounded up (see the module docstring)."""
    a, r = _validate_rdp_curve(orders, rdp)
    return _epsilon_and_order(a, r, v.delta(delta), conversion)


def rdp_to_delta(
    orders: Sequence[float], rdp: Sequence[float], epsilon: float, conversion: str = "improved"
) -> tuple[float, float]:
    """(δ, best order) from an RDP curve at ε, rounded up and capped at 1."""
    a, r = _validate_rdp_curve(orders, rdp)
    return _delta_and_order(a, r, v.epsilon(epsilon), conversion)


# --------------------------------------------------------------------------------------------
# The accountant
# --------------------------------------------------------------------------------------------


class RDPAccountant:
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

    def supports(self, event: DPEvent) -> bool:
        return _REGISTRY.supports(event, self._neighbours)

    def compose(self, event: DPEvent, count: int = 1) -> RDPAccountant:
        """Record ``count`` repetitions of ``event``. Everything is checked and computed before the
        state changes, so a raise records nothing."""
        count = v.positive_int(count, "count")
        _check_event(event, self._neighbours)  # dry pass: raises on unsupported / mismatched
        increment = count * _event_rdp(event, self._orders)
        total = self._rdp + increment
        self._rdp = np.where(total > 0, np.nextafter(total, np.inf), total)
        return self

    def get_epsilon(self, delta: float, conversion: str = "improved") -> float:
        """The smallest ε over the orders at this δ, rounded up; δ = 0 gives ∞ once anything is
        spent (see the module docstring)."""
        return self.get_epsilon_and_order(delta, conversion)[0]

    def get_epsilon_and_order(self, delta: float, conversion: str = "improved") -> tuple[float, float]:
        """(ε, the order that attains it); the order is ∞ when δ = 0."""
        return _epsilon_and_order(self._alphas, self._rdp, v.delta(delta), conversion)

    def get_delta(self, epsilon: float, conversion: str = "improved") -> float:
        """The smallest δ over the orders at this ε, rounded up and capped at 1."""
        return self.get_delta_and_order(epsilon, conversion)[0]

    def get_delta_and_order(self, epsilon: float, conversion: str = "improved") -> tuple[float, float]:
        return _delta_and_order(self._alphas, self._rdp, v.epsilon(epsilon), conversion)
