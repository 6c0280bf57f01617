"""Tests for dpkit.mechanisms.laplace: the Laplace mechanism (lattice, floating-point safe) and the
geometric mechanism (integers).

Statistical checks use fixed seeds and bounds chosen so that a correct implementation fails them
with a stated, tiny probability over seeds: 6σ two-sided normal bands (≈ 2e-9), one-sided 5σ
binomial bands (≈ 3e-7) and χ² / KS tests at α = 1e-6. ε audits live in tests/audit/.
"""

from __future__ import annotations

import dataclasses
import math
from fractions import Fraction

import mpmath
import numpy as np
import pytest
from scipy import stats

import dpkit.mechanisms.laplace as laplace_module
import dpkit.noise.lattice as lattice_module
from _stats import ALPHA, CountingSource, chi2_pvalue
from dpkit._validate import decimal_fraction
from dpkit.accounting.events import LaplaceEvent
from dpkit.errors import InvalidDataError, InvalidParameterError
from dpkit.mechanisms.laplace import Geometric, Laplace, LaplaceNoisePlan

SEED = 20240611
N = 1_000_000
MP_PREC = 200


@pytest.fixture
def spy_lattice_laplace(monkeypatch):
    """Record (plan.scale, n) of every discrete Laplace draw made for a lattice release."""
    calls: list[tuple[Fraction, int]] = []
    real = lattice_module.sample_discrete_laplace

    def spy(plan, n, src):
        calls.append((plan.scale, int(n)))
        return real(plan, n, src)

    monkeypatch.setattr(lattice_module, "sample_discrete_laplace", spy)
    return calls


@pytest.fixture
def spy_geometric(monkeypatch):
    """Record (plan.scale, n) of every discrete Laplace draw made by Geometric.release."""
    calls: list[tuple[Fraction, int]] = []
    real = laplace_module.sample_discrete_laplace

    def spy(plan, n, src):
        calls.append((plan.scale, int(n)))
        return real(plan, n, src)

    monkeypatch.setattr(laplace_module, "sample_discrete_laplace", spy)
    return calls


def dlap_pmf(scale: float, support: np.ndarray) -> np.ndarray:
    rho = math.exp(-1.0 / scale)
    return (1 - rho) / (1 + rho) * rho ** np.abs(support).astype(float)


# ------------------------------------------------------------------------------------------------
# Laplace: parameters and the event
# ------------------------------------------------------------------------------------------------


def test_laplace_scale_and_event():
    mech = Laplace(epsilon=0.5, sensitivity=2.0, neighbours="replace")
    assert mech.scale == 4.0
    event = mech.event
    assert isinstance(event, LaplaceEvent)
    assert event.noise_multiplier == 2.0
    assert event.epsilon == 0.5
    assert event.neighbours == "replace"
    assert Laplace(epsilon=1.0).neighbours == "add_remove"


@pytest.mark.parametrize("size", [1, 7, 1000, 40_000])
@pytest.mark.parametrize(
    "eps, sens",
    [
        (1.0, 1.0),
        (0.5, 2.0),
        (0.3, 1.0),
        (2.0, 0.25),
        (1e-3, 10.0),
    ],
)
def test_laplace_event_equals_noise_drawn(spy_lattice_laplace, eps, sens, size):
    mech = Laplace(epsilon=eps, sensitivity=sens)
    plan = mech.noise_plan(size)
    assert isinstance(plan, LaplaceNoisePlan)
    mech.release(np.zeros(size) if size > 1 else 0.0, rng=np.random.default_rng(SEED))
    # The sampler may be called in several blocks; every block uses the planned scale.
    assert spy_lattice_laplace, "release drew no discrete Laplace noise"
    assert {scale for scale, _ in spy_lattice_laplace} == {plan.lattice_scale}
    assert sum(n for _, n in spy_lattice_laplace) == size
    g = Fraction(plan.lattice.granularity)
    assert plan.sensitivity_on_lattice == Fraction(sens) / g + size
    assert plan.lattice_scale == plan.sensitivity_on_lattice / decimal_fraction(eps)
    # The noise drawn is exactly Fraction(ε)-DP on the lattice, and the event says so.
    assert plan.sensitivity_on_lattice / plan.lattice_scale == decimal_fraction(eps)
    assert plan.epsilon == eps
    assert Fraction(mech.event.epsilon) >= decimal_fraction(eps) and mech.event.epsilon <= math.nextafter(eps, math.inf)
    # The lattice is chosen from the scale alone and is tiny relative to it: the extra noise from
    # snapping (size·g/Δ relative) is negligible at these sizes.
    assert mech.scale <= plan.scale <= mech.scale * (1 + 1e-5)


def test_laplace_lattice_overhead_is_bounded_for_small_epsilon():
    # Snapping adds size·g/Δ to the noise, relative. The lattice scale is capped at 2^47 (the
    # samplers' fast range), so for long vectors and tiny ε the documented bound size/(ε·2^47)
    # applies: here 10^12/2^47 ≈ 0.7 % more noise than Δ/ε — a utility cost, never a privacy one.
    mech = Laplace(epsilon=1e-6)
    size = 10**6
    assert mech.noise_plan(size).scale <= mech.scale * (1 + size / (1e-6 * 2.0**47) * 1.01)
    assert Laplace(epsilon=1.0).noise_plan(100).scale <= 1.0 * (1 + 2.0**-39)


# 1/fl(1/ε) != ε for about 14% of doubles. The event therefore stores the multiplier rounded
# down and reports ε rounded up: it may overstate the noise's ε by one ulp, never understate it.
@pytest.mark.parametrize("eps", [0.11, 0.41, 0.3, 1.0])
def test_laplace_event_epsilon_brackets_the_noise_epsilon(eps):
    mech = Laplace(epsilon=eps)
    exact = mech.noise_plan(1).sensitivity_on_lattice / mech.noise_plan(1).lattice_scale
    assert exact == decimal_fraction(eps)
    assert Fraction(mech.event.epsilon) >= exact
    assert mech.event.epsilon <= math.nextafter(eps, math.inf)


def test_laplace_event_never_understates_the_epsilon_of_the_noise():
    mech = Laplace(epsilon=0.11)
    plan = mech.noise_plan(1)
    true_eps = plan.sensitivity_on_lattice / plan.lattice_scale  # exact, as sampled
    assert 1 / Fraction(mech.event.noise_multiplier) >= true_eps


def test_noise_plan_lattice_does_not_depend_on_data(spy_lattice_laplace):
    mech = Laplace(epsilon=1.0)
    rng = np.random.default_rng(SEED)
    for x in (0.0, 1e6, -3.25, 1e-300):
        mech.release(x, rng=rng)
    assert len({scale for scale, _ in spy_lattice_laplace}) == 1


# ------------------------------------------------------------------------------------------------
# Laplace: distribution and shapes
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("eps, sens", [(1.0, 1.0), (0.5, 2.0)])
def test_laplace_noise_has_the_right_scale(eps, sens):
    # For Laplace(b), |Y| ~ Exp(b): mean b, sd b. The mean of 10^6 values is within 6 standard
    # errors of b except with probability ≈ 2e-9 (normal approximation, n = 10^6); likewise the
    # signed mean is within 6·√2·b/√n of 0. KS against the continuous Laplace(b) at α = 1e-6: the
    # lattice is 2^-40 of b, invisible to KS at this n.
    mech = Laplace(epsilon=eps, sensitivity=sens)
    b = mech.scale
    y = mech.release(np.zeros(N), rng=np.random.default_rng(SEED))
    assert y.shape == (N,) and y.dtype == np.float64
    assert abs(np.abs(y).mean() - b) <= 6 * b / math.sqrt(N)
    assert abs(y.mean()) <= 6 * math.sqrt(2) * b / math.sqrt(N)
    assert stats.kstest(y, "laplace", args=(0.0, b)).pvalue > ALPHA


def test_laplace_outputs_lie_on_the_lattice():
    mech = Laplace(epsilon=1.0)
    x = np.array([0.1, -0.3, 1 / 3, 123456.789, 0.0])
    plan = mech.noise_plan(x.size)
    y = mech.release(x, rng=np.random.default_rng(SEED))
    steps = np.ldexp(y, -plan.lattice.exponent)
    assert np.all(steps == np.rint(steps))


def test_laplace_release_shapes():
    mech = Laplace(epsilon=1.0)
    rng = np.random.default_rng(SEED)
    for scalar in (3.0, 3, np.float64(3.0), np.int64(3), np.array(3.0)):
        out = mech.release(scalar, rng=rng)
        assert type(out) is float
    out = mech.release([1.0, 2.0], rng=rng)
    assert isinstance(out, np.ndarray) and out.shape == (2,) and out.dtype == np.float64
    out = mech.release(np.zeros((2, 3, 4)), rng=rng)
    assert out.shape == (2, 3, 4)
    out = mech.release(np.arange(6, dtype=np.int32).reshape(3, 2), rng=rng)
    assert out.shape == (3, 2) and out.dtype == np.float64
    out = mech.release(np.zeros(1), rng=rng)
    assert isinstance(out, np.ndarray) and out.shape == (1,)


def test_laplace_release_does_not_modify_input():
    x = np.array([1.0, 2.0, 3.0])
    Laplace(epsilon=1.0).release(x, rng=np.random.default_rng(SEED))
    assert x.tolist() == [1.0, 2.0, 3.0]


# ------------------------------------------------------------------------------------------------
# Laplace: accuracy
# ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def laplace_sample():
    mech = Laplace(epsilon=0.5, sensitivity=1.0)
    x = np.full(N, 0.3)  # off the lattice: the snapping error counts as error too
    return mech, x, mech.release(x, rng=np.random.default_rng(SEED + 1))


@pytest.mark.parametrize("beta", [0.05, 0.01, 1e-3])
def test_laplace_error_bound_holds_and_is_tight(laplace_sample, beta):
    # Exceedances ~ Binomial(n, p) with p <= β. Upper check: one-sided 5σ (≈ 3e-7). The bound is
    # exact for the lattice Laplace up to one lattice step, so p ≈ β and p >= β/2 is ≥ 20σ away
    # from failing.
    mech, x, y = laplace_sample
    a = mech.error_bound(beta, size=N)
    assert a == pytest.approx(mech.scale * math.log(1 / beta), rel=1e-6)  # P(|Y| > t·b) = e^{-t}
    exceed = int(np.sum(np.abs(y - x) > a))
    se = math.sqrt(N * beta * (1 - beta))
    assert exceed <= N * beta + 5 * se
    assert exceed >= N * beta / 2


def test_laplace_confidence_interval_covers():
    # 20,000 coordinates released at once; covered ~ Binomial(20000, ≈ 0.95): ≥ 94% is 6.5σ away
    # and, since the bound is tight, ≤ 95% + 5σ (≈ 3e-7 each).
    rng = np.random.default_rng(SEED + 2)
    mech = Laplace(epsilon=0.2, sensitivity=3.0)
    n = 20_000
    truth = rng.uniform(-100, 100, size=n)
    released = mech.release(truth, rng=rng)
    low, high = mech.confidence_interval(released, 0.95)
    assert low.shape == high.shape == (n,)
    covered = int(np.sum((low <= truth) & (truth <= high)))
    assert covered >= 0.94 * n
    assert covered <= 0.95 * n + 5 * math.sqrt(n * 0.95 * 0.05)
    np.testing.assert_allclose(high - low, 2 * mech.error_bound(0.05, size=n), rtol=1e-12)


def test_laplace_confidence_interval_scalar():
    mech = Laplace(epsilon=1.0)
    low, high = mech.confidence_interval(10.0, 0.9)
    assert type(low) is float and type(high) is float
    assert low < 10.0 < high
    assert high - low == pytest.approx(2 * mech.error_bound(0.1), rel=1e-12)
    low99, high99 = mech.confidence_interval(10.0, 0.99)
    assert low99 < low and high < high99


# ------------------------------------------------------------------------------------------------
# Laplace: randomness
# ------------------------------------------------------------------------------------------------


def test_laplace_rng_none_is_secure_and_fresh():
    mech = Laplace(epsilon=1.0)
    a, b = mech.release(np.zeros(100)), mech.release(np.zeros(100))
    assert np.all(np.isfinite(a)) and a.shape == (100,)
    assert not np.array_equal(a, b)  # two 100-vectors of continuous-like noise never coincide
    assert mech.release(0.0) != mech.release(0.0)  # P(equal) ≈ g/(2b) ≈ 2^-41
    s1 = mech.release(np.zeros(10), rng=np.random.default_rng(SEED))
    s2 = mech.release(np.zeros(10), rng=np.random.default_rng(SEED))
    np.testing.assert_array_equal(s1, s2)


def test_laplace_rejects_a_bad_rng():
    with pytest.raises(InvalidParameterError, match="rng"):
        Laplace(epsilon=1.0).release(0.0, rng=42)


# ------------------------------------------------------------------------------------------------
# Geometric
# ------------------------------------------------------------------------------------------------


def test_geometric_scale_and_event():
    mech = Geometric(epsilon=0.5, sensitivity=3)
    assert mech.scale == 6.0
    assert isinstance(mech.event, LaplaceEvent)
    assert mech.event.epsilon == 0.5
    assert mech.event.neighbours == "add_remove"
    assert Geometric(epsilon=1.0, neighbours="replace").event.neighbours == "replace"


@pytest.mark.parametrize("eps, sens", [(0.5, 1), (0.3, 3), (1.0, 1), (0.1, 7), (2.5, 2)])
def test_geometric_event_equals_noise_drawn(spy_geometric, eps, sens):
    mech = Geometric(epsilon=eps, sensitivity=sens)
    mech.release(np.zeros(100, dtype=np.int64), rng=np.random.default_rng(SEED))
    assert {s for s, _ in spy_geometric} == {Fraction(sens) / decimal_fraction(eps)}
    assert sum(n for _, n in spy_geometric) == 100
    # Exactly ε-DP for an integer query of sensitivity Δ: scale = Δ/ε taken at ε's decimal value,
    # the amount the event charges.
    (scale,) = {s for s, _ in spy_geometric}
    assert Fraction(sens) / scale == decimal_fraction(eps) == 1 / Fraction(mech.event.noise_multiplier)


@pytest.mark.parametrize("eps", [0.11, 0.41])
def test_geometric_event_never_understates_epsilon(eps):
    event = Geometric(epsilon=eps).event
    assert 1 / Fraction(event.noise_multiplier) >= decimal_fraction(eps)
    assert decimal_fraction(eps) <= Fraction(event.epsilon) and event.epsilon <= math.nextafter(eps, math.inf)


def test_geometric_matches_discrete_laplace_pmf():
    # χ² against P(y) ∝ exp(−ε|y|/Δ) at α = 1e-6.
    mech = Geometric(epsilon=0.5, sensitivity=1)
    y = mech.release(np.zeros(N, dtype=np.int64), rng=np.random.default_rng(SEED))
    assert y.dtype == np.int64
    support = np.arange(-80, 81)
    assert chi2_pvalue(y, support, dlap_pmf(2.0, support)) > ALPHA
    # Mean |Y| for the discrete Laplace: 2ρ/(1 − ρ²); sd(|Y|) <= sqrt(E Y²) = sqrt(2ρ)/(1 − ρ).
    rho = math.exp(-0.5)
    mean_abs = 2 * rho / (1 - rho**2)
    assert abs(np.abs(y).mean() - mean_abs) <= 6 * math.sqrt(2 * rho) / (1 - rho) / math.sqrt(N)


def test_geometric_types_and_shapes():
    mech = Geometric(epsilon=1.0)
    rng = np.random.default_rng(SEED)
    for scalar in (5, np.int64(5), 5.0, np.array(5), np.uint8(5)):
        out = mech.release(scalar, rng=rng)
        assert type(out) is int
    out = mech.release([1, 2, 3], rng=rng)
    assert isinstance(out, np.ndarray) and out.dtype == np.int64 and out.shape == (3,)
    out = mech.release(np.zeros((4, 5), dtype=np.int32), rng=rng)
    assert out.dtype == np.int64 and out.shape == (4, 5)
    out = mech.release(np.array([1.0, -2.0, 3.0]), rng=rng)  # integer-valued floats are integers
    assert out.dtype == np.int64


@pytest.fixture(scope="module")
def geometric_sample():
    mech = Geometric(epsilon=0.1, sensitivity=1)  # ρ = e^-0.1: consecutive tails differ by 10%
    x = np.full(N, 17, dtype=np.int64)
    return mech, x, mech.release(x, rng=np.random.default_rng(SEED + 3))


def _smallest_tail_steps(scale: Fraction, beta: float) -> int:
    """Smallest m >= 1 with P(|Y| >= m) = 2ρ^m/(1 + ρ) <= β, in 200-bit arithmetic."""
    rho = mpmath.exp(-mpmath.mpf(scale.denominator) / scale.numerator)
    m = 1
    while 2 * rho**m / (1 + rho) > beta:
        m += 1
    return m


@pytest.mark.parametrize("beta", [0.05, 0.01, 1e-3])
def test_geometric_error_bound_is_exact_and_holds(geometric_sample, beta):
    # Exceedances ~ Binomial(n, p), p <= β and p > ρβ ≈ 0.9β: 5σ one-sided (≈ 3e-7) above, and
    # p >= β/2 below (≥ 20σ margin).
    mech, x, y = geometric_sample
    m = mech.error_bound(beta)
    assert isinstance(m, int)
    assert m == _smallest_tail_steps(Fraction(10), beta)
    exceed = int(np.sum(np.abs(y - x) >= m))
    se = math.sqrt(N * beta * (1 - beta))
    assert exceed <= N * beta + 5 * se
    assert exceed >= N * beta / 2


@pytest.mark.parametrize("eps", [0.05, 1.0])
def test_geometric_confidence_interval_covers(eps):
    # Coverage ≥ 95% by construction; ≥ 94% of 20,000 fails w.p. < 1e-10.
    rng = np.random.default_rng(SEED + 4)
    mech = Geometric(epsilon=eps)
    n = 20_000
    truth = rng.integers(-1000, 1000, size=n)
    released = mech.release(truth, rng=rng)
    low, high = mech.confidence_interval(released, 0.95)
    assert low.dtype == np.int64 and high.dtype == np.int64
    covered = int(np.sum((low <= truth) & (truth <= high)))
    assert covered >= 0.94 * n
    lo, hi = mech.confidence_interval(int(released[0]), 0.95)
    assert type(lo) is int and type(hi) is int
    assert hi - lo == 2 * (mech.error_bound(0.05) - 1)


def test_geometric_rng_none_is_secure_and_fresh():
    mech = Geometric(epsilon=1.0)
    a, b = mech.release(np.zeros(200, dtype=np.int64)), mech.release(np.zeros(200, dtype=np.int64))
    assert a.dtype == np.int64
    # Each lane agrees with probability Σ P(y)² < 0.5; all 200 with probability < 2^-200.
    assert not np.array_equal(a, b)


# ------------------------------------------------------------------------------------------------
# Bad input: the right error class, naming the parameter; nothing is sampled
# ------------------------------------------------------------------------------------------------

BAD_EPSILON = [0, 0.0, -1.0, float("nan"), float("inf"), -float("inf"), "1.0", True, None, 1j]


@pytest.mark.parametrize("cls", [Laplace, Geometric])
@pytest.mark.parametrize("eps", BAD_EPSILON)
def test_bad_epsilon(cls, eps):
    with pytest.raises(InvalidParameterError) as info:
        cls(epsilon=eps)
    assert info.value.name == "epsilon"
    assert "epsilon" in str(info.value)


@pytest.mark.parametrize("sens", [0, 0.0, -1.0, float("nan"), float("inf"), "1", True, None])
def test_laplace_bad_sensitivity(sens):
    with pytest.raises(InvalidParameterError) as info:
        Laplace(epsilon=1.0, sensitivity=sens)
    assert info.value.name == "sensitivity"
    assert "sensitivity" in str(info.value)


@pytest.mark.parametrize("sens", [0, -1, 1.5, 2.0, float("nan"), "1", True])
def test_geometric_sensitivity_must_be_a_positive_integer(sens):
    with pytest.raises(InvalidParameterError) as info:
        Geometric(epsilon=1.0, sensitivity=sens)
    assert info.value.name == "sensitivity"
    assert "sensitivity" in str(info.value)


@pytest.mark.parametrize("eps", [1e-20, 2.0**21])
def test_geometric_epsilon_giving_unsamplable_scale(eps):
    with pytest.raises(InvalidParameterError) as info:
        Geometric(epsilon=eps)
    assert info.value.name == "epsilon"
    assert "scale" in str(info.value)


@pytest.mark.parametrize("cls", [Laplace, Geometric])
@pytest.mark.parametrize("nb", ["add-remove", "bounded", "ADD_REMOVE", "", None, 1])
def test_bad_neighbours(cls, nb):
    with pytest.raises(InvalidParameterError) as info:
        cls(epsilon=1.0, neighbours=nb)
    assert info.value.name == "neighbours"
    assert "add_remove" in str(info.value) and "replace" in str(info.value)


# Only public facts (type, dtype, emptiness) may raise; NaN and ±inf are values, clamped below.
BAD_VALUES = [
    ("strings", ["a", "b"], "dtype"),
    ("string scalar", "3.0", "dtype"),
    ("empty", [], "empty"),
    ("empty 2-D", np.zeros((0, 3)), "empty"),
    ("object dtype", np.array([1.0, 2.0], dtype=object), "dtype"),
    ("bools", np.array([True, False]), "dtype"),
    ("ragged", [[1.0, 2.0], [3.0]], "array"),
    ("complex", np.array([1 + 2j]), "dtype"),
]


@pytest.mark.parametrize("case, value, words", BAD_VALUES, ids=[c[0] for c in BAD_VALUES])
def test_laplace_bad_value_raises_and_draws_nothing(spy_lattice_laplace, case, value, words):
    src = CountingSource(SEED)
    with pytest.raises(InvalidDataError) as info:
        Laplace(epsilon=1.0).release(value, rng=src)
    assert info.value.name == "value"
    assert str(info.value).startswith("value")
    assert words in str(info.value)
    assert src.calls == 0 and spy_lattice_laplace == []


def test_laplace_clamps_values_beyond_the_lattice_limit():
    # Used to raise InvalidDataError (a value-dependent exception). Now: NaN → 0, ±inf and values
    # beyond M = value_limit(lattice) are clamped to ±M, and the release equals that of the
    # clamped input drawn with the same randomness.
    mech = Laplace(epsilon=1.0)
    plan = mech.noise_plan(4)
    m = lattice_module.value_limit(plan.lattice)
    assert m == 2.0 ** (1000 + plan.lattice.exponent)  # g·2^1000 for this scale (g < 1)
    got = mech.release([0.0, 1e300, float("inf"), float("nan")], rng=np.random.default_rng(SEED))
    want = mech.release([0.0, m, m, 0.0], rng=np.random.default_rng(SEED))
    np.testing.assert_array_equal(got, want)
    assert np.all(np.isfinite(got))
    m2 = lattice_module.value_limit(mech.noise_plan(2).lattice)  # the lattice depends on the size
    neg = mech.release([-1e300, -float("inf")], rng=np.random.default_rng(SEED))
    np.testing.assert_array_equal(neg, mech.release([-m2, -m2], rng=np.random.default_rng(SEED)))


def test_geometric_rounds_and_clamps_values():
    # Used to raise on non-integers, NaN, ±inf and |x| > 2^62. Now: NaN → 0, clamp to ±2^62,
    # round half to even; the release equals that of the normalised integers, same randomness.
    mech = Geometric(epsilon=1.0)
    values = [0.5, 2.5, 1.0000001, 1e30, -float("inf"), float("nan"), 7]
    ints = np.array([0, 2, 1, 2**62, -(2**62), 0, 7], dtype=np.int64)
    got = mech.release(values, rng=np.random.default_rng(SEED))
    want = mech.release(ints, rng=np.random.default_rng(SEED))
    assert got.dtype == np.int64
    np.testing.assert_array_equal(got, want)
    big = np.array([2**64 - 1], dtype=np.uint64)
    np.testing.assert_array_equal(
        mech.release(big, rng=np.random.default_rng(SEED)),
        mech.release(np.array([2**62]), rng=np.random.default_rng(SEED)),
    )


@pytest.mark.parametrize("mech", [Laplace(epsilon=1.0), Geometric(epsilon=1.0)], ids=["laplace", "geometric"])
@pytest.mark.parametrize("beta", [0, 0.0, 1.0, 1.5, -0.1, float("nan"), "0.05", True])
def test_bad_beta(mech, beta):
    with pytest.raises(InvalidParameterError) as info:
        mech.error_bound(beta)
    assert info.value.name == "beta"
    assert "beta" in str(info.value)


@pytest.mark.parametrize("mech", [Laplace(epsilon=1.0), Geometric(epsilon=1.0)], ids=["laplace", "geometric"])
@pytest.mark.parametrize("confidence", [0, 1, 1.0, 95, -0.5, float("nan"), "0.95"])
def test_bad_confidence(mech, confidence):
    with pytest.raises(InvalidParameterError) as info:
        mech.confidence_interval(3, confidence)
    assert info.value.name == "confidence"
    assert "confidence" in str(info.value)


@pytest.mark.parametrize("mech", [Laplace(epsilon=1.0), Geometric(epsilon=1.0)], ids=["laplace", "geometric"])
@pytest.mark.parametrize("released", [float("nan"), [], ["x"]])
def test_bad_released_value_in_confidence_interval(mech, released):
    with pytest.raises(InvalidDataError) as info:
        mech.confidence_interval(released, 0.95)
    assert info.value.name == "released"


def test_mechanisms_are_frozen():
    for mech in (Laplace(epsilon=1.0), Geometric(epsilon=1.0)):
        with pytest.raises(dataclasses.FrozenInstanceError):
            mech.epsilon = 2.0  # type: ignore[misc]


@pytest.mark.parametrize("cls", [Laplace, Geometric])
def test_constructor_is_keyword_only(cls):
    with pytest.raises(TypeError):
        cls(1.0, 1)  # type: ignore[misc]
