"""Parquet data read row by row by the declared schema, alike on DuckDB and Spark.

A path names Parquet files (:func:`parquet_files`: a file, a directory, a glob). How their rows
are read must not depend on any other row (DESIGN.md, "Reading is row-local"), yet both engines'
own readers decide from the data as a whole: the first file's footer types every file, partition
directories' names are typed by inference, and text that is not UTF-8 fails a query. So the
files are laid out here (:func:`parquet_layout`), from their footers and their names only:

* **Physical schemas.** The files are grouped by their own Parquet schema (read from each
  footer; no row is read). Each group is read with its own types. A column whose type differs
  between groups is one *mixed* column: a struct with one field per physical type
  (``__dpkit_as_0``, …), set in the rows of the files of that type and NULL elsewhere. An engine
  reads a mixed column field by field, each by its own type's rule, so a value is read as its
  own file's type says, whatever the other files hold (``'N/A'`` in a text file is NULL, 33.5 in
  a DOUBLE file is 33.5 — not 34, as the first file's INT64 would have it — and 1e300 is a
  finite double). A column a file lacks is NULL in that file's rows. The kind a mixed column
  reports (:func:`mixed_kind`) is what its files share, else ``string``.
* **Partition directories** (``key=value`` below the base) are text, never typed from their
  names: ``zip=00501`` reads ``'00501'`` and ``day=2020-1-5`` ``'2020-1-5'``, then the declared type
  applies. :func:`partition_value` is the rule: ``%XY`` escapes are bytes, the bytes are decoded as
  text by :func:`decode_text`, ``__HIVE_DEFAULT_PARTITION__`` is NULL, an empty value is ``''``.
  Where both engines read a directory's name to that value themselves (:func:`plain_partition`:
  no escapes beyond ASCII, not empty) they do (DuckDB with ``hive_types_autocast = false``, Spark
  with the partition columns given as strings); other files are read with the value as a constant.
* **Text that is not UTF-8** is decoded totally by :func:`decode_text`, DuckDB's own repair
  (``read_parquet(..., utf8_validation = 'replace')``): each byte of a malformed sequence becomes
  ``'?'``. Spark applies the same rule to the strings it reads (:mod:`.spark_parquet`).

:func:`duckdb_parquet` builds DuckDB's view of a layout: one ``read_parquet`` per group (and per
set of files whose partitions are constants), ``UNION ALL``. The common case — one schema, plain
partition names — is a single ``read_parquet`` of every file, as fast as before.

Not covered: URIs that only Spark can list (``hdfs://``, ``s3a://``: their footers are not read
here, so Spark's own reading applies — see :func:`~dpkit.analytics.engines.spark_parquet.read_parquet`);
a data column named like a partition key (the partition wins); file paths that are not valid
UTF-8 (refused: DuckDB cannot open them).
"""

from __future__ import annotations

import glob as globmod
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dpkit.analytics.engines.base import ColumnKind, ReadType, sql_string
from dpkit.analytics.engines.base import quote_identifier as q
from dpkit.errors import InvalidParameterError

__all__ = [
    "MIXED_FIELD",
    "HIVE_NULL",
    "ParquetFiles",
    "ParquetRead",
    "ParquetGroup",
    "ParquetLayout",
    "DuckDBParquet",
    "parquet_files",
    "parquet_layout",
    "partition_value",
    "plain_partition",
    "partitions_of",
    "decode_text",
    "mixed_kind",
    "duckdb_parquet",
    "duckdb_read_mixed",
    "duckdb_mixed_text",
]

#: The name of a mixed column's fields: ``__dpkit_as_0``, ``__dpkit_as_1``, … (one per physical type).
MIXED_FIELD = "__dpkit_as_"
#: The directory value Hive and Spark write for a NULL partition value.
HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"

_GLOB = set("*?[")
_ESCAPE = re.compile(rb"%([0-9A-Fa-f]{2})")
#: A partition directory's value both engines read to :func:`partition_value` themselves: not
#: empty, no ``=``, and every ``%`` an escape of an ASCII character (DuckDB decodes ``%XY`` as
#: UTF-8 bytes, Spark as one character each: they agree below ``%80``; Spark refuses ``key=``).
_PLAIN = re.compile(r"(?:[^%=]|%[0-7][0-9A-Fa-f])+")


# ---- listing --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ParquetFiles:
    """The Parquet files a path names (see :func:`parquet_files`).

    ``files``: every file, sorted; ``base``: the directory below which ``key=value`` directories
    are partition columns (Spark's ``basePath``); ``hive``: whether there are any."""

    files: tuple[str, ...]
    base: Path
    hive: bool


def _hidden(parts: Sequence[str]) -> bool:
    """Spark's rule for paths that hold no data: a name starting with ``.``, or with ``_`` unless it
    is a ``key=value`` directory (``_SUCCESS``, ``_temporary/``, ``.part-0.parquet.crc``)."""
    return any(p.startswith(".") or (p.startswith("_") and "=" not in p) for p in parts)


def _partition_base(directory: Path) -> Path:
    """The directory above ``directory``'s trailing ``key=value`` directories (itself when its name
    is not one): ``people/year=2020`` → ``people``, so ``year`` is a column on both engines."""
    while "=" in directory.name and directory.parent != directory:
        directory = directory.parent
    return directory


def _hive(files: Sequence[Path], base: Path) -> bool:
    start = len(base.parts)
    return any("=" in part for f in files for part in f.parts[start:-1])


def parquet_files(path: str | os.PathLike[str]) -> ParquetFiles | None:
    """The Parquet files ``path`` names: a ``.parquet``/``.pq`` file; a directory (every Parquet
    file under it, at any depth); a glob (``data/*.parquet``, ``data/**/*.parquet``, ``**`` matching
    any number of directories). Names starting with ``.`` or ``_`` (``_SUCCESS``, ``_temporary/``)
    are skipped, as Spark skips them. The ``key=value`` directories the files sit in — below the
    directory named, or the glob's fixed part, and the ``key=value`` directories that end it — are
    Hive partition columns. None when ``path`` is none of these; a directory or a glob that
    matches no file is refused (:class:`~dpkit.errors.InvalidParameterError`). Only names are
    listed here: no file is opened (:func:`parquet_layout` reads the footers)."""
    text = os.fspath(path)
    p = Path(text)
    if _GLOB & set(text):
        parts = p.parts
        fixed = next(i for i, part in enumerate(parts) if _GLOB & set(part))
        root = Path(*parts[:fixed]) if fixed else Path()
        matches = sorted(Path(m) for m in globmod.glob(text, recursive=True))
        files = [m for m in matches if not _hidden(m.parts[fixed:]) and m.is_file()]
        if not files:
            shown = str(Path(*parts[max(fixed - 1, 0) :]))  # the pattern and the directory it starts in
            raise InvalidParameterError("data", shown, "a glob that matches at least one Parquet file")
        base = _partition_base(root)
        return ParquetFiles(tuple(str(f) for f in files), base, _hive(files, base))
    if p.is_dir():
        files = sorted(
            f
            for f in p.rglob("*")
            if f.suffix.lower() in (".parquet", ".pq") and not _hidden(f.relative_to(p).parts) and f.is_file()
        )
        if not files:
            raise InvalidParameterError("data", p.name, "a directory holding at least one .parquet file")
        base = _partition_base(p)
        return ParquetFiles(tuple(str(f) for f in files), base, _hive(files, base))
    if p.is_file() and p.suffix.lower() in (".parquet", ".pq"):
        return ParquetFiles((str(p),), p.parent, False)
    return None


# ---- text and partition values --------------------------------------------------------------------


def decode_text(data: bytes) -> str:
    """``data`` as text, every byte of a malformed UTF-8 sequence replaced by ``'?'`` — DuckDB's
    rule (``Utf8Proc::MakeValid``), which its Parquet reader applies with ``utf8_validation =
    'replace'`` and Spark's reading reproduces. Scanning left to right, a lead byte announces a
    sequence of 2, 3 or 4 bytes: when fewer bytes remain, the lead alone is replaced; else the
    sequence up to and including its first byte that is not a continuation is replaced; a
    complete sequence that is overlong, a surrogate or above U+10FFFF is replaced whole; a byte
    that cannot start a sequence is replaced. Valid text is returned unchanged (a reference for
    tests and for partition names; the engines run their own).

    >>> decode_text(b"caf\\xc3\\xa9"), decode_text(b"a\\xffb"), decode_text(b"\\xe2\\x82A!"), decode_text(b"\\xe2\\x82")
    ('café', 'a?b', '???!', '??')
    """
    s = bytearray(data)
    n, i = len(s), 0
    while i < n:
        c = s[i]
        if c < 0x80:
            i += 1
            continue
        if c & 0xE0 == 0xC0:
            size, mask, v = 2, 0x780, c & 0x1F
        elif c & 0xF0 == 0xE0:
            size, mask, v = 3, 0xF800, c & 0x0F
        elif c & 0xF8 == 0xF0:
            size, mask, v = 4, 0x1F0000, c & 0x07
        else:  # a continuation byte or 0xF8-0xFF: cannot start a sequence
            s[i] = 0x3F
            i += 1
            continue
        first = i
        if n - i < size:  # too short: the lead alone
            s[i] = 0x3F
            i += 1
            continue
        bad = False
        for _ in range(size - 1):
            i += 1
            if s[i] & 0xC0 != 0x80:
                bad = True
                break
            v = (v << 6) | (s[i] & 0x3F)
        if bad or v & mask == 0 or v > 0x10FFFF or v & 0x1FFF800 == 0xD800:
            s[first : i + 1] = b"?" * (i + 1 - first)
        i += 1
    return s.decode("utf-8")


def partition_value(raw: str) -> str | None:
    """The text a partition directory ``key=raw`` holds: None for ``__HIVE_DEFAULT_PARTITION__``;
    else ``raw`` with each ``%XY`` escape as the byte 0xXY, decoded by :func:`decode_text`.

    >>> partition_value("00501"), partition_value("a%20b"), partition_value("caf%C3%A9"), partition_value("%FF")
    ('00501', 'a b', 'café', '?')
    """
    if raw == HIVE_NULL:
        return None
    data = raw.encode("utf-8", "surrogateescape")
    return decode_text(_ESCAPE.sub(lambda m: bytes([int(m.group(1), 16)]), data))


def plain_partition(raw: str) -> bool:
    """Whether DuckDB and Spark each read the directory value ``raw`` to :func:`partition_value`
    themselves (else it is given to them as a constant)."""
    return raw == HIVE_NULL or (_PLAIN.fullmatch(raw) is not None and _utf8(raw))


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a name that was not UTF-8 on disk (surrogate escapes)
        return False
    return True


def partitions_of(file: str, base: Path) -> tuple[tuple[str, str], ...]:
    """The ``(key, raw value)`` of each ``key=value`` directory between ``base`` and ``file``, in
    path order (other directories are no partition)."""
    dirs = Path(file).parts[len(base.parts) : -1]
    return tuple((k, v) for k, eq, v in (d.partition("=") for d in dirs) if eq and k)


# ---- the layout -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ParquetRead:
    """Files read together: one physical schema, the same partition keys. ``values``: None when
    the engine reads the partition directories' names itself; else the value of each key
    (:func:`partition_value`), the same for every file."""

    files: tuple[str, ...]
    keys: tuple[str, ...]
    values: tuple[str | None, ...] | None


@dataclass(frozen=True)
class ParquetGroup:
    """The files of one physical schema (every column's Parquet type the same)."""

    reads: tuple[ParquetRead, ...]

    @property
    def first(self) -> str:
        """The file whose footer stands for the group's schema."""
        return self.reads[0].files[0]

    @property
    def files(self) -> tuple[str, ...]:
        return tuple(f for r in self.reads for f in r.files)


@dataclass(frozen=True)
class ParquetLayout:
    """Every file of a Parquet source, grouped by physical schema; ``keys``: the partition keys
    (columns after the data columns, in the order first seen)."""

    base: Path
    groups: tuple[ParquetGroup, ...]
    keys: tuple[str, ...]

    @property
    def files(self) -> tuple[str, ...]:
        return tuple(f for g in self.groups for f in g.files)


def _schema_key(path: str) -> tuple[Any, ...]:
    """A file's physical schema, from its footer: every leaf column's path and Parquet types."""
    import pyarrow.parquet as pq

    s = pq.read_metadata(path).schema
    return tuple(
        (c.path, c.physical_type, str(c.logical_type), c.converted_type, c.max_definition_level, c.max_repetition_level)
        for c in (s.column(i) for i in range(len(s)))
    )


def parquet_layout(found: ParquetFiles, name: str) -> ParquetLayout:
    """The files of ``found`` grouped by physical schema (every footer is read; no row is), each
    group split by how its partition directories are read. Refused with InvalidParameterError
    naming ``data`` (shown as ``name``) when a footer cannot be read or a path is not UTF-8."""
    by_schema: dict[tuple[Any, ...], dict[tuple[Any, ...], list[str]]] = {}
    keys: dict[str, None] = {}
    for f in found.files:
        if not _utf8(f):
            raise InvalidParameterError("data", name, "Parquet files whose paths are UTF-8 text")
        try:
            schema = _schema_key(f)
        except Exception:  # pyarrow's ArrowInvalid, OSError: not a readable footer
            raise InvalidParameterError(
                "data", name, "Parquet files whose footers can be read", "a file's footer could not be read"
            ) from None
        parts = partitions_of(f, found.base) if found.hive else ()
        names = tuple(k for k, _ in parts)
        native = (
            len(parts) == len(Path(f).parts) - len(found.base.parts) - 1  # every directory is key=value
            and len(set(names)) == len(names)
            and all("%" not in k and plain_partition(v) for k, v in parts)
        )
        read = (names, None if native else tuple(partition_value(v) for _, v in parts))
        keys.update(dict.fromkeys(read[0]))
        by_schema.setdefault(schema, {}).setdefault(read, []).append(f)
    groups = tuple(
        ParquetGroup(tuple(ParquetRead(tuple(files), k, v) for (k, v), files in reads.items()))
        for reads in by_schema.values()
    )
    return ParquetLayout(found.base, groups, tuple(keys))


def mixed_kind(kinds: Sequence[ColumnKind]) -> ColumnKind:
    """The kind a mixed column reports (:meth:`schema` of an engine): the kind its files share;
    ``string`` when they differ (every scalar value has a text form); ``nested`` only when every
    file holds it nested — so a column is refused as nested only when no file could give a value,
    and one file's type cannot make a declared column undeclarable."""
    scalar = [k for k in kinds if k != "nested"]
    if not scalar:
        return "nested"
    return scalar[0] if len(set(scalar)) == 1 else "string"


def columns_and_types(
    types: Sequence[dict[str, Any]], keys: Sequence[str]
) -> tuple[list[str], dict[str, Any], dict[str, list[Any]]]:
    """The data columns of all groups (first seen first; a partition key's name is the key's),
    the type of each column every group agrees on, and the distinct types of the mixed ones."""
    columns = list(dict.fromkeys(c for t in types for c in t if c not in keys))
    uniform: dict[str, Any] = {}
    mixed: dict[str, list[Any]] = {}
    for c in columns:
        seen: list[Any] = []
        for t in types:
            if c in t and t[c] not in seen:
                seen.append(t[c])
        if len(seen) == 1:
            uniform[c] = seen[0]
        else:
            mixed[c] = seen
    return columns, uniform, mixed


# ---- DuckDB ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DuckDBParquet:
    """A layout as DuckDB reads it: ``sql``, the query of the source's rows; ``types``: each
    group's column types (DuckDB's names, from the group's first footer)."""

    layout: ParquetLayout
    types: tuple[dict[str, str], ...]
    sql: str


def _files_sql(files: Sequence[str]) -> str:
    return "[" + ", ".join(sql_string(f) for f in files) + "]"


def duckdb_parquet(con: Any, layout: ParquetLayout) -> DuckDBParquet:
    """The query reading ``layout`` on the DuckDB connection ``con`` (footers only are read here)."""
    types = []
    for g in layout.groups:
        rel = con.sql(f"SELECT * FROM read_parquet({_files_sql([g.first])}, hive_partitioning = false) LIMIT 0")
        types.append({c: str(t) for c, t in zip(rel.columns, rel.types, strict=True)})
    columns, uniform, mixed = columns_and_types(types, layout.keys)
    parts = []
    for g, t in zip(layout.groups, types, strict=True):
        for r in g.reads:
            items = []
            for c in columns:
                if c in uniform:
                    items.append(q(c) if c in t else f"CAST(NULL AS {uniform[c]}) AS {q(c)}")
                    continue
                fields = ", ".join(
                    f"{q(MIXED_FIELD + str(i))} := " + (q(c) if t.get(c) == ft else f"CAST(NULL AS {ft})")
                    for i, ft in enumerate(mixed[c])
                )
                items.append(f"struct_pack({fields}) AS {q(c)}")
            for k in layout.keys:
                if k in r.keys and r.values is None:
                    items.append(q(k))
                else:
                    v = r.values[r.keys.index(k)] if r.values is not None and k in r.keys else None
                    items.append(f"CAST({'NULL' if v is None else sql_string(v)} AS VARCHAR) AS {q(k)}")
            hive = r.values is None and bool(r.keys)
            options = "hive_partitioning = true, hive_types_autocast = false" if hive else "hive_partitioning = false"
            parts.append(
                f"SELECT {', '.join(items) or '1 AS __dpkit_one'} FROM read_parquet({_files_sql(r.files)}, "
                f"{options}, utf8_validation = 'replace')"
            )
    return DuckDBParquet(layout, tuple(types), " UNION ALL ".join(parts))


def duckdb_read_mixed(
    read_one: Callable[[str, ReadType, ColumnKind, bool, str], str],
    x: str,
    read: ReadType,
    fields: Sequence[tuple[str, str, ColumnKind]],
    strip: bool,
) -> str:
    """The total SQL expression reading the mixed column ``x`` as ``read``: each row's value by its
    own field's type (``fields``: name, DuckDB type, kind), through the engine's rule
    ``read_one`` (``_read``). A unit is read as text (its files' values compare as text); a
    nested field, or a date/binary one read as anything but text, is NULL, as on Spark."""
    want: ReadType = "string" if read == "unit" else read
    null = {"double": "DOUBLE", "integer": "BIGINT", "boolean": "BOOLEAN"}.get(want, "VARCHAR")
    whens = []
    for name, sql_type, kind in fields:
        if kind == "nested" or (kind == "other" and want != "string"):
            continue
        f = f"{x}.{q(name)}"
        whens.append(f"WHEN {f} IS NOT NULL THEN CAST({read_one(f, want, kind, strip, sql_type)} AS {null})")
    return f"(CASE {' '.join(whens)} END)" if whens else f"CAST(NULL AS {null})"


def duckdb_mixed_text(x: str, fields: Sequence[tuple[str, str, ColumnKind]]) -> str:
    """The mixed column ``x`` as stored, as text (NULL when the row's file holds NULL)."""
    return "coalesce(" + ", ".join(f"CAST({x}.{q(name)} AS VARCHAR)" for name, _, _ in fields) + ")"
