"""No module of ``src/dpkit`` over 600 lines.

A module past that size has usually grown a second concern; it is split along what its parts do
(``docs/architecture.md``, "No import cycles, no module over 600 lines") before it passes the
limit, not after.
"""

from __future__ import annotations

from pathlib import Path

import dpkit

LIMIT = 600


def test_no_module_over_the_limit() -> None:
    root = Path(dpkit.__file__).parent
    sizes = {
        p.relative_to(root.parent).as_posix(): len(p.read_text(encoding="utf-8").splitlines())
        for p in root.rglob("*.py")
    }
    assert len(sizes) > 100  # the walk read the package
    over = {name: n for name, n in sorted(sizes.items()) if n > LIMIT}
    assert not over, f"modules over {LIMIT} lines: {over}"
