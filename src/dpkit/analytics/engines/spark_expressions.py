"""The column expressions of the Spark engine (:class:`~dpkit.analytics.engines.spark.SparkEngine`):
how a declared column is read from the physical one, a plan's predicate, a sum's integer summand
and a quantile's cell.

Everything is built with the DataFrame API (``pyspark.sql.functions``): constants go through
``F.lit`` and the only pattern strings are the fixed ones below — no SQL text is ever assembled
from names or values. Apart from the engine, which holds the plumbing (the frame and its
positional names, the binding, the bounding window, the job, a local SparkSession), because
these are the rules themselves: each is a function from columns to a column, written rule for
rule against DuckDB's (:mod:`dpkit.analytics.engines.duckdb`) and read side by side with it.

Reading rules (identical to DuckDB's, which is what they reproduce):

* text: a string column as is, with the Unicode space separators (``' '``, NBSP, U+2000–U+200A, …,
  exactly what DuckDB's ``trim`` removes) trimmed from both ends when ``strip_strings``; any other
  column as its text form;
* ``boolean``: text whose ASCII-lowercased form is one of ``true t yes y 1`` / ``false f no n 0``
  (no surrounding whitespace, as in DuckDB; Spark's own cast would also accept ``' true'`` and
  control characters); numbers are true when non-zero (NaN too), booleans are themselves;
* ``double``: text in DuckDB's number syntax — optional ASCII whitespace (space, ``\\t \\n \\r \\v
  \\f``) around an optional ``+``, an optional ``-``, decimal digits with single ``_`` separators
  between digits, an optional fraction and exponent — parsed to the nearest double (Spark's own cast
  would also take ``1.5d``, ``0x1p3`` and leading control characters; DuckDB takes ``1_000`` and
  ``+-1``, so those are accepted here too); numbers and booleans (1.0/0.0) cast; NaN and ±inf
  (also their spellings, and overflowing text) become NULL;
* ``integer``: the double above when it is finite, integral and within ±2**53, else NULL;
* date, time, binary and interval columns (kind ``other``) read as NULL for every type but text
  (Spark alone would turn a timestamp into epoch seconds); ``nested`` columns cannot be declared.

What still differs between the engines is the *text form* of non-text columns read as ``string`` or
``unit``: integers, decimals, booleans and dates print alike, floating-point values do not (DuckDB
writes ``1e+16``, Spark ``1.0E16``), nor do binary values (DuckDB escapes bytes, Spark decodes
UTF-8), intervals, or timestamps with time zones (Spark prints them in the session's time zone).
Portable priorities stringify the unit and group key values too, so use integer or string keys (or
text columns) for cross-engine parity.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dpkit.analytics.engines.base import EXACT_INTEGER_LIMIT, ColumnKind, ReadType
from dpkit.analytics.plan import And, Between, Compare, InList, IsNull, Not, Or, Predicate, SumSpec, ValueSpec
from dpkit.errors import InvalidParameterError

#: What DuckDB's ``trim`` removes: the Unicode space separators (category Zs).
_SPACES = " \u00a0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u202f\u205f\u3000"
#: DuckDB's number syntax for text read as a double (Java regex; ``\z`` is the very end, unlike
#: ``$``, which also matches before a final line terminator). Group 1 is the sign, group 2 the
#: digits (with ``_`` separators) — nan/inf spellings do not match, as they would become NULL anyway.
_WS = r"[ \t\n\r\x0b\x0c]*"
_DIGITS = r"[0-9]+(?:_[0-9]+)*"
_NUMBER = rf"^{_WS}\+?(-?)((?:{_DIGITS}(?:\.(?:{_DIGITS})?)?|\.{_DIGITS})(?:[eE][+-]?{_DIGITS})?){_WS}\z"
_TRUE = ("true", "t", "yes", "y", "1")
_FALSE = ("false", "f", "no", "n", "0")


def column_by_name(name: str) -> Any:
    """A column by its exact name (backtick-quoted: no nested-field or dot parsing)."""
    from pyspark.sql import functions as F

    return F.col("`" + name.replace("`", "``") + "`")


def spark_kind(data_type: Any) -> ColumnKind:
    from pyspark.sql import types as T

    if isinstance(data_type, T.BooleanType):
        return "boolean"
    if isinstance(data_type, T.NumericType):
        return "numeric"
    if isinstance(data_type, (T.StringType, T.VarcharType, T.CharType)):
        return "string"
    nested = tuple(
        getattr(T, n)
        for n in ("ArrayType", "MapType", "StructType", "VariantType", "UserDefinedType", "SpatialType")
        if hasattr(T, n)
    )
    if isinstance(data_type, nested):
        return "nested"
    return "other"


def _finite(d: Any) -> Any:
    from pyspark.sql import functions as F

    return ~F.isnan(d) & (F.abs(d) < F.lit(float("inf")))


def null_of(read: ReadType) -> Any:
    """A NULL of the type ``read`` gives."""
    from pyspark.sql import functions as F

    return F.lit(None).cast({"double": "double", "integer": "long", "boolean": "boolean"}.get(read, "string"))


def native_type(data_type: Any) -> str:
    """``"integer"`` for Spark's integer types, ``"float"`` for its floating types, else ``""``."""
    from pyspark.sql import types as T

    if isinstance(data_type, (T.ByteType, T.ShortType, T.IntegerType, T.LongType)):
        return "integer"
    if isinstance(data_type, (T.FloatType, T.DoubleType)):
        return "float"
    return ""


def _number_text(x: Any, native: str) -> Any:
    """A number's canonical text (DuckDB's ``_number_text``): an integral value within ±2**53 as an
    integer, whatever the physical type (``0`` for −0.0); another finite value as Spark writes it;
    NaN and ±inf NULL."""
    from pyspark.sql import functions as F

    if native == "integer":
        return x.cast("string")
    finite = _finite(x) if native == "float" else F.lit(True)
    whole = finite & (F.abs(x) <= F.lit(EXACT_INTEGER_LIMIT)) & (x == F.round(x))
    return F.when(whole, x.try_cast("long").cast("string")).when(finite, x.try_cast("string"))


def read_declared(x: Any, read: ReadType, kind: ColumnKind, strip: bool, native: str = "") -> Any:
    """The total expression reading the physical column ``x`` as its declared type (DuckDB's
    ``_read``, rule for rule; see the module docstring). ``native`` (:func:`native_type` of the
    physical type) selects a cheaper expression with the same values (integers and floats need no
    round trip through a double and no integrality test) and the canonical forms of floats: −0.0
    is 0.0 and NaN is NULL."""
    from pyspark.sql import functions as F

    if read == "unit" and kind in ("numeric", "boolean"):
        if native == "float":
            return F.when(x == F.lit(0), F.lit(0).cast("double")).when(~F.isnan(x), x.cast("double"))
        return x  # compared and hashed only: kept native, as in DuckDB
    if read == "double" and native == "integer":
        return x.cast("double")
    if read == "double" and native == "float":
        return F.when(x == F.lit(0), F.lit(0.0)).when(_finite(x), x.cast("double"))
    if read == "integer" and native == "integer":
        limit = F.lit(int(EXACT_INTEGER_LIMIT)).cast("long")
        return F.when(x.between(-limit, limit), x.cast("long"))
    if kind == "numeric" and read in ("string", "unit"):
        return _number_text(x, native)
    if kind != "string":
        text = x.try_cast("string")
    elif strip:
        text = F.btrim(x, F.lit(_SPACES))
    else:
        text = x
    if read in ("string", "unit"):
        return text
    if kind in ("other", "nested"):
        return null_of(read)
    if read == "boolean":
        if kind == "string":
            low = F.lower(text)
            return F.when(low.isin(*[F.lit(s) for s in _TRUE]), F.lit(True)).when(
                low.isin(*[F.lit(s) for s in _FALSE]), F.lit(False)
            )
        return x.try_cast("boolean")
    if kind == "string":
        number = F.concat(
            F.regexp_extract(text, _NUMBER, 1), F.regexp_replace(F.regexp_extract(text, _NUMBER, 2), "_", "")
        )
        d = F.when(text.rlike(_NUMBER), number.try_cast("double"))
    else:
        d = x.try_cast("double")
    if read == "double":
        return F.when(d == F.lit(0), F.lit(0.0)).when(_finite(d), d)
    # integer: an exact double with an integral value (3.5 and 1e300 are not integers)
    return F.when(_finite(d) & (F.abs(d) <= F.lit(float(EXACT_INTEGER_LIMIT))) & (d == F.round(d)), d.try_cast("long"))


# -- the plan's expressions -------------------------------------------------------------------------


def predicate(p: Predicate, column: Callable[[str], Any]) -> Any:
    """``p`` as a boolean column, each column named in it found by ``column`` (the engine's
    bound columns)."""
    from pyspark.sql import functions as F

    if isinstance(p, Compare):
        c, v = column(p.column), F.lit(p.value)
        ops = {"=": c == v, "!=": c != v, "<": c < v, "<=": c <= v, ">": c > v, ">=": c >= v}
        if p.op not in ops:
            raise InvalidParameterError("op", p.op, "one of =, !=, <, <=, >, >=")
        return ops[p.op]
    if isinstance(p, InList):
        e = column(p.column).isin(*[F.lit(x) for x in p.values])
        return ~e if p.negated else e
    if isinstance(p, Between):
        e = column(p.column).between(F.lit(p.low), F.lit(p.high))
        return ~e if p.negated else e
    if isinstance(p, IsNull):
        return column(p.column).isNotNull() if p.negated else column(p.column).isNull()
    if isinstance(p, (And, Or)):
        parts = [predicate(x, column) for x in p.parts]
        if not parts:
            return F.lit(isinstance(p, And))
        e = parts[0]
        for x in parts[1:]:
            e = (e & x) if isinstance(p, And) else (e | x)
        return e
    if isinstance(p, Not):
        return ~predicate(p.part, column)
    raise TypeError(f"not a predicate: {p!r}")


def summand(s: SumSpec, x: Any) -> Any:
    """The integer summand of ``s`` from ``x``, a column already cleaned (NaN → NULL) by the
    engine's first projection: one expression, each input read once."""
    from pyspark.sql import functions as F

    clipped = F.least(F.greatest(x, F.lit(float(s.lower))), F.lit(float(s.upper)))
    # F.round is HALF_UP on the double's exact decimal value: half away from zero, like DuckDB.
    # |(clipped − center)·2^-k| <= bound (quantize_spec), so the cast cannot overflow; the
    # clamp keeps the summand in range whatever the rounding. least/greatest skip NULLs in
    # Spark, so a NULL value is kept NULL explicitly.
    r = F.round((clipped - F.lit(float(s.center))) * F.lit(2.0**-s.grid_exp)).cast("long")
    b = int(s.bound)
    v = F.when(x.isNotNull(), F.least(F.greatest(r, F.lit(-b).cast("long")), F.lit(b).cast("long")))
    if s.square:
        v = F.shiftright(v * v + F.lit(1 << s.shift >> 1).cast("long"), int(s.shift))
    return v


def quantile_cell(x: ValueSpec, clean: Any) -> Any:
    """The row's cell on the quantile's candidate grid (plan.ValueSpec) from ``clean`` (the
    cleaned column), NULL for NULL."""
    from pyspark.sql import functions as F

    lo = F.lit(float(x.lower))
    t = (F.least(F.greatest(clean, lo), F.lit(float(x.upper))) - lo) * F.lit(float(x.scale))
    k = F.floor(t).cast("long")
    cell = k * F.lit(2).cast("long") + F.when(t == F.floor(t), F.lit(0)).otherwise(F.lit(1)).cast("long")
    # least() skips NULLs in Spark (least(NULL, c) = c): a NULL value must stay NULL explicitly
    return F.when(clean.isNotNull(), F.least(cell, F.lit(2 * x.cells).cast("long")))
