"""Every script in examples/ runs to the end and exits 0, as a reader would run it: in a fresh
interpreter, from an empty working directory (so nothing depends on where it is started), with
the project's environment. The examples that need UCI Adult find it through ``DPKIT_ADULT`` or
skip it themselves, and say so."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))
#: Examples whose run, with checks of what they print, is a test of its own elsewhere.
TESTED_ELSEWHERE = {"curator_service": "tests/server/test_example.py"}


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["MPLBACKEND"] = "Agg"  # the examples that plot write files; no display here
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), env.get("PYTHONPATH")]))
    env.setdefault("DPKIT_ADULT", str(ROOT.parent / "shared" / "data" / "adult"))
    return env


RUN_HERE = [p for p in EXAMPLES if p.stem not in TESTED_ELSEWHERE]


@pytest.mark.parametrize("script", RUN_HERE, ids=[p.stem for p in RUN_HERE])
def test_the_example_runs(script: Path, tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, (
        f"{script.name} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    )


def test_the_census_queries_script_runs(tmp_path: Path) -> None:
    """``make demo``'s shell story: queries until the budget is spent and the next is refused."""
    env = {**_env(), "DPKIT": str(Path(sys.executable).parent / "dpkit")}
    done = subprocess.run(
        ["bash", str(ROOT / "examples" / "census_queries.sh"), str(tmp_path / "out")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, f"exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    assert "refused" in (done.stdout + done.stderr).lower()


def test_every_example_is_collected() -> None:
    """The power check: the glob finds the scripts (an empty list would pass every test above)."""
    assert len(EXAMPLES) >= 20 and all(p.suffix == ".py" for p in EXAMPLES)
    for stem, test in TESTED_ELSEWHERE.items():
        assert (ROOT / "examples" / f"{stem}.py").is_file() and f"{stem}.py" in (ROOT / test).read_text()
