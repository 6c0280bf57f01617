"""Helpers shared by the benchmark scripts: Markdown tables, package versions, the n/a marker."""

from __future__ import annotations

import importlib.metadata as _md
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any


class NotAvailable(Exception):
    """The library does not provide the call (yet)."""


def best_seconds(fn: Callable[[], Any], repeats: int, *, warm_up: bool = False) -> float:
    """The least wall-clock time of ``repeats`` calls of ``fn`` (after one untimed call with
    ``warm_up``)."""
    if warm_up:
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


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


def print_table(
    title: str,
    headers: Sequence[str],
    left: Iterable[str],
    rows: Iterable[tuple[Sequence[str], object, bool]],
    notes: Iterable[str],
    *,
    to_stderr: bool,
    width: int = 160,
    blank_repeats: bool = False,
) -> None:
    """A rich table (plain text if rich is missing). ``rows`` are (cells, group, bold): a new
    group starts a new section; with ``blank_repeats`` the first cell is shown once per group."""
    import sys

    rows = list(rows)
    notes = list(notes)
    left = set(left)
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        out = sys.stderr if to_stderr else sys.stdout
        print(" | ".join(headers), file=out)
        for cells, _, _ in rows:
            print(" | ".join(cells), file=out)
        for note in notes:
            print(f"  {note}", file=out)
        return
    probe = Console(stderr=to_stderr)
    console = Console(stderr=to_stderr, width=max(probe.width, width))
    t = Table(title=title)
    for h in headers:
        t.add_column(h, justify="left" if h in left else "right", no_wrap=True)
    prev: object = None
    for cells, group, bold in rows:
        cells = list(cells)
        if prev is not None and group != prev:
            t.add_section()
        if blank_repeats and group == prev:
            cells[0] = ""
        prev = group
        t.add_row(*cells, style="bold" if bold else None)
    console.print(t)
    for note in notes:
        console.print(f"  • {note}", highlight=False)
