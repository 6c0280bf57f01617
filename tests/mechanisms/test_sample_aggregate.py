"""Tests for dpkit.mechanisms.sample_aggregate (fixed seeds; audits at confidence 1 − 1e-6)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from dpkit.accounting.events import LaplaceEvent
from dpkit.audit import estimate_epsilon
from dpkit.errors import InvalidDataError, InvalidParameterError
from dpkit.mechanisms.sample_aggregate import SampleAndAggregate
from dpkit.noise.source import SeededSource

SEED = 20240702
STRICT = 1 - 1e-6


def test_event_and_noise_match() -> None:
    sa = SampleAndAggregate(epsilon=0.5, blocks=10, lower=20.0, upper=80.0, function=np.mean)
    assert sa.event == LaplaceEvent.for_epsilon(0.5, "add_remove")
    assert sa.event.epsilon == 0.5
    assert sa.laplace.epsilon == 0.5 and sa.laplace.sensitivity == sa.sensitivity
    assert sa.scale == pytest.approx(60.0 / (10 * 0.5))
    assert sa.error_bound(0.05) == sa.laplace.error_bound(0.05)


def test_block_answers_clip_and_default() -> None:
    sa = SampleAndAggregate(epsilon=1.0, blocks=3, lower=0.0, upper=10.0, function=np.max)
    data = np.array([1.0, 50.0, 3.0, 4.0])
    # block 0: {1, 50} -> 50 clipped to 10; block 1: {3, 4} -> 4; block 2: empty -> midpoint 5
    got = sa.block_answers(data, np.array([0, 0, 1, 1]))
    assert got.tolist() == [10.0, 4.0, 5.0]
    nan_f = SampleAndAggregate(epsilon=1.0, blocks=2, lower=0.0, upper=10.0, function=lambda b: math.nan)
    assert nan_f.block_answers(data, np.array([0, 1, 0, 1])).tolist() == [5.0, 5.0]


def test_assignment_is_uniform_and_covers_every_row_once() -> None:
    sa = SampleAndAggregate(epsilon=1.0, blocks=8, lower=0.0, upper=1.0, function=np.mean)
    a = sa.assign_blocks(80_000, SeededSource(np.random.default_rng(SEED)))
    assert a.shape == (80_000,) and a.min() >= 0 and a.max() < 8
    counts = np.bincount(a, minlength=8)
    from scipy import stats

    assert stats.chisquare(counts).pvalue > 1e-6


def test_output_near_truth_for_large_k_and_epsilon() -> None:
    data = np.random.default_rng(SEED).normal(40.0, 10.0, size=100_000)
    sa = SampleAndAggregate(epsilon=10.0, blocks=200, lower=0.0, upper=100.0, function=np.mean)
    out = sa.release(data, rng=np.random.default_rng(SEED))
    # noise scale 0.05 (P(|noise| > 1) = e^-20); block means within ±0.1 of the mean
    assert abs(out - data.mean()) < 1.0
    med = SampleAndAggregate(epsilon=10.0, blocks=200, lower=0.0, upper=100.0, function=np.median)
    assert abs(med.release(data, rng=np.random.default_rng(SEED)) - np.median(data)) < 1.0


def test_two_dimensional_rows() -> None:
    data = np.column_stack([np.arange(1000.0), np.ones(1000)])
    sa = SampleAndAggregate(epsilon=5.0, blocks=10, lower=0.0, upper=2.0, function=lambda b: b[:, 1].mean())
    assert abs(sa.release(data, rng=np.random.default_rng(0)) - 1.0) < 1.0


def _sampler(sa: SampleAndAggregate):
    def sample(data, n, rng):
        src = SeededSource(rng)
        return np.fromiter((sa.release(data, rng=src) for _ in range(n)), dtype=np.float64, count=n)

    return sample


# add/remove neighbours with the largest block change: f = max, one added record moves its block
# from 0 to the upper bound.
D0 = np.zeros(12)
D1 = np.concatenate([np.zeros(12), [1.0]])


def test_audit_within_claim() -> None:
    sa = SampleAndAggregate(epsilon=1.0, blocks=4, lower=0.0, upper=1.0, function=np.max)
    res = estimate_epsilon(_sampler(sa), D0, D1, trials=12_000, confidence=STRICT, rng=np.random.default_rng(SEED))
    assert res.epsilon_lower <= sa.event.epsilon


def test_broken_twin_is_caught() -> None:
    # Dividing by k twice: noise for sensitivity (u − l)/k² while claiming ε.
    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Broken(SampleAndAggregate):
        @property
        def sensitivity(self) -> float:
            return (self.upper - self.lower) / self.blocks**2

    sa = Broken(epsilon=1.0, blocks=4, lower=0.0, upper=1.0, function=np.max)
    assert sa.event.epsilon == 1.0  # still claims ε = 1; true ε is 4
    res = estimate_epsilon(_sampler(sa), D0, D1, trials=12_000, confidence=STRICT, rng=np.random.default_rng(SEED))
    assert res.epsilon_lower > sa.event.epsilon


@pytest.mark.parametrize(
    "kwargs",
    [
        {"lower": 5.0, "upper": 1.0},  # bounds reversed
        {"epsilon": 0.0},
        {"epsilon": -2.0},
        {"blocks": 0},
        {"blocks": 2.5},
        {"function": "mean"},  # not callable
        {"neighbours": "swap"},
    ],
)
def test_bad_parameters(kwargs) -> None:
    base = {"epsilon": 1.0, "blocks": 4, "lower": 0.0, "upper": 1.0, "function": np.mean}
    with pytest.raises(InvalidParameterError):
        SampleAndAggregate(**{**base, **kwargs})


def test_bad_data() -> None:
    sa = SampleAndAggregate(epsilon=1.0, blocks=4, lower=0.0, upper=1.0, function=np.mean)
    with pytest.raises(InvalidDataError):  # k > n
        sa.release(np.zeros(3), rng=np.random.default_rng(0))
    with pytest.raises(InvalidDataError):
        sa.release(np.array([]), rng=np.random.default_rng(0))
    with pytest.raises(InvalidDataError):
        sa.release(0.5, rng=np.random.default_rng(0))
    with pytest.raises(InvalidDataError):
        sa.release(["a", "b", "c", "d"], rng=np.random.default_rng(0))


def test_values_and_failing_blocks_never_raise() -> None:
    # NaN/inf in the data used to raise, and so did f raising TypeError/ValueError on a block
    # (which can depend on the data). Now the data go to f as they are, and a block on which f
    # raises or returns a non-number answers the midpoint, like a NaN answer.
    sa = SampleAndAggregate(epsilon=1.0, blocks=4, lower=0.0, upper=1.0, function=np.mean)
    out = sa.release(np.array([0.1, math.nan, 0.2, math.inf, 0.4]), rng=np.random.default_rng(0))
    assert math.isfinite(out)

    def picky(block):
        if np.any(block > 0.5):
            raise ValueError("a secret value was seen")
        return float(np.mean(block))

    data = np.array([0.1, 0.9, 0.2, 0.3])
    assignment = np.array([0, 1, 0, 1])
    mk = lambda f: SampleAndAggregate(epsilon=1.0, blocks=2, lower=0.0, upper=1.0, function=f)  # noqa: E731
    assert mk(picky).block_answers(data, assignment).tolist() == [pytest.approx(0.15), 0.5]
    assert mk(lambda b: "x").block_answers(data, assignment).tolist() == [0.5, 0.5]
