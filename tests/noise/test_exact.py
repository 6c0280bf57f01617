"""Certified enclosures and the lazy exact comparison used by the samplers' rare branches."""

from __future__ import annotations

from fractions import Fraction

import mpmath
import numpy as np
import pytest

from dpkit.noise._exact import exp_neg_bounds, fraction_bounds_fn, lazy_less
from dpkit.noise.bernoulli_exp import _table, exp_neg_enclosure
from dpkit.noise.source import SeededSource

MP_PREC = 600


def _exact_exp(g: Fraction) -> mpmath.mpf:
    return mpmath.exp(-mpmath.mpf(g.numerator) / g.denominator)


@pytest.mark.parametrize(
    "gamma",
    [
        Fraction(0),
        Fraction(1, 7),
        Fraction(1),
        Fraction(5, 2),
        Fraction(48),
        Fraction(2**61 + 3, 2**60),
        Fraction(10**9, 3),
    ],
)
@pytest.mark.parametrize("prec", [32, 64, 200])
def test_exp_neg_bounds_enclose_the_true_value(gamma: Fraction, prec: int) -> None:
    lo, hi = exp_neg_bounds(gamma, prec)
    true = _exact_exp(gamma) * mpmath.mpf(2) ** prec
    assert lo <= true <= hi
    assert hi - lo <= 2 or hi <= 1  # tight: two units at most


def test_float_table_is_certified() -> None:
    lo, hi = _table()
    j = np.arange(0, lo.size, 97)
    for k in j:
        true = _exact_exp(Fraction(int(k), 512))
        assert lo[k] <= true <= hi[k]


def test_enclosure_holds_on_random_points() -> None:
    rng = np.random.default_rng(0)
    g = np.concatenate([rng.uniform(0, 50, 3000), rng.uniform(0, 1e-3, 1000), np.arange(0, 48, 1 / 512)[::37]])
    err = g * 2.0**-50
    lower, upper = exp_neg_enclosure(g, err)
    for x, lo_, hi_ in zip(g, lower, upper, strict=True):
        true = mpmath.exp(-mpmath.mpf(float(x)))
        assert lo_ <= true <= hi_
    inside = g < 47
    assert np.max((upper - lower)[inside] / np.exp(-g[inside])) < 2.0**-18  # narrow: few exact lanes


def test_lazy_less_is_exact() -> None:
    src = SeededSource(np.random.default_rng(1))
    v = Fraction(1, 3)
    bounds = fraction_bounds_fn(v)
    # Prefix 0b0101 (= 5/16 = 0.3125 <= U < 0.375): U < 1/3 iff the continuation is small; the
    # probability is (1/3 - 5/16) * 16 = 1/3.
    outcomes = [lazy_less(5, 4, bounds, src)[0] for _ in range(30_000)]
    rate = float(np.mean(outcomes))
    assert abs(rate - 1 / 3) < 6 * np.sqrt(2 / 9 / 30_000)  # false failure ~2e-9
    assert lazy_less(0, 4, bounds, src)[0] is True  # U < 1/16 < 1/3
    assert lazy_less(8, 4, bounds, src)[0] is False  # U >= 1/2
