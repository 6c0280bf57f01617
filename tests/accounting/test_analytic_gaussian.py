"""Tests for dpkit.accounting.analytic_gaussian: the exact Gaussian (ε, δ) curve and σ calibration.

Every number is checked against references computed here, independently of dpkit: the
Balle & Wang (2018, Thm 8) formula transcribed with scipy.stats.norm, and the same formula at
60 significant digits with mpmath (which also gives the exact calibrated σ by bisection).
"""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest
from scipy import stats

from dpkit.accounting.analytic_gaussian import analytic_gaussian_sigma, classic_gaussian_sigma, gaussian_delta
from dpkit.errors import InvalidParameterError

MP_PREC = 210  # 60 decimal digits


def delta_scipy(eps: float, sigma: float, sens: float = 1.0) -> float:
    """Balle & Wang (2018), Thm 8: δ = Φ(Δ/2σ − εσ/Δ) − e^ε·Φ(−Δ/2σ − εσ/Δ)."""
    return float(
        stats.norm.cdf(sens / (2 * sigma) - eps * sigma / sens)
        - math.exp(eps) * stats.norm.cdf(-sens / (2 * sigma) - eps * sigma / sens)
    )


def delta_mp(eps: float, m: float) -> mpmath.mpf:
    """The same curve at 60 digits, for noise multiplier m = σ/Δ."""
    e, m = mpmath.mpf(eps), mpmath.mpf(m)
    return mpmath.ncdf(1 / (2 * m) - e * m) - mpmath.exp(e) * mpmath.ncdf(-1 / (2 * m) - e * m)


def sigma_mp(eps: float, delta: float) -> mpmath.mpf:
    """The smallest m with δ(ε, m) <= δ, by 200 bisection steps at 60 digits."""
    lo, hi = mpmath.mpf("1e-6"), mpmath.mpf(1)
    while delta_mp(eps, hi) > delta:
        hi *= 2
    for _ in range(200):
        mid = (lo + hi) / 2
        if delta_mp(eps, mid) <= delta:
            hi = mid
        else:
            lo = mid
    return hi


# ------------------------------------------------------------------------------------------------
# the curve
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("eps", [0.01, 0.1, 0.5, 1.0, 2.0, 5.0, 10.0])
@pytest.mark.parametrize("m", [0.3, 1.0, 3.0, 10.0, 30.0, 300.0])
def test_gaussian_delta_matches_high_precision_reference(eps, m):
    ref = delta_mp(eps, m)
    got = gaussian_delta(eps, m)
    assert 0.0 <= got < 1.0
    if ref > 1e-12:
        assert got == pytest.approx(float(ref), rel=1e-9)
    else:
        assert got <= 1e-12 + 1e-18


@pytest.mark.parametrize("eps, sigma", [(0.5, 5.0), (1.0, 1.0), (1.0, 4.0), (2.0, 2.0), (0.1, 20.0), (5.0, 0.8)])
def test_gaussian_delta_matches_scipy_transcription(eps, sigma):
    assert gaussian_delta(eps, sigma) == pytest.approx(delta_scipy(eps, sigma), rel=1e-9)


def test_gaussian_delta_limits_and_monotonicity():
    ms = np.geomspace(0.05, 200, 60)
    for eps in (0.1, 1.0, 4.0):
        ds = [gaussian_delta(eps, float(m)) for m in ms]
        assert all(a >= b for a, b in zip(ds, ds[1:], strict=False))  # more noise, smaller δ
        assert ds[0] > 0.9 and ds[-1] < 1e-12
    # More ε at the same noise, smaller δ.
    assert gaussian_delta(0.5, 3.0) > gaussian_delta(1.0, 3.0) > gaussian_delta(2.0, 3.0)


def test_gaussian_delta_does_not_overflow_for_large_epsilon():
    # e^800 overflows a double; the curve is evaluated as exp(ε + log Φ(b)) and stays in [0, 1].
    d = gaussian_delta(800.0, 0.01)
    assert math.isfinite(d) and 0.0 <= d <= 1.0
    assert gaussian_delta(1e3, 1.0) == 0.0


# ------------------------------------------------------------------------------------------------
# analytic calibration
# ------------------------------------------------------------------------------------------------

GRID = [(eps, delta) for eps in (0.01, 0.1, 0.5, 1.0, 2.0, 5.0, 10.0) for delta in (1e-3, 1e-5, 1e-10)]


@pytest.mark.parametrize("eps, delta", GRID)
def test_analytic_sigma_meets_delta_and_is_tight(eps, delta):
    sigma = analytic_gaussian_sigma(eps, delta, 1.0)
    assert gaussian_delta(eps, sigma) <= delta
    assert gaussian_delta(eps, sigma * (1 - 1e-9)) > delta
    assert sigma == pytest.approx(float(sigma_mp(eps, delta)), rel=1e-10)


@pytest.mark.parametrize("eps, delta", [(1.0, 1e-5), (0.5, 1e-10), (5.0, 1e-5), (2.0, 1e-3), (0.1, 1e-5)])
def test_analytic_sigma_meets_delta_in_exact_arithmetic(eps, delta):
    sigma = analytic_gaussian_sigma(eps, delta, 1.0)
    assert delta_mp(eps, sigma) <= delta


def test_analytic_sigma_meets_delta_in_exact_arithmetic_small_epsilon():
    sigma = analytic_gaussian_sigma(0.01, 1e-5, 1.0)
    assert delta_mp(0.01, sigma) <= 1e-5


@pytest.mark.parametrize(
    "eps, delta, sens",
    [(0.001, 1e-3, 1.0), (1.0, 1.7269832906594343e-04, 1.0), (0.01, 1e-5, 0.1), (1e-4, 1e-4, 1.0)],
)
def test_analytic_sigma_never_raises_arithmetic_error(eps, delta, sens):
    sigma = analytic_gaussian_sigma(eps, delta, sens)
    assert gaussian_delta(eps, sigma / sens) <= delta


@pytest.mark.parametrize("eps", [5.0, 0.01])
def test_analytic_sigma_extreme_epsilons(eps):
    sigma = analytic_gaussian_sigma(eps, 1e-5, 1.0)
    assert math.isfinite(sigma) and sigma > 0
    assert gaussian_delta(eps, sigma) <= 1e-5 < gaussian_delta(eps, sigma * (1 - 1e-9))


@pytest.mark.parametrize("sens", [3.0, 7.7, 1e-3, 250.0])
def test_analytic_sigma_scales_with_sensitivity(sens):
    unit = analytic_gaussian_sigma(1.0, 1e-6, 1.0)
    assert analytic_gaussian_sigma(1.0, 1e-6, sens) == pytest.approx(unit * sens, rel=1e-12)


def test_analytic_sigma_is_monotone():
    assert (
        analytic_gaussian_sigma(0.5, 1e-6, 1.0)
        > analytic_gaussian_sigma(1.0, 1e-6, 1.0)
        > analytic_gaussian_sigma(2.0, 1e-6, 1.0)
    )
    assert (
        analytic_gaussian_sigma(1.0, 1e-9, 1.0)
        > analytic_gaussian_sigma(1.0, 1e-6, 1.0)
        > analytic_gaussian_sigma(1.0, 1e-3, 1.0)
    )


@pytest.mark.parametrize("eps", [0.01, 0.1, 0.5, 0.9, 0.999])
@pytest.mark.parametrize("delta", [1e-3, 1e-5, 1e-10])
def test_analytic_needs_less_noise_than_classic(eps, delta):
    assert analytic_gaussian_sigma(eps, delta, 1.0) < classic_gaussian_sigma(eps, delta, 1.0)


# ------------------------------------------------------------------------------------------------
# classic calibration
# ------------------------------------------------------------------------------------------------


def test_classic_formula_value():
    # Dwork & Roth (2014), Thm 3.22: σ = Δ·√(2 ln(1.25/δ))/ε; ε = 0.5, δ = 1e-5, Δ = 1.
    sigma = classic_gaussian_sigma(0.5, 1e-5, 1.0)
    hand = math.sqrt(2 * math.log(1.25e5)) / 0.5
    assert sigma == pytest.approx(hand, rel=4e-16)
    exact = mpmath.sqrt(2 * mpmath.log(mpmath.mpf(1.25) / mpmath.mpf(1e-5))) / mpmath.mpf(0.5)
    assert sigma >= exact  # rounded up, never down
    assert sigma <= math.nextafter(math.nextafter(hand, math.inf), math.inf)
    assert classic_gaussian_sigma(0.5, 1e-5, 4.0) == pytest.approx(4 * hand, rel=1e-15)


@pytest.mark.parametrize("eps, delta", [(0.1, 1e-5), (0.5, 1e-3), (0.9, 1e-8)])
def test_classic_sigma_is_private(eps, delta):
    # The classic σ over-covers: the exact curve at it is below δ.
    assert gaussian_delta(eps, classic_gaussian_sigma(eps, delta, 1.0)) <= delta


@pytest.mark.parametrize("eps", [1, 1.0, 1.5, 10.0])
def test_classic_refuses_epsilon_at_least_one(eps):
    with pytest.raises(InvalidParameterError) as info:
        classic_gaussian_sigma(eps, 1e-5, 1.0)
    assert info.value.name == "epsilon"
    msg = str(info.value)
    assert "(0, 1)" in msg
    assert "ε < 1" in msg and "Thm 3.22" in msg
    assert "calibration='analytic'" in msg


# ------------------------------------------------------------------------------------------------
# bad input
# ------------------------------------------------------------------------------------------------

FUNCS = {"analytic": analytic_gaussian_sigma, "classic": classic_gaussian_sigma}


@pytest.mark.parametrize("func", FUNCS)
@pytest.mark.parametrize("eps", [0, -0.5, float("nan"), float("inf"), "0.5", True, None])
def test_bad_epsilon(func, eps):
    with pytest.raises(InvalidParameterError) as info:
        FUNCS[func](eps, 1e-5, 1.0)
    assert info.value.name == "epsilon"
    assert "epsilon" in str(info.value)


@pytest.mark.parametrize("func", FUNCS)
@pytest.mark.parametrize("delta", [0, 0.0, -1e-5, 1.0, 2.0, float("nan"), float("inf"), "1e-5", True])
def test_bad_delta(func, delta):
    with pytest.raises(InvalidParameterError) as info:
        FUNCS[func](0.5, delta, 1.0)
    assert info.value.name == "delta"
    assert "(0, 1)" in str(info.value)


@pytest.mark.parametrize("func", FUNCS)
@pytest.mark.parametrize("sens", [0, -1.0, float("nan"), float("inf"), "1"])
def test_bad_sensitivity(func, sens):
    with pytest.raises(InvalidParameterError) as info:
        FUNCS[func](0.5, 1e-5, sens)
    assert info.value.name == "sensitivity"
    assert "sensitivity" in str(info.value)
