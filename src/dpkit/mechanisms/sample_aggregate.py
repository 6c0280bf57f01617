"""Sample-and-aggregate (Nissim, Raskhodnikova & Smith 2007; "采样-聚合框架").

Any function f becomes ε-DP, without knowing its sensitivity:

1. split the rows into k disjoint blocks;
2. a_i = clip(f(block_i), lower, upper);
3. release (1/k)·Σ a_i + Laplace((upper − lower)/(k·ε)).

Partition. Each row is assigned to a block by its own independent uniform draw from {0, …, k−1}
(exact, :func:`dpkit.noise.integers.uniform_below`, from the secure source by default). This
handles both neighbour relations cleanly: couple the two runs so that the rows they share get the
same draws; then under ``add_remove`` the extra row changes the contents of exactly one block, and
under ``replace`` the changed row sits in exactly one block. Either way one a_i moves, by at most
u − l, so the average moves by at most (u − l)/k: the Laplace mechanism with that sensitivity is
ε-DP for every fixed assignment, hence for the mixture over assignments (the coupling has the same
law on both sides). A fixed split into consecutive chunks (a common shortcut) would let one added row
shift every later boundary; the i.i.d. assignment avoids that.

Blocks may come out empty (with probability (1 − 1/k)^n each): an empty block, a block whose
f value is NaN, and a block on which f raises an exception or returns something that is not a
real number answer the midpoint (lower + upper)/2; ±inf clip to the bounds. These rules do not
look at the other blocks, so a_i stays in [lower, upper] and the argument above is unchanged.

Totality (docs/architecture.md, "Totality"): a release never raises on a data value. The data are handed to
f as given (NaN and ±inf included: what they mean is f's business), and whatever f does on a
block becomes a number in [lower, upper] by the rules above. Only public facts raise: a
non-numeric dtype, a scalar, fewer rows than blocks.

The noise is dpkit's floating-point-safe :class:`~dpkit.mechanisms.laplace.Laplace` with
sensitivity (u − l)/k, so the event is ``LaplaceEvent`` with ε. The check k <= n happens before any
release and only raises an error; n is treated as public there.

>>> import numpy as np
>>> sa = SampleAndAggregate(epsilon=1.0, blocks=10, lower=0.0, upper=100.0, function=np.mean)
>>> sa.event.epsilon
1.0
>>> out = sa.release(np.full(1000, 40.0), rng=np.random.default_rng(0))
>>> abs(out - 40.0) < 100
True
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from dpkit import _validate as v
from dpkit._validate import Neighbours
from dpkit.accounting.events import LaplaceEvent
from dpkit.errors import InvalidDataError, InvalidParameterError
from dpkit.mechanisms.laplace import Laplace
from dpkit.noise.integers import _uniform_below
from dpkit.noise.source import RNG, RandomSource, resolve_rng

__all__ = ["SampleAndAggregate"]


@dataclass(frozen=True, kw_only=True)
class SampleAndAggregate:
    """ε-DP release of any function f through sample-and-aggregate (module docstring).

    Args:
        epsilon: ε > 0.
        blocks: k, the number of blocks (1 <= k <= number of rows).
        lower, upper: the declared range of f's output; each block's answer is clipped to it.
        function: f, called on each block (a numpy array: rows of ``data``) and returning a number.
        neighbours: the relation stated in the event; the proof covers both.

    Accuracy: the noise has scale (upper − lower)/(k·ε); :meth:`error_bound` gives the exact
    lattice bound (the error against f on the whole data also includes the blocks' own spread).

    >>> import numpy as np
    >>> round(SampleAndAggregate(epsilon=0.5, blocks=20, lower=0.0, upper=1.0, function=np.median).scale, 9)
    0.1
    """

    epsilon: float
    blocks: int
    lower: float
    upper: float
    function: Callable[[Any], Any]
    neighbours: Neighbours = "add_remove"

    def __post_init__(self) -> None:
        object.__setattr__(self, "epsilon", v.epsilon(self.epsilon))
        object.__setattr__(self, "blocks", v.positive_int(self.blocks, "blocks"))
        lo, hi = v.bounds(self.lower, self.upper)
        object.__setattr__(self, "lower", lo)
        object.__setattr__(self, "upper", hi)
        if not callable(self.function):
            raise InvalidParameterError("function", self.function, "a callable f(block) -> number")
        v.neighbours(self.neighbours)
        _ = self.laplace  # validates the noise scale range

    @property
    def sensitivity(self) -> float:
        """ℓ1 sensitivity of the *computed* clipped average, rounded up: (upper − lower)/k plus
        2^-50·max(|lower|, |upper|), which covers the two roundings of fsum(a)/k (each within
        2^-52 of the largest |a_i|), so the bound holds for the float the noise is added to."""
        slack = 2.0**-50 * max(abs(self.lower), abs(self.upper))
        return math.nextafter((self.upper - self.lower) / self.blocks + slack, math.inf)

    @property
    def laplace(self) -> Laplace:
        """The Laplace mechanism that adds the final noise."""
        return Laplace(epsilon=self.epsilon, sensitivity=self.sensitivity, neighbours=self.neighbours)

    @property
    def scale(self) -> float:
        return self.laplace.scale

    @property
    def event(self) -> LaplaceEvent:
        return self.laplace.event

    def _check_data(self, data: ArrayLike) -> NDArray[np.float64]:
        """The data as a float array; only public facts are checked (values go to f as they are)."""
        x = v.as_array(data, "data", "an array of numbers")  # the dtype depends on types, not values
        if x.dtype == bool or x.dtype.kind not in "iuf":
            raise InvalidDataError("data", f"has dtype {x.dtype}", "numbers (int or float)")
        x = x.astype(np.float64)
        if x.ndim == 0:
            raise InvalidDataError("data", "is a scalar", "an array with one row per record")
        if x.shape[0] < self.blocks:
            raise InvalidDataError(
                "data", f"has {x.shape[0]} rows, fewer than blocks={self.blocks}", "at least `blocks` rows"
            )
        return x

    def assign_blocks(self, n: int, src: RandomSource) -> NDArray[np.int64]:
        """An independent uniform block in {0, …, k − 1} for each of n rows, exactly."""
        return _uniform_below(self.blocks, n, src).astype(np.int64)

    def block_answers(self, data: ArrayLike, assignment: NDArray[np.int64]) -> NDArray[np.float64]:
        """a_i = clip(f(block_i)) with the empty/NaN rules (not private on its own)."""
        x = self._check_data(data)
        order = np.argsort(assignment, kind="stable")
        counts = np.bincount(assignment, minlength=self.blocks)
        parts = np.split(x[order], np.cumsum(counts)[:-1])
        mid = (self.lower + self.upper) / 2
        answers = np.empty(self.blocks, dtype=np.float64)
        for i, part in enumerate(parts):  # one call of f per block (k calls, not per row)
            if part.shape[0] == 0:
                answers[i] = mid
                continue
            try:
                a = float(self.function(part))
            except Exception:  # noqa: BLE001 — f failing on some block is a fact about the data
                a = math.nan  # … so it must not surface: the block answers the midpoint
            answers[i] = mid if math.isnan(a) else min(max(a, self.lower), self.upper)
        return answers

    def release(self, data: ArrayLike, *, rng: RNG = None) -> float:
        """(1/k)·Σ clip(f(block_i)) + Laplace((upper − lower)/(k·ε)), floating-point safe."""
        x = self._check_data(data)
        src = resolve_rng(rng)
        assignment = self.assign_blocks(x.shape[0], src)
        average = math.fsum(self.block_answers(x, assignment)) / self.blocks
        return float(self.laplace.release(average, rng=src))

    def error_bound(self, beta: float = 0.05) -> float:
        """a with P(|release − average of the clipped block answers| > a) <= ``beta``."""
        return self.laplace.error_bound(beta)
