"""The remote-session guide (docs/guide/remote.md) runs end to end against a real ``dpkit serve``.

Its Python blocks need the service its first shell block starts, so ``test_docs.py`` skips them;
here the block runs as a reader would run it (its setup in a fresh directory, then its ``dpkit
serve`` line on a free port, as ``test_docs_curl.py`` runs the README's), and the page's Python
blocks run in order in one namespace with alice's key in ``DPKIT_API_KEY`` and the documented
address changed to the service's port only. Then the page's ``dpkit query --server`` line.
Slow: the service takes seconds to set up, and a synthetic table's answer is held for 10 s.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from _docs_collector import ROOT, logical_lines, parse

pytest.importorskip("fastapi", reason="the server extra (FastAPI) is not installed")

from test_docs_curl import DOCUMENTED_ADDRESS, running  # noqa: E402

PAGE = ROOT / "docs" / "guide" / "remote.md"


@pytest.mark.slow
def test_the_remote_session_guide_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocks = parse(PAGE, PAGE.name)
    shell = [b.code for b in blocks if b.lang == "bash"]
    service_block = next(code for code in shell if any(x.startswith("dpkit serve") for x in logical_lines(code)))
    python = [b for b in blocks if b.lang == "python"]
    assert len(python) >= 4 and all("skip" in b.marks for b in python)
    with running(service_block, tmp_path) as service:
        address = f"127.0.0.1:{service.port}"
        monkeypatch.setenv("DPKIT_API_KEY", service.key)
        monkeypatch.setenv("MPLBACKEND", "Agg")
        monkeypatch.chdir(service.cwd)
        namespace: dict[str, object] = {"__name__": "__docs__"}
        for b in python:
            assert DOCUMENTED_ADDRESS in b.code or "connect(" not in b.code, b.line
            code = compile("\n" * b.line + b.code.replace(DOCUMENTED_ADDRESS, address), str(PAGE), "exec")
            exec(code, namespace)
        r = namespace["r"]
        assert r.remaining_epsilon == 0.75 and len(r.table) == 2  # type: ignore[attr-defined]
        commands = [x for code in shell for x in logical_lines(code) if x.startswith("dpkit query --server")]
        assert commands
        for command in commands:
            done = subprocess.run(
                ["bash", "-e", "-c", command.replace(DOCUMENTED_ADDRESS, address)],
                cwd=service.cwd, env={**service.env, "DPKIT_API_KEY": service.key},
                capture_output=True, text=True, timeout=120,
            )  # fmt: skip
            assert done.returncode == 0, f"{command}\n{done.stdout}\n{done.stderr}"
            assert "budget census/alice" in done.stdout
