"""Privacy events: immutable descriptions of what a mechanism did.

An ε in an event is read as the decimal number it prints as (``PureDPEvent(0.1)`` costs exactly
1/10, see :func:`dpkit._validate.decimal_fraction`), by every accountant; the mechanisms that
record it calibrate their noise to no more than that.

Mechanisms record events, not numbers (in the spirit of dp_accounting's ``DpEvent``): an
accountant turns events into an (ε, δ) guarantee, and a tighter accountant can later re-evaluate
what was spent. Every event carries its neighbouring relation so that a mismatch between how the
noise was calibrated and how it is accounted can be detected.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, fields
from fractions import Fraction
from numbers import Real
from typing import cast

from dpkit._validate import Neighbours, decimal_fraction
from dpkit.accounting.rounding import log_up, to_float_up
from dpkit.errors import InvalidParameterError

__all__ = [
    "DPEvent",
    "ExponentialEvent",
    "SampledWithoutReplacementEvent",
    "event_to_dict",
    "event_from_dict",
    "event_to_json",
    "event_from_json",
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
class ExponentialEvent(DPEvent):
    """The exponential mechanism with privacy parameter ε (utilities of sensitivity Δ, scale
    ε/(2Δ)). ε-DP, and moreover ε-bounded-range, which gives ρ = ε²/8 zCDP
    (Cesar & Rogers 2021) — tighter than a plain PureDPEvent when composed many times."""

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
        _check_positive(
            "noise_multiplier",
            float(self.noise_multiplier) if isinstance(self.noise_multiplier, Fraction) else self.noise_multiplier,
        )

    @classmethod
    def for_epsilon(cls, epsilon: float, neighbours: Neighbours = "add_remove") -> LaplaceEvent:
        """The event of Laplace noise calibrated to ``epsilon`` read as the decimal it prints as
        (:func:`dpkit._validate.decimal_fraction`): ``for_epsilon(0.1)`` has noise multiplier 10
        exactly, and costs exactly 1/10."""
        if not (isinstance(epsilon, Real) and not isinstance(epsilon, bool) and math.isfinite(epsilon) and epsilon > 0):
            raise InvalidParameterError("epsilon", epsilon, "a finite number > 0")
        return cls(noise_multiplier=1 / decimal_fraction(epsilon), neighbours=neighbours)

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

    def __post_init__(self) -> None:
        object.__setattr__(self, "events", tuple(self.events))


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


@dataclass(frozen=True)
class SampledWithoutReplacementEvent(DPEvent):
    """``event`` run on a uniformly random subset of ``sample_size`` out of ``population_size``
    records (neighbours: replace one record — the relation sampling without replacement needs)."""

    population_size: int
    sample_size: int
    event: DPEvent

    def __post_init__(self) -> None:
        if not isinstance(self.population_size, int) or self.population_size < 1:
            raise InvalidParameterError("population_size", self.population_size, "an integer >= 1")
        if not isinstance(self.sample_size, int) or not 1 <= self.sample_size <= self.population_size:
            raise InvalidParameterError("sample_size", self.sample_size, f"an integer in [1, {self.population_size}]")


_EVENT_TYPES: dict[str, type[DPEvent]] = {}


def _register() -> None:
    for cls in (
        PureDPEvent,
        ApproxDPEvent,
        ExponentialEvent,
        LaplaceEvent,
        GaussianEvent,
        RandomizedResponseEvent,
        ComposedEvent,
        SelfComposedEvent,
        PoissonSampledEvent,
        SampledWithoutReplacementEvent,
    ):
        _EVENT_TYPES[cls.__name__] = cls


def _encode(value: object) -> object:
    if isinstance(value, DPEvent):
        return event_to_dict(value)
    if isinstance(value, tuple):
        return [_encode(v) for v in value]
    if isinstance(value, Fraction):
        return {"fraction": f"{value.numerator}/{value.denominator}"}
    return value


def _decode(value: object) -> object:
    if isinstance(value, dict) and "type" in value:
        return event_from_dict(value)
    if isinstance(value, dict) and set(value) == {"fraction"}:
        return Fraction(value["fraction"])
    if isinstance(value, list):
        return tuple(_decode(v) for v in value)
    return value


def event_to_dict(event: DPEvent) -> dict[str, object]:
    """A JSON-ready dict: {"type": class name, field: value, …}; nested events nest."""
    out: dict[str, object] = {"type": type(event).__name__}
    for f in fields(event):
        out[f.name] = _encode(getattr(event, f.name))
    return out


def event_from_dict(data: dict[str, object]) -> DPEvent:
    """Inverse of :func:`event_to_dict`; unknown types raise InvalidParameterError."""
    name = data.get("type")
    # Any hashable name is looked up as it is: one that is not a str simply finds nothing.
    cls = _EVENT_TYPES.get(cast(str, name))
    if cls is None:
        raise InvalidParameterError("type", name, f"one of {sorted(_EVENT_TYPES)}")
    kwargs = {k: _decode(v) for k, v in data.items() if k != "type"}
    return cls(**kwargs)


def event_to_json(event: DPEvent) -> str:
    return json.dumps(event_to_dict(event), sort_keys=True)


def event_from_json(text: str) -> DPEvent:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidParameterError("text", text[:80], "a JSON object written by event_to_json") from exc
    if not isinstance(data, dict):
        raise InvalidParameterError("text", text[:80], "a JSON object written by event_to_json")
    return event_from_dict(data)


_register()
