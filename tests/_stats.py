"""Shared statistical checks for sampler tests (not a test module)."""

from __future__ import annotations

import numpy as np
from scipy import stats

ALPHA = 1e-6  # every χ² test below falsely fails with probability 1e-6


def chi2_pvalue(samples: np.ndarray, support: np.ndarray, pmf: np.ndarray, min_expected: float = 20.0) -> float:
    """χ² goodness of fit of integer samples to a pmf on ``support``. Each tail is pooled into
    the outermost bin with at least ``min_expected`` expected counts (a bin of its own would have
    a tiny expectation, and one rare legitimate draw there would fail the test)."""
    n = samples.size
    pmf = pmf / pmf.sum()
    expected = pmf * n
    keep = expected >= min_expected
    lo, hi = support[keep].min(), support[keep].max()
    if lo == hi:  # one likely value: that value against all the others
        at = float(expected[support == lo].sum())
        hits = int((samples == lo).sum())
        return float(stats.chisquare([hits, n - hits], [at * n / expected.sum(), n - at * n / expected.sum()]).pvalue)
    counts = np.bincount((np.clip(samples, lo, hi) - lo).astype(np.int64), minlength=int(hi - lo + 1))
    exp = expected[(support >= lo) & (support <= hi)].copy()
    exp[0] += expected[support < lo].sum()
    exp[-1] += expected[support > hi].sum()
    return float(stats.chisquare(counts, exp * counts.sum() / exp.sum()).pvalue)


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
