"""A release's stored content: its rows cut into parts, each part once as CSV and once as JSON.

A release is downloaded as a stream of parts (:mod:`dpkit.server.releases`), so that a download
holds at most one part in the server's memory whatever the release's size. Everything about the
parts is fixed by the release's *shape* — its columns and, for each one, the widest cell it can
hold — which comes from the declared metadata (a categorical column's declared categories; a
number's longest text), never from the rows:

* a part holds ``⌊PART_BYTES / widest row⌋`` rows (at least one), so each of its two texts is at
  most :data:`PART_BYTES` whatever values were sampled;
* the upper bound of a release's stored size, which the publisher's quota is checked against
  before anything is paid, is the widest row times the rows asked for, twice (CSV and JSON),
  plus :data:`REPORT_BYTES` for the measurement report;
* CSV cells that a spreadsheet would run as a formula are escaped (OWASP's rule for CSV
  injection: https://owasp.org/www-community/attacks/CSV_Injection): a *text* cell — a declared
  category that is a string, or a column name in the header — starting with ``=``, ``+``, ``-``,
  ``@``, a tab or a carriage return is written with a single quote ``'`` before it. Numbers
  (numeric columns, integer categories) are numbers, not text, and are written as they are:
  ``-3.5`` stays ``-3.5``. The escaping is decided per declared category and applied to the
  column with one hash lookup per cell (no Python loop over rows). The JSON parts are never
  escaped: JSON is not read by spreadsheets, and its values must equal the paid answer's.

The content's digest (:func:`content_digest`) is what the audit chain records at publication
and ``verify-log`` recomputes from the stored parts.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

__all__ = [
    "PART_BYTES",
    "REPORT_BYTES",
    "FORMULA_START",
    "TableShape",
    "build_parts",
    "content_digest",
    "csv_text",
    "plain",
]

#: The most bytes of one part's CSV or JSON text (a row wider than this is a part of its own).
#: A download waiting for its reader holds about two parts (the one being sent and the next), so
#: this is what a slow reader costs the server (measured with 1,000 slow readers of a 300,000-row
#: release and 16 KiB transport buffers: +152 MB, against +243 MB with 64 KiB parts).
PART_BYTES = 16 * 1024
#: What the quota's bound allows for a release's measurement report (its actual size is what is
#: counted once the release is stored).
REPORT_BYTES = 64 * 1024
#: The first characters that make a spreadsheet read a cell as a formula (OWASP).
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
#: The longest text of a number in a release: a float's shortest repr is at most 24 characters
#: (``-2.2250738585072014e-308``), a 64-bit integer's 20.
NUMBER_BYTES = 24


def csv_text(value: str) -> str:
    """A text cell as the CSV holds it: storable (a lone surrogate becomes ``?``, NUL U+FFFD) and
    prefixed with ``'`` when a spreadsheet would read it as a formula."""
    text = value.encode("utf-8", "replace").decode("utf-8").replace("\x00", "\ufffd")
    return "'" + text if text.startswith(FORMULA_START) else text


def plain(value: Any) -> Any:
    """numpy scalars as plain JSON values; non-finite floats as null (as the paid answer encodes
    them)."""
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value if isinstance(value, (int, float, str, bool)) or value is None else str(value)


def _csv_line(cells: Sequence[Any]) -> str:
    """One CSV line as the parts hold them: RFC 4180's CR LF line end (so that a cell holding a
    CR or an LF is quoted: the csv module quotes only the line end's characters)."""
    out = io.StringIO()
    csv.writer(out, lineterminator="\r\n").writerow(cells)
    return out.getvalue()


def _widest(categories: Sequence[Any] | None) -> int:
    """The most bytes one cell of a column takes in either encoding (JSON or escaped CSV)."""
    if categories is None:
        return NUMBER_BYTES
    widths = [4]  # null; an empty CSV cell
    for c in categories:  # (per declared category, not per row)
        shown = csv_text(c) if isinstance(c, str) else c
        widths.append(max(len(json.dumps(plain(c))), len(_csv_line([shown, ""]).encode("utf-8")) - 3))
    return max(widths)


@dataclass(frozen=True)
class ColumnShape:
    """One column of a release: its ``name``, the bytes of its widest cell, and the declared
    text values that the CSV writes differently (escaped or made storable)."""

    name: str
    widest: int
    csv_values: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class TableShape:
    """The columns of a release, from the declared metadata alone (see the module's docstring)."""

    columns: tuple[ColumnShape, ...]

    @classmethod
    def of(cls, names: Sequence[str], categories: Mapping[str, Sequence[Any] | None]) -> TableShape:
        """The shape of columns ``names``; ``categories``: each categorical column's declared
        categories (a column absent or None is numeric)."""
        shapes = []
        for name in names:
            cats = categories.get(name)
            texts = {c: csv_text(c) for c in cats or () if isinstance(c, str) and csv_text(c) != c}
            shapes.append(ColumnShape(name, _widest(cats), texts))
        return cls(tuple(shapes))

    @classmethod
    def of_domain(cls, domain: Any) -> TableShape:
        """The shape of a synthetic table over ``domain`` (:class:`dpkit.synth.domain.Domain`)."""
        return cls.of([c.name for c in domain.columns], {c.name: c.categories for c in domain.columns})

    def row_bytes(self) -> int:
        """The most bytes of one row in either encoding, separators included (JSON: brackets, a
        comma per cell and one between rows; CSV: a comma per cell and the CR LF line end)."""
        return sum(c.widest for c in self.columns) + len(self.columns) + 2

    def rows_per_part(self) -> int:
        return max(1, PART_BYTES // self.row_bytes())

    def header(self) -> str:
        """The CSV header line (column names are text: escaped like text cells)."""
        return _csv_line([csv_text(c.name) for c in self.columns])

    def bound(self, rows: int) -> int:
        """An upper bound of the bytes stored for a release of at most ``rows`` rows."""
        return 2 * max(0, int(rows)) * self.row_bytes() + len(self.header().encode("utf-8")) + REPORT_BYTES


def _escaped(shape: TableShape, columns: Sequence[str], rows: list[list[Any]]) -> list[list[Any]]:
    """The rows as the CSV writes them: every text value a column's shape names replaced, one
    vectorised lookup per column."""
    by_name = {c.name: c for c in shape.columns}
    todo = [(j, by_name[n].csv_values) for j, n in enumerate(columns) if n in by_name and by_name[n].csv_values]
    if not todo or not rows:
        return rows
    table = np.empty((len(rows), len(columns)), dtype=object)
    table[:] = rows
    for j, values in todo:
        column = pd.Series(table[:, j], dtype=object)
        hit = column.isin(list(values)).to_numpy()
        table[hit, j] = column[hit].map(values).to_numpy()
    return table.tolist()


def build_parts(shape: TableShape, columns: Sequence[str], rows: list[list[Any]]) -> list[tuple[str, str]]:
    """The release's parts in order: (CSV rows, JSON rows) of ``shape.rows_per_part()`` rows
    each; the JSON text of a part is its rows' arrays separated by commas (the download puts
    the brackets and the commas between parts)."""
    step = shape.rows_per_part()
    shown = _escaped(shape, columns, rows)
    parts = []
    for start in range(0, len(rows), step):  # (per part, not per row)
        out = io.StringIO()
        csv.writer(out, lineterminator="\r\n").writerows(shown[start : start + step])
        encoded = json.dumps(rows[start : start + step], allow_nan=False, separators=(",", ":"), default=plain)
        parts.append((out.getvalue(), encoded[1:-1]))
    return parts


def content_digest(parts: Iterable[tuple[str, str]]) -> str:
    """SHA-256 (hex) of a release's stored parts in order: for each part its CSV text then its
    JSON text, each as its UTF-8 bytes preceded by their length (8 bytes, big-endian), so that
    moving bytes from one part or text to the next changes the digest."""
    digest = hashlib.sha256()
    for texts in parts:
        for text in texts:
            data = str(text).encode("utf-8", "surrogatepass")
            digest.update(len(data).to_bytes(8, "big"))
            digest.update(data)
    return digest.hexdigest()
