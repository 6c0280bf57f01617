"""Tests for dpkit.accounting.rdp: per-mechanism RDP curves, composition, conversions, errors.

References are independent of dpkit: Google's dp_accounting 0.6.0 (a test-only dependency; the
same orders are handed to both), direct numerical integration (scipy.integrate.quad, and mpmath
at 30 digits for the subsampled Gaussian), exact finite sums and hand-computed values.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from fractions import Fraction

import mpmath
import numpy as np
import pytest
from scipy import integrate

from dpkit.accounting.accountant import Accountant
from dpkit.accounting.events import (
    ApproxDPEvent,
    ComposedEvent,
    DPEvent,
    ExponentialEvent,
    GaussianEvent,
    LaplaceEvent,
    PoissonSampledEvent,
    PureDPEvent,
    RandomizedResponseEvent,
    SampledWithoutReplacementEvent,
    SelfComposedEvent,
)
from dpkit.accounting.rdp import (
    DEFAULT_RDP_ORDERS,
    RDPAccountant,
    event_rdp,
    gaussian_rdp,
    laplace_rdp,
    poisson_subsampled_gaussian_rdp,
    pure_dp_rdp,
    randomized_response_rdp,
    rdp_to_delta,
    rdp_to_epsilon,
    register_rdp,
    sampled_without_replacement_gaussian_rdp,
)
from dpkit.accounting.rdp import accountant as rdp_accountant
from dpkit.accounting.rdp import curves as rdp_curves
from dpkit.errors import InvalidParameterError

dp_accounting = pytest.importorskip("dp_accounting")
from dp_accounting import dp_event as de  # noqa: E402
from dp_accounting.rdp import rdp_privacy_accountant as ra  # noqa: E402

ORDERS = DEFAULT_RDP_ORDERS
A = np.asarray(ORDERS)


# --------------------------------------------------------------------------------------------
# Cross-check with dp_accounting 0.6.0 (Poisson-subsampled Gaussian, the DP-SGD workhorse)
# --------------------------------------------------------------------------------------------

GRID_Q = (0.001, 0.004, 0.01, 0.1)
GRID_SIGMA = (0.6, 1.1, 2.0)
GRID_STEPS = (100, 1000, 10000)


@pytest.fixture(scope="module")
def reference_rdp() -> dict[tuple[float, float], np.ndarray]:
    """dp_accounting's RDP per (q, σ) for one step, computed once (steps only multiply)."""
    out = {}
    for q in GRID_Q:
        for s in GRID_SIGMA:
            acc = ra.RdpAccountant(list(ORDERS))
            acc.compose(de.PoissonSampledDpEvent(q, de.GaussianDpEvent(s)))
            out[(q, s)] = acc.rdp
    return out


@pytest.mark.parametrize("q", GRID_Q)
@pytest.mark.parametrize("sigma", GRID_SIGMA)
def test_poisson_gaussian_matches_dp_accounting(reference_rdp, q, sigma):
    theirs = reference_rdp[(q, sigma)]
    ours = poisson_subsampled_gaussian_rdp(q, sigma, ORDERS)
    # dp_accounting returns ∞ (drops the order) where its fractional series does not converge in
    # 1,000 terms (q = 0.1, σ <= 1.1, α near 1); dpkit gives a finite upper bound there.
    ok = np.isfinite(theirs)
    assert ok.sum() >= len(ORDERS) - 15
    assert np.all(np.isfinite(ours))
    np.testing.assert_allclose(ours[ok], theirs[ok], rtol=1e-6, atol=0)
    for steps in GRID_STEPS:
        acc = RDPAccountant(ORDERS).compose(SelfComposedEvent(PoissonSampledEvent(q, GaussianEvent(sigma)), steps))
        np.testing.assert_allclose(acc.rdp[ok], steps * theirs[ok], rtol=1e-6, atol=0)
        # dp_accounting 0.6.0 converts with CKS 2020 Prop 12 (plus the KL shortcut): compare like
        # with like on the orders both have.
        eps_theirs, order_theirs = ra.compute_epsilon(list(ORDERS), steps * theirs, 1e-5)
        eps_ours, order_ours = rdp_to_epsilon(A[ok], acc.rdp[ok], 1e-5)
        assert eps_ours == pytest.approx(float(eps_theirs), rel=1e-6)
        assert order_ours == order_theirs
        # with every order dpkit can only be tighter
        assert acc.get_epsilon(1e-5) <= eps_ours


def test_full_accountant_path_matches_dp_accounting():
    q, sigma, steps = 256 / 60000, 1.1, 23400
    theirs = ra.RdpAccountant(list(ORDERS))
    theirs.compose(de.SelfComposedDpEvent(de.PoissonSampledDpEvent(q, de.GaussianDpEvent(sigma)), steps))
    ours = RDPAccountant(ORDERS).compose(SelfComposedEvent(PoissonSampledEvent(q, GaussianEvent(sigma)), steps))
    assert ours.get_epsilon(1e-5) == pytest.approx(theirs.get_epsilon(1e-5), rel=1e-6)
    for eps in (1.0, 3.0, 8.0):
        assert ours.get_delta(eps) == pytest.approx(theirs.get_delta(eps), rel=1e-6)
    eps, order = ours.get_epsilon_and_order(1e-5)
    assert order == theirs.get_epsilon_and_optimal_order(1e-5)[1]
    assert order in ORDERS


def test_other_mechanisms_match_dp_accounting():
    for b in (0.3, 1.0, 5.0):
        acc = ra.RdpAccountant(list(ORDERS))
        acc.compose(de.LaplaceDpEvent(b))
        np.testing.assert_allclose(laplace_rdp(b, ORDERS), acc.rdp, rtol=1e-9)
    for s in (0.5, 3.0):
        acc = ra.RdpAccountant(list(ORDERS))
        acc.compose(de.GaussianDpEvent(s))
        np.testing.assert_allclose(gaussian_rdp(s, ORDERS), acc.rdp, rtol=1e-12)
    # k-ary RR: dp_accounting's noise parameter r answers uniformly at random with probability r,
    # so p_truth = 1 − r + r/k (REPLACE_ONE relation).
    for p, k in ((0.75, 2), (0.5, 4), (0.9, 10)):
        r = (1 - p) * k / (k - 1)
        acc = ra.RdpAccountant(list(ORDERS), ra.NeighborRel.REPLACE_ONE)
        acc.compose(de.RandomizedResponseDpEvent(r, k))
        np.testing.assert_allclose(randomized_response_rdp(p, k, ORDERS), acc.rdp, rtol=1e-9)


# --------------------------------------------------------------------------------------------
# Per-mechanism curves against direct computation
# --------------------------------------------------------------------------------------------


def renyi_quad(logp, logq, alpha: float, breaks) -> float:
    """D_α(P ‖ Q) = 1/(α−1) ln ∫ p^α q^{1−α} by scipy quad on (−∞, ∞) split at ``breaks``."""
    f = lambda z: math.exp(alpha * logp(z) + (1 - alpha) * logq(z))  # noqa: E731
    pts = [-math.inf, *breaks, math.inf]
    total = sum(
        integrate.quad(f, a, b, epsabs=0, epsrel=1e-12, limit=200)[0] for a, b in zip(pts, pts[1:], strict=False)
    )
    return math.log(total) / (alpha - 1)


@pytest.mark.parametrize("b", [0.5, 1.0, 4.0])
@pytest.mark.parametrize("alpha", [1.5, 2.0, 3.7, 10.0])
def test_laplace_formula_against_integration(b, alpha):
    logp = lambda z: -math.log(2 * b) - abs(z) / b  # noqa: E731
    logq = lambda z: -math.log(2 * b) - abs(z - 1) / b  # noqa: E731
    ref = renyi_quad(logp, logq, alpha, [0.0, 1.0])
    assert laplace_rdp(b, [alpha])[0] == pytest.approx(ref, rel=1e-8)
    # also the closed form of Mironov 2017 Table II, written as given
    e = 1 / b
    table = math.log(
        alpha / (2 * alpha - 1) * math.exp((alpha - 1) * e) + (alpha - 1) / (2 * alpha - 1) * math.exp(-alpha * e)
    ) / (alpha - 1)
    assert laplace_rdp(b, [alpha])[0] == pytest.approx(table, rel=1e-12)
    assert laplace_rdp(b, [alpha])[0] <= min(e, alpha * e * e / 2)


@pytest.mark.parametrize("sigma", [0.4, 1.0, 3.0])
@pytest.mark.parametrize("alpha", [1.5, 2.0, 7.0])
def test_gaussian_exact(sigma, alpha):
    c = -math.log(sigma * math.sqrt(2 * math.pi))
    logp = lambda z: c - 0.5 * (z / sigma) ** 2  # noqa: E731
    logq = lambda z: c - 0.5 * ((z - 1) / sigma) ** 2  # noqa: E731
    ref = renyi_quad(logp, logq, alpha, [0.0, 1.0])
    assert gaussian_rdp(sigma, [alpha])[0] == pytest.approx(alpha / (2 * sigma**2), rel=1e-15)
    assert gaussian_rdp(sigma, [alpha])[0] == pytest.approx(ref, rel=1e-7)


def rr_direct(p: float, k: int, alpha: float) -> mpmath.mpf:
    """D_α(P ‖ Q) summed over the k outputs at 40 digits."""
    with mpmath.workdps(40):
        p = mpmath.mpf(p)
        q = (1 - p) / (k - 1)
        P = [p] + [q] * (k - 1)
        Q = [q, p] + [q] * (k - 2)
        s = mpmath.fsum(x**alpha * y ** (1 - alpha) for x, y in zip(P, Q, strict=True))
        return mpmath.log(s) / (alpha - 1)


@pytest.mark.parametrize(("p", "k"), [(0.75, 2), (0.6, 2), (0.5, 4), (0.9, 10), (0.2, 3), (0.5001, 2)])
def test_randomized_response_against_direct_sum(p, k):
    orders = [1.05, 1.5, 2.0, 5.5, 32.0, 1024.0]
    ours = randomized_response_rdp(p, k, orders)
    for a, r in zip(orders, ours, strict=True):
        assert r == pytest.approx(float(rr_direct(p, k, a)), rel=1e-10)
    eps = RandomizedResponseEvent(p, k).epsilon
    if eps > 0:
        assert np.all(ours <= eps * (1 + 1e-12))


def test_randomized_response_edge_cases():
    assert np.all(randomized_response_rdp(0.5, 2, ORDERS) == 0)  # p = 1/k: output independent of input
    assert np.all(np.isinf(randomized_response_rdp(1.0, 3, [2.0, 3.0])))  # truth always: no privacy


@pytest.mark.parametrize("eps", [0.01, 0.5, 1.0, 3.0, 10.0])
def test_pure_dp_bound(eps):
    ours = pure_dp_rdp(eps, ORDERS)
    # the bound quoted everywhere (Bun & Steinke 2016, Prop 3.3): min(ε, αε²/2)
    assert np.all(ours <= np.minimum(eps, A * eps * eps / 2) * (1 + 1e-12))
    # the tight form from its proof: 1/(α−1) ln[(sinh(αε) − sinh((α−1)ε))/sinh(ε)], at 40 digits
    with mpmath.workdps(40):
        e = mpmath.mpf(eps)
        for a, r in zip(ORDERS[::7], ours[::7], strict=True):
            ref = mpmath.log((mpmath.sinh(a * e) - mpmath.sinh((a - 1) * e)) / mpmath.sinh(e)) / (a - 1)
            assert r == pytest.approx(float(ref), rel=1e-9, abs=1e-300)
    # binary randomized response at e^ε attains it
    p = math.exp(eps) / (1 + math.exp(eps))
    np.testing.assert_allclose(ours, randomized_response_rdp(p, 2, ORDERS), rtol=1e-9)


def test_exponential_bounded_range():
    for eps in (0.1, 1.0, 5.0):
        r = event_rdp(ExponentialEvent(eps), ORDERS)
        assert np.all(r <= A * eps * eps / 8 * (1 + 1e-12))
        assert np.all(r <= event_rdp(PureDPEvent(eps), ORDERS))


def test_approx_dp_with_zero_delta_is_pure():
    np.testing.assert_array_equal(event_rdp(ApproxDPEvent(1.0, 0.0), ORDERS), event_rdp(PureDPEvent(1.0), ORDERS))


# --------------------------------------------------------------------------------------------
# Poisson-subsampled Gaussian against exact sums and quadrature
# --------------------------------------------------------------------------------------------


def log_a_exact_int(q: float, sigma: float, alpha: int) -> mpmath.mpf:
    with mpmath.workdps(50):
        q, s = mpmath.mpf(q), mpmath.mpf(sigma)
        return mpmath.log(
            mpmath.fsum(
                mpmath.binomial(alpha, i) * q**i * (1 - q) ** (alpha - i) * mpmath.exp((i * i - i) / (2 * s * s))
                for i in range(alpha + 1)
            )
        )


def log_a_quad(q: float, sigma: float, alpha: float) -> mpmath.mpf:
    """ln E_{z~N(0,σ²)}[(1 − q + q·e^{(2z−1)/(2σ²)})^α] by mpmath quadrature at 30 digits."""
    with mpmath.workdps(30):
        q, s, a = mpmath.mpf(q), mpmath.mpf(sigma), mpmath.mpf(alpha)
        f = lambda z: mpmath.npdf(z, 0, s) * (1 - q + q * mpmath.exp((2 * z - 1) / (2 * s * s))) ** a  # noqa: E731
        z0 = s * s * mpmath.log(1 / q - 1) + mpmath.mpf(1) / 2
        return mpmath.log(mpmath.quad(f, [-mpmath.inf, -10 * s, 0, z0, z0 + 10 * s, mpmath.inf]))


@pytest.mark.parametrize(("q", "sigma"), [(0.001, 1.1), (0.01, 0.6), (0.2, 2.0), (0.5, 0.3), (0.999, 1.0)])
def test_poisson_integer_orders_exact(q, sigma):
    orders = [2.0, 3.0, 8.0, 33.0]
    ours = poisson_subsampled_gaussian_rdp(q, sigma, orders)
    for a, r in zip(orders, ours, strict=True):
        ref = float(log_a_exact_int(q, sigma, int(a))) / (a - 1)
        assert r == pytest.approx(min(ref, a / (2 * sigma**2)), rel=1e-11)


@pytest.mark.parametrize(("q", "sigma"), [(0.001, 1.1), (0.1, 1.1), (0.1, 0.6), (0.5, 0.3)])
def test_poisson_fractional_orders_are_upper_bounds(q, sigma):
    orders = [1.05, 1.3, 2.5, 7.5]
    ours = poisson_subsampled_gaussian_rdp(q, sigma, orders)
    for a, r in zip(orders, ours, strict=True):
        truth = float(log_a_quad(q, sigma, a)) / (a - 1)
        assert r >= truth * (1 - 1e-12)
    # where the series converges quickly the bound is tight
    assert ours[-1] == pytest.approx(float(log_a_quad(q, sigma, 7.5)) / 6.5, rel=1e-5)


def test_poisson_structure():
    full = gaussian_rdp(1.1, ORDERS)
    np.testing.assert_array_equal(poisson_subsampled_gaussian_rdp(1.0, 1.1, ORDERS), full)
    prev = np.zeros(len(ORDERS))
    for q in (1e-6, 1e-3, 0.01, 0.1, 0.5, 0.9):
        cur = poisson_subsampled_gaussian_rdp(q, 1.1, ORDERS)
        assert np.all(cur >= prev * (1 - 1e-9))  # non-decreasing in q
        assert np.all(cur <= full)
        prev = cur
    # RDP is non-decreasing in α
    r = poisson_subsampled_gaussian_rdp(0.01, 1.1, ORDERS)
    assert np.all(np.diff(r) >= -1e-12 * r[1:])


def test_nested_gaussians_inside_sampling_use_effective_sigma():
    # two Gaussians σ = 2 on the same subsample are one Gaussian with σ = √2
    nested = PoissonSampledEvent(0.01, ComposedEvent((GaussianEvent(2.0), GaussianEvent(2.0))))
    single = PoissonSampledEvent(0.01, GaussianEvent(math.sqrt(2.0)))
    np.testing.assert_allclose(event_rdp(nested, ORDERS), event_rdp(single, ORDERS), rtol=1e-12)
    nested2 = PoissonSampledEvent(0.01, SelfComposedEvent(GaussianEvent(2.0), 4))
    np.testing.assert_allclose(
        event_rdp(nested2, ORDERS), event_rdp(PoissonSampledEvent(0.01, GaussianEvent(1.0)), ORDERS), rtol=1e-12
    )


# --------------------------------------------------------------------------------------------
# Sampling without replacement (Wang, Balle & Kasiviswanathan 2019)
# --------------------------------------------------------------------------------------------


def test_swor_sanity():
    sigma = 1.0
    full = gaussian_rdp(sigma, ORDERS)
    np.testing.assert_array_equal(sampled_without_replacement_gaussian_rdp(100, 100, sigma, ORDERS), full)
    prev = np.zeros(len(ORDERS))
    for m in (1, 5, 20, 50, 90, 100):
        cur = sampled_without_replacement_gaussian_rdp(100, m, sigma, ORDERS)
        assert np.all(cur >= prev)  # non-decreasing in γ = m/n
        assert np.all(cur <= full)
        # a valid lower bound: datasets 0…0 vs 0…01 give exactly the Poisson pair with q = γ
        assert np.all(cur >= poisson_subsampled_gaussian_rdp(m / 100, sigma, ORDERS) * (1 - 1e-12))
        prev = cur


def test_swor_against_dp_accounting():
    for n, m, sigma in ((1000, 10, 1.0), (1000, 100, 2.0), (1000, 500, 0.8), (10000, 10, 5.0)):
        ours = sampled_without_replacement_gaussian_rdp(n, m, sigma, ORDERS)
        acc = ra.RdpAccountant(list(ORDERS), ra.NeighborRel.REPLACE_ONE)
        acc.compose(de.SampledWithoutReplacementDpEvent(n, m, de.GaussianDpEvent(sigma)))
        theirs = acc.rdp
        full = gaussian_rdp(sigma, ORDERS)
        # above order 256 dp_accounting also evaluates Theorem 9
        big = (A > 256) & (np.floor(A) == A)
        np.testing.assert_allclose(ours[big], np.minimum(theirs[big], full[big]), rtol=1e-9)
        # below, it uses the tighter Theorem 27; Theorem 9 is never below it
        below = (A <= 256) & (np.floor(A) == A) & (ours < full)
        assert np.all(ours[below] >= theirs[below] * (1 - 1e-9))


def test_swor_fractional_orders_use_neighbouring_integers():
    r = sampled_without_replacement_gaussian_rdp(1000, 10, 1.0, [2.0, 2.5, 3.0])
    assert r[0] <= r[1] <= r[2]
    cgf2, cgf3 = r[0] * 1, r[2] * 2
    assert r[1] <= (0.5 * cgf2 + 0.5 * cgf3) / 1.5 * (1 + 1e-12)


# --------------------------------------------------------------------------------------------
# The accountant: composition, conversions, neighbours
# --------------------------------------------------------------------------------------------


def test_accountant_protocol_and_composition():
    acc = RDPAccountant()
    assert isinstance(acc, Accountant)
    assert acc.compose(GaussianEvent(2.0)) is acc
    acc.compose(LaplaceEvent(1.0), count=3)
    acc.compose(ComposedEvent((PureDPEvent(0.5), SelfComposedEvent(GaussianEvent(2.0), 2))))
    expected = 3 * gaussian_rdp(2.0, ORDERS) + 3 * laplace_rdp(1.0, ORDERS) + pure_dp_rdp(0.5, ORDERS)
    np.testing.assert_allclose(acc.rdp, expected, rtol=1e-14)
    assert np.all(acc.rdp >= expected)  # composition rounds up
    np.testing.assert_array_equal(acc.orders, A)


def test_conversion_hand_values():
    # one Gaussian σ = 1 at the single order α = 10: R = 5
    acc = RDPAccountant(orders=[10]).compose(GaussianEvent(1.0))
    delta = 1e-5
    classic = 5 + math.log(1 / delta) / 9  # Mironov 2017, Prop 3: 6.27921...
    improved = 5 + math.log(9 / 10) - (math.log(delta) + math.log(10)) / 9  # CKS 2020, Prop 12: 5.91801...
    assert classic == pytest.approx(6.279214, abs=1e-6) and improved == pytest.approx(5.918011, abs=1e-6)
    assert acc.get_epsilon(delta, conversion="classic") == pytest.approx(classic, rel=1e-14)
    assert acc.get_epsilon(delta, conversion="classic") >= classic
    assert acc.get_epsilon(delta) == pytest.approx(improved, rel=1e-14)
    assert acc.get_epsilon(delta) >= improved
    assert acc.get_epsilon_and_order(delta) == (acc.get_epsilon(delta), 10.0)
    # δ at ε: classic e^{(α−1)(R−ε)}, improved e^{(α−1)(R−ε+ln(1−1/α))}/α
    assert acc.get_delta(7.0, conversion="classic") == pytest.approx(math.exp(9 * (5 - 7.0)), rel=1e-12)
    assert acc.get_delta(7.0) == pytest.approx(math.exp(9 * (5 - 7.0 + math.log(0.9))) / 10, rel=1e-12)


def test_conversions_are_consistent():
    acc = RDPAccountant().compose(SelfComposedEvent(PoissonSampledEvent(0.01, GaussianEvent(1.0)), 1000))
    for delta in (1e-3, 1e-5, 1e-10):
        eps = acc.get_epsilon(delta)
        assert 0 < eps <= acc.get_epsilon(delta, conversion="classic")
        assert acc.get_delta(eps) <= delta * (1 + 1e-9)  # round trip
    eps = acc.get_epsilon(1e-5)
    assert acc.get_delta(eps) >= acc.get_delta(eps * 1.1)
    assert acc.get_delta(1e-6) <= 1.0


def test_zero_and_trivial_cases():
    acc = RDPAccountant()
    assert acc.get_epsilon(1e-5) == 0.0 and acc.get_epsilon(0.0) == 0.0
    assert acc.get_delta(1.0) == 0.0
    acc.compose(GaussianEvent(1.0))
    assert acc.get_epsilon(0.0) == math.inf  # RDP at finite orders never gives δ = 0
    assert acc.get_epsilon_and_order(0.0) == (math.inf, math.inf)
    # tiny RDP: KL / Bretagnolle–Huber gives ε = 0 (never negative)
    tiny = RDPAccountant().compose(GaussianEvent(1e6))  # R(1.05) = 5.25e-13, √(1 − e^{−R}) = 7.2e-7
    assert tiny.get_epsilon(1e-5) == 0.0
    assert tiny.get_epsilon(1e-8) > 0
    # huge RDP: δ capped at 1
    huge = RDPAccountant().compose(GaussianEvent(0.01), count=1000)
    assert huge.get_delta(1.0) == 1.0


def test_rdp_to_epsilon_functions():
    r = gaussian_rdp(1.0, ORDERS)
    eps, order = rdp_to_epsilon(ORDERS, r, 1e-5)
    assert eps == RDPAccountant().compose(GaussianEvent(1.0)).get_epsilon(1e-5) or eps == pytest.approx(
        RDPAccountant().compose(GaussianEvent(1.0)).get_epsilon(1e-5), rel=1e-14
    )
    d, _ = rdp_to_delta(ORDERS, r, eps)
    assert d <= 1e-5 * (1 + 1e-9)
    with pytest.raises(InvalidParameterError):
        rdp_to_epsilon(ORDERS, r[:-1], 1e-5)
    with pytest.raises(InvalidParameterError):
        rdp_to_epsilon([2.0], [-1.0], 1e-5)
    with pytest.raises(InvalidParameterError):
        rdp_to_epsilon([2.0], [math.nan], 1e-5)


def test_neighbour_relations():
    add = RDPAccountant()
    rep = RDPAccountant(neighbours="replace")
    # RR is a replace-one mechanism
    rr = RandomizedResponseEvent(0.75)
    assert not add.supports(rr) and rep.supports(rr)
    with pytest.raises(InvalidParameterError, match="neighbours"):
        add.compose(rr)
    # a Gaussian calibrated under replace is not accounted under add/remove, and vice versa
    with pytest.raises(InvalidParameterError, match="neighbours"):
        add.compose(GaussianEvent(1.0, neighbours="replace"))
    with pytest.raises(InvalidParameterError, match="neighbours"):
        rep.compose(ComposedEvent((GaussianEvent(1.0),)))
    # Poisson needs add_remove; sampling without replacement needs replace (also inside)
    poisson = PoissonSampledEvent(0.1, GaussianEvent(1.0, neighbours="replace"))
    with pytest.raises(InvalidParameterError, match="neighbours"):
        rep.compose(poisson)
    swor = SampledWithoutReplacementEvent(100, 10, GaussianEvent(1.0, neighbours="replace"))
    assert rep.supports(swor) and not add.supports(swor)
    with pytest.raises(InvalidParameterError, match="neighbours"):
        add.compose(swor)
    with pytest.raises(InvalidParameterError, match="neighbours"):
        rep.compose(SampledWithoutReplacementEvent(100, 10, GaussianEvent(1.0)))
    rep.compose(swor).compose(rr)
    assert rep.get_epsilon(1e-5) > 0
    assert np.all(add.rdp == 0)


def test_unsupported_events_record_nothing():
    acc = RDPAccountant().compose(GaussianEvent(3.0))
    before = acc.rdp
    bad_events = [
        ApproxDPEvent(1.0, 1e-6),
        PoissonSampledEvent(0.1, LaplaceEvent(1.0)),
        PoissonSampledEvent(0.1, ComposedEvent(())),
        ComposedEvent((GaussianEvent(1.0), ApproxDPEvent(1.0, 1e-6))),  # valid part first
        SelfComposedEvent(ComposedEvent((PureDPEvent(1.0), ApproxDPEvent(0.5, 0.1))), 3),
    ]
    for ev in bad_events:
        assert not acc.supports(ev)
        with pytest.raises(InvalidParameterError) as info:
            acc.compose(ev)
        assert info.value.name == "event"
        np.testing.assert_array_equal(acc.rdp, before)

    @dataclass(frozen=True)
    class Strange(DPEvent):
        pass

    with pytest.raises(InvalidParameterError, match="event"):
        acc.compose(Strange())
    np.testing.assert_array_equal(acc.rdp, before)


def test_registry_extends_without_editing_the_accountant():
    @dataclass(frozen=True)
    class ConstantRDPEvent(DPEvent):
        value: float
        neighbours: str = "add_remove"

    register_rdp(ConstantRDPEvent, lambda ev, orders: np.full(len(orders), ev.value))
    try:
        acc = RDPAccountant(orders=[2.0, 4.0]).compose(ConstantRDPEvent(0.25), count=4)
        np.testing.assert_allclose(acc.rdp, [1.0, 1.0])
        assert not RDPAccountant(neighbours="replace").supports(ConstantRDPEvent(0.25))
    finally:
        rdp_accountant._REGISTRY.rules.pop(ConstantRDPEvent)

    # subclasses dispatch through their base's entry
    @dataclass(frozen=True)
    class MyGaussian(GaussianEvent):
        pass

    np.testing.assert_array_equal(event_rdp(MyGaussian(2.0), ORDERS), gaussian_rdp(2.0, ORDERS))


@pytest.mark.parametrize(
    "orders",
    [[], [1.0], [0.5, 2.0], [2.0, math.nan], [2.0, math.inf], ["2"], [True, 2.0], "2345", 3.0],
)
def test_bad_orders(orders):
    with pytest.raises(InvalidParameterError) as info:
        RDPAccountant(orders=orders)
    assert info.value.name == "orders"


def test_bad_arguments():
    acc = RDPAccountant().compose(GaussianEvent(1.0))
    for delta in (-0.1, 1.0, 1.5, math.nan, math.inf, "0.1"):
        with pytest.raises(InvalidParameterError):
            acc.get_epsilon(delta)
    for eps in (-1.0, math.nan, math.inf):  # ε = 0 is valid: see tests/accounting/test_accountant.py
        with pytest.raises(InvalidParameterError):
            acc.get_delta(eps)
    for count in (0, -1, 1.5, True, "2"):
        with pytest.raises(InvalidParameterError):
            acc.compose(GaussianEvent(1.0), count=count)
    with pytest.raises(InvalidParameterError):
        acc.get_epsilon(1e-5, conversion="bogus")
    with pytest.raises(InvalidParameterError):
        RDPAccountant(neighbours="swap")
    with pytest.raises(InvalidParameterError):
        RDPAccountant(neighbours="replace").compose(RandomizedResponseEvent(1.5, neighbours="replace"))
    np.testing.assert_allclose(acc.rdp, gaussian_rdp(1.0, ORDERS), rtol=1e-15)  # nothing recorded


def test_orders_are_sorted_and_deduplicated():
    acc = RDPAccountant(orders=[8, 2.5, 2.5, 3])
    np.testing.assert_array_equal(acc.orders, [2.5, 3.0, 8.0])


# --------------------------------------------------------------------------------------------
# Extreme settings and speed
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "event",
    [
        SelfComposedEvent(PoissonSampledEvent(1.0, GaussianEvent(0.3)), 1_000_000),
        SelfComposedEvent(PoissonSampledEvent(0.5, GaussianEvent(0.3)), 1_000_000),
        SelfComposedEvent(PoissonSampledEvent(1e-6, GaussianEvent(50.0)), 10),
        SelfComposedEvent(PoissonSampledEvent(0.999999, GaussianEvent(0.3)), 1000),
        SelfComposedEvent(LaplaceEvent(1e-4), 1_000_000),
        SelfComposedEvent(LaplaceEvent(1e6), 1_000_000),
        SelfComposedEvent(PureDPEvent(50.0), 100),
        SelfComposedEvent(GaussianEvent(1e-4), 1_000_000),
    ],
)
def test_extreme_settings_are_sound_finite_and_quiet(event):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with np.errstate(over="raise", invalid="raise", divide="raise"):
            acc = RDPAccountant().compose(event)
            r = acc.rdp
            assert not np.any(np.isnan(r)) and np.all(r >= 0)
            for delta in (1e-18, 1e-5):
                eps, order = acc.get_epsilon_and_order(delta)
                assert math.isfinite(eps) and eps >= 0
                assert eps >= acc.get_epsilon(0.5)
                d = acc.get_delta(max(eps, 1e-9))
                assert 0 <= d <= 1
                # both directions round up by an error allowance of ~1e-15·α·ε nats
                assert eps == 0 or math.log(d) - math.log(delta) <= 1e-6 + 1e-10 * eps
            for e in (1e-3, 1.0, 1e3):
                assert 0 <= acc.get_delta(e) <= 1


def test_extreme_event_with_gaussian_bound():
    # q = 1, σ = 0.3, 10^6 steps: the Gaussian with ρ = 10^6/(2·0.09); ε tracks the zCDP value
    acc = RDPAccountant().compose(SelfComposedEvent(PoissonSampledEvent(1.0, GaussianEvent(0.3)), 1_000_000))
    rho = 1e6 / (2 * 0.09)
    eps = acc.get_epsilon(1e-18)
    assert eps >= rho  # no (ε, δ) bound of a Gaussian with this ρ is below ρ at δ < 1/2
    assert eps <= 1.06 * rho  # the smallest default order is 1.05


def test_dp_sgd_curve_is_computed_once():
    # The speed this buys (cold < 1 s, warm ~1 ms) is measured in benchmarks/bench_accounting.py;
    # here: the repeated accounting of one DP-SGD setting reuses the cached curve.
    event = SelfComposedEvent(PoissonSampledEvent(256 / 60000, GaussianEvent(1.1)), 23400)
    cached = rdp_curves._poisson_gaussian_rdp_cached
    cached.cache_clear()
    eps = RDPAccountant().compose(event).get_epsilon(1e-5)
    assert cached.cache_info().misses >= 1
    misses = cached.cache_info().misses
    for _ in range(20):
        assert RDPAccountant().compose(event).get_epsilon(1e-5) == eps
    assert cached.cache_info().misses == misses and cached.cache_info().hits >= 20
    assert 3.0 < eps < 4.0  # dp_accounting agrees to 1e-6 (test_full_accountant_path_matches_dp_accounting)


def test_cached_curves_cannot_be_mutated():
    r = poisson_subsampled_gaussian_rdp(0.01, 1.0, ORDERS)
    r[:] = 0  # a copy
    assert np.all(poisson_subsampled_gaussian_rdp(0.01, 1.0, ORDERS) > 0)
    acc = RDPAccountant().compose(PoissonSampledEvent(0.01, GaussianEvent(1.0)))
    acc.compose(PoissonSampledEvent(0.01, GaussianEvent(1.0)))
    np.testing.assert_allclose(acc.rdp, 2 * poisson_subsampled_gaussian_rdp(0.01, 1.0, ORDERS), rtol=1e-14)


def test_laplace_fraction_multiplier():
    ev = LaplaceEvent.for_epsilon(0.5)
    assert isinstance(ev.noise_multiplier, Fraction)
    np.testing.assert_allclose(event_rdp(ev, ORDERS), laplace_rdp(2.0, ORDERS), rtol=1e-15)
