"""``dpkit demo``: the source texts' worked examples (computed and drawn by :mod:`dpkit.demo`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from dpkit.cli._common import JsonOption, SeedOption, _emit_json, _fail
from dpkit.errors import DPError

__all__ = ["demo"]


def demo(
    out: Annotated[Path, typer.Option("--out", help="Directory for the figure, CSV files and results.json.")] = Path(
        "out/demo"
    ),
    seed: SeedOption = None,
    json_output: JsonOption = False,
) -> None:
    """Run the source texts' worked examples on generated data.

    a. randomized-response survey (Warner p = 2/3, and two coins) with unbiased estimates and 95% CIs;
    b. Laplace counts, an age histogram and k counting queries with error bounds;
    c. Laplace vs Gaussian expected errors, saved as laplace_vs_gaussian.png.
    """
    from dpkit import demo as demo_mod  # matplotlib and friends load only for this command

    try:
        if json_output:
            result = demo_mod.run_demo(out, seed=seed)
        else:
            progress = Progress(
                SpinnerColumn(),
                TextColumn("{task.description}"),
                BarColumn(),
                TimeElapsedColumn(),
                console=Console(stderr=True),
                transient=True,
            )
            with progress:
                result = demo_mod.run_demo(out, seed=seed, progress=progress)
    except OSError as exc:
        _fail(f"could not write the demo's files under {str(out)!r}: {exc}")
    except DPError as exc:
        _fail(str(exc))
    if json_output:
        _emit_json(result)
    else:
        from dpkit.demo_report import render

        render(result, Console())
