"""The smoke mode every benchmark shares: ``--smoke`` runs a script at a tiny size in seconds, in
dpkit's own environment, so that ``make test`` notices a benchmark that no longer runs.

A benchmark is run in full rarely and by hand, so nothing else would tell that a rename in dpkit
broke it. In smoke mode a script:

- shrinks its sizes (rows, runs, seeds, rounds) to seconds of work: its numbers mean nothing;
- skips, with one printed line, the peers that do not import here and whatever needs a virtualenv
  of its own (Tumult, SmartNoise Synth) or a JVM (Spark: its start-up alone takes longer than a
  whole smoke run);
- writes its results under a temporary folder removed at exit, never into ``benchmarks/results/``;
- reads no data from outside the repository: UCI Adult is replaced by a few hundred rows drawn from
  its public schema (:func:`adult_dir`);
- exits with status 1 when a dpkit row fails: a peer may be missing, dpkit may not.
"""

from __future__ import annotations

import argparse
import atexit
import importlib.util
import shutil
import sys
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path

HELP = (
    "tiny sizes, seconds: checks that the benchmark still runs (no results written, missing peers "
    "skipped, exit 1 when a dpkit row fails)"
)

# adult.names' education values (dpkit.datasets leaves the column out: education-num carries it).
EDUCATION = (
    "Bachelors", "Some-college", "11th", "HS-grad", "Prof-school", "Assoc-acdm", "Assoc-voc", "9th", "7th-8th",
    "12th", "Masters", "1st-4th", "10th", "Doctorate", "5th-6th", "Preschool",
)  # fmt: skip
ADULT_COLUMNS = (
    "age", "workclass", "fnlwgt", "education", "education-num", "marital-status", "occupation", "relationship",
    "race", "sex", "capital-gain", "capital-loss", "hours-per-week", "native-country", "Y",
)  # fmt: skip

_tmp: Path | None = None


def add_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--smoke", action="store_true", help=HELP)


def temp_dir() -> Path:
    """This process's scratch folder for a smoke run (created once, removed at exit)."""
    global _tmp  # noqa: PLW0603
    if _tmp is None:
        _tmp = Path(tempfile.mkdtemp(prefix="dpkit-bench-smoke-"))
        atexit.register(shutil.rmtree, _tmp, True)
    return _tmp


def out_path(name: str) -> Path:
    """Where a smoke run writes what a full run writes to ``benchmarks/results/<name>``."""
    return temp_dir() / name


def importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package missing, or a broken one
        return False


def skip(what: str, why: str) -> None:
    print(f"[smoke] skipped {what}: {why}", file=sys.stderr, flush=True)


def present(libraries: Iterable[str], modules: Mapping[str, str] | None = None) -> list[str]:
    """The libraries whose module (``modules[library]``, else the library's own name) imports here;
    a line for each of the others."""
    out = []
    for lib in libraries:
        module = (modules or {}).get(lib, lib)
        if importable(module):
            out.append(lib)
        else:
            skip(lib, f"{module} is not installed in this environment")
    return out


def missing(module: str, *names: str) -> list[str]:
    """The failures of a path a smoke run skips (Spark's): ``module`` must import and hold ``names``,
    so that a rename in dpkit still shows before the next full run."""
    try:
        mod = importlib.import_module(module)
    except ImportError as exc:
        return [f"{module} does not import: {exc}"]
    return [f"{module} has no {name} (used by the skipped path)" for name in names if not hasattr(mod, name)]


def adult_dir(train_rows: int = 600, test_rows: int = 300, seed: int = 0) -> Path:
    """A folder with ``adult.data`` and ``adult.test`` shaped like UCI Adult's (header line, values
    separated by ", ", '?' for a few unknowns, test labels ending in '.'), drawn from the public schema
    of ``dpkit.datasets``: the real files live outside the repository, and a smoke run needs none."""
    folder = temp_dir() / "adult"
    if (folder / "adult.test").exists():
        return folder
    import numpy as np  # noqa: PLC0415

    from dpkit.datasets import ADULT_CATEGORICAL, ADULT_NUMERIC  # noqa: PLC0415

    rng = np.random.default_rng(seed)
    folder.mkdir()
    for name, rows, suffix in (("adult.data", train_rows, ""), ("adult.test", test_rows, ".")):
        columns: dict[str, list[str]] = {}
        for col, (lo, hi) in ADULT_NUMERIC.items():
            columns[col] = [str(v) for v in rng.integers(int(lo), int(hi) + 1, rows)]
        for col, cats in (*ADULT_CATEGORICAL.items(), ("education", EDUCATION)):
            values = np.asarray(cats, dtype=object)[rng.integers(0, len(cats), rows)]
            values[rng.random(rows) < 0.02] = "?"
            columns[col] = list(values)
        # the label leans on education-num, so that a model has something to learn
        edu = np.array([int(v) for v in columns["education-num"]])
        rich = rng.random(rows) < 0.05 + 0.5 * (edu - 1) / 15
        columns["Y"] = [(">50K" if r else "<=50K") + suffix for r in rich]
        lines = [", ".join(ADULT_COLUMNS)]
        lines += [", ".join(columns[c][i] for c in ADULT_COLUMNS) for i in range(rows)]
        (folder / name).write_text("\n".join(lines) + "\n")
    return folder


def finish(failures: Iterable[str]) -> int:
    """The smoke run's exit status: 1, each failure printed, when a dpkit row failed."""
    failures = list(failures)
    for failure in failures:
        print(f"[smoke] FAILED: {failure}", file=sys.stderr, flush=True)
    return 1 if failures else 0
