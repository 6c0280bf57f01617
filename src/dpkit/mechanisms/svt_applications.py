"""Applications of the sparse vector technique: an SVT-chosen clipping bound, the mean with that
bound, and range queries above a threshold (Dwork & Roth 2014, §3.6; Lyu, Su & Li 2017).

Each application reads its data with the totality rules of :mod:`dpkit.mechanisms.sparse_vector`
(NaN → 0, ±inf clipped to the declared range or kept where a count needs no bound) and composes
the events of the mechanisms it runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from dpkit import _validate as v
from dpkit._validate import decimal_fraction
from dpkit.accounting.events import ComposedEvent, LaplaceEvent, PureDPEvent, SelfComposedEvent
from dpkit.accounting.rounding import to_decimal_down
from dpkit.errors import InvalidDataError, InvalidParameterError
from dpkit.mechanisms.laplace import Laplace
from dpkit.mechanisms.mean import release_exact_sum
from dpkit.mechanisms.sparse_vector import AboveThreshold, Sparse
from dpkit.noise.source import RNG, resolve_rng

__all__ = [
    "SVTMeanResult",
    "choose_clipping_bound",
    "clipping_queries",
    "svt_private_mean",
    "range_queries_above_threshold",
    "range_queries_event",
]


# --- applications ---------------------------------------------------------------------------------


def _data_values(values: ArrayLike, name: str = "values") -> NDArray[np.float64]:
    """Private data as a 1-D float array: NaN → 0, ±inf kept (each use clips or counts them)."""
    x = v.data_array(values, name)
    if x.ndim != 1:
        raise InvalidDataError(name, f"has shape {x.shape}", "a 1-D array")
    return x


def _candidates(max_bound: object, step: object) -> NDArray[np.float64]:
    hi = v.positive_int(max_bound, "max_bound")
    st = v.positive_int(step, "step")
    if hi > 10**8:
        raise InvalidParameterError("max_bound", max_bound, "an integer in [1, 10**8]")
    return np.arange(1, hi + 1, st, dtype=np.float64)


def clipping_queries(values: ArrayLike, bounds: ArrayLike) -> NDArray[np.float64]:
    """q_b(D) = Σ clip(x, 0, b) − Σ clip(x, 0, b + 1) for every b, vectorised (Near & Abuah,
    "Programming Differential Privacy", ch. "The Sparse Vector Technique").

    Each q_b equals −Σ_x clip(x − b, 0, 1), so adding, removing or changing one record moves it by
    at most 1: sensitivity 1 under both neighbour relations. It rises to 0 as b passes the data.

    >>> clipping_queries([0.5, 2.0, 7.0], [1, 2, 8]).tolist()
    [-2.0, -1.0, -0.0]
    """
    x = np.sort(np.clip(_data_values(values), 0.0, None))
    b = np.asarray(bounds, dtype=np.float64)
    lo = np.searchsorted(x, b, side="right")
    hi = np.searchsorted(x, b + 1, side="right")
    # Σ (x − b) over b < x <= b + 1, summed slice by slice (terms in (0, 1], so the float error
    # is below m·2^-53 for m terms — no prefix sums, whose error grows with the data's total).
    partial = np.array([float(np.sum(x[i:j] - bb)) for i, j, bb in zip(lo, hi, b, strict=True)])
    return -((x.size - hi) + partial)


def choose_clipping_bound(
    values: ArrayLike,
    *,
    epsilon: float,
    max_bound: int,
    step: int = 1,
    threshold: float = 0.0,
    rng: RNG = None,
) -> int:
    """A clipping bound b for sums of non-negative values, chosen with AboveThreshold (ε-DP).

    Near & Abuah, "Programming Differential Privacy", ch. "The Sparse Vector Technique"
    ("应用稀疏向量技术"): candidates b = 1, 1 + step, …, <= ``max_bound``; query
    q_b(D) = Σ clip(x, 0, b) − Σ clip(x, 0, b + 1) has sensitivity 1 (:func:`clipping_queries`)
    and rises to 0 once raising the bound no longer changes the sum; AboveThreshold with
    threshold 0 returns the first b whose noisy q_b clears the noisy threshold. The cost
    is ε however many candidates there are (Dwork & Roth 2014, Thm 3.23). If no candidate is
    found positive, the largest candidate is returned (post-processing of ⊥). Neighbours:
    add/remove or replace (both give sensitivity 1). Values below 0 count as 0, NaN counts as 0
    and +inf as a value above every candidate (total: nothing raises on a value).

    >>> import numpy as np
    >>> ages = np.random.default_rng(0).integers(18, 90, size=20_000)
    >>> b = choose_clipping_bound(ages, epsilon=1.0, max_bound=200, rng=np.random.default_rng(1))
    >>> 80 <= b <= 110
    True
    """
    bs = _candidates(max_bound, step)
    # Sensitivity 1, plus 2^-20 for the float error of the slice sums (below n·2^-53 <= 2^-20
    # for up to 2^33 records).
    at = AboveThreshold(epsilon=epsilon, threshold=threshold, sensitivity=1.0 + 2.0**-20)
    q = clipping_queries(values, bs)
    idx = at.release(q, rng=rng)
    return int(bs[-1] if idx is None else bs[idx])


@dataclass(frozen=True)
class SVTMeanResult:
    """A private mean from :func:`svt_private_mean` and the three releases it came from."""

    mean: float
    bound: int
    noisy_sum: float
    noisy_count: float
    event: ComposedEvent


def svt_private_mean(
    values: ArrayLike, *, epsilon: float, max_bound: int, step: int = 1, rng: RNG = None
) -> SVTMeanResult:
    """ε-DP mean of non-negative values with an automatically chosen clipping bound.

    Near & Abuah, "Programming Differential Privacy" (``auto_avg``): ε/3 chooses the bound b with
    :func:`choose_clipping_bound`, ε/3 releases Σ clip(x, 0, b) with Laplace noise (sensitivity b),
    ε/3 the count (sensitivity 1); mean = noisy sum / noisy count (post-processing, the count
    floored at 1 and the mean clamped to [0, b]). Sequential composition gives ε (Dwork & Roth 2014,
    Thm 3.16). Neighbours: add/remove. The event is ``ComposedEvent((PureDPEvent(ε/3),
    LaplaceEvent(ε/3), LaplaceEvent(ε/3)))``, each third rounded down. NaN counts as 0 and ±inf are
    clipped to [0, b] like every value (total: nothing raises on a value).

    >>> import numpy as np
    >>> ages = np.random.default_rng(0).integers(18, 90, size=20_000)
    >>> r = svt_private_mean(ages, epsilon=1.0, max_bound=200, rng=np.random.default_rng(2))
    >>> bool(abs(r.mean - ages.mean()) < 1.0)
    True
    """
    eps = v.epsilon(epsilon)
    third = to_decimal_down(decimal_fraction(eps) / 3)
    # Parameters first: a refusal never reads the data. The sum's sensitivity is the bound chosen
    # privately, somewhere in [1, max_bound]; the scale check is monotone in it, so checking both
    # ends now means no choice can make the Laplace construction fail later.
    _candidates(max_bound, step)
    for sens in (1.0, float(v.positive_int(max_bound, "max_bound"))):
        Laplace(epsilon=third, sensitivity=sens)
    x = _data_values(values)
    src = resolve_rng(rng)
    bound = choose_clipping_bound(x, epsilon=third, max_bound=max_bound, step=step, rng=src)
    sum_mech = Laplace(epsilon=third, sensitivity=float(bound))
    count_mech = Laplace(epsilon=third, sensitivity=1.0)
    noisy_sum = release_exact_sum(sum_mech, np.clip(x, 0.0, bound), src)  # exact, not a float sum
    noisy_count = float(count_mech.release(float(x.size), rng=src))
    mean = float(np.clip(noisy_sum / max(noisy_count, 1.0), 0.0, bound))
    event = ComposedEvent((PureDPEvent(epsilon=third), sum_mech.event, count_mech.event))
    return SVTMeanResult(mean, bound, noisy_sum, noisy_count, event)


def _check_ranges(ranges: Sequence[tuple[float, float]]) -> NDArray[np.float64]:
    try:
        r = np.asarray(ranges, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise InvalidDataError(
            "ranges", f"cannot be read as (lower, upper) pairs ({exc})", "a list of (lower, upper) pairs"
        ) from exc
    if r.ndim != 2 or r.shape[1] != 2 or r.shape[0] == 0:
        raise InvalidDataError("ranges", f"has shape {r.shape}", "a non-empty list of (lower, upper) pairs")
    if not np.isfinite(r).all() or np.any(r[:, 0] > r[:, 1]):
        raise InvalidDataError("ranges", "holds a non-finite or reversed pair", "finite pairs with lower <= upper")
    return r


def range_queries_above_threshold(
    data: ArrayLike,
    ranges: Sequence[tuple[float, float]],
    *,
    epsilon: float,
    threshold: float,
    max_answers: int,
    rng: RNG = None,
) -> list[tuple[tuple[float, float], float]]:
    """Answer only the range counts that are large, paying for at most ``max_answers`` of them.

    Near & Abuah, "Programming Differential Privacy" ("应用: 范围问询"): the count of rows with
    lower < x < upper (sensitivity 1, add/remove) for each range; ε/2 runs :class:`Sparse` with c =
    ``max_answers`` to find the ranges whose count is above ``threshold``, and ε/(2c) releases each
    selected count with Laplace noise — ε in total by sequential composition (Dwork & Roth 2014, Thm
    3.16 and 3.25), however many ranges are asked. Returns ((lower, upper), noisy count) for each
    selected range. The event is ``ComposedEvent((PureDPEvent(ε/2),
    SelfComposedEvent(LaplaceEvent(ε/(2c)), c)))`` (see :func:`range_queries_event`). A NaN data
    value counts as 0 and ±inf fall in no range (total: nothing raises on a data value; bad
    ``ranges`` are refused before anything runs).

    >>> import numpy as np
    >>> ages = np.random.default_rng(0).integers(18, 90, size=10_000)
    >>> out = range_queries_above_threshold(ages, [(20, 22), (30, 60), (85, 86), (18, 90)],
    ...     epsilon=1.0, threshold=1000, max_answers=2, rng=np.random.default_rng(3))
    >>> [r for r, _ in out]
    [(30.0, 60.0), (18.0, 90.0)]
    """
    # Every parameter is checked (and both mechanisms built) before the data is read.
    r = _check_ranges(ranges)
    eps = v.epsilon(epsilon)
    c = v.positive_int(max_answers, "max_answers")
    half = to_decimal_down(decimal_fraction(eps) / 2)
    sparse = Sparse(epsilon=half, threshold=threshold, max_positives=c)
    lap = Laplace(epsilon=to_decimal_down(decimal_fraction(half) / c), sensitivity=1.0)
    src = resolve_rng(rng)
    x = np.sort(_data_values(data, "data"))
    counts = (
        (np.searchsorted(x, r[:, 1], side="left") - np.searchsorted(x, r[:, 0], side="right"))
        .clip(0)
        .astype(np.float64)
    )
    chosen = sparse.release(counts, rng=src)
    if not chosen:
        return []
    noisy = np.atleast_1d(lap.release(counts[chosen], rng=src))
    return [((float(r[i, 0]), float(r[i, 1])), float(y)) for i, y in zip(chosen, noisy, strict=True)]


def range_queries_event(epsilon: float, max_answers: int) -> ComposedEvent:
    """The event :func:`range_queries_above_threshold` spends (add/remove neighbours)."""
    eps = v.epsilon(epsilon)
    c = v.positive_int(max_answers, "max_answers")
    half = to_decimal_down(decimal_fraction(eps) / 2)
    per = to_decimal_down(decimal_fraction(half) / c)
    return ComposedEvent((PureDPEvent(epsilon=half), SelfComposedEvent(LaplaceEvent.for_epsilon(per), c)))
