"""Helpers shared by the benchmark scripts: Markdown tables, package versions, the n/a marker."""

from __future__ import annotations

import importlib.metadata as _md
from collections.abc import Iterable, Sequence


class NotAvailable(Exception):
    """The library does not provide the call (yet)."""


def version(dist: str) -> str | None:
    try:
        return _md.version(dist)
    except _md.PackageNotFoundError:
        return None


def markdown(
    title: str, headers: Sequence[str], left: Iterable[str], rows: Iterable[Sequence[str]], notes: Iterable[str]
) -> str:
    """A Markdown table with a title line above and a bullet list of notes below."""
    left = set(left)
    lines = [
        title,
        "",
        "| " + " | ".join(headers) + " |",
        "|" + "".join("---|" if h in left else "--:|" for h in headers),
    ]
    for cells in rows:
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    lines.append("")
    lines.extend(f"- {note}" for note in notes)
    return "\n".join(lines)
