"""The Gaussian mechanism, floating-point safe."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Literal

from numpy.typing import ArrayLike

from dpkit import _validate as v
from dpkit._validate import Neighbours
from dpkit.accounting.analytic_gaussian import analytic_gaussian_sigma, classic_gaussian_sigma, gaussian_delta
from dpkit.accounting.events import GaussianEvent
from dpkit.accounting.rounding import decimal_down
from dpkit.errors import InvalidParameterError
from dpkit.mechanisms.laplace import _as_output, _check_scale_range
from dpkit.noise.lattice import DELTA_MARGIN, Lattice, choose_lattice, lattice_gaussian
from dpkit.noise.source import RNG, resolve_rng

__all__ = ["Gaussian", "GaussianNoisePlan", "gaussian_noise_plan"]

# The lattice discrete Gaussian's privacy curve differs from the continuous one's by O(g²/σ²)
# (the sum over the lattice of a function with one kink, CKS 2020 Sec. 4): below 2^-78 here.
# Calibrating for δ·DELTA_MARGIN = δ·(1 − 2^-20) covers that for every δ >= 2^-58.
_MIN_DELTA = 2.0**-58


@dataclass(frozen=True)
class GaussianNoisePlan:
    """Exactly the noise a release of ``size`` coordinates draws."""

    lattice: Lattice
    lattice_sigma: Fraction  # σ / g, sampled exactly
    sensitivity_on_lattice: Fraction  # Δ₂/g + √size: ℓ2 distance between snapped neighbours

    @property
    def sigma(self) -> float:
        return float(self.lattice_sigma) * self.lattice.granularity

    @property
    def noise_multiplier(self) -> float:
        return float(self.lattice_sigma / self.sensitivity_on_lattice)


def gaussian_noise_plan(noise_multiplier: float, sensitivity: float, size: int) -> GaussianNoisePlan:
    """The lattice and exact σ/g for ``size`` coordinates of ℓ2 sensitivity ``sensitivity`` at a
    given noise multiplier: the ℓ2 sensitivity on the lattice is Δ₂/g + √size (√size rounded up),
    and σ/g is that times the multiplier, rounded up to a multiple of 2^-8 (more noise is always
    safe), so the multiplier actually drawn is at least ``noise_multiplier``."""
    lattice = choose_lattice(noise_multiplier * sensitivity, size, norm=2)
    root = Fraction(math.nextafter(math.sqrt(size), math.inf))  # sqrt is correctly rounded
    sens = Fraction(sensitivity) / Fraction(lattice.granularity) + root
    lat_sigma = Fraction(math.ceil(Fraction(noise_multiplier) * sens * 256), 256)
    return GaussianNoisePlan(lattice, lat_sigma, sens)


@dataclass(frozen=True, kw_only=True)
class Gaussian:
    """The Gaussian mechanism: (ε, δ)-DP release of a real value or vector with ℓ2 sensitivity Δ₂.

    Guarantee: (ε, δ)-DP w.r.t. ``neighbours`` when the query's ℓ2 sensitivity is at most
    ``sensitivity``; also ρ-zCDP with ρ = Δ₂²/(2σ²) (Bun & Steinke 2016).

    Calibration: ``"analytic"`` (default) — the smallest σ satisfying the exact Gaussian privacy
    curve of Balle & Wang (2018), valid for every ε; ``"classic"`` — σ = Δ₂√(2 ln(1.25/δ))/ε
    (Dwork & Roth 2014, Thm 3.22; seeds 003/004), which is only a theorem for ε < 1 and is refused
    otherwise.

    Floating-point safety: values are snapped to a lattice g = 2^k (about 2^-40 of σ, finer for
    long vectors, at most 2^-47) and discrete Gaussian noise with σ/g is added, sampled exactly (Canonne, Kamath
    & Steinke 2020). Snapping adds at most g√d to the ℓ2 sensitivity; σ is calibrated for Δ₂ + g√d
    and for δ·(1 − 2^-20), which covers the lattice's O(2^-78) difference from the continuous
    curve. The event ``GaussianEvent(σ/(Δ₂ + g√d))`` describes the noise drawn.

    Totality: :meth:`release` never raises on a value. NaN is treated as 0 (a NaN has no place
    in a query with a declared sensitivity), and every coordinate is clamped to [−M, M] with
    M = min(2^1000, 2^1000·g) (:func:`~dpkit.noise.lattice.value_limit`; g depends on σ and the
    size only), so ±inf become ±M. Clamping each coordinate to a fixed interval is 1-Lipschitz:
    it never increases the ℓ2 sensitivity, and the guarantee above is unchanged. Only public facts
    raise: a non-numeric dtype, booleans, an empty array.

    >>> import numpy as np
    >>> mech = Gaussian(epsilon=1.0, delta=1e-6, sensitivity=1.0)
    >>> round(mech.sigma, 3)
    4.225
    >>> y = mech.release(np.zeros(3), rng=np.random.default_rng(0))
    >>> y.shape
    (3,)
    """

    epsilon: float
    delta: float
    sensitivity: float = 1.0
    neighbours: Neighbours = "add_remove"
    calibration: Literal["analytic", "classic"] = "analytic"
    _unit_sigma: float = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "epsilon", v.epsilon(self.epsilon))
        object.__setattr__(self, "delta", v.delta(self.delta, allow_zero=False))
        object.__setattr__(self, "sensitivity", v.positive(self.sensitivity, "sensitivity"))
        v.neighbours(self.neighbours)
        if self.delta < _MIN_DELTA:
            raise InvalidParameterError("delta", self.delta, "a number in [2**-58, 1)")
        # ε at its decimal value, rounded down: never calibrated to more than the ε charged
        eps = decimal_down(self.epsilon)
        if self.calibration == "analytic":
            unit = analytic_gaussian_sigma(eps, self.delta * DELTA_MARGIN, 1.0)
        elif self.calibration == "classic":
            unit = classic_gaussian_sigma(eps, self.delta * DELTA_MARGIN, 1.0)
        else:
            raise InvalidParameterError("calibration", self.calibration, "'analytic' or 'classic'")
        object.__setattr__(self, "_unit_sigma", unit)  # σ per unit of ℓ2 sensitivity
        _check_scale_range(self.sigma)

    @classmethod
    def from_noise_multiplier(
        cls,
        noise_multiplier: float,
        *,
        delta: float,
        sensitivity: float = 1.0,
        neighbours: Neighbours = "add_remove",
    ) -> Gaussian:
        """The Gaussian mechanism with σ = ``noise_multiplier`` · Δ₂ exactly, for callers that
        calibrate the noise themselves (by ρ-zCDP or an accountant over many releases).

        The noise, lattice and event are those of a mechanism calibrated to that σ: ``event`` is
        ``GaussianEvent(noise_multiplier)`` and :meth:`noise_plan` draws at least that multiplier.
        ``epsilon`` is the smallest ε (to about 1e-9 relative, rounded up) for which one release is
        (ε, δ·(1 − 2^-20))-DP on the exact Gaussian privacy curve (Balle & Wang 2018, Thm 8); it
        describes a single release and is what this object reports, not what a composition of
        many releases costs (compose ``event`` with an accountant for that).

        >>> Gaussian.from_noise_multiplier(2.0, delta=1e-6).event.noise_multiplier
        2.0
        """
        nm = v.positive(noise_multiplier, "noise_multiplier")
        delta = v.delta(delta, allow_zero=False)
        if delta < _MIN_DELTA:
            raise InvalidParameterError("delta", delta, "a number in [2**-58, 1)")
        sens = v.positive(sensitivity, "sensitivity")
        v.neighbours(neighbours)
        _check_scale_range(nm * sens)
        target = delta * DELTA_MARGIN
        lo, hi = 0.0, 1.0
        while not gaussian_delta(hi, nm) <= target:  # δ(ε) decreases in ε: bracket, then bisect (NaN: go on)
            lo, hi = hi, hi * 2.0
            if hi > 2.0**100:
                raise InvalidParameterError(
                    "noise_multiplier", nm, f"a multiplier giving a finite ε at delta={delta} (larger)"
                )
        for _ in range(100):
            mid = (lo + hi) / 2.0
            if gaussian_delta(mid, nm) <= target:
                hi = mid
            else:
                lo = mid
            if hi - lo <= hi * 1e-12:
                break
        mech = object.__new__(cls)
        for name, value in (
            ("epsilon", hi),
            ("delta", delta),
            ("sensitivity", sens),
            ("neighbours", neighbours),
            ("calibration", "analytic"),
            ("_unit_sigma", nm),
        ):
            object.__setattr__(mech, name, value)
        return mech

    @property
    def sigma(self) -> float:
        """The nominal noise standard deviation σ for sensitivity Δ₂ (before the lattice's 2^-39)."""
        return self._unit_sigma * self.sensitivity

    @property
    def event(self) -> GaussianEvent:
        return GaussianEvent(noise_multiplier=self._unit_sigma, neighbours=self.neighbours)

    def noise_plan(self, size: int = 1) -> GaussianNoisePlan:
        """The exact lattice and noise a release of ``size`` coordinates uses.

        In exact arithmetic: the ℓ2 sensitivity on the lattice is Δ₂/g + √size (√size rounded
        up) and σ/g is that times the calibrated multiplier, rounded up to a multiple of 2^-8
        (which keeps the fraction small; more noise is always safe).
        """
        return gaussian_noise_plan(self._unit_sigma, self.sensitivity, size)

    def release(self, value: ArrayLike, *, rng: RNG = None) -> Any:
        """Return value + Gaussian noise (same shape; a float for a scalar input).

        Total on values: NaN → 0, then each coordinate clamped to ±M (class docstring).
        """
        x = v.data_array(value, "value")
        plan = self.noise_plan(x.size)
        return _as_output(lattice_gaussian(x, plan.lattice, plan.lattice_sigma, resolve_rng(rng)), value)

    def error_bound(self, beta: float = 0.05, *, size: int = 1) -> float:
        """a with P(|error| > a) <= beta per coordinate, from the discrete Gaussian's sub-Gaussian
        tail P(|Y| >= t) <= 2·exp(−t²/(2σ²)) (CKS 2020, Prop. 23) plus half a lattice step."""
        beta = v.probability(beta, "beta")
        plan = self.noise_plan(size)
        return plan.sigma * math.sqrt(2.0 * math.log(2.0 / beta)) + plan.lattice.granularity / 2

    def confidence_interval(self, released: ArrayLike, confidence: float = 0.95) -> tuple[Any, Any]:
        confidence = v.probability(confidence, "confidence")
        r = v.finite_array(released, "released")
        a = self.error_bound(1 - confidence, size=r.size)
        return _as_output(r - a, released), _as_output(r + a, released)
