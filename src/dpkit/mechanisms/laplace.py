"""The Laplace mechanism (real values, floating-point safe) and the geometric mechanism (integers)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from dpkit import _validate as v
from dpkit._validate import Neighbours, decimal_fraction
from dpkit.accounting.events import LaplaceEvent
from dpkit.errors import InvalidParameterError
from dpkit.noise.discrete import laplace_plan, sample_discrete_laplace
from dpkit.noise.lattice import Lattice, choose_lattice, lattice_laplace
from dpkit.noise.source import RNG, resolve_rng

__all__ = ["Laplace", "Geometric", "LaplaceNoisePlan"]


# Geometric clamps to ±2^62: with noise of scale <= 2^52, |value + noise| < 2^63 (int64) except
# with probability below e^{-2^10}.
_GEOMETRIC_LIMIT = 2**62


def _as_output(noisy: NDArray[Any], original: ArrayLike) -> Any:
    """Scalars in, scalar out; arrays keep their shape."""
    return noisy.reshape(()).item() if np.ndim(original) == 0 else noisy


def _check_scale_range(scale: float) -> None:
    if not (math.isfinite(scale) and 2.0**-900 <= scale <= 2.0**900):
        raise InvalidParameterError("sensitivity/epsilon", scale, "a noise scale in [2**-900, 2**900]")


def _laplace_tail_steps(lattice_scale: Fraction, beta: float) -> int:
    """Smallest m with P(|Y| >= m) <= beta for Y ~ DiscreteLaplace(t): P(|Y| >= m) = 2ρ^m / (1 + ρ)."""
    t = float(lattice_scale)
    rho = math.exp(-1.0 / t)
    return max(1, math.ceil(t * math.log(2.0 / (beta * (1.0 + rho)))))


@dataclass(frozen=True)
class LaplaceNoisePlan:
    """Exactly the noise a release of ``size`` coordinates draws.

    On the lattice the snapped query has ℓ1 sensitivity at most ``sensitivity_on_lattice``
    (Δ/g + size) and the discrete Laplace scale is that divided by ε, so the event
    ``LaplaceEvent(1/ε)`` describes this noise exactly.
    """

    lattice: Lattice
    lattice_scale: Fraction  # the discrete Laplace scale on the lattice, sampled exactly
    sensitivity_on_lattice: Fraction

    @property
    def scale(self) -> float:
        """The noise scale in the value's units (g × lattice scale), slightly above Δ/ε."""
        return float(self.lattice_scale) * self.lattice.granularity

    @property
    def epsilon(self) -> float:
        return float(self.sensitivity_on_lattice / self.lattice_scale)


@dataclass(frozen=True, kw_only=True)
class Laplace:
    """The Laplace mechanism: ε-DP release of a real value or vector with ℓ1 sensitivity Δ.

    Guarantee: ε-differential privacy with respect to the neighbour relation ``neighbours``,
    provided the query's ℓ1 sensitivity under that relation is at most ``sensitivity``
    (Dwork, McSherry, Nissim & Smith 2006; Dwork & Roth 2014, Thm 3.6).

    Floating-point safety (Mironov 2012): the value is snapped to a lattice g = 2^k chosen from
    the scale (about 2^-40 of it) and discrete Laplace noise is added on the lattice, sampled
    exactly (Canonne, Kamath & Steinke 2020). Snapping adds at most g per coordinate to the
    sensitivity, so the lattice noise scale is (Δ/g + d)/ε for d coordinates and the guarantee is
    exactly ε, taken at its decimal value (ε = 0.1 is 1/10: the amount :attr:`event` charges). The extra noise, d·g/Δ relative, is below 2^-39 for short vectors and below
    d/(ε·2^47) for long ones (``noise_plan(d)`` shows the numbers).

    Totality: :meth:`release` never raises on a value. NaN is treated as 0 (a NaN has no place
    in a query with a declared sensitivity), and every coordinate is clamped to [−M, M] with
    M = min(2^1000, 2^1000·g) (:func:`~dpkit.noise.lattice.value_limit`; g depends on Δ/ε and the
    size only), so ±inf become ±M. Clamping each coordinate to a fixed interval is 1-Lipschitz:
    it never increases the ℓ1 sensitivity, and the guarantee above is unchanged. M is at least
    2^100 noise scales (2^952 or more when Δ/ε < 2^40), so finite answers are in practice never
    moved. Only public facts raise: a non-numeric dtype, booleans, an empty array.

    Accuracy: per coordinate, P(|noise| >= t·b) = e^{-t} for the continuous Laplace; the exact
    lattice bound is :meth:`error_bound`.

    >>> import numpy as np
    >>> mech = Laplace(epsilon=1.0, sensitivity=1.0)
    >>> mech.scale
    1.0
    >>> noisy = mech.release(42.0, rng=np.random.default_rng(0))
    >>> abs(noisy - 42.0) < 20
    True
    """

    epsilon: float
    sensitivity: float = 1.0
    neighbours: Neighbours = "add_remove"

    def __post_init__(self) -> None:
        object.__setattr__(self, "epsilon", v.epsilon(self.epsilon))
        object.__setattr__(self, "sensitivity", v.positive(self.sensitivity, "sensitivity"))
        v.neighbours(self.neighbours)
        _check_scale_range(self.sensitivity / self.epsilon)

    @property
    def scale(self) -> float:
        """The nominal noise scale b = Δ/ε."""
        return self.sensitivity / self.epsilon

    @property
    def event(self) -> LaplaceEvent:
        return LaplaceEvent.for_epsilon(self.epsilon, self.neighbours)

    def noise_plan(self, size: int = 1) -> LaplaceNoisePlan:
        """The exact lattice and noise a release of ``size`` coordinates uses."""
        lattice = choose_lattice(self.scale, size, norm=1)
        sens = Fraction(self.sensitivity) / Fraction(lattice.granularity) + size
        return LaplaceNoisePlan(lattice, sens / decimal_fraction(self.epsilon), sens)

    def release(self, value: ArrayLike, *, rng: RNG = None) -> Any:
        """Return value + Laplace noise (same shape; a float for a scalar input).

        Total on values: NaN → 0, then each coordinate clamped to ±M (class docstring).
        """
        x = v.data_array(value, "value")
        plan = self.noise_plan(x.size)
        noisy = lattice_laplace(x, plan.lattice, plan.lattice_scale, resolve_rng(rng))
        return _as_output(noisy, value)

    def error_bound(self, beta: float = 0.05, *, size: int = 1) -> float:
        """a such that each coordinate's error exceeds a with probability at most ``beta``."""
        beta = v.probability(beta, "beta")
        plan = self.noise_plan(size)
        g = plan.lattice.granularity
        return _laplace_tail_steps(plan.lattice_scale, beta) * g + g / 2

    def confidence_interval(self, released: ArrayLike, confidence: float = 0.95) -> tuple[Any, Any]:
        """(low, high) around a released value covering the true value with ``confidence``."""
        confidence = v.probability(confidence, "confidence")
        r = v.finite_array(released, "released")
        a = self.error_bound(1 - confidence, size=r.size)
        return _as_output(r - a, released), _as_output(r + a, released)


@dataclass(frozen=True, kw_only=True)
class Geometric:
    """The geometric mechanism: integer counts plus discrete Laplace noise, ε-DP.

    Guarantee: ε-DP for integer-valued queries whose ℓ1 sensitivity (an integer) under
    ``neighbours`` is at most ``sensitivity`` (Ghosh, Roughgarden & Sundararajan 2009; the
    discrete Laplace of Canonne, Kamath & Steinke 2020, Sec. 2). The noise P(Y = y) ∝
    e^{−ε|y|/Δ} is sampled exactly, with the scale Δ/ε taken at ε's decimal value (ε = 0.1 is
    1/10, and the event charges exactly that).

    Totality: :meth:`release` never raises on a value. Float input is read with NaN as 0,
    clamped to [−2^62, 2^62] (±inf to ±2^62) and rounded to the nearest integer (ties to even);
    integer input is clamped to [−2^62, 2^62]. For an integer-valued query, as the guarantee
    assumes, rounding is the identity and clamping is 1-Lipschitz, so the sensitivity and the
    guarantee are unchanged; the clamp keeps value + noise inside int64. Only public facts
    raise: a non-numeric dtype, booleans, an empty array.

    >>> import numpy as np
    >>> Geometric(epsilon=0.5).release(np.array([10, 20, 30]), rng=np.random.default_rng(0)).dtype
    dtype('int64')
    """

    epsilon: float
    sensitivity: int = 1
    neighbours: Neighbours = "add_remove"
    _scale: Fraction = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "epsilon", v.epsilon(self.epsilon))
        object.__setattr__(self, "sensitivity", v.positive_int(self.sensitivity, "sensitivity"))
        v.neighbours(self.neighbours)
        scale = Fraction(self.sensitivity) / decimal_fraction(self.epsilon)
        if not Fraction(1, 2**20) <= scale <= Fraction(2) ** 52:
            raise InvalidParameterError(
                "epsilon", self.epsilon, f"a value giving a noise scale Δ/ε in [2**-20, 2**52] (Δ = {self.sensitivity})"
            )
        object.__setattr__(self, "_scale", scale)

    @property
    def scale(self) -> float:
        return float(self._scale)

    @property
    def event(self) -> LaplaceEvent:
        return LaplaceEvent.for_epsilon(self.epsilon, self.neighbours)

    def release(self, value: ArrayLike, *, rng: RNG = None) -> Any:
        """Return value + discrete Laplace noise as int64 (an int for a scalar input); total on
        values (class docstring)."""
        x = v.integer_data(value, "value", limit=_GEOMETRIC_LIMIT)
        noise = sample_discrete_laplace(laplace_plan(self._scale), x.size, resolve_rng(rng)).reshape(x.shape)
        out = x + noise
        return int(out) if np.ndim(value) == 0 else out

    def error_bound(self, beta: float = 0.05) -> int:
        """m such that P(|noise| >= m) <= beta."""
        return _laplace_tail_steps(self._scale, v.probability(beta, "beta"))

    def confidence_interval(self, released: ArrayLike, confidence: float = 0.95) -> tuple[Any, Any]:
        confidence = v.probability(confidence, "confidence")
        r = v.finite_array(released, "released", integer=True)
        m = self.error_bound(1 - confidence) - 1  # |noise| <= m − 1 with the stated confidence
        return _as_output(r - m, released), _as_output(r + m, released)
