"""``dpkit query`` gets binned histograms through SQL's ``BIN(...)``: the builder's labels, one
spend from the ledger, and a bad BIN refused before anything is spent."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

import dpkit
from _cli_census import census_with_budget
from dpkit.analytics import Metadata
from dpkit.cli import app
from dpkit.ledger.identity import dataset_identity

runner = CliRunner()


def _census(tmp_path: Path) -> tuple[Path, Path, Path]:
    return census_with_budget(tmp_path, people=1000)


def test_query_runs_a_binned_histogram_and_refuses_a_bad_bin(tmp_path: Path) -> None:
    data, meta, ledger = _census(tmp_path)
    base = ["--epsilon", "0.5", "--metadata", str(meta), "--ledger", str(ledger), "--analyst", "ann"]
    spends = lambda: dpkit.open_ledger(ledger).list_spends(dataset_identity(data), "ann")  # noqa: E731

    bad = runner.invoke(
        app, ["query", str(data), "SELECT BIN(hours_per_week, 0) AS h, COUNT(*) FROM census GROUP BY h", *base]
    )
    assert (
        bad.exit_code == 1
        and "BIN(hours_per_week, 0)" in bad.output
        and "whole number >= 1" in " ".join(bad.output.split())
    )
    assert spends() == []

    sql = "SELECT sex, BIN(hours_per_week, 4) AS h, COUNT(*) FROM census GROUP BY sex, h"
    result = runner.invoke(app, ["query", str(data), sql, *base, "--json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)["rows"]
    # the builder's labels for 4 bins over the declared bounds [1, 80], on the same metadata
    s = dpkit.Session(data, metadata=Metadata.from_json(meta), budget=dpkit.Budget(epsilon=1.0), table="census")
    labels = list(s.histogram("hours_per_week", bins=4, epsilon=1.0).table["hours_per_week"])
    assert labels == ["[1, 20.75)", "[20.75, 40.5)", "[40.5, 60.25)", "[60.25, 80]"]
    assert [(r["sex"], r["hours_per_week"]) for r in rows] == [
        (sex, label) for sex in ("Female", "Male") for label in labels
    ]
    assert [x.query_text for x in spends()] == [sql]
