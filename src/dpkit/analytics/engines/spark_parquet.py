"""Parquet data on Spark, read exactly as DuckDB reads it (:mod:`.parquet_source` has the rules).

:func:`spark_parquet_frame` reads a layout: each group of files with its own schema (Spark's own
types for the group's first footer), the partition directories as strings (the partition columns
are given as ``StringType`` in the reader's schema, so Spark never infers their type from the
names) or as constants, every group projected onto one schema — a column whose type differs
between groups becomes a struct with one field per type (``__dpkit_as_0``, …) — and the groups
appended (``union``). The engine (:class:`~dpkit.analytics.engines.spark.SparkEngine`) reads such
a column field by field (:func:`spark_read_mixed`).

Spark's strings are the file's bytes as they are (they may not be UTF-8). Every string column is
read through :func:`valid_text`: valid text is kept; other text is repaired byte for byte as
DuckDB's reader repairs it (:func:`~dpkit.analytics.engines.parquet_source.decode_text`) — its
bytes as Latin-1 characters, the malformed sequences marked by one regular expression (valid
UTF-8, or a malformed sequence as DuckDB delimits it), each of their bytes made ``'?'`` and the
bytes read back as UTF-8. Only rows whose text is not valid UTF-8 pay for the repair.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from functools import reduce
from pathlib import Path
from typing import Any

from dpkit.analytics.engines.base import ColumnKind, ReadType, is_uri
from dpkit.analytics.engines.parquet_source import (
    MIXED_FIELD,
    ParquetFiles,
    ParquetLayout,
    columns_and_types,
    parquet_files,
    parquet_layout,
)
from dpkit.errors import InvalidParameterError

__all__ = [
    "read_parquet",
    "parquet_listing",
    "spark_parquet_frame",
    "spark_uri_frame",
    "valid_text",
    "spark_read_mixed",
    "mixed_fields",
]

# The text's bytes as Latin-1 characters (one character per byte), by their role in UTF-8.
_BYTE = r"[\x00-\xFF]"
_CONT = r"[\x80-\xBF]"  # a continuation byte
_NOT_CONT = r"[\x00-\x7F\xC0-\xFF]"  # any other byte
_VALID = "|".join(
    [
        r"[\x00-\x7F]",
        rf"[\xC2-\xDF]{_CONT}",
        rf"(?:\xE0[\xA0-\xBF]|[\xE1-\xEC\xEE\xEF]{_CONT}|\xED[\x80-\x9F]){_CONT}",
        rf"(?:\xF0[\x90-\xBF]|[\xF1-\xF3]{_CONT}|\xF4[\x80-\x8F]){_CONT}{_CONT}",
    ]
)
#: A malformed sequence as DuckDB's repair delimits it (``Utf8Proc::MakeValid``): a byte that
#: cannot start one; a lead with too few bytes left (the lead alone); a lead with enough bytes
#: left, up to its first byte that is not a continuation; a complete sequence that is overlong,
#: a surrogate or above U+10FFFF. (Java tries the alternatives in order: too few bytes first.)
_MALFORMED = "|".join(
    [
        r"[\x80-\xBF\xF8-\xFF]",
        rf"[\xC0-\xDF]\z|[\xE0-\xEF](?={_BYTE}?\z)|[\xF0-\xF7](?={_BYTE}{{0,2}}\z)",
        rf"[\xC0-\xDF]{_NOT_CONT}|[\xE0-\xEF](?={_BYTE}{{2}}){_NOT_CONT}|[\xF0-\xF7](?={_BYTE}{{3}}){_NOT_CONT}",
        rf"[\xE0-\xEF]{_CONT}{_NOT_CONT}|[\xF0-\xF7](?={_BYTE}{{3}}){_CONT}{_NOT_CONT}",
        rf"[\xF0-\xF7]{_CONT}{_CONT}{_NOT_CONT}",
        rf"[\xC0\xC1]{_CONT}|\xE0[\x80-\x9F]{_CONT}|\xED[\xA0-\xBF]{_CONT}",
        rf"\xF0[\x80-\x8F]{_CONT}{_CONT}|\xF4[\x90-\xBF]{_CONT}{_CONT}|[\xF5-\xF7]{_CONT}{_CONT}{_CONT}",
    ]
)
#: Markers no Latin-1 character can be: a malformed token ends up between them.
_OPEN, _CLOSE = "\ue000", "\ue001"
#: Every token from the start, aligned on sequences: up to 64 valid ones at a time (a bounded
#: repetition: Java recurses once per repetition of a group) followed by the two markers, or one
#: malformed token between them (Java appends nothing for a group that did not match).
_TOKENS = f"((?:{_VALID}){{1,64}})|({_MALFORMED})"


def valid_text(x: Any) -> Any:
    """The string column ``x`` with text that is not UTF-8 repaired as DuckDB repairs it (each
    pass a linear scan; about 5 s for 10 MB of adversarial text on one core)."""
    from pyspark.sql import functions as F

    s = F.decode(x.cast("binary"), "ISO-8859-1")
    s = F.regexp_replace(s, F.lit(_TOKENS), F.lit(f"$1{_OPEN}$2{_CLOSE}"))
    s = F.regexp_replace(s, F.lit(f"{_BYTE}(?={_BYTE}{{0,3}}{_CLOSE})"), F.lit("?"))  # a malformed token's bytes
    s = F.regexp_replace(s, F.lit(f"[{_OPEN}{_CLOSE}]"), F.lit(""))
    return F.when(F.is_valid_utf8(x), x).otherwise(F.encode(s, "ISO-8859-1").cast("string"))


def _col(name: str) -> Any:
    from pyspark.sql import functions as F

    return F.col("`" + name.replace("`", "``") + "`")


def _value(name: str, data_type: Any) -> Any:
    """A data column as read: text through :func:`valid_text`, anything else as it is."""
    from pyspark.sql import types as T

    x = _col(name)
    return valid_text(x) if isinstance(data_type, T.StringType) else x


def spark_parquet_frame(spark: Any, layout: ParquetLayout) -> Any:
    """One DataFrame over every file of ``layout`` on ``spark`` (see the module docstring)."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    base = os.path.abspath(layout.base)
    schemas = [spark.read.parquet(os.path.abspath(g.first)).schema for g in layout.groups]
    types = [{f.name: f.dataType for f in s.fields} for s in schemas]
    columns, uniform, mixed = columns_and_types(types, layout.keys)
    frames = []
    for g, s, t in zip(layout.groups, schemas, types, strict=True):
        data = [f for f in s.fields if f.name not in layout.keys]
        for r in g.reads:
            files = [os.path.abspath(f) for f in r.files]
            if r.values is None and r.keys:  # partition directories read by Spark, as strings
                schema = T.StructType(data + [T.StructField(k, T.StringType()) for k in r.keys])
                df = spark.read.schema(schema).option("basePath", base).parquet(*files)
            else:  # given the files alone, Spark finds no partition in their paths
                df = spark.read.schema(T.StructType(data)).parquet(*files)
            items = []
            for c in columns:
                if c in uniform:
                    items.append((_value(c, t[c]) if c in t else F.lit(None).cast(uniform[c])).alias(c))
                    continue
                fields = [
                    (_value(c, t[c]) if t.get(c) == ft else F.lit(None).cast(ft)).alias(f"{MIXED_FIELD}{i}")
                    for i, ft in enumerate(mixed[c])
                ]
                items.append(F.struct(*fields).alias(c))
            for k in layout.keys:
                if k in r.keys and r.values is None:
                    items.append(_col(k))
                else:
                    v = r.values[r.keys.index(k)] if r.values is not None and k in r.keys else None
                    items.append(F.lit(v).cast("string").alias(k))
            frames.append(df.select(*items))
    return reduce(lambda a, b: a.union(b), frames)


def spark_uri_frame(spark: Any, uri: str) -> Any:
    """Parquet data at a URI Spark lists itself (``hdfs://…``, ``s3a://…``): the columns that are
    ``key=value`` directories of every file read as strings, text through :func:`valid_text`.
    Files that disagree on a column's type are not regrouped (their footers are not read here)."""
    from pyspark.sql import types as T

    first = spark.read.parquet(uri)
    files = first.inputFiles()
    segments = [set(f.split("/")[:-1]) for f in files]
    fields = []
    for f in first.schema.fields:
        partition = bool(files) and all(any(s.startswith(f.name + "=") for s in seen) for seen in segments)
        fields.append(T.StructField(f.name, T.StringType()) if partition else f)
    frame = spark.read.schema(T.StructType(fields)).parquet(uri)
    return frame.select(*[_value(f.name, f.dataType).alias(f.name) for f in frame.schema.fields])


def mixed_fields(
    data_type: Any, kind: Callable[[Any], ColumnKind], native: Callable[[Any], str]
) -> tuple[tuple[str, ColumnKind, str], ...] | None:
    """A mixed column's fields (name, kind, :func:`~dpkit.analytics.engines.spark_expressions.native_type`), or
    None when ``data_type`` is not a mixed column's struct."""
    from pyspark.sql import types as T

    if not isinstance(data_type, T.StructType) or not data_type.fields:
        return None
    if not all(f.name.startswith(MIXED_FIELD) for f in data_type.fields):
        return None
    return tuple((f.name, kind(f.dataType), native(f.dataType)) for f in data_type.fields)


def spark_read_mixed(
    read_one: Callable[[Any, ReadType, ColumnKind, bool, str], Any],
    x: Any,
    read: ReadType,
    fields: Sequence[tuple[str, ColumnKind, str]],
    strip: bool,
) -> Any:
    """The mixed column ``x`` read as ``read``, each row by its own field's type through the
    engine's rule ``read_one`` — DuckDB's :func:`~.parquet_source.duckdb_read_mixed`, rule for
    rule (a unit as text; a nested field, or a date/binary one read as anything but text, NULL)."""
    from pyspark.sql import functions as F

    want: ReadType = "string" if read == "unit" else read
    cast = {"double": "double", "integer": "long", "boolean": "boolean"}.get(want, "string")
    out = None
    for name, kind, native in fields:
        if kind == "nested" or (kind == "other" and want != "string"):
            continue
        f = x.getField(name)
        value = read_one(f, want, kind, strip, native).cast(cast)
        out = F.when(f.isNotNull(), value) if out is None else out.when(f.isNotNull(), value)
    return F.lit(None).cast(cast) if out is None else out


def parquet_listing(path: str | os.PathLike[str]) -> ParquetFiles | None:
    """The Parquet files ``path`` names (:func:`~dpkit.analytics.engines.parquet_source.parquet_files`),
    or None for a URI, which Spark lists itself. Refused with InvalidParameterError naming
    ``data`` when there is nothing to read — before any Spark session is needed."""
    text = os.fspath(path)
    if is_uri(text):
        return None
    found = parquet_files(Path(text))
    if found is None:
        raise InvalidParameterError(
            "data", Path(text).name, "an existing Parquet file, a directory of Parquet files or a glob"
        )
    return found


def read_parquet(spark: Any, path: str | os.PathLike[str], listing: ParquetFiles | None = None) -> Any:
    """A DataFrame over Parquet data on ``spark``: a file, a directory or a glob (exactly the
    files :func:`~dpkit.analytics.engines.parquet_source.parquet_files` lists, laid out and read
    row by row as DuckDB reads them — each file by its own physical schema, partition
    directories as text, text that is not UTF-8 repaired alike: see
    :mod:`~dpkit.analytics.engines.spark_parquet`), or a URI Spark lists itself (its partition
    columns read as text and its text repaired, but its files read with one schema).
    ``listing``: the :func:`parquet_listing` of ``path`` when the caller already made it. Only
    the files' footers are read (Spark Connect resolves the schema here). Refused with
    InvalidParameterError naming ``data`` when there is nothing to read or Spark cannot read it."""
    text = os.fspath(path)
    p = Path(text)
    uri = is_uri(text)
    found = listing if listing is not None else parquet_listing(text)
    layout = None if found is None else parquet_layout(found, p.name)  # every footer, before Spark reads
    from pyspark.errors import AnalysisException

    try:
        frame = spark_uri_frame(spark, text) if layout is None else spark_parquet_frame(spark, layout)
        frame.schema  # noqa: B018  (Spark Connect reads the footers only when asked)
    except Exception as exc:  # AnalysisException, or the JVM's own error for a file that is not Parquet
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        cause = next((line for line in lines if line.startswith("Caused by:")), None)
        what = lines[0] if isinstance(exc, AnalysisException) and lines else (cause or type(exc).__name__)
        raise InvalidParameterError(
            "data", text if uri else p.name, "Parquet data Spark can read", f"Spark says: {what}"
        ) from None
    return frame
