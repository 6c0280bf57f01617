"""Tests for dpkit.accounting.pld: the privacy loss distribution accountant.

Every reference is independent of dpkit's PLD code: closed forms (the Laplace curve
δ(ε) = 1 − e^{(ε−ε₀)/2}, checked here against numerical integration; the analytic Gaussian curve
of Balle & Wang 2018; the exact binomial composition of randomized response and of pure /
approximate DP pairs), a rounded-down / rounded-up sandwich of the k-fold Laplace loss computed
with numpy, and Google's dp_accounting 0.6.0 (a test-only dependency) at the same discretisation.

The claim under test is the module's theorem: every δ (ε) reported is at least the true one,
and close to it.
"""

from __future__ import annotations

import math
import warnings
from fractions import Fraction

import numpy as np
import pytest
from scipy import integrate

from dpkit.accounting.accountant import Accountant
from dpkit.accounting.analytic_gaussian import gaussian_delta
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
from dpkit.accounting.pld import PLDAccountant
from dpkit.accounting.pld.compose import _delta_of
from dpkit.accounting.pld.mechanisms import _gaussian, _leaf_pmfs
from dpkit.errors import InvalidParameterError

dp_accounting = pytest.importorskip("dp_accounting")
from dp_accounting.pld import pld_privacy_accountant as dpa_pld  # noqa: E402

pytestmark = pytest.mark.filterwarnings("error")

H = 1e-4  # the default grid


@pytest.fixture(autouse=True)
def _strict_floating_point():
    """Overflow, division by zero and invalid operations raise instead of warning."""
    with np.errstate(divide="raise", over="raise", invalid="raise"):
        yield


def dpa_epsilon(event, delta: float, h: float) -> float:
    acc = dpa_pld.PLDAccountant(value_discretization_interval=h)
    acc.compose(event)
    return acc.get_epsilon(delta)


# ------------------------------------------------------------------------------ references


def laplace_delta(eps: float, eps0: float) -> float:
    """Exact δ(ε) of the Laplace mechanism with ε₀ = Δ/b: 1 − e^{(ε−ε₀)/2} on [0, ε₀], 0 above."""
    return 0.0 if eps >= eps0 else -math.expm1((eps - eps0) / 2)


def gauss_eps(delta: float, sigma: float) -> float:
    """Inverse of the analytic Gaussian curve by bisection (60 steps), from above."""
    lo, hi = 0.0, 1.0
    while gaussian_delta(hi, sigma) > delta:
        hi *= 2
    for _ in range(80):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if gaussian_delta(mid, sigma) <= delta else (mid, hi)
    return hi


def binomial_delta(eps: float, eps0: float, k: int, delta0: float = 0.0) -> float:
    """Exact δ(ε) of k compositions of the canonical (ε₀, δ₀) pair: losses (2i − k)ε₀ with
    binomial weights, plus the mass 1 − (1 − δ₀)^k at +∞ (Kairouz, Oh & Viswanath 2015)."""
    p = math.exp(eps0) / (1 + math.exp(eps0))
    fin = 0.0
    for i in range(k + 1):
        loss = (2 * i - k) * eps0
        if loss > eps:
            fin += math.comb(k, i) * p**i * (1 - p) ** (k - i) * -math.expm1(eps - loss)
    keep = (1 - delta0) ** k
    return 1 - keep + keep * fin


def laplace_sandwich(eps0: float, k: int, h_ref: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """k-fold Laplace loss distribution rounded down and rounded up to the grid h_ref.

    Single step under P: atom ½e^{−ε₀} at −ε₀, density ¼e^{(ℓ−ε₀)/2} on (−ε₀, ε₀), atom ½ at ε₀.
    Returns (losses, pmf rounded down, pmf rounded up) of the k-fold sum; δ from the first is a
    lower bound on the true δ, from the second an upper bound."""
    m = round(eps0 / h_ref)
    assert abs(m * h_ref - eps0) < 1e-12
    edges = (np.arange(-m, m + 1)) * h_ref
    cdf = 0.5 * np.exp((edges - eps0) / 2)  # P(L <= ℓ) on [−ε₀, ε₀)
    cell = np.diff(cdf)  # mass in (ℓ_i, ℓ_{i+1}]
    down = np.zeros(2 * m + 1)
    up = np.zeros(2 * m + 1)
    down[0] += 0.5 * math.exp(-eps0)
    up[0] += 0.5 * math.exp(-eps0)
    down[:-1] += cell
    up[1:] += cell
    down[-1] += 0.5
    up[-1] += 0.5
    n = k * 2 * m + 1
    size = 1 << int(math.ceil(math.log2(n)))
    out = []
    for pmf in (down, up):
        r = np.fft.irfft(np.fft.rfft(pmf, size) ** k, size)[:n]
        out.append(np.maximum(r, 0.0))
    losses = (np.arange(n) - k * m) * h_ref
    return losses, out[0], out[1]


def delta_from_pmf(losses: np.ndarray, pmf: np.ndarray, eps: float) -> float:
    sel = losses > eps
    return float(pmf[sel] @ -np.expm1(eps - losses[sel]))


# ------------------------------------------------------------------------------ protocol


def test_is_an_accountant_and_empty_is_free():
    acc = PLDAccountant()
    assert isinstance(acc, Accountant)
    assert acc.get_epsilon(1e-6) == 0.0
    assert acc.get_delta(0.0) == 0.0
    assert acc.value_discretization_interval == 1e-4 and acc.neighbours == "add_remove"
    assert "PLDAccountant" in repr(acc)


def test_count_self_composed_composed_and_repeated_compose_agree():
    ev = PoissonSampledEvent(0.02, GaussianEvent(1.2))
    lap = LaplaceEvent(3.0)
    a = PLDAccountant().compose(ev, count=50).compose(lap, count=2)
    b = PLDAccountant().compose(SelfComposedEvent(ComposedEvent((ev, ev)), 25)).compose(ComposedEvent((lap, lap)))
    c = PLDAccountant()
    for _ in range(50):
        c.compose(ev)
    c.compose(lap).compose(lap)
    assert a.get_epsilon(1e-6) == b.get_epsilon(1e-6) == c.get_epsilon(1e-6)
    assert a.get_delta(1.0) == b.get_delta(1.0) == c.get_delta(1.0)


def test_nested_poisson_subsampling_multiplies_probabilities():
    a = PLDAccountant().compose(PoissonSampledEvent(0.5, PoissonSampledEvent(0.1, GaussianEvent(1.0))), count=100)
    b = PLDAccountant().compose(PoissonSampledEvent(0.05, GaussianEvent(1.0)), count=100)
    assert a.get_epsilon(1e-5) == pytest.approx(b.get_epsilon(1e-5), rel=1e-12)


# ------------------------------------------------------------------------------ Laplace


def test_laplace_closed_form_matches_numerical_integration():
    for eps0 in (0.5, 1.0, 3.0):
        b = 1 / eps0
        for eps in (0.0, 0.3 * eps0, 0.9 * eps0):

            def f(x: float, b: float = b, eps: float = eps) -> float:
                return max(0.5 / b * math.exp(-abs(x - 1) / b) - math.exp(eps) * 0.5 / b * math.exp(-abs(x) / b), 0.0)

            val = integrate.quad(f, -60, 60, points=[0, 1], limit=500, epsabs=1e-14)[0]
            assert val == pytest.approx(laplace_delta(eps, eps0), rel=1e-8, abs=1e-13)


@pytest.mark.parametrize("b", [0.25, 1.0, 2.0, Fraction(1, 3)])
def test_laplace_single_pure_epsilon_and_curve(b):
    eps0 = float(1 / Fraction(b))
    acc = PLDAccountant().compose(LaplaceEvent(b))
    e_pure = acc.get_epsilon(0.0)
    assert eps0 <= e_pure <= eps0 + H  # an upper bound, within one grid step
    assert acc.get_delta(e_pure) == 0.0
    for eps in np.linspace(0.0, eps0 * 0.999, 13):
        d, exact = acc.get_delta(float(eps)), laplace_delta(float(eps), eps0)
        assert d >= exact  # sound
        assert d <= exact + 1e-7  # connect-the-dots is exact at grid points, chord in between
    for delta in (1e-2, 1e-4, 1e-6, 1e-9):
        exact = eps0 + 2 * math.log1p(-delta)  # inverse of the closed form
        e = acc.get_epsilon(delta)
        assert exact <= e <= exact + 1e-5


def test_laplace_from_epsilon_is_exact_on_the_grid():
    acc = PLDAccountant().compose(LaplaceEvent.for_epsilon(0.5), count=10)
    assert 5.0 <= acc.get_epsilon(0.0) <= 5.0 + 1e-12
    assert acc.get_epsilon(1e-18) <= 5.0 + 1e-12  # below the numerical floor: the exact pure answer


@pytest.mark.parametrize("k", [2, 10])
def test_laplace_composition_is_sandwiched(k):
    eps0 = 1.0
    losses, low, high = laplace_sandwich(eps0, k, 2e-5)
    acc = PLDAccountant().compose(LaplaceEvent(1.0), count=k)
    assert k * eps0 <= acc.get_epsilon(0.0) <= k * eps0 + k * H
    for eps in np.linspace(0.0, 0.8 * k * eps0, 9):
        lo, hi = delta_from_pmf(losses, low, float(eps)), delta_from_pmf(losses, high, float(eps))
        d = acc.get_delta(float(eps))
        assert d >= lo  # the true δ is >= lo: never below it
        assert d <= hi * (1 + 1e-6) + 1e-9  # and no looser than rounding every loss up by 2e-5
    for delta in (1e-3, 1e-6):
        e = acc.get_epsilon(delta)
        assert delta_from_pmf(losses, low, e) <= delta  # sound w.r.t. the lower curve
        assert delta_from_pmf(losses, high, e - 2e-3) > delta  # and tight within 2e-3


# ------------------------------------------------------------------------------ Gaussian


@pytest.mark.parametrize("sigma", [0.3, 1.0, 4.0])
def test_gaussian_alone_is_the_analytic_curve(sigma):
    acc = PLDAccountant().compose(GaussianEvent(sigma))
    for eps in (0.0, 0.5, 2.0, 10.0):
        exact = gaussian_delta(eps, sigma)
        assert exact <= acc.get_delta(eps) <= exact * (1 + 1e-9) + 1e-300
    for delta in (1e-3, 1e-8, 1e-15):
        exact = gauss_eps(delta, sigma)
        assert exact * (1 - 1e-12) <= acc.get_epsilon(delta) <= exact * (1 + 1e-9) + 1e-12
    assert acc.get_epsilon(0.0) == math.inf


@pytest.mark.parametrize("sigma", [0.5, 1.0, 2.0])
def test_discretised_gaussian_pmf_bounds_the_analytic_curve(sigma):
    pmf = _gaussian(1 / sigma, H, 1e-20)
    for eps in np.linspace(0.0, 1 / (2 * sigma * sigma) + 6 / sigma, 25):
        d, exact = _delta_of(pmf, H, float(eps)), gaussian_delta(float(eps), sigma)
        assert d >= exact
        assert d <= exact + 1e-8


@pytest.mark.parametrize(("sigma", "k"), [(1.0, 16), (4.0, 100), (0.8, 3)])
def test_k_gaussians_through_the_grid_are_one_gaussian(sigma, k):
    """k Gaussians = one Gaussian with σ/√k. A Laplace of scale 1e9 (losses ±1e-9) forces the
    discretised path; it can only add to ε."""
    tiny = LaplaceEvent(1e9)
    for ev in (GaussianEvent(sigma), PoissonSampledEvent(1.0, GaussianEvent(sigma))):
        acc = PLDAccountant().compose(ev, count=k).compose(tiny)
        assert acc._evaluate().pmfs  # the grid, not the analytic shortcut
        for delta in (1e-3, 1e-6, 1e-9):
            exact = gauss_eps(delta, sigma / math.sqrt(k))
            e = acc.get_epsilon(delta)
            assert exact <= e <= exact + 5e-4
        assert acc.get_delta(1.0) >= gaussian_delta(1.0, sigma / math.sqrt(k))


# ------------------------------------------------------------------------------ RR, pure, approx


@pytest.mark.parametrize(("p", "k"), [(0.75, 2), (0.6, 5), (0.1, 4), (Fraction(2, 3), 3)])
def test_randomized_response_exact_pld(p, k):
    pf = Fraction(p)
    r = (1 - pf) / (k - 1)
    big, small = float(max(pf, r)), float(min(pf, r))
    e_rr = math.log(big / small)
    rem, add = _leaf_pmfs(("rr", p, k), H, 1e-20)
    assert add is None  # symmetric
    losses = (rem.lo + np.arange(rem.probs.size)) * H
    assert math.fsum(rem.probs) == pytest.approx(1.0, abs=1e-15)
    assert math.fsum(rem.probs * np.exp(-losses)) == pytest.approx(1.0, abs=1e-12)  # Q-mass kept
    acc = PLDAccountant(neighbours="replace").compose(RandomizedResponseEvent(p_truth=p, k=k))
    assert e_rr <= acc.get_epsilon(0.0) <= e_rr + H
    for eps in np.arange(0.0, e_rr, 0.0517):
        exact = max(0.0, big - math.exp(eps) * small)
        on_grid = round(eps / H) * H
        assert acc.get_delta(float(eps)) >= exact
        assert acc.get_delta(on_grid) == pytest.approx(max(0.0, big - math.exp(on_grid) * small), abs=1e-12)


def test_randomized_response_composition_is_binomial():
    p, n = 0.75, 7
    eps0 = math.log(3)
    acc = PLDAccountant(neighbours="replace").compose(RandomizedResponseEvent(p_truth=p, k=2), count=n)
    for eps in (0.0, 1.0, 3.0, 6.0):
        exact = binomial_delta(eps, eps0, n)
        assert exact <= acc.get_delta(eps) <= exact + n * H
    assert acc.get_epsilon(0.0) == pytest.approx(n * eps0, abs=n * H)


@pytest.mark.parametrize(("eps0", "k"), [(0.5, 10), (1.0, 30), (0.1, 200)])
def test_pure_dp_composition_is_optimal_composition(eps0, k):
    acc = PLDAccountant().compose(PureDPEvent(eps0), count=k)
    exp = PLDAccountant().compose(ExponentialEvent(eps0), count=k)
    for eps in (0.0, 0.3 * k * eps0, 0.6 * k * eps0):
        exact = binomial_delta(eps, eps0, k)
        assert exact <= acc.get_delta(eps) <= exact + 2e-3 * max(exact, 1e-6) + 1e-9
        assert exp.get_delta(eps) == acc.get_delta(eps)  # ε-DP pair: sound, if conservative
    assert k * eps0 <= acc.get_epsilon(0.0) <= k * (eps0 + H)


def test_approx_dp_composition():
    acc = PLDAccountant().compose(ApproxDPEvent(0.5, 1e-6), count=20)
    for eps in (0.5, 2.0, 5.0):
        exact = binomial_delta(eps, 0.5, 20, delta0=1e-6)
        assert exact <= acc.get_delta(eps) <= exact * (1 + 2e-3) + 1e-9
    assert acc.get_epsilon(1e-5) == math.inf  # 20 steps put 2e-5 at loss +∞
    zero = PLDAccountant().compose(ApproxDPEvent(0.5, 0.0), count=20)
    assert zero.get_delta(2.0) == PLDAccountant().compose(PureDPEvent(0.5), count=20).get_delta(2.0)


# ------------------------------------------------------------------------------ dp_accounting


GRID = [(q, s, k) for q in (0.001, 0.01, 0.1) for s in (0.6, 1.1, 2.0) for k in (100, 1000)]


@pytest.mark.parametrize(("q", "sigma", "steps"), GRID)
def test_subsampled_gaussian_matches_dp_accounting(q, sigma, steps, record_property):
    h = 1e-3
    ours = PLDAccountant(h).compose(PoissonSampledEvent(q, GaussianEvent(sigma)), count=steps).get_epsilon(1e-5)
    ref = dpa_epsilon(
        dp_accounting.SelfComposedDpEvent(
            dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), steps
        ),
        1e-5,
        h,
    )
    record_property("tighter_than_dp_accounting", ours < ref)
    record_property("relative_difference", ours / ref - 1)
    assert ours == pytest.approx(ref, rel=1e-2)
    assert ours >= ref * (1 - 1e-3)  # same discretisation, same theorem: never much tighter


@pytest.mark.parametrize(("q", "b", "steps"), [(0.01, 1.0, 300), (0.2, 2.0, 50), (1.0, 4.0, 20)])
def test_subsampled_laplace_matches_dp_accounting(q, b, steps):
    h = 1e-3
    ours = PLDAccountant(h).compose(PoissonSampledEvent(q, LaplaceEvent(b)), count=steps)
    ref = dpa_pld.PLDAccountant(value_discretization_interval=h)
    ref.compose(
        dp_accounting.SelfComposedDpEvent(
            dp_accounting.PoissonSampledDpEvent(q, dp_accounting.LaplaceDpEvent(b)), steps
        )
    )
    assert ours.get_epsilon(1e-6) == pytest.approx(ref.get_epsilon(1e-6), rel=1e-2)
    for delta in (1e-2, 1e-4):  # both directions: the maximum is reported, like dp_accounting
        eps = ref.get_epsilon(delta)
        assert ours.get_delta(eps) == pytest.approx(ref.get_delta(eps), rel=1e-2)


def test_both_directions_are_composed():
    """For subsampling the add and remove PLDs differ; δ is the larger of the two."""
    acc = PLDAccountant().compose(PoissonSampledEvent(0.1, GaussianEvent(0.8)), count=50)
    ev = acc._evaluate()
    assert len(ev.pmfs) == 2
    for eps in (0.0, 1.0, 3.0):
        ds = [_delta_of(p, ev.h, eps) for p in ev.pmfs]
        assert acc.get_delta(eps) == max(ds)
    assert ds[0] != ds[1]


def test_dp_sgd_benchmark_setting_is_tight():
    """The issue's setting: q = 256/60000, σ = 1.1, 100 epochs of 235 steps, δ = 1e-5.
    dp_accounting 0.6.0's PLD at value_discretization_interval = 1e-5 gives 3.1634943396311104
    (computed once; it takes seconds)."""
    ref = 3.1634943396311104
    ev = SelfComposedEvent(PoissonSampledEvent(256 / 60000, GaussianEvent(1.1)), 100 * 235)
    # Its speed (~10 ms on a quiet machine) is measured in benchmarks/bench_accounting.py, not here.
    e = PLDAccountant().compose(ev).get_epsilon(1e-5)
    assert ref <= e <= ref * 1.001


# ------------------------------------------------------------------------------ extremes


def test_extreme_delta_gives_a_clear_error_or_a_sound_value():
    dpsgd = PLDAccountant().compose(PoissonSampledEvent(256 / 60000, GaussianEvent(1.1)), count=23500)
    with pytest.raises(InvalidParameterError, match="numerical floor") as info:
        dpsgd.get_epsilon(1e-18)
    assert info.value.name == "delta"
    lap = PLDAccountant().compose(LaplaceEvent(1.0))
    assert 1.0 <= lap.get_epsilon(1e-18) <= 1.0 + H  # exact pure answer, no floor issue
    g = PLDAccountant().compose(GaussianEvent(1.0), count=4)  # analytic: no floor at all
    assert g.get_epsilon(1e-18) == pytest.approx(gauss_eps(1e-18, 0.5), rel=1e-9)


@pytest.mark.parametrize(
    ("name", "events", "delta"),
    [
        ("a million DP-SGD steps", [(PoissonSampledEvent(256 / 60000, GaussianEvent(1.1)), 10**6)], 1e-5),
        ("q = 1, sigma = 0.3", [(PoissonSampledEvent(1.0, GaussianEvent(0.3)), 1000)], 1e-5),
        ("sigma = 0.3 Gaussians and a Laplace", [(GaussianEvent(0.3), 10**6), (LaplaceEvent(1.0), 1)], 1e-5),
        ("epsilon near 100", [(PoissonSampledEvent(0.1, GaussianEvent(0.6)), 1000)], 1e-5),
        ("tiny sigma, coarsened grid", [(PoissonSampledEvent(0.01, GaussianEvent(0.01)), 10)], 1e-5),
        ("a trillion steps", [(PoissonSampledEvent(256 / 60000, GaussianEvent(1.1)), 10**12)], 1e-5),
        ("a million pure steps", [(PureDPEvent(0.01), 10**6)], 1e-5),
    ],
)
def test_extreme_settings_finish_soundly(name, events, delta):
    acc = PLDAccountant()
    for ev, c in events:
        acc.compose(ev, count=c)
    try:
        e = acc.get_epsilon(delta)
    except InvalidParameterError as exc:  # a clear refusal is allowed, a wrong or infinite value is not
        assert "numerical floor" in str(exc)
        e = None
    if e is not None:
        assert math.isfinite(e) and e > 0
        assert acc.get_delta(e) <= delta


def test_extreme_settings_are_ordered_and_sound():
    q = 256 / 60000
    e_big = PLDAccountant().compose(PoissonSampledEvent(q, GaussianEvent(1.1)), count=10**6).get_epsilon(1e-5)
    e_small = PLDAccountant().compose(PoissonSampledEvent(q, GaussianEvent(1.1)), count=10**5).get_epsilon(1e-5)
    assert e_big > e_small > 0
    big = PLDAccountant().compose(GaussianEvent(0.3), count=10**6)
    with_lap = PLDAccountant().compose(GaussianEvent(0.3), count=10**6).compose(LaplaceEvent(1.0))
    assert with_lap.get_epsilon(1e-5) >= big.get_epsilon(1e-5) == pytest.approx(gauss_eps(1e-5, 0.3e-3), rel=1e-9)
    e100 = PLDAccountant(1e-3).compose(PoissonSampledEvent(0.1, GaussianEvent(0.6)), count=1000).get_epsilon(1e-5)
    ref = dpa_epsilon(
        dp_accounting.SelfComposedDpEvent(
            dp_accounting.PoissonSampledDpEvent(0.1, dp_accounting.GaussianDpEvent(0.6)), 1000
        ),
        1e-5,
        1e-3,
    )
    assert e100 == pytest.approx(ref, rel=1e-3) and e100 > 50


def test_monotone_in_epsilon_and_delta():
    acc = (
        PLDAccountant()
        .compose(PoissonSampledEvent(0.05, GaussianEvent(0.9)), count=300)
        .compose(LaplaceEvent(5.0), count=3)
    )
    ds = [acc.get_delta(float(e)) for e in np.linspace(0, 6, 25)]
    assert all(a >= b for a, b in zip(ds, ds[1:], strict=False))
    es = [acc.get_epsilon(d) for d in (1e-2, 1e-4, 1e-6, 1e-8)]
    assert all(a <= b for a, b in zip(es, es[1:], strict=False))
    for d, e in zip((1e-2, 1e-4, 1e-6, 1e-8), es, strict=True):
        assert acc.get_delta(e) <= d


def test_non_private_randomized_response_is_infinite():
    acc = PLDAccountant(neighbours="replace").compose(RandomizedResponseEvent(p_truth=1.0, k=2))
    assert acc.get_epsilon(0.5) == math.inf and acc.get_delta(10.0) == 1.0


# ------------------------------------------------------------------------------ bad inputs


@pytest.mark.parametrize("h", [0, -1e-4, math.nan, math.inf, 2.0, True, "1e-4", None])
def test_bad_discretisation_interval(h):
    with pytest.raises(InvalidParameterError) as info:
        PLDAccountant(value_discretization_interval=h)
    assert info.value.name == "value_discretization_interval"


def test_bad_neighbours():
    with pytest.raises(InvalidParameterError):
        PLDAccountant(neighbours="add")  # type: ignore[arg-type]


@pytest.mark.parametrize("delta", [-0.1, 1.0, 1.5, math.nan, math.inf, "0.1"])
def test_bad_delta(delta):
    acc = PLDAccountant().compose(LaplaceEvent(1.0))
    with pytest.raises(InvalidParameterError) as info:
        acc.get_epsilon(delta)
    assert info.value.name == "delta"


@pytest.mark.parametrize("eps", [-0.5, math.nan, math.inf, None])
def test_bad_epsilon(eps):
    acc = PLDAccountant().compose(LaplaceEvent(1.0))
    with pytest.raises(InvalidParameterError) as info:
        acc.get_delta(eps)
    assert info.value.name == "epsilon"


@pytest.mark.parametrize("count", [0, -3, 1.5, True, "2"])
def test_bad_count(count):
    with pytest.raises(InvalidParameterError) as info:
        PLDAccountant().compose(LaplaceEvent(1.0), count=count)
    assert info.value.name == "count"


def _state(acc: PLDAccountant) -> tuple:
    return dict(acc._counts), acc.get_epsilon(1e-6), acc.get_delta(0.5)


UNSUPPORTED = [
    SampledWithoutReplacementEvent(100, 10, GaussianEvent(1.0)),
    PoissonSampledEvent(0.1, PureDPEvent(1.0)),
    PoissonSampledEvent(0.1, SelfComposedEvent(GaussianEvent(1.0), 2)),
    RandomizedResponseEvent(p_truth=0.75, k=2, neighbours="add_remove"),  # RR needs 'replace'
    RandomizedResponseEvent(p_truth=1.5, k=2, neighbours="add_remove"),
    ComposedEvent((GaussianEvent(1.0), LaplaceEvent(1.0), SampledWithoutReplacementEvent(10, 2, LaplaceEvent(1.0)))),
    "not an event",
]


@pytest.mark.parametrize("event", UNSUPPORTED, ids=lambda e: type(e).__name__)
def test_unsupported_event_leaves_the_accountant_unchanged(event):
    acc = PLDAccountant().compose(PoissonSampledEvent(0.01, GaussianEvent(1.0)), count=10)
    before = _state(acc)
    assert not acc.supports(event)  # type: ignore[arg-type]
    with pytest.raises(InvalidParameterError) as info:
        acc.compose(event)  # type: ignore[arg-type]
    assert info.value.name == "event"
    assert _state(acc) == before


@pytest.mark.parametrize(
    ("acc_nb", "event"),
    [
        ("add_remove", GaussianEvent(1.0, neighbours="replace")),
        ("add_remove", ComposedEvent((LaplaceEvent(1.0), LaplaceEvent(2.0, neighbours="replace")))),
        ("replace", LaplaceEvent(1.0)),
        ("add_remove", RandomizedResponseEvent(p_truth=0.75, k=2)),
        ("replace", PoissonSampledEvent(0.1, GaussianEvent(1.0, neighbours="replace"))),
        ("add_remove", PoissonSampledEvent(0.1, GaussianEvent(1.0, neighbours="replace"))),
        ("add_remove", PureDPEvent(1.0, neighbours="replace")),
    ],
)
def test_neighbour_mismatch_raises_and_records_nothing(acc_nb, event):
    acc = PLDAccountant(neighbours=acc_nb).compose(LaplaceEvent(2.0, neighbours=acc_nb))
    before = _state(acc)
    with pytest.raises(InvalidParameterError, match="neighbours|replace|add_remove") as info:
        acc.compose(event)
    assert info.value.name == "event"
    assert _state(acc) == before


def test_supported_events_under_replace():
    acc = PLDAccountant(neighbours="replace")
    for ev in (
        GaussianEvent(2.0, neighbours="replace"),
        LaplaceEvent(1.0, neighbours="replace"),
        RandomizedResponseEvent(0.7, 3),
        PureDPEvent(0.3, neighbours="replace"),
        ApproxDPEvent(0.3, 1e-9, neighbours="replace"),
        ExponentialEvent(0.2, neighbours="replace"),
    ):
        assert acc.supports(ev)
        acc.compose(ev)
    assert math.isfinite(acc.get_epsilon(1e-6))


def test_no_warnings_escape():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        acc = PLDAccountant(1e-3)
        acc.compose(PoissonSampledEvent(0.3, LaplaceEvent(0.05)), count=7)
        acc.compose(PoissonSampledEvent(1e-9, GaussianEvent(50.0)), count=3)
        acc.get_epsilon(1e-9)
        acc.get_delta(0.0)
        acc.get_delta(1e6)
