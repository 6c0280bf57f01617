"""Tests for dpkit.mechanisms.quantiles: Smith's exponential-mechanism quantiles.

Gap frequencies are compared by χ² tests (α = 1e-6, fixed seeds) with Smith's exact gap
probabilities computed independently here with mpmath at 50 digits from the gap lengths and the
utilities −|i − q·n|. Tiny data sets are integers, so they lie on the output lattice, where the
sampler's gap probabilities equal Smith's exactly. Many draws on the same data use the internal
``_draw_many`` (count independent releases, each costing ε).
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import mpmath
import numpy as np
import pytest
from scipy import stats

from _stats import ALPHA, CountingSource, binomial_z
from dpkit.accounting.events import ComposedEvent, ExponentialEvent
from dpkit.audit import estimate_epsilon
from dpkit.errors import InvalidDataError, InvalidParameterError
from dpkit.mechanisms.quantiles import Median, Quantile, Quantiles, quantile_lattice

SEED = 20240614
STRICT = 1 - 1e-6
ADULT = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "adult" / "adult.data"


def smith_probabilities(data: list[int], lower: int, upper: int, q: float, eps: float) -> np.ndarray:
    """P[gap i] ∝ (x₍ᵢ₊₁₎ − x₍ᵢ₎)·exp(ε·(−|i − q·n|)/2), at 50 significant digits."""
    mpmath.mp.dps = 50
    xs = [lower, *sorted(min(max(x, lower), upper) for x in data), upper]
    n = len(data)
    qn = mpmath.mpf(q) * n
    w = [(xs[i + 1] - xs[i]) * mpmath.exp(-mpmath.mpf(eps) / 2 * abs(i - qn)) for i in range(n + 1)]
    total = mpmath.fsum(w)
    return np.array([float(wi / total) for wi in w])


def load_adult_ages(path: Path) -> np.ndarray:
    """Column 0 (age) of every data row; a header or blank/odd line is skipped."""
    with path.open(encoding="latin-1") as fh:
        first = (line.split(",", 1)[0].strip() for line in fh)
        return np.array([float(a) for a in first if a.isdigit()])


def gap_index(data: list[int], lower: float, upper: float, out: np.ndarray) -> np.ndarray:
    xs = np.sort(np.clip(np.asarray(data, dtype=float), lower, upper))
    return np.searchsorted(xs, out, side="right")


@pytest.mark.parametrize(
    ("data", "lower", "upper", "q", "eps"),
    [
        ([2, 3, 7], 0, 10, 0.5, 1.0),
        ([2, 3, 7], 0, 10, 0.5, 0.1),
        ([1, 4, 4, 6, 9, 12], 0, 10, 0.3, 2.0),  # a tie (zero-length gap) and a value clipped to 10
        ([-5, 0, 5], -8, 8, 0.9, 0.5),
        ([20, 30], 0, 64, 0.0, 1.0),
    ],
)
def test_gap_frequencies_match_smith(data, lower, upper, q, eps) -> None:
    mech = Quantile(epsilon=eps, q=q, lower=lower, upper=upper)
    n_draws = 200_000
    out = mech._draw_many(data, n_draws, rng=np.random.default_rng(SEED))
    assert out.shape == (n_draws,)
    assert np.all((out >= lower) & (out < upper))
    g = mech.granularity
    assert np.all(out / g == np.round(out / g))  # on the output lattice
    p = smith_probabilities(data, lower, upper, q, eps)
    counts = np.bincount(gap_index(data, lower, upper, out), minlength=p.size)
    assert counts[p == 0].sum() == 0  # zero-length gaps are never chosen
    keep = p > 0
    pvalue = stats.chisquare(counts[keep], p[keep] * n_draws).pvalue
    assert pvalue > ALPHA
    # The float helper agrees with the independent reference.
    assert np.allclose(mech.gap_probabilities(data)[1], p, rtol=1e-12, atol=1e-15)


def test_uniform_within_gap() -> None:
    # Inside the chosen gap the output is uniform: position within [3, 7) in 8 equal bins.
    mech = Median(epsilon=1.0, lower=0.0, upper=10.0)
    out = mech._draw_many([2, 3, 7], 100_000, rng=np.random.default_rng(SEED + 1))
    inner = out[(out >= 3) & (out < 7)]
    counts = np.bincount(((inner - 3) / 0.5).astype(int), minlength=8)
    assert stats.chisquare(counts).pvalue > ALPHA


def test_median_accuracy_large_data() -> None:
    x = np.random.default_rng(SEED).normal(45.0, 12.0, 100_001)
    mech = Median(epsilon=1.0, lower=0.0, upper=100.0)
    rng = np.random.default_rng(SEED + 2)
    errors = np.abs(np.array([mech.release(x, rng=rng) for _ in range(50)]) - np.median(x))
    assert errors.max() < 0.5  # ~ a few dozen ranks: far below 0.5 at n = 10^5


def test_integer_ages_all_epsilons() -> None:
    # Heavy ties (integer ages): zero-length gaps everywhere, the sampler must still be fast.
    ages = np.random.default_rng(SEED).integers(17, 91, 30_000)
    for eps, tol in ((1.0, 2.0), (0.01, 3.0)):
        r = Median(epsilon=eps, lower=0.0, upper=100.0).release(ages, rng=np.random.default_rng(SEED))
        assert abs(r - np.median(ages)) < tol


def test_quantiles_release_and_event() -> None:
    x = np.random.default_rng(SEED).uniform(0.0, 100.0, 20_000)
    mech = Quantiles(epsilon=1.5, qs=[0.1, 0.5, 0.9], lower=0.0, upper=100.0)
    r = mech.release(x, rng=np.random.default_rng(SEED))
    assert r.shape == (3,)
    assert np.all(np.abs(r - np.quantile(x, [0.1, 0.5, 0.9])) < 2.0)
    ev = mech.event
    assert isinstance(ev, ComposedEvent) and len(ev.events) == 3
    assert all(isinstance(e, ExponentialEvent) for e in ev.events)
    # The event's parameters are those of the samplers actually run.
    assert [e.epsilon for e in ev.events] == [p.epsilon for p in mech.parts] == [0.5, 0.5, 0.5]
    assert sum(e.epsilon for e in ev.events) <= 1.5
    # ε/3 rounds down.
    parts = Quantiles(epsilon=1.0, qs=[0.2, 0.4, 0.6], lower=0.0, upper=1.0).parts
    assert 3 * parts[0].epsilon <= 1.0


def test_event_matches_sampler() -> None:
    mech = Quantile(epsilon=0.7, q=0.25, lower=-1.0, upper=1.0, neighbours="replace")
    assert mech.event == ExponentialEvent(epsilon=0.7, neighbours="replace")
    assert Median(epsilon=2.0, lower=0, upper=1).event == ExponentialEvent(epsilon=2.0)


def test_lattice_is_data_independent_and_exact() -> None:
    assert quantile_lattice(0.0, 100.0) == 2.0**-34
    g = quantile_lattice(1e12, 1e12 + 1.0)  # large magnitude: indices stay below 2^53
    assert 1e12 / g < 2.0**53
    r = Quantile(epsilon=1.0, q=0.5, lower=1e12, upper=1e12 + 1.0).release([1e12 + 0.5], rng=np.random.default_rng(0))
    assert 1e12 <= r < 1e12 + 1.0


def _sampler(mech: Quantile):
    def sample(data, n, rng):
        return mech._draw_many(data, n, rng=rng)

    return sample


def test_audit_within_epsilon() -> None:
    # Add/remove neighbours: one record added far above the data moves q·n (and every utility).
    mech = Median(epsilon=1.0, lower=0.0, upper=10.0)
    x0, x1 = [1, 2, 3], [1, 2, 3, 10]
    res = estimate_epsilon(_sampler(mech), x0, x1, trials=400_000, confidence=STRICT, rng=np.random.default_rng(SEED))
    assert res.epsilon_lower <= mech.event.epsilon
    assert res.epsilon_lower > 0.2  # the audit has power (0.35 at this seed): the loss on this pair is substantial


def test_broken_twin_is_caught() -> None:
    # Sampling for ε = 4 while claiming ε = 1: the audit must see more than 1 (1.57 at this seed).
    claimed = 1.0
    broken = Median(epsilon=4.0, lower=0.0, upper=10.0)
    res = estimate_epsilon(
        _sampler(broken), [1, 2, 3], [1, 2, 3, 10], trials=400_000, confidence=STRICT, rng=np.random.default_rng(SEED)
    )
    assert res.epsilon_lower > claimed


@pytest.mark.parametrize(
    "kwargs",
    [
        {"epsilon": 0.0, "q": 0.5, "lower": 0, "upper": 1},
        {"epsilon": float("nan"), "q": 0.5, "lower": 0, "upper": 1},
        {"epsilon": 1.0, "q": -0.1, "lower": 0, "upper": 1},
        {"epsilon": 1.0, "q": 1.1, "lower": 0, "upper": 1},
        {"epsilon": 1.0, "q": float("nan"), "lower": 0, "upper": 1},
        {"epsilon": 1.0, "q": 0.5, "lower": 1, "upper": 1},
        {"epsilon": 1.0, "q": 0.5, "lower": 2, "upper": 1},
        {"epsilon": 1.0, "q": 0.5, "lower": 0, "upper": float("inf")},
        {"epsilon": 1.0, "q": 0.5, "lower": float("-inf"), "upper": 0},
        {"epsilon": 1.0, "q": 0.5, "lower": 0, "upper": 1, "neighbours": "bounded"},
    ],
)
def test_bad_parameters(kwargs) -> None:
    with pytest.raises(InvalidParameterError):
        Quantile(**kwargs)


def test_bad_quantiles_parameters() -> None:
    with pytest.raises(InvalidParameterError):
        Quantiles(epsilon=1.0, qs=[], lower=0, upper=1)
    with pytest.raises(InvalidParameterError):
        Quantiles(epsilon=1.0, qs=[0.5, 2.0], lower=0, upper=1)
    with pytest.raises(InvalidParameterError):
        Quantiles(epsilon=1.0, qs="0.5", lower=0, upper=1)
    with pytest.raises(InvalidParameterError):
        Median(epsilon=1.0, q=0.3, lower=0, upper=1)


@pytest.mark.parametrize("values", [[], ["a", "b"], np.array([True])])
def test_bad_data_draws_nothing(values) -> None:
    src = CountingSource(0)
    for mech in (Median(epsilon=1.0, lower=0, upper=1), Quantiles(epsilon=1.0, qs=[0.5], lower=0, upper=1)):
        with pytest.raises(InvalidDataError):
            mech.release(values, rng=src)
    assert src.calls == 0


def test_non_finite_values_are_clipped_not_refused() -> None:
    # Used to raise. Now NaN counts as 0 and ±inf clip to the bounds: same output as the
    # normalised data under the same randomness.
    for mech in (Median(epsilon=1.0, lower=-1, upper=1), Quantiles(epsilon=1.0, qs=[0.5], lower=-1, upper=1)):
        got = mech.release([np.nan, np.inf, -np.inf, 0.25], rng=np.random.default_rng(SEED))
        want = mech.release([0.0, 1.0, -1.0, 0.25], rng=np.random.default_rng(SEED))
        assert np.array_equal(got, want)


def test_release_clipped_on_empty_input_is_in_the_bounds() -> None:
    # An empty group still gets its draw: uniform on the lattice points of [lower, upper).
    mech = Quantile(epsilon=1.0, q=0.3, lower=-2.0, upper=5.0)
    g = mech.granularity
    for seed in range(20):
        t = mech.release_clipped([], rng=np.random.default_rng(seed))
        assert -2.0 <= t < 5.0
        assert t / g == np.floor(t / g)  # on the output lattice
    src = CountingSource(SEED)  # any RandomSource is accepted
    assert -2.0 <= mech.release_clipped(np.zeros(0), rng=src) < 5.0
    assert src.calls > 0


@pytest.mark.parametrize("q", [0.1, 0.5, 0.9])
def test_release_clipped_matches_release_under_a_seed(q) -> None:
    # Same sampler, same draws: identical output for the same seed on non-empty input.
    mech = Quantile(epsilon=0.7, q=q, lower=0.0, upper=100.0)
    x = np.clip(np.random.default_rng(SEED).normal(40.0, 30.0, 501), 0.0, 100.0)
    for seed in range(5):
        want = mech.release(x, rng=np.random.default_rng(seed))
        assert mech.release_clipped(x, rng=np.random.default_rng(seed)) == want
        assert mech.release_clipped(x[::-1], rng=np.random.default_rng(seed)) == want  # order-free


def test_batch_size_does_not_depend_on_the_data() -> None:
    # The proposal batch used to be sized from the data's acceptance rate (1.25/rate + 16: 17 for
    # concentrated data, 18 for spread data); now from the proven bound 1/4: 4·1 + 16 = 20 for
    # one output, whatever the data. (Both runs accept within their first batch under these seeds:
    # each lane accepts w.p. >= 1/4, so a miss has probability <= 0.75^20 < 0.4%, fixed by SEED.)
    drawn = []
    for x in (np.full(1001, 50.0), np.random.default_rng(SEED).uniform(0, 100, 1001)):
        _, st = _stats_of(Median(epsilon=1.0, lower=0.0, upper=100.0), x, 1, SEED)
        drawn.append(st["drawn"])
    assert drawn == [20, 20]


def test_adult_ages_median() -> None:
    if not ADULT.exists():
        pytest.skip("UCI Adult data not present at <repo>/../shared/data/adult/")
    ages = load_adult_ages(ADULT)
    assert ages.size > 30_000
    r = Median(epsilon=1.0, lower=0.0, upper=100.0).release(ages, rng=np.random.default_rng(SEED))
    assert abs(r - np.median(ages)) <= 1.0


# --- the dyadic-envelope sampler ----------------------------------------------------------------


def _stats_of(mech: Quantile, data, count: int, seed: int) -> tuple[np.ndarray, dict[str, int]]:
    from dpkit.noise.source import resolve_rng

    record: dict[str, int] = {}
    out = mech._sample(mech._prepare(mech._data(data)), count, resolve_rng(np.random.default_rng(seed)), record)
    return out, record


def test_tiny_best_gap_needs_few_proposals() -> None:
    # Half the data at 50, half at 50 + 1e-9: the best gap holds ~17 of 2^40 lattice points and
    # every other gap is e^{-thousands} worse. Uniform proposals would need ~2^36 tries per output.
    x = np.repeat([50.0, 50.0 + 1e-9], 50_000)
    mech = Median(epsilon=1.0, lower=0.0, upper=100.0)
    r = mech.release(x, rng=np.random.default_rng(SEED))
    assert 50.0 <= r < 50.0 + 1e-9
    for seed in range(20):
        out, st = _stats_of(mech, x, 1, SEED + seed)
        assert 50.0 <= out[0] < 50.0 + 1e-9
        assert 1 <= st["proposals"] <= 64
        assert st["drawn"] <= 1024


def test_acceptance_at_least_a_quarter_on_random_data() -> None:
    rng = np.random.default_rng(SEED + 10)
    for _ in range(6):
        x = rng.normal(rng.uniform(20, 80), rng.uniform(0.001, 20), int(rng.integers(1, 3000)))
        mech = Quantile(epsilon=float(rng.uniform(0.01, 5.0)), q=float(rng.uniform()), lower=0.0, upper=100.0)
        assert mech._prepare(mech._data(x)).accept_rate >= 0.25
        count = 20_000
        _, st = _stats_of(mech, x, count, int(rng.integers(2**32)))
        assert count / st["proposals"] >= 0.25


def test_envelope_exponent_is_certified() -> None:
    from dpkit.mechanisms import quantiles as qm

    mpmath.mp.dps = 50
    assert mpmath.mpf(qm._LN2_UP) >= mpmath.log(2)
    rng = np.random.default_rng(SEED + 11)
    x = rng.normal(50.0, 5.0, 2001)
    for eps, q in ((0.3, 0.5), (2.0, 0.1), (7.0, 0.77)):
        mech = Quantile(epsilon=eps, q=q, lower=0.0, upper=100.0)
        prep = mech._prepare(mech._data(x))
        n = x.size
        qn = mpmath.mpf(q) * n  # q is a double: exact at 50 digits
        d_star = mpmath.mpf(prep.d_star.numerator) / prep.d_star.denominator
        for i in prep.order:
            gamma = mpmath.mpf(eps) / 2 * (abs(int(i) - qn) - d_star)
            k = int(prep.k[i])
            assert k * mpmath.log(2) <= gamma  # e^{-γ} <= 2^{-k}: the envelope is valid
            if k < qm._ENVELOPE_CAP:
                assert k >= int(mpmath.floor(gamma / mpmath.log(2))) - 1  # acceptance > 1/4


def test_uniform_big_integers() -> None:
    from dpkit.mechanisms.quantiles import _uniform_big
    from dpkit.noise.source import resolve_rng

    m = 3 * 2**70 + 5
    r = _uniform_big(m, 60_000, resolve_rng(np.random.default_rng(SEED)))
    assert all(0 <= v < m for v in r)
    top = np.array([v * 6 // m for v in r])  # six equal-probability bins (up to 5/m)
    assert stats.chisquare(np.bincount(top, minlength=6)).pvalue > ALPHA
    low = np.array([v % 8 for v in r])
    assert stats.chisquare(np.bincount(low, minlength=8)).pvalue > ALPHA


def test_gap_frequencies_match_smith_wide_envelope() -> None:
    # Utilities spread over ~20·ε: envelope exponents up to ~30, proposal totals beyond 2^63
    # (the big-integer path), zero-length gaps from ties.
    data = [
        1,
        3,
        3,
        4,
        6,
        7,
        9,
        10,
        12,
        15,
        15,
        18,
        20,
        21,
        22,
        25,
        27,
        30,
        31,
        33,
        35,
        36,
        38,
        40,
        41,
        44,
        46,
        47,
        49,
        50,
        52,
        55,
        56,
        58,
        60,
        61,
        63,
        64,
        66,
        69,
        70,
    ]
    lower, upper, q, eps = 0, 72, 0.4, 2.0
    mech = Quantile(epsilon=eps, q=q, lower=lower, upper=upper)
    prep = mech._prepare(mech._data(data))
    assert sum(s << (len(prep.group_size) - 1 - d) for d, s in enumerate(prep.group_size)) > 2**63
    n_draws = 100_000
    out = mech._draw_many(data, n_draws, rng=np.random.default_rng(SEED + 12))
    g = mech.granularity
    assert np.all(out / g == np.round(out / g))
    p = smith_probabilities(data, lower, upper, q, eps)
    counts = np.bincount(gap_index(data, lower, upper, out), minlength=p.size)
    assert counts[p == 0].sum() == 0
    big = p * n_draws >= 5  # pool the cells too small for χ²
    obs = np.append(counts[big], counts[~big].sum())
    exp = np.append(p[big], p[~big].sum()) * n_draws
    assert stats.chisquare(obs, exp).pvalue > ALPHA


# ---- the rank error bound (Quantile.rank_error) --------------------------------------------------------


def _two_point_data(mech: Quantile, h: int) -> np.ndarray:
    """h rows at 50 and h at the next lattice point: the one lattice point [50, 50 + g) is the only
    output of rank error 0 (d* = 0), every other output is h rows off (#{x <= t} is 0 or 2h). The
    bound is tight here: P[rank error = h] = B/(1 + B), B = (m − 1)·e^{−ε·h/2}."""
    return np.array([50.0] * h + [50.0 + mech.granularity] * h)


def _rank_misses(mech: Quantile, bound: float, h: int, draws: int, seed: int) -> int:
    data = _two_point_data(mech, h)
    out = mech._draw_many(data, draws, rng=np.random.default_rng(seed))
    ranks = gap_index(list(data), mech.lower, mech.upper, out)  # #{x <= t}
    return int(np.count_nonzero(np.abs(ranks - mech.q * data.size) > bound))  # d* = 0


def _coverage_pvalue(misses: int, draws: int, confidence: float) -> float:
    """One-sided binomial test of "misses happen with probability <= 1 − confidence"."""
    return float(stats.binomtest(misses, draws, 1 - confidence, alternative="greater").pvalue)


def _coverage_holds(mech: Quantile, bound: float, confidence: float) -> bool:
    """The bound covers on two tight data sets: h = ⌊k⌋ + 1 (the true k: misses with probability
    just below 1 − confidence, about 0.089 here) and h = ⌈0.6·k⌉ (the true k never misses; a bound
    below 0.6·k misses with probability about 1). 20,000 draws each; the check fails when either
    binomial test rejects at ALPHA = 1e-6, so a correct bound fails it with probability <= 2e-6."""
    k = mech.rank_error(confidence)
    draws = 20_000
    for i, h in enumerate((math.floor(k) + 1, math.ceil(0.6 * k))):
        misses = _rank_misses(mech, bound, h, draws, SEED + 40 + i)
        if _coverage_pvalue(misses, draws, confidence) < ALPHA:
            return False
    return True


def test_rank_error_is_the_utility_theorem_bound() -> None:
    mech = Median(epsilon=1.0, lower=0.0, upper=100.0)
    m = mech.outputs
    assert m == 100 * 2**34  # [0, 100) on the lattice 2^-34
    beta = 0.05
    assert mech.rank_error(0.95) == pytest.approx(2 * (math.log(m - 1) + math.log((1 - beta) / beta)), rel=1e-12)
    # Halving ε doubles it; the level q and the data play no part.
    assert Median(epsilon=0.5, lower=0.0, upper=100.0).rank_error() == pytest.approx(2 * mech.rank_error())
    assert Quantile(epsilon=1.0, q=0.9, lower=0.0, upper=100.0).rank_error() == mech.rank_error()
    assert Quantiles(epsilon=3.0, qs=[0.25, 0.5, 0.75], lower=0.0, upper=100.0).rank_error() == mech.rank_error()


def test_rank_error_covers_at_its_confidence() -> None:
    """With the exact ε = 1, confidence 0.9: both tight data sets pass (see _coverage_holds)."""
    mech = Median(epsilon=1.0, lower=0.0, upper=100.0)
    assert _coverage_holds(mech, mech.rank_error(0.9), 0.9)


def test_rank_error_is_nearly_attained() -> None:
    """The bound is not loose on the tight data: with h = ⌊k⌋ + 1 misses happen with probability
    B/(1 + B) ≈ 0.089 (computed below); 20,000 draws land within 5σ of it (false failure ~6e-7)."""
    mech = Median(epsilon=1.0, lower=0.0, upper=100.0)
    k = mech.rank_error(0.9)
    h = math.floor(k) + 1
    b = (mech.outputs - 1) * math.exp(-mech.epsilon * h / 2)
    p = b / (1 + b)
    assert 0.08 < p <= 0.1
    misses = _rank_misses(mech, k, h, 20_000, SEED + 50)
    assert abs(binomial_z(misses, 20_000, p)) < 5


@pytest.mark.parametrize(
    "broken",
    [
        pytest.param(lambda m: m.rank_error(0.9) / 4, id="bound/4"),
        pytest.param(lambda m: replace(m, epsilon=2 * m.epsilon).rank_error(0.9), id="epsilon-misreported"),
    ],
)
def test_a_broken_rank_error_fails_the_coverage_check(broken) -> None:  # type: ignore[no-untyped-def]
    mech = Median(epsilon=1.0, lower=0.0, upper=100.0)
    assert not _coverage_holds(mech, broken(mech), 0.9)


@pytest.mark.parametrize("confidence", [0.0, 1.0, -0.5, float("nan"), "0.9"])
def test_rank_error_rejects_a_bad_confidence(confidence) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(InvalidParameterError, match="confidence"):
        Median(epsilon=1.0, lower=0.0, upper=100.0).rank_error(confidence)
