"""The install commands the README and the guide show work from a clone: each installs the
checkout itself (``pip install -e '.[...]'``), and every extra they name exists in pyproject.toml."""

from __future__ import annotations

import re
import tomllib

import pytest

from _docs_collector import ROOT, SHELL, parse

EXTRAS = set(tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["optional-dependencies"])
PAGES = ["README.md", "docs/guide/getting-started.md"]
#: ``pip install -e '.[a,b]'``: the checkout, with extras.
_CLONE = re.compile(r"pip install (?:--quiet )?-e ['\"]?\.\[(?P<extras>[^\]]*)\]")
#: ``dpkit[a,b]`` or ``.[a,b]`` anywhere: the extras named.
_NAMED = re.compile(r"(?:dpkit|\.)\[(?P<extras>[a-z,\s]+)\]")


def _clone_commands(page: str) -> list[str]:
    return [m.group("extras") for b in parse(ROOT / page, page) if b.lang in SHELL for m in _CLONE.finditer(b.code)]


@pytest.mark.parametrize("page", PAGES)
def test_the_page_shows_how_to_install_from_a_clone(page: str) -> None:
    """A reader of a clone is shown a command that installs it (``pip install dpkit`` alone is for a
    release on PyPI), in a shell block they can copy."""
    commands = _clone_commands(page)
    assert commands, f"{page} has no `pip install -e '.[...]'` command in a shell block"
    for extras in commands:
        names = {e.strip() for e in extras.split(",")}
        assert names <= EXTRAS, f"{page}: {sorted(names - EXTRAS)} are not extras of pyproject.toml"


def test_every_extra_named_exists() -> None:
    """Every ``dpkit[...]`` or ``.[...]`` of the docs and the Makefile names extras that exist."""
    pages = [ROOT / "README.md", ROOT / "Makefile", *sorted((ROOT / "docs").rglob("*.md"))]
    named: dict[str, set[str]] = {}
    for page in pages:
        for m in _NAMED.finditer(page.read_text(encoding="utf-8")):
            named.setdefault(page.name, set()).update(e.strip() for e in m.group("extras").split(","))
    assert {"README.md", "Makefile", "getting-started.md"} <= set(named)
    unknown = {page: sorted(names - EXTRAS) for page, names in named.items() if names - EXTRAS}
    assert unknown == {}
