"""Exactness of the discrete Laplace and discrete Gaussian samplers against their PMFs."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from _stats import ALPHA, chi2_pvalue
from dpkit.errors import InvalidParameterError
from dpkit.noise import discrete_gaussian, discrete_laplace
from dpkit.noise.discrete import _resolve_count, laplace_plan
from dpkit.noise.source import SeededSource

N = 1_000_000


def dlap_pmf(scale: float, support: np.ndarray) -> np.ndarray:
    rho = np.exp(-1.0 / scale)
    return (1 - rho) / (1 + rho) * rho ** np.abs(support)


def dgauss_pmf(sigma: float, support: np.ndarray) -> np.ndarray:
    return np.exp(-(support.astype(float) ** 2) / (2 * sigma**2))


@pytest.mark.parametrize("scale", [0.05, 0.3, 1.0, 2.5, 100.0, 1500.0, 3.0e4])
def test_discrete_laplace_matches_pmf(scale: float) -> None:
    y = discrete_laplace(scale, N, rng=np.random.default_rng(int(scale * 1000) + 1))
    eff = scale
    if scale >= 1024:  # compare on bins of width w: P(bin) from the exact pmf
        w = int(eff // 64)
        support = np.arange(-40 * int(eff), 40 * int(eff) + 1)
        pmf = dlap_pmf(eff, support)
        binned = np.bincount((support - support[0]) // w, weights=pmf)
        samples = (np.clip(y, support[0], support[-1]) - support[0]) // w
        p = chi2_pvalue(samples, np.arange(binned.size), binned)
    else:
        support = np.arange(-int(60 * eff) - 5, int(60 * eff) + 6)
        p = chi2_pvalue(y, support, dlap_pmf(eff, support))
    assert p > ALPHA


@pytest.mark.parametrize("sigma", [0.3, 1.0, 3.0, 50.0, 2000.0, 5000.5])
def test_discrete_gaussian_matches_pmf(sigma: float) -> None:
    y = discrete_gaussian(sigma, N, rng=np.random.default_rng(int(sigma * 100) + 7))
    support = np.arange(-int(12 * sigma) - 5, int(12 * sigma) + 6)
    pmf = dgauss_pmf(sigma, support)
    if sigma > 100:
        w = int(sigma // 32)
        binned = np.bincount((support - support[0]) // w, weights=pmf)
        p = chi2_pvalue((np.clip(y, support[0], support[-1]) - support[0]) // w, np.arange(binned.size), binned)
    else:
        p = chi2_pvalue(y, support, pmf)
    assert p > ALPHA


def test_huge_scales_have_the_right_spread() -> None:
    # For scale 2^40 the pmf is far too wide to tabulate: check E|Y| = 2ρ/(1−ρ²) ≈ scale and the
    # variance of the discrete Gaussian, each within 6 standard errors (false failure ~2e-9).
    scale = 2.0**40
    y = discrete_laplace(scale, N, rng=np.random.default_rng(3)).astype(float)
    assert abs(np.abs(y).mean() / scale - 1) < 6 / np.sqrt(N)
    g = discrete_gaussian(scale, N, rng=np.random.default_rng(4)).astype(float)
    assert abs(g.var() / scale**2 - 1) < 6 * np.sqrt(2 / N)


def test_broken_sampler_fails_the_same_test() -> None:
    # Power: rounding a continuous Laplace is *not* the discrete Laplace, and 5 % too much scale
    # is not either; the χ² test above must reject both.
    rng = np.random.default_rng(11)
    support = np.arange(-80, 81)
    rounded = np.rint(rng.laplace(0, 2.5, N)).astype(np.int64)
    assert chi2_pvalue(rounded, support, dlap_pmf(2.5, support)) < ALPHA
    wide = discrete_laplace(2.5 * 1.05, N, rng=rng)
    assert chi2_pvalue(wide, support, dlap_pmf(2.5, support)) < ALPHA


def test_plan_samples_the_scale_asked_for_exactly() -> None:
    for scale in [Fraction(7, 3), Fraction(1023.9), Fraction(1024), Fraction(1500.3), Fraction(2**40 + 12345, 7)]:
        plan = laplace_plan(scale)
        assert plan.scale == scale
        assert plan.hi_scale * (1 << plan.lo_bits) == scale
        assert plan.lo_bits == 0 or 512 <= plan.hi_scale < 1024


def test_exact_branch_counts_thresholds_correctly() -> None:
    # A uniform whose 32-bit prefix ties a threshold is resolved with more bits: check the rare
    # branch by feeding it prefixes just below and at a threshold.
    plan = laplace_plan(Fraction(5, 2))
    src = SeededSource(np.random.default_rng(0))
    t1 = int(plan.top.thresholds[0])
    assert _resolve_count(t1 + 1, plan.top_tail, 1, src) == 0  # above T_1: Top = 0
    # At the tie, Top >= 1 iff the remaining bits fall below the fraction part: about half/half.
    hits = [_resolve_count(t1, plan.top_tail, 1, src) for _ in range(400)]
    assert set(hits) <= {0, 1}


def test_outputs_are_int64_and_sized() -> None:
    assert discrete_laplace(1.0, 0).shape == (0,)
    y = discrete_gaussian(2.0, 17)
    assert y.dtype == np.int64 and y.shape == (17,)


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf"), 2.0**60, "1", True, 1e-9])
def test_bad_scale_is_rejected(bad: object) -> None:
    with pytest.raises(InvalidParameterError, match="scale"):
        discrete_laplace(bad, 10)  # type: ignore[arg-type]
    with pytest.raises(InvalidParameterError, match="sigma"):
        discrete_gaussian(bad, 10)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [-1, 2.5, "3", None])
def test_bad_size_is_rejected(bad: object) -> None:
    with pytest.raises(InvalidParameterError, match="size"):
        discrete_laplace(1.0, bad)  # type: ignore[arg-type]


def test_broken_gaussian_fails_the_same_test() -> None:
    # Power: 2 % too much σ, or a rounded continuous normal, must fail the χ² test used above.
    rng = np.random.default_rng(12)
    support = np.arange(-40, 41)
    wide = discrete_gaussian(3.0 * 1.02, N, rng=rng)
    assert chi2_pvalue(wide, support, dgauss_pmf(3.0, support)) < ALPHA
    rounded = np.rint(rng.normal(0, 1.0, N)).astype(np.int64)
    assert chi2_pvalue(rounded, support, dgauss_pmf(1.0, support)) < ALPHA


def test_inversion_table_counts_thresholds_above_the_uniform() -> None:
    from dpkit.noise.discrete import InversionTable

    # Two thresholds in one bucket (crowded), one alone, and the final zero.
    t = [3_000_000_000, 70_000, 69_000, 5, 0]
    table = InversionTable.build(t)
    r = np.array([3_100_000_000, 2_999_999_999, 69_500, 68_000, 6, 4, 0, 5], dtype=np.uint64)
    cnt, ties = table.count(r)
    expected = [sum(x > int(v) for x in t) for v in r]
    assert cnt.tolist() == expected
    assert ties.tolist() == [6, 7]  # R = 0 ties the final threshold, R = 5 ties T_4
