"""Tests for dpkit.accounting.zcdp: ρ per event, exact composition, conversions, errors.

References: hand-computed values (Bun & Steinke 2016 Prop 1.3), a brute-force minimisation of
the Canonne–Kamath–Steinke 2020 Prop 12 bound over a dense grid of orders at 30 digits (mpmath),
and the RDP accountant on the same curve.
"""

from __future__ import annotations

import math
import warnings
from fractions import Fraction

import mpmath
import numpy as np
import pytest

from dpkit.accounting.accountant import Accountant
from dpkit.accounting.events import (
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
)
from dpkit.accounting.rdp import RDPAccountant
from dpkit.accounting.zcdp import (
    ZCDPAccountant,
    event_rho,
    rho_from_bounded_range,
    rho_from_gaussian,
    rho_from_pure,
    zcdp_to_approx_dp,
    zcdp_to_delta,
)
from dpkit.errors import InvalidParameterError


def _minimise(f_np, f_mp) -> mpmath.mpf:
    """The infimum over t = ln(α − 1) in [−25, 30]: a dense double-precision grid finds the basin,
    then 200 golden-section steps at 40 digits refine it."""
    t = np.linspace(-25, 30, 20001)
    with np.errstate(over="ignore", invalid="ignore"):
        vals = f_np(np.exp(t))
    i = int(np.nanargmin(vals))
    with mpmath.workdps(40):
        lo, hi = mpmath.mpf(float(t[max(i - 1, 0)])), mpmath.mpf(float(t[min(i + 1, t.size - 1)]))
        g = (mpmath.sqrt(5) - 1) / 2
        for _ in range(200):
            a, b = hi - g * (hi - lo), lo + g * (hi - lo)
            if f_mp(mpmath.e**a) < f_mp(mpmath.e**b):
                hi = b
            else:
                lo = a
        return f_mp(mpmath.e ** ((lo + hi) / 2))


def cks_eps_inf(rho: float, delta: float) -> float:
    """inf over α > 1 of αρ + [ln(1/δ) + (α−1) ln(1 − 1/α) − ln α]/(α − 1) (CKS 2020, Prop 12)."""
    L = math.log(1 / delta)
    f_np = lambda a1: (1 + a1) * rho + (L + a1 * (np.log(a1) - np.log1p(a1)) - np.log1p(a1)) / a1  # noqa: E731
    r, Lm = mpmath.mpf(rho), mpmath.log(1 / mpmath.mpf(delta))
    f_mp = lambda a1: (1 + a1) * r + (Lm + a1 * mpmath.log(a1 / (1 + a1)) - mpmath.log(1 + a1)) / a1  # noqa: E731
    return float(_minimise(f_np, f_mp))


def cks_delta_inf(rho: float, eps: float) -> float:
    """inf over α > 1 of exp((α−1)(αρ − ε + ln(1 − 1/α)) − ln α)."""
    f_np = lambda a1: a1 * ((1 + a1) * rho - eps + np.log(a1) - np.log1p(a1)) - np.log1p(a1)  # noqa: E731
    r, e = mpmath.mpf(rho), mpmath.mpf(eps)
    f_mp = lambda a1: a1 * ((1 + a1) * r - e + mpmath.log(a1 / (1 + a1))) - mpmath.log(1 + a1)  # noqa: E731
    with mpmath.workdps(40):
        return float(mpmath.e ** _minimise(f_np, f_mp))


# --------------------------------------------------------------------------------------------
# ρ of single mechanisms
# --------------------------------------------------------------------------------------------


def test_rho_helpers():
    assert rho_from_gaussian(1.0) == 0.5
    assert rho_from_gaussian(2.0) == 0.125
    assert rho_from_gaussian(1.1) >= 1 / (2 * 1.1**2)
    assert rho_from_gaussian(1.1) == pytest.approx(1 / (2 * 1.1**2), rel=1e-15)
    assert rho_from_pure(1.0) == 0.5
    assert rho_from_pure(0.1) >= 0.1**2 / 2 and rho_from_pure(0.1) == pytest.approx(0.005, rel=1e-15)
    assert rho_from_pure(2.0) == 2.0  # ε²/2 = ε at ε = 2
    assert rho_from_pure(4.0) == 4.0  # beyond 2, ρ = ε (D_α <= ε <= εα) is the smaller
    assert rho_from_bounded_range(1.0) == 0.125
    assert rho_from_bounded_range(16.0) == 16.0


@pytest.mark.parametrize(
    ("event", "rho"),
    [
        (GaussianEvent(2.0), Fraction(1, 8)),
        (PureDPEvent(0.5), Fraction(1, 8)),
        (ApproxDPEvent(0.5, 0.0), Fraction(1, 8)),
        (LaplaceEvent(2.0), Fraction(1, 8)),  # ε = 1/b = 0.5
        (LaplaceEvent.for_epsilon(0.5), Fraction(1, 8)),
        (ExponentialEvent(1.0), Fraction(1, 8)),
        (SelfComposedEvent(GaussianEvent(2.0), 8), Fraction(1)),
        (ComposedEvent((GaussianEvent(2.0), PureDPEvent(0.5), ExponentialEvent(1.0))), Fraction(3, 8)),
        (ComposedEvent(()), Fraction(0)),
    ],
)
def test_event_rho(event, rho):
    assert event_rho(event) == float(rho)


def test_randomized_response_rho_is_pure():
    ev = RandomizedResponseEvent(0.75)  # ε = ln 3
    assert event_rho(ev) == pytest.approx(math.log(3) ** 2 / 2, rel=1e-14)
    assert event_rho(ev) >= math.log(3) ** 2 / 2
    # p below 1/k is just as private as its mirror image
    assert event_rho(RandomizedResponseEvent(0.25)) == event_rho(RandomizedResponseEvent(0.75))
    assert event_rho(RandomizedResponseEvent(0.5)) == 0.0


# --------------------------------------------------------------------------------------------
# Composition
# --------------------------------------------------------------------------------------------


def test_composition_is_exact_addition():
    acc = ZCDPAccountant()
    assert isinstance(acc, Accountant)
    assert acc.compose(GaussianEvent(1.1)) is acc
    acc.compose(GaussianEvent(1.1), count=2)
    assert acc.rho == pytest.approx(3 / (2 * 1.1**2), rel=1e-15)
    assert Fraction(acc.rho) >= 3 / (2 * Fraction(1.1) ** 2)  # rounded up once, from exact
    acc2 = ZCDPAccountant().compose(
        ComposedEvent((PureDPEvent(1.0), GaussianEvent(1.0), ExponentialEvent(2.0))), count=10
    )
    assert acc2.rho == 10 * (0.5 + 0.5 + 0.5)


# --------------------------------------------------------------------------------------------
# Conversions
# --------------------------------------------------------------------------------------------


def test_classic_conversion_hand_value():
    # ρ = 0.5, δ = 1e-5: ε = 0.5 + 2√(0.5 · ln 1e5) = 0.5 + 2√5.756462732485115 = 5.298525912188081
    hand = 5.298525912188081
    ours = zcdp_to_approx_dp(0.5, 1e-5, conversion="classic")
    assert hand <= ours <= hand * (1 + 1e-14)
    acc = ZCDPAccountant().compose(GaussianEvent(1.0))
    assert acc.get_epsilon(1e-5, conversion="classic") == ours


@pytest.mark.parametrize("rho", [1e-8, 1e-3, 0.1, 0.5, 3.0, 100.0, 1e5])
@pytest.mark.parametrize("delta", [1e-3, 1e-6, 1e-12])
def test_improved_conversion(rho, delta):
    improved = zcdp_to_approx_dp(rho, delta)
    classic = zcdp_to_approx_dp(rho, delta, conversion="classic")
    assert 0 <= improved <= classic
    if improved > 0:
        best = cks_eps_inf(rho, delta)
        assert improved >= best  # never below the true infimum (rounded up)
        assert improved <= best * (1 + 1e-9)
        # the RDP accountant on the same curve (discrete orders) can only be looser
        rdp = RDPAccountant(orders=np.exp(np.linspace(-6, 12, 400)) + 1)
        rdp.compose(GaussianEvent(1 / math.sqrt(2 * rho)))
        assert improved <= rdp.get_epsilon(delta) * (1 + 1e-9)
        assert improved == pytest.approx(rdp.get_epsilon(delta), rel=1e-3)


@pytest.mark.parametrize("rho", [1e-3, 0.5, 3.0, 100.0])
@pytest.mark.parametrize("eps", [0.1, 1.0, 10.0, 300.0])
def test_delta_conversion(rho, eps):
    improved = zcdp_to_delta(rho, eps)
    classic = zcdp_to_delta(rho, eps, conversion="classic")
    assert 0 <= improved <= classic <= 1
    if eps > rho:
        assert classic == pytest.approx(math.exp(-((eps - rho) ** 2) / (4 * rho)), rel=1e-12)
    best = min(cks_delta_inf(rho, eps), 1.0, math.sqrt(-math.expm1(-rho)))
    assert improved >= best
    assert improved <= best * (1 + 1e-9) or improved == pytest.approx(best, abs=1e-300)


def test_round_trip():
    for rho in (0.01, 0.5, 10.0):
        for delta in (1e-3, 1e-8):
            eps = zcdp_to_approx_dp(rho, delta)
            assert zcdp_to_delta(rho, eps) <= delta * (1 + 1e-9)


def test_trivial_and_limit_cases():
    assert zcdp_to_approx_dp(0.0, 1e-5) == 0.0
    assert zcdp_to_approx_dp(0.0, 0.0) == 0.0
    assert zcdp_to_approx_dp(0.5, 0.0) == math.inf  # ρ-zCDP never implies pure DP
    assert zcdp_to_delta(0.0, 1.0) == 0.0
    assert zcdp_to_approx_dp(1e-14, 1e-3) == 0.0  # KL <= ρ: total variation below δ
    acc = ZCDPAccountant()
    assert acc.get_epsilon(1e-5) == 0.0 and acc.get_delta(1.0) == 0.0
    assert acc.compose(GaussianEvent(0.01)).get_delta(1.0) == 1.0


def test_extreme_values_are_quiet_and_finite():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with np.errstate(over="raise", invalid="raise", divide="raise"):
            acc = ZCDPAccountant().compose(GaussianEvent(0.3), count=1_000_000)
            for delta in (1e-18, 1e-300, 0.5):
                eps = acc.get_epsilon(delta)
                assert math.isfinite(eps) and eps >= acc.rho * 0.999
            assert 0 <= acc.get_delta(1e-3) <= 1
            tiny = ZCDPAccountant().compose(GaussianEvent(1e7))
            assert math.isfinite(tiny.get_epsilon(1e-18))
            assert 0 <= tiny.get_delta(1e-9) <= 1


# --------------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------------


def test_unsupported_events_record_nothing():
    acc = ZCDPAccountant().compose(GaussianEvent(2.0))
    before = acc.rho
    for ev in (
        ApproxDPEvent(1.0, 1e-6),
        PoissonSampledEvent(0.1, GaussianEvent(1.0)),
        SampledWithoutReplacementEvent(100, 10, GaussianEvent(1.0)),
        ComposedEvent((GaussianEvent(1.0), ApproxDPEvent(1.0, 1e-6))),
        SelfComposedEvent(PoissonSampledEvent(0.1, GaussianEvent(1.0)), 5),
    ):
        assert not acc.supports(ev)
        with pytest.raises(InvalidParameterError) as info:
            acc.compose(ev)
        assert info.value.name == "event"
        assert acc.rho == before


def test_neighbours():
    add, rep = ZCDPAccountant(), ZCDPAccountant(neighbours="replace")
    rr = RandomizedResponseEvent(0.75)
    assert not add.supports(rr) and rep.supports(rr)
    with pytest.raises(InvalidParameterError, match="neighbours"):
        add.compose(rr)
    with pytest.raises(InvalidParameterError, match="neighbours"):
        rep.compose(GaussianEvent(1.0))
    with pytest.raises(InvalidParameterError, match="neighbours"):
        add.compose(SelfComposedEvent(ComposedEvent((GaussianEvent(1.0, neighbours="replace"),)), 2))
    assert add.rho == 0.0
    rep.compose(rr).compose(GaussianEvent(1.0, neighbours="replace"))
    assert rep.rho > 0.5
    with pytest.raises(InvalidParameterError):
        ZCDPAccountant(neighbours="bogus")
    with pytest.raises(InvalidParameterError):
        rep.compose(RandomizedResponseEvent(1.0, neighbours="replace"))  # p = 1: no finite ρ


def test_bad_arguments():
    acc = ZCDPAccountant().compose(GaussianEvent(1.0))
    for delta in (-1e-9, 1.0, math.nan, math.inf):
        with pytest.raises(InvalidParameterError):
            acc.get_epsilon(delta)
        with pytest.raises(InvalidParameterError):
            zcdp_to_approx_dp(0.5, delta)
    for eps in (-1.0, math.nan):  # ε = 0 is valid: see tests/accounting/test_accountant.py
        with pytest.raises(InvalidParameterError):
            acc.get_delta(eps)
    for count in (0, -3, 2.0, True):
        with pytest.raises(InvalidParameterError):
            acc.compose(GaussianEvent(1.0), count=count)
    for rho in (-0.1, math.nan, math.inf, "1", True):
        with pytest.raises(InvalidParameterError):
            zcdp_to_approx_dp(rho, 1e-5)
    with pytest.raises(InvalidParameterError):
        acc.get_epsilon(1e-5, conversion="tight")
    with pytest.raises(InvalidParameterError):
        zcdp_to_delta(0.5, 1.0, conversion=None)
    for bad in (0.0, -1.0, math.nan):
        with pytest.raises(InvalidParameterError):
            rho_from_gaussian(bad)
        with pytest.raises(InvalidParameterError):
            rho_from_pure(bad)
    assert acc.rho == 0.5
