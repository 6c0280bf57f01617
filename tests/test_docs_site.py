"""The documentation site (mkdocs.yml) builds in strict mode, and strict mode catches what it should.

``make docs`` builds the site; these tests build it into a temporary folder. They need the ``docs``
extra (part of ``dev``) and skip without it.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in ("mkdocs", "material", "mkdocstrings_handlers.python")),
    reason="mkdocs, mkdocs-material or mkdocstrings[python] is not installed: pip install -e '.[docs]'",
)


def _build(project: Path, site: Path) -> subprocess.CompletedProcess[str]:
    """``mkdocs build --strict`` of ``project``'s mkdocs.yml, run in ``project`` (the snippets
    and the docstring extension are found relative to it)."""
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.mark.slow
def test_the_site_builds_in_strict_mode(tmp_path: Path) -> None:
    result = _build(ROOT, tmp_path / "site")
    assert result.returncode == 0, result.stderr[-5000:]
    assert (tmp_path / "site" / "index.html").is_file()
    # The API reference was generated from the docstrings, and the benchmarks page includes
    # BENCHMARKS.md rather than a copy of it.
    reference = (tmp_path / "site" / "reference" / "mechanisms" / "index.html").read_text(encoding="utf-8")
    assert 'id="dpkit.mechanisms.Laplace"' in reference
    benchmarks = (tmp_path / "site" / "benchmarks" / "index.html").read_text(encoding="utf-8")
    assert "Noise: 10,000,000 values" in benchmarks
    # The guide is a section of pages, each built (strict mode also fails a page left out of the nav).
    guide = sorted(p.stem for p in (ROOT / "docs" / "guide").glob("*.md"))
    assert {"index", "getting-started", "mechanisms", "analytics", "service", "ml"} <= set(guide)
    for stem in guide:
        built = tmp_path / "site" / "guide" / ("" if stem == "index" else stem) / "index.html"
        assert built.is_file(), f"docs/guide/{stem}.md was not built"
    start = (tmp_path / "site" / "guide" / "getting-started" / "index.html").read_text(encoding="utf-8")
    assert 'id="9-a-query-over-http"' in start  # GitHub-style anchors, as the pages link them


def _copy_of_the_docs(tmp_path: Path) -> Path:
    project = tmp_path / "project"
    project.mkdir()
    shutil.copy(ROOT / "mkdocs.yml", project / "mkdocs.yml")
    shutil.copy(ROOT / "BENCHMARKS.md", project / "BENCHMARKS.md")
    shutil.copytree(ROOT / "docs", project / "docs")
    (project / "src").symlink_to(ROOT / "src", target_is_directory=True)
    return project


@pytest.mark.slow
@pytest.mark.parametrize(
    ("page", "addition", "named"),
    [
        ("index.md", "\nSee [the missing page](missing.md).\n", "missing.md"),
        ("reference/dpkit.md", "\n::: dpkit.no_such_name\n", "dpkit.no_such_name"),
    ],
    ids=["link-to-a-missing-page", "unknown-api-identifier"],
)
def test_strict_mode_fails_on_a_broken_reference(tmp_path: Path, page: str, addition: str, named: str) -> None:
    project = _copy_of_the_docs(tmp_path)
    with (project / "docs" / page).open("a", encoding="utf-8") as f:
        f.write(addition)
    result = _build(project, tmp_path / "site")
    assert result.returncode != 0, "the strict build accepted a broken reference"
    assert named in result.stderr, result.stderr[-5000:]  # it failed for that reason, not another
