"""The CLI tests' example data: ``dpkit generate census`` into a temporary folder and a budget for
the analyst ``ann`` on it, both made through the command line itself."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from dpkit.cli import app


def census_with_budget(
    tmp_path: Path, *, people: int = 2000, epsilon: str = "1", delta: str | None = None
) -> tuple[Path, Path, Path]:
    """(data file, metadata file, ledger) with ``ann``'s budget of (``epsilon``, ``delta``) on the data."""
    runner = CliRunner()
    data, meta, ledger = tmp_path / "census.csv", tmp_path / "census.json", tmp_path / "ledger.sqlite"
    made = runner.invoke(app, ["generate", "census", str(data), "--people", str(people), "--metadata", str(meta)])
    assert made.exit_code == 0, made.output
    args = ["budget", "create", str(data), "ann", "--epsilon", epsilon, "--ledger", str(ledger)]
    created = runner.invoke(app, args + (["--delta", delta] if delta is not None else []))
    assert created.exit_code == 0, created.output
    return data, meta, ledger
