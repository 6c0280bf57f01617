"""Private quantiles: the exponential mechanism over the gaps of the sorted data (Smith 2011).

The data are clipped to declared bounds [L, U] and sorted, with the bounds added as end points:
L = x₍₀₎ <= x₍₁₎ <= … <= x₍ₙ₎ <= x₍ₙ₊₁₎ = U. Gap i = [x₍ᵢ₎, x₍ᵢ₊₁₎), i = 0..n, holds the points
with exactly i data values at or below them, and gets utility u_i = −|i − q·n|. Smith's mechanism
picks gap i with probability ∝ (x₍ᵢ₊₁₎ − x₍ᵢ₎)·exp(ε·u_i / 2) and then a uniform point in it:
it is the exponential mechanism over outputs t ∈ [L, U) with utility u(t) = −|#{x <= t} − q·n|
and the uniform base measure (Smith 2011, "Privacy-preserving statistical estimation with optimal
convergence rates", STOC; McSherry & Talwar 2007; Dwork & Roth 2014, Thm 3.10).

Sensitivity of u(t) is 1 for both neighbouring relations:

* ``add_remove``: adding (or removing) one record moves the count #{x <= t} by 0 or 1 and q·n by q,
  in the same direction, so |Δu(t)| <= max(q, 1 − q) <= 1;
* ``replace``: n is unchanged and the count moves by at most 1, so |Δu(t)| <= 1.

Hence ε-DP under either relation (the exponential mechanism's factor 2 is kept: the utilities do
not all move in one direction).

Exact sampling on a lattice. Outputs are the points of the lattice g·ℤ that lie in [L, U), with
g = 2^k chosen from (U − L) and max(|L|, |U|) alone (about 2^40 points across the range; never
from the data). The mechanism is *exactly* the exponential mechanism over that finite output set
with the utility above, so the ε-DP guarantee holds exactly for any data. Gap i is chosen with
probability ∝ c_i·exp(ε·u_i/2), where c_i is the number of lattice points in the gap; for data on
the lattice c_i = (x₍ᵢ₊₁₎ − x₍ᵢ₎)/g, so the gap probabilities are exactly Smith's, and within a gap
the output is uniform on its lattice points (for off-lattice data the gap lengths are off by less
than one lattice step, g <= 2^-40·(U − L)).

Sampling is by rejection from a dyadic envelope, without a floating-point exp. Let γ_i =
ε·(u* − u_i)/2 >= 0 (exact rationals), u* the largest utility of a gap holding a lattice point,
and k_i = ⌊γ_i / ln 2⌋ (or one less, from a certified float bound; capped at 128), so that
e^{−γ_i} <= 2^{−k_i} < 4·e^{−γ_i} for uncapped gaps. A proposal picks a lattice point of gap i with
probability ∝ 2^{−k_i}, i.e. gap i with probability ∝ P_i = c_i·2^{K−k_i} (exact integers, one
uniform big integer below Σ P_i per proposal, located by group of equal k and a ``searchsorted``
over the lattice sizes), and is accepted with probability e^{−γ_i}·2^{k_i} ∈ (1/4, 1]: the exact
comparison U·2^{−k_i} < e^{−γ_i} of :func:`dpkit.noise.bernoulli_exp.decide_exp_neg`, U·2^{−k_i}
being k_i zero bits followed by the bits of U (with the exact rational γ as fallback, as in
:class:`dpkit.mechanisms.selection.Exponential`). An accepted point of gap i thus has probability
∝ c_i·e^{−γ_i} in all, uniform within the gap: exactly the target. The acceptance rate is at least
1/4 whatever the data (about 1/2 or more in practice; the capped gaps carry a proposal share below
2^{42−128}), so a release needs a couple of proposals, run in a small vectorised batch (sized
from the bound 1/4 and the number of outputs, never from the data); the work
over the data (clipping, sorting, lattice sizes, utilities) is vectorised numpy. Only the output
is released.

Accuracy is stated in ranks, from the mechanism's own utility: :meth:`Quantile.rank_error` is the
k such that the released value's rank error |#{x <= t} − q·n| exceeds the best achievable by more
than k with probability at most 1 − confidence (the exponential mechanism's utility theorem over
the m lattice points). k depends on ε, the bounds and the confidence alone, so it costs nothing.
A value interval around the output is not offered: its ends are the data's values at ranks
q·n ± k, and reading them would need a budget of its own (more exponential-mechanism draws, which
would take ε from the quantile itself).

Many quantiles (:class:`Quantiles`) split ε evenly (ε/k each, rounded down) and compose
sequentially (basic composition, Dwork & Roth 2014, Thm 3.16). Future work: the joint exponential
mechanism of Gillenwater, Joseph & Kulesza (2021, "Differentially private quantiles", ICML), which
spends ε once for all k quantiles and is far more accurate for large k.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from functools import partial

import numpy as np
from numpy.typing import ArrayLike, NDArray

from dpkit import _validate as v
from dpkit._validate import Neighbours, decimal_fraction
from dpkit.accounting.events import ComposedEvent, ExponentialEvent
from dpkit.accounting.rounding import to_decimal_down
from dpkit.errors import InvalidParameterError
from dpkit.mechanisms.selection import Exponential
from dpkit.noise.bernoulli_exp import decide_exp_neg
from dpkit.noise.integers import _uniform_below
from dpkit.noise.source import RNG, RandomSource, resolve_rng

__all__ = ["Quantile", "Median", "Quantiles", "quantile_lattice"]

_LATTICE_BITS = 40  # about 2^40 lattice points across [lower, upper)
_MAX_BATCH = 1 << 18
_ENVELOPE_CAP = 128  # envelope exponents k_i are capped here (the envelope stays valid)
_LN2_UP = math.nextafter(math.log(2.0), 1.0)  # >= ln 2 (math.log(2.0) is the double just below)


def quantile_lattice(lower: float, upper: float) -> float:
    """The lattice step g = 2^k of the outputs for bounds [lower, upper) (data-independent).

    g is about 2^-40 of (upper − lower), raised if needed so that every lattice index
    |x/g| stays below 2^53 (each lattice point is then an exact double).

    >>> quantile_lattice(0.0, 100.0) == 2.0**-34
    True
    """
    width_exp = math.frexp(upper / 2 - lower / 2)[1] + 1  # (upper − lower) < 2^width_exp, no overflow
    mag_exp = math.frexp(max(abs(lower), abs(upper)))[1]  # max |bound| < 2^mag_exp
    exponent = max(width_exp - 1 - _LATTICE_BITS, mag_exp - 53, -1022)
    return math.ldexp(1.0, exponent)


def _ceil_div(x: NDArray[np.float64], g: float) -> NDArray[np.float64]:
    """⌈x/g⌉ (x/g is exact: g is a power of two; a positive x that underflows still gives 1)."""
    c = np.ceil(x / g)
    return np.where((c == 0) & (x > 0), 1.0, c)


def _check_q(q: object, name: str = "q") -> float:
    return v.probability(q, name, low_open=False, high_open=False)


@dataclass(frozen=True)
class _Prepared:
    """Everything one data set needs for sampling (built once per release, no randomness).

    The non-empty gaps are listed in ``order`` sorted by their envelope exponent; ``cum`` holds
    the running totals of their lattice sizes in that order (int64, exact), and ``group_size`` the
    total lattice size of each exponent d = 0..max k.
    """

    edges: NDArray[np.float64]  # the sorted clipped data x₍₁₎..x₍ₙ₎
    first: NDArray[np.int64]  # first lattice index of each gap, i = 0..n (= ⌈x₍ᵢ₎/g⌉)
    gamma_hat: NDArray[np.float64]  # ≈ γ_i = ε/2·(|i − qn| − d*), i = 0..n, clipped at 0
    gamma_err: NDArray[np.float64]  # |γ_i − gamma_hat_i| <= gamma_err_i
    d_star: Fraction  # min over non-empty gaps of |i − q·n|
    k: NDArray[np.int64]  # envelope exponent per gap: e^{−γ_i} <= 2^{−k_i}, 0 <= k_i <= C
    order: NDArray[np.int64]  # non-empty gaps sorted by k (stable)
    cum: NDArray[np.int64]  # cum[j] = lattice points in gaps order[0..j]
    group_size: tuple[int, ...]  # S_d = lattice points in the non-empty gaps with k = d
    accept_rate: float  # ≈ Σ c_i·e^{−γ_i} / Σ c_i·2^{−k_i} (>= 1/4), for tests; never sizes a batch


@dataclass(frozen=True, kw_only=True)
class Quantile:
    """ε-DP q-quantile of values clipped to [lower, upper]: Smith's exponential mechanism.

    Guarantee: ε-DP under ``add_remove`` and under ``replace`` (the utility −|#{x <= t} − q·n| has
    sensitivity 1 for both; see the module docstring). Outputs lie on the lattice g·ℤ ∩ [lower,
    upper), g = :func:`quantile_lattice` (lower, upper); sampling is exact on that lattice. The
    bounds must be chosen without looking at the data.

    Totality: :meth:`release` never raises on a data value: a NaN is treated as 0 (a NaN has no
    place in a query with a declared sensitivity) and then clipped to [lower, upper] like every
    value, ±inf clip to the bounds. Clipping is per record, so neighbours stay neighbours and the
    guarantee is unchanged. Only public facts raise: a non-numeric dtype, an empty array.

    >>> import numpy as np
    >>> med = Quantile(epsilon=1.0, q=0.5, lower=0.0, upper=100.0)
    >>> x = np.random.default_rng(0).normal(40.0, 10.0, 10_001)
    >>> bool(abs(med.release(x, rng=np.random.default_rng(1)) - np.median(x)) < 1.0)
    True
    >>> med.event
    ExponentialEvent(epsilon=1.0, neighbours='add_remove')
    """

    epsilon: float
    q: float
    lower: float
    upper: float
    neighbours: Neighbours = "add_remove"

    def __post_init__(self) -> None:
        object.__setattr__(self, "epsilon", v.epsilon(self.epsilon))
        object.__setattr__(self, "q", _check_q(self.q))
        lo, hi = v.bounds(self.lower, self.upper)
        object.__setattr__(self, "lower", lo)
        object.__setattr__(self, "upper", hi)
        v.neighbours(self.neighbours)
        g = self.granularity
        if math.ceil(hi / g) - math.ceil(lo / g) < 1:
            raise InvalidParameterError(
                "bounds",
                (lo, hi),
                "bounds at least a few units in the last place apart",
                "No output lattice point fits between them.",
            )

    @property
    def granularity(self) -> float:
        """The output lattice step g (a power of two)."""
        return quantile_lattice(self.lower, self.upper)

    @property
    def event(self) -> ExponentialEvent:
        return ExponentialEvent(epsilon=self.epsilon, neighbours=self.neighbours)

    @property
    def outputs(self) -> int:
        """m, the number of output lattice points in [lower, upper) (from the bounds alone)."""
        g = self.granularity
        return math.ceil(self.upper / g) - math.ceil(self.lower / g)

    def rank_error(self, confidence: float = 0.95) -> float:
        """k, in rows: with probability at least ``confidence`` the released value t has
        |#{x <= t} − q·n| <= k + d*, where d* is the smallest rank error any output can have (the
        distance from q·n to the nearest achievable count: at most 1/2 for distinct values at
        least a lattice step apart; with ties, at most about half the rows tied at the quantile).
        k depends on ε, the bounds and ``confidence`` alone, never on the data, so it is published
        with every release for free; the value interval it implies, between the data's values of
        rank q·n ± (k + d*), is not: reading those values would be a second look at the data.

        Theorem: with β = 1 − confidence and m = :attr:`outputs`,

            k = (2/ε)·ln((m − 1)·(1 − β)/β)   (about (2/ε)·(27.7 + ln(1/β)) for m ≈ 2^40),

        the utility theorem of the exponential mechanism (McSherry & Talwar 2007; Dwork & Roth
        2014, Thm 3.11; :meth:`~dpkit.mechanisms.selection.Exponential.utility_gap`) for the
        utility −|#{x <= t} − q·n| of sensitivity 1 over the m lattice points, weighted
        exp(ε·u/2) as this sampler draws them (module docstring). It holds for any data: an
        optimal output holds at least one lattice point, and at most m − 1 can lie k below it.
        It is tight for data that leave one lattice point optimal and the rest of the range k rows
        away (half the rows at one lattice point, half at the next), and loose for data spread
        over the range, where the worst-case ln m is mostly unused. The bound is per release: for
        :class:`Quantiles` each part's bound holds at ``confidence`` (all at once with
        probability at least 1 − k·(1 − confidence), by a union bound).

        >>> med = Median(epsilon=1.0, lower=0.0, upper=100.0)
        >>> round(med.rank_error(0.95), 1)
        62.2
        """
        mech = Exponential(epsilon=self.epsilon, sensitivity=1.0, neighbours=self.neighbours)
        return mech.utility_gap(self.outputs, confidence)

    def release(self, values: ArrayLike, *, rng: RNG = None) -> float:
        """The private q-quantile of ``values`` (a float on the output lattice)."""
        return float(self._draw_many(values, 1, rng=rng)[0])

    def release_clipped(self, values: ArrayLike, *, rng: RNG = None) -> float:
        """The private q-quantile of values already clipped to [lower, upper], possibly none.

        For callers that clip per record themselves, such as a query engine releasing one
        quantile per group: an empty group must still get its draw. ``rng`` is anything
        :meth:`release` accepts, a :class:`~dpkit.noise.source.RandomSource` included.

        Guarantee: the same as :meth:`release` (ε-DP under ``add_remove`` and ``replace``), and the
        same output distribution and random draws: the values go through the same NaN rule,
        clipping (a no-op on clipped values) and sort. An empty input is fine because the
        mechanism never needed a data point: with n = 0 there is one gap, [lower, upper), and the
        output is uniform on its lattice points, the exponential mechanism over the same output
        set with every utility equal. The sensitivity argument holds for n = 0 (adding a record
        to an empty data set moves each utility by at most 1). Only a non-numeric input raises.

        >>> med = Quantile(epsilon=1.0, q=0.5, lower=0.0, upper=10.0)
        >>> t = med.release_clipped([], rng=np.random.default_rng(0))
        >>> bool(0.0 <= t < 10.0)
        True
        """
        x = np.asarray(values, dtype=np.float64).ravel()
        x = np.where(np.isnan(x), 0.0, x)  # the NaN rule of ``release``
        x = np.sort(np.clip(x, self.lower, self.upper))
        return float(self._sample(self._prepare(x), 1, resolve_rng(rng))[0])

    def gap_probabilities(self, values: ArrayLike) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """(edges, probabilities) of Smith's continuous mechanism, in floating point (display/tests).

        ``edges`` are L, the sorted clipped data and U; gap i = [edges[i], edges[i+1]).
        """
        x = self._data(values)
        n = x.size
        edges = np.concatenate([[self.lower], x, [self.upper]])
        u = -np.abs(np.arange(n + 1) - self.q * n)
        w = np.diff(edges) * np.exp(self.epsilon / 2 * (u - u.max()))
        return edges, w / w.sum()

    # --- internals ------------------------------------------------------------------------------

    def _data(self, values: ArrayLike) -> NDArray[np.float64]:
        x = v.data_array(values, "values").ravel()  # NaN → 0, then clipped like every value
        return np.sort(np.clip(x, self.lower, self.upper))

    def _prepare(self, x: NDArray[np.float64]) -> _Prepared:
        n = x.size
        g = self.granularity
        bounds = np.array([self.lower, self.upper])
        c = _ceil_div(np.concatenate([bounds[:1], x, bounds[1:]]), g)
        counts = np.diff(c)  # lattice points in each gap (exact: integers below 2^53)
        nonempty = counts > 0
        idx = np.arange(n + 1, dtype=np.float64)
        qn_hat = self.q * n  # one rounding: |error| <= qn·2^-53
        dist = np.abs(idx - qn_hat)  # |error| <= 2·(n+1)·2^-53
        qn = Fraction(self.q) * n
        j = int(np.flatnonzero(nonempty)[np.argmin(dist[nonempty])])
        # The float argmin may miss the exact one by a rounding: check the neighbours exactly.
        cand = [k for k in (j - 1, j, j + 1) if 0 <= k <= n and nonempty[k]]
        d_star = min(abs(k - qn) for k in cand)
        half_eps = float(decimal_fraction(self.epsilon) / 2)  # within half an ulp of the exact ε/2
        gamma_hat = np.maximum((dist - float(d_star)) * half_eps, 0.0)
        # Absolute error of dist − d*: <= 4·(n+1)·2^-53; times ε/2 plus two roundings.
        gamma_err = gamma_hat * 2.0**-50 + half_eps * (n + 1) * 2.0**-50
        k = _envelope_exponent(gamma_hat, gamma_err)
        ne = np.flatnonzero(nonempty)
        order = ne[np.argsort(k[ne], kind="stable")].astype(np.int64)
        sizes = counts[order].astype(np.int64)
        cum = np.cumsum(sizes)  # <= 2^42: exact in int64
        k_used = int(k[order[-1]])
        ends = np.searchsorted(k[order], np.arange(k_used + 1), side="right")  # order is sorted by k
        totals = np.concatenate([[0], cum])[ends]
        group_size = tuple(int(s) for s in np.diff(totals, prepend=0))
        envelope = float((counts[ne] * np.ldexp(1.0, -k[ne])).sum())
        rate = float((counts[ne] * np.exp(-gamma_hat[ne])).sum()) / envelope
        return _Prepared(x, c.astype(np.int64), gamma_hat, gamma_err, d_star, k, order, cum, group_size, rate)

    def _draw_many(self, values: ArrayLike, count: int, *, rng: RNG = None) -> NDArray[np.float64]:
        """``count`` independent releases on the same data (internal: costs count × ε).

        Used by :meth:`release` (count = 1) and by the statistical tests.
        """
        x = self._data(values)
        return self._sample(self._prepare(x), count, resolve_rng(rng))

    def _sample(
        self, prep: _Prepared, count: int, src: RandomSource, stats: dict[str, int] | None = None
    ) -> NDArray[np.float64]:
        """``count`` exact draws by rejection from the dyadic envelope (see the module docstring).

        ``stats``, if given, receives ``proposals`` (the proposals a one-at-a-time sampler would
        have made for these ``count`` outputs) and ``drawn`` (the proposals actually generated,
        including the unused tail of the last batch): a test hook, not part of the output.
        """
        g = self.granularity
        half_eps = decimal_fraction(self.epsilon) / 2  # ε at its decimal value: what the event charges
        qn = Fraction(self.q) * prep.edges.size
        d_star = prep.d_star
        top = len(prep.group_size) - 1  # largest exponent in use
        # Group d carries proposal mass T_d = S_d·2^{top−d}; base[d] = Σ_{d' < d} T_d'.
        base = [0]
        for d, size in enumerate(prep.group_size):
            base.append(base[-1] + (size << (top - d)))
        start = np.cumsum([0, *prep.group_size])[:-1].astype(np.int64)  # first position of each group in cum
        out = np.empty(count, dtype=np.float64)
        done = proposals = drawn = 0
        while done < count:
            need = count - done
            # Sized from the proven acceptance bound 1/4, never from the data's own rate: the
            # amount of randomness drawn (and the work done) must not depend on the data.
            batch = int(min(4 * need + 16, _MAX_BATCH))
            group, rest = _locate_groups(_uniform_big(base[-1], batch, src), base, top)
            pos = start[group] + rest  # position among all lattice points of the non-empty gaps, by k
            j = np.searchsorted(prep.cum, pos, side="right")
            gap = prep.order[j]
            before = np.where(j > 0, prep.cum[np.maximum(j - 1, 0)], 0)
            m = prep.first[gap] + (pos - before)  # uniform lattice point of the chosen gap
            t = m.astype(np.float64) * g  # exact: |m| < 2^53, g a power of two
            # Accept with probability e^{−γ_i}·2^{k_i}: U·2^{−k_i} < e^{−γ_i}, U uniform on [0, 1).
            # U·2^{−k_i} is k_i zero bits followed by U's bits, so its first 53 + k_i bits are U's
            # first 53 (< 2^53, exact as doubles; 2^{−53−k_i} >= 2^{−53−C} is a normal double).
            prefix = src.words(batch) >> np.uint64(11)
            ok = np.zeros(batch, dtype=bool)
            k_lane = prep.k[gap]
            for d in np.unique(k_lane):
                lanes = np.flatnonzero(k_lane == d)
                gl = gap[lanes]
                ok[lanes] = decide_exp_neg(
                    prep.gamma_hat[gl],
                    prep.gamma_err[gl],
                    prefix[lanes],
                    53 + int(d),
                    partial(_gap_gamma, half_eps, qn, d_star, gl),
                    src,
                )
            hit_idx = np.flatnonzero(ok)[:need]
            out[done : done + hit_idx.size] = t[hit_idx]
            done += hit_idx.size
            drawn += batch
            proposals += int(hit_idx[-1]) + 1 if done == count else batch
        if stats is not None:
            stats["proposals"] = proposals
            stats["drawn"] = drawn
        return out


def _gap_gamma(half_eps: Fraction, qn: Fraction, d_star: Fraction, gaps: NDArray[np.int64], i: int) -> Fraction:
    """The exact γ of lane i: ε/2·(|gap − q·n| − d*)."""
    return half_eps * (abs(int(gaps[i]) - qn) - d_star)


def _envelope_exponent(gamma_hat: NDArray[np.float64], err: NDArray[np.float64]) -> NDArray[np.int64]:
    """k_i = ⌊γ_i / ln 2⌋ or one less, capped at C; always k_i·ln 2 <= γ_i (so e^{−γ_i} <= 2^{−k_i}).

    With γ >= γ̂ − err and _LN2_UP >= ln 2, the three correctly rounded operations below each
    raise a positive value by at most a factor 1 + 2^-53, which the factor 1 − 2^-50 more than
    undoes: the computed value is <= (γ̂ − err)/ln 2 <= γ/ln 2, and it is below γ/ln 2 by far less
    than one unless err is (it is <= 2^-50·(γ + ε·(n+1)/2)), so k is the floor or one less.
    """
    a = np.maximum((gamma_hat - err) / _LN2_UP * (1.0 - 2.0**-50), 0.0)
    return np.minimum(np.floor(a), _ENVELOPE_CAP).astype(np.int64)


def _uniform_big(m: int, size: int, src: RandomSource) -> NDArray:
    """``size`` exact uniform integers in [0, m), m >= 1 (int64 if m <= 2^63, else Python ints).

    Beyond 2^63: the top bits of ⌈bits(m)/64⌉ secure words, rejecting values >= m (chance < 1/2).
    """
    if m <= 1 << 63:
        return _uniform_below(m, size, src).astype(np.int64)
    b = m.bit_length()
    nw = -(-b // 64)
    out = np.empty(size, dtype=object)
    todo = np.arange(size)
    while todo.size:
        w = src.words(todo.size * nw).reshape(todo.size, nw)
        r = np.zeros(todo.size, dtype=object)
        for col in range(nw):
            r = (r << 64) | w[:, col].astype(object)
        r = r >> (64 * nw - b)  # the top b bits: uniform on [0, 2^b)
        good = r < m
        out[todo[good]] = r[good]
        todo = todo[~good]
    return out


def _locate_groups(r: NDArray, base: list[int], top: int) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """Group d of each r (base[d] <= r < base[d+1]) and the rank ⌊(r − base[d]) / 2^{top−d}⌋.

    Group d's mass is S_d·2^{top−d}, so the rank is uniform on [0, S_d) given the group.
    """
    if r.dtype != object:
        b = np.array(base, dtype=np.int64)
        group = np.searchsorted(b, r, side="right") - 1
        shift = (top - group).astype(np.uint64)
        return group.astype(np.int64), ((r - b[group]).astype(np.uint64) >> shift).astype(np.int64)
    group = np.empty(r.size, dtype=np.int64)
    rank = np.empty(r.size, dtype=np.int64)
    for i, ri in enumerate(r):
        d = bisect.bisect_right(base, ri) - 1
        group[i] = d
        rank[i] = (ri - base[d]) >> (top - d)
    return group, rank


@dataclass(frozen=True, kw_only=True)
class Median(Quantile):
    """ε-DP median: :class:`Quantile` with q = 0.5 (same guarantee, same sampler).

    >>> Median(epsilon=1.0, lower=0.0, upper=10.0).q
    0.5
    """

    q: float = 0.5

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.q != 0.5:
            raise InvalidParameterError("q", self.q, "0.5 for Median (use Quantile for other levels)")


@dataclass(frozen=True, kw_only=True)
class Quantiles:
    """ε-DP quantiles at several levels ``qs``: one :class:`Quantile` per level with ε/k each.

    Guarantee: ε-DP under ``add_remove`` or ``replace`` by basic sequential composition of k
    exponential mechanisms (Dwork & Roth 2014, Thm 3.16); each part's ε is ε/k rounded down, so
    the parts never add up to more than ε. Outputs are independent releases, in the order of
    ``qs`` (not forced to be monotone; sorting them is free post-processing).

    >>> import numpy as np
    >>> qs = Quantiles(epsilon=3.0, qs=[0.25, 0.5, 0.75], lower=0.0, upper=100.0)
    >>> qs.parts[0].epsilon
    1.0
    >>> x = np.random.default_rng(0).uniform(0.0, 100.0, 10_000)
    >>> r = qs.release(x, rng=np.random.default_rng(2))
    >>> bool(np.all(np.abs(r - [25.0, 50.0, 75.0]) < 2.0))
    True
    """

    epsilon: float
    qs: Sequence[float]
    lower: float
    upper: float
    neighbours: Neighbours = "add_remove"

    def __post_init__(self) -> None:
        object.__setattr__(self, "epsilon", v.epsilon(self.epsilon))
        if isinstance(self.qs, (str, bytes)) or not isinstance(self.qs, Sequence | np.ndarray):
            raise InvalidParameterError("qs", self.qs, "a non-empty sequence of numbers in [0, 1]")
        qs = tuple(_check_q(q, f"qs[{i}]") for i, q in enumerate(self.qs))
        if not qs:
            raise InvalidParameterError("qs", self.qs, "a non-empty sequence of numbers in [0, 1]")
        object.__setattr__(self, "qs", qs)
        lo, hi = v.bounds(self.lower, self.upper)
        object.__setattr__(self, "lower", lo)
        object.__setattr__(self, "upper", hi)
        v.neighbours(self.neighbours)

    @property
    def epsilon_each(self) -> float:
        return to_decimal_down(decimal_fraction(self.epsilon) / len(self.qs))

    @property
    def parts(self) -> tuple[Quantile, ...]:
        e = self.epsilon_each
        return tuple(
            Quantile(epsilon=e, q=q, lower=self.lower, upper=self.upper, neighbours=self.neighbours) for q in self.qs
        )

    @property
    def event(self) -> ComposedEvent:
        return ComposedEvent(tuple(p.event for p in self.parts))

    def rank_error(self, confidence: float = 0.95) -> float:
        """Each part's :meth:`Quantile.rank_error` (the same for every part: each spends ε/k):
        each released quantile is within it, with probability ``confidence`` for each."""
        return self.parts[0].rank_error(confidence)

    def release(self, values: ArrayLike, *, rng: RNG = None) -> NDArray[np.float64]:
        """The private quantiles, one per level in ``qs``."""
        parts = self.parts
        x = parts[0]._data(values)  # validates once; the same clipping for every part
        src = resolve_rng(rng)
        return np.array([float(p._sample(p._prepare(x), 1, src)[0]) for p in parts])
