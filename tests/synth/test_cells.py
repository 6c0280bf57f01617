"""Rare cells merged after the one-way measurements are measured once: a merged cell of a pair
measurement gets one noisy count of scale σ (variance σ²), not the sum of its members' noisy
counts (variance k·σ² for k members) — at the same privacy cost: the merged cells partition the
rows, so one person still changes one count by one.

The old code summed the noisy counts: :func:`_summed` reproduces it, and the statistical test
refutes it (the power check). Statistical: each variance check compares the sample variance of
4,000 draws with bounds 0.8σ² and 1.25σ²; for σ² the estimate's standard deviation is
σ²·√(2/3999) ≈ 0.022σ², so a bound is more than 9 standard deviations away and the test falsely
fails with probability below 1e-18 (fixed seeds: reproducible). The summed twin has variance
25σ²: far outside."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import pytest

from dpkit.analytics import Categorical, Metadata
from dpkit.synth import Synthesizer
from dpkit.synth import cells as cells_module
from dpkit.synth.cells import compress, measure_merged, merge_rare, merged_sigma
from dpkit.synth.measure import noisy

SIGMA = 3.0
K = 25  # members of the merged cell
DRAWS = 4_000


def _table() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A 2 × (K + 2) table whose last K columns are merged into one (their counts are small)."""
    table = np.zeros((2, K + 2), dtype=np.int64)
    table[:, 0], table[:, 1] = 500, 300
    table[:, 2:] = 1
    rows = np.arange(2)
    cols = merge_rare(np.array([500.0, 300.0, *[1.0] * K]), 10.0)
    assert cols.tolist() == [0, 1, *[2] * K]
    return table, rows, cols


def _once(table: np.ndarray, rows: np.ndarray, cols: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    return measure_merged(compress(table, rows, cols, 2, 3), SIGMA, rng)


def _summed(table: np.ndarray, rows: np.ndarray, cols: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """The old measurement: every member noised, then summed into the merged cell."""
    return compress(noisy(table, SIGMA, rng), rows, cols, 2, 3)


def _merged_variance(measure: Any, seed: int) -> float:
    table, rows, cols = _table()
    rng = np.random.default_rng(seed)
    draws = np.array([measure(table, rows, cols, rng)[0, 2] for _ in range(DRAWS)])
    assert abs(draws.mean() - K) < 1.0 * np.sqrt(draws.var()) + 1  # unbiased (loose: any noise level)
    return float(draws.var(ddof=1))


def test_a_merged_cell_carries_sigma_squared() -> None:
    var = _merged_variance(_once, seed=11)
    assert 0.8 * SIGMA**2 < var < 1.25 * SIGMA**2, var


def test_summing_the_members_noisy_counts_is_caught() -> None:
    """The power check: the old summing gives the merged cell K·σ²."""
    var = _merged_variance(_summed, seed=12)
    assert not var < 1.25 * SIGMA**2, var
    assert var > 0.8 * K * SIGMA**2


def test_a_merged_one_way_cell_knows_it_sums_its_members() -> None:
    """The one-way marginals are measured before the merge is known, so a merged one-way cell
    is a sum of noisy counts: its σ for the model fit is σ·√members."""
    merge = np.array([0, 1, 2, 2, 2, 2])
    assert merged_sigma(merge, 2.0).tolist() == [2.0, 2.0, 4.0]


def test_the_synthesizer_measures_each_merged_cell_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Through a fit: every pair measurement draws one noise value per merged cell (the noised
    array has the merged shape), and the report counts the merged cells."""
    rng = np.random.default_rng(0)
    n = 3_000
    rare = tuple(f"r{i}" for i in range(20))
    frame = pd.DataFrame(
        {
            "country": np.where(rng.random(n) < 0.995, "us", rng.choice(np.array(rare), n)),
            "sex": rng.choice(["F", "M"], n),
            "y": rng.choice(["a", "b", "c"], n),
        }
    )
    meta = Metadata(
        columns={
            "country": Categorical(("us", *rare), nullable=False),
            "sex": Categorical(("F", "M"), nullable=False),
            "y": Categorical(("a", "b", "c"), nullable=False),
        },
        row_level=True,
    )
    shapes: list[tuple[int, ...]] = []
    original = cells_module.noisy

    def recording(counts: np.ndarray, sigma: float, rng: Any) -> np.ndarray:
        shapes.append(counts.shape)
        return original(counts, sigma, rng)

    monkeypatch.setattr(cells_module, "noisy", recording)
    syn = Synthesizer(epsilon=1.0, delta=1e-9, metadata=meta, rng=np.random.default_rng(1)).fit(frame)
    assert syn.report is not None
    merged = syn.report.merged["country"]
    assert merged >= 19  # the 20 rare countries (about 0.8 rows each) share one cell
    kept = 21 - merged
    pairs = [m for m in syn.report.measurements if m.how == "selected"]
    assert len(shapes) == len(pairs) == syn.planned_rounds
    sizes = {"country": kept, "sex": 2, "y": 3}
    for m, shape in zip(pairs, shapes, strict=True):
        assert shape == tuple(sizes[c] for c in m.columns) and m.cells == int(np.prod(shape)), (m, shape)
