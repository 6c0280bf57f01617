"""The identity a file's budgets are kept under.

A budget protects *data*, so the command line keys it by the file's content, not by whatever name
the analyst types: ``sha256:3f9a…`` (the first 16 hex digits of the SHA-256 of its bytes). The
file's name plays no part: a copy or a renamed file lands on the same budget (so renaming cannot
mint a fresh one), a different file never shares one silently (its budget must be created for
it), and ``--table`` only names the table in SQL.

>>> import tempfile, pathlib
>>> p = pathlib.Path(tempfile.mkdtemp()) / "census.csv"
>>> _ = p.write_text("a\\n1\\n")
>>> dataset_identity(p)
'sha256:309b0e45a73d3fc5'
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

__all__ = ["dataset_identity", "is_identity"]

_CHUNK = 1 << 20


def dataset_identity(path: str | os.PathLike[str]) -> str:
    """``sha256:<16 hex digits>`` of the file's bytes (read in 1 MiB chunks)."""
    p = Path(path)
    digest = hashlib.sha256()
    with p.open("rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            digest.update(chunk)
    return f"sha256:{digest.hexdigest()[:16]}"


def is_identity(name: str) -> bool:
    """True for a name made by :func:`dataset_identity`."""
    return name.startswith("sha256:")
