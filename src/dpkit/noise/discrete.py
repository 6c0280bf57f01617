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

Discrete Gaussian with σ on the same idea: M = |Y| = 2^J·A + Lo, where A is drawn by inversion
from the half discrete Gaussian with σ/2^J (σ/2^J ∈ [512, 1024), or J = 0 for σ < 1024) and Lo
is uniform; each draw is accepted with probability exp(−(M² − (2^J·A)²)/(2σ²)) >= e^{-1/64}.
Then P(M = m) ∝ exp(−(2^J a)²/(2σ²))·exp(−(m² − (2^J a)²)/(2σ²)) = exp(−m²/(2σ²)). This is
the rejection scheme of CKS Alg. 3 with a staircase Gaussian proposal instead of a Laplace one:
acceptance above 0.999 instead of about 0.76.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache, partial

import numpy as np
from numpy.typing import NDArray

from dpkit._validate import positive_int
from dpkit.errors import InvalidParameterError
from dpkit.noise._exact import exp_neg_bounds, interval_quotient, lazy_less
from dpkit.noise.bernoulli_exp import CHUNK, decide_exp_neg, decide_exp_neg_small
from dpkit.noise.source import RNG, RandomSource, resolve_rng

__all__ = ["discrete_laplace", "discrete_gaussian", "laplace_plan", "LaplacePlan", "gaussian_plan", "GaussianPlan"]

_U32 = np.uint64(32)
_MASK32 = np.uint64(0xFFFFFFFF)
_MAX_SCALE = Fraction(2) ** 52
_MIN_SCALE = Fraction(1, 2**20)


@dataclass(frozen=True)
class InversionTable:
    """Inversion sampling of a count K >= 0 from certified 32-bit tail thresholds.

    ``thresholds[k-1] = floor(P(K >= k)·2^32)`` for k = 1, 2, … down to the first zero. A 32-bit
    uniform R gives K = #{k : T_k > R}, exactly, unless R equals the next threshold (then more bits
    decide, see :func:`_resolve_count`). A 2^16-bucket guide table answers with one lookup and one
    comparison; buckets holding two or more thresholds (far tails only) use a binary search.
    """

    thresholds: NDArray[np.uint64]  # decreasing, ends with 0; padded with a final 0
    guide: NDArray[np.int64]  # #{k : T_k >= (j+1)·2^16} for bucket j
    crowded: NDArray[np.bool_]  # bucket j holds two or more thresholds
    ascending: NDArray[np.uint64]

    @classmethod
    def build(cls, thresholds: list[int]) -> InversionTable:
        t = np.array(thresholds, dtype=np.uint64)
        edges = np.arange(1, 65537, dtype=np.uint64) << np.uint64(16)
        asc = t[::-1].copy()
        guide = t.size - np.searchsorted(asc, edges, side="left")  # #{T_k >= edge}
        per_bucket = np.bincount((t >> np.uint64(16)).astype(np.int64), minlength=65536)
        return cls(np.append(t, np.uint64(0)), guide.astype(np.int64), per_bucket >= 2, asc)

    def count(self, r: NDArray[np.uint64]) -> tuple[NDArray[np.int64], NDArray[np.intp]]:
        """K for each 32-bit uniform in ``r``, and the lanes whose R ties the next threshold."""
        bucket = (r >> np.uint64(16)).view(np.int64)
        c = self.guide[bucket]
        cnt = c + (self.thresholds[c] > r)
        crowd = np.flatnonzero(self.crowded[bucket])
        if crowd.size:
            cnt[crowd] = self.ascending.size - np.searchsorted(self.ascending, r[crowd], side="right")
        ties = np.flatnonzero(self.thresholds[cnt] == r)
        return cnt, ties


def _counts(
    table: InversionTable, r: NDArray[np.uint64], tail: Callable[[int, int], tuple[int, int]], src: RandomSource
) -> NDArray[np.int64]:
    cnt, ties = table.count(r)
    for i in ties:  # R equals a threshold: compare the same uniform with more bits
        cnt[i] = _resolve_count(int(r[i]), tail, int(cnt[i]) + 1, src)
    return cnt


@dataclass(frozen=True)
class LaplacePlan:
    """Everything a discrete Laplace draw with one scale needs, computed once."""

    scale: Fraction  # the scale sampled, exactly
    lo_bits: int  # J
    hi_scale: Fraction  # M = scale / 2^J
    mid_bits: int  # m
    mid: InversionTable | None  # P(Mid >= v), v = 1..2^m − 1, then 0
    top: InversionTable  # P(Top >= k) = Q^k down to the first zero

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
    plan = LaplacePlan(scale, j, hi, m, None, InversionTable.build([0]))
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
        mid.append(_threshold(lo_, hi_, partial(plan.mid_tail, v)))
    top = []
    t_lo, t_hi = q_lo, q_hi
    k = 1
    while True:
        t_k = _threshold(t_lo, t_hi, partial(plan.top_tail, k))
        top.append(t_k)
        if t_k == 0:
            break
        t_lo, t_hi = t_lo * q_lo >> p, -((-t_hi * q_hi) >> p)
        k += 1
    mid_table = InversionTable.build(mid + [0]) if m else None
    return LaplacePlan(scale, j, hi, m, mid_table, InversionTable.build(top))


def _resolve_count(prefix: int, tail: Callable[[int, int], tuple[int, int]], start: int, src: RandomSource) -> int:
    """Exact count of k >= start with U < tail(k), given U's 32-bit prefix (the rare branch)."""
    bits, k = 32, start
    while True:
        less, prefix, bits = lazy_less(prefix, bits, partial(tail, k), src)
        if not less:
            return k - 1
        k += 1


def _geometric(plan: LaplacePlan, n: int, src: RandomSource) -> tuple[NDArray[np.int64], NDArray[np.uint64]]:
    """n draws of X (P(X = x) ∝ e^{−x/scale}) and, for each, one spare random bit (the top bit)."""
    word_a = src.words(n)
    word_b = src.words(n)
    spare = word_a >> np.uint64(63)
    top = _counts(plan.top, word_b & _MASK32, plan.top_tail, src)
    mid = _counts(plan.mid, word_b >> _U32, plan.mid_tail, src) if plan.mid is not None else np.zeros(n, dtype=np.int64)
    x = (top << np.int64(plan.mid_bits)) + mid
    if not plan.lo_bits:
        return x, spare
    return (x << np.int64(plan.lo_bits)) + _low_part(plan, word_a, src), spare


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
    out = np.empty(word_a.size, dtype=np.int64)
    todo = np.arange(word_a.size)
    words = word_a
    while todo.size:
        r = (words & mask_j).view(np.int64)
        gamma_hat = r.astype(np.float64) * inv
        ok = decide_exp_neg_small(
            gamma_hat, (words >> np.uint64(jbits)) & mask_u, ubits, partial(_over_scale, r, plan.scale), src
        )
        out[todo[ok]] = r[ok]
        todo = todo[~ok]
        words = src.words(todo.size)
    return out


def _over_scale(r: NDArray[np.int64], scale: Fraction, i: int) -> Fraction:
    """The exact γ of lane i, r[i]/scale."""
    return int(r[i]) / scale


def _check_scale(value: object, name: str) -> Fraction:
    if isinstance(value, bool) or not isinstance(value, (int, float, Fraction, np.floating, np.integer)):
        raise InvalidParameterError(name, value, "a finite number in [2**-20, 2**52]")
    if isinstance(value, (float, np.floating)) and not math.isfinite(value):
        raise InvalidParameterError(name, value, "a finite number in [2**-20, 2**52]")
    if isinstance(value, np.floating):  # exact, whatever the width
        f = Fraction(*value.as_integer_ratio())
    else:
        f = Fraction(int(value) if isinstance(value, np.integer) else value)  # exact for floats
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
    >>> bool(abs(np.abs(y).mean() - 2 * np.exp(-0.5) / (1 - np.exp(-1))) < 0.05)
    True
    """
    plan = laplace_plan(_check_scale(scale, "scale"))
    return sample_discrete_laplace(plan, positive_int(size, "size", minimum=0), resolve_rng(rng))


@dataclass(frozen=True)
class GaussianPlan:
    """Everything a discrete Gaussian draw with one σ needs, computed once."""

    sigma: Fraction
    lo_bits: int  # J
    hi_sigma: Fraction  # s = σ / 2^J
    table: InversionTable  # P(A >= k) for the half discrete Gaussian with s
    p_zero: float  # P(A = 0), to size batches

    @property
    def inv_two_sigma2(self) -> float:
        return float(1 / (2 * self.sigma * self.sigma))

    def tail(self, k: int, prec: int) -> tuple[int, int]:
        sums = _half_gauss_sums(self.hi_sigma, prec + 8)
        return _quotient_at(sums, k, prec + 8, prec)


def _quotient_at(sums: tuple[list[int], list[int]], k: int, p: int, prec: int) -> tuple[int, int]:
    s_lo, s_hi = sums
    if k >= len(s_lo):
        return 0, -((-s_hi[-1] << prec) // s_lo[0]) if s_hi[-1] else 0
    lo, hi = interval_quotient((s_lo[k], s_hi[k]), (s_lo[0], s_hi[0]), p)
    return lo >> (p - prec), -((-hi) >> (p - prec))


@lru_cache(maxsize=16)
def _half_gauss_sums(s: Fraction, p: int) -> tuple[list[int], list[int]]:
    """Certified suffix sums S_k = Σ_{a >= k} e^{−a²/(2s²)}, scaled by 2^p, as (lo, hi) lists.

    Terms follow w_{a+1} = w_a·b^{2a+1}, b = e^{−1/(2s²)}, in outward-rounded interval
    arithmetic. Summation stops at the first N with w_N < 2^-p; the rest of the series is at most
    w_N·(1 + 2s²/(2N+1)) (a geometric bound, as 1 − e^{−x} >= x/(1 + x)), added to every upper
    sum. The last entry of each list is that tail bound alone (the sum from N on).
    """
    w = p + 24  # guard bits for the rounding of up to a few 10^4 products
    b_lo, b_hi = exp_neg_bounds(1 / (2 * s * s), w)
    b2_lo, b2_hi = b_lo * b_lo >> w, -((-b_hi * b_hi) >> w)
    w_lo = w_hi = 1 << w
    c_lo, c_hi = b_lo, b_hi  # b^{2a+1} for a = 0
    terms: list[tuple[int, int]] = []
    while w_hi >= (1 << 24):  # w_a >= 2^-p
        terms.append((w_lo, w_hi))
        w_lo, w_hi = w_lo * c_lo >> w, -((-w_hi * c_hi) >> w)
        c_lo, c_hi = c_lo * b2_lo >> w, -((-c_hi * b2_hi) >> w)
    n = len(terms)
    factor = 1 + -((-2 * s * s) // (2 * n + 1))  # ceil(1 + 2s²/(2N+1))
    rest = int(w_hi * factor)
    sums_lo, sums_hi = [0] * (n + 1), [0] * (n + 1)
    sums_hi[n] = rest
    for a in range(n - 1, -1, -1):
        sums_lo[a] = sums_lo[a + 1] + terms[a][0]
        sums_hi[a] = sums_hi[a + 1] + terms[a][1]
    shift = w - p
    return [x >> shift for x in sums_lo], [-((-x) >> shift) for x in sums_hi]


@lru_cache(maxsize=64)
def gaussian_plan(sigma: Fraction) -> GaussianPlan:
    j = 0
    if sigma >= 1024:
        j = max(0, math.floor(math.log2(sigma)) - 9)
        while sigma / (1 << j) >= 1024:
            j += 1
        while j and sigma / (1 << j) < 512:
            j -= 1
    s = sigma / (1 << j)
    p = _PLAN_PREC
    sums = _half_gauss_sums(s, p)
    plan = GaussianPlan(sigma, j, s, InversionTable.build([0]), 0.0)
    thresholds = []
    k = 1
    while True:
        lo, hi = _quotient_at(sums, k, p, p)
        t_k = _threshold(lo, hi, partial(plan.tail, k))
        thresholds.append(t_k)
        if t_k == 0:
            break
        k += 1
    p_zero = 1.0 - thresholds[0] / 2.0**32
    return GaussianPlan(sigma, j, s, InversionTable.build(thresholds), p_zero)


def _gaussian_batch(plan: GaussianPlan, k: int, src: RandomSource) -> NDArray[np.int64]:
    word_a = src.words(k)
    y, ok = gaussian_decide(plan, word_a, lambda: src.words(k), src)
    return y[ok]


def gaussian_decide(
    plan: GaussianPlan,
    word_a: NDArray[np.uint64],
    word_b: Callable[[], NDArray[np.uint64]],
    src: RandomSource,
) -> tuple[NDArray[np.int64], NDArray[np.bool_]]:
    """Each proposal's value and whether it is accepted, lane by lane, from its words: ``word_a``
    (32-bit uniform R, sign in the top bit) and, read after R's ties are settled and only when the
    plan has low bits, ``word_b()`` (the low part and the acceptance prefix). More words of
    ``src`` settle ties and the exp acceptance's margin, in lane order. Lanes are independent:
    deciding any subset of proposals gives those lanes' values and decisions."""
    k = word_a.size
    sign = word_a >> np.uint64(63)
    a = _counts(plan.table, word_a & _MASK32, plan.tail, src)
    jbits = plan.lo_bits
    if jbits:
        wb = word_b()
        ubits = 63 - jbits
        prefix = (wb >> np.uint64(jbits)) & np.uint64((1 << ubits) - 1)
        low = (wb & np.uint64((1 << jbits) - 1)).view(np.int64)
        base = a << np.int64(jbits)
        # γ = low·(2^{J+1}·a + low)/(2σ²). While a < 2^14 both factors are integers below 2^53,
        # so γ̂ carries two roundings plus that of 1/(2σ²): within 2^−50 relative. Larger a has
        # probability below 2^-180 (s < 1024); such a batch sends those lanes to the exact branch.
        gamma_hat = low.astype(np.float64) * ((base << np.int64(1)) + low).astype(np.float64) * plan.inv_two_sigma2
        two_s2 = 2 * plan.sigma * plan.sigma

        def exact(i: int) -> Fraction:
            lo_i = int(low[i])
            return Fraction(lo_i * (2 * (int(a[i]) << jbits) + lo_i)) / two_s2

        if a.max(initial=0) < (1 << 14):
            ok = decide_exp_neg_small(gamma_hat, prefix, ubits, exact, src)
        else:
            err = np.where(a < (1 << 14), gamma_hat * 2.0**-50, np.inf)
            ok = decide_exp_neg(np.where(a < (1 << 14), gamma_hat, 0.0), err, prefix, ubits, exact, src)
        m = base + low
    else:
        m = a
        ok = np.ones(k, dtype=bool)
    ok &= (sign == 0) | (m != 0)  # reject (−, 0): zero would otherwise be counted twice
    return np.where(sign == 1, -m, m), ok


def sample_discrete_gaussian(sigma: Fraction, n: int, src: RandomSource) -> NDArray[np.int64]:
    """n exact draws of the discrete Gaussian with parameter σ (see the module docstring)."""
    plan = gaussian_plan(sigma)
    rate = (1.0 - plan.p_zero / 2) * (0.99 if plan.lo_bits else 1.0)
    return _fill(n, lambda k: _gaussian_batch(plan, k, src), rate)


def discrete_gaussian(sigma: float | Fraction, size: int, *, rng: RNG = None) -> NDArray[np.int64]:
    """``size`` exact draws of the discrete Gaussian: P(Y = y) ∝ exp(−y² / (2σ²)), y ∈ ℤ.

    Source: the rejection scheme of Canonne, Kamath & Steinke (2020), Alg. 3, with a staircase
    Gaussian proposal drawn by certified inversion (see the module docstring), vectorised.
    Sampling is exact for every σ in [2**-20, 2**52].

    >>> import numpy as np
    >>> y = discrete_gaussian(3.0, 200_000, rng=np.random.default_rng(0))
    >>> bool(abs(y.var() - 9.0) < 0.2)
    True
    """
    sig = _check_scale(sigma, "sigma")
    return sample_discrete_gaussian(sig, positive_int(size, "size", minimum=0), resolve_rng(rng))
