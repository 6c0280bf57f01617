"""Private key selection: the keep probabilities satisfy the (ε, δ) inequalities exactly, a key
held by one unit appears at most δ/F of the time, and broken variants are caught."""

from __future__ import annotations

import math
from fractions import Fraction

import mpmath
import numpy as np
import pytest

from _stats import binomial_z
from dpkit.analytics.key_selection import keep_probabilities, laplace_threshold, select_keys
from dpkit.audit import estimate_epsilon
from dpkit.errors import InvalidParameterError

SEED = 20261128
STRICT = 1 - 1e-6


def _exp(eps: float) -> mpmath.mpf:
    with mpmath.workdps(60):
        return mpmath.e ** mpmath.mpf(eps)


@pytest.mark.parametrize("eps, delta", [(1.0, 1e-6), (0.1, 1e-9), (3.0, 0.01), (0.5 / 3, 2e-7 / 3)])
def test_keep_probabilities_satisfy_both_dp_inequalities_exactly(eps: float, delta: float) -> None:
    pi = keep_probabilities(eps, delta)
    assert pi[0] == 0 and pi[-1] == 1 and all(a <= b for a, b in zip(pi, pi[1:], strict=False))
    with mpmath.workdps(60):
        e = _exp(eps)
        d = mpmath.mpf(Fraction(delta).numerator) / Fraction(delta).denominator
        for a, b in zip(pi, pi[1:], strict=False):
            pa, pb = mpmath.mpf(a.numerator) / a.denominator, mpmath.mpf(b.numerator) / b.denominator
            assert pb <= e * pa + d  # adding a unit: keep probability grows by at most e^ε, + δ
            assert 1 - pa <= e * (1 - pb) + d  # and the drop probability shrinks likewise
    # not needlessly conservative: within 1e-9 (relative) of the exact optimum at n = 1, 2
    assert float(pi[1]) == pytest.approx(delta, rel=1e-9)
    assert float(pi[2]) == pytest.approx(delta * (1 + math.exp(eps)), rel=1e-9)


def test_singleton_keys_appear_at_rate_delta_over_fan_out() -> None:
    """200,000 singleton groups with δ = 0.05, F = 2: the keep rate is δ/F = 0.025 (|z| < 5,
    false failure ~6e-7); the broken variant that forgets the fan-out (rate δ) is caught."""
    rng = np.random.default_rng(SEED)
    n = 200_000
    kept = select_keys(np.ones(n, dtype=np.int64), epsilon=1.0, delta=0.05, fan_out=2, rng=rng)
    assert abs(binomial_z(int(kept.sum()), n, 0.025)) < 5
    broken = select_keys(np.ones(n, dtype=np.int64), epsilon=1.0, delta=0.05, fan_out=1, rng=rng)
    assert binomial_z(int(broken.sum()), n, 0.025) > 5  # the same check would fail it


@pytest.mark.parametrize("strategy", ["laplace", "gaussian"])
def test_threshold_strategies_keep_singletons_at_most_delta_over_fan_out(strategy: str) -> None:
    """Upper one-sided: rate <= δ/F + 5σ (false failure < 3e-7)."""
    rng = np.random.default_rng(SEED + 1)
    n = 200_000
    kept = select_keys(np.ones(n, dtype=np.int64), epsilon=1.0, delta=0.05, fan_out=2, strategy=strategy, rng=rng)  # type: ignore[arg-type]
    assert binomial_z(int(kept.sum()), n, 0.025) < 5
    big = select_keys(
        np.full(1000, 200, dtype=np.int64), epsilon=1.0, delta=1e-6, fan_out=2, strategy=strategy, rng=rng
    )  # type: ignore[arg-type]
    assert big.all()


def test_laplace_threshold_is_the_least_safe_integer() -> None:
    scale = Fraction(2)
    rho = math.exp(-1 / 2)
    for d in (1e-3, 1e-6, 1e-9):
        m = laplace_threshold(scale, d)
        assert rho**m / (1 + rho) <= d < rho ** (m - 1) / (1 + rho) * (1 + 1e-9)


def _sampler(eps: float, delta: float):  # type: ignore[no-untyped-def]
    def sample(units: int, n: int, rng: np.random.Generator) -> np.ndarray:
        return select_keys(np.full(n, units, dtype=np.int64), epsilon=eps, delta=delta, fan_out=1, rng=rng).astype(
            np.int64
        )

    return sample


def test_audit_of_truncated_geometric_on_neighbouring_counts() -> None:
    """Units 2 vs 3 (both below the π = 1 point): ε_lower <= ε at the claimed δ (false failure
    <= 1e-6); a variant built for 3ε is caught at the claimed ε."""
    rng = np.random.default_rng(SEED + 2)
    eps, delta = 0.5, 0.02
    ok = estimate_epsilon(_sampler(eps, delta), 3, 2, trials=200_000, delta=delta, confidence=STRICT, rng=rng)
    assert ok.epsilon_lower <= eps
    broken = estimate_epsilon(_sampler(3 * eps, delta), 3, 2, trials=200_000, delta=delta, confidence=STRICT, rng=rng)
    assert broken.epsilon_lower > eps


def test_bad_strategy_and_parameters() -> None:
    with pytest.raises(InvalidParameterError, match="key_selection"):
        select_keys(np.ones(3, dtype=np.int64), epsilon=1.0, delta=1e-6, fan_out=1, strategy="magic")  # type: ignore[arg-type]
    with pytest.raises(InvalidParameterError, match="delta"):
        keep_probabilities(1.0, 1e-25)
