"""Events: immutable, validated, and JSON round-trippable — what the ledger stores."""

from __future__ import annotations

import dataclasses
import json
from fractions import Fraction

import pytest

import dpkit as dp
from dpkit.accounting import (
    ApproxDPEvent,
    ComposedEvent,
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
from dpkit.errors import InvalidParameterError

EVENTS = [
    PureDPEvent(0.5),
    ApproxDPEvent(1.0, 1e-6, neighbours="replace"),
    ExponentialEvent(0.3),
    LaplaceEvent(noise_multiplier=2.5),
    LaplaceEvent.for_epsilon(0.1),  # an exact Fraction multiplier
    GaussianEvent(1.1),
    RandomizedResponseEvent(p_truth=2 / 3, k=3),
    PoissonSampledEvent(0.01, GaussianEvent(1.1)),
    SampledWithoutReplacementEvent(1000, 10, GaussianEvent(2.0, neighbours="replace")),
    SelfComposedEvent(PoissonSampledEvent(256 / 60000, GaussianEvent(1.1)), 23_400),
    ComposedEvent([LaplaceEvent.for_epsilon(0.5), ComposedEvent([PureDPEvent(0.1), ExponentialEvent(0.2)])]),
]


@pytest.mark.parametrize("event", EVENTS, ids=lambda e: type(e).__name__)
def test_json_round_trip(event: dp.accounting.DPEvent) -> None:
    text = event_to_json(event)
    json.loads(text)  # plain JSON
    back = event_from_json(text)
    assert back == event and type(back) is type(event)
    assert event_from_dict(event_to_dict(event)) == event


def test_exact_fractions_survive() -> None:
    e = LaplaceEvent.for_epsilon(0.1)
    back = event_from_json(event_to_json(e))
    assert isinstance(back.noise_multiplier, Fraction) and back.noise_multiplier == 10  # ε = 0.1 read as 1/10
    assert back.epsilon == 0.1


def test_every_mechanism_emits_an_event() -> None:
    mechs = [
        dp.Laplace(epsilon=1.0),
        dp.Geometric(epsilon=1.0),
        dp.Gaussian(epsilon=1.0, delta=1e-6),
        dp.RandomizedResponse(epsilon=1.0),
        dp.ForcedResponse(),
        dp.Exponential(epsilon=1.0),
        dp.ReportNoisyMax(epsilon=1.0),
        dp.BoundedMean(epsilon=1.0, lower=0.0, upper=1.0),
    ]
    for m in mechs:
        assert event_from_json(event_to_json(m.event)) == m.event


def test_events_are_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        GaussianEvent(1.0).noise_multiplier = 2.0  # type: ignore[misc]


@pytest.mark.parametrize(
    "make, name",
    [
        (lambda: PureDPEvent(0.0), "epsilon"),
        (lambda: PureDPEvent(float("nan")), "epsilon"),
        (lambda: ApproxDPEvent(1.0, 1.0), "delta"),
        (lambda: LaplaceEvent(noise_multiplier=-1.0), "noise_multiplier"),
        (lambda: GaussianEvent(float("inf")), "noise_multiplier"),
        (lambda: SelfComposedEvent(PureDPEvent(1.0), 0), "count"),
        (lambda: PoissonSampledEvent(0.0, PureDPEvent(1.0)), "sampling_probability"),
        (lambda: SampledWithoutReplacementEvent(10, 11, PureDPEvent(1.0)), "sample_size"),
        (lambda: event_from_json('{"type": "NoSuchEvent"}'), "type"),
        (lambda: event_from_json("not json"), "text"),
    ],
)
def test_bad_events_are_refused(make, name: str) -> None:
    with pytest.raises(InvalidParameterError, match=name):
        make()
