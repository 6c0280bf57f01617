"""Local sensitivity of common queries, and why it cannot be used directly.

The local sensitivity of ``f`` at the actual dataset ``D`` (Dwork & Roth 2014
§7; Nissim, Raskhodnikova & Smith 2007) is

    LS_f(D) = max over neighbours D' of D of |f(D) − f(D')|,

and the local sensitivity at distance ``k`` is A^(k)(D) = max over D' with d(D, D') <= k of
LS_f(D'). Unlike the global sensitivity it depends on the data, so **noise calibrated to it is not
differentially private** (Nissim, Raskhodnikova & Smith 2007):
:func:`release_with_local_sensitivity` does exactly that, for teaching, and the tests show with
:func:`dpkit.audit.estimate_epsilon` that it leaks.
The safe ways to use it are propose-test-release (:mod:`dpkit.mechanisms.ptr`), smooth sensitivity
and sample-and-aggregate.

Every function states its neighbour relation. Data are clipped to the declared ``[lower, upper]``
first (clipping is per record, so it keeps neighbours neighbours); a NaN is treated as 0 and then
clipped like every value, ±inf clip to the bounds — the same total rule the private mechanisms
built on these functions (:mod:`dpkit.mechanisms.ptr`) apply, so nothing raises on a data value.
Only public facts raise :class:`~dpkit.errors.InvalidDataError`: the dtype, the shape, emptiness.
All computations are vectorised over sorted data.

>>> local_sensitivity_median([1.0, 2.0, 3.0, 4.0, 10.0], lower=0.0, upper=10.0)
1.0
>>> local_sensitivity_median([1.0, 2.0, 3.0, 10.0, 10.0], lower=0.0, upper=10.0)
7.0
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from dpkit import _validate as v
from dpkit._validate import Neighbours
from dpkit.errors import InvalidDataError, InvalidParameterError
from dpkit.mechanisms.laplace import Laplace
from dpkit.noise.source import RNG

__all__ = [
    "local_sensitivity_count",
    "local_sensitivity_sum",
    "local_sensitivity_mean",
    "local_sensitivity_median",
    "mean_sensitivity_at_distance",
    "median_sensitivity_at_distance",
    "mean_distance_to_high_sensitivity",
    "median_distance_to_high_sensitivity",
    "median_index",
    "release_with_local_sensitivity",
]


def _data(data: ArrayLike, name: str = "data", *, allow_empty: bool = False) -> NDArray[np.float64]:
    """A 1-D float array, NaN → 0 and ±inf kept for the clipping (empty allowed only where asked).

    Raises only on public facts (not an array, shape, dtype, emptiness), naming no value.
    """
    arr = v.as_array(data, name, "a 1-D array of numbers")  # the dtype depends on types, not values
    if arr.ndim != 1:
        raise InvalidDataError(name, f"has shape {arr.shape}", "a 1-D array of numbers")
    if arr.size == 0:
        if allow_empty and (arr.dtype.kind in "iuf" or arr.dtype == object):
            return np.zeros(0, dtype=np.float64)
        raise InvalidDataError(name, "is empty", "at least one value")
    return v.data_array(arr, name)


def _clipped_sorted(data: ArrayLike, lower: float, upper: float, *, allow_empty: bool = False) -> NDArray[np.float64]:
    return np.sort(np.clip(_data(data, allow_empty=allow_empty), lower, upper))


def _distance_k(k: object) -> int:
    return v.positive_int(k, "k", minimum=0)


def median_index(n: int) -> int:
    """The 1-based rank m = ⌈n/2⌉ of the (lower) median of n values."""
    return (n + 1) // 2


# --- count and sum --------------------------------------------------------------------------------


def local_sensitivity_count(data: ArrayLike | None = None, neighbours: Neighbours = "add_remove") -> float:
    """LS of the number of records: 1 under add/remove (one record appears or vanishes) and 0
    under replace (the number of records does not change). It does not depend on the data.

    >>> local_sensitivity_count([3.0, 4.0])
    1.0
    """
    if data is not None:
        _data(data, allow_empty=True)
    return 1.0 if v.neighbours(neighbours) == "add_remove" else 0.0


def local_sensitivity_sum(
    data: ArrayLike, *, lower: float, upper: float, neighbours: Neighbours = "add_remove"
) -> float:
    """LS of the sum of values clipped to [lower, upper].

    add/remove: adding a value v ∈ [l, u] changes the sum by |v| ≤ max(|l|, |u|), which is
    attained, and removing a record changes it by |x_i| ≤ max(|l|, |u|); so LS = max(|l|, |u|),
    the global sensitivity, for every dataset.
    replace: changing x_i to v changes the sum by |v − x_i|, at most max(u − x_i, x_i − l); so
    LS = max_i max(u − x_i, x_i − l) ≤ u − l (0 for the empty dataset).

    >>> local_sensitivity_sum([2.0, 3.0], lower=0.0, upper=5.0, neighbours="replace")
    3.0
    """
    lo, hi = v.bounds(lower, upper)
    if v.neighbours(neighbours) == "add_remove":
        _data(data, allow_empty=True)
        return max(abs(lo), abs(hi))
    x = _clipped_sorted(data, lo, hi, allow_empty=True)
    if x.size == 0:
        return 0.0
    return float(max(hi - x[0], x[-1] - lo))


# --- mean (add/remove) ----------------------------------------------------------------------------


def local_sensitivity_mean(data: ArrayLike, *, upper: float, lower: float = 0.0) -> float:
    """Exact LS of the mean of values clipped to [lower, upper], under add/remove.

    Derivation (n = |D|, m = mean, S = sum):

    * add v ∈ [l, u]: (S + v)/(n + 1) − S/n = (v − m)/(n + 1), at most max(u − m, m − l)/(n + 1)
      ≤ (u − l)/(n + 1). With l = 0 this is the u/(n + 1) often quoted, which only
      considers adding a row.
    * remove x_i (n ≥ 2): (S − x_i)/(n − 1) − S/n = (m − x_i)/(n − 1), at most (u − l)/n
      (attained by [l, …, l, u] with u removed), which is *larger* than (u − l)/(n + 1).
    * n = 1: removing the record leaves no data; dpkit counts that change as u − l (the mean of
      no data may be any point of [l, u]).

    So LS = max(max(u − m, m − l)/(n + 1), max_i |m − x_i|/(n − 1)) and LS ≤ (u − l)/n, the bound
    :func:`mean_sensitivity_at_distance` and :class:`~dpkit.mechanisms.ptr.PTRMean` use.

    >>> local_sensitivity_mean([0.0, 0.0, 0.0, 10.0], upper=10.0)
    2.5
    """
    lo, hi = v.bounds(lower, upper)
    x = _clipped_sorted(data, lo, hi)
    n = x.size
    if n == 1:
        return hi - lo
    m = float(np.mean(x))
    add = max(hi - m, m - lo) / (n + 1)
    remove = max(abs(m - x[0]), abs(x[-1] - m)) / (n - 1)
    return float(max(add, remove))


def mean_sensitivity_at_distance(data: ArrayLike, k: int, *, upper: float, lower: float = 0.0) -> float:
    """An upper bound on A^(k)(D) for the mean under add/remove: (u − l)/max(n − k, 1).

    A dataset at distance ≤ k has at least n − k records, and LS ≤ (u − l)/n' for n' records
    (:func:`local_sensitivity_mean`). A bound of u/(n − k + 1), sometimes used for this, misses the
    removal case.

    >>> mean_sensitivity_at_distance([1.0] * 10, 5, upper=10.0)
    2.0
    """
    lo, hi = v.bounds(lower, upper)
    n = _data(data, allow_empty=True).size
    return (hi - lo) / max(n - _distance_k(k), 1)


def mean_distance_to_high_sensitivity(data: ArrayLike, bound: float, *, upper: float, lower: float = 0.0) -> float:
    """γ(D): the number of add/remove steps after which the mean's sensitivity bound
    (u − l)/max(n', 1) can exceed ``bound``; ``math.inf`` when it never can (bound ≥ u − l).

    γ = max(0, n − N) with N = ⌈(u − l)/b⌉ − 1 the largest size whose bound exceeds b, computed
    in exact rationals. γ changes by at most 1 when one record is added or removed, and γ ≥ 1
    implies LS(D) ≤ (u − l)/n ≤ b — the two facts propose-test-release needs.

    >>> mean_distance_to_high_sensitivity([5.0] * 100, 0.5, upper=10.0)
    81
    """
    lo, hi = v.bounds(lower, upper)
    b = v.positive(bound, "bound")
    n = _data(data, allow_empty=True).size
    width = Fraction(hi) - Fraction(lo)
    if Fraction(b) >= width:
        return math.inf
    big = math.ceil(width / Fraction(b)) - 1
    return max(0, n - big)


# --- median (replace) -----------------------------------------------------------------------------


def _padded(x: NDArray[np.float64], lower: float, upper: float) -> NDArray[np.float64]:
    """x_i for i = −n … 2n+2 (index i at position i + n): l below 1, u above n."""
    n = x.size
    return np.concatenate([np.full(n + 1, lower), x, np.full(n + 2, upper)])


def _median_a(p: NDArray[np.float64], n: int, k: int) -> float:
    """A^(k) = max_{0 ≤ t ≤ k+1} (x_{m+t} − x_{m+t−k−1}) on the padded order statistics."""
    k = min(k, n)  # A^(n) is already u − l
    m, off = median_index(n), n
    t = np.arange(k + 2)
    return float(np.max(p[m + t + off] - p[m + t - k - 1 + off]))


def local_sensitivity_median(data: ArrayLike, *, lower: float, upper: float) -> float:
    """LS of the median x_m (m = ⌈n/2⌉, the lower median of the values clipped to [l, u] and
    sorted) under **replace** (n fixed and public): max(x_m − x_{m−1}, x_{m+1} − x_m), where
    x_0 = l and x_{n+1} = u pad the order statistics (Nissim, Raskhodnikova & Smith 2007, §3.1).
    Changing one record moves the m-th order statistic anywhere in [x_{m−1}, x_{m+1}] and no
    further. (Under add/remove the median's rank changes with n; dpkit states the median's local
    sensitivity for replace only.)

    >>> local_sensitivity_median([4.0], lower=0.0, upper=10.0)
    6.0
    """
    return median_sensitivity_at_distance(data, 0, lower=lower, upper=upper)


def median_sensitivity_at_distance(data: ArrayLike, k: int, *, lower: float, upper: float) -> float:
    """A^(k)(D) for the median under replace: max_{0 ≤ t ≤ k+1} (x_{m+t} − x_{m+t−k−1}), with
    the padding of :func:`local_sensitivity_median` (NRS 2007, Prop. 3.4). Changing k records can
    empty any window of k + 1 consecutive gaps around the median rank. A^(k) = u − l for k ≥ n.

    >>> median_sensitivity_at_distance([1.0, 2.0, 3.0, 4.0, 5.0], 1, lower=0.0, upper=10.0)
    2.0
    """
    lo, hi = v.bounds(lower, upper)
    x = _clipped_sorted(data, lo, hi)
    return _median_a(_padded(x, lo, hi), x.size, _distance_k(k))


def median_distance_to_high_sensitivity(data: ArrayLike, bound: float, *, lower: float, upper: float) -> float:
    """γ(D) = min{k : A^(k)(D) > b} for the median under replace: the fewest records to change
    so that the local sensitivity exceeds ``bound``; ``math.inf`` if it never can (b ≥ u − l).

    γ is the distance from D to the set {D' : LS(D') > b}, so it changes by at most 1 between
    neighbours. A^(k) is non-decreasing in k, so γ is found by binary search over k ∈ [0, n]
    (each step vectorised), O(n log n) in all.

    >>> median_distance_to_high_sensitivity([1.0, 2.0, 3.0, 4.0, 5.0], 2.5, lower=0.0, upper=10.0)
    2
    """
    lo, hi = v.bounds(lower, upper)
    b = v.positive(bound, "bound")
    x = _clipped_sorted(data, lo, hi)
    if b >= hi - lo:
        return math.inf
    n = x.size
    p = _padded(x, lo, hi)
    left, right = 0, n  # A^(n) = u − l > b, so the answer is in [0, n]
    while left < right:
        mid = (left + right) // 2
        if _median_a(p, n, mid) > b:
            right = mid
        else:
            left = mid + 1
    return left


# --- the broken mechanism -------------------------------------------------------------------------


def release_with_local_sensitivity(
    value: ArrayLike, local_sensitivity: float, epsilon: float, *, rng: RNG = None
) -> Any:
    """value + Laplace(LS/ε) noise — **NOT differentially private**; for teaching only.

    The noise scale depends on the data through LS, so the scale itself leaks (NRS 2007;
    Dwork & Roth 2014 §7): two neighbouring datasets with the same answer but very different local
    sensitivities give noise distributions whose ratio is unbounded in the tails. The tests audit
    this function with :func:`dpkit.audit.estimate_epsilon` and catch it. A local sensitivity of 0
    releases the value exactly — the worst leak of all. Use :mod:`dpkit.mechanisms.ptr` instead.

    >>> release_with_local_sensitivity(3.0, 0.0, 1.0)
    3.0
    """
    eps = v.epsilon(epsilon)
    if not (
        isinstance(local_sensitivity, (int, float)) and math.isfinite(local_sensitivity) and local_sensitivity >= 0
    ):
        raise InvalidParameterError("local_sensitivity", local_sensitivity, "a finite number >= 0")
    x = v.finite_array(value, "value")
    if local_sensitivity == 0:
        return float(x) if np.ndim(value) == 0 else x
    return Laplace(epsilon=eps, sensitivity=float(local_sensitivity)).release(value, rng=rng)
