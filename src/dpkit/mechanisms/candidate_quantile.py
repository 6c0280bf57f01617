"""A quantile chosen among a finite set of candidates (for integer or coarse data)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from dpkit import _validate as v
from dpkit._validate import Neighbours, decimal_fraction
from dpkit.accounting.events import ExponentialEvent
from dpkit.errors import InvalidDataError, InvalidParameterError
from dpkit.mechanisms.selection import Exponential
from dpkit.noise.source import RNG, resolve_rng

__all__ = ["CandidateQuantile"]


@dataclass(frozen=True, kw_only=True)
class CandidateQuantile:
    """The q-quantile chosen among declared ``candidates`` by the exponential mechanism.

    Score of candidate c: −|(1 − q)·#{x < c} − q·#{x > c}|, which is 0 at an exact q-quantile
    whatever the ties (the scoring of OpenDP's ``make_quantile_score_candidates``). Adding or
    removing one record moves one of the two counts by 1, so the score by at most
    max(q, 1 − q); replacing one moves it by at most (1 − q) + q = 1. The exponential mechanism is
    run with that sensitivity Δ (ε/(2Δ) per unit of score) and is ε-DP (McSherry & Talwar 2007). The candidates must be chosen without looking at the data — e.g. the integers of
    a declared age range. On integer data this beats gap-based sampling (:class:`Quantile`), which
    spends its randomness spreading the answer inside a gap. Sampling is exact
    (:class:`~dpkit.mechanisms.selection.Exponential`).

    Totality: :meth:`release` never raises on a data value: a NaN is treated as 0 (a NaN has no
    place in a query with a declared sensitivity), ±inf count as below or above every candidate.
    Each record still moves one count by at most 1, so the sensitivity above is unchanged. Only
    public facts raise: dtype, shape, an empty array.

    >>> import numpy as np
    >>> ages = np.random.default_rng(0).integers(18, 90, size=10_000)
    >>> m = CandidateQuantile(epsilon=1.0, q=0.5, candidates=np.arange(0, 101))
    >>> bool(abs(m.release(ages, rng=np.random.default_rng(1)) - np.median(ages)) <= 1)
    True
    """

    epsilon: float
    q: float
    candidates: Any
    neighbours: Neighbours = "add_remove"

    def __post_init__(self) -> None:
        object.__setattr__(self, "epsilon", v.epsilon(self.epsilon))
        object.__setattr__(self, "q", v.probability(self.q, "q", low_open=False, high_open=False))
        v.neighbours(self.neighbours)
        try:
            c = np.asarray(self.candidates, dtype=np.float64)
        except (TypeError, ValueError):
            raise InvalidParameterError("candidates", self.candidates, "a 1-D array of finite numbers") from None
        if c.ndim != 1 or c.size == 0 or not np.all(np.isfinite(c)):
            raise InvalidParameterError("candidates", self.candidates, "a non-empty 1-D array of finite numbers")
        c = np.unique(c)  # sorted, distinct
        c.setflags(write=False)
        object.__setattr__(self, "candidates", c)

    @property
    def sensitivity(self) -> float:
        """Of the score: max(q, 1 − q) under add/remove, 1 under replace."""
        return max(self.q, 1.0 - self.q) if self.neighbours == "add_remove" else 1.0

    @property
    def event(self) -> ExponentialEvent:
        return ExponentialEvent(epsilon=self.epsilon, neighbours=self.neighbours)

    def scores(self, values: ArrayLike) -> NDArray[np.float64]:
        """−|(1 − q)·#{x < c} − q·#{x > c}| for every candidate c (vectorised)."""
        below, above = self._counts(values)
        return -np.abs((1 - self.q) * below - self.q * above)

    def release(self, values: ArrayLike, *, rng: RNG = None) -> float:
        """The chosen candidate (scored in exact integers, as :meth:`release_counts`)."""
        return self.release_counts(*self._counts(values), rng=rng)

    def _counts(self, values: ArrayLike) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
        x = v.data_array(values, "values")  # NaN → 0; ±inf sort below/above every candidate
        if x.ndim != 1:
            raise InvalidDataError("values", f"has shape {x.shape}", "a 1-D array")
        xs = np.sort(x)
        below = np.searchsorted(xs, self.candidates, side="left").astype(np.int64)
        return below, (x.size - np.searchsorted(xs, self.candidates, side="right")).astype(np.int64)

    def release_counts(self, below: ArrayLike, above: ArrayLike, *, rng: RNG = None) -> float:
        """The chosen candidate, from counts alone: ``below[j]`` = #{x < c_j} and ``above[j]`` =
        #{x > c_j} for every candidate c_j (for instance counted inside a query engine, so that
        no value leaves it). All counts may be 0 (then every candidate is equally likely).

        Guarantee: the same as :meth:`release` (ε-DP under ``add_remove`` and ``replace``), computed
        in exact integers: with q = a/b (q read as the decimal it prints as, its denominator at most
        2^16, else the nearest such fraction, a public change of q), the score is scaled to
        −|(b − a)·below − a·above| and the sensitivity to max(a, b − a) (``add_remove``) or b
        (``replace``), so no rounding can move a score by more than the sensitivity says. Scores
        are shifted by their maximum before the exponential mechanism (which leaves its output
        distribution unchanged); they are exact doubles unless a score lies more than 2^53 below
        the best, a candidate whose probability is below exp(−2^52·ε/sensitivity).

        >>> m = CandidateQuantile(epsilon=1.0, q=0.5, candidates=[0, 1, 2, 3, 4])
        >>> m.release_counts([0, 10, 40, 70, 100], [100, 80, 40, 20, 0], rng=np.random.default_rng(0))
        2.0
        """
        lo = np.asarray(below)
        hi = np.asarray(above)
        size = self.candidates.size
        for name, arr in (("below", lo), ("above", hi)):
            if arr.shape != (size,) or arr.dtype.kind not in "iu" or (arr.size and arr.min() < 0):
                raise InvalidParameterError(
                    name, f"an array of shape {arr.shape} and dtype {arr.dtype}", f"{size} counts (integers >= 0)"
                )
        a, b = self._level()
        lo64, hi64 = lo.astype(np.int64), hi.astype(np.int64)
        if max(int(lo64.max(initial=0)), int(hi64.max(initial=0))) >= 2**45:
            raise InvalidDataError("counts", "above 2**45", "counts below 2**45 (exact integer scores)")
        scores = -np.abs((b - a) * lo64 - a * hi64)  # |.| < 2^61: exact in int64
        shifted = (scores - scores.max(initial=0)).astype(np.float64)
        return float(self._selection(a, b).release(shifted, candidates=list(self.candidates), rng=resolve_rng(rng)))

    def rank_error(self, confidence: float = 0.95) -> float:
        """k, in rows: with probability at least ``confidence`` the released candidate's rank
        error is at most k plus half the rows in the grid step that holds the q-quantile. k
        depends on ε, q, the neighbour relation and the number of candidates M alone, never on
        the data, so it is published with every release for free.

        The rank error of a candidate c is the distance from q·n to [#{x < c}, #{x <= c}] (0 when
        c is a q-quantile of the data). Theorem: with β = 1 − confidence and Δ the score's
        sensitivity (max(q, 1 − q) under ``add_remove``, 1 under ``replace``),

            k = (2Δ/ε)·ln((M − 1)·(1 − β)/β),

        and P[rank error(out) > k + |s*|] <= β, where s* is the best score, |s*| <= w/2 and w is
        the number of rows in [c_L, c_R], c_L the last candidate whose score function
        (1 − q)·#{x < c} − q·#{x > c} is <= 0 and c_R the next one.

        Proof: the utility theorem of the exponential mechanism
        (:meth:`~dpkit.mechanisms.selection.Exponential.utility_gap`; McSherry & Talwar 2007;
        Dwork & Roth 2014, Thm 3.11) bounds the score: |s(out)| < |s*| + k except with
        probability β. The rank error is at most |s(c)|: with b = #{x < c}, e = #{x = c}, the score
        function is b − q·n + q·e, which is >= b − q·n, and −(it) = q·n − b − e + (1 − q)·e. The
        score function rises from <= 0 at the lower bound to >= 0 at the upper, by
        (1 − q)·#{x = c_L} + #{c_L < x < c_R} + q·#{x = c_R} <= w from c_L to c_R, so one of the two
        has |s| <= w/2. Here w is the grid's resolution at the quantile: the rows tied at a
        candidate or between two (for integer data on a unit grid, the ties at the median; for
        continuous data on a fine grid, rarely more than one). Without it no public bound can
        hold: all the rows strictly between two candidates leave every candidate n·min(q, 1 − q)
        away. q is read as the mechanism reads it (:meth:`release_counts`).

        >>> m = CandidateQuantile(epsilon=1.0, q=0.5, candidates=np.arange(0, 101))
        >>> round(m.rank_error(0.95), 2)
        7.55
        """
        a, b = self._level()
        return self._selection(a, b).utility_gap(self.candidates.size, confidence) / b

    def _level(self) -> tuple[int, int]:
        """q as the exact fraction a/b the scores use (its decimal value, denominator <= 2^16)."""
        q = decimal_fraction(self.q)
        if q.denominator > 2**16:
            q = q.limit_denominator(2**16)
        return q.numerator, q.denominator

    def _selection(self, a: int, b: int) -> Exponential:
        """The exponential mechanism over the integer scores −|(b − a)·below − a·above|."""
        delta = max(a, b - a) if self.neighbours == "add_remove" else b
        return Exponential(epsilon=self.epsilon, sensitivity=float(delta), neighbours=self.neighbours)
