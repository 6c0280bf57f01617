"""A dataset's declared size class: a public bound on its rows, which scales its answers' time.

The curator declares it when registering a dataset (``size_class``; default ``medium``). It is
public — analysts see it with the dataset's schema — and it is the only fact about a dataset's
size the service uses: every paid answer on the dataset is held until a time budget that grows
with the class (:mod:`dpkit.server.pacing`), never until a time measured on the data.
"""

from __future__ import annotations

from dpkit.errors import InvalidParameterError

__all__ = ["SIZE_CLASSES", "DEFAULT_SIZE_CLASS", "check_size_class"]

#: Each class: the most rows a dataset of it should hold, and the factor of its answer times.
SIZE_CLASSES: dict[str, tuple[int, float]] = {
    "small": (100_000, 0.5),
    "medium": (1_000_000, 1.0),
    "large": (10_000_000, 4.0),
    "huge": (100_000_000, 16.0),
}
DEFAULT_SIZE_CLASS = "medium"


def check_size_class(value: object) -> str:
    """``value`` if it names a size class, else InvalidParameterError naming the classes."""
    if not isinstance(value, str) or value not in SIZE_CLASSES:
        accepted = ", ".join(f"{k!r} (at most {rows:,} rows)" for k, (rows, _) in SIZE_CLASSES.items())
        raise InvalidParameterError("size_class", value, f"one of {accepted}")
    return value
