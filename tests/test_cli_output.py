"""What the ``dpkit`` command line prints for a person to read: every command's one-line help is a
whole sentence, and a query's table is never cut or folded to fit a narrow terminal."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import click
import typer
from typer.testing import CliRunner

from _cli_census import census_with_budget
from dpkit.cli import app

runner = CliRunner()


def _commands(group: click.Command, path: tuple[str, ...] = ()) -> list[tuple[str, click.Command]]:
    out = []
    for name, sub in sorted(getattr(group, "commands", {}).items()):
        out.append((" ".join((*path, name)), sub))
        out += _commands(sub, (*path, name))
    return out


def _short_help(command: click.Command) -> str:
    """What ``--help`` lists for a command: its help's first paragraph, as Typer takes it."""
    return inspect.cleandoc(command.short_help or command.help or "").split("\n\n")[0]


def test_every_command_lists_one_whole_sentence() -> None:
    """Typer lists a command by its docstring's first paragraph, line breaks kept: a paragraph of
    two lines was shown broken mid-phrase, and synth's ended at "Example:" (its example being the
    next paragraph). Each is now one line, a sentence ending with a full stop."""
    commands = _commands(typer.main.get_command(app))
    assert len(commands) > 20
    bad = {name: first for name, cmd in commands if (first := _short_help(cmd)).count("\n") or first[-1:] != "."}
    assert bad == {}


def test_the_command_list_shows_no_cut_sentence() -> None:
    out = runner.invoke(app, ["--help"], env={"COLUMNS": "200"}).output
    panel = out[out.index("Commands") :]
    assert "Example:" not in panel
    assert "Release a synthetic table: noisy marginals measured once, a model fitted to them, rows sampled." in panel


def _census(tmp_path: Path) -> tuple[Path, Path, Path]:
    return census_with_budget(tmp_path, epsilon="10")


def test_a_query_table_is_whole_in_a_narrow_terminal(tmp_path: Path) -> None:
    """At 40 columns rich squeezed the table: headers cut to "mean_hour…" and intervals broken
    over two lines. The table is now printed at its own width, every header and interval whole."""
    data, meta, ledger = _census(tmp_path)
    sql = "SELECT education, COUNT(*), AVG(hours_per_week) FROM census GROUP BY education"
    args = ["query", str(data), sql, "--epsilon", "1", "--metadata", str(meta), "--ledger", str(ledger)]
    result = runner.invoke(app, [*args, "--analyst", "ann"], env={"COLUMNS": "40"})
    assert result.exit_code == 0, result.output
    out = result.stdout
    header = next((line for line in out.splitlines() if "education" in line and "count" in line), out)
    for name in ("education", "count", "mean_hours_per_week", "95% CI"):
        assert name in header, header
    assert "…" not in out.split("privacy unit")[0]
    rows = [line for line in out.splitlines() if line.startswith("│")]
    assert len(rows) == 8  # one line for each declared education level
    for row in rows:  # two aggregates, each with its whole interval on the row's one line
        assert len(re.findall(r"\[-?[\d,.e+-]+, -?[\d,.e+-]+\]", row)) == 2, row
