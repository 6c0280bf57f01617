"""DuckDB's text of Spark values, for the keyed hashes both engines must compute alike.
A portable join truncation (:mod:`dpkit.analytics.engines.spark_joins`) hashes each value as
DuckDB's ``concat_ws`` writes it, and two privacy units stored as different types are compared as
their canonical text (:mod:`dpkit.analytics.engines.duckdb_joins`). Integers, strings and booleans
print alike in both engines; a double does not. DuckDB writes what Python's ``repr`` writes: the
shortest digits that read back as the double, positional for decimal exponents in [−4, 16)
(``10000000.0``, ``0.0001``), else ``1.5e+16`` / ``1e-05``. Spark writes Java's
``Double.toString``: positional only in [−3, 7) (``1.0E7``, ``1.0E-4``), and on Java 17 every digit
of an integral double in [2**53, 2**63) (``2.13095637728292992E18`` for 2.13095637728293e+18).
:func:`with_double_texts` rewrites Java's text into DuckDB's.

Left different: a few doubles that Java 17 itself writes with a digit too many or a last digit
off (``1.0E23`` as ``9.999999999999999E22``, 2**-44, the smallest subnormal; Java 19 and later
write the shortest digits, as DuckDB does), and 32-bit floats, which Spark reads as doubles and
DuckDB writes as floats (``0.1`` stored as a float is ``0.1`` in DuckDB,
``0.10000000149011612`` here).

Total under any ``spark.sql.ansi.enabled`` setting: every cast that could fail is a ``try_cast``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dpkit.analytics.engines.base import EXACT_INTEGER_LIMIT

__all__ = ["with_double_texts", "with_texts"]

#: Java's Double.toString in computerized scientific notation: sign, first digit, the others, exponent.
_JAVA_SCIENTIFIC = r"^(-?)([1-9])\.([0-9]+)E(-?[0-9]+)$"


def _rounded(exact: Any, k: Any) -> Any:
    """The first ``k`` digits of the integer ``exact`` (its text), rounded half up: 999 → 1000."""
    from pyspark.sql import functions as F

    up = (exact.substr(k + F.lit(1), F.lit(1)) >= F.lit("5")).cast("long")
    return (exact.substr(F.lit(1), k).try_cast("long") + up).cast("string")


def _shortest_length(exact: Any, a: Any) -> Any:
    """The fewest significant digits that read back as ``a``, an integral double in [2**53, 2**63)
    whose exact integer is ``exact`` (its text): the integer rounded (half up) to 1, 2, … 17
    digits, the first that reads back as ``a`` — the nearest decimal of that length, the one
    DuckDB writes. NULL when ``exact`` is."""
    from pyspark.sql import functions as F

    found: Any = None
    for k in range(1, 18):
        back = F.concat(_rounded(exact, F.lit(k)), F.lit("E"), (F.length(exact) - F.lit(k)).cast("string"))
        hit = back.try_cast("double") == a
        found = F.when(hit, F.lit(k)) if found is None else found.when(hit, F.lit(k))
    return found


def _formatted(x: Any, s: Any, digits: Any, e: Any) -> Any:
    """DuckDB's text of the double ``x`` from Java's (``s``) and the shortest ``digits`` and
    decimal exponent ``e`` (``digits`` empty: Java wrote ``x`` positionally, as DuckDB does)."""
    from pyspark.sql import functions as F

    sign = F.when(x < F.lit(0.0), F.lit("-")).otherwise(F.lit(""))
    n = F.length(digits)
    exponent = F.concat(
        F.when(e < 0, F.lit("-")).otherwise(F.lit("+")),
        F.when(F.abs(e) < 10, F.lit("0")).otherwise(F.lit("")),
        F.abs(e).cast("string"),
    )
    fraction = F.when(n > 1, F.concat(F.lit("."), digits.substr(F.lit(2), F.lit(1 << 20)))).otherwise(F.lit(""))
    scientific = F.concat(sign, digits.substr(F.lit(1), F.lit(1)), fraction, F.lit("e"), exponent)
    # 0 <= e < 16: the point after e + 1 digits (zeros padded, ".0" when nothing follows);
    # −4 <= e < 0: "0.", −e − 1 zeros, the digits
    zeros = F.lit("0" * 16)
    big = F.when(n <= e + 1, F.concat(sign, digits, zeros.substr(F.lit(1), e + 1 - n), F.lit(".0"))).otherwise(
        F.concat(sign, digits.substr(F.lit(1), e + 1), F.lit("."), digits.substr(e + 2, F.lit(1 << 20)))
    )
    small = F.concat(sign, F.lit("0."), zeros.substr(F.lit(1), -e - 1), digits)
    return (
        F.when(F.isnan(x), F.lit("nan"))
        .when(x == F.lit(float("inf")), F.lit("inf"))
        .when(x == F.lit(float("-inf")), F.lit("-inf"))
        .when(digits == F.lit(""), s)
        .when((e >= 16) | (e < -4), scientific)
        .when(e >= 0, big)
        .otherwise(small)
    )


def with_double_texts(frame: Any, columns: Mapping[str, str]) -> Any:
    """``frame`` with, for each (double column, name) of ``columns``, a column ``name``: the value
    as DuckDB writes it (see the module docstring).

    Four projections, each reading the previous one's columns: written as one expression, each part
    would be repeated in every branch that uses it (Catalyst does not collapse a projection into
    one that would repeat an expression), and the generated code outgrows a Java method."""
    from pyspark.sql import functions as F

    if not columns:
        return frame
    outs = list(columns.values())
    x = [F.col(c) for c in columns]

    def tmp(kind: str, i: int) -> Any:
        return f"__dpkit_{kind}{i}"

    def col(kind: str, i: int) -> Any:
        return F.col(tmp(kind, i))

    lo, hi = F.lit(float(2**53)), F.lit(float(2**63))
    frame = frame.select(
        "*",
        *[v.cast("string").alias(tmp("s", i)) for i, v in enumerate(x)],
        *[
            F.when((F.abs(v) >= lo) & (F.abs(v) < hi), F.abs(v).try_cast("long").cast("string")).alias(tmp("l", i))
            for i, v in enumerate(x)
        ],
    )
    frame = frame.select("*", *[_shortest_length(col("l", i), F.abs(v)).alias(tmp("k", i)) for i, v in enumerate(x)])
    parts = []
    for i in range(len(x)):
        s, exact, k = col("s", i), col("l", i), col("k", i)
        q = _rounded(exact, k)
        java = F.concat(F.regexp_extract(s, _JAVA_SCIENTIFIC, 2), F.regexp_extract(s, _JAVA_SCIENTIFIC, 3))
        # trailing zeros dropped (Java writes 1.0E16 for one digit)
        digits = F.regexp_replace(F.when(k.isNotNull(), q).otherwise(java), "0+$", "")
        # a rounding up from 999… gains a digit, and the exponent with it
        e = F.when(k.isNotNull(), F.length(exact) - k - F.lit(1) + F.length(q)).otherwise(
            F.regexp_extract(s, _JAVA_SCIENTIFIC, 4).try_cast("int")
        )
        parts += [digits.alias(tmp("d", i)), e.alias(tmp("e", i))]
    frame = frame.select("*", *parts)
    texts = [_formatted(v, col("s", i), col("d", i), col("e", i)).alias(outs[i]) for i, v in enumerate(x)]
    return frame.select("*", *texts).drop(*[tmp(kind, i) for kind in "slkde" for i in range(len(x))])


def _is_double(data_type: Any) -> bool:
    from pyspark.sql import types as T

    return isinstance(data_type, (T.DoubleType, T.FloatType))


def with_texts(frame: Any, columns: Mapping[str, tuple[Any, str, bool]]) -> Any:
    """``frame`` with, for each (column, (its Spark type, name, canonical)) of ``columns``, a column
    ``name``: the value as DuckDB's ``concat_ws`` writes it; with ``canonical``, its canonical text
    as a privacy unit instead (DuckDB's ``_read(x, "string", ...)``: an integral number within
    ±2**53 as an integer — ``5`` whether stored as 5, 5.0 or 5.00 —, another finite number as
    DuckDB writes it, NaN and ±inf NULL, text as is)."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    doubles = {c: f"__dpkit_x{k}" for k, (c, (dt, _, _)) in enumerate(columns.items()) if _is_double(dt)}
    if doubles:
        frame = frame.select("*", *[F.col(c).cast("double").alias(n) for c, n in doubles.items()])
        frame = with_double_texts(frame, {n: f"{n}t" for n in doubles.values()})
    out = []
    for c, (data_type, name, canonical) in columns.items():
        x = F.col(c)
        text = F.col(f"{doubles[c]}t") if c in doubles else x.cast("string")
        if canonical and (c in doubles or isinstance(data_type, T.DecimalType)):
            d = x.cast("double")
            finite = ~F.isnan(d) & (F.abs(d) < F.lit(float("inf")))
            whole = finite & (F.abs(d) <= F.lit(float(EXACT_INTEGER_LIMIT))) & (d == F.round(d))
            text = F.when(whole, d.try_cast("long").cast("string")).when(finite, text)
        out.append(text.alias(name))
    return frame.select("*", *out).drop(*[x for n in doubles.values() for x in (n, f"{n}t")])
