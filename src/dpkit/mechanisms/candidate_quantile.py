"""A quantile chosen among a finite set of candidates (for integer or coarse data)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from dpkit import _validate as v
from dpkit._validate import Neighbours
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
        x = v.data_array(values, "values")  # NaN → 0; ±inf sort below/above every candidate
        if x.ndim != 1:
            raise InvalidDataError("values", f"has shape {x.shape}", "a 1-D array")
        xs = np.sort(x)
        below = np.searchsorted(xs, self.candidates, side="left")
        above = x.size - np.searchsorted(xs, self.candidates, side="right")
        return -np.abs((1 - self.q) * below - self.q * above)

    def release(self, values: ArrayLike, *, rng: RNG = None) -> float:
        """The chosen candidate."""
        scores = self.scores(values)
        mech = Exponential(epsilon=self.epsilon, sensitivity=self.sensitivity, neighbours=self.neighbours)
        return float(mech.release(scores, candidates=list(self.candidates), rng=resolve_rng(rng)))
