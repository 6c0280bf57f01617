"""``import dpkit`` is cheap and the core needs none of the optional extras.

``dpkit/__init__.py`` resolves its public names on first use (PEP 562,
https://peps.python.org/pep-0562/). These tests run in a fresh interpreter each, because the
test process itself has long since imported everything.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

import dpkit

# Modules of the optional extras (and scipy.signal, which only the PLD accountant needs): a bare
# `import dpkit` must load none of them.
HEAVY = ("pandas", "sklearn", "scipy.signal", "duckdb", "sqlglot", "torch", "fastapi", "matplotlib", "rich")

# What the core install (numpy, scipy, mpmath, cryptography) must run without.
OPTIONAL = (
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
)

CORE = ("dpkit.noise", "dpkit.accounting", "dpkit.mechanisms", "dpkit.budget", "dpkit.errors")


def _run(code: str) -> dict[str, object]:
    """Run ``code`` in a fresh interpreter; it prints one JSON object as its last line."""
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_import_dpkit_loads_no_heavy_module() -> None:
    out = _run(
        f"""
        import json, sys
        import dpkit
        print(json.dumps({{"loaded": [m for m in {HEAVY!r} if m in sys.modules],
                          "subpackages": sorted(m for m in sys.modules if m.startswith("dpkit."))}}))
        """
    )
    assert out["loaded"] == [], f"import dpkit loaded {out['loaded']}"
    assert out["subpackages"] == []


def test_every_public_name_resolves_in_a_fresh_interpreter() -> None:
    out = _run(
        """
        import json
        import dpkit
        missing = [n for n in dpkit.__all__ if getattr(dpkit, n, None) is None]
        print(json.dumps({"missing": missing, "n": len(dpkit.__all__)}))
        """
    )
    assert out["missing"] == []
    assert out["n"] == len(dpkit.__all__)


@pytest.mark.parametrize("name", dpkit.__all__)
def test_from_dpkit_import_name(name: str) -> None:
    namespace: dict[str, object] = {}
    exec(f"from dpkit import {name}", namespace)
    assert namespace[name] is getattr(dpkit, name)


def test_the_lazy_names_are_the_defining_objects() -> None:
    from dpkit.accounting import RDPAccountant
    from dpkit.analytics import Session
    from dpkit.budget import Budget
    from dpkit.errors import DPError
    from dpkit.mechanisms import Laplace, sensitivity

    assert dpkit.Session is Session and dpkit.Budget is Budget and dpkit.RDPAccountant is RDPAccountant
    assert dpkit.Laplace is Laplace and dpkit.DPError is DPError and dpkit.sensitivity is sensitivity


def test_dir_lists_every_public_name() -> None:
    listed = set(dir(dpkit))
    assert set(dpkit.__all__) <= listed
    assert "__version__" in listed


def test_an_unknown_name_raises_attribute_error() -> None:
    with pytest.raises(AttributeError, match="module 'dpkit' has no attribute 'no_such_name'"):
        dpkit.no_such_name  # noqa: B018
    assert not hasattr(dpkit, "no_such_name")


def test_submodules_stay_reachable_as_attributes() -> None:
    import dpkit.budget

    assert dpkit.budget is sys.modules["dpkit.budget"]
    assert dpkit.noise.source is sys.modules["dpkit.noise.source"]


def test_star_import_gives_all_names() -> None:
    namespace: dict[str, object] = {}
    exec("from dpkit import *", namespace)
    assert set(dpkit.__all__) <= set(namespace)


def test_the_core_runs_without_the_optional_extras() -> None:
    """``sys.modules[name] = None`` makes ``import name`` raise ImportError, as on a machine where
    the package is not installed: the core modules import, and a release is made and accounted."""
    out = _run(
        f"""
        import importlib, json, sys
        for name in {OPTIONAL!r}:
            sys.modules[name] = None
        for module in {CORE!r}:
            importlib.import_module(module)
        import dpkit as dp
        mech = dp.Laplace(epsilon=0.5, sensitivity=1.0)
        value = float(mech.release(3.0))
        accountant = dp.RDPAccountant()
        accountant.compose(mech.event)
        eps = accountant.get_epsilon(1e-6)
        try:
            dp.Session
            hint = None
        except ModuleNotFoundError as exc:
            hint = str(exc)
        print(json.dumps({{"scale": mech.scale, "finite": value == value, "eps_positive": eps > 0, "hint": hint}}))
        """
    )
    assert out == {
        "scale": 2.0,
        "finite": True,
        "eps_positive": True,
        "hint": "dpkit.Session needs 'pandas', which is not installed: pip install 'dpkit[analytics]'",
    }


# What printing the command line's help must not load: the engines, the service's web stack, the
# data libraries and the accountants' numerics. Each command imports them when it runs.
CLI_HEAVY = (
    "duckdb",
    "pandas",
    "pyarrow",
    "torch",
    "fastapi",
    "uvicorn",
    "pyspark",
    "sqlglot",
    "sklearn",
    "matplotlib",
    "numpy",
    "scipy",
    "pydantic",  # Typer validates an unset --help flag with it (dpkit.cli sets the flag's default)
)


def test_the_command_line_help_loads_no_heavy_module() -> None:
    """``dpkit --help`` and a command's ``--help`` build the whole app (every command's options)
    and print; the heavy modules a command uses are imported inside it, so none is loaded here."""
    commands = [
        ["--help"],
        ["query", "--help"],
        ["serve", "--help"],
        ["admin", "grant", "--help"],
        ["budget", "--help"],
    ]
    out = _run(
        f"""
        import json, sys
        from typer.testing import CliRunner
        from dpkit.cli import app
        report = []
        for args in {commands!r}:
            result = CliRunner().invoke(app, args)
            loaded = [m for m in {CLI_HEAVY!r} if m in sys.modules]
            report.append({{"args": args, "exit": result.exit_code, "usage": "Usage:" in result.output, "loaded": loaded}})
        print(json.dumps(report))
        """
    )
    assert [r["args"] for r in out] == commands
    assert all(r["exit"] == 0 and r["usage"] for r in out), out
    assert [r["loaded"] for r in out] == [[]] * len(commands), f"--help loaded heavy modules: {out}"
