"""The settings of a DuckDB connection dpkit opens: its memory limit and where it spills, checked
before any row is read (a query that runs out of memory would fail after it is paid for)."""

from __future__ import annotations

import os
import re
from pathlib import Path

from dpkit.errors import InvalidParameterError

__all__ = ["MIN_MEMORY_PER_THREAD", "checked_memory_limit", "checked_temp_directory", "memory_bytes"]

_MEMORY = re.compile(r"(\d+(?:\.\d*)?|\.\d+)\s*(B|KB|MB|GB|TB|KiB|MiB|GiB|TiB)", re.IGNORECASE)
_UNITS = {
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
#: The least ``memory_limit`` per DuckDB thread: with less, the bounding's window and the group-by
#: run out of memory even while spilling (16 MiB per thread failed on 200,000 rows), and a query
#: that runs out fails after it is paid for.
MIN_MEMORY_PER_THREAD = 32 * 2**20


def checked_memory_limit(value: object) -> str | None:
    """``memory_limit`` checked: a size with its unit (DuckDB's syntax), or None."""
    if value is None:
        return None
    m = _MEMORY.fullmatch(value.strip()) if isinstance(value, str) else None
    if m is None:
        raise InvalidParameterError(
            "memory_limit", value, "None or a size with its unit, such as '4GB', '512MB' or '2GiB'"
        )
    return f"{m.group(1)}{m.group(2)}"


def memory_bytes(limit: str) -> float:
    m = _MEMORY.fullmatch(limit)
    assert m is not None  # checked by _memory_limit
    return float(m.group(1)) * _UNITS[m.group(2).lower()]


def checked_temp_directory(value: object) -> Path | None:
    """``temp_directory`` checked, made absolute (DuckDB resolves a relative one when it spills, from
    whatever the working directory is then): a directory, or a path where one can be created."""
    if value is None:
        return None
    if not isinstance(value, (str, os.PathLike)) or not os.fspath(value):
        raise InvalidParameterError("temp_directory", value, "None or a directory path for DuckDB's spill files")
    path = Path(os.path.abspath(Path(os.fspath(value)).expanduser()))
    existing = next(d for d in (path, *path.parents) if d.exists())
    if not existing.is_dir():
        raise InvalidParameterError(
            "temp_directory",
            os.fspath(value),
            "a directory (or a path where one can be created)",
            f"{existing} is a file",
        )
    if not os.access(existing, os.W_OK | os.X_OK):
        raise InvalidParameterError(
            "temp_directory", os.fspath(value), "a directory this process can write to", f"{existing} is not writable"
        )
    return path
