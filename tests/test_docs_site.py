"""The documentation site (mkdocs.yml) builds in strict mode, and strict mode catches what it should.

``make docs`` builds the site; these tests build it into a temporary folder. They need the ``docs``
extra (part of ``dev``) and skip without it.
"""

from __future__ import annotations

import importlib.util
import os
import re
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
    # No special method in the API reference (__post_init__, __repr__, __sklearn_tags__, ...),
    # while the classes keep their constructor's signature.
    special = re.compile(r'id="dpkit\.[\w.]*\.__\w+__"')
    for page in sorted((tmp_path / "site" / "reference").rglob("index.html")):
        found = special.findall(page.read_text(encoding="utf-8"))
        assert not found, f"{page.parent.name}: {found[:5]}"
    ml = (tmp_path / "site" / "reference" / "ml" / "index.html").read_text(encoding="utf-8")
    assert 'id="dpkit.ml.KMeans"' in ml and "__sklearn_clone__" not in ml
    assert "sensitivity" in reference[reference.index('id="dpkit.mechanisms.Laplace"') :][:3000]


def test_the_reference_leaves_out_special_methods() -> None:
    """The griffe extension mkdocs.yml loads removes special methods from every class it reads
    (without it, griffe lists them as public), and keeps ``__init__`` (the class's signature)."""
    import griffe

    extension = ROOT / "docs" / "reference" / "_special_members.py"
    plain = griffe.load("dpkit.ml.kmeans", search_paths=[ROOT / "src"])
    hidden = griffe.load(
        "dpkit.ml.kmeans", search_paths=[ROOT / "src"], extensions=griffe.load_extensions(str(extension))
    )
    assert {"__sklearn_tags__", "__sklearn_clone__"} <= set(plain["KMeans"].members)  # the power check
    members = set(hidden["KMeans"].members)
    assert "__init__" in members and "fit" in members
    assert not [m for m in members if m.startswith("__") and m != "__init__"], members


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
