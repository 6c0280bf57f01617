"""Smooth sensitivity (Nissim, Raskhodnikova & Smith 2007) for the median and order statistics.

Theory (NRS 2007, Def. 2.1–2.2, Lemmas 2.6/2.7, Cor. 2.4; "平滑敏感度"). For a
query f and β > 0 the β-smooth sensitivity is

    S*(x) = max_{k >= 0} e^{−kβ} A^(k)(x),   A^(k)(x) = max_{y : d(x, y) <= k} LS_f(y),

the smallest function that is >= the local sensitivity LS_f and β-smooth (S(x) <= e^β S(x') for
neighbours x, x'). Neighbours are ``replace`` (Hamming distance 1, n fixed and public): the rank
of the median depends on n, so add/remove is *not* covered.

For the r-th order statistic of data clipped to [l, u], sorted x_1 <= … <= x_n and padded with
x_i = l for i <= 0 and x_i = u for i > n (NRS Prop. 3.4):

    A^(k)(x) = max_{0 <= t <= k+1} (x_{r+t} − x_{r+t−k−1}),   A^(k) = u − l for k >= n.

The median is the order statistic of rank r = ⌈n/2⌉ = (n + 1) // 2 (the lower median for even n).

Mechanisms (NRS Lemma 2.5 with the admissible noises of Lemma 2.7 / Example 2 there):

* ``noise="laplace"``: β = ε / (2 ln(2/δ)), release f(x) + (2 S(x)/ε)·Z, Z standard Laplace:
  (ε, δ)-DP: NRS 2007's Laplace instance with α = ε/2, i.e. noise S(x)/α.
* ``noise="cauchy"``: h(z) ∝ 1/(1 + z²) (γ = 2) is (α, β)-admissible with α = β = ε/(2(γ+1)) = ε/6,
  so f(x) + (6 S(x)/ε)·Z with Z standard Cauchy is ε-DP (pure).

Floating-point safety. The release is J·g where J is the index of the lattice cell
[g(J − ½), g(J + ½)) that contains the *continuous* value f(x) + b·Z, b = c·S(x)/ε. The cell is found
exactly by inversion: U uniform on (0, 1) from the random source, J = min{j : U < F((g(j + ½) − f)/b)}
with F the CDF of Z; every comparison is certified (a float fast path with a 2^-40 margin, else
lazily read bits of U against mpmath interval enclosures of F, :func:`dpkit.noise._exact.lazy_less`).
So the output is a deterministic, data-independent function (rounding to g·ℤ) of the exact
continuous mechanism: private by post-processing, with NRS's proof unchanged. This is why we do
*not* use the lattice discrete Laplace here: with a data-dependent scale its dilation property would
need a separate proof, while the cell method inherits NRS directly. The lattice g = 2^(⌊log2(u − l)⌋
− 24) is a fixed function of the declared bounds only (never of S or the data), so rounding adds at
most g/2 ≈ 2^-25 (u − l) of error.

Rounding of S against ourselves: the weights e^{−kβ} are a running product of r ≥ e^{−β} (rounded
up) and the result is rounded up one ulp, so the computed S is >= LS and its smoothness is at most
β + 2^-48 (every term's ratio to its neighbour term is within (1 + 2^-51)^4 of e^β; floating-point
rounding is monotone, so A^(k)(x) <= A^(k+1)(x') survives rounding). The mechanism computes S with
β' = β(1 − 2^-30) − 2^-46 < β − 2^-48, and uses max(S, 2^-40·(u − l)) — a maximum of β-smooth
functions that are >= LS is again one — so the scale never underflows to 0.

>>> import numpy as np
>>> smooth_sensitivity_median([1.0, 2.0, 3.0], lower=0.0, upper=4.0, beta=10.0) > 1.0
True
>>> mech = SmoothSensitivityMedian(epsilon=1.0, delta=1e-6, lower=0.0, upper=100.0)
>>> round(mech.beta, 6)
0.034462
>>> out = mech.release(np.arange(101.0), rng=np.random.default_rng(0))
>>> abs(out - 50.0) < 50
True
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

from dpkit import _validate as v
from dpkit._validate import Neighbours
from dpkit.accounting.events import ApproxDPEvent, PureDPEvent
from dpkit.accounting.rounding import decimal_down
from dpkit.errors import InvalidDataError, InvalidParameterError
from dpkit.noise._exact import lazy_less
from dpkit.noise.source import RNG, RandomSource, resolve_rng

__all__ = [
    "smooth_sensitivity_median",
    "smooth_sensitivity_order_statistic",
    "SmoothSensitivityMedian",
]

Noise = Literal["laplace", "cauchy"]
_NOISE_FACTOR = {"laplace": 2.0, "cauchy": 6.0}  # b = factor · S / ε
_LATTICE_BITS = 24  # g = 2^(⌊log2(u − l)⌋ − 24)
_FLOOR_BITS = 40  # S >= 2^-40 (u − l)
_MARGIN = 2.0**-40  # fast-path margin on CDF values (absolute)
_BIG = 2.0**50  # fast path only for cell offsets below this


# --- smooth sensitivity -----------------------------------------------------------------------


def _check_bounds(lower: object, upper: object) -> tuple[float, float]:
    lo, hi = v.bounds(lower, upper)
    width = hi - lo
    if not (math.isfinite(width) and 2.0**-900 <= width <= 2.0**900):
        raise InvalidParameterError("bounds", (lower, upper), "bounds with upper − lower in [2**-900, 2**900]")
    return lo, hi


def _data(values: ArrayLike) -> NDArray[np.float64]:
    """Values as a 1-D float array, NaN → 0 and ±inf kept for the clipping to [lower, upper]
    (total on values; only dtype, shape and emptiness raise)."""
    x = v.data_array(values, "values")
    if x.ndim > 1:
        raise InvalidDataError("values", f"has shape {x.shape}", "a 1-D array of numbers")
    return x.ravel().astype(np.float64)


def _smooth_sorted(x: NDArray[np.float64], rank: int, lower: float, upper: float, beta: float) -> float:
    """β-smooth sensitivity of the ``rank``-th order statistic (1-based) of sorted, clipped x."""
    n = x.size
    pad = n + 2
    padded = np.concatenate([np.full(pad, lower), x, np.full(pad, upper)])  # x_i at padded[i − 1 + pad]
    width = upper - lower  # >= every computed difference (rounding is monotone)
    ratio = math.nextafter(math.nextafter(math.exp(-beta), 1.0), 1.0)  # >= e^{−β}
    weight, best = 1.0, 0.0
    for k in range(n + 1):
        if weight * width <= best:  # later terms are <= weight·width: none can win
            break
        t = np.arange(k + 2)
        hi = padded[rank + t - 1 + pad]
        lo = padded[rank + t - k - 2 + pad]
        best = max(best, weight * float(np.max(hi - lo)))
        weight *= ratio
    return math.nextafter(best, math.inf)


def smooth_sensitivity_order_statistic(values: ArrayLike, k: int, *, lower: float, upper: float, beta: float) -> float:
    """The β-smooth sensitivity of the k-th smallest value (k = 1 … n) of ``values`` clipped to
    [lower, upper], under ``replace`` neighbours (NRS 2007, Prop. 3.4).

    Exact up to upward rounding (see the module docstring); O(n·K) for K the number of distances
    examined before e^{−Kβ}(u − l) drops below the running maximum (at most n + 1).

    >>> smooth_sensitivity_order_statistic([0.0, 1.0, 1.0, 1.0, 5.0], 3, lower=0.0, upper=5.0, beta=1.0) > 0
    True
    """
    lo, hi = _check_bounds(lower, upper)
    beta = v.positive(beta, "beta")
    x = np.sort(np.clip(_data(values), lo, hi))
    rank = v.positive_int(k, "k")
    if rank > x.size:
        raise InvalidParameterError("k", k, f"an integer in [1, n] (n = {x.size})")
    return _smooth_sorted(x, rank, lo, hi, beta)


def smooth_sensitivity_median(values: ArrayLike, *, lower: float, upper: float, beta: float) -> float:
    """The β-smooth sensitivity of the median (rank (n + 1) // 2) of ``values`` clipped to
    [lower, upper], under ``replace`` neighbours (NRS 2007, Prop. 3.4).

    >>> smooth_sensitivity_median([5.0] * 9, lower=0.0, upper=10.0, beta=0.1) > 0
    True
    """
    x = _data(values)
    return smooth_sensitivity_order_statistic(x, (x.size + 1) // 2, lower=lower, upper=upper, beta=beta)


# --- exact lattice cell of f + b·Z ------------------------------------------------------------


def _cdf_np(noise: str, z: NDArray[np.float64]) -> NDArray[np.float64]:
    if noise == "laplace":
        return np.where(z <= 0, 0.5 * np.exp(np.minimum(z, 0.0)), 1.0 - 0.5 * np.exp(-np.maximum(z, 0.0)))
    return 0.5 + np.arctan(z) / np.pi


def _icdf_np(noise: str, u: NDArray[np.float64]) -> NDArray[np.float64]:
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        if noise == "laplace":
            return np.where(u < 0.5, np.log(2.0 * u), -np.log(2.0 * (1.0 - u)))
        return np.tan(np.pi * (u - 0.5))


def _scaled(raw: tuple, prec: int, up: bool) -> int:
    """floor (or ceil) of value·2^prec for an mpmath raw mpf (sign, man, exp, bc), exactly."""
    sign, man, exp, _ = raw
    e = exp + prec
    if e >= 0:
        q, inexact = man << e, False
    else:
        q, inexact = man >> -e, (man & ((1 << -e) - 1)) != 0
    if sign:
        return -q - (1 if inexact and not up else 0)
    return q + (1 if inexact and up else 0)


def _cdf_bounds(noise: str, cell: int, delta: float, b: float, g: float, prec: int) -> tuple[int, int]:
    """Integers (lo, hi) with lo <= F(((cell + ½)·g − delta)/b)·2^prec <= hi, by interval arithmetic."""
    from mpmath import iv

    saved = iv.prec
    iv.prec = prec + 64
    try:
        arg = (iv.mpf(2 * cell + 1) * iv.mpf(g / 2) - iv.mpf(delta)) / iv.mpf(b)
        a_lo, a_hi = arg._mpi_

        def cdf(negative: bool):  # each branch is increasing on all of ℝ
            if noise == "cauchy":
                return iv.mpf(0.5) + iv.atan2(arg, iv.mpf(1)) / iv.pi
            return iv.mpf(0.5) * iv.exp(arg) if negative else iv.mpf(1) - iv.mpf(0.5) * iv.exp(-arg)

        lower = cdf(a_lo[0] == 1 or a_lo[1] == 0)._mpi_[0]
        upper = cdf(a_hi[0] == 1 or a_hi[1] == 0)._mpi_[1]
    finally:
        iv.prec = saved
    return _scaled(lower, prec, False), _scaled(upper, prec, True)


def _exact_cell(
    noise: str, delta: float, b: float, g: float, prefix: int, bits: int, guess: int, src: RandomSource
) -> int:
    """min{j : U < c_j}, c_j = F(((j + ½)g − delta)/b), U's known prefix given; galloping then
    bisection, every comparison certified by :func:`lazy_less` (more bits of U as needed)."""
    state = [prefix, bits]

    def less(j: int) -> bool:
        ans, state[0], state[1] = lazy_less(state[0], state[1], lambda p: _cdf_bounds(noise, j, delta, b, g, p), src)
        return ans

    step = 1
    if less(guess):
        hi = guess
        while True:
            lo = hi - step
            if not less(lo):
                break
            hi, step = lo, step * 2
    else:
        lo = guess
        while True:
            hi = lo + step
            if less(hi):
                break
            lo, step = hi, step * 2
    while hi - lo > 1:  # invariant: U >= c_lo, U < c_hi
        mid = (lo + hi) // 2
        if less(mid):
            hi = mid
        else:
            lo = mid
    return hi


def sample_lattice_cells(
    noise: str, center: float, scale: float, granularity: float, size: int, src: RandomSource
) -> NDArray[np.float64]:
    """``size`` independent draws of g·J, J the index of the cell [g(J − ½), g(J + ½)) holding
    center + scale·Z (Z standard Laplace or Cauchy), sampled exactly.

    Write center = j0·g + delta (|delta| <= g/2, exact). U = w·2^-64 + (later bits) from the source.
    Fast path (vectorised): guess J − j0 = i by float inversion, then accept if
    U_high <= ĉ_i − 2^-40 and U_low >= ĉ_{i−1} + 2^-40, where ĉ are float CDF values: the argument
    ((i ± ½)g − delta)/b has relative error <= 2^-52 ((i ± ½)g is exact for |i| < 2^50), moving F by
    <= 2^-52 (|z F'(z)| <= 1/2), and numpy's exp/arctan are within a few ulp, so |ĉ − c| < 2^-44.
    Every other lane (about 2^-38·b/g of them) is settled exactly by :func:`_exact_cell`.
    """
    g, b = granularity, scale
    j0 = round(center / g)
    delta = center - j0 * g  # exact: |delta| <= g/2 and both terms are multiples of ulp(delta)
    w = src.words(size)
    uf = (w >> np.uint64(11)).astype(np.float64) * 2.0**-53  # U in [uf, uf + 2^-53)
    z = _icdf_np(noise, uf + 2.0**-54)
    with np.errstate(over="ignore", invalid="ignore"):
        t = np.floor((delta + b * z) / g + 0.5)
    ok = np.isfinite(t) & (np.abs(t) < _BIG)
    i = np.where(ok, t, 0.0)
    with np.errstate(over="ignore", invalid="ignore"):
        c_hi = _cdf_np(noise, ((i + 0.5) * g - delta) / b)
        c_lo = _cdf_np(noise, ((i - 0.5) * g - delta) / b)
    decided = ok & (uf + 2.0**-53 <= c_hi - _MARGIN) & (uf >= c_lo + _MARGIN)
    out = (float(j0) + i) * g
    for lane in np.flatnonzero(~decided):
        guess = int(i[lane]) if ok[lane] else (0 if not np.isfinite(t[lane]) else int(t[lane]))
        cell = _exact_cell(noise, delta, b, g, int(w[lane]), 64, guess, src)
        out[lane] = float(j0 + cell) * g
    return out


# --- the mechanism ----------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class SmoothSensitivityMedian:
    """Private median by smooth sensitivity (NRS 2007), ``replace`` neighbours.

    * ``noise="laplace"`` (default): (ε, δ)-DP with β = ε/(2 ln(2/δ)) and noise (2 S/ε)·Laplace(1);
      ``delta`` in (0, 1) is required.
    * ``noise="cauchy"``: pure ε-DP with β = ε/6 and noise (6 S/ε)·Cauchy(1); ``delta`` must be
      left out (None) or 0.

    ``neighbours``: ``"replace"`` only (the analysis treats n as public), recorded in ``event``.
    Data are clipped to [lower, upper]; n is public. The released value is on the lattice
    g·ℤ, g = 2^(⌊log2(upper − lower)⌋ − 24), sampled exactly (module docstring).

    Totality: :meth:`release` never raises on a data value: a NaN is treated as 0 (a NaN has no
    place in a query with a declared sensitivity) and then clipped like every value, ±inf clip to
    the bounds. Clipping is per record, so neighbours stay neighbours and the guarantee is
    unchanged. Only public facts raise: dtype, shape, an empty array.

    >>> import numpy as np
    >>> m = SmoothSensitivityMedian(epsilon=1.0, lower=0.0, upper=10.0, noise="cauchy")
    >>> m.event
    PureDPEvent(epsilon=1.0, neighbours='replace')
    >>> isinstance(m.release([1.0, 2.0, 3.0], rng=np.random.default_rng(1)), float)
    True
    """

    epsilon: float
    delta: float | None = None
    lower: float
    upper: float
    noise: Noise = "laplace"
    neighbours: Neighbours = "replace"

    def __post_init__(self) -> None:
        if v.neighbours(self.neighbours) != "replace":
            # The local-sensitivity analysis fixes n (NRS 2007, Sec. 3): add/remove is not covered.
            raise InvalidParameterError(
                "neighbours",
                self.neighbours,
                "'replace'",
                "the smooth-sensitivity analysis of the median treats n as public",
            )
        object.__setattr__(self, "epsilon", v.epsilon(self.epsilon))
        lo, hi = _check_bounds(self.lower, self.upper)
        object.__setattr__(self, "lower", lo)
        object.__setattr__(self, "upper", hi)
        if self.noise not in _NOISE_FACTOR:
            raise InvalidParameterError("noise", self.noise, "'laplace' or 'cauchy'")
        if self.noise == "laplace":
            if self.delta is None:
                raise InvalidParameterError(
                    "delta", None, "a number in (0, 1)", "Laplace smooth sensitivity is (ε, δ)-DP"
                )
            object.__setattr__(self, "delta", v.delta(self.delta, allow_zero=False))
        elif self.delta not in (None, 0, 0.0):
            raise InvalidParameterError(
                "delta", self.delta, "None or 0 for noise='cauchy'", "Cauchy noise gives pure ε-DP"
            )
        else:
            object.__setattr__(self, "delta", None)
        if not self.beta >= 2.0**-40:
            raise InvalidParameterError("epsilon", self.epsilon, "a value giving β >= 2**-40")
        if not math.isfinite(self.worst_case_scale):
            raise InvalidParameterError("epsilon", self.epsilon, "a value giving a finite noise scale")

    # -- parameters --
    @property
    def beta(self) -> float:
        """The smoothness parameter of the analysis: ε/(2 ln(2/δ)) (Laplace) or ε/6 (Cauchy)."""
        if self.noise == "laplace":
            return self._eps / (2.0 * math.log(2.0 / self.delta))  # type: ignore[operator]
        return self._eps / 6.0

    @property
    def _eps(self) -> float:
        # ε at its decimal value (what the event charges), rounded down for the float arithmetic
        return decimal_down(self.epsilon)

    @property
    def _beta_computed(self) -> float:
        return self.beta * (1.0 - 2.0**-30) - 2.0**-46  # leaves room for β + 2^-48 rounding slack

    @property
    def granularity(self) -> float:
        """The output lattice g (a function of the bounds only)."""
        return math.ldexp(1.0, math.floor(math.log2(self.upper - self.lower)) - _LATTICE_BITS)

    @property
    def _floor(self) -> float:
        return math.ldexp(1.0, math.floor(math.log2(self.upper - self.lower)) - _FLOOR_BITS)

    @property
    def worst_case_scale(self) -> float:
        """The noise scale for S = upper − lower, the largest S can be (data-independent)."""
        return _NOISE_FACTOR[self.noise] * (self.upper - self.lower) / self.epsilon

    @property
    def event(self) -> ApproxDPEvent | PureDPEvent:
        if self.noise == "laplace":
            return ApproxDPEvent(self.epsilon, self.delta, "replace")  # type: ignore[arg-type]
        return PureDPEvent(self.epsilon, "replace")

    # -- data-dependent quantities (NOT private: for the curator's eyes only) --
    def _median_and_s(self, values: ArrayLike) -> tuple[float, float]:
        x = np.sort(np.clip(_data(values), self.lower, self.upper))
        rank = (x.size + 1) // 2
        s = _smooth_sorted(x, rank, self.lower, self.upper, self._beta_computed)
        return float(x[rank - 1]), max(s, self._floor)

    def smooth_sensitivity(self, values: ArrayLike) -> float:
        """The S used for ``values`` (depends on the data: do not publish)."""
        return self._median_and_s(values)[1]

    def scale(self, values: ArrayLike) -> float:
        """The noise scale b = factor·S/ε for ``values``, rounded up (depends on the data)."""
        return math.nextafter(_NOISE_FACTOR[self.noise] * self.smooth_sensitivity(values) / self._eps, math.inf)

    # -- release --
    def _sample(self, values: ArrayLike, size: int, src: RandomSource) -> NDArray[np.float64]:
        """``size`` independent releases on the same data (each costs the full ε; tests only)."""
        median, s = self._median_and_s(values)
        b = math.nextafter(_NOISE_FACTOR[self.noise] * s / self._eps, math.inf)
        return sample_lattice_cells(self.noise, median, b, self.granularity, size, src)

    def release(self, values: ArrayLike, *, rng: RNG = None) -> float:
        """The private median of ``values`` (clipped to [lower, upper]) as a float on the lattice."""
        return float(self._sample(values, 1, resolve_rng(rng))[0])

    def error_bound(self, beta: float = 0.05, *, values: ArrayLike | None = None) -> float:
        """a with P(|release − clipped median| > a) <= ``beta``.

        Without ``values`` the bound uses the worst case S = upper − lower and is public. With
        ``values`` it uses their S: tighter, but it depends on the data and is not private.
        Laplace: b·ln(1/β) + g/2; Cauchy: b·tan(π(1 − β)/2) + g/2.
        """
        p = v.probability(beta, "beta")
        b = self.worst_case_scale if values is None else self.scale(values)
        t = math.log(1.0 / p) if self.noise == "laplace" else math.tan(math.pi * (1.0 - p) / 2.0)
        return math.nextafter(b * t + self.granularity / 2, math.inf)
