"""Privacy accounting: events and (in later releases) accountants that turn them into (ε, δ)."""

from dpkit.accounting.events import (
    ApproxDPEvent,
    ComposedEvent,
    DPEvent,
    GaussianEvent,
    LaplaceEvent,
    PoissonSampledEvent,
    PureDPEvent,
    RandomizedResponseEvent,
    SelfComposedEvent,
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
]
