"""Every quantile of a query result carries its accuracy: a rank error bound k in rows.

The bound is :meth:`~dpkit.mechanisms.candidate_quantile.CandidateQuantile.rank_error` of the
mechanism the query ran (ε per row, q, the candidate grid, the result's confidence): in each group,
with probability at least the confidence, the released value's rank error is at most k beyond the
grid's resolution at the quantile. It is in ``AggregateInfo.rank_error``, ``to_dict``, the text and
HTML of the result, the command line's table, and the notes, with a WARNING when a released count
shows groups for which k is at least half the count.

Statistical checks use fixed seeds; each docstring gives the probability that a fresh seed would
make a correct implementation fail (the false-failure rate). Independent repetitions are the
groups of one grouped query: each group's draw is independent of the others'.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats
from typer.testing import CliRunner

import dpkit as dp
from _stats import ALPHA
from dpkit.analytics import Categorical, Metadata, Numeric
from dpkit.cli import app


def _session(df: pd.DataFrame, meta: Metadata, seed: int) -> dp.Session:
    return dp.Session(
        df, metadata=meta, budget=dp.Budget(epsilon=1e3), rng=np.random.default_rng(seed)
    )  # seeded: tests only


def _small_groups() -> tuple[pd.DataFrame, Metadata]:
    """Two groups of 21 values near 200 on [0, 1000] (integer bounds: a unit grid, M = 1001)."""
    rng = np.random.default_rng(5)
    df = pd.DataFrame({"g": ["a"] * 21 + ["b"] * 21, "x": np.round(rng.normal(200.0, 30.0, 42))})
    return df, Metadata(columns={"x": Numeric(0, 1000), "g": Categorical(["a", "b"])}, row_level=True)


def _k(epsilon: float, q: float, candidates: int, confidence: float) -> float:
    """(2Δ/ε)·ln((M − 1)(1 − β)/β), Δ = max(q, 1 − q) (rows, add/remove), computed here."""
    beta = 1 - confidence
    return 2 * max(q, 1 - q) / epsilon * math.log((candidates - 1) * (1 - beta) / beta)


@pytest.mark.parametrize(
    ("sql", "name", "q"),
    [
        ("SELECT g, MEDIAN(x) FROM data GROUP BY g", "median_x", 0.5),
        ("SELECT g, PERCENTILE_CONT(0.9) WITHIN GROUP (ORDER BY x) AS p90 FROM data GROUP BY g", "p90", 0.9),
        ("SELECT g, QUANTILE_CONT(x, 0.25) AS q1 FROM data GROUP BY g", "q1", 0.25),
    ],
)
def test_every_quantile_carries_its_rank_error(sql: str, name: str, q: float) -> None:
    df, meta = _small_groups()
    r = _session(df, meta, 1).sql(sql, epsilon=0.25)
    (info,) = r.aggregates
    k = _k(0.25, q, 1001, 0.95)
    assert info.name == name and info.rank_error == pytest.approx(k, rel=1e-9)
    assert info.to_dict()["rank_error"] == pytest.approx(k, rel=1e-9)
    assert r.to_dict()["aggregates"][0]["rank_error"] == pytest.approx(k, rel=1e-9)
    # no value interval (its ends would be data values), the bound instead in every display
    assert r.table[f"{name}_low"].isna().all() and r.table[f"{name}_high"].isna().all()
    phrase = f"rank error ≤ {k:.4g} rows per group"
    assert phrase in str(r) and phrase in r._repr_html_()
    (note,) = [n for n in r.notes if n.startswith(f"{name}:")]
    assert f"rank error at most {k:.1f} rows with 0.95 confidence" in note
    assert f"fewer than {2 * k:.0f} rows" in note


def test_the_bound_follows_epsilon_per_row_and_the_confidence() -> None:
    """With a privacy unit of up to 2 rows per group and 2 groups, each row gets ε/(2·2)."""
    rng = np.random.default_rng(2)
    df = pd.DataFrame(
        {"uid": np.repeat(np.arange(300), 2), "g": rng.choice(["a", "b"], 600), "x": rng.integers(0, 100, 600)}
    )
    meta = Metadata(columns={"x": Numeric(0, 100), "g": Categorical(["a", "b"])}, privacy_unit="uid")
    s = dp.Session(
        df, metadata=meta, max_groups=2, max_rows=2, budget=dp.Budget(epsilon=10.0), rng=np.random.default_rng(0)
    )
    r = s.sql("SELECT g, MEDIAN(x) FROM data GROUP BY g", epsilon=1.0, confidence=0.9)
    assert r.aggregates[0].rank_error == pytest.approx(_k(1.0 / 4, 0.5, 101, 0.9), rel=1e-9)


def test_counts_turn_the_bound_into_a_warning_for_small_groups() -> None:
    """The issue's case: groups of 21 at ε = 0.25 have k ≈ 39 rows, more than half of each group
    (the median may be anywhere), and a released COUNT(*) makes that a WARNING."""
    df, meta = _small_groups()
    r = _session(df, meta, 3).sql("SELECT g, COUNT(*), MEDIAN(x) FROM data GROUP BY g", epsilon=0.5)
    counts = r.table["count"].to_numpy()
    k = r.aggregates[1].rank_error
    assert np.all(k >= np.maximum(counts, 1) / 2)  # noise scale 4: the counts stay below 78
    (note,) = [n for n in r.notes if "median_x" in n]
    assert note.startswith("WARNING: median_x: rank error at most 39.4 rows")
    assert "in 2 of 2 group(s) k is at least half the noisy count" in note
    assert math.isnan(r.aggregates[0].rank_error) and r.aggregates[0].to_dict()["rank_error"] is None


def test_large_groups_get_a_quantile_level_band_and_no_warning() -> None:
    rng = np.random.default_rng(4)
    df = pd.DataFrame({"g": rng.choice(["a", "b"], 4000), "x": np.round(rng.normal(200.0, 30.0, 4000))})
    meta = Metadata(columns={"x": Numeric(0, 1000), "g": Categorical(["a", "b"])}, row_level=True)
    r = _session(df, meta, 5).sql("SELECT g, COUNT(*), MEDIAN(x) FROM data GROUP BY g", epsilon=0.5)
    (note,) = [n for n in r.notes if "median_x" in n]
    assert not note.startswith("WARNING")
    # k ≈ 39.4 rows over about 2000 rows a group: a level of 0.5 ± 0.02
    assert re.search(r"in each group a quantile level of 0\.5 ±0\.02", note), note


def _tight_groups(groups: int, h: int) -> tuple[list[str], np.ndarray]:
    """``groups`` groups of 2h rows: h at 99.5 and h at 100.5, strictly between the unit grid's
    candidates. The candidate 100 has rank error 0 and score 0; every other one rank error h and
    score −h, so a group misses a bound below h with probability B/(1 + B), B = 200·e^{−ε·h}."""
    return [f"h{h}_{i:04d}" for i in range(groups)], np.array([99.5] * h + [100.5] * h)


def test_the_rank_error_covers_and_a_broken_one_is_caught() -> None:
    """One query of 2000 groups at ε = 1, confidence 0.95 (k = ln(200·19) = 8.24 rows): 1000
    groups with h = 9 (a miss of the true k has probability 200·e^{−9}/(1 + 200·e^{−9}) = 0.024,
    just under 0.05) and 1000 with h = 5 (the true k never misses; a bound below 5 misses with
    probability 200·e^{−5}/(1 + 200·e^{−5}) = 0.57). The check — a one-sided binomial test of
    "misses <= 5 % of the groups" at ALPHA = 1e-6 — passes the true bound (false failure <= 1e-6)
    and fails the broken ones: k/4 and the k of a misreported ε (2ε: k/2) miss about 600 times."""
    names, rows = [], []
    for h in (9, 5):
        keys, values = _tight_groups(1000, h)
        names += keys
        rows += [(key, x) for key in keys for x in values]
    df = pd.DataFrame(rows, columns=["g", "x"])
    meta = Metadata(columns={"x": Numeric(0, 200), "g": Categorical(names)}, row_level=True)
    r = _session(df, meta, 11).sql("SELECT g, MEDIAN(x) FROM data GROUP BY g", epsilon=1.0)
    k = r.aggregates[0].rank_error
    assert k == pytest.approx(math.log(200 * 19), rel=1e-9)
    out = r.table.set_index("g")["median_x"].loc[names].to_numpy()
    h = np.repeat([9, 5], 1000)
    errors = np.where(out == 100.0, 0, h)  # every other candidate is h rows off

    def covers(bound: float) -> bool:
        misses = int(np.count_nonzero(errors > bound))
        return stats.binomtest(misses, errors.size, 0.05, alternative="greater").pvalue >= ALPHA

    assert covers(k)
    assert not covers(k / 4)
    assert not covers(k / 2)


def test_the_command_line_shows_the_bound_instead_of_a_dash(tmp_path: Path) -> None:
    runner = CliRunner()
    data, meta, ledger = tmp_path / "census.csv", tmp_path / "census.json", tmp_path / "ledger.sqlite"
    made = runner.invoke(app, ["generate", "census", str(data), "--people", "500", "--metadata", str(meta)])
    assert made.exit_code == 0, made.output
    made = runner.invoke(app, ["budget", "create", str(data), "ann", "--epsilon", "3", "--ledger", str(ledger)])
    assert made.exit_code == 0, made.output
    args = ["query", str(data), "SELECT MEDIAN(age) FROM census", "--epsilon", "1",
            "--metadata", str(meta), "--ledger", str(ledger), "--analyst", "ann"]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "rank ±" in text and "rank error ≤" in text, text  # the table's cell, the line below it
