"""The data check's row norms: the share of rows a given data_norm would scale (curator only).

Exact counts on a small table whose norms are known, through ``check_data`` and ``dpkit check``;
bad options are refused before the data is read.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from dpkit.analytics import Categorical, Metadata, Numeric, check_data
from dpkit.cli import app
from dpkit.errors import InvalidParameterError

META = Metadata(
    row_level=True,
    columns={
        "mass_g": Numeric(0, 6500),
        "flipper_mm": Numeric(0, 235),
        "year": Numeric(),
        "species": Categorical(("Adelie", "Gentoo")),
    },
)
# Norms of (mass_g, flipper_mm): 5, 10, 13, 5000-ish, and one row without a mass.
FRAME = pd.DataFrame(
    {
        "mass_g": [3.0, 6.0, 12.0, 5000.0, None],
        "flipper_mm": [4.0, 8.0, 5.0, 200.0, 190.0],
        "year": [2007.0, 2008.0, 2009.0, 2007.0, 2008.0],
        "species": ["Adelie", "Gentoo", "Adelie", "Gentoo", "Adelie"],
    }
)


def test_the_rows_above_data_norm_are_counted() -> None:
    report = check_data(FRAME, META, features=["mass_g", "flipper_mm"], data_norm=10.0)
    n = report.norms
    assert n is not None
    assert (n.rows, n.rows_missing, n.scaled) == (4, 1, 2)  # 13 and ~5004 are above 10; 10 is not
    assert n.share == 0.5
    assert n.norm_max == pytest.approx(math.hypot(5000.0, 200.0))
    assert n.bounded_norm == math.sqrt(2)
    text = report.to_text()
    assert "2 of 4 rows (50.00%) have a larger ℓ2 norm" in text and "BoundsScaler" in text
    assert report.to_dict()["norms"]["scaled"] == 2
    # Not asked for: nothing counted, nothing said.
    assert check_data(FRAME, META).norms is None and "ℓ2 norm" not in check_data(FRAME, META).to_text()


def test_unbounded_features_are_counted_without_the_scaler_hint() -> None:
    report = check_data(FRAME, META, features=["year"], data_norm=2008.0)
    assert report.norms is not None and report.norms.scaled == 1 and report.norms.bounded_norm is None
    assert "BoundsScaler" not in report.to_text()


@pytest.mark.parametrize(
    "features, data_norm, bad",
    [
        (["mass_g"], None, "data_norm"),
        (None, 1.0, "features"),
        (["species"], 1.0, "features"),
        (["nope"], 1.0, "features"),
        (["mass_g", "mass_g"], 1.0, "features"),
        ("mass_g", 1.0, "features"),
        (["mass_g"], 0.0, "data_norm"),
        (["mass_g"], float("inf"), "data_norm"),
    ],
)
def test_bad_options_are_refused_before_reading(features: object, data_norm: object, bad: str) -> None:
    with pytest.raises(InvalidParameterError) as info:
        check_data(Path("no such file.csv"), META, features=features, data_norm=data_norm)  # type: ignore[arg-type]
    assert info.value.name == bad


def test_dpkit_check_reports_the_share(tmp_path: Path) -> None:
    data, meta = tmp_path / "penguins.csv", tmp_path / "penguins.json"
    FRAME.to_csv(data, index=False)
    meta.write_text(json.dumps(META.to_dict()), encoding="utf-8")
    runner = CliRunner()
    args = ["check", str(data), "--metadata", str(meta), "--data-norm", "10", "--features", "mass_g, flipper_mm"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "2 of 4 rows (50.00%) have a larger ℓ2 norm and would be scaled down" in result.output
    assert "1 row with a missing feature not counted" in result.output
    result = runner.invoke(app, [*args, "--json"])
    assert json.loads(result.output)["norms"]["share"] == 0.5
    bad = runner.invoke(app, ["check", str(data), "--metadata", str(meta), "--features", "species", "--data-norm", "1"])
    assert bad.exit_code == 2 and "--features species is not accepted" in bad.output
    alone = runner.invoke(app, ["check", str(data), "--metadata", str(meta), "--data-norm", "1"])
    assert alone.exit_code == 2 and "--features is missing" in alone.output
