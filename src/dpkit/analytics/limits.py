"""Limits on the size of one query, set by whoever runs the session (the curator, in the service).

Every limit is checked on the request and the declared metadata only — before anything is paid
and before the data is read — so a refusal says nothing about the data. A request over a limit
raises :class:`~dpkit.errors.LimitExceededError` naming the limit and its setting.

* ``max_keys`` — the number of public group keys: the product of the per-column counts (declared
  categories, bins) or the length of an explicit ``keys=`` list. It is computed as an integer,
  never by listing the keys, so a request for 10^9 keys is refused as quickly as one for 10^6.
  With a column whose keys are selected privately, the product of the other columns' public
  values counts (they still filter the table).
* ``max_result_rows`` — the rows of one answer. With public keys the row count is known before
  paying (one row per key) and a larger request is refused. With keys selected privately it is
  not: the released rows are cut to the limit in key order, which depends on the released keys
  only (post-processing of the release), and the result says ``truncated=True``.
* ``max_response_bytes`` — the size of the answer as JSON (``QueryResult.to_dict()`` encoded with
  ``json.dumps``, ASCII-escaped or UTF-8, default or compact separators), bounded from above
  before paying from the declared metadata: per row, the column names, 24 bytes per number, the
  longest declared category, explicit key or bin label; plus the aggregates'
  descriptions and the priced event. With public keys a larger answer is refused. With keys
  selected privately the rows are cut, like above, to those that fit — for text keys whose
  length is not declared, from the released keys' own lengths. The curator service bounds a
  synthetic table's answer the same way, from its declared domain and rounds
  (:mod:`dpkit.server.synth_size`): too many ``rows`` are refused before paying, and a table of
  the measured number of rows is cut to the rows that fit. Every refusal names
  ``max_response_bytes`` and its value.
* ``max_query_depth`` — the nesting of SQL text and predicates: parentheses (and brackets)
  count one level each, and so does each AND, OR and NOT chained at one level (``a AND b AND c``
  is a tree three deep). It is measured by one linear pass over the text before the parser
  sees it; the parser's own recursion needs about twenty Python frames per parenthesis, so the
  default, 32, stays well inside Python's recursion limit.

>>> QueryLimits().max_keys
100000
>>> public_key_count([4, 1000, 1000])
4000000
>>> json_text_bound("Male")
6
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dpkit.errors import LimitExceededError

# `dpkit serve --help` shows the limits' defaults: reading them loads neither numpy nor pandas
# (the checks that need them import them when they run).
if TYPE_CHECKING:
    import numpy as np
    import pandas as pd

__all__ = [
    "QueryLimits",
    "public_key_count",
    "json_text_bound",
    "json_text_bounds",
    "JSON_NUMBER_BYTES",
    "JSON_BIN_LABEL_BYTES",
]

#: The longest JSON text of a Python float (``repr``: 17 significant digits, sign, point and a
#: three-digit exponent, e.g. ``-1.2345678901234567e-308``); NaN is written as ``null``.
JSON_NUMBER_BYTES = 24
#: The longest bin label ``"[a, b)"`` with quotes: each edge is formatted with ``:g`` (at most 13
#: characters, e.g. ``-1.23457e-100``).
JSON_BIN_LABEL_BYTES = 2 * 13 + 6
JSON_BOOLEAN_BYTES = 5
#: ``null`` — any value may be missing (a NULL key selected privately, a NaN interval end).
JSON_NULL_BYTES = 4
#: An upper bound on the bytes one character takes in a JSON string, escaped (``\\u0000``,
#: ``\\ud83d\\ude00``) or as UTF-8: 12, so 11 more than a plain printable ASCII character.
_EXTRA_PER_SPECIAL_CHAR = 11
#: Any character but printable ASCII without the quote and the backslash (those take one byte
#: whatever the encoder).
_SPECIAL = r"[^\x20\x21\x23-\x5b\x5d-\x7e]"
_SPECIAL_RE = re.compile(_SPECIAL)


@dataclass(frozen=True)
class QueryLimits:
    """How large one query may be (see the module docstring for how each is measured).

    ``max_keys``: public group keys (product of the per-column counts). ``max_result_rows``: rows
    of one answer (refused with public keys, cut in key order with private ones).
    ``max_response_bytes``: the answer's JSON size, bounded before paying. ``max_query_depth``:
    nesting of parentheses and boolean operators in SQL text and predicates.
    """

    max_keys: int = 100_000
    max_result_rows: int = 100_000
    max_response_bytes: int = 16 * 1024 * 1024
    max_query_depth: int = 32

    def __post_init__(self) -> None:
        from dpkit import _validate as v

        for name in ("max_keys", "max_result_rows", "max_response_bytes", "max_query_depth"):
            v.positive_int(getattr(self, name), name)

    def check(self, name: str, value: int, setting: str) -> None:
        """Raise :class:`LimitExceededError` if ``value`` exceeds the limit ``setting``."""
        limit = getattr(self, setting)
        if value > limit:
            raise LimitExceededError(name, value, limit, setting)


def public_key_count(counts: Iterable[int]) -> int:
    """The number of keys in the product of per-column key counts, as an exact integer (the
    product is never listed)."""
    return math.prod(int(c) for c in counts)


def json_text_bound(text: str) -> int:
    """An upper bound on the bytes of ``text`` as a JSON string, quotes included, whether the
    encoder escapes non-ASCII characters (``ensure_ascii=True``) or writes UTF-8."""
    return len(text) + 2 + _EXTRA_PER_SPECIAL_CHAR * len(_SPECIAL_RE.findall(text))


def json_text_bounds(values: pd.Series) -> np.ndarray:
    """:func:`json_text_bound` for a column of text (vectorised); NULLs count as ``null``."""
    import numpy as np

    s = values.astype("string")
    length = s.str.len().fillna(0).to_numpy(dtype=np.int64)
    special = s.str.count(_SPECIAL).fillna(0).to_numpy(dtype=np.int64)
    out = length + 2 + _EXTRA_PER_SPECIAL_CHAR * special
    return np.maximum(out, JSON_NULL_BYTES)
