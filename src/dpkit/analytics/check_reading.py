"""What the reader repaired, for the curator's data check (:func:`~dpkit.analytics.check.check_data`).

A source is read row by row by the declared schema (docs/guide/reading.md): Parquet files whose
physical type differs from the declaration are cast value by value, partition directories are
text cast by the declared type, text that is not UTF-8 is repaired. None of that fails a query,
so none of it shows in an answer — :func:`reading_check` tells the curator, who can fix the
source. Curator only: it names files and directory values and counts rows exactly.

The files' types and partition directories come from the source's layout (footers and names,
no row); the text that is not UTF-8 is counted on the files' own bytes (read by pyarrow as
binary, checked by DuckDB's ``try(decode(…))``), since both engines only ever see it repaired.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dpkit.analytics.check_report import FileTypeCheck, Issue, PartitionCheck, ReadingCheck
from dpkit.analytics.engines.base import ReadType
from dpkit.analytics.engines.base import quote_identifier as q
from dpkit.analytics.engines.parquet_source import DuckDBParquet, ParquetGroup, partition_value, partitions_of
from dpkit.analytics.metadata import Categorical, Numeric

__all__ = ["csv_reading_check", "reading_check"]

_INTEGER = ("TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT", "UTINYINT", "USMALLINT", "UINTEGER", "UBIGINT")


def _fits(read: ReadType, sql_type: str) -> bool:
    """Whether a file's physical type is the declared one (its values need no cast that can fail)."""
    from dpkit.analytics.engines.duckdb import _kind

    kind = _kind(sql_type)
    if read == "unit":
        return kind != "nested"
    if read == "integer":
        return sql_type.upper() in _INTEGER
    return kind == {"double": "numeric", "string": "string", "boolean": "boolean"}[read]


def reading_check(
    engine: Any, specs: Mapping[str, Numeric | Categorical | None], types: Mapping[str, ReadType], strip: bool
) -> ReadingCheck | None:
    """The reading report of the source ``engine`` reads (a DuckDB engine), for the declared
    columns ``types`` (their specs in ``specs``); None for a source that is not Parquet files."""
    csv = getattr(engine, "csv", None)
    if csv is not None:
        return csv_reading_check(csv)
    parquet: DuckDBParquet | None = getattr(engine, "parquet", None)
    if parquet is None:
        return None
    layout = parquet.layout
    base = layout.base

    def shown(file: str) -> str:
        return Path(file).relative_to(base).as_posix() if Path(file).is_relative_to(base) else Path(file).name

    file_types = []
    for col, read in types.items():
        if col in layout.keys:
            continue
        seen: dict[str, list[str]] = {}
        for g, t in zip(layout.groups, parquet.types, strict=True):
            st = t.get(col)
            if st is None or not _fits(read, st):
                seen.setdefault("missing" if st is None else st, []).extend(g.files)
        file_types += [FileTypeCheck(col, st, len(fs), shown(fs[0])) for st, fs in seen.items()]
    import duckdb

    con = duckdb.connect()  # of its own: the engine's connection may hold a query's unfinished result
    try:
        return ReadingCheck(
            files=len(layout.files),
            file_types=tuple(file_types),
            partitions=_partitions(con, layout.files, base, specs, types, strip),
            invalid_text=tuple(
                _invalid_text(con, layout.groups, parquet.types, [c for c in types if c not in layout.keys])
            ),
        )
    finally:
        con.close()


def _partitions(
    con: Any,
    files: tuple[str, ...],
    base: Path,
    specs: Mapping[str, Numeric | Categorical | None],
    types: Mapping[str, ReadType],
    strip: bool,
) -> tuple[PartitionCheck, ...]:
    """The partition directories of declared columns that do not conform or are not UTF-8 text:
    every distinct directory value read by the engine's own rule (``_read``)."""
    from dpkit.analytics.engines.duckdb import _Params, _read

    dirs: dict[tuple[str, str], int] = {}
    for f in files:
        for key, raw in partitions_of(f, base):
            if key in types:
                dirs[(key, raw)] = dirs.get((key, raw), 0) + 1
    if not dirs:
        return ()
    out = []
    for (key, raw), n in dirs.items():
        value = partition_value(raw)
        repaired = value is not None and value.encode("utf-8") != _unescaped(raw)
        issue: Issue | None = None
        if value is not None:
            params = _Params()
            typed = _read("v", types[key], "string", strip, "VARCHAR")
            spec = specs[key]
            listed = "NULL"
            if isinstance(spec, Categorical) and spec.categories is not None:
                listed = f"{typed} IN ({', '.join(params.add(c) for c in spec.categories)})"
            sql = f"SELECT {typed} IS NULL, {listed} FROM (SELECT {params.add(value)}::VARCHAR AS v)"
            null, inside = con.execute(sql, params.values).fetchall()[0]
            issue = "unreadable" if null else "outside_categories" if inside is False else None
        if issue is not None or repaired:
            out.append(PartitionCheck(key, f"{key}={raw}", value, n, issue, repaired))
    return tuple(out)


def _unescaped(raw: str) -> bytes:
    """A directory value's bytes, its ``%XY`` escapes decoded (before the text is repaired)."""
    import re

    data = raw.encode("utf-8", "surrogateescape")
    return re.sub(rb"%([0-9A-Fa-f]{2})", lambda m: bytes([int(m.group(1), 16)]), data)


def _invalid_text(
    con: Any, groups: tuple[ParquetGroup, ...], types: tuple[dict[str, str], ...], declared: list[str]
) -> list[tuple[str, int]]:
    """Per declared text column, the values that are not valid UTF-8, in the files' own bytes."""
    import pyarrow as pa
    import pyarrow.dataset as ds
    import pyarrow.parquet as pq

    binary = {pa.string(): pa.binary(), pa.large_string(): pa.large_binary()}
    counts: dict[str, int] = {}
    for g, t in zip(groups, types, strict=True):
        cols = [c for c in declared if t.get(c) == "VARCHAR"]
        schema = pq.read_schema(g.first)
        fields = [(c, binary.get(schema.field(c).type, pa.binary())) for c in cols if c in schema.names]
        if not fields:
            continue
        data = ds.dataset(list(g.files), format="parquet", schema=pa.schema(fields))
        con.register("__dpkit_text", data)
        items = [f"count(*) FILTER (WHERE {q(c)} IS NOT NULL AND try(decode({q(c)})) IS NULL)" for c, _ in fields]
        row = con.execute(f"SELECT {', '.join(items)} FROM __dpkit_text").fetchall()[0]
        con.unregister("__dpkit_text")
        for (c, _), n in zip(fields, row, strict=True):
            counts[c] = counts.get(c, 0) + int(n)
    return list(counts.items())


def csv_reading_check(source: Any) -> ReadingCheck:
    """The lines of a CSV file (a :class:`~dpkit.analytics.engines.csv_source.CsvFile`) the reader
    dropped, by reason (engines.csv_source): for the check of a CSV source, and of the service's
    copy of one (whose table no longer shows what was dropped)."""
    import duckdb

    from dpkit.analytics.engines.csv_source import csv_skipped_sql, csv_unreadable_lines

    with duckdb.connect() as con:
        row = con.execute(csv_skipped_sql(source)).fetchone()
    lines, malformed, replacement, headers = row if row is not None else (0, 0, 0, 0)
    unreadable = csv_unreadable_lines(source)
    detail = (
        ("a quote that does not close on its line, or a misplaced quote", int(malformed)),
        ("not UTF-8, or 2 MiB or longer", unreadable),
        ("holding U+FFFD (the character invalid bytes decode to)", int(replacement)),
    )
    return ReadingCheck(
        files=1,
        skipped_records=sum(n for _, n in detail),
        skipped_detail=tuple((why, n) for why, n in detail if n),
        csv_lines=int(lines) - int(headers) + unreadable,
    )
