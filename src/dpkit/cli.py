"""The ``dpkit`` command line (Typer).

Commands stay thin: they parse options, call library code and print either rich tables or, with
``--json``, one JSON document on stdout (progress bars and errors go to stderr).

Extending: a new command is a function decorated with ``@app.command()``; a command group
(``budget``, ``account``, ...) is its own ``typer.Typer()`` mounted with ``app.add_typer(group,
name=...)``. Reuse the shared options below (``JsonOption``, ``SeedOption``) and
:func:`_emit_json` / :func:`_fail` so every command behaves alike. Planned (not yet available):
``query``, ``budget``, ``account``, ``audit``, ``serve`` (see docs/guide.md).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

import dpkit
from dpkit.errors import DPError

app = typer.Typer(
    name="dpkit",
    help="dpkit: differential privacy you can audit — secure noise, calibrated mechanisms, accuracy with every release.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

# ---- options shared by commands ------------------------------------------------------------------

JsonOption = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON on stdout instead of tables.")]
SeedOption = Annotated[
    int | None,
    typer.Option(
        "--seed",
        min=0,
        help="Seed the noise with numpy.random.default_rng(SEED): reproducible, NOT secure (teaching and tests only). "
        "Without it all noise comes from the OS CSPRNG.",
    ),
]


def _emit_json(obj: Any) -> None:
    typer.echo(json.dumps(obj, indent=2, ensure_ascii=False))


def _fail(message: str, code: int = 1) -> NoReturn:
    Console(stderr=True).print(f"[bold red]error:[/] {message}")
    raise typer.Exit(code)


# ---- commands ------------------------------------------------------------------------------------


@app.callback()
def main() -> None:
    """dpkit: differential privacy you can audit.

    Run `dpkit demo` to see the worked examples of the source texts (randomized response,
    the Laplace mechanism on counts and histograms, Laplace vs Gaussian noise).
    """


@app.command()
def demo(
    out: Annotated[Path, typer.Option("--out", help="Directory for the figure, CSV files and results.json.")] = Path("out/demo"),
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
                SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(),
                console=Console(stderr=True), transient=True,
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
        demo_mod.render(result, Console())


@app.command()
def version() -> None:
    """Print the installed dpkit version."""
    typer.echo(f"dpkit {dpkit.__version__}")


if __name__ == "__main__":  # pragma: no cover
    app()
