"""The curator-service example (``make demo`` runs it) works end to end."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "curator_service.py"


@pytest.mark.slow
def test_curator_service_example(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, str(EXAMPLE), str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "without a valid key: 401 unauthenticated" in out.stdout
    assert out.stdout.count("QueryResult(ε=") == 3  # the analyst's answers, through dpkit.client
    assert "409 budget_exceeded" in out.stdout
    assert "audit log OK" in out.stdout
