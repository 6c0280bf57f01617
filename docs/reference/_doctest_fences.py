"""Griffe extension for the API reference: show doctests as Python console code blocks.

dpkit's docstrings carry plain doctests (``>>>`` lines and their output) that pytest runs with
``--doctest-modules``. Markdown would read ``>>>`` as a quote and an output such as ``[4, 4]`` as a
link, so each doctest block (from its first ``>>>`` line to the next blank line) is wrapped in a
``pycon`` fence before mkdocstrings renders the docstring. Loaded by mkdocs.yml; not part of dpkit.
"""

from __future__ import annotations

from typing import Any

import griffe


def fence_doctests(text: str) -> str:
    out: list[str] = []
    lines = text.splitlines()
    in_fence = False
    i = 0
    while i < len(lines):
        line = lines[i]
        stripped = line.lstrip()
        if stripped.startswith(("```", "~~~")):
            in_fence = not in_fence
        if in_fence or not stripped.startswith(">>>"):
            out.append(line)
            i += 1
            continue
        indent = line[: len(line) - len(stripped)]
        block = []
        while i < len(lines) and lines[i].strip():
            block.append(lines[i])
            i += 1
        if out and out[-1].strip():
            out.append("")
        out.extend([f"{indent}```pycon", *block, f"{indent}```", ""])
    return "\n".join(out)


class DoctestFences(griffe.Extension):
    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = fence_doctests(obj.docstring.value)
