"""The synthetic report compares the noise with the table: σ (public, from the plan) against the
noisy row count (public once released). It warns — in the report object, its text, and the
``dpkit synth`` output — when the noise alone moves some column's one-way marginal by more than
10 % in total variation (ε too small for the table), and stays quiet on a large table.

Before, no report said so (a 344-row table at ε = 1 got σ ≈ 30 per cell without a word).
Deterministic (fixed seeds); the tiny table's expected noise share is twice the threshold and the
large table's under a fifth of it, far beyond what the noisy row count can move."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dpkit.analytics import Categorical, Metadata, Numeric
from dpkit.synth import Synthesizer
from dpkit.synth.report import NOISE_WARNING, noise_share, noise_warnings

META = Metadata(
    columns={
        "species": Categorical(("Adelie", "Chinstrap", "Gentoo"), nullable=False),
        "island": Categorical(("Biscoe", "Dream", "Torgersen"), nullable=False),
        "mass": Numeric(2_500, 6_500, nullable=False),
        "year": Categorical((2007, 2008, 2009), nullable=False),
    },
    row_level=True,
)


def _frame(n: int, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    species = rng.choice(["Adelie", "Chinstrap", "Gentoo"], n, p=[0.44, 0.2, 0.36])
    island = np.where(
        species == "Gentoo",
        "Biscoe",
        np.where(species == "Chinstrap", "Dream", rng.choice(["Biscoe", "Dream", "Torgersen"], n)),
    )
    mass = np.where(species == "Gentoo", 5_000.0, 3_700.0) + rng.normal(0, 400, n)
    return pd.DataFrame({"species": species, "island": island, "mass": mass, "year": rng.choice([2007, 2008, 2009], n)})


def test_a_tiny_table_at_small_epsilon_is_warned() -> None:
    syn = Synthesizer(epsilon=1.0, delta=1e-9, metadata=META, bins={"mass": 10}, rng=np.random.default_rng(1))
    syn.fit(_frame(344))
    report = syn.report
    assert report is not None and len(report.warnings) == 1
    warning = report.warnings[0]
    assert "ε=1 is small for" in warning and "'mass'" in warning and "(10 cells)" in warning
    assert report.to_text().startswith(f"warning: {warning}")
    widest = max((m for m in report.measurements if m.how == "one-way"), key=lambda m: m.cells)
    assert noise_share(widest.sigma, widest.cells, report.rows) > 2 * NOISE_WARNING


def test_a_large_table_is_not_warned() -> None:
    syn = Synthesizer(epsilon=1.0, delta=1e-9, metadata=META, bins={"mass": 10}, rng=np.random.default_rng(2))
    syn.fit(_frame(50_000))
    report = syn.report
    assert report is not None and report.warnings == () and "warning" not in report.to_text()
    widest = max((m for m in report.measurements if m.how == "one-way"), key=lambda m: m.cells)
    assert noise_share(widest.sigma, widest.cells, report.rows) < NOISE_WARNING / 5
    assert "noise against rows: σ=" in report.to_text()


def test_the_rule_names_the_worst_column_and_counts_the_others() -> None:
    from dpkit.synth.report import Measurement

    ms = [
        Measurement(("a",), 30.0, 3, 1e-3, "one-way"),
        Measurement(("b",), 30.0, 12, 1e-3, "one-way"),
        Measurement(("c",), 30.0, 2, 1e-3, "one-way"),
        Measurement(("a", "b"), 30.0, 36, 1e-3, "selected"),  # pairs do not trigger the warning
    ]
    (only,) = noise_warnings(ms, 344.0, 1.0)
    assert "one-way marginal of 'b' (12 cells)" in only and "and 1 other column by more than 10%" in only
    assert noise_warnings(ms, 100_000.0, 1.0) == ()


@pytest.mark.parametrize(("rows", "warned"), [(344, True), (50_000, False)])
def test_dpkit_synth_prints_the_warning(tmp_path: Path, rows: int, warned: bool) -> None:
    from typer.testing import CliRunner

    from dpkit.cli import app

    _frame(rows).to_csv(tmp_path / "penguins.csv", index=False)
    (tmp_path / "meta.json").write_text(json.dumps(META.to_dict()))
    args = ["synth", str(tmp_path / "penguins.csv"), "--metadata", str(tmp_path / "meta.json"), "--epsilon", "1",
            "--delta", "1e-9", "--out", str(tmp_path / "out.csv"), "--bins", "mass=10", "--rows", "100",
            "--report", str(tmp_path / "report.txt")]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert ("warning: ε=1 is small" in result.output) == warned
    assert ("warning: ε=1 is small" in (tmp_path / "report.txt").read_text()) == warned
    assert not pd.read_csv(tmp_path / "out.csv").isna().any().any()  # every column declared never missing
