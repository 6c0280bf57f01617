"""Bernoulli(exp(−γ)) trials: exact rates, the exact branch, validation."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from _stats import binomial_z
from dpkit.errors import InvalidParameterError
from dpkit.noise import bernoulli_exp
from dpkit.noise.bernoulli_exp import decide_exp_neg
from dpkit.noise.source import SeededSource


@pytest.mark.parametrize("num,den", [(0, 1), (1, 3), (1, 1), (5, 2), (17, 4), (49, 1)])
def test_rate_is_exp_minus_gamma(num: int, den: int) -> None:
    n = 1_000_000
    x = bernoulli_exp(np.full(n, num), den, rng=np.random.default_rng(num * 10 + den))
    assert abs(binomial_z(int(x.sum()), n, float(np.exp(-num / den)))) < 5.3  # false failure 1e-7


def test_exact_branch_alone_has_the_right_rate() -> None:
    # err = 1 gives only trivial float bounds, so every lane goes through the exact branch.
    n = 4000
    src = SeededSource(np.random.default_rng(3))
    gamma = Fraction(7, 10)
    ok = decide_exp_neg(np.full(n, 0.7), 1.0, src.words(n) >> np.uint64(11), 53, lambda i: gamma, src)
    assert abs(binomial_z(int(ok.sum()), n, float(np.exp(-0.7)))) < 5.3


def test_broken_enclosure_would_be_caught() -> None:
    # Power: lying about γ (decide with γ̂ = 0.6 while the truth is 0.7) shifts the rate by 0.05,
    # which the 5.3-sigma check above detects at this sample size.
    n = 1_000_000
    src = SeededSource(np.random.default_rng(4))
    ok = decide_exp_neg(np.full(n, 0.6), 0.0, src.words(n) >> np.uint64(11), 53, lambda i: Fraction(6, 10), src)
    assert abs(binomial_z(int(ok.sum()), n, float(np.exp(-0.7)))) > 5.3


def test_shape_is_kept() -> None:
    x = bernoulli_exp(np.ones((3, 4), dtype=np.int64), 2)
    assert x.shape == (3, 4) and x.dtype == bool


@pytest.mark.parametrize(
    "num,den,name",
    [
        (-1, 1, "gamma_numerator"),
        (1, 0, "gamma_denominator"),
        (1, -2, "gamma_denominator"),
        (0.5, 1, "gamma_numerator"),
    ],
)
def test_bad_gamma_is_rejected(num: object, den: object, name: str) -> None:
    with pytest.raises(InvalidParameterError, match=name):
        bernoulli_exp(num, den)  # type: ignore[arg-type]
