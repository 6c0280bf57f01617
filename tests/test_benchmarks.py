"""The benchmarks cannot rot unnoticed.

``make bench-smoke`` (part of ``make test``) runs every benchmark at a tiny size in dpkit's own
environment. What a smoke run cannot see is checked here, from the source:

* every ``benchmarks/bench_*.py`` has the smoke mode (the runner picks up every such file, so one
  without it fails there as well: this names the file sooner) and is run by ``make bench``;
* every module a benchmark imports is installed by ``benchmarks/setup_env.sh`` — in its list of
  peers, or by one of the dpkit extras it installs — or is a peer with a virtualenv of its own. A
  smoke run skips what it cannot import, so it would not notice: ``make bench`` failed on a fresh
  clone when ``bench_server.py`` started ``dpkit serve`` (a Typer command) and the script installed
  only dpkit's [server] extra.
"""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ROOT / "benchmarks"
SCRIPTS = sorted(BENCHMARKS.glob("bench_*.py"))

#: Import name -> distribution, where they differ.
DISTRIBUTION = {"sklearn": "scikit-learn", "pipeline_dp": "pipeline-dp", "dp_accounting": "dp-accounting"}
#: Modules that arrive with a peer's extra: (the peer, its extra).
WITH_EXTRA = {"polars": ("opendp", "polars")}
#: Peers whose pins clash with dpkit's: installed in a virtualenv of their own, by these scripts.
OWN_VIRTUALENV = {
    "tmlt": ("setup_tumult.sh", "tmlt.analytics"),
    "snsynth": ("setup_synth_peers.sh", "smartnoise-synth"),
}
#: Run by hand or by their own script, not by ``make bench``: the GPU rows need a CUDA device.
NOT_IN_MAKE_BENCH = {"bench_dpsgd_gpu.py": "gpu_dpsgd.sh"}


def _third_party_imports(path: Path) -> set[str]:
    """The top-level names of the modules ``path`` imports, less the standard library, dpkit and
    the benchmarks' own helpers."""
    local = {p.stem for p in BENCHMARKS.glob("*.py")}
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names - set(sys.stdlib_module_names) - local - {"dpkit", "__future__"}


def _setup_env() -> tuple[list[str], list[str]]:
    """setup_env.sh's dpkit extras and its peers (requirement strings)."""
    text = (BENCHMARKS / "setup_env.sh").read_text(encoding="utf-8")
    extras = re.search(r'^EXTRAS="([^"]*)"', text, re.MULTILINE)
    peers = re.search(r"^PEERS=\((.*?)^\)", text, re.MULTILINE | re.DOTALL)
    assert extras and peers, 'setup_env.sh: EXTRAS="..." and PEERS=( ... ) are what this test reads'
    return extras.group(1).split(","), re.findall(r'"([^"]+)"', peers.group(1))


def _extra_requirements(extras: list[str]) -> set[str]:
    """The distributions dpkit's ``extras`` install (extras naming ``dpkit[...]`` expanded)."""
    optional = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    names = {canonicalize_name(Requirement(r).name) for r in optional["dependencies"]}
    todo, seen = list(extras), set()
    while todo:
        extra = todo.pop()
        if extra in seen:
            continue
        seen.add(extra)
        for spec in optional["optional-dependencies"][extra]:
            req = Requirement(spec)
            if canonicalize_name(req.name) == "dpkit":
                todo += sorted(req.extras)
            else:
                names.add(canonicalize_name(req.name))
    return names


def test_every_benchmark_has_a_smoke_mode() -> None:
    assert SCRIPTS, "no benchmarks found"
    missing = [p.name for p in SCRIPTS if "_smoke.add_flag(" not in p.read_text(encoding="utf-8")]
    assert not missing, f"without --smoke (see benchmarks/_smoke.py): {missing}"


def test_make_bench_runs_every_benchmark() -> None:
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    recipe = re.search(r"^bench:.*?\n((?:\t.*\n)+)", makefile, re.MULTILINE)
    assert recipe, "the Makefile has a bench target"
    missing = [p.name for p in SCRIPTS if p.name not in recipe.group(1) and p.name not in NOT_IN_MAKE_BENCH]
    assert not missing, f"not run by make bench: {missing}"
    for script, runner in NOT_IN_MAKE_BENCH.items():
        assert script in (BENCHMARKS / runner).read_text(encoding="utf-8")


def test_setup_env_installs_what_the_benchmarks_import() -> None:
    extras, peers = _setup_env()
    requirements = [Requirement(p) for p in peers]
    installed = _extra_requirements(extras) | {canonicalize_name(r.name) for r in requirements}
    with_extras = {(canonicalize_name(r.name), extra) for r in requirements for extra in r.extras}
    missing = {}
    for path in SCRIPTS + sorted(BENCHMARKS.glob("_*.py")):
        for module in sorted(_third_party_imports(path)):
            if module in OWN_VIRTUALENV:
                script, dist = OWN_VIRTUALENV[module]
                assert f'"{dist}' in (BENCHMARKS / script).read_text(encoding="utf-8"), f"{script} installs {dist}"
            elif module in WITH_EXTRA:
                if WITH_EXTRA[module] not in with_extras:
                    missing[f"{path.name}: {module}"] = "{}[{}]".format(*WITH_EXTRA[module])
            elif canonicalize_name(DISTRIBUTION.get(module, module)) not in installed:
                missing[f"{path.name}: {module}"] = DISTRIBUTION.get(module, module)
    assert not missing, f"imported by a benchmark, not installed by benchmarks/setup_env.sh: {missing}"
