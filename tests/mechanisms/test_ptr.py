"""Propose-test-release (seed 004 §5.2; Dwork & Roth 2014 §7.1): refuses on high-sensitivity
data, releases on well-behaved data, records the event of the noise it draws, and its empirical
ε on a neighbouring pair near the test threshold stays within the (ε, δ) claim."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dpkit.accounting.events import ApproxDPEvent
from dpkit.audit import estimate_epsilon
from dpkit.errors import InvalidDataError, InvalidParameterError
from dpkit.mechanisms import local_sensitivity as ls
from dpkit.mechanisms.ptr import ProposeTestRelease, PTRMean, PTRMedian, PTRResult

STRICT = 1 - 1e-6
EPS, DELTA = 1.0, 1e-6
BOTTOM = -1000.0  # how the audit samplers encode ⊥ (outside [lower, upper], far from any noise)


def median_ptr(bound: float = 1.0) -> PTRMedian:
    return PTRMedian(epsilon=EPS, delta=DELTA, bound=bound, lower=0.0, upper=100.0)


def test_event_matches_the_noise_drawn() -> None:
    ptr = median_ptr(bound=0.5)
    assert ptr.event == ApproxDPEvent(1.0, 1e-6, "replace")
    assert ptr.test_mechanism.epsilon + ptr.release_mechanism.epsilon == ptr.event.epsilon
    assert ptr.test_mechanism.sensitivity == 1 and ptr.test_mechanism.scale == 2.0
    assert ptr.release_mechanism.sensitivity == 0.5 and ptr.release_mechanism.scale == 1.0
    assert ptr.threshold == pytest.approx(math.log(1e6) / 0.5)
    # P[test passes | γ = 0] for the exact discrete Laplace noise is below δ
    rho = math.exp(-ptr.epsilon_test)
    assert rho ** (math.floor(ptr.threshold) + 1) / (1 + rho) < DELTA
    assert PTRMean(epsilon=2.0, delta=1e-5, bound=1.0, lower=0.0, upper=1.0).event == ApproxDPEvent(2.0, 1e-5)


def test_refuses_on_spread_out_data() -> None:
    ptr = median_ptr(bound=1.0)
    data = np.array([3.0, 20.0, 41.0, 55.0, 70.0, 88.0, 99.0])
    values, noisy = ptr._release_batch(data, 10_000, np.random.default_rng(1))
    assert np.all(np.isnan(values))
    result = ptr.release(data, rng=np.random.default_rng(2))
    assert result.value is None and not result.released
    assert result.noisy_distance <= result.threshold and result.bound == 1.0


def test_releases_on_concentrated_data() -> None:
    data = np.random.default_rng(3).normal(50.0, 1.0, size=20_001)
    ptr = median_ptr(bound=0.05)
    assert ls.median_distance_to_high_sensitivity(data, 0.05, lower=0.0, upper=100.0) > 200
    values, _ = ptr._release_batch(data, 10_000, np.random.default_rng(4))
    assert not np.any(np.isnan(values))
    assert abs(np.median(values) - np.median(data)) < 0.01
    r = ptr.release(data, rng=np.random.default_rng(5))
    assert isinstance(r, PTRResult) and r.released and isinstance(r.value, float)
    assert r.scale == 0.1 and r.noisy_distance > r.threshold


def test_mean_release_and_refusal() -> None:
    ptr = PTRMean(epsilon=EPS, delta=DELTA, bound=0.005, lower=0.0, upper=100.0)
    big = np.random.default_rng(6).uniform(20.0, 60.0, size=30_000)
    r = ptr.release(big, rng=np.random.default_rng(7))
    assert r.released and abs(r.value - big.mean()) < 0.2
    small = big[:1000]  # (u − l)/n = 0.1 > b: γ = 0
    assert ls.mean_distance_to_high_sensitivity(small, 0.005, upper=100.0) == 0
    assert ptr.release(small, rng=np.random.default_rng(8)).value is None
    assert ptr.release([], rng=np.random.default_rng(9)).value is None  # empty data: γ = 0


def test_generic_ptr_and_infinite_distance() -> None:
    ptr = ProposeTestRelease(
        epsilon=EPS, delta=DELTA, bound=1.0, query=lambda d: float(len(d)), distance=lambda d, b: math.inf
    )
    r = ptr.release([1, 2, 3], rng=np.random.default_rng(0))
    assert r.released and r.noisy_distance == math.inf
    never = ProposeTestRelease(epsilon=EPS, delta=DELTA, bound=1.0, query=lambda d: 0.0, distance=lambda d, b: 0)
    assert never.release([1], rng=np.random.default_rng(0)).value is None


def test_secure_default_rng() -> None:
    assert median_ptr().release(np.linspace(49.0, 51.0, 5001)).released


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(epsilon=0.0),
        dict(epsilon=float("nan")),
        dict(delta=0.0),
        dict(delta=1.0),
        dict(bound=-1.0),
        dict(bound=float("inf")),
        dict(lower=5.0, upper=5.0),
        dict(lower=float("-inf")),
    ],
)
def test_bad_parameters(kwargs) -> None:
    args = dict(epsilon=EPS, delta=DELTA, bound=1.0, lower=0.0, upper=100.0) | kwargs
    with pytest.raises(InvalidParameterError):
        PTRMedian(**args)


@pytest.mark.parametrize(
    "query, distance",
    [(None, lambda d, b: 0), (lambda d: 0.0, "no")],
)
def test_bad_callables(query, distance) -> None:
    with pytest.raises(InvalidParameterError):
        ProposeTestRelease(epsilon=EPS, delta=DELTA, bound=1.0, query=query, distance=distance)


@pytest.mark.parametrize("gamma", [True, "3", None])
def test_distance_of_the_wrong_type(gamma) -> None:
    ptr = ProposeTestRelease(epsilon=EPS, delta=DELTA, bound=1.0, query=lambda d: 0.0, distance=lambda d, b: gamma)
    with pytest.raises(InvalidParameterError) as info:
        ptr.release([1.0], rng=np.random.default_rng(0))
    assert repr(gamma) not in str(info.value).replace(repr(type(gamma)), "")  # the type, not the value


@pytest.mark.parametrize(
    "gamma, as_gamma", [(-1, 0), (1.5, 1), (float("nan"), 0), (-math.inf, 0), (2**80, 2**62), (1e300, 2**62), (7.0, 7)]
)
def test_distance_values_are_mapped_not_refused(gamma, as_gamma) -> None:
    # Used to raise (and to quote γ, a number computed from the data). Now min(2^62, max(0, ⌊γ⌋)).
    def run(g):
        ptr = ProposeTestRelease(epsilon=EPS, delta=DELTA, bound=1.0, query=lambda d: 3.0, distance=lambda d, b: g)
        return ptr.release([1.0], rng=np.random.default_rng(0))

    got, want = run(gamma), run(as_gamma)
    assert got.noisy_distance == want.noisy_distance and got.value == want.value


def test_query_values_nan_and_inf_are_not_refused() -> None:
    def run(value):
        ptr = ProposeTestRelease(
            epsilon=EPS, delta=DELTA, bound=1.0, query=lambda d: value, distance=lambda d, b: math.inf
        )
        return ptr.release([1.0], rng=np.random.default_rng(0)).value

    from dpkit.noise.lattice import value_limit

    ptr = ProposeTestRelease(epsilon=EPS, delta=DELTA, bound=1.0, query=lambda d: 0.0, distance=lambda d, b: math.inf)
    m = value_limit(ptr.release_mechanism.noise_plan(1).lattice)
    assert run(float("nan")) == run(0.0)  # NaN counts as 0
    assert run(float("inf")) == run(m) and math.isfinite(run(m))  # ±inf clamp in the Laplace release
    assert run(-float("inf")) == run(-m)


def test_query_of_the_wrong_type() -> None:
    ptr = ProposeTestRelease(epsilon=EPS, delta=DELTA, bound=1.0, query=lambda d: "secret", distance=lambda d, b: 5)
    with pytest.raises(InvalidDataError) as info:
        ptr.release([1.0], rng=np.random.default_rng(0))
    assert "secret" not in str(info.value)


@pytest.mark.parametrize("data", [[], [[1.0]], ["x"]])
def test_bad_data(data) -> None:
    with pytest.raises(InvalidDataError):
        median_ptr().release(data, rng=np.random.default_rng(0))


def test_nothing_sampled_on_bad_data() -> None:
    rng = np.random.default_rng(0)
    state = rng.bit_generator.state
    with pytest.raises(InvalidDataError):
        median_ptr().release(["x", "y"], rng=rng)
    assert rng.bit_generator.state == state


def test_non_finite_data_are_clipped_not_refused() -> None:
    # Used to raise on NaN/inf. Now NaN counts as 0 and ±inf clip to [lower, upper].
    a = median_ptr().release([1.0, float("nan"), float("inf"), -float("inf"), 50.0], rng=np.random.default_rng(0))
    b = median_ptr().release([1.0, 0.0, 100.0, 0.0, 50.0], rng=np.random.default_rng(0))
    assert a == b


def test_ptr_median_audit_within_claim() -> None:
    """A pair near the threshold (γ = 29 vs 28, T ≈ 27.6, so both pass often): y replaces the median
    record of x by the upper bound, which opens a 2g gap (γ drops by 1) and moves the median by g."""
    g, b = 1 / 29.5, 1.0
    x = 50.0 + g * (np.arange(201) - 100)
    y = x.copy()
    y[100] = 100.0
    ptr = median_ptr(bound=b)
    assert ls.median_distance_to_high_sensitivity(x, b, lower=0.0, upper=100.0) == 29
    assert ls.median_distance_to_high_sensitivity(y, b, lower=0.0, upper=100.0) == 28

    def sampler(data, n, rng):
        values, _ = ptr._release_batch(data, n, rng)
        return np.where(np.isnan(values), BOTTOM, values)

    def distances(data, n, rng):
        return ptr._release_batch(data, n, rng)[1].astype(np.int64)

    for s in (sampler, distances):
        result = estimate_epsilon(
            s, x, y, trials=200_000, delta=DELTA, confidence=STRICT, rng=np.random.default_rng(12)
        )
        assert result.epsilon_lower <= EPS, str(result)
        assert result.epsilon_lower > 0.2, str(result)  # the test's ε/2 = 0.5 is visible


def test_error_bound_covers_released_values() -> None:
    # On concentrated data the test passes; the released value is within the 95 % bound of the
    # truth in >= 92 % of 2,000 runs (expected >= 95 %, binomial sd 0.5 %: false failure ~1e-9).
    import numpy as np

    from dpkit.mechanisms.ptr import PTRMean

    mech = PTRMean(epsilon=1.0, delta=1e-6, bound=0.01, lower=0.0, upper=100.0)
    data = np.full(20_000, 40.0)
    a = mech.error_bound(0.05)
    rng = np.random.default_rng(7)
    hits = [abs(r.value - 40.0) <= a for r in (mech.release(data, rng=rng) for _ in range(2000)) if r.released]
    assert len(hits) == 2000 and np.mean(hits) >= 0.92
