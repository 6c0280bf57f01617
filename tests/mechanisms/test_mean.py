"""Tests for dpkit.mechanisms.mean: BoundedMean = clipped noisy sum / noisy count.

Statistical bounds use fixed seeds and state their false-failure rates (6σ normal bands ≈ 2e-9).
"""

from __future__ import annotations

import dataclasses
import math
from fractions import Fraction

import numpy as np
import pytest

import dpkit.mechanisms.laplace as laplace_module
import dpkit.noise.lattice as lattice_module
from _stats import CountingSource
from dpkit._validate import decimal_fraction
from dpkit.accounting.events import ComposedEvent, LaplaceEvent
from dpkit.errors import InvalidDataError, InvalidParameterError
from dpkit.mechanisms.laplace import Laplace
from dpkit.mechanisms.mean import BoundedMean, MeanRelease

SEED = 20240614


@pytest.fixture
def spy_release(monkeypatch):
    """Record the values each part hands to the lattice (the clipped values for the exact sum,
    the count for the count) and the discrete Laplace scale of every draw, in release order."""
    import dpkit.mechanisms.mean as mean_module

    rec: dict[str, list] = {"values": [], "scales": []}
    real_snap = mean_module.snap
    real_lattice = laplace_module.lattice_laplace
    real_sum_sampler = mean_module.sample_discrete_laplace
    real_sampler = lattice_module.sample_discrete_laplace

    def snap_spy(x, lattice):
        rec["values"].append(np.array(x, copy=True))
        return real_snap(x, lattice)

    def lattice_spy(x, lattice, lattice_scale, src):
        rec["values"].append(np.array(x, copy=True))
        return real_lattice(x, lattice, lattice_scale, src)

    def sampler_spy(real):
        def spy(plan, n, src):
            rec["scales"].append(plan.scale)
            return real(plan, n, src)

        return spy

    monkeypatch.setattr(mean_module, "snap", snap_spy)
    monkeypatch.setattr(laplace_module, "lattice_laplace", lattice_spy)
    monkeypatch.setattr(mean_module, "sample_discrete_laplace", sampler_spy(real_sum_sampler))
    monkeypatch.setattr(lattice_module, "sample_discrete_laplace", sampler_spy(real_sampler))
    return rec


# ------------------------------------------------------------------------------------------------
# the event and the split
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("eps, share", [(1.0, 0.5), (0.4, 0.5), (2.0, 0.75), (1.0, 0.25)])
def test_event_is_two_laplace_events_summing_to_epsilon(eps, share):
    mech = BoundedMean(epsilon=eps, lower=-3.0, upper=2.0, sum_share=share)
    event = mech.event
    assert isinstance(event, ComposedEvent)
    assert len(event.events) == 2
    assert all(isinstance(e, LaplaceEvent) for e in event.events)
    assert all(e.neighbours == "add_remove" for e in event.events)
    sum_event, count_event = event.events
    assert sum_event.epsilon == pytest.approx(eps * share, rel=1e-15)
    assert count_event.epsilon == pytest.approx(eps * (1 - share), rel=1e-15)
    # Exact for these dyadic shares: the parts sum to ε with no rounding.
    # The split is rounded against us: the parts never add up to more than ε, and lose < 1e-15.
    total = 1 / Fraction(sum_event.noise_multiplier) + 1 / Fraction(count_event.noise_multiplier)
    assert decimal_fraction(eps) * (1 - Fraction(1, 10**15)) <= total <= decimal_fraction(eps)


@pytest.mark.parametrize("eps, share", [(1.0, 0.3), (0.7, 0.1), (3.3, 0.9)])
def test_event_parts_sum_to_epsilon_approximately(eps, share):
    parts = BoundedMean(epsilon=eps, lower=0.0, upper=1.0, sum_share=share).event.events
    assert sum(e.epsilon for e in parts) == pytest.approx(eps, rel=1e-14)


@pytest.mark.parametrize("eps, share", [(0.1, 0.1), (0.3, 0.1)])
def test_budget_split_never_exceeds_epsilon(eps, share):
    mech = BoundedMean(epsilon=eps, lower=0.0, upper=1.0, sum_share=share)
    spent = sum(1 / Fraction(e.noise_multiplier) for e in mech.event.events)
    assert spent <= decimal_fraction(eps)


def test_sensitivities_come_from_the_declared_bounds():
    mech = BoundedMean(epsilon=1.0, lower=-3.0, upper=2.0)
    assert mech._sum_mech == Laplace(epsilon=0.5, sensitivity=3.0)  # max(|L|, |U|), add/remove
    assert mech._count_mech == Laplace(epsilon=0.5, sensitivity=1.0)
    assert BoundedMean(epsilon=1.0, lower=2.0, upper=5.0)._sum_mech.sensitivity == 5.0


def test_event_equals_noise_drawn(spy_release):
    mech = BoundedMean(epsilon=0.8, lower=-4.0, upper=10.0, sum_share=0.25)
    mech.release(np.arange(20.0), rng=np.random.default_rng(SEED))
    sum_scale, count_scale = spy_release["scales"]
    sum_plan, count_plan = mech._sum_mech.noise_plan(1), mech._count_mech.noise_plan(1)
    assert sum_scale == sum_plan.lattice_scale and count_scale == count_plan.lattice_scale
    sum_event, count_event = mech.event.events
    assert sum_plan.sensitivity_on_lattice / sum_scale == 1 / Fraction(sum_event.noise_multiplier)
    assert count_plan.sensitivity_on_lattice / count_scale == 1 / Fraction(count_event.noise_multiplier)
    assert sum_plan.sensitivity_on_lattice == Fraction(10.0) / Fraction(sum_plan.lattice.granularity) + 1


# ------------------------------------------------------------------------------------------------
# clipping and utility
# ------------------------------------------------------------------------------------------------


def test_values_are_clipped_before_summing(spy_release):
    mech = BoundedMean(epsilon=1.0, lower=0.0, upper=10.0)
    mech.release(np.array([-100.0, 5.0, 1e9, 3.0]), rng=np.random.default_rng(SEED))
    clipped, count_value = spy_release["values"]
    assert clipped.tolist() == [0.0, 5.0, 10.0, 3.0]  # summed exactly after clipping
    assert count_value.item() == 4.0


def test_outliers_do_not_move_the_mean_beyond_the_bounds():
    # Every value is 1e12, far above the upper bound 10: the mean is that of the clipped data (10).
    # Noise sd of the sum is √2·10/0.5, of the count √2/0.5; with 10^5 rows the ratio is within
    # 1e-2 of 10 except w.p. < 1e-12.
    mech = BoundedMean(epsilon=1.0, lower=0.0, upper=10.0)
    r = mech.release(np.full(100_000, 1e12), rng=np.random.default_rng(SEED))
    assert 0.0 <= r.mean <= 10.0
    assert r.mean == pytest.approx(10.0, abs=1e-2)
    assert r.noisy_sum == pytest.approx(1e6, abs=1e3)


def test_mean_is_always_within_the_bounds():
    # Tiny ε and tiny n: the noise dominates, yet the released mean stays in [lower, upper].
    mech = BoundedMean(epsilon=0.01, lower=-2.0, upper=3.0)
    rng = np.random.default_rng(SEED)
    for _ in range(300):
        r = mech.release([1.0, 2.0], rng=rng)
        assert -2.0 <= r.mean <= 3.0
        assert r.noisy_count >= 1.0


def test_mean_is_accurate_for_large_n():
    # n = 10^5 values in [0, 100]: noise on the sum has sd 100·√2/0.5 ≈ 283, on the count √2/0.5,
    # so the error of the mean is ≈ 283/10^5 ≈ 0.003 (sd); 0.05 is > 15 sd.
    rng = np.random.default_rng(SEED)
    values = rng.uniform(0, 100, size=100_000)
    mech = BoundedMean(epsilon=1.0, lower=0.0, upper=100.0)
    r = mech.release(values, rng=rng)
    assert isinstance(r, MeanRelease)
    assert r.mean == pytest.approx(values.mean(), abs=0.05)
    assert r.noisy_count == pytest.approx(100_000, abs=100)
    assert r.mean == pytest.approx(min(max(r.noisy_sum / r.noisy_count, 0.0), 100.0), rel=1e-15)


def test_noisy_parts_are_unbiased():
    # 2000 releases of the same data: the mean noisy sum is within 6 standard errors of the
    # clipped sum (false failure ≈ 2e-9), likewise the count. Laplace(b) has sd √2·b.
    mech = BoundedMean(epsilon=1.0, lower=0.0, upper=1.0, sum_share=0.5)
    rng = np.random.default_rng(SEED)
    data = np.array([0.2, 0.9, 5.0, -1.0, 0.5])  # clipped sum 2.6, count 5
    trials = 2000
    results = [mech.release(data, rng=rng) for _ in range(trials)]
    sums = np.array([r.noisy_sum for r in results])
    se = math.sqrt(2) * 2.0 / math.sqrt(trials)  # both parts have b = 1/0.5 = 2
    assert abs(sums.mean() - 2.6) <= 6 * se
    counts = np.array([r.noisy_count for r in results])
    # The count is floored at 1 (post-processing; below 1 w.p. e^{-2}/2 per release), which leaves
    # the median alone: the sample median of Laplace(2) has SE ≈ 2/√2000 ≈ 0.045; 0.3 is > 6 SE.
    assert abs(np.median(counts) - 5.0) <= 0.3


def test_multidimensional_values_are_flattened():
    r = BoundedMean(epsilon=5.0, lower=0.0, upper=1.0).release(
        np.full((100, 100), 0.5), rng=np.random.default_rng(SEED)
    )
    assert r.mean == pytest.approx(0.5, abs=0.01)


def test_rng_none_is_secure_and_fresh():
    mech = BoundedMean(epsilon=1.0, lower=0.0, upper=1.0)
    a, b = mech.release(np.full(50, 0.5)), mech.release(np.full(50, 0.5))
    assert a != b
    assert 0.0 <= a.mean <= 1.0


def test_seeded_release_reproduces():
    mech = BoundedMean(epsilon=1.0, lower=0.0, upper=1.0)
    assert mech.release([0.1, 0.2], rng=np.random.default_rng(7)) == mech.release(
        [0.1, 0.2], rng=np.random.default_rng(7)
    )


# ------------------------------------------------------------------------------------------------
# bad input
# ------------------------------------------------------------------------------------------------


def _param_error(name: str, **kwargs) -> InvalidParameterError:
    kwargs = {"epsilon": 1.0, "lower": 0.0, "upper": 1.0, **kwargs}
    with pytest.raises(InvalidParameterError) as info:
        BoundedMean(**kwargs)
    assert info.value.name == name
    assert name in str(info.value)
    return info.value


@pytest.mark.parametrize("eps", [0, -1.0, float("nan"), float("inf"), "1", True, None])
def test_bad_epsilon(eps):
    _param_error("epsilon", epsilon=eps)


@pytest.mark.parametrize("lower, upper", [(1.0, 0.0), (1.0, 1.0), (5, -5)])
def test_reversed_or_equal_bounds(lower, upper):
    err = _param_error("bounds", lower=lower, upper=upper)
    assert "lower < upper" in str(err)


@pytest.mark.parametrize(
    "lower, upper, name",
    [
        (float("nan"), 1.0, "lower"),
        (-float("inf"), 1.0, "lower"),
        ("0", 1.0, "lower"),
        (None, 1.0, "lower"),
        (0.0, float("nan"), "upper"),
        (0.0, float("inf"), "upper"),
        (0.0, "1", "upper"),
        (0.0, True, "upper"),
    ],
)
def test_non_finite_bounds(lower, upper, name):
    with pytest.raises(InvalidParameterError) as info:
        BoundedMean(epsilon=1.0, lower=lower, upper=upper)
    assert name in info.value.name
    assert name in str(info.value)


@pytest.mark.parametrize("share", [0, 0.0, 1, 1.0, 1.5, -0.2, float("nan"), "0.5", True])
def test_bad_sum_share(share):
    _param_error("sum_share", sum_share=share)


# Only public facts (dtype, emptiness) may raise; NaN and ±inf are values (test below).
BAD_VALUES = [
    ("strings", ["1.0", "2.0"], "dtype"),
    ("empty", [], "empty"),
    ("object", np.array([0.5], dtype=object), "dtype"),
    ("bools", [True, True], "dtype"),
]


@pytest.mark.parametrize("case, values, words", BAD_VALUES, ids=[c[0] for c in BAD_VALUES])
def test_bad_values_raise_and_draw_nothing(spy_release, case, values, words):
    src = CountingSource(SEED)
    with pytest.raises(InvalidDataError) as info:
        BoundedMean(epsilon=1.0, lower=0.0, upper=1.0).release(values, rng=src)
    assert info.value.name == "values"
    assert words in str(info.value)
    assert src.calls == 0
    assert spy_release == {"values": [], "scales": []}


def test_non_finite_values_are_clipped_not_refused():
    # Used to raise InvalidDataError. Now NaN counts as 0 and ±inf clip to the bounds: the
    # release equals that of the normalised values under the same randomness.
    mech = BoundedMean(epsilon=1.0, lower=-1.0, upper=2.0)
    got = mech.release([float("nan"), float("inf"), -float("inf"), 1e300, 0.5], rng=np.random.default_rng(SEED))
    want = mech.release([0.0, 2.0, -1.0, 2.0, 0.5], rng=np.random.default_rng(SEED))
    assert got == want


def test_frozen():
    mech = BoundedMean(epsilon=1.0, lower=0.0, upper=1.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        mech.upper = 5.0  # type: ignore[misc]
    r = mech.release([0.5], rng=np.random.default_rng(SEED))
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.mean = 0.0  # type: ignore[misc]


def test_constructor_is_keyword_only():
    with pytest.raises(TypeError):
        BoundedMean(1.0, 0.0, 1.0)  # type: ignore[misc]


def test_sum_is_exact_whatever_the_float_rounding():
    # A float sum can move by more than one record's value when a record is added (Casacuberta
    # et al. 2022); the lattice sum cannot: adding one record at the upper bound moves it by
    # exactly that record's lattice steps, and it matches exact rational arithmetic.
    from dpkit.mechanisms.mean import _exact_lattice_sum
    from dpkit.noise.lattice import Lattice

    mech = BoundedMean(epsilon=1.0, lower=0.0, upper=1.0)
    lattice = mech._sum_mech.noise_plan(1).lattice
    data = np.random.default_rng(SEED).random(20_001)
    a = _exact_lattice_sum(data, lattice)
    b = _exact_lattice_sum(np.append(data, 1.0), lattice)
    assert b - a == round(Fraction(1) / Fraction(lattice.granularity))
    g = Fraction(lattice.granularity)
    assert a == sum(round(Fraction(float(x)) / g) for x in data[:2000]) + _exact_lattice_sum(data[2000:], lattice)
    big = np.full(5000, 2.0**20)  # 2^59 steps each: a plain int64 sum of 5000 would overflow
    assert _exact_lattice_sum(big, Lattice(-39)) == 5000 * 2**59
