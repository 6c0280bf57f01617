"""Tests for dpkit.mechanisms.smooth_sensitivity.

Brute force: A^(k)(x) = max of the local sensitivity over every dataset at Hamming distance <= k,
enumerated on a grid that holds the data values and the bounds (the maximum is attained there:
moving a point to a bound or onto another point is what opens the largest gap).
Statistical checks use fixed seeds; audits run at confidence 1 − 1e-6.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy import stats

import dpkit.mechanisms.smooth_sensitivity as ss
from dpkit.accounting.events import ApproxDPEvent, PureDPEvent
from dpkit.audit import estimate_epsilon
from dpkit.errors import InvalidDataError, InvalidParameterError
from dpkit.mechanisms.smooth_sensitivity import (
    SmoothSensitivityMedian,
    smooth_sensitivity_median,
    smooth_sensitivity_order_statistic,
)
from dpkit.noise.source import SeededSource

SEED = 20240701
STRICT = 1 - 1e-6


# --- references --------------------------------------------------------------------------------


def order_stat(rows: np.ndarray, rank: int) -> np.ndarray:
    return np.sort(rows, axis=-1)[..., rank - 1]


def local_sensitivity_brute(rows: np.ndarray, rank: int, grid: np.ndarray) -> np.ndarray:
    """max over one replacement (by any grid value) of |f(y') − f(y)|, for each row y."""
    base = order_stat(rows, rank)
    best = np.zeros(rows.shape[0])
    for i in range(rows.shape[1]):
        for g in grid:
            y = rows.copy()
            y[:, i] = g
            best = np.maximum(best, np.abs(order_stat(y, rank) - base))
    return best


def smooth_brute(x: np.ndarray, rank: int, lower: float, upper: float, beta: float) -> float:
    x = np.clip(np.asarray(x, dtype=float), lower, upper)
    n = x.size
    grid = np.unique(np.concatenate([x, [lower, upper]]))
    rows = np.array(list(itertools.product(grid, repeat=n)))
    dist = (rows != x).sum(axis=1)
    ls = local_sensitivity_brute(rows, rank, grid)
    a = [ls[dist <= k].max() for k in range(n + 1)]
    return max(math.exp(-k * beta) * a[k] for k in range(n + 1))


def smooth_closed_form(x: np.ndarray, rank: int, lower: float, upper: float, beta: float) -> float:
    """NRS Prop 3.4, written with plain loops."""
    xs = sorted(min(max(float(v), lower), upper) for v in x)
    n = len(xs)

    def at(i: int) -> float:
        return lower if i <= 0 else upper if i > n else xs[i - 1]

    return max(
        math.exp(-k * beta) * max(at(rank + t) - at(rank + t - k - 1) for t in range(k + 2)) for k in range(n + 1)
    )


# --- smooth sensitivity ------------------------------------------------------------------------


@pytest.mark.parametrize("beta", [0.1, 0.5, 2.0])
def test_matches_brute_force_on_tiny_data(beta: float) -> None:
    rng = np.random.default_rng(SEED)
    for _ in range(6):
        n = int(rng.integers(3, 6))
        x = rng.choice([0.0, 1.0, 2.0, 3.5, 7.0], size=n)
        for rank in range(1, n + 1):
            got = smooth_sensitivity_order_statistic(x, rank, lower=0.0, upper=10.0, beta=beta)
            want = smooth_brute(x, rank, 0.0, 10.0, beta)
            assert want <= got <= want * (1 + 1e-12) + 1e-300


def test_median_matches_closed_form_and_clips() -> None:
    rng = np.random.default_rng(SEED + 1)
    for n in (1, 2, 7, 50, 201):
        x = rng.normal(5.0, 3.0, size=n)  # some values outside [0, 10]: clipped
        for beta in (0.01, 0.2, 3.0):
            got = smooth_sensitivity_median(x, lower=0.0, upper=10.0, beta=beta)
            want = smooth_closed_form(x, (n + 1) // 2, 0.0, 10.0, beta)
            assert want <= got <= want * (1 + 1e-12)


def test_dominates_local_sensitivity_and_is_beta_smooth() -> None:
    rng = np.random.default_rng(SEED + 2)
    grid = np.array([0.0, 1.0, 2.0, 4.0, 8.0])
    beta = 0.3
    for _ in range(10):
        x = rng.choice(grid, size=5)
        for rank in (1, 3, 5):
            s = smooth_sensitivity_order_statistic(x, rank, lower=0.0, upper=8.0, beta=beta)
            assert s >= local_sensitivity_brute(x[None, :], rank, grid)[0]
            for i, g in itertools.product(range(5), grid):  # every neighbour on the grid
                y = x.copy()
                y[i] = g
                s2 = smooth_sensitivity_order_statistic(y, rank, lower=0.0, upper=8.0, beta=beta)
                assert s <= math.exp(beta) * s2 * (1 + 1e-12)


def test_large_n_is_fast_and_bounded() -> None:
    x = np.random.default_rng(SEED).integers(18, 91, size=200_000).astype(float)
    s = smooth_sensitivity_median(x, lower=18.0, upper=90.0, beta=0.03)
    assert 0 < s <= 72.0


def test_smooth_sensitivity_bad_inputs() -> None:
    with pytest.raises(InvalidParameterError):
        smooth_sensitivity_median([1.0], lower=2.0, upper=1.0, beta=0.1)
    with pytest.raises(InvalidParameterError):
        smooth_sensitivity_median([1.0], lower=0.0, upper=1.0, beta=0.0)
    with pytest.raises(InvalidParameterError):
        smooth_sensitivity_order_statistic([1.0, 2.0], 3, lower=0.0, upper=3.0, beta=0.1)
    with pytest.raises(InvalidParameterError):
        smooth_sensitivity_order_statistic([1.0, 2.0], 0, lower=0.0, upper=3.0, beta=0.1)
    with pytest.raises(InvalidDataError):
        smooth_sensitivity_median([], lower=0.0, upper=3.0, beta=0.1)
    # NaN counts as 0 and ±inf clip to the bounds (it used to raise).
    assert smooth_sensitivity_median([1.0, math.nan, math.inf], lower=0.0, upper=3.0, beta=0.1) == (
        smooth_sensitivity_median([1.0, 0.0, 3.0], lower=0.0, upper=3.0, beta=0.1)
    )


# --- the exact lattice-cell sampler ------------------------------------------------------------


@pytest.mark.parametrize("noise", ["cauchy", "laplace"])
def test_cell_sampler_matches_cdf(noise: str) -> None:
    src = SeededSource(np.random.default_rng(SEED))
    g = 2.0**-20
    x = ss.sample_lattice_cells(noise, 0.3, 2.0, g, 20_000, src)
    assert np.all(np.round(x / g) == x / g)  # on the lattice
    # The lattice moves each value by <= g/2 = 5e-7: invisible to a KS test at n = 20k.
    p = stats.kstest((x - 0.3) / 2.0, noise).pvalue
    assert p > 1e-6  # false failure <= 1e-6


@pytest.mark.parametrize("noise", ["cauchy", "laplace"])
def test_exact_path_matches_cdf(noise: str) -> None:
    # The certified slow path on its own (every lane of the fast path could fall through to it).
    src = SeededSource(np.random.default_rng(SEED + 3))
    g = 2.0**-10
    cells = [ss._exact_cell(noise, 0.0, 1.0, g, int(src.words(1)[0]), 64, 3, src) for _ in range(300)]
    assert stats.kstest(np.array(cells) * g, noise).pvalue > 1e-6


def test_cdf_bounds_enclose_the_cdf() -> None:
    import mpmath

    for noise, cell, delta, b in [("cauchy", 5, 0.25, 3.0), ("laplace", -40, -0.5, 0.7), ("laplace", 7, 0.0, 1.0)]:
        lo, hi = ss._cdf_bounds(noise, cell, delta, b, 0.5, 100)
        with mpmath.workprec(400):
            z = (mpmath.mpf(cell) + mpmath.mpf(0.5)) * mpmath.mpf(0.5) - mpmath.mpf(delta)
            z /= mpmath.mpf(b)
            if noise == "cauchy":
                c = mpmath.mpf(0.5) + mpmath.atan(z) / mpmath.pi
            else:
                c = mpmath.exp(z) / 2 if z <= 0 else 1 - mpmath.exp(-z) / 2
            scaled = c * mpmath.mpf(2) ** 100
        assert lo <= scaled <= hi and hi - lo <= 4


def test_far_tail_takes_exact_path() -> None:
    # Force every lane into the exact path: all comparisons certified with mpmath.
    src = SeededSource(np.random.default_rng(SEED + 4))
    orig = ss._MARGIN
    try:
        ss._MARGIN = 2.0  # nothing passes the fast path
        x = ss.sample_lattice_cells("laplace", 1.0, 1.0, 2.0**-4, 50, src)
    finally:
        ss._MARGIN = orig
    assert np.all(np.abs(x - 1.0) < 40) and np.all(np.round(x * 16) == x * 16)


# --- the mechanism -----------------------------------------------------------------------------


def test_events_and_constants() -> None:
    lap = SmoothSensitivityMedian(epsilon=1.0, delta=1e-6, lower=0.0, upper=100.0)
    assert lap.event == ApproxDPEvent(1.0, 1e-6, "replace")
    assert lap.beta == pytest.approx(1.0 / (2 * math.log(2e6)))
    cau = SmoothSensitivityMedian(epsilon=1.5, lower=0.0, upper=100.0, noise="cauchy")
    assert cau.event == PureDPEvent(1.5, "replace")
    assert cau.beta == 0.25
    x = np.arange(11.0)
    assert lap.scale(x) == pytest.approx(2 * lap.smooth_sensitivity(x) / 1.0)
    assert cau.scale(x) == pytest.approx(6 * cau.smooth_sensitivity(x) / 1.5)
    # the S used is the smooth sensitivity at (just below) the analysis's β
    assert lap.smooth_sensitivity(x) == pytest.approx(
        smooth_sensitivity_median(x, lower=0.0, upper=100.0, beta=lap.beta)
    )
    assert lap.granularity == 2.0**-18  # 2^(⌊log2 100⌋ − 24), from the bounds only


def test_release_is_a_float_on_the_lattice_and_reproducible() -> None:
    mech = SmoothSensitivityMedian(epsilon=1.0, delta=1e-6, lower=0.0, upper=100.0)
    a = mech.release([1.0, 50.0, 99.0], rng=np.random.default_rng(7))
    b = mech.release([1.0, 50.0, 99.0], rng=np.random.default_rng(7))
    assert isinstance(a, float) and a == b and (a / mech.granularity).is_integer()
    assert isinstance(mech.release([1.0, 50.0, 99.0]), float)  # secure default


@pytest.mark.parametrize("noise", ["laplace", "cauchy"])
def test_error_bound_covers(noise: str) -> None:
    kw = {"delta": 1e-6} if noise == "laplace" else {}
    mech = SmoothSensitivityMedian(epsilon=1.0, lower=18.0, upper=90.0, noise=noise, **kw)
    x = np.random.default_rng(SEED).integers(18, 91, 1001).astype(float)
    a = mech.error_bound(0.05, values=x)
    assert a <= mech.error_bound(0.05)  # the public (worst-case) bound is looser
    out = mech._sample(x, 20_000, SeededSource(np.random.default_rng(SEED)))
    miss = int((np.abs(out - np.median(x)) > a).sum())
    assert miss <= stats.binom.ppf(1 - 1e-6, 20_000, 0.05)


def _sampler(mech: SmoothSensitivityMedian):
    return lambda data, n, rng: mech._sample(data, n, SeededSource(rng))


# Neighbours (replace one value) around a local-sensitivity cliff: LS(x0) = 0, LS(x1) = 1.
X0 = np.array([0.0, 0.0, 0.0, 0.0, 1.0])
X1 = np.array([0.0, 0.0, 0.0, 1.0, 1.0])
X2 = np.array([0.0, 0.0, 1.0, 1.0, 1.0])  # median moves 0 → 1 from X1


@pytest.mark.parametrize("pair", [(X0, X1), (X1, X2)])
def test_laplace_variant_audit_within_claim(pair) -> None:
    mech = SmoothSensitivityMedian(epsilon=1.0, delta=1e-6, lower=0.0, upper=1.0)
    res = estimate_epsilon(
        _sampler(mech), *pair, trials=200_000, delta=1e-6, confidence=STRICT, rng=np.random.default_rng(SEED)
    )
    assert res.epsilon_lower <= mech.epsilon


@pytest.mark.parametrize("pair", [(X0, X1), (X1, X2)])
def test_cauchy_variant_audit_within_claim(pair) -> None:
    mech = SmoothSensitivityMedian(epsilon=1.0, lower=0.0, upper=1.0, noise="cauchy")
    res = estimate_epsilon(_sampler(mech), *pair, trials=200_000, confidence=STRICT, rng=np.random.default_rng(SEED))
    assert res.epsilon_lower <= mech.epsilon


def test_broken_local_sensitivity_variant_is_caught(monkeypatch) -> None:
    # The classic mistake: noise calibrated to the *local* sensitivity (A^(0)) instead of S.
    def local_only(x, rank, lower, upper, beta):
        padded = np.concatenate([[lower], x, [upper]])
        return float(max(padded[rank + 1] - padded[rank], padded[rank] - padded[rank - 1]))

    monkeypatch.setattr(ss, "_smooth_sorted", local_only)
    mech = SmoothSensitivityMedian(epsilon=1.0, delta=1e-6, lower=0.0, upper=1.0)
    res = estimate_epsilon(
        _sampler(mech), X0, X1, trials=50_000, delta=1e-6, confidence=STRICT, rng=np.random.default_rng(SEED)
    )
    assert res.epsilon_lower > mech.epsilon


# --- bad inputs --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs",
    [
        {"epsilon": 1.0, "delta": 1e-6, "lower": 5.0, "upper": 1.0},  # bounds reversed
        {"epsilon": 0.0, "delta": 1e-6, "lower": 0.0, "upper": 1.0},  # ε <= 0
        {"epsilon": -1.0, "delta": 1e-6, "lower": 0.0, "upper": 1.0},
        {"epsilon": math.nan, "delta": 1e-6, "lower": 0.0, "upper": 1.0},
        {"epsilon": 1.0, "delta": 0.0, "lower": 0.0, "upper": 1.0},  # δ outside (0, 1)
        {"epsilon": 1.0, "delta": 1.0, "lower": 0.0, "upper": 1.0},
        {"epsilon": 1.0, "delta": None, "lower": 0.0, "upper": 1.0},  # Laplace needs δ
        {"epsilon": 1.0, "delta": 1e-6, "lower": 0.0, "upper": 1.0, "noise": "cauchy"},  # pure: no δ
        {"epsilon": 1.0, "delta": 1e-6, "lower": 0.0, "upper": 1.0, "noise": "gauss"},
        {"epsilon": 1.0, "delta": 1e-6, "lower": 0.0, "upper": math.inf},
    ],
)
def test_mechanism_bad_parameters(kwargs) -> None:
    with pytest.raises(InvalidParameterError):
        SmoothSensitivityMedian(**kwargs)


def test_mechanism_bad_data() -> None:
    mech = SmoothSensitivityMedian(epsilon=1.0, delta=1e-6, lower=0.0, upper=1.0)
    for bad in ([], ["a"], [[0.1, 0.2], [0.3, 0.4]]):
        with pytest.raises(InvalidDataError):
            mech.release(bad, rng=np.random.default_rng(0))
    got = mech.release([0.5, math.nan, -math.inf], rng=np.random.default_rng(0))  # used to raise
    assert got == mech.release([0.5, 0.0, 0.0], rng=np.random.default_rng(0))
    with pytest.raises(InvalidParameterError):
        mech.error_bound(0.0)
