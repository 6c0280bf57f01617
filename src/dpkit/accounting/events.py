"""Privacy events: immutable descriptions of what a mechanism did.

Mechanisms record events, not numbers (in the spirit of dp_accounting's ``DpEvent``): an
accountant turns events into an (ε, δ) guarantee, and a tighter accountant can later re-evaluate
what was spent. Every event carries its neighbouring relation so that a mismatch between how the
noise was calibrated and how it is accounted can be detected.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from fractions import Fraction

from dpkit._validate import Neighbours
from dpkit.accounting.rounding import log_up, to_float_up
from dpkit.errors import InvalidParameterError

__all__ = [
    "DPEvent",
    "PureDPEvent",
    "ApproxDPEvent",
    "LaplaceEvent",
    "GaussianEvent",
    "RandomizedResponseEvent",
    "ComposedEvent",
    "SelfComposedEvent",
    "PoissonSampledEvent",
]


@dataclass(frozen=True)
class DPEvent:
    """Base class of all events."""


def _check_positive(name: str, value: float) -> None:
    if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
        raise InvalidParameterError(name, value, "a finite number > 0")


@dataclass(frozen=True)
class PureDPEvent(DPEvent):
    """A mechanism known only to be ε-DP (e.g. the exponential mechanism)."""

    epsilon: float
    neighbours: Neighbours = "add_remove"

    def __post_init__(self) -> None:
        _check_positive("epsilon", self.epsilon)


@dataclass(frozen=True)
class ApproxDPEvent(DPEvent):
    """A mechanism known only to be (ε, δ)-DP."""

    epsilon: float
    delta: float
    neighbours: Neighbours = "add_remove"

    def __post_init__(self) -> None:
        _check_positive("epsilon", self.epsilon)
        if not (0 <= self.delta < 1):
            raise InvalidParameterError("delta", self.delta, "a number in [0, 1)")


@dataclass(frozen=True)
class LaplaceEvent(DPEvent):
    """Laplace (or discrete Laplace) noise with scale = noise_multiplier × ℓ1 sensitivity.

    Pure DP with ε = 1 / noise_multiplier (Dwork & Roth 2014, Thm 3.6; for the discrete Laplace on
    a lattice that contains the sensitivity, Canonne–Kamath–Steinke 2020, Sec. 2). ``epsilon`` is
    that reciprocal, rounded up. The multiplier may be an exact :class:`~fractions.Fraction`:
    :meth:`for_epsilon` records 1/ε exactly, so ``epsilon`` gives back ε itself.
    """

    noise_multiplier: float | Fraction
    neighbours: Neighbours = "add_remove"

    def __post_init__(self) -> None:
        _check_positive("noise_multiplier", float(self.noise_multiplier) if isinstance(self.noise_multiplier, Fraction) else self.noise_multiplier)

    @classmethod
    def for_epsilon(cls, epsilon: float, neighbours: Neighbours = "add_remove") -> LaplaceEvent:
        return cls(noise_multiplier=1 / Fraction(epsilon), neighbours=neighbours)

    @property
    def epsilon(self) -> float:
        return to_float_up(1 / Fraction(self.noise_multiplier))


@dataclass(frozen=True)
class GaussianEvent(DPEvent):
    """Gaussian (or discrete Gaussian) noise with σ = noise_multiplier × ℓ2 sensitivity.

    ρ-zCDP with ρ = 1 / (2 noise_multiplier²) (Bun & Steinke 2016; discrete: CKS 2020, Thm 14);
    (ε, δ) by the analytic Gaussian curve (Balle & Wang 2018, Thm 8).
    """

    noise_multiplier: float
    neighbours: Neighbours = "add_remove"

    def __post_init__(self) -> None:
        _check_positive("noise_multiplier", self.noise_multiplier)


@dataclass(frozen=True)
class RandomizedResponseEvent(DPEvent):
    """k-ary randomized response: the truth with probability p_truth, otherwise one of the other
    k − 1 answers uniformly. ε = ln(p_truth · (k − 1) / (1 − p_truth)) under ``replace``
    (one respondent's true answer changes)."""

    p_truth: float
    k: int = 2
    neighbours: Neighbours = "replace"

    @property
    def epsilon(self) -> float:
        """ln(p·(k − 1)/(1 − p)) for the exact binary value of p, rounded up."""
        p = Fraction(self.p_truth)
        return log_up(p * (self.k - 1) / (1 - p))


@dataclass(frozen=True)
class ComposedEvent(DPEvent):
    """Sequential composition of several events."""

    events: tuple[DPEvent, ...] = field(default_factory=tuple)


@dataclass(frozen=True)
class SelfComposedEvent(DPEvent):
    """``count`` adaptive repetitions of the same event."""

    event: DPEvent
    count: int

    def __post_init__(self) -> None:
        if not isinstance(self.count, int) or self.count < 1:
            raise InvalidParameterError("count", self.count, "an integer >= 1")


@dataclass(frozen=True)
class PoissonSampledEvent(DPEvent):
    """``event`` run on a Poisson subsample that keeps each record with probability q."""

    sampling_probability: float
    event: DPEvent

    def __post_init__(self) -> None:
        if not (0 < self.sampling_probability <= 1):
            raise InvalidParameterError("sampling_probability", self.sampling_probability, "a number in (0, 1]")
