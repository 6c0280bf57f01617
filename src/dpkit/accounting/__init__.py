"""Privacy accounting: events and (in later releases) accountants that turn them into (ε, δ)."""

from dpkit.accounting.events import (
    ApproxDPEvent,
    ComposedEvent,
    DPEvent,
    ExponentialEvent,
    GaussianEvent,
    LaplaceEvent,
    PoissonSampledEvent,
    PureDPEvent,
    RandomizedResponseEvent,
    SampledWithoutReplacementEvent,
    SelfComposedEvent,
    event_from_dict,
    event_from_json,
    event_to_dict,
    event_to_json,
)

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
    "SampledWithoutReplacementEvent",
    "ExponentialEvent",
    "event_to_dict",
    "event_from_dict",
    "event_to_json",
    "event_from_json",
]
