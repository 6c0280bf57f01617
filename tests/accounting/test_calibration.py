"""Noise calibration never overshoots and is within 1 % of the smallest σ."""

from __future__ import annotations

import itertools

import pytest

from dpkit.accounting import RDPAccountant, ZCDPAccountant, calibrate_noise_multiplier, dp_sgd_event
from dpkit.errors import InvalidParameterError

TARGETS = [0.5, 1.0, 3.0, 8.0]
SETTINGS = [(1.0, 1), (0.01, 1000), (256 / 60000, 2350)]


@pytest.mark.parametrize("target, setting", list(itertools.product(TARGETS, SETTINGS)))
def test_calibrated_sigma_meets_the_target_and_is_nearly_smallest(target: float, setting: tuple[float, int]) -> None:
    q, steps = setting
    sigma = calibrate_noise_multiplier(epsilon=target, delta=1e-5, accountant=RDPAccountant, sample_rate=q, steps=steps)

    def eps(s: float) -> float:
        return RDPAccountant().compose(dp_sgd_event(s, q, steps)).get_epsilon(1e-5)

    assert eps(sigma) <= target  # re-checked independently: never overshoots
    assert eps(sigma * 0.99) > target  # within 1 % of the smallest σ that meets it


def test_any_accountant_and_event_builder() -> None:
    from dpkit.accounting import GaussianEvent, SelfComposedEvent

    sigma = calibrate_noise_multiplier(
        epsilon=2.0,
        delta=1e-6,
        accountant=ZCDPAccountant,
        event_for=lambda s: SelfComposedEvent(GaussianEvent(s), 10),
    )
    acc = ZCDPAccountant().compose(SelfComposedEvent(GaussianEvent(sigma), 10))
    assert acc.get_epsilon(1e-6) <= 2.0


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"epsilon": 0.0}, "epsilon"),
        ({"epsilon": float("nan")}, "epsilon"),
        ({"delta": 0.0}, "delta"),
        ({"delta": 1.0}, "delta"),
        ({"sample_rate": 0.0}, "sample_rate"),
        ({"sample_rate": 1.5}, "sample_rate"),
        ({"steps": 0}, "steps"),
        ({"tolerance": 0.9}, "tolerance"),
    ],
)
def test_bad_arguments_are_rejected(kwargs: dict, name: str) -> None:
    args = {"epsilon": 1.0, "delta": 1e-5, "accountant": RDPAccountant, **kwargs}
    with pytest.raises(InvalidParameterError, match=name):
        calibrate_noise_multiplier(**args)


def test_unreachable_target_is_a_clear_error() -> None:
    with pytest.raises(InvalidParameterError, match="epsilon"):
        calibrate_noise_multiplier(epsilon=1e-9, delta=1e-12, accountant=RDPAccountant, steps=10**6)
