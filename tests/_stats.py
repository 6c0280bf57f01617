"""Shared statistical checks for sampler tests (not a test module)."""

from __future__ import annotations

import numpy as np
from scipy import stats

ALPHA = 1e-6  # every χ² test below falsely fails with probability 1e-6


def chi2_pvalue(samples: np.ndarray, support: np.ndarray, pmf: np.ndarray, min_expected: float = 20.0) -> float:
    """χ² goodness of fit of integer samples to a pmf on ``support`` (tails pooled)."""
    n = samples.size
    pmf = pmf / pmf.sum()
    expected = pmf * n
    keep = expected >= min_expected
    lo, hi = support[keep].min(), support[keep].max()
    inner = (support >= lo) & (support <= hi)
    counts = np.bincount((np.clip(samples, lo - 1, hi + 1) - (lo - 1)).astype(np.int64), minlength=int(hi - lo + 3))
    obs = np.concatenate([[counts[0]], counts[1:-1], [counts[-1]]])
    exp = np.concatenate([[expected[support < lo].sum()], expected[inner], [expected[support > hi].sum()]])
    mask = exp > 0
    return float(stats.chisquare(obs[mask], exp[mask] * obs[mask].sum() / exp[mask].sum()).pvalue)


def binomial_z(successes: int, n: int, p: float) -> float:
    return (successes - n * p) / np.sqrt(max(n * p * (1 - p), 1e-300))


class CountingSource:
    """A seeded RandomSource that counts how often randomness is asked for (for tests that
    prove bad input draws nothing)."""

    def __init__(self, seed: int) -> None:
        self.generator = np.random.default_rng(seed)
        self.calls = 0

    def words(self, n: int) -> np.ndarray:
        self.calls += 1
        return self.generator.integers(0, np.iinfo(np.uint64).max, size=n, dtype=np.uint64, endpoint=True)
