"""Tests for dpkit.mechanisms.gaussian: the Gaussian mechanism on a lattice (floating-point safe).

Statistical checks use fixed seeds; each bound states its false-failure rate for a correct
implementation (6σ normal bands ≈ 2e-9, one-sided 5σ binomial bands ≈ 3e-7, KS at α = 1e-6).
The (ε, δ) curve itself is tested in tests/accounting/test_analytic_gaussian.py.
"""

from __future__ import annotations

import dataclasses
import math
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

import dpkit.noise.lattice as lattice_module
from _stats import ALPHA, CountingSource
from dpkit.accounting.analytic_gaussian import analytic_gaussian_sigma, classic_gaussian_sigma, gaussian_delta
from dpkit.accounting.events import GaussianEvent
from dpkit.errors import InvalidDataError, InvalidParameterError
from dpkit.mechanisms.gaussian import Gaussian, GaussianNoisePlan

SEED = 20240612
N = 1_000_000
_MARGIN = 1.0 - 2.0**-20  # the mechanism calibrates for δ·(1 − 2^-20) (see gaussian.py)


@pytest.fixture
def spy_gaussian(monkeypatch):
    """Record (sigma, n) of every discrete Gaussian draw made for a lattice release."""
    calls: list[tuple[Fraction, int]] = []
    real = lattice_module.sample_discrete_gaussian

    def spy(sigma, n, src):
        calls.append((Fraction(sigma), int(n)))
        return real(sigma, n, src)

    monkeypatch.setattr(lattice_module, "sample_discrete_gaussian", spy)
    return calls


# ------------------------------------------------------------------------------------------------
# calibration and the event
# ------------------------------------------------------------------------------------------------


def test_docstring_sigma():
    mech = Gaussian(epsilon=1.0, delta=1e-6, sensitivity=1.0)
    assert round(mech.sigma, 3) == 4.225
    assert mech.calibration == "analytic"
    assert mech.neighbours == "add_remove"


@pytest.mark.parametrize("eps, delta, sens", [(1.0, 1e-6, 1.0), (0.5, 1e-5, 3.0), (5.0, 1e-5, 1.0), (0.01, 1e-8, 0.5)])
def test_analytic_sigma_is_the_calibration_for_the_margined_delta(eps, delta, sens):
    mech = Gaussian(epsilon=eps, delta=delta, sensitivity=sens)
    unit = analytic_gaussian_sigma(eps, delta * _MARGIN, 1.0)
    assert mech.sigma == pytest.approx(unit * sens, rel=1e-15)
    event = mech.event
    assert isinstance(event, GaussianEvent)
    assert event.noise_multiplier == unit
    assert event.neighbours == "add_remove"
    # The event, evaluated on the exact Gaussian curve, meets the target.
    assert gaussian_delta(eps, event.noise_multiplier) <= delta


def test_classic_calibration():
    mech = Gaussian(epsilon=0.5, delta=1e-5, sensitivity=2.0, calibration="classic")
    assert mech.event.noise_multiplier == classic_gaussian_sigma(0.5, 1e-5 * _MARGIN, 1.0)
    assert mech.sigma == pytest.approx(2.0 * math.sqrt(2 * math.log(1.25 / 1e-5)) / 0.5, rel=1e-6)
    analytic = Gaussian(epsilon=0.5, delta=1e-5, sensitivity=2.0)
    assert analytic.sigma < mech.sigma


def test_classic_calibration_refuses_epsilon_at_least_one():
    with pytest.raises(InvalidParameterError) as info:
        Gaussian(epsilon=1.0, delta=1e-5, calibration="classic")
    assert info.value.name == "epsilon"
    msg = str(info.value)
    assert "ε < 1" in msg and "analytic" in msg and "3.22" in msg


def test_neighbours_propagate_to_the_event():
    assert Gaussian(epsilon=1.0, delta=1e-6, neighbours="replace").event.neighbours == "replace"


@pytest.mark.parametrize("size", [1, 5, 1000, 40_000])
@pytest.mark.parametrize(
    "kwargs",
    [
        {"epsilon": 1.0, "delta": 1e-6},
        {"epsilon": 0.3, "delta": 1e-9, "sensitivity": 4.0},
        {"epsilon": 5.0, "delta": 1e-5, "sensitivity": 0.1},
        {"epsilon": 0.5, "delta": 1e-5, "calibration": "classic"},
    ],
)
def test_event_equals_noise_drawn(spy_gaussian, kwargs, size):
    mech = Gaussian(**kwargs)
    plan = mech.noise_plan(size)
    assert isinstance(plan, GaussianNoisePlan)
    mech.release(np.zeros(size) if size > 1 else 0.0, rng=np.random.default_rng(SEED))
    assert spy_gaussian, "release drew no discrete Gaussian noise"
    assert {s for s, _ in spy_gaussian} == {plan.lattice_sigma}
    assert sum(n for _, n in spy_gaussian) == size
    g = plan.lattice.granularity
    # The ℓ2 distance between snapped neighbours is covered (rounded up).
    assert Fraction(plan.sensitivity_on_lattice) >= Fraction(mech.sensitivity) / Fraction(g) + Fraction(math.sqrt(size))
    event = mech.event
    # σ/(Δ + g√d) of the noise drawn is at least the event's multiplier, and not by more than 1e-9.
    drawn_multiplier = plan.lattice_sigma / Fraction(plan.sensitivity_on_lattice)
    assert drawn_multiplier >= Fraction(event.noise_multiplier)
    assert plan.noise_multiplier >= event.noise_multiplier
    assert plan.noise_multiplier <= event.noise_multiplier * (1 + 1e-9)
    assert gaussian_delta(mech.epsilon, plan.noise_multiplier) <= mech.delta
    assert mech.sigma <= plan.sigma <= mech.sigma * (1 + 1e-6)


@pytest.mark.parametrize("eps, delta", [(0.001, 1e-5), (0.001, 1e-4)])
def test_small_epsilon_constructs(eps, delta):
    mech = Gaussian(epsilon=eps, delta=delta)
    assert gaussian_delta(eps, mech.event.noise_multiplier) <= delta


# ------------------------------------------------------------------------------------------------
# distribution and shapes
# ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gaussian_sample():
    mech = Gaussian(epsilon=1.0, delta=1e-6, sensitivity=1.0)
    x = np.full(N, -2.7)
    return mech, x, mech.release(x, rng=np.random.default_rng(SEED + 1))


def test_noise_has_standard_deviation_sigma(gaussian_sample):
    # For normal data the sample sd has standard error σ/√(2n); the mean has σ/√n. 6 standard
    # errors two-sided: ≈ 2e-9 each. KS against N(0, σ²) at α = 1e-6 (the lattice is 2^-40 of σ).
    mech, x, y = gaussian_sample
    noise = y - x
    sigma = mech.sigma
    assert abs(noise.std() - sigma) <= 6 * sigma / math.sqrt(2 * N)
    assert abs(noise.mean()) <= 6 * sigma / math.sqrt(N)
    assert stats.kstest(noise, "norm", args=(0.0, sigma)).pvalue > ALPHA


def test_outputs_lie_on_the_lattice():
    mech = Gaussian(epsilon=1.0, delta=1e-6)
    x = np.array([0.1, -0.3, 1 / 3, 98765.4321])
    plan = mech.noise_plan(x.size)
    y = mech.release(x, rng=np.random.default_rng(SEED))
    steps = np.ldexp(y, -plan.lattice.exponent)
    assert np.all(steps == np.rint(steps))


def test_release_shapes():
    mech = Gaussian(epsilon=1.0, delta=1e-6)
    rng = np.random.default_rng(SEED)
    for scalar in (3.0, 3, np.float32(3.0), np.array(3.0)):
        assert type(mech.release(scalar, rng=rng)) is float
    out = mech.release([1, 2, 3], rng=rng)
    assert isinstance(out, np.ndarray) and out.shape == (3,) and out.dtype == np.float64
    assert mech.release(np.zeros((3, 2, 2)), rng=rng).shape == (3, 2, 2)
    assert mech.release(np.zeros(1), rng=rng).shape == (1,)


@pytest.mark.parametrize("eps", [5.0, 0.01])
def test_extreme_but_valid_epsilon_releases(eps):
    mech = Gaussian(epsilon=eps, delta=1e-5)
    y = mech.release(np.zeros(20_000), rng=np.random.default_rng(SEED))
    # sd within 6 standard errors (σ/√(2n)): ≈ 2e-9.
    assert abs(y.std() - mech.sigma) <= 6 * mech.sigma / math.sqrt(2 * y.size)


# ------------------------------------------------------------------------------------------------
# accuracy
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("beta", [0.05, 0.01, 1e-3])
def test_error_bound_is_conservative(gaussian_sample, beta):
    # The sub-Gaussian bound 2·exp(−a²/2σ²) over-states the normal tail: only P(|err| > a) <= β is
    # promised. One-sided 5σ binomial band: ≈ 3e-7.
    mech, x, y = gaussian_sample
    a = mech.error_bound(beta, size=N)
    assert a >= mech.sigma * stats.norm.isf(beta / 2)  # at least the exact normal quantile
    assert a == pytest.approx(mech.sigma * math.sqrt(2 * math.log(2 / beta)), rel=1e-6)
    exceed = int(np.sum(np.abs(y - x) > a))
    assert exceed <= N * beta + 5 * math.sqrt(N * beta * (1 - beta))


def test_confidence_interval_covers():
    # Coverage of the conservative 95% interval is ≈ 99.3%; ≥ 94% of 20,000 fails w.p. ≪ 1e-10.
    rng = np.random.default_rng(SEED + 2)
    mech = Gaussian(epsilon=0.7, delta=1e-7, sensitivity=2.0)
    n = 20_000
    truth = rng.normal(0, 50, size=n)
    released = mech.release(truth, rng=rng)
    low, high = mech.confidence_interval(released, 0.95)
    covered = int(np.sum((low <= truth) & (truth <= high)))
    assert covered >= 0.94 * n
    np.testing.assert_allclose(high - low, 2 * mech.error_bound(0.05, size=n), rtol=1e-12)
    lo, hi = mech.confidence_interval(1.5)
    assert type(lo) is float and lo < 1.5 < hi


# ------------------------------------------------------------------------------------------------
# randomness
# ------------------------------------------------------------------------------------------------


def test_rng_none_is_secure_and_fresh():
    mech = Gaussian(epsilon=1.0, delta=1e-6)
    a, b = mech.release(np.zeros(50)), mech.release(np.zeros(50))
    assert np.all(np.isfinite(a))
    assert not np.array_equal(a, b)
    assert mech.release(1.0) != mech.release(1.0)  # P(equal) ≈ g/σ ≈ 2^-40
    s1 = mech.release(np.zeros(5), rng=np.random.default_rng(SEED))
    s2 = mech.release(np.zeros(5), rng=np.random.default_rng(SEED))
    np.testing.assert_array_equal(s1, s2)


# ------------------------------------------------------------------------------------------------
# bad input
# ------------------------------------------------------------------------------------------------


def _param_error(name: str, **kwargs) -> InvalidParameterError:
    kwargs = {"epsilon": 1.0, "delta": 1e-6, **kwargs}
    with pytest.raises(InvalidParameterError) as info:
        Gaussian(**kwargs)
    assert info.value.name == name
    assert name in str(info.value)
    return info.value


@pytest.mark.parametrize("eps", [0, 0.0, -0.5, float("nan"), float("inf"), "1.0", True, None])
def test_bad_epsilon(eps):
    _param_error("epsilon", epsilon=eps)


@pytest.mark.parametrize("delta", [-1e-6, 1.0, 1.5, float("nan"), float("inf"), "1e-6", True, None])
def test_bad_delta(delta):
    _param_error("delta", delta=delta)


@pytest.mark.parametrize("delta", [0, 0.0])
def test_delta_zero_is_refused(delta):
    err = _param_error("delta", delta=delta)
    assert "(0, 1)" in str(err)


def test_delta_below_two_to_minus_58_is_refused():
    err = _param_error("delta", delta=1e-20)
    assert "2**-58" in str(err)


@pytest.mark.parametrize("sens", [0, -1.0, float("nan"), float("inf"), "2", True])
def test_bad_sensitivity(sens):
    _param_error("sensitivity", sensitivity=sens)


@pytest.mark.parametrize("nb", ["add-remove", "substitute", None, ""])
def test_bad_neighbours(nb):
    _param_error("neighbours", neighbours=nb)


@pytest.mark.parametrize("cal", ["Analytic", "rdp", "", None, 1])
def test_bad_calibration(cal):
    err = _param_error("calibration", calibration=cal)
    assert "'analytic' or 'classic'" in str(err)


# Only public facts (dtype, emptiness) may raise; NaN and ±inf are values, clamped (test below).
BAD_VALUES = [
    ("strings", ["1", "2"], "dtype"),
    ("empty", np.array([]), "empty"),
    ("object dtype", np.array([1.0], dtype=object), "dtype"),
    ("bools", [True], "dtype"),
]


@pytest.mark.parametrize("case, value, words", BAD_VALUES, ids=[c[0] for c in BAD_VALUES])
def test_bad_value_raises_and_draws_nothing(spy_gaussian, case, value, words):
    src = CountingSource(SEED)
    with pytest.raises(InvalidDataError) as info:
        Gaussian(epsilon=1.0, delta=1e-6).release(value, rng=src)
    assert info.value.name == "value"
    assert words in str(info.value)
    assert src.calls == 0 and spy_gaussian == []


def test_non_finite_and_huge_values_are_clamped():
    # Used to raise InvalidDataError on NaN/inf (and on 1e308 for a fine lattice). Now NaN → 0 and
    # everything is clamped to ±value_limit(lattice); same randomness, same output.
    from dpkit.noise.lattice import value_limit

    mech = Gaussian(epsilon=1.0, delta=1e-6)
    m = value_limit(mech.noise_plan(4).lattice)
    got = mech.release([float("nan"), float("inf"), -float("inf"), 1e308], rng=np.random.default_rng(SEED))
    want = mech.release([0.0, m, -m, m], rng=np.random.default_rng(SEED))
    np.testing.assert_array_equal(got, want)
    assert np.all(np.isfinite(got))


@pytest.mark.parametrize("beta", [0, 1, -0.1, 2.0, float("nan"), "0.1"])
def test_bad_beta(beta):
    with pytest.raises(InvalidParameterError) as info:
        Gaussian(epsilon=1.0, delta=1e-6).error_bound(beta)
    assert info.value.name == "beta"


@pytest.mark.parametrize("confidence", [0, 1.0, 1.01, -0.95, float("inf"), None])
def test_bad_confidence(confidence):
    with pytest.raises(InvalidParameterError) as info:
        Gaussian(epsilon=1.0, delta=1e-6).confidence_interval(0.0, confidence)
    assert info.value.name == "confidence"


def test_frozen():
    mech = Gaussian(epsilon=1.0, delta=1e-6)
    with pytest.raises(dataclasses.FrozenInstanceError):
        mech.delta = 0.5  # type: ignore[misc]


def test_constructor_is_keyword_only():
    with pytest.raises(TypeError):
        Gaussian(1.0, 1e-6)  # type: ignore[misc]
