"""Tests for dpkit.accounting.composition: the composition theorems and BasicAccountant.

Every theorem is checked against a value computed by hand (the arithmetic is in the comment) or
independently of dpkit: the formulas at 50 significant digits with mpmath, the optimal composition
by brute-force enumeration of the Kairouz–Oh–Viswanath worst-case mechanism, and dp_accounting's
own implementation of KOV Thm 3.3 (a test-only dependency). Every rounded result must be an upper
bound on the exact value and within a few ulps of it.
"""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import mpmath
import numpy as np
import pytest

from dpkit.accounting.accountant import Accountant
from dpkit.accounting.composition import (
    BasicAccountant,
    advanced_composition,
    advanced_composition_simple,
    basic_composition,
    group_privacy,
    optimal_homogeneous_composition,
    parallel_composition,
    post_processing,
)
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
from dpkit.accounting.rounding import to_float_up
from dpkit.errors import InvalidParameterError

MP_PREC = 180  # 50 decimal digits

NAN, INF = float("nan"), float("inf")
BAD_EPSILONS = [0, 0.0, -1.0, NAN, INF, True, "1", None]
BAD_DELTAS = [-0.1, 1.0, 1.5, NAN, INF, "0", None]
BAD_KS = [0, -1, 1.5, 2.0, True, "3", None]


def assert_upper(got: float, exact: mpmath.mpf, rel: float = 1e-14) -> None:
    """got is a valid (upward) bound on exact, and close to it."""
    assert mpmath.mpf(got) >= exact, (got, exact)
    assert mpmath.mpf(got) <= exact * (1 + mpmath.mpf(rel)) + mpmath.mpf(1e-300), (got, exact)


def raises_naming(name: str):
    class _Ctx:
        def __enter__(self):
            self.cm = pytest.raises(InvalidParameterError)
            self.info = self.cm.__enter__()
            return self.info

        def __exit__(self, *exc):
            out = self.cm.__exit__(*exc)
            assert self.info.value.name == name, (self.info.value.name, name)
            assert name in str(self.info.value)
            return out

    return _Ctx()


# ------------------------------------------------------------------------------------------------
# basic, parallel, post-processing
# ------------------------------------------------------------------------------------------------


def test_basic_composition_adds_hand_computed():
    # 0.5 + 0.25 + 0.25 = 1.0 (all exact in binary); 1e-6 + 0 + 1e-6 = 2e-6.
    assert basic_composition([(0.5, 1e-6), (0.25, 0.0), (0.25, 1e-6)]) == (1.0, 2e-06)
    assert basic_composition(guarantees=[(1.0, 0.0)]) == (1.0, 0.0)


def test_basic_composition_rounds_up_not_to_nearest():
    # The double 0.1 is 0.1000000000000000055511…; ten of them sum to 1.000000000000000055511…,
    # which is above 1.0: float summation gives 0.9999999999999999 (understated), nearest
    # rounding of the exact sum gives 1.0 (still below), the upward rounding gives 1 + 2^-52.
    assert sum([0.1] * 10) == 0.9999999999999999
    eps, _ = basic_composition([(0.1, 0.0)] * 10)
    exact = 10 * Fraction(0.1)
    assert Fraction(eps) >= exact
    assert eps == to_float_up(exact) == 1.0000000000000002
    # Same for δ: 3 × the double 1e-7 is above the double nearest to it.
    _, dlt = basic_composition([(1.0, 1e-7)] * 3)
    assert Fraction(dlt) >= 3 * Fraction(1e-7) and dlt == to_float_up(3 * Fraction(1e-7))


def test_basic_composition_random_inputs_never_understate():
    rng = np.random.default_rng(1)
    for _ in range(200):
        n = int(rng.integers(1, 30))
        pairs = [(float(e), float(d)) for e, d in zip(rng.uniform(1e-3, 3, n), rng.uniform(0, 1e-3, n), strict=True)]
        eps, dlt = basic_composition(pairs)
        exact_e = sum(Fraction(e) for e, _ in pairs)
        exact_d = sum(Fraction(d) for _, d in pairs)
        assert Fraction(eps) >= exact_e and eps == to_float_up(exact_e)
        assert Fraction(dlt) >= exact_d and dlt == to_float_up(exact_d)


def test_basic_composition_caps_delta_at_one():
    assert basic_composition([(1.0, 0.6), (1.0, 0.6)]) == (2.0, 1.0)


def test_numpy_inputs_are_accepted():
    arr = np.array([[0.5, 1e-6], [0.25, 0.0], [0.25, 1e-6]])
    assert basic_composition(arr) == (1.0, 2e-06)
    assert parallel_composition(arr) == (0.5, 1e-06)
    assert post_processing(np.array([1.0, 0.0])) == (1.0, 0.0)


def test_parallel_composition_takes_the_maxima():
    assert parallel_composition([(0.5, 1e-6), (1.0, 0.0), (0.25, 1e-5)]) == (1.0, 1e-05)
    assert parallel_composition(guarantees=[(0.3, 0.0)]) == (0.3, 0.0)


def test_parallel_composition_documents_the_disjointness_requirement():
    doc = parallel_composition.__doc__
    assert "one record changes at most one part" in doc and "replace" in doc and "add_remove" in doc


def test_post_processing_returns_the_guarantee_unchanged():
    assert post_processing((1.0, 1e-6)) == (1.0, 1e-6)
    assert post_processing(guarantee=[0.5, 0]) == (0.5, 0.0)


@pytest.mark.parametrize("fn", [basic_composition, parallel_composition])
def test_sequence_functions_validate(fn):
    for bad in ([], (), "ab", None, 1.0, {"a": 1}):
        with raises_naming("guarantees"):
            fn(bad)
    with raises_naming("guarantees[0]"):
        fn((1.0, 0.0))  # a single pair instead of a list of pairs
    with raises_naming("guarantees[1]"):
        fn([(1.0, 0.0), (1.0, 0.0, 0.0)])
    for bad in BAD_EPSILONS:
        with raises_naming("guarantees[1].epsilon"):
            fn([(1.0, 0.0), (bad, 0.0)])
    for bad in BAD_DELTAS:
        with raises_naming("guarantees[0].delta"):
            fn([(1.0, bad)])


def test_post_processing_validates():
    with raises_naming("guarantee"):
        post_processing(1.0)
    with raises_naming("guarantee.epsilon"):
        post_processing((NAN, 0.0))
    with raises_naming("guarantee.delta"):
        post_processing((1.0, 1.0))


# ------------------------------------------------------------------------------------------------
# group privacy
# ------------------------------------------------------------------------------------------------


def test_group_privacy_hand_computed_k3():
    # ε = 0.5, δ = 1e-6, k = 3: kε = 1.5; k·e^{(k−1)ε}·δ = 3·e^1·1e-6 = 8.1548454853771353…e-6.
    eps, dlt = group_privacy(epsilon=0.5, delta=1e-6, k=3)
    assert eps == 1.5
    assert_upper(dlt, 3 * mpmath.e * mpmath.mpf(1e-6))
    assert dlt == pytest.approx(8.154845485377135e-06, rel=1e-15)


def test_group_privacy_pure_and_trivial_cases():
    assert group_privacy(epsilon=0.5, delta=0.0, k=3) == (1.5, 0.0)  # DR Thm 2.2: kε
    assert group_privacy(epsilon=0.7, delta=1e-5, k=1) == (0.7, 1e-5)  # k = 1 is the guarantee itself
    # kε rounded up: 3 × the double 0.1 is above 0.30000000000000004's predecessor.
    eps, _ = group_privacy(epsilon=0.1, delta=0.0, k=3)
    assert Fraction(eps) >= 3 * Fraction(0.1) and eps == to_float_up(3 * Fraction(0.1))


@pytest.mark.parametrize("eps, delta, k", [(0.1, 1e-8, 10), (1.0, 1e-9, 5), (2.0, 1e-12, 7), (0.01, 1e-6, 100)])
def test_group_privacy_matches_high_precision(eps, delta, k):
    _, dlt = group_privacy(epsilon=eps, delta=delta, k=k)
    assert_upper(dlt, k * mpmath.exp((k - 1) * mpmath.mpf(eps)) * mpmath.mpf(delta))


def test_group_privacy_large_exponent():
    # e^{(k−1)ε} overflows a double: ε = 1, k = 702, δ = 2^-1074 (the smallest double):
    # ln δ_g = ln 702 + 701 − 1074·ln 2 = 6.5539 + 701 − 744.4401 = −36.886 → δ_g ≈ 9.5e-17.
    eps, dlt = group_privacy(epsilon=1.0, delta=5e-324, k=702)
    assert eps == 702.0
    assert_upper(dlt, 702 * mpmath.exp(701) * mpmath.mpf(2) ** -1074, rel=1e-12)
    # And when the bound exceeds 1 it is capped.
    assert group_privacy(epsilon=1.0, delta=1e-300, k=1000) == (1000.0, 1.0)
    assert group_privacy(epsilon=1.0, delta=0.1, k=5)[1] == 1.0  # 5·e^4·0.1 = 27.3 > 1


def test_group_privacy_validates():
    for bad in BAD_EPSILONS:
        with raises_naming("epsilon"):
            group_privacy(epsilon=bad, delta=0.0, k=2)
    for bad in BAD_DELTAS:
        with raises_naming("delta"):
            group_privacy(epsilon=1.0, delta=bad, k=2)
    for bad in BAD_KS:
        with raises_naming("k"):
            group_privacy(epsilon=1.0, delta=0.0, k=bad)
    assert group_privacy(epsilon=1.0, delta=0.0, k=np.int64(2)) == (2.0, 0.0)


# ------------------------------------------------------------------------------------------------
# advanced composition
# ------------------------------------------------------------------------------------------------


def drv_mp(eps, k, delta_prime):
    """DR Thm 3.20 at 50 digits: √(2k ln(1/δ'))·ε + kε(e^ε − 1)."""
    e = mpmath.mpf(eps)
    return mpmath.sqrt(2 * k * mpmath.log(1 / mpmath.mpf(delta_prime))) * e + k * e * mpmath.expm1(e)


def test_advanced_composition_hand_computed():
    # ε = 0.1, k = 100, δ' = 1e-5:
    #   ln(1/δ') = ln(1e5) = 11.512925464970229
    #   √(2·100·11.512925464970229) = √2302.5850929940457 = 47.985259…  → ×0.1 = 4.7985259…
    #   k·ε·(e^ε − 1) = 100·0.1·0.10517091807564763 = 1.0517091807564763
    #   ε' = 4.7985259… + 1.0517092… = 5.8502351 (against basic composition's kε = 10)
    eps, dlt = advanced_composition(epsilon=0.1, delta=0.0, k=100, delta_prime=1e-5)
    assert eps == pytest.approx(5.850235092944558, rel=1e-15)
    assert_upper(eps, drv_mp(0.1, 100, 1e-5))
    assert dlt == 1e-5
    # δ_total = kδ + δ' = 100·1e-7 + 1e-5 = 2e-5, exactly summed, rounded up.
    _, dlt = advanced_composition(epsilon=0.1, delta=1e-7, k=100, delta_prime=1e-5)
    assert Fraction(dlt) >= 100 * Fraction(1e-7) + Fraction(1e-5) and dlt == pytest.approx(2e-5, rel=1e-15)


@pytest.mark.parametrize("eps", [1e-4, 0.01, 0.1, 0.5, 1.0, 3.0])
@pytest.mark.parametrize("k", [1, 10, 100, 10_000])
@pytest.mark.parametrize("delta_prime", [1e-12, 1e-5, 0.1, 0.9])
def test_advanced_composition_matches_high_precision(eps, k, delta_prime):
    got, _ = advanced_composition(epsilon=eps, delta=0.0, k=k, delta_prime=delta_prime)
    assert_upper(got, drv_mp(eps, k, delta_prime), rel=1e-13)


def test_advanced_beats_basic_only_for_large_k():
    # Exact DRV < kε  ⟺  √(2kL)ε + kε(e^ε − 1) < kε  ⟺  k > 2L/(2 − e^ε)², L = ln(1/δ').
    # ε = 0.1, δ' = 1e-5: 2·11.5129/(2 − 1.10517)² = 23.0259/0.80072 = 28.76 → from k = 29 on.
    for k, better in [(28, False), (29, True), (100, True)]:
        adv, _ = advanced_composition(epsilon=0.1, delta=0.0, k=k, delta_prime=1e-5)
        assert (adv < k * 0.1) is better
    # Simplified: 2ε√(2kL) < kε  ⟺  k > 8L = 92.10 (seed 004: basic wins for small k).
    for k, better in [(92, False), (93, True)]:
        simple, _ = advanced_composition_simple(epsilon=0.1, delta=0.0, k=k, delta_prime=1e-5)
        assert (simple < k * 0.1) is better


def test_advanced_composition_simple_hand_computed():
    # 2ε√(2k ln(1/δ')) = 2·0.1·47.985259… = 9.5970518; valid since e^0.1 − 1 = 0.105 <=
    # √(2·11.5129/100) = 0.4799.
    eps, dlt = advanced_composition_simple(epsilon=0.1, delta=0.0, k=100, delta_prime=1e-5)
    assert eps == pytest.approx(9.597051824376163, rel=1e-15)
    assert_upper(
        eps, 2 * mpmath.mpf(0.1) * mpmath.sqrt(200 * mpmath.log(mpmath.mpf(10) ** 5 / (mpmath.mpf(1e-5) * 10**5)))
    )
    assert dlt == 1e-5


def test_advanced_composition_simple_refuses_when_not_implied():
    # ε = 1, k = 100, δ' = 1e-5: e − 1 = 1.718 > 0.4799, so 2ε√(2k ln(1/δ')) = 95.97 is below the
    # exact bound 47.99 + 100·1.718 = 219.8: the notes' formula would understate the loss.
    with raises_naming("epsilon") as info:
        advanced_composition_simple(epsilon=1.0, delta=0.0, k=100, delta_prime=1e-5)
    assert "advanced_composition" in str(info.value) and "understate" in str(info.value)


def test_advanced_composition_simple_condition_boundary():
    # The simplified bound is implied iff e^ε − 1 <= √(2 ln(1/δ')/k).
    k, dp = 400, 1e-6
    limit = math.log1p(math.sqrt(2 * math.log(1 / dp) / k))
    advanced_composition_simple(epsilon=limit * (1 - 1e-9), delta=0.0, k=k, delta_prime=dp)
    with raises_naming("epsilon"):
        advanced_composition_simple(epsilon=limit * (1 + 1e-9), delta=0.0, k=k, delta_prime=dp)


@pytest.mark.parametrize("fn", [advanced_composition, advanced_composition_simple])
def test_advanced_composition_validates(fn):
    ok = dict(epsilon=0.1, delta=0.0, k=10, delta_prime=1e-5)
    for bad in BAD_EPSILONS:
        with raises_naming("epsilon"):
            fn(**{**ok, "epsilon": bad})
    for bad in BAD_DELTAS:
        with raises_naming("delta"):
            fn(**{**ok, "delta": bad})
    for bad in BAD_KS:
        with raises_naming("k"):
            fn(**{**ok, "k": bad})
    for bad in [0.0, 1.0, -1e-5, NAN, None]:
        with raises_naming("delta_prime"):
            fn(**{**ok, "delta_prime": bad})


# ------------------------------------------------------------------------------------------------
# optimal homogeneous composition (KOV 2015, Thm 3.3)
# ------------------------------------------------------------------------------------------------


def kov_total_mp(eps, delta, k, i):
    """KOV Thm 3.3 at 50 digits: 1 − (1−δ)^k (1 − δ_i)."""
    e = mpmath.mpf(eps)
    # Σ_{l<i} C(k,l)(e^{(k−l)ε} − e^{(k−2i+l)ε}), with C, and both powers, updated term by term
    # (fast even for k = 10^4 at 50 digits).
    binom, up, down, step = mpmath.mpf(1), mpmath.exp(k * e), mpmath.exp((k - 2 * i) * e), mpmath.exp(e)
    d_i = mpmath.mpf(0)
    for j in range(i):
        d_i += binom * (up - down)
        binom, up, down = binom * (k - j) / (j + 1), up / step, down * step
    d_i /= (1 + step) ** k
    return 1 - (1 - mpmath.mpf(delta)) ** k * (1 - d_i)


def brute_force_hockey_stick(eps, delta, k, eps_g):
    """sup_S P^k(S) − e^{ε_g} Q^k(S) for the KOV worst-case 4-outcome pair, by enumerating 4^k
    outcomes: P = (δ, (1−δ)e^ε/(1+e^ε), (1−δ)/(1+e^ε), 0), Q = P reversed."""
    e, d = mpmath.mpf(eps), mpmath.mpf(delta)
    mid = (1 - d) / (1 + mpmath.exp(e))
    p = [d, mid * mpmath.exp(e), mid, mpmath.mpf(0)]
    q = p[::-1]
    total = mpmath.mpf(0)
    scale = mpmath.exp(mpmath.mpf(eps_g))
    for outcome in itertools.product(range(4), repeat=k):
        pp = mpmath.fprod(p[o] for o in outcome)
        qq = mpmath.fprod(q[o] for o in outcome)
        total += max(pp - scale * qq, 0)
    return total


@pytest.mark.parametrize("eps, delta, k", [(0.5, 0.0, 4), (1.0, 0.0, 5), (0.3, 1e-3, 4), (2.0, 1e-2, 3), (0.1, 0.0, 2)])
def test_optimal_composition_against_brute_force(eps, delta, k):
    grid = [(k - 2 * i) * eps for i in range(k // 2 + 1)]
    brute = [brute_force_hockey_stick(eps, delta, k, g) for g in grid]
    # The theorem's total δ is exactly the worst case's hockey-stick divergence at each ε_g.
    for i, b in enumerate(brute):
        assert abs(b - kov_total_mp(eps, delta, k, i)) <= mpmath.mpf(10) ** -40
    assert all(a < b for a, b in zip(brute, brute[1:], strict=False))  # the total δ grows as ε_g shrinks
    for i, b in enumerate(brute):
        # Just above the i-th total δ: ε_g = (k − 2i)ε is achievable (and the next one is not).
        got = optimal_homogeneous_composition(
            epsilon=eps, delta=delta, k=k, delta_total=float(b * (1 + mpmath.mpf(1e-9)))
        )
        assert got == pytest.approx(grid[i], rel=1e-15) and got >= grid[i]
        if i > 0:  # just below it: only the previous grid point
            got = optimal_homogeneous_composition(
                epsilon=eps, delta=delta, k=k, delta_total=float(b * (1 - mpmath.mpf(1e-9)))
            )
            assert got == pytest.approx(grid[i - 1], rel=1e-15)


def test_optimal_composition_hand_computed_small_case():
    # ε = ln 2, δ = 0, k = 2: e^ε = 2, (1 + e^ε)^2 = 9.
    #   i = 1: δ_1 = C(2,0)(e^{2ε} − e^{0}) / 9 = (4 − 1)/9 = 1/3, so (0, 1/3)-DP.
    #   i = 0: (2ε, 0) = (2 ln 2, 0).
    eps = math.log(2)
    assert optimal_homogeneous_composition(epsilon=eps, delta=0.0, k=2, delta_total=0.34) == 0.0
    assert optimal_homogeneous_composition(epsilon=eps, delta=0.0, k=2, delta_total=0.33) == pytest.approx(
        2 * eps, rel=1e-15
    )


@pytest.mark.parametrize("eps", [0.01, 0.1, 0.5, 1.0])
@pytest.mark.parametrize("delta", [0.0, 1e-7])
@pytest.mark.parametrize("k", [1, 2, 7, 30, 100, 400])
@pytest.mark.parametrize("delta_total", [1e-3, 1e-5, 1e-9])
def test_optimal_composition_matches_dp_accounting(eps, delta, k, delta_total):
    from dp_accounting.pld import accountant, common

    ref = accountant.advanced_composition(common.DifferentialPrivacyParameters(eps, delta), k, delta_total)
    if ref is None:
        with raises_naming("delta_total"):
            optimal_homogeneous_composition(epsilon=eps, delta=delta, k=k, delta_total=delta_total)
        return
    got = optimal_homogeneous_composition(epsilon=eps, delta=delta, k=k, delta_total=delta_total)
    assert got == pytest.approx(ref, rel=1e-12)


@pytest.mark.parametrize(
    "eps, delta, k, delta_total",
    [(0.01, 0.0, 10_000, 1e-5), (0.1, 1e-9, 10_000, 1e-4), (0.001, 0.0, 10_000, 1e-6), (1.0, 0.0, 3_000, 1e-6)],
)
def test_optimal_composition_large_k_is_the_exact_grid_point(eps, delta, k, delta_total):
    # For k = 10^4 dp_accounting's float loop overflows; check the chosen i against 50-digit sums:
    # the total δ at i is <= delta_total and at i + 1 it is not.
    got = optimal_homogeneous_composition(epsilon=eps, delta=delta, k=k, delta_total=delta_total)
    i = round((k - got / eps) / 2)
    assert got == pytest.approx((k - 2 * i) * eps, rel=1e-14) and Fraction(got) >= (k - 2 * i) * Fraction(eps)
    assert kov_total_mp(eps, delta, k, i) <= delta_total
    assert kov_total_mp(eps, delta, k, i + 1) > delta_total


@pytest.mark.parametrize("eps", [0.001, 0.01, 0.1, 0.3])
@pytest.mark.parametrize("k", [100, 1000, 10_000])
@pytest.mark.parametrize("delta_prime", [1e-9, 1e-5])
def test_optimal_le_exact_advanced_le_simple_le_basic(eps, k, delta_prime):
    opt = optimal_homogeneous_composition(epsilon=eps, delta=0.0, k=k, delta_total=delta_prime)
    adv, _ = advanced_composition(epsilon=eps, delta=0.0, k=k, delta_prime=delta_prime)
    assert opt <= adv
    assert opt <= to_float_up(k * Fraction(eps))  # never worse than basic composition
    try:
        simple, _ = advanced_composition_simple(epsilon=eps, delta=0.0, k=k, delta_prime=delta_prime)
    except InvalidParameterError:
        return
    assert adv <= simple


def test_optimal_composition_is_k_epsilon_for_tiny_delta_total():
    # δ_1 = (e^{kε} − e^{(k−2)ε})/(1+e^ε)^k; for ε = 1, k = 10 that is 1.4e-3·… ≈ 1.23e-2 ≫ 1e-12.
    assert optimal_homogeneous_composition(epsilon=1.0, delta=0.0, k=10, delta_total=1e-12) == 10.0
    assert optimal_homogeneous_composition(epsilon=1.0, delta=0.0, k=10, delta_total=0.0) == 10.0
    # With δ > 0, the smallest δ_total is 1 − (1 − δ)^k; here 1 − (1 − 1e-6)^10 ≈ 9.99996e-6.
    assert optimal_homogeneous_composition(epsilon=1.0, delta=1e-6, k=10, delta_total=1e-5) == 10.0


def test_optimal_composition_refuses_too_small_delta_total():
    with raises_naming("delta_total") as info:
        optimal_homogeneous_composition(epsilon=1.0, delta=1e-6, k=10, delta_total=9.9e-6)
    assert "1 − (1 − delta)^k" in str(info.value)


def test_optimal_composition_validates():
    ok = dict(epsilon=0.1, delta=0.0, k=10, delta_total=1e-5)
    for bad in BAD_EPSILONS:
        with raises_naming("epsilon"):
            optimal_homogeneous_composition(**{**ok, "epsilon": bad})
    for bad in BAD_DELTAS:
        with raises_naming("delta"):
            optimal_homogeneous_composition(**{**ok, "delta": bad})
    for bad in BAD_KS:
        with raises_naming("k"):
            optimal_homogeneous_composition(**{**ok, "k": bad})
    for bad in BAD_DELTAS:
        with raises_naming("delta_total"):
            optimal_homogeneous_composition(**{**ok, "delta_total": bad})


# ------------------------------------------------------------------------------------------------
# BasicAccountant
# ------------------------------------------------------------------------------------------------


def test_basic_accountant_is_an_accountant():
    assert isinstance(BasicAccountant(), Accountant)


def test_basic_accountant_hand_computed():
    # Laplace ε = 0.5 (exact 1/multiplier) + 2 × (0.25, 1e-6) = (1.0, 2e-6).
    acc = BasicAccountant()
    assert acc.compose(LaplaceEvent.for_epsilon(0.5)) is acc
    acc.compose(ApproxDPEvent(0.25, 1e-6), count=2)
    assert (acc.epsilon, acc.delta) == (1.0, 2e-06)
    assert acc.neighbours == "add_remove"
    assert acc.get_epsilon(delta=2e-6) == 1.0 and acc.get_epsilon(delta=1e-5) == 1.0
    assert acc.get_epsilon(delta=1e-6) == INF
    assert acc.get_delta(epsilon=1.0) == 2e-06 and acc.get_delta(epsilon=2.0) == 2e-06
    assert acc.get_delta(epsilon=0.99) == 1.0


def test_basic_accountant_empty():
    acc = BasicAccountant()
    assert (acc.epsilon, acc.delta, acc.neighbours) == (0.0, 0.0, None)
    assert acc.get_epsilon(0.0) == 0.0 and acc.get_delta(0.0) == 0.0


def test_basic_accountant_reads_epsilon_at_its_decimal_value():
    # 10 × ε = 0.1 is exactly 1: an ε is the decimal it prints as (1/10), not the double's binary
    # value 0.1000000000000000055…, whose ten-fold sum would round up to 1 + 2^-52.
    for event in (PureDPEvent(0.1), ExponentialEvent(0.1), LaplaceEvent.for_epsilon(0.1), ApproxDPEvent(0.1, 1e-7)):
        acc = BasicAccountant().compose(event, count=10)
        assert acc._exact_epsilon(1e-6) == 1
        assert acc.epsilon == 1.0
    acc = BasicAccountant()
    for _ in range(10):
        acc.compose(PureDPEvent(0.1))
    assert acc.epsilon == 1.0  # the same, however it is split up
    # A decimal above its double (0.3 > the double 0.29999999999999998…) is charged in full.
    acc = BasicAccountant().compose(PureDPEvent(0.3), count=3)
    assert acc._exact_epsilon(0.0) == Fraction(9, 10) > 3 * Fraction(0.3)
    assert Fraction(acc.epsilon) >= Fraction(9, 10)


def test_basic_accountant_rounding_never_understates():
    # Laplace ε is taken as exactly 1/noise_multiplier: 3 × 1/3 = 1 exactly (summing the rounded-up
    # event.epsilon would give 1 + 2^-52, valid but looser).
    assert BasicAccountant().compose(LaplaceEvent(noise_multiplier=3.0), count=3).epsilon == 1.0
    rng = np.random.default_rng(7)
    acc, exact = BasicAccountant(), Fraction(0)
    for e in rng.uniform(0.001, 2.0, 300):
        acc.compose(PureDPEvent(float(e)))
        exact += Fraction(repr(float(e)))  # the decimal value every ε is read at
        assert Fraction(acc.epsilon) >= exact and acc.epsilon == to_float_up(exact)


def test_basic_accountant_randomized_response_epsilon():
    # p = 0.75, k = 2: ε = ln(0.75·1/0.25) = ln 3 = 1.0986122886681098.
    acc = BasicAccountant().compose(RandomizedResponseEvent(p_truth=0.75))
    assert acc.neighbours == "replace"
    assert_upper(acc.epsilon, mpmath.log(3), rel=1e-15)
    # p = 0.5, k = 4: ε = ln(0.5·3/0.5) = ln 3; p = 0.25, k = 2 (favours the lie): |ln(1/3)| = ln 3.
    for p, k in [(0.5, 4), (0.25, 2)]:
        assert_upper(
            BasicAccountant().compose(RandomizedResponseEvent(p_truth=p, k=k)).epsilon, mpmath.log(3), rel=1e-15
        )
    # ε close to 0 (p just above 1/2) is still an upper bound on the exact log of the double p.
    p = 0.5 + 1e-9
    exact = mpmath.log(mpmath.mpf(p) / (1 - mpmath.mpf(p)))
    assert_upper(BasicAccountant().compose(RandomizedResponseEvent(p_truth=p)).epsilon, exact, rel=1e-12)


def test_basic_accountant_rejects_degenerate_randomized_response():
    for p in (1.0, 0.0, 1.5, NAN):
        acc = BasicAccountant()
        assert not acc.supports(RandomizedResponseEvent(p_truth=p))
        with raises_naming("event"):
            acc.compose(RandomizedResponseEvent(p_truth=p))
        assert acc.epsilon == 0.0


def test_basic_accountant_nested_events():
    # 2 × [3 × 0.1 + (0.2, 1e-6) + Laplace ε=0.25] = 2 × (0.3 + 0.2 + 0.25, 1e-6) = (1.5, 2e-6)
    inner = ComposedEvent(
        [SelfComposedEvent(PureDPEvent(0.1), 3), ComposedEvent([ApproxDPEvent(0.2, 1e-6)]), LaplaceEvent(4.0)]
    )
    acc = BasicAccountant()
    assert acc.supports(inner) and acc.supports(SelfComposedEvent(inner, 5))
    acc.compose(inner, count=2)
    exact_eps = 2 * (3 * Fraction("0.1") + Fraction("0.2") + Fraction(1, 4))  # ε at decimal values
    assert exact_eps == Fraction(3, 2) and acc.epsilon == 1.5
    assert acc.delta == to_float_up(2 * Fraction(1e-6))
    acc.compose(SelfComposedEvent(SelfComposedEvent(ExponentialEvent(0.5), 2), 3))  # + 6 × 0.5
    assert acc.epsilon == to_float_up(exact_eps + 3)
    assert BasicAccountant().compose(ComposedEvent([])).epsilon == 0.0


@pytest.mark.parametrize(
    "event",
    [
        GaussianEvent(1.0),
        PoissonSampledEvent(0.01, LaplaceEvent(1.0)),
        SampledWithoutReplacementEvent(100, 10, PureDPEvent(1.0)),
        ComposedEvent([PureDPEvent(1.0), GaussianEvent(2.0)]),
        SelfComposedEvent(ComposedEvent([GaussianEvent(2.0)]), 3),
        DPEvent(),
    ],
)
def test_basic_accountant_unsupported_events_raise_and_record_nothing(event):
    acc = BasicAccountant().compose(PureDPEvent(0.5))
    assert not acc.supports(event)
    with raises_naming("event") as info:
        acc.compose(event)
    assert "RDPAccountant or PLDAccountant" in str(info.value)
    assert (acc.epsilon, acc.delta, acc.neighbours) == (0.5, 0.0, "add_remove")
    fresh = BasicAccountant()
    with raises_naming("event"):
        fresh.compose(event)
    assert fresh.neighbours is None  # a failed compose does not fix the relation


def test_basic_accountant_rejects_non_events():
    for bad in ("laplace", None, (1.0, 0.0), 3):
        assert not BasicAccountant().supports(bad)
        with raises_naming("event"):
            BasicAccountant().compose(bad)


def test_basic_accountant_neighbour_mismatch_raises():
    acc = BasicAccountant().compose(LaplaceEvent(1.0))  # add_remove fixes the relation
    before = (acc.epsilon, acc.delta)
    with raises_naming("event") as info:
        acc.compose(RandomizedResponseEvent(p_truth=0.75))  # replace
    assert "add_remove" in str(info.value)
    with raises_naming("event"):
        acc.compose(ComposedEvent([PureDPEvent(1.0), PureDPEvent(1.0, neighbours="replace")]))
    assert (acc.epsilon, acc.delta) == before
    # A relation fixed at construction.
    acc = BasicAccountant(neighbours="replace")
    with raises_naming("event"):
        acc.compose(LaplaceEvent(1.0))
    assert acc.epsilon == 0.0
    acc.compose(LaplaceEvent(1.0, neighbours="replace"))
    assert acc.epsilon == 1.0
    # A single event mixing relations fails even on a fresh accountant, fixing nothing.
    fresh = BasicAccountant()
    with raises_naming("event"):
        fresh.compose(ComposedEvent([RandomizedResponseEvent(0.75), SelfComposedEvent(PureDPEvent(1.0), 2)]))
    assert fresh.neighbours is None and fresh.epsilon == 0.0


def test_basic_accountant_validates_neighbours():
    with raises_naming("neighbours"):
        BasicAccountant(neighbours="bounded")
    with raises_naming("event.neighbours"):
        BasicAccountant().compose(PureDPEvent(1.0, neighbours="everything"))


@pytest.mark.parametrize("bad", [0, -1, 1.5, 2.0, True, "2", None])
def test_basic_accountant_count_validation(bad):
    acc = BasicAccountant()
    with raises_naming("count"):
        acc.compose(PureDPEvent(1.0), count=bad)
    assert acc.epsilon == 0.0 and acc.neighbours is None


def test_basic_accountant_count_accepts_numpy_ints():
    assert BasicAccountant().compose(PureDPEvent(0.5), count=np.int64(4)).epsilon == 2.0


def test_basic_accountant_getters_validate():
    acc = BasicAccountant().compose(PureDPEvent(1.0))
    for bad in (-0.1, 1.0, NAN, None, "0"):
        with raises_naming("delta"):
            acc.get_epsilon(bad)
    for bad in (-0.1, NAN, INF, None, "1"):
        with raises_naming("epsilon"):
            acc.get_delta(bad)


def test_basic_accountant_delta_is_capped():
    acc = BasicAccountant().compose(ApproxDPEvent(1.0, 0.6), count=2)
    assert acc.delta == 1.0 and acc.get_epsilon(0.99) == INF and acc.get_delta(5.0) == 1.0
