"""Import-time benchmark: what ``import dpkit``, each core subpackage and the ``dpkit`` command's
start cost, and what they drag in.

Not a test. Run it from dpkit's own environment:

    .venv/bin/python benchmarks/bench_import.py [--repeats 5] [--modules dpkit dpkit.noise ...]
        [--commands "dpkit --help" "dpkit query --help" ...]

Each module is imported ``--repeats`` times, every time in a fresh interpreter started with
``python -X importtime`` (https://docs.python.org/3/using/cmdline.html#cmdoption-X), and the best
cumulative time is reported: the minimum is the least disturbed by other load on the machine.

Each command (``dpkit --help``, ``dpkit query --help``, ``dpkit serve --help``) runs ``--repeats``
times as a fresh process of the installed ``dpkit`` script (``python -m dpkit.cli`` where there is
none), and the best CPU time of the whole process (user + system, from ``getrusage``) is reported:
CPU time, unlike the wall clock, grows less than it when other processes share the cores. Three
floor rows say what no change in dpkit's commands can remove: the interpreter's start, and the
``--help`` and ``one --help`` of a Typer app of two empty commands set up as dpkit's (Typer, Click
and rich; the app's ``context_settings`` keep Typer from loading pydantic, see ``dpkit.cli``).

For every heavy third-party module that ends up in ``sys.modules`` the script names the first dpkit
module whose import pulled it in (read from the nesting of the ``-X importtime`` report), so a
regression points at the line to make lazy. "Heavy" is a fixed list: the optional extras (pandas,
DuckDB, sqlglot, scikit-learn, torch, FastAPI, matplotlib, rich, typer, psycopg, PySpark) and the
scipy subpackages the core should not need at import time.
"""

from __future__ import annotations

import argparse
import os
import resource
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import _smoke

HEAVY: tuple[str, ...] = (
    "pandas",
    "duckdb",
    "sqlglot",
    "sklearn",
    "torch",
    "fastapi",
    "uvicorn",
    "matplotlib",
    "rich",
    "typer",
    "psycopg",
    "pyspark",
    "scipy.signal",
    "scipy.stats",
    "scipy.optimize",
    "mpmath",
)

# What the command line may load to print its help: not the engines, the service's web stack, the
# data libraries, or the accountants' scipy. (typer, rich and Typer's own pydantic it needs.)
CLI_HEAVY: tuple[str, ...] = (
    *(m for m in HEAVY if m not in ("rich", "typer")),
    "numpy",
    "scipy",
    "pyarrow",
    "starlette",
    "pydantic",
)

# The command lines timed by default: the top-level help, the help of the analyst's command and that
# of the curator's (whose options show the service's defaults).
DEFAULT_COMMANDS: tuple[str, ...] = ("dpkit --help", "dpkit query --help", "dpkit serve --help")

# A Typer app of two empty commands, set up as dpkit's: the floor under its --help.
_TYPER_FLOOR = """
import typer
app = typer.Typer(no_args_is_help=True, add_completion=False, context_settings={"default_map": {"help": False}})
@app.command()
def one(x: int = 1) -> None:
    \"\"\"One.\"\"\"
@app.command()
def two(x: int = 1) -> None:
    \"\"\"Two.\"\"\"
app()
"""

DEFAULT_MODULES: tuple[str, ...] = (
    "dpkit",
    "dpkit.errors",
    "dpkit.noise",
    "dpkit.accounting",
    "dpkit.budget",
    "dpkit.mechanisms",
    "dpkit.ledger",
    "dpkit.audit",
    "dpkit.analytics",
    "dpkit.ml",
)


@dataclass(frozen=True)
class ImportLine:
    """One line of ``-X importtime`` output: the module, its nesting depth and cumulative µs."""

    module: str
    depth: int
    cumulative_us: int


def _parse_importtime(stderr: str) -> list[ImportLine]:
    lines: list[ImportLine] = []
    for raw in stderr.splitlines():
        if not raw.startswith("import time:") or "|" not in raw:
            continue
        _, cumulative, name = raw[len("import time:") :].split("|", 2)
        if not cumulative.strip().isdigit():  # the header line
            continue
        stripped = name.lstrip(" ")
        # Python indents a nested import by two spaces per level, after one leading space.
        depth = (len(name) - len(stripped) - 1) // 2
        lines.append(ImportLine(stripped.strip(), depth, int(cumulative)))
    return lines


def _importer(lines: list[ImportLine], index: int) -> str | None:
    """The innermost dpkit module whose import contains line ``index``; else the outermost module
    that does (a library's own lazy import, e.g. Typer's of pydantic); None for a top-level import.

    ``-X importtime`` prints a module after everything it imported, so its ancestors are the later
    lines with a smaller depth."""
    depth = lines[index].depth
    outermost = None
    for line in lines[index + 1 :]:
        if line.depth < depth:
            if line.module == "dpkit" or line.module.startswith("dpkit."):
                return line.module
            depth, outermost = line.depth, line.module
    return outermost


def _heavy_loaded(stderr: str, heavy: tuple[str, ...]) -> dict[str, str | None]:
    """Each module of ``heavy`` in an ``-X importtime`` report -> who imported it first."""
    lines = _parse_importtime(stderr)
    loaded: dict[str, str | None] = {}
    for i, line in enumerate(lines):
        if line.module in heavy and line.module not in loaded:
            loaded[line.module] = _importer(lines, i)
    return loaded


@dataclass(frozen=True)
class Measurement:
    module: str
    best_s: float
    heavy: dict[str, str | None]  # heavy module -> the dpkit module that imported it


def _startup_modules() -> set[str]:
    """Modules the interpreter imports before running any code (``site``, ``encodings``, ...)."""
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "pass"], capture_output=True, text=True, check=True
    )
    return {line.module for line in _parse_importtime(proc.stderr)}


def measure(module: str, repeats: int, startup: set[str]) -> Measurement:
    """Best over ``repeats`` fresh interpreters of the cumulative ``-X importtime`` of every top-level
    import that ``import <module>`` caused (the interpreter's own start-up imports excluded)."""
    best = float("inf")
    heavy: dict[str, str | None] = {}
    for _ in range(repeats):
        proc = subprocess.run(
            [sys.executable, "-X", "importtime", "-c", f"import {module}"],
            capture_output=True,
            text=True,
            check=True,
        )
        lines = _parse_importtime(proc.stderr)
        total_us = sum(line.cumulative_us for line in lines if line.depth == 0 and line.module not in startup)
        best = min(best, total_us / 1e6)
        heavy = _heavy_loaded(proc.stderr, HEAVY)
    return Measurement(module, best, heavy)


def dpkit_command() -> list[str]:
    """How a user starts dpkit here: the ``dpkit`` script beside this interpreter (what ``pip``
    installs from ``[project.scripts]``), else ``python -m dpkit.cli``."""
    script = Path(sys.executable).with_name("dpkit")
    return [str(script)] if script.is_file() else [sys.executable, "-m", "dpkit.cli"]


def cpu_seconds(argv: list[str], env: dict[str, str] | None = None) -> tuple[float, subprocess.CompletedProcess[str]]:
    """User + system CPU seconds of one run of ``argv`` (the child and whatever it waited for)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise RuntimeError(f"{shlex.join(argv)} exited with {proc.returncode}: {proc.stderr.strip()[-500:]}")
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), proc


@dataclass(frozen=True)
class CommandMeasurement:
    label: str
    best_cpu_s: float
    heavy: dict[str, str | None]  # heavy module -> who imported it first


def measure_command(label: str, argv: list[str], repeats: int) -> CommandMeasurement:
    """Best CPU time over ``repeats`` fresh processes of ``argv``, then one more run with
    ``PYTHONPROFILEIMPORTTIME`` (it slows the process, so it is not timed) for what was loaded."""
    best = min(cpu_seconds(argv)[0] for _ in range(repeats))
    _, proc = cpu_seconds(argv, env={**os.environ, "PYTHONPROFILEIMPORTTIME": "1"})
    return CommandMeasurement(label, best, _heavy_loaded(proc.stderr, CLI_HEAVY))


def command_rows(commands: list[str], repeats: int) -> list[CommandMeasurement]:
    """The floor rows, then each of ``commands`` (``dpkit ARGS``)."""
    floor = [sys.executable, "-c", _TYPER_FLOOR]
    rows = [
        measure_command("python -c pass (floor)", [sys.executable, "-c", "pass"], repeats),
        measure_command("typer app --help (floor)", [*floor, "--help"], repeats),
        measure_command("typer app one --help (floor)", [*floor, "one", "--help"], repeats),
    ]
    dpkit = dpkit_command()
    rows += [measure_command(command, [*dpkit, *shlex.split(command)[1:]], repeats) for command in commands]
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="fresh interpreters per module (best is kept)")
    parser.add_argument("--modules", nargs="*", default=list(DEFAULT_MODULES), help="modules to import")
    parser.add_argument(
        "--commands",
        nargs="*",
        default=list(DEFAULT_COMMANDS),
        help="dpkit command lines to start, each one argument (e.g. 'dpkit query --help'); none: skip the table",
    )
    _smoke.add_flag(parser)
    args = parser.parse_args(argv)
    if args.smoke:
        args.repeats, args.modules, args.commands = 1, ["dpkit"], ["dpkit --help"]
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    if any(shlex.split(command)[:1] != ["dpkit"] for command in args.commands):
        parser.error("each of --commands is a dpkit command line: 'dpkit ARGS'")

    if args.modules:
        print(f"python {sys.version.split()[0]}; best of {args.repeats} fresh interpreters (-X importtime)")
        print(f"{'module':<24} {'best (s)':>9}  heavy modules loaded (first imported by)")
        startup = _startup_modules()
        for module in args.modules:
            m = measure(module, args.repeats, startup)
            print(f"{m.module:<24} {m.best_s:>9.3f}  {_heavy_text(m.heavy)}")
    if args.commands:
        print()
        print(f"command line start: {_shown(dpkit_command())}; best CPU (user + sys) of {args.repeats} processes")
        print(f"{'command':<30} {'CPU (s)':>8}  heavy modules loaded (first imported by)")
        for c in command_rows(args.commands, args.repeats):
            print(f"{c.label:<30} {c.best_cpu_s:>8.3f}  {_heavy_text(c.heavy)}")
    return 0


def _shown(argv: list[str]) -> str:
    """``argv`` as a shell line, with paths under the working directory relative to it."""
    cwd = Path.cwd()
    return shlex.join(str(Path(a).relative_to(cwd)) if Path(a).is_relative_to(cwd) else a for a in argv)


def _heavy_text(heavy: dict[str, str | None]) -> str:
    return ", ".join(f"{name} ({by or '?'})" for name, by in heavy.items()) or "none"


if __name__ == "__main__":
    raise SystemExit(main())
