"""A dataset's declared size class: a public bound on its rows, which scales its answers' time.

The curator declares it when registering a dataset (``size_class``; default ``medium``). It is
public — analysts see it with the dataset's schema — and it is the only fact about a dataset's
size the service uses: every paid answer on the dataset is held until a time budget that grows
with the class (:mod:`dpkit.server.pacing`), never until a time measured on the data.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from dpkit.errors import InvalidParameterError

if TYPE_CHECKING:
    from dpkit.analytics.check_report import DataCheck

__all__ = ["SIZE_CLASSES", "DEFAULT_SIZE_CLASS", "check_size_class", "fits_size_class"]


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


def fits_size_class(check: DataCheck | None, size_class: str) -> DataCheck | None:
    """The curator's data check, with a problem added when the rows exceed the declared size
    class (whose answer times would then be too short: overruns answer query_failed). In a
    dataset of several tables the class bounds the rows of each table (each table's check)."""
    most = SIZE_CLASSES[size_class][0]
    if check is None or check.rows <= most:
        return check
    larger = [k for k, (rows, _) in SIZE_CLASSES.items() if rows >= check.rows]
    advice = f"register it as {larger[0]!r}" if larger else "raise --answer-seconds"
    problem = (
        f"{check.rows:,} rows exceed the size class {size_class!r} (at most {most:,}): paid answers may run past "
        f"their time and fail; {advice}"
    )
    return replace(check, problems=(*check.problems, problem))
