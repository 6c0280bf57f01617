"""The mean of bounded values as a noisy sum over a noisy count."""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

import numpy as np
from numpy.typing import ArrayLike, NDArray

from dpkit import _validate as v
from dpkit._validate import Neighbours, decimal_fraction
from dpkit.accounting.events import ComposedEvent, LaplaceEvent
from dpkit.accounting.rounding import to_decimal_down
from dpkit.errors import InvalidParameterError
from dpkit.mechanisms import sensitivity
from dpkit.mechanisms.laplace import Laplace
from dpkit.noise.discrete import laplace_plan, sample_discrete_laplace
from dpkit.noise.lattice import Lattice, exact_lattice_sum, snap
from dpkit.noise.source import RNG, RandomSource, resolve_rng

__all__ = ["BoundedMean", "MeanRelease", "release_exact_sum"]


def _exact_lattice_sum(values: NDArray[np.float64], lattice: Lattice) -> int:
    """Σ round(x/g) exactly, as a Python int (:func:`~dpkit.noise.lattice.exact_lattice_sum`)."""
    return int(exact_lattice_sum(snap(values, lattice).astype(np.int64).ravel()))


def release_exact_sum(mech: Laplace, clipped: NDArray[np.float64], src: RandomSource) -> float:
    """Σ clipped + Laplace noise of ``mech``, with the sum computed exactly on its lattice.

    A float sum is not sensitivity-bounded: adding one record can move numpy's rounded sum by more
    than the record (Casacuberta et al. 2022). Instead every clipped value is snapped to the
    lattice g (|snapped| <= the clipping bound + g/2, within the Δ/g + 1 lattice steps the noise is
    calibrated for) and the integers are summed exactly, then the noise is added in exact integer
    arithmetic. ``clipped`` must already lie within bounds whose magnitude is ``mech``'s
    sensitivity.
    """
    plan = mech.noise_plan(1)
    total = _exact_lattice_sum(clipped, plan.lattice)
    noise = int(sample_discrete_laplace(laplace_plan(plan.lattice_scale), 1, src)[0])
    return float(total + noise) * plan.lattice.granularity


@dataclass(frozen=True)
class MeanRelease:
    """A private mean with the two private parts it was computed from."""

    mean: float
    noisy_sum: float
    noisy_count: float


@dataclass(frozen=True, kw_only=True)
class BoundedMean:
    """ε-DP mean of values clipped to declared bounds, as noisy sum / noisy count.

    The budget is split: ``sum_share``·ε for the sum (sensitivity max(|L|, |U|) under add/remove)
    and the rest for the count (sensitivity 1); sequential composition gives ε in total
    (Dwork & Roth 2014, Thm 3.16). Values are clipped to [lower, upper] before summing —
    the bounds must be chosen without looking at the data. The ratio is post-processing.
    ``neighbours``: ``"add_remove"`` only, recorded in both parts of :attr:`event` (under
    ``replace`` the count is public and the sum's sensitivity is U − L: use a Laplace sum instead).

    Totality: :meth:`release` never raises on a value: NaN is treated as 0 (a NaN has no place in
    a query with a declared sensitivity) and then clipped like every value, ±inf clip to the
    bounds. Clipping to the declared bounds is 1-Lipschitz per record, so the sensitivities above
    hold unchanged. Only public facts raise: a non-numeric dtype, booleans, an empty array.

    >>> import numpy as np
    >>> m = BoundedMean(epsilon=1.0, lower=0.0, upper=100.0)
    >>> r = m.release(np.full(10_000, 40.0), rng=np.random.default_rng(0))
    >>> abs(r.mean - 40.0) < 1.0
    True
    """

    epsilon: float
    lower: float
    upper: float
    sum_share: float = 0.5
    neighbours: Neighbours = "add_remove"

    def __post_init__(self) -> None:
        if v.neighbours(self.neighbours) != "add_remove":
            raise InvalidParameterError(
                "neighbours",
                self.neighbours,
                "'add_remove'",
                "under replace the count is public: use a Laplace sum instead",
            )
        object.__setattr__(self, "epsilon", v.epsilon(self.epsilon))
        if self.epsilon > 2.0**20:  # keeps every clipped value below 2^62 lattice steps (int64)
            raise InvalidParameterError("epsilon", self.epsilon, "a number in (0, 2**20]")
        lo, hi = v.bounds(self.lower, self.upper)
        object.__setattr__(self, "lower", lo)
        object.__setattr__(self, "upper", hi)
        share = v.probability(self.sum_share, "sum_share")
        object.__setattr__(self, "sum_share", share)

    @property
    def _sum_mech(self) -> Laplace:
        s = sensitivity.bounded_sum(self.lower, self.upper, self.neighbours).l1
        eps = to_decimal_down(decimal_fraction(self.epsilon) * Fraction(self.sum_share))
        return Laplace(epsilon=eps, sensitivity=s, neighbours=self.neighbours)

    @property
    def _count_mech(self) -> Laplace:
        # The remainder, rounded down, so that the two parts never add up to more than ε (each
        # part is charged the decimal value of its double).
        rest = decimal_fraction(self.epsilon) - decimal_fraction(self._sum_mech.epsilon)
        return Laplace(epsilon=to_decimal_down(rest), sensitivity=1.0, neighbours=self.neighbours)

    @property
    def event(self) -> ComposedEvent:
        parts: tuple[LaplaceEvent, ...] = (self._sum_mech.event, self._count_mech.event)
        return ComposedEvent(parts)

    def release(self, values: ArrayLike, *, rng: RNG = None) -> MeanRelease:
        x = v.data_array(values, "values").ravel()  # NaN → 0; ±inf are clipped below
        src = resolve_rng(rng)
        noisy_sum = self._noisy_exact_sum(x.clip(self.lower, self.upper), src)
        noisy_count = float(self._count_mech.release(float(x.size), rng=src))
        if noisy_count < 1.0:
            noisy_count = 1.0  # post-processing: a mean over fewer than one record means nothing
        mean = min(max(noisy_sum / noisy_count, self.lower), self.upper)
        return MeanRelease(mean, noisy_sum, noisy_count)

    def _noisy_exact_sum(self, clipped: NDArray[np.float64], src: RandomSource) -> float:
        return release_exact_sum(self._sum_mech, clipped, src)
