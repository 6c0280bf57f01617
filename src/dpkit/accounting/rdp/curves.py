"""Per-mechanism Rényi DP curves: pure functions of numbers (cached where expensive).

Each function returns R(α) at every order α of the grid, for one mechanism; the theorem behind
each curve is stated in its docstring and in :mod:`dpkit.accounting.rdp`. The orders themselves
are validated here (finite numbers > 1; the default grid is :data:`DEFAULT_RDP_ORDERS`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from numbers import Real
from typing import overload

import numpy as np
from numpy.typing import NDArray
from scipy.special import gammaln, log_ndtr

from dpkit import _validate as v
from dpkit.errors import InvalidParameterError

__all__ = [
    "DEFAULT_RDP_ORDERS",
    "gaussian_rdp",
    "laplace_rdp",
    "randomized_response_rdp",
    "pure_dp_rdp",
    "poisson_subsampled_gaussian_rdp",
    "sampled_without_replacement_gaussian_rdp",
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


@overload
def _log_comb(n: float, k: float) -> float: ...
@overload
def _log_comb(n: float | FloatArray, k: FloatArray) -> FloatArray: ...
def _log_comb(n: float | FloatArray, k: float | FloatArray) -> float | FloatArray:
    """ln |C(n, k)| via log-gamma (generalised binomial coefficients for fractional n)."""
    return gammaln(n + 1.0) - gammaln(k + 1.0) - gammaln(n - k + 1.0)


@overload
def _log_expm1(c: float) -> float: ...
@overload
def _log_expm1(c: FloatArray) -> FloatArray: ...
def _log_expm1(c: float | FloatArray) -> float | FloatArray:
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
            order = float(a[idx])
            if math.isfinite(log_a[pos]):
                out[idx] = log_a[pos] / (order - 1.0)
            else:  # convexity of ln A_α between the neighbouring integers
                lo, hi = math.floor(order), math.ceil(order)
                t = order - lo
                out[idx] = ((1.0 - t) * log_a_int(lo) + t * log_a_int(hi)) / (order - 1.0)
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
