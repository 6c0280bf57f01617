"""Exact discrete Laplace and discrete Gaussian samplers, vectorised.

Discrete Laplace with scale t: P(Y = y) ∝ exp(−|y|/t) on the integers. We draw Y = ±X with X
geometric, P(X = x) ∝ ρ^x, ρ = e^{−1/t}, rejecting (−, 0) (Canonne, Kamath & Steinke 2020,
Alg. 2). Instead of CKS's per-sample loop we use a fact about geometric variables: the bits of X
are independent, so X splits into independent parts at any bit position,

    X = Lo + 2^J · (Mid + 2^m · Top),

    Lo  ∈ [0, 2^J):  P(Lo = r)  ∝ e^{−r/t}          nearly uniform (t = M·2^J, M ∈ [512, 1024)):
                                                      a uniform proposal, accepted w.p. e^{−r/t}
    Mid ∈ [0, 2^m):  P(Mid = v) ∝ e^{−v/M}          inversion through a 2^16-entry guide table
    Top ∈ {0, 1, …}: P(Top >= k) = e^{−k·2^m/M}     inversion, ratio <= e^{−1}: a few thresholds

Every comparison is against certified 32-bit thresholds (integers computed with interval
arithmetic); a uniform that ties a threshold, or lands inside the margin of the Lo acceptance,
is settled exactly with more random bits. Two 64-bit words per sample on average.

The split works for any rational scale t = M·2^J (M ∈ [512, 1024) need not be an integer), so
the scale is sampled exactly as asked.

Discrete Gaussian with σ: CKS Alg. 3 — propose discrete Laplace with t >= ⌊σ⌋ + 1 and accept
with probability exp(−(|y| − σ²/t)² / (2σ²)), decided by :func:`decide_exp_neg`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache

import numpy as np
from numpy.typing import NDArray

from dpkit.errors import InvalidParameterError
from dpkit.noise._exact import exp_neg_bounds, interval_quotient, lazy_less
from dpkit.noise.bernoulli_exp import CHUNK, decide_exp_neg
from dpkit.noise.source import RNG, RandomSource, resolve_rng

__all__ = ["discrete_laplace", "discrete_gaussian", "laplace_plan", "LaplacePlan"]

_U32 = np.uint64(32)
_MASK32 = np.uint64(0xFFFFFFFF)
_MAX_SCALE = Fraction(2) ** 52
_MIN_SCALE = Fraction(1, 2**20)


@dataclass(frozen=True)
class LaplacePlan:
    """Everything a discrete Laplace draw with one scale needs, computed once."""

    scale: Fraction  # the scale sampled, exactly
    lo_bits: int  # J
    hi_scale: Fraction  # M = scale / 2^J
    mid_bits: int  # m
    mid_thresholds: NDArray[np.uint64]  # T_v = floor(P(Mid >= v)·2^32), v = 1..2^m − 1, then 0
    mid_guide: NDArray[np.intp]  # number of T_v >= (j+1)·2^16, per top-16-bit bucket j
    top_thresholds: NDArray[np.uint64]  # floor(Q^k·2^32), k = 1..K, last one 0

    def mid_tail(self, v: int, prec: int) -> tuple[int, int]:
        """Enclose P(Mid >= v)·2^prec = (ρ^v − ρ^{2^m}) / (1 − ρ^{2^m})·2^prec."""
        w = prec + 16
        a = exp_neg_bounds(v / self.hi_scale, w)
        b = exp_neg_bounds((1 << self.mid_bits) / self.hi_scale, w)
        one = 1 << w
        return interval_quotient((a[0] - b[1], a[1] - b[0]), (one - b[1], one - b[0]), prec)

    def top_tail(self, k: int, prec: int) -> tuple[int, int]:
        return exp_neg_bounds(k * (1 << self.mid_bits) / self.hi_scale, prec)


def _floor32(lo: int, hi: int, prec: int) -> int | None:
    """floor(v·2^32) from lo <= v·2^prec <= hi, or None if the enclosure straddles a step."""
    a, b = lo >> (prec - 32), hi >> (prec - 32)
    return a if a == b else None


def _threshold(lo: int, hi: int, exact: Callable[[int], tuple[int, int]]) -> int:
    t = _floor32(lo, hi, _PLAN_PREC)
    while t is None:  # a value within 2^-150 of a step: recompute it alone, more precisely
        prec = 2 * _PLAN_PREC
        t = _floor32(*exact(prec), prec)
    return t


_PLAN_PREC = 192


@lru_cache(maxsize=256)
def laplace_plan(scale: Fraction) -> LaplacePlan:
    """The sampling plan for a discrete Laplace with exactly the given (rational) scale."""
    j = 0
    if scale >= 1024:
        j = max(0, math.floor(math.log2(scale)) - 9)
        while scale / (1 << j) >= 1024:  # guard the float log2 near powers of two
            j += 1
        while j and scale / (1 << j) < 512:
            j -= 1
    hi = scale / (1 << j)
    m = 0
    while (1 << m) < hi:
        m += 1
    plan = LaplacePlan(scale, j, hi, m, np.zeros(0, np.uint64), np.zeros(0, np.intp), np.zeros(0, np.uint64))
    # Powers of ρ = e^{-1/M} as certified intervals by repeated multiplication at 192 bits
    # (each product loses at most one unit in the last place, far below the 32 bits needed).
    p = _PLAN_PREC
    r_lo, r_hi = exp_neg_bounds(1 / hi, p)
    pw = [(1 << p, 1 << p)]
    for _ in range(1 << m):
        lo_, hi_ = pw[-1]
        pw.append((lo_ * r_lo >> p, -((-hi_ * r_hi) >> p)))
    q_lo, q_hi = pw[-1]  # Q = ρ^{2^m}
    one = 1 << p
    den = (one - q_hi, one - q_lo)
    mid = []
    for v in range(1, 1 << m):
        lo_, hi_ = interval_quotient((pw[v][0] - q_hi, pw[v][1] - q_lo), den, p)
        mid.append(_threshold(lo_, hi_, lambda prec, v=v: plan.mid_tail(v, prec)))
    mid_arr = np.array(mid + [0], dtype=np.uint64)
    edges = np.arange(1, 65537, dtype=np.float64) * 65536.0
    # guide[j] = #{v : T_v >= (j+1)·2^16}; the thresholds decrease with v
    guide = np.searchsorted(-mid_arr[:-1].astype(np.float64), -edges, side="right")
    top = []
    t_lo, t_hi = q_lo, q_hi
    k = 1
    while True:
        t_k = _threshold(t_lo, t_hi, lambda prec, k=k: plan.top_tail(k, prec))
        top.append(t_k)
        if t_k == 0:
            break
        t_lo, t_hi = t_lo * q_lo >> p, -((-t_hi * q_hi) >> p)
        k += 1
    return LaplacePlan(scale, j, hi, m, mid_arr, guide.astype(np.intp), np.array(top, dtype=np.uint64))


def _resolve_count(prefix: int, tail, start: int, src: RandomSource) -> int:
    """Exact count of k >= start with U < tail(k), given U's 32-bit prefix (the rare branch)."""
    bits, k = 32, start
    while True:
        less, prefix, bits = lazy_less(prefix, bits, lambda p, k=k: tail(k, p), src)
        if not less:
            return k - 1
        k += 1


def _geometric(plan: LaplacePlan, n: int, src: RandomSource) -> tuple[NDArray[np.int64], NDArray[np.uint64]]:
    """n draws of X (P(X = x) ∝ e^{−x/scale}) and, for each, one spare random bit (the top bit)."""
    word_a = src.words(n)
    word_b = src.words(n)
    spare = word_a >> np.uint64(63)
    # Mid by inversion: count of thresholds above the uniform, via the guide table.
    r_mid = word_b >> _U32
    if plan.mid_bits:
        c = plan.mid_guide[(r_mid >> np.uint64(16)).astype(np.intp)]
        nxt = plan.mid_thresholds[c]
        mid = c + (nxt > r_mid)
        for i in np.flatnonzero(nxt == r_mid):
            mid[i] = _resolve_count(int(r_mid[i]), plan.mid_tail, int(c[i]) + 1, src)
    else:
        mid = np.zeros(n, dtype=np.intp)
    # Top by inversion over its few thresholds (P(Top >= 1) <= e^-1), following only the lanes
    # still below the last threshold passed.
    r_top = word_b & _MASK32
    thresholds = plan.top_thresholds
    below = r_top < thresholds[0]
    top = below.astype(np.int64)
    for i in np.flatnonzero(r_top == thresholds[0]):
        top[i] = _resolve_count(int(r_top[i]), plan.top_tail, 1, src)
    lanes = np.flatnonzero(below)
    for k, t_k in enumerate(thresholds[1:], start=2):
        if not lanes.size:
            break
        r = r_top[lanes]
        for i in lanes[r == t_k]:
            top[i] = _resolve_count(int(r_top[i]), plan.top_tail, k, src)
        lanes = lanes[r < t_k]
        top[lanes] = k
    x = (top << np.int64(plan.mid_bits)) + mid.astype(np.int64)
    if plan.lo_bits:
        x = (x << np.int64(plan.lo_bits)) + _low_part(plan, word_a, src)
    return x, spare


def _low_part(plan: LaplacePlan, word_a: NDArray[np.uint64], src: RandomSource) -> NDArray[np.int64]:
    """Lo ∈ [0, 2^J) with P(Lo = r) ∝ e^{−r/scale}: uniform r accepted w.p. e^{−r/scale}.

    r is the low J bits of the word and the acceptance uniform's prefix is bits J..62; bit 63 is
    left to the caller. γ̂ = r·(1/scale) has relative error <= 2^−52 (one rounding of 1/M and one
    of the product), covered by err = γ̂·2^−50.
    """
    jbits = plan.lo_bits
    ubits = 63 - jbits
    mask_j = np.uint64((1 << jbits) - 1)
    mask_u = np.uint64((1 << ubits) - 1)
    inv = float(1 / plan.scale)
    ulp = 2.0**-ubits
    out = np.empty(word_a.size, dtype=np.int64)
    todo = np.arange(word_a.size)
    words = word_a
    while todo.size:
        r = words & mask_j
        gamma_hat = r.astype(np.float64) * inv
        u = ((words >> np.uint64(jbits)) & mask_u).astype(np.float64) * ulp
        # Fast accept: e^{−γ} >= 1 − γ >= 1 − γ̂(1 + 2^−50); the float evaluation errs by less
        # than 2^−52 absolute, so 2^−50 more slack keeps this a lower bound. About one lane in
        # 2^9 needs the full decision.
        ok = u + ulp <= 1.0 - gamma_hat * (1.0 + 2.0**-50) - 2.0**-50
        rest = np.flatnonzero(~ok)
        if rest.size:
            r_rest = r[rest]
            g_rest = gamma_hat[rest]
            ok[rest] = decide_exp_neg(
                g_rest,
                g_rest * 2.0**-50,
                (words[rest] >> np.uint64(jbits)) & mask_u,
                ubits,
                lambda i, r_rest=r_rest: Fraction(int(r_rest[i])) / plan.scale,
                src,
            )
        out[todo[ok]] = r[ok].astype(np.int64)
        todo = todo[~ok]
        words = src.words(todo.size)
    return out


def _check_size(size: object) -> int:
    if not isinstance(size, (int, np.integer)) or isinstance(size, bool) or int(size) < 0:
        raise InvalidParameterError("size", size, "an integer >= 0")
    return int(size)


def _check_scale(value: object, name: str) -> Fraction:
    if isinstance(value, bool) or not isinstance(value, (int, float, Fraction, np.floating, np.integer)):
        raise InvalidParameterError(name, value, "a finite number in [2**-20, 2**52]")
    if isinstance(value, (float, np.floating)) and not math.isfinite(value):
        raise InvalidParameterError(name, value, "a finite number in [2**-20, 2**52]")
    f = Fraction(value)  # exact for floats
    if not _MIN_SCALE <= f <= _MAX_SCALE:
        raise InvalidParameterError(name, value, "a finite number in [2**-20, 2**52]")
    return f


def _fill(n: int, draw: Callable[[int], NDArray[np.int64]], rate: float) -> NDArray[np.int64]:
    """n accepted draws from a rejection sampler, asking for enough proposals at once.

    ``draw(k)`` makes k proposals and returns the accepted ones, in order. Keeping the first n
    accepted values of an i.i.d. proposal stream is exact; over-asking by a few percent means
    one round almost always suffices.
    """
    out = np.empty(n, dtype=np.int64)
    have = 0
    while have < n:
        need = n - have
        got = draw(min(CHUNK, int(need / rate * 1.02) + 16))[:need]
        out[have : have + got.size] = got
        have += got.size
    return out


def _laplace_batch(plan: LaplacePlan, k: int, src: RandomSource) -> NDArray[np.int64]:
    x, sign = _geometric(plan, k, src)
    keep = (sign == 0) | (x != 0)  # reject (−, 0): zero would otherwise be counted twice
    return np.where(sign == 1, -x, x)[keep]


def _laplace_rate(plan: LaplacePlan) -> float:
    p_zero = 1.0 - math.exp(-1.0 / float(plan.scale))  # P(X = 0); half of those are rejected
    return 1.0 - p_zero / 2


def sample_discrete_laplace(plan: LaplacePlan, n: int, src: RandomSource) -> NDArray[np.int64]:
    rate = _laplace_rate(plan)
    return _fill(n, lambda k: _laplace_batch(plan, k, src), rate)


def discrete_laplace(scale: float | Fraction, size: int, *, rng: RNG = None) -> NDArray[np.int64]:
    """``size`` exact draws of the discrete Laplace: P(Y = y) ∝ exp(−|y| / scale), y ∈ ℤ.

    ``scale`` is taken at its exact binary value (or pass a :class:`~fractions.Fraction`) and
    sampled exactly. Source: Canonne, Kamath
    & Steinke (2020), "The Discrete Gaussian for Differential Privacy", Alg. 2, vectorised by
    bit-splitting the geometric (see the module docstring).

    >>> import numpy as np
    >>> y = discrete_laplace(2.0, 100_000, rng=np.random.default_rng(0))
    >>> abs(np.abs(y).mean() - 2 * np.exp(-0.5) / (1 - np.exp(-1))) < 0.05
    True
    """
    plan = laplace_plan(_check_scale(scale, "scale"))
    return sample_discrete_laplace(plan, _check_size(size), resolve_rng(rng))


def sample_discrete_gaussian(sigma: Fraction, n: int, src: RandomSource) -> NDArray[np.int64]:
    """CKS Alg. 3: discrete Laplace proposals, accepted with probability exactly e^{−γ},
    γ = (|y| − σ²/t)² / (2σ²)."""
    s2 = sigma * sigma
    plan = laplace_plan(Fraction(math.floor(sigma) + 1))
    t = plan.scale
    c = float(s2 / t)
    inv2s2 = float(1 / (2 * s2))
    inv_s2 = float(1 / s2)
    lap_rate = _laplace_rate(plan)

    def batch(k: int) -> NDArray[np.int64]:
        y = _fill(k, lambda j: _laplace_batch(plan, j, src), lap_rate)
        a_abs = np.abs(y).astype(np.float64)  # exact while |y| < 2^53
        d = a_abs - c
        gamma_hat = d * d * inv2s2
        # One rounding each in c, d, d² and the product by 1/(2σ²) gives
        # |γ̂ − γ| <= 2^−52·(c + |y|)²/σ² + 2^−51·γ̂; err (one bound for the whole batch) is 8x
        # that. A batch holding |y| >= 2^52 gets per-lane bounds, infinite for those lanes.
        a_max = float(a_abs.max(initial=0.0))
        err: NDArray[np.float64] | float = 2.0**-49 * ((c + a_max) ** 2 * inv_s2 + float(gamma_hat.max(initial=0.0)))
        if a_max >= 2.0**52:
            ca = c + a_abs
            err = np.where(a_abs < 2.0**52, 2.0**-49 * (ca * ca * inv_s2 + gamma_hat), np.inf)
        ok = decide_exp_neg(
            gamma_hat,
            err,
            src.words(k) >> np.uint64(11),
            53,
            lambda i: (abs(int(y[i])) - s2 / t) ** 2 / (2 * s2),
            src,
        )
        return y[ok]

    # Acceptance is about 0.76 for t ≈ σ (CKS Sec. 5); ask a little more than 1/0.7.
    return _fill(n, batch, 0.7)


def discrete_gaussian(sigma: float | Fraction, size: int, *, rng: RNG = None) -> NDArray[np.int64]:
    """``size`` exact draws of the discrete Gaussian: P(Y = y) ∝ exp(−y² / (2σ²)), y ∈ ℤ.

    Source: Canonne, Kamath & Steinke (2020), Alg. 3 (discrete Laplace proposal, Bernoulli(exp)
    acceptance), vectorised. Sampling is exact for every σ in [2**-20, 2**52].

    >>> import numpy as np
    >>> y = discrete_gaussian(3.0, 200_000, rng=np.random.default_rng(0))
    >>> abs(y.var() - 9.0) < 0.2
    True
    """
    sig = _check_scale(sigma, "sigma")
    return sample_discrete_gaussian(sig, _check_size(size), resolve_rng(rng))
