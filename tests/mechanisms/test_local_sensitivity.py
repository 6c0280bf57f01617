"""Local sensitivity (seed 004 ch. 5): formulas against brute force over neighbours, and an audit
showing that noise calibrated to local sensitivity is not differentially private."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from dpkit.audit import estimate_epsilon
from dpkit.errors import InvalidDataError, InvalidParameterError
from dpkit.mechanisms import local_sensitivity as ls

STRICT = 1 - 1e-6
LO, HI = 0.0, 10.0


def lower_median(x) -> float:
    s = np.sort(np.asarray(x, dtype=float))
    return float(s[(s.size + 1) // 2 - 1])


def brute_median_ls(x, lo=LO, hi=HI) -> float:
    """max |med(x) − med(x')| over x' with one record replaced (by l or u: the median is
    monotone in the replaced value, so the extremes are enough)."""
    x = np.clip(np.asarray(x, float), lo, hi)
    base = lower_median(x)
    best = 0.0
    for i in range(x.size):
        for val in (lo, hi):
            y = x.copy()
            y[i] = val
            best = max(best, abs(lower_median(y) - base))
    return best


def brute_median_a(x, k, lo=LO, hi=HI) -> float:
    """max LS(x') over x' at replace-distance <= k, new values from {l, u} ∪ data."""
    x = np.clip(np.asarray(x, float), lo, hi)
    grid = sorted(set(x.tolist()) | {lo, hi})
    best = brute_median_ls(x, lo, hi)
    for j in range(1, min(k, x.size) + 1):
        for idx in itertools.combinations(range(x.size), j):
            for vals in itertools.product(grid, repeat=j):
                y = x.copy()
                y[list(idx)] = vals
                best = max(best, brute_median_ls(y, lo, hi))
    return best


def brute_mean_ls(x, lo=LO, hi=HI) -> float:
    x = np.clip(np.asarray(x, float), lo, hi)
    m = x.mean()
    cands = [abs(np.append(x, val).mean() - m) for val in (lo, hi)]
    cands += [abs(np.delete(x, i).mean() - m) for i in range(x.size)]
    return float(max(cands))


def brute_sum_ls(x, lo, hi, neighbours) -> float:
    x = np.clip(np.asarray(x, float), lo, hi)
    s = x.sum()
    if neighbours == "add_remove":
        cands = [abs(val) for val in (lo, hi)] + [abs(np.delete(x, i).sum() - s) for i in range(x.size)]
    else:
        cands = [abs(s - x[i] + val - s) for i in range(x.size) for val in (lo, hi)]
    return float(max(cands))


def small_datasets(seed: int, count: int, max_n: int):
    rng = np.random.default_rng(seed)
    for _ in range(count):
        n = int(rng.integers(1, max_n + 1))
        yield rng.integers(-2, 13, size=n).astype(float)  # some values outside [0, 10]: clipped


# --- values against brute force ------------------------------------------------------------------


def test_count() -> None:
    assert ls.local_sensitivity_count([1.0, 2.0]) == 1.0
    assert ls.local_sensitivity_count(neighbours="replace") == 0.0


@pytest.mark.parametrize("neighbours", ["add_remove", "replace"])
@pytest.mark.parametrize("bounds", [(0.0, 10.0), (-3.0, 2.0), (-7.0, -1.0)])
def test_sum_matches_brute_force(neighbours, bounds) -> None:
    lo, hi = bounds
    for x in small_datasets(1, 30, 6):
        assert ls.local_sensitivity_sum(x, lower=lo, upper=hi, neighbours=neighbours) == pytest.approx(
            brute_sum_ls(x, lo, hi, neighbours)
        )
    assert ls.local_sensitivity_sum([], lower=lo, upper=hi) == max(abs(lo), abs(hi))


def test_mean_matches_brute_force_and_bounds() -> None:
    for x in small_datasets(2, 60, 7):
        got = ls.local_sensitivity_mean(x, upper=HI, lower=LO)
        n = x.size
        if n >= 2:
            assert got == pytest.approx(brute_mean_ls(x))
        else:
            assert got == HI - LO  # the change to the empty dataset counts as u − l
        assert got <= (HI - LO) / n + 1e-12  # the bound PTRMean uses
    # the notes' u/(n+1) is only the add-a-row part: removing u from [0, 0, 0, u] moves the mean by u/4
    assert ls.local_sensitivity_mean([0.0, 0.0, 0.0, 10.0], upper=10.0) == 2.5 > 10.0 / 5


def test_mean_at_distance_bounds_brute_force() -> None:
    rng = np.random.default_rng(3)
    for _ in range(20):
        x = rng.uniform(LO, HI, size=int(rng.integers(3, 7)))
        for k in range(x.size - 1):
            bound = ls.mean_sensitivity_at_distance(x, k, upper=HI)
            for j in range(k + 1):  # datasets reachable by removing j records
                for idx in itertools.combinations(range(x.size), j):
                    assert brute_mean_ls(np.delete(x, list(idx))) <= bound + 1e-12


def test_median_ls_matches_brute_force() -> None:
    for x in small_datasets(4, 80, 7):
        assert ls.local_sensitivity_median(x, lower=LO, upper=HI) == pytest.approx(brute_median_ls(x))


def test_median_ls_at_distance_matches_brute_force() -> None:
    for x in small_datasets(5, 12, 4):
        for k in range(0, 3):
            assert ls.median_sensitivity_at_distance(x, k, lower=LO, upper=HI) == pytest.approx(brute_median_a(x, k)), (
                x,
                k,
            )
    assert ls.median_sensitivity_at_distance([5.0, 5.0, 5.0], 3, lower=LO, upper=HI) == HI - LO


def test_median_distance_matches_brute_force() -> None:
    for x in small_datasets(6, 10, 4):
        for b in (0.5, 2.0, 4.5):
            want = next(k for k in range(x.size + 1) if brute_median_a(x, k) > b)
            assert ls.median_distance_to_high_sensitivity(x, b, lower=LO, upper=HI) == want, (x, b)
    assert ls.median_distance_to_high_sensitivity([1.0, 2.0], 10.0, lower=LO, upper=HI) == math.inf


def test_median_distance_changes_by_at_most_one_between_neighbours() -> None:
    rng = np.random.default_rng(7)
    for _ in range(200):
        x = np.round(rng.normal(5.0, 1.0, size=int(rng.integers(1, 60))), 2)
        y = x.copy()
        y[rng.integers(x.size)] = rng.uniform(-1.0, 11.0)
        b = float(rng.uniform(0.05, 3.0))
        gx = ls.median_distance_to_high_sensitivity(x, b, lower=LO, upper=HI)
        gy = ls.median_distance_to_high_sensitivity(y, b, lower=LO, upper=HI)
        assert abs(gx - gy) <= 1


def test_mean_distance_matches_definition() -> None:
    rng = np.random.default_rng(8)
    for n in (0, 1, 5, 50, 1000):
        x = rng.uniform(LO, HI, size=n)
        for b in (0.01, 0.3, 1.0, 9.99):
            want = 0
            while (HI - LO) / max(n - want, 1) <= b:  # steps until the bound exceeds b
                want += 1
            got = ls.mean_distance_to_high_sensitivity(x, b, upper=HI)
            assert got == want
            if got >= 1:
                assert ls.local_sensitivity_mean(x, upper=HI) <= b
    assert ls.mean_distance_to_high_sensitivity([1.0], 10.0, upper=HI) == math.inf


# --- bad inputs ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "call",
    [
        lambda: ls.local_sensitivity_median([], lower=LO, upper=HI),
        lambda: ls.local_sensitivity_median([[1.0, 2.0]], lower=LO, upper=HI),
        lambda: ls.local_sensitivity_sum(["a"], lower=LO, upper=HI),
        lambda: ls.local_sensitivity_mean([], upper=HI),
    ],
)
def test_bad_data(call) -> None:
    with pytest.raises(InvalidDataError):
        call()


def test_non_finite_data_follow_the_mechanisms_rule() -> None:
    # Used to raise: NaN now counts as 0 and ±inf clip to the bounds, as in PTR (which uses these).
    assert ls.local_sensitivity_median([1.0, float("nan"), 3.0], lower=LO, upper=HI) == ls.local_sensitivity_median(
        [1.0, 0.0, 3.0], lower=LO, upper=HI
    )
    assert ls.local_sensitivity_mean([1.0, float("inf")], upper=HI) == ls.local_sensitivity_mean([1.0, HI], upper=HI)


@pytest.mark.parametrize(
    "call",
    [
        lambda: ls.local_sensitivity_median([1.0], lower=HI, upper=LO),
        lambda: ls.local_sensitivity_mean([1.0], upper=float("nan")),
        lambda: ls.local_sensitivity_sum([1.0], lower=0.0, upper=1.0, neighbours="swap"),
        lambda: ls.median_sensitivity_at_distance([1.0], -1, lower=LO, upper=HI),
        lambda: ls.median_distance_to_high_sensitivity([1.0], 0.0, lower=LO, upper=HI),
        lambda: ls.release_with_local_sensitivity(1.0, -1.0, 1.0),
        lambda: ls.release_with_local_sensitivity(1.0, 1.0, 0.0),
    ],
)
def test_bad_parameters(call) -> None:
    with pytest.raises(InvalidParameterError):
        call()


# --- the leak ------------------------------------------------------------------------------------


def test_release_with_local_sensitivity_is_caught() -> None:
    """Neighbours (replace 3 → 10) with the same median 2 but LS 1 vs 8: the noise scales differ
    by 8×, so the tails give far more than the claimed ε = 1."""
    x0 = np.array([0.0, 1.0, 2.0, 3.0, 10.0])
    x1 = np.array([0.0, 1.0, 2.0, 10.0, 10.0])
    assert lower_median(x0) == lower_median(x1) == 2.0
    assert ls.local_sensitivity_median(x0, lower=LO, upper=HI) == 1.0
    assert ls.local_sensitivity_median(x1, lower=LO, upper=HI) == 8.0

    def sampler(x, n, rng):
        scale = ls.local_sensitivity_median(x, lower=LO, upper=HI)
        return ls.release_with_local_sensitivity(np.full(n, lower_median(x)), scale, 1.0, rng=rng)

    result = estimate_epsilon(sampler, x0, x1, trials=200_000, confidence=STRICT, rng=np.random.default_rng(11))
    assert result.epsilon_lower > 2.0, str(result)


def test_zero_local_sensitivity_releases_exactly() -> None:
    assert ls.release_with_local_sensitivity(2.5, 0.0, 1.0) == 2.5
