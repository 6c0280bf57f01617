"""A mean's own noise scale and interval (not its sum's).

A private mean is released as m + (noisy centred sum) / (noisy count). Its ``scale`` is the
approximate standard deviation of the released mean's noise, in the mean's units, from the noisy
parts alone (delta method); the sum's noise scale stays available as ``sum_scale``. Its interval
combines the intervals of the noisy sum and the noisy count, each at confidence 1 − β/2 (a union
bound), taking the extreme ratios, and is the whole declared range when the count's interval
reaches below 1.

Every statistical check uses a fixed seed (so it passes or fails the same way each run); the
docstrings give the probability that a fresh seed would make it fail although the code is right
(the false-failure rate). Independent repetitions are groups of one grouped query: each group's
noise is drawn independently of the others'.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

import dpkit as dp
from dpkit.analytics import Categorical, Count, Mean, Metadata, Numeric, Std, Variance
from dpkit.analytics import execute as execute_module
from dpkit.analytics.plan import quantize_spec
from dpkit.cli import app
from dpkit.mechanisms.laplace import Geometric

LOWER, UPPER = 0, 250_000  # the income bounds of the new user's report
CENTRE = (LOWER + UPPER) / 2
NORMAL_975 = 1.959963984540054  # the 0.975 quantile of the standard normal


def _grouped_frame(keys: int, rows: int, values: np.ndarray) -> tuple[pd.DataFrame, Metadata]:
    """``keys`` public groups of ``rows`` rows each; ``values`` (keys × rows integers) are the
    incomes. Integers are exact on the sum's grid (2^-7 for these bounds), so the bounded
    statistic is the plain mean of the clipped values."""
    names = [f"k{i:04d}" for i in range(keys)]
    df = pd.DataFrame({"g": np.repeat(names, rows), "income": values.reshape(-1)})
    meta = Metadata(columns={"income": Numeric(LOWER, UPPER), "g": Categorical(names)}, row_level=True)
    return df, meta


def _session(df: pd.DataFrame, meta: Metadata, seed: int, **budget: Any) -> dp.Session:
    return dp.Session(
        df, metadata=meta, budget=dp.Budget(epsilon=1e3, **budget), rng=np.random.default_rng(seed)
    )  # seeded: tests only


# -- the scale is the mean's, in the mean's units -------------------------------------------------


def test_a_means_scale_is_in_the_means_units_and_the_sums_stays_available() -> None:
    """The report's case: incomes bounded by (0, 250 000). The sum inside the mean has noise
    scale (U − L)/2 / (ε/2) = 500 000 at ε = 0.5; the mean's own noise is that divided by about
    n = 5000, so its standard deviation is a few hundred."""
    rng = np.random.default_rng(11)
    df = pd.DataFrame({"income": rng.integers(10_000, 120_000, 5000)})
    meta = Metadata(columns={"income": Numeric(LOWER, UPPER)}, row_level=True)
    r = _session(df, meta, 0).mean("income", epsilon=0.5)
    (a,) = r.aggregates
    assert a.sum_scale == pytest.approx(500_000, rel=1e-9)  # the number scale used to show
    assert dict(a.noise_scales) == {"count": pytest.approx(4.0, rel=1e-9), "sum": a.sum_scale}
    assert isinstance(r.scale, float) and r.scale == a.scale == a.scales[0]
    # √(2·500 000² + d²·2·4²) / 5000 with |d| ≤ 125 000: between 141 and 208
    assert 100 < r.scale < 250 and r.scale < a.sum_scale / 1000
    assert a.scale_label == "approx. std. dev. of the mean" and a.is_ratio
    d = a.to_dict()
    assert d["scale"] == a.scale and d["scale_label"] == a.scale_label
    assert d["noise_scales"] == {"count": a.noise_scales[0][1], "sum": a.sum_scale}
    json.dumps(r.to_dict())  # still JSON-ready
    # what is printed is the mean's own
    text = str(r)
    assert f"approx. std. dev. of the mean {a.scale:.4g}" in text and "5e+05" not in text
    assert f"approx. std. dev. of the mean {a.scale:.4g}" in r._repr_html_()


def test_counts_and_sums_keep_their_noise_scale() -> None:
    df, meta = _grouped_frame(3, 50, np.full((3, 50), 1000))
    r = _session(df, meta, 1).group_by("g").aggregate([Count(), dp.analytics.Sum("income")], epsilon=1.0)
    count, total = r.aggregates
    assert count.scale == pytest.approx(2.0) and count.scale_label == "noise scale" and not count.is_ratio
    assert total.scale == pytest.approx(250_000 / 0.5) and total.sum_scale == total.scale
    assert count.scales == () and math.isnan(count.sum_scale)
    assert "count: count, laplace, ε=0.5, δ=0, noise scale 2" in str(r)


def test_grouped_means_have_each_groups_own_scale() -> None:
    """Small groups have noisier means: the scale follows each group's noisy count."""
    sizes = [20, 200, 2000]
    names = ["small", "medium", "large"]
    df = pd.DataFrame({"g": np.repeat(names, sizes), "income": 50_000})
    meta = Metadata(columns={"income": Numeric(LOWER, UPPER), "g": Categorical(names)}, row_level=True)
    r = _session(df, meta, 2).group_by("g").mean("income", epsilon=1.0)
    scale = r.scale
    assert isinstance(scale, pd.Series) and list(scale.index) == names
    assert scale["small"] > scale["medium"] > scale["large"]
    (a,) = r.aggregates
    assert a.scale == max(a.scales) == scale["small"] and a.scale_range() == (scale["large"], scale["small"])
    low, high = a.scale_range()
    assert f"approx. std. dev. of the mean {low:.4g} to {high:.4g} across the groups" in str(r)


@pytest.mark.parametrize("kind", ["var", "std"])
def test_variance_and_std_scales_are_their_own(kind: str) -> None:
    rng = np.random.default_rng(12)
    df = pd.DataFrame({"income": rng.integers(10_000, 120_000, 5000)})
    meta = Metadata(columns={"income": Numeric(LOWER, UPPER)}, row_level=True)
    agg = Variance("income") if kind == "var" else Std("income")
    r = _session(df, meta, 3).aggregate([agg], epsilon=1.0)
    (a,) = r.aggregates
    assert a.is_ratio and set(dict(a.noise_scales)) == {"count", "sum", "sum_of_squares"}
    label = "the variance" if kind == "var" else "the standard deviation"
    assert a.scale_label == f"approx. std. dev. of {label}"
    top = ((UPPER - LOWER) / 2) ** 2
    assert 0 < a.scale < (top / 2 if kind == "var" else (UPPER - LOWER) / 4)


# -- the scale matches the spread of the released means ------------------------------------------


@pytest.mark.parametrize(
    ("kind", "noise"),
    [("mean", "laplace"), ("mean", "gaussian"), ("var", "laplace"), ("std", "laplace")],
)
def test_the_scale_matches_the_empirical_spread(kind: str, noise: str) -> None:
    """500 groups holding the same 1000 incomes: each group's released value is an independent
    draw of the same noise. The standard deviation of (released − true) over the groups is within
    20 % of the mean reported scale. The sample standard deviation of 500 draws of noise with
    kurtosis κ ≤ 9 has relative standard error about √((κ − 1)/(4·500)) ≤ 0.063, so 20 % is at
    least 3.2 of them (false failure below about 1e-3; at ε = 1 the delta method's own error,
    measured, is under 7 %). With seed 5 the ratios measured are 0.96–1.004."""
    keys, rows = 500, 1000
    base = np.random.default_rng(7).integers(0, 120_000, rows)
    df, meta = _grouped_frame(keys, rows, np.tile(base, (keys, 1)))
    truth = {"mean": base.mean(), "var": base.var(), "std": base.std()}[kind]
    agg = {"mean": Mean, "var": Variance, "std": Std}[kind]("income")
    if noise == "gaussian":
        s = _session(df, meta, 5, delta=1e-3, accountant="pld")
        r = s.group_by("g").aggregate([agg], epsilon=1.0, delta=1e-6, noise="gaussian")
    else:
        s = _session(df, meta, 5)
        r = s.group_by("g").aggregate([agg], epsilon=1.0)
    (a,) = r.aggregates
    errors = r.table[a.name].to_numpy() - truth
    ratio = errors.std() / np.mean(a.scales)
    assert 0.8 < ratio < 1.2, ratio
    if kind == "mean":  # same-sized groups: about the same scale (a std's follows its noisy variance)
        assert np.ptp(a.scales) < 0.1 * np.mean(a.scales)


# -- the interval ---------------------------------------------------------------------------------


def _noisy_parts(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, float, Any]]:
    """Records what ``execute._release`` draws: (mechanism, β share, noisy part). A spy: the
    release is unchanged."""
    calls: list[tuple[Any, float, Any]] = []
    real = execute_module._release

    def spy(mech: Any, ints: np.ndarray, beta: float, src: Any) -> Any:
        out = real(mech, ints, beta, src)
        calls.append((mech, beta, out))
        return out

    monkeypatch.setattr(execute_module, "_release", spy)
    return calls


@pytest.mark.parametrize("noise", ["laplace", "gaussian"])
def test_the_mean_interval_covers_and_a_too_narrow_one_is_caught(noise: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Coverage of the 95 % interval of a mean over 2000 groups of 10 rows (small counts, so the
    count's noise matters), incomes near the lower bound (where the count's noise moves the mean
    most). The check fails when more than 140 of the 2000 true means fall outside their interval
    (coverage below 93 %): for an interval of exactly 95 % coverage that has probability
    P[Binomial(2000, 0.05) > 140] = 4.1e-5. Ours is conservative (union bound, worst-case
    ratios): measured 99.6–99.9 % with Laplace noise and 100 % with Gaussian (seeds 8–10).

    Power: the broken twin takes the noisy sum's own 95 % interval (no union bound; ±1.96σ for
    Gaussian noise) divided by the noisy count, ignoring the count's noise, on the very draws of
    the release — measured 88–89 % (Laplace) and 83–86 % (Gaussian) coverage — and the same check
    must fail it; a twin of 90 % coverage passes it with probability
    P[Binomial(2000, 0.10) ≤ 140] = 1.7e-6."""
    keys, rows = 2000, 10
    values = np.random.default_rng(21).integers(0, 20_000, (keys, rows))
    df, meta = _grouped_frame(keys, rows, values)
    truth = values.mean(axis=1)
    calls = _noisy_parts(monkeypatch)
    if noise == "gaussian":
        # ε = 4: at ε = 1 nearly every count interval of 10 rows reaches below 1 (the whole range)
        s = _session(df, meta, 8, delta=1e-3, accountant="pld")
        r = s.group_by("g").mean("income", epsilon=4.0, delta=1e-5, noise="gaussian")
    else:
        r = _session(df, meta, 8).group_by("g").mean("income", epsilon=1.0)
    assert r.confidence == 0.95
    assert list(r.table["g"]) == [f"k{i:04d}" for i in range(keys)]  # rows in the order of truth
    low, high = r.table["mean_income_low"].to_numpy(), r.table["mean_income_high"].to_numpy()
    misses = int(np.sum((truth < low) | (truth > high)))
    assert misses <= 140, misses

    # the twin, on the very draws of this release
    (count_mech, beta_n, count), (sum_mech, beta_s, total) = sorted(calls, key=lambda c: c[0].sensitivity)
    assert beta_n == beta_s == pytest.approx(0.05 / 2)  # the union bound: each part at 1 − β/2
    spec = quantize_spec("s", "income", LOWER, UPPER, centered=True)
    # the sum's own 95 % half-width: the exact discrete Laplace tail, or ±1.96σ for Gaussian noise
    # (not the looser sub-Gaussian bound the release uses)
    half = float(sum_mech.error_bound(0.05) - 1) if isinstance(sum_mech, Geometric) else NORMAL_975 * total.scale
    c_hat = np.maximum(count.values, 1.0)
    naive_low = np.clip(CENTRE + (total.values - half) * spec.unit / c_hat, LOWER, UPPER)
    naive_high = np.clip(CENTRE + (total.values + half) * spec.unit / c_hat, LOWER, UPPER)
    naive_misses = int(np.sum((truth < naive_low) | (truth > naive_high)))
    assert naive_misses > 140, naive_misses
    # the released value is the twin's centre: same draws, same mean
    assert np.allclose(r.table["mean_income"], np.clip(CENTRE + total.values * spec.unit / c_hat, LOWER, UPPER))


def test_a_count_interval_below_one_gives_the_declared_range() -> None:
    """An empty group at small ε: the count's interval reaches below 1, so nothing bounds the
    mean but the declared bounds — the interval is all of them, and the scale is at most half
    the range (the released mean lies within the bounds)."""
    names = ["empty", "full"]
    df = pd.DataFrame({"g": ["full"] * 3000, "income": 40_000})
    meta = Metadata(columns={"income": Numeric(LOWER, UPPER), "g": Categorical(names)}, row_level=True)
    r = _session(df, meta, 4).group_by("g").mean("income", epsilon=0.1)
    row = r.table.set_index("g")
    # count noise scale 20: the interval's half-width is 20·ln 40 ≈ 74, the noisy count of the
    # empty group would have to exceed 75 (probability e^-3.7 / 2 ≈ 1 %; not with this seed)
    assert (row.loc["empty", "mean_income_low"], row.loc["empty", "mean_income_high"]) == (LOWER, UPPER)
    assert row.loc["full", "mean_income_low"] > LOWER and row.loc["full", "mean_income_high"] < UPPER
    # full: √(2·(2.5e6)² + 85 000²·2·20²) / 3000 ≈ 1430
    assert r.scale["empty"] <= (UPPER - LOWER) / 2 and 1000 < r.scale["full"] < 2000


def test_the_plot_shows_the_means_interval() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.container import ErrorbarContainer

    df, meta = _grouped_frame(3, 400, np.random.default_rng(3).integers(0, 100_000, (3, 400)))
    r = _session(df, meta, 6).group_by("g").mean("income", epsilon=1.0)
    ax = r.plot()
    try:
        (bars,) = [c for c in ax.containers if isinstance(c, ErrorbarContainer)]
        segments = bars.lines[2][0].get_segments()
        ends = sorted((min(s[0][1], s[1][1]), max(s[0][1], s[1][1])) for s in segments)
        want = sorted(zip(r.table["mean_income_low"], r.table["mean_income_high"], strict=True))
        assert np.allclose(ends, want)
        assert max(h - lo for lo, h in ends) < 40 * max(r.aggregates[0].scales)  # the mean's, not the sum's
    finally:
        plt.close(ax.figure)


# -- the command line -----------------------------------------------------------------------------


def test_dpkit_query_prints_the_means_own_scale(tmp_path: Path) -> None:
    """``dpkit query`` on the census example: AVG(income) at ε = 1 (ε = 0.5 on the sum, whose
    sensitivity is 2 rows × 125 000): the sum's noise scale is 500 000; the mean's standard
    deviation, printed, is a few hundred."""
    runner = CliRunner()
    data, meta, ledger = tmp_path / "census.csv", tmp_path / "census.json", tmp_path / "ledger.sqlite"
    made = runner.invoke(app, ["generate", "census", str(data), "--people", "2000", "--metadata", str(meta)])
    assert made.exit_code == 0, made.output
    made = runner.invoke(app, ["budget", "create", str(data), "ann", "--epsilon", "3", "--ledger", str(ledger)])
    assert made.exit_code == 0, made.output
    args = ["query", str(data), "SELECT AVG(income) FROM census", "--epsilon", "1",
            "--metadata", str(meta), "--ledger", str(ledger), "--analyst", "ann"]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    found = re.search(r"approx\. std\. dev\. of the mean ([\d,.]+)", text)
    assert found is not None, text
    printed = float(found.group(1).replace(",", ""))
    assert 100 < printed < 5000  # √2·500 000 / (about 2600 rows) ≈ 300, plus the count's share
    assert "500,000" not in text and "noise scale of its sum" not in text
    doc = json.loads(runner.invoke(app, [*args, "--json"]).stdout)
    (agg,) = doc["aggregates"]
    assert agg["scale_label"] == "approx. std. dev. of the mean" and 100 < agg["scale"] < 5000
    assert agg["noise_scales"]["sum"] == pytest.approx(500_000, rel=1e-9)
