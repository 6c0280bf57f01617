"""A Spark dataset's files as registered, checked before every query it answers and after.

Spark reads a dataset's Parquet files in place, by path, at every query, and nothing stops a file
being added, removed or rewritten after registration; an answer computed from other rows than
the registered ones is not an answer about the dataset its budgets refer to. So registration
*pins* the files (:func:`pin_files`) and every query checks them twice:

* **before paying** (:meth:`dpkit.server.catalog.Catalog.opened`, on every query and synthetic
  table): the files are listed again and compared with the pins (:func:`pinned_change`); a
  difference makes the dataset unavailable — the fixed ``dataset_unavailable`` (503), nothing
  spent — and the ``dpkit.curator`` log says what changed, until the files are put back;
* **after Spark has read them** (:class:`PinnedSparkEngine`, for queries): listed and compared
  again; a file gone or rewritten while the job ran fails the paid query with the fixed
  ``query_failed`` (the spend stands: the data may have been read), logged the same way.

What is pinned: each file's path (relative to the partition base), size and modification time —
the default, ``fingerprint=None``: one listing and one ``stat`` per file, microseconds a file.
It misses a file rewritten with the same size whose modification time was set back. With
``fingerprint="sha256"`` the curator also pins each file's SHA-256, recomputed at both checks:
any change of content is caught, at the cost of reading every byte of the dataset twice per
query on the service's machine (hashing runs at roughly 1 GB/s per core, so about a second per
GB before the answer and again after) — for datasets small enough, or queried rarely enough.
A file changed and put back between two checks is not seen by either; what Spark read then is
whatever the writer left, and the data root's writers are trusted like the administrator.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd

from dpkit._validate import short_repr
from dpkit.analytics.engines.parquet_source import ParquetFiles
from dpkit.analytics.engines.spark import SparkEngine
from dpkit.analytics.plan import AggregationPlan
from dpkit.errors import InvalidParameterError

__all__ = ["FINGERPRINTS", "check_fingerprint", "pin_files", "pinned_change", "FilesChangedError", "PinnedSparkEngine"]

#: The content fingerprints a curator may pin besides size and modification time.
FINGERPRINTS = ("sha256",)


def check_fingerprint(value: object, engine: str) -> str | None:
    """``value`` if it is None or one of :data:`FINGERPRINTS` with ``engine="spark"``; else
    InvalidParameterError naming ``fingerprint`` (a DuckDB dataset is a copy: nothing to pin)."""
    if value is None:
        return None
    if engine != "spark":
        raise InvalidParameterError(
            "fingerprint", short_repr(value), "None unless engine='spark' (a DuckDB dataset is copied at registration)"
        )
    if not isinstance(value, str) or value not in FINGERPRINTS:
        raise InvalidParameterError(
            "fingerprint",
            short_repr(value),
            "None (each file's size and modification time, checked at every query) or 'sha256' "
            "(also each file's content, hashed at every query: about a second per GB)",
        )
    return value


def pin_files(listing: ParquetFiles, fingerprint: str | None = None) -> str:
    """The identity of a Parquet source's files, as stored at registration: each file's path
    (relative to the partition base), size and modification time — and with ``fingerprint`` its
    content's digest — as JSON. The same files, unchanged, give the same text; a file added,
    removed, replaced or rewritten does not. OSError when a file has gone since it was listed."""
    base = os.fspath(listing.base)
    entries: list[list[Any]] = []
    for f in listing.files:
        st = os.stat(f)
        entries.append([Path(os.path.relpath(f, base)).as_posix(), st.st_size, st.st_mtime_ns])
        if fingerprint is not None:
            with open(f, "rb") as handle:
                entries[-1].append(hashlib.file_digest(handle, fingerprint).hexdigest())
    return json.dumps(entries, separators=(",", ":"))


def pinned_change(pinned: str, listing: ParquetFiles | None) -> str | None:
    """None when ``listing`` names exactly the files :func:`pin_files` pinned, unchanged (their
    content too when it was fingerprinted); else what changed, in words for the curator's log:
    counts and the first file that differs, by its path below the data (never a value of the
    data). Sizes and times are compared first: a file is hashed only when they match."""
    then = _entries(pinned)
    fingerprint = FINGERPRINTS[0] if any(len(v) > 2 for v in then.values()) else None
    try:
        now = None if listing is None else _entries(pin_files(listing))
        if listing is not None and fingerprint is not None and now == {k: v[:2] for k, v in then.items()}:
            now = _entries(pin_files(listing, fingerprint))
    except OSError:  # a file went between the listing and its stat
        now = None
    if now is None:
        return "the files cannot be listed"
    if now == then:
        return None
    added = sorted(set(now) - set(then))
    removed = sorted(set(then) - set(now))
    changed = sorted(k for k in set(then) & set(now) if then[k][: len(now[k])] != now[k])
    first = (added or removed or changed or ["?"])[0]
    return f"{len(added)} file(s) added, {len(removed)} removed, {len(changed)} rewritten (first: {first})"


def _entries(pins: str) -> dict[str, list[Any]]:
    return {e[0]: e[1:] for e in json.loads(pins)}


class FilesChangedError(Exception):
    """A Spark dataset's files changed while a query read them (raised after the debit: the
    session answers the fixed ``query_failed``, and the spend stands)."""


class PinnedSparkEngine(SparkEngine):
    """A :class:`~dpkit.analytics.engines.spark.SparkEngine` that checks the dataset's pins once
    Spark has computed a plan: ``after()`` lists the files again and returns what changed (None:
    nothing; it logs the change for the curator). A change, or a failure of the job with the
    files changed, ends the query (see the module docstring)."""

    def __init__(self, source: Any, after: Callable[[], str | None]) -> None:
        super().__init__(source)
        self._after = after

    def compute(self, plan: AggregationPlan) -> tuple[pd.DataFrame, pd.DataFrame | None]:
        try:
            out = super().compute(plan)
        except Exception:
            self._after()  # a file gone mid-job: Spark's own error stands, and the change is logged
            raise
        change = self._after()
        if change is not None:
            raise FilesChangedError(change)
        return out
