"""Import-time benchmark: what ``import dpkit`` and each core subpackage cost, and what they drag in.

Not a test. Run it from dpkit's own environment:

    .venv/bin/python benchmarks/bench_import.py [--repeats 5] [--modules dpkit dpkit.noise ...]

Each module is imported ``--repeats`` times, every time in a fresh interpreter started with
``python -X importtime`` (https://docs.python.org/3/using/cmdline.html#cmdoption-X), and the best
cumulative time is reported: the minimum is the least disturbed by other load on the machine.

For every heavy third-party module that ends up in ``sys.modules`` the script names the first dpkit
module whose import pulled it in (read from the nesting of the ``-X importtime`` report), so a
regression points at the line to make lazy. "Heavy" is a fixed list: the optional extras (pandas,
DuckDB, sqlglot, scikit-learn, torch, FastAPI, matplotlib, rich, typer, psycopg, PySpark) and the
scipy subpackages the core should not need at import time.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from dataclasses import dataclass

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
    """The innermost dpkit module whose import contains line ``index``.

    ``-X importtime`` prints a module after everything it imported, so its ancestors are the later
    lines with a smaller depth."""
    depth = lines[index].depth
    for line in lines[index + 1 :]:
        if line.depth < depth:
            if line.module == "dpkit" or line.module.startswith("dpkit."):
                return line.module
            depth = line.depth
    return None


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
        heavy = {}
        for i, line in enumerate(lines):
            if line.module in HEAVY and line.module not in heavy:
                heavy[line.module] = _importer(lines, i)
    return Measurement(module, best, heavy)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="fresh interpreters per module (best is kept)")
    parser.add_argument("--modules", nargs="+", default=list(DEFAULT_MODULES), help="modules to import")
    args = parser.parse_args(argv)

    print(f"python {sys.version.split()[0]}; best of {args.repeats} fresh interpreters (-X importtime)")
    print(f"{'module':<20} {'best (s)':>9}  heavy modules loaded (first imported by)")
    startup = _startup_modules()
    for module in args.modules:
        m = measure(module, args.repeats, startup)
        heavy = ", ".join(f"{name} ({by or '?'})" for name, by in m.heavy.items()) or "none"
        print(f"{m.module:<20} {m.best_s:>9.3f}  {heavy}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
