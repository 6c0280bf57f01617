"""The candidate-set quantile: exact exponential-mechanism frequencies, audit, bad input."""

from __future__ import annotations

import numpy as np
import pytest

from _stats import ALPHA, chi2_pvalue
from dpkit.audit import estimate_epsilon
from dpkit.errors import InvalidDataError, InvalidParameterError
from dpkit.mechanisms.candidate_quantile import CandidateQuantile

SEED = 20241126


def test_frequencies_match_the_exponential_mechanism() -> None:
    data = np.array([1.0, 2.0, 2.0, 3.0, 7.0])
    m = CandidateQuantile(epsilon=1.0, q=0.5, candidates=np.arange(0, 9))
    scores = m.scores(data)
    p = np.exp(m.epsilon * (scores - scores.max()) / (2 * m.sensitivity))
    rng = np.random.default_rng(SEED)
    draws = np.array([m.release(data, rng=rng) for _ in range(20_000)]).astype(np.int64)
    assert chi2_pvalue(draws, np.arange(0, 9), p, min_expected=5) > ALPHA  # false failure 1e-6


def test_median_of_integer_ages_is_exact_at_moderate_epsilon() -> None:
    ages = np.random.default_rng(SEED).integers(18, 90, size=30_000).astype(float)
    m = CandidateQuantile(epsilon=1.0, q=0.5, candidates=np.arange(0, 101))
    rng = np.random.default_rng(SEED + 1)
    picks = [m.release(ages, rng=rng) for _ in range(50)]
    assert np.mean(np.abs(np.array(picks) - np.median(ages))) <= 0.5  # typical 0


def test_audit_stays_within_epsilon() -> None:
    m = CandidateQuantile(epsilon=1.0, q=0.5, candidates=np.arange(0, 6))
    d0, d1 = np.array([1.0, 2.0, 3.0]), np.array([1.0, 2.0, 3.0, 5.0])

    def sampler(data, n, rng):
        return np.array([m.release(data, rng=rng) for _ in range(n)])

    result = estimate_epsilon(sampler, d0, d1, trials=20_000, confidence=1 - 1e-6, rng=np.random.default_rng(SEED))
    assert result.epsilon_lower <= 1.0  # guarantee; false failure <= 1e-6


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"epsilon": 0.0}, "epsilon"),
        ({"q": 1.5}, "q"),
        ({"candidates": []}, "candidates"),
        ({"candidates": [1.0, float("nan")]}, "candidates"),
        ({"candidates": [[1.0, 2.0]]}, "candidates"),
        ({"neighbours": "swap"}, "neighbours"),
    ],
)
def test_bad_parameters(kwargs: dict, name: str) -> None:
    args = {"epsilon": 1.0, "q": 0.5, "candidates": np.arange(5), **kwargs}
    with pytest.raises(InvalidParameterError, match=name):
        CandidateQuantile(**args)


@pytest.mark.parametrize("bad", [[], [[1.0], [2.0]], ["a"]])
def test_bad_data(bad: object) -> None:
    with pytest.raises(InvalidDataError):
        CandidateQuantile(epsilon=1.0, q=0.5, candidates=np.arange(5)).release(bad)


def test_non_finite_values_are_counted_not_refused() -> None:
    # Used to raise. NaN counts as 0; ±inf lie below/above every candidate.
    m = CandidateQuantile(epsilon=1.0, q=0.5, candidates=np.arange(5))
    np.testing.assert_array_equal(m.scores([1.0, float("nan"), float("inf")]), m.scores([1.0, 0.0, 99.0]))
    got = m.release([1.0, float("nan"), -float("inf")], rng=np.random.default_rng(0))
    assert got == m.release([1.0, 0.0, -99.0], rng=np.random.default_rng(0))
