"""An upper bound on the bytes of a synthetic-table answer, from public facts only.

The service refuses, before paying, a synthetic table whose answer could exceed
``max_response_bytes``, and cuts a table of the measured number of rows to the rows that fit
(:mod:`dpkit.server.synthetic`). Both need a bound that holds for every table the request can
release, computed from the request and the declared metadata alone — never from the rows:

* **a row** ``[v1, v2, ...], `` — per column the longest JSON text its cells can take: the
  longest declared category as ``json.dumps`` writes it (``null`` for the missing cell), or for
  a numeric column :data:`~dpkit.analytics.limits.JSON_NUMBER_BYTES` (the longest ``repr`` of a
  double; whole numbers are exact within ±2**53, so shorter);
* **the report** — its text and its lists grow with the measurements (one per column and one per
  round) and the pairs selected (one per round), each bounded from the longest column name, the
  largest cell count of a marginal and the largest noise σ the split allows;
* **the rest** — the envelope (the dataset's and the release's names, the cost, the budget, the
  estimated number of rows) — fits in :data:`FIXED_BYTES`.

The encoder is the service's (``json.dumps`` with ASCII escapes, default separators): every
non-ASCII character of a name is counted as its escape (:func:`~dpkit.analytics.limits.json_text_bound`).

>>> from dpkit.synth.domain import Column, Domain
>>> d = Domain((Column("sex", categories=("F", "M")), Column("age", edges=(0.0, 50.0, 100.0))))
>>> SynthSize.of(d, rounds=4).row
34
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from dpkit.analytics.limits import JSON_NULL_BYTES, JSON_NUMBER_BYTES, QueryLimits, json_text_bound
from dpkit.errors import LimitExceededError
from dpkit.synth.domain import Domain

__all__ = ["FIXED_BYTES", "SynthSize"]

#: The answer around the rows and the report's lists: its keys, the cost and the budget (names
#: of at most 64 ASCII characters, numbers of at most 24 bytes), the report's first lines (the
#: estimated number of rows written with thousands separators takes at most 410 characters).
FIXED_BYTES = 4096
#: One measurement in the report's text and its list, besides four column names: the padding to
#: 40 characters, a cell count of at most 7 digits (MAX_PAIR_CELLS), σ <= 1e5 written "8.2f", the
#: escaped "×", "σ" and "±", and the keys of its record.
_MEASUREMENT_BYTES = 256
#: One selected pair in the text ("a — b") and in the list, besides four column names.
_SELECTED_BYTES = 32
#: One column in the text's line of merged cells, besides its name (its count: <= 10**4).
_MERGED_BYTES = 24


@dataclass(frozen=True)
class SynthSize:
    """Bytes of one row, and of everything but the rows, of a synthetic table's answer."""

    row: int
    overhead: int

    @classmethod
    def of(cls, domain: Domain, *, rounds: int) -> SynthSize:
        """The bound for a table of ``domain`` fitted in ``rounds`` selection rounds."""
        cells = []
        for c in domain.columns:
            if c.categories is not None:
                cells.append(max(JSON_NULL_BYTES, *(len(json.dumps(x)) for x in c.categories)))
            else:
                cells.append(JSON_NUMBER_BYTES)
        d = len(domain.columns)
        row = 4 + sum(cells) + 2 * (d - 1)  # brackets, the separators inside and after the row
        names = [json_text_bound(c.name) for c in domain.columns]
        widest = max(names)
        overhead = FIXED_BYTES + sum(n + 2 for n in names)  # "columns": [...]
        overhead += (d + rounds) * (4 * widest + _MEASUREMENT_BYTES)  # one-way, then one per round
        overhead += rounds * (4 * widest + _SELECTED_BYTES)
        overhead += sum(n + _MERGED_BYTES for n in names)
        return cls(row, overhead)

    def most_rows(self, limits: QueryLimits) -> int:
        """The most rows an answer may hold within ``max_result_rows`` and ``max_response_bytes``."""
        return max(0, min(limits.max_result_rows, (limits.max_response_bytes - self.overhead) // self.row))

    def check(self, rows: int | None, limits: QueryLimits) -> int:
        """The rows to release (``rows``, or for the measured number at most :meth:`most_rows`),
        refusing with LimitExceededError naming ``max_response_bytes`` a request whose answer
        could exceed it: ``rows`` too many, or not even one row fitting."""
        wanted = 1 if rows is None else rows
        size = self.overhead + wanted * self.row
        if size > limits.max_response_bytes:
            raise LimitExceededError("response bytes", size, limits.max_response_bytes, "max_response_bytes")
        return self.most_rows(limits) if rows is None else rows
