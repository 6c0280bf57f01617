"""Exact uniform integers and rational Bernoulli trials."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from _stats import ALPHA, binomial_z, chi2_pvalue
from dpkit.errors import InvalidParameterError
from dpkit.noise import bernoulli, uniform_below


@pytest.mark.parametrize("d", [1, 2, 3, 6, 7, 1000, 2**20])
def test_uniform_below_is_uniform(d: int) -> None:
    x = uniform_below(d, 600_000, rng=np.random.default_rng(d))
    assert x.min() >= 0 and x.max() < d
    if 1 < d <= 1000:
        support = np.arange(d)
        assert chi2_pvalue(x, support, np.ones(d), min_expected=0) > ALPHA


def test_uniform_below_large_modulus_has_the_right_mean() -> None:
    d = 2**62 + 12345  # rejection matters most near 2^63: the top block is large
    x = uniform_below(d, 200_000, rng=np.random.default_rng(1)).astype(float)
    assert x.max() < d
    # mean d/2, sd d/sqrt(12 n): 6 sigma, false failure ~2e-9
    assert abs(x.mean() / d - 0.5) < 6 / np.sqrt(12 * 200_000)


def test_modulo_rejection_is_needed_and_done() -> None:
    # Power check for the rejection step: for d = 3·2^61, plain "word % d" gives residues below
    # 2^62 three preimages instead of two, so P(x < 2^62) is 3/4 instead of 2/3.
    d = 3 * 2**61
    n = 200_000
    x = uniform_below(d, n, rng=np.random.default_rng(2))
    sd = np.sqrt(2 / 9 / n)
    assert abs((x.astype(float) < 2.0**62).mean() - 2 / 3) < 6 * sd  # false failure ~2e-9
    words = np.random.default_rng(2).integers(0, 2**64 - 1, n, dtype=np.uint64, endpoint=True)
    naive = words % np.uint64(d)
    assert abs((naive.astype(float) < 2.0**62).mean() - 2 / 3) > 6 * sd  # the same check catches it


@pytest.mark.parametrize("p", [Fraction(1, 3), Fraction(2, 3), 0.1, Fraction(999, 1000)])
def test_bernoulli_has_the_exact_rate(p: Fraction | float) -> None:
    n = 1_000_000
    x = bernoulli(p, n, rng=np.random.default_rng(7))
    assert abs(binomial_z(int(x.sum()), n, float(p))) < 5.3  # false failure 1e-7


def test_bernoulli_edges() -> None:
    assert not bernoulli(0, 100).any()
    assert bernoulli(1, 100).all()


@pytest.mark.parametrize("bad", [-0.1, 1.5, float("nan"), "half", True, Fraction(1, 2**70)])
def test_bernoulli_rejects_bad_p(bad: object) -> None:
    with pytest.raises(InvalidParameterError, match="p"):
        bernoulli(bad, 10)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [0, -3, 2**63 + 1, 2.0, True])
def test_uniform_below_rejects_bad_bound(bad: object) -> None:
    with pytest.raises(InvalidParameterError, match="d"):
        uniform_below(bad, 10)  # type: ignore[arg-type]


def test_rejects_bad_size() -> None:
    with pytest.raises(InvalidParameterError, match="size"):
        uniform_below(5, -1)
    with pytest.raises(InvalidParameterError, match="size"):
        bernoulli(0.5, 2.5)  # type: ignore[arg-type]
