"""Reading a pandas DataFrame by the declared schema, whatever its dtypes.

A column's dtype is a property of the whole column: one row holding NaN turns an int64 column into
float64, one odd object makes a column ``object``. What a row contributes must not depend on it
(DESIGN.md, "Reading is row-local"), so only the column's broad kind is taken from the dtype, and
the engines' total casts read every value by the declared type: an integral number reads the same
as an integer or as a string category (``1`` and ``1.0`` both read ``"1"``), NaN is NULL.

Text columns (object, string, category) are handed to DuckDB as text, each value as its ``str``.
Python strings may hold lone surrogates (``"\\ud800"``) and object columns may hold bytes that are
not UTF-8: neither is Unicode text, and such a value is decoded totally instead of failing the whole
column (each surrogate or invalid byte becomes U+FFFD; bytes that are UTF-8 read as their text).
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from dpkit.analytics.engines.base import ColumnKind

__all__ = ["pandas_kind", "text_column"]

_ARROW_TEXT = pd.StringDtype("pyarrow")


def pandas_kind(dtype: Any) -> ColumnKind:
    """A column's kind from its dtype (the schema, never the values)."""
    if pd.api.types.is_bool_dtype(dtype):
        return "boolean"
    if pd.api.types.is_numeric_dtype(dtype):
        return "numeric"
    if isinstance(dtype, pd.ArrowDtype) and not (pd.api.types.is_string_dtype(dtype)):
        return "nested" if "list" in str(dtype) or "struct" in str(dtype) or "map" in str(dtype) else "other"
    if pd.api.types.is_datetime64_any_dtype(dtype) or pd.api.types.is_timedelta64_dtype(dtype):
        return "other"
    # object, string and category columns: read as text (an object column's values are turned
    # into their text form before DuckDB sees them, so no per-row type inference happens)
    return "string"


def text_column(col: pd.Series) -> pd.Series:
    """``col`` as Arrow-backed text: every value's ``str``, NULL for missing values, lone
    surrogates decoded totally (U+FFFD) rather than failing the column."""
    if col.dtype == _ARROW_TEXT:
        return col
    try:
        return col.astype(_ARROW_TEXT)
    except (UnicodeEncodeError, UnicodeDecodeError):
        # Only a column holding a value that is not Unicode text comes here (a lone surrogate, or
        # bytes that are not UTF-8): each value is converted alone, the others as above.
        return col.map(_total_text, na_action="ignore").astype(_ARROW_TEXT)


def _total_text(value: object) -> str:
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", "replace")
    text = str(value)
    return text.encode("utf-8", "surrogatepass").decode("utf-8", "replace")
