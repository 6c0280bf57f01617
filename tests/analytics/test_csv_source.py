"""The CSV reader is row-local: one hostile line changes the rows read by at most itself.

For each hostile record h and a base file D, the rows read from D with h inserted mid-file are the
rows read from D plus at most one row per line of h, and none for a record whose only line breaks
are quoted (as multisets): no other line's record moves, fails or is re-typed.
The same property fails for the quote-honouring reader dpkit used before (DuckDB's read_csv with
quotes, padding and skipped errors), which is the power check. Deterministic: no noise, no
false-failure rate. DuckDB and Spark read every corpus file to the same rows (Spark tests are
marked by their ``spark`` fixture).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import duckdb
import pytest

from dpkit.analytics.engines.base import sql_string
from dpkit.analytics.engines.csv_source import (
    MAX_LINE_BYTES,
    CsvFile,
    CsvOptions,
    csv_names,
    csv_skipped_sql,
    csv_source_sql,
    csv_unreadable_lines,
    read_csv_spark,
)
from dpkit.errors import InvalidParameterError

HEADER = b"age,city,note\n"
BASE = [f"{20 + i % 50},{'AB'[i % 2]},n{i}\n".encode() for i in range(200)]

#: One person's line each, as hostile as a CSV line can be.
HOSTILE = {
    "quoted_newline": b'33,A,"two\nlines"\n',
    "quoted_newline_crafted": b'33,A,"x\n99,B,forged\ny"\n',  # the middle piece is a line of its own
    "stray_quote": b'33,A,"oops\n',
    "text_after_quote": b'33,A,"x"y\n',
    "invalid_utf8": b"33,\xff\xfe,x\n",
    "replacement_char": "33,\ufffd,x\n".encode(),
    "lone_cr": b"33,A\rB,x\n",
    "nul": b"33,A\x00,x\n",
    "huge_field": b"33,A," + b"x" * (10 * 2**20) + b"\n",
    "at_the_limit": b"33,A," + b"x" * (MAX_LINE_BYTES - 5) + b"\n",
    "quoted_delimiters": b'"33","A,B","say ""hi"""\n',
    "short": b"33\n",
    "long": b"33,A,x,extra,more\n",
    "header_again": HEADER,
    "bom_and_header": b"\xef\xbb\xbf" + HEADER,
    "blank": b"\n",
    "crlf": b"33,A,x\r\n",
    "unicode_spaces": "\u00a033\u2003,A,x\n".encode(),
    "big_number": b"1e308,A,x\n",
}


def write(tmp_path: Path, name: str, hostile: bytes | None = None) -> Path:
    lines = [HEADER, *BASE]
    if hostile is not None:
        lines.insert(101, hostile)
    path = tmp_path / f"{name}.csv"
    path.write_bytes(b"".join(lines))
    return path


def rows(path: Path, options: CsvOptions | None = None) -> Counter[tuple[object, ...]]:
    with duckdb.connect() as con:
        return Counter(con.sql(f"SELECT * FROM {csv_source_sql(path, options)}").fetchall())


def old_rows(path: Path) -> Counter[tuple[object, ...]]:
    """The previous reader: DuckDB's scanner honouring quotes (a quoted line break continues the
    record), padding short rows and skipping unparsable ones."""
    columns = "{'age': 'VARCHAR', 'city': 'VARCHAR', 'note': 'VARCHAR'}"
    sql = (
        f"SELECT * FROM read_csv({sql_string(str(path))}, header = true, auto_detect = false, columns = {columns}, "
        "delim = ',', quote = '\"', escape = '\"', null_padding = true, ignore_errors = true, strict_mode = false)"
    )
    with duckdb.connect() as con:
        return Counter(con.sql(sql).fetchall())


def added_at_most(before: Counter[tuple[object, ...]], after: Counter[tuple[object, ...]], most: int = 1) -> bool:
    return not (before - after) and sum((after - before).values()) <= most


#: What each hostile record may add: its line count less the two malformed ends of a quoted
#: field broken over lines; a lone CR ends a line (two lines, two rows).
MOST = {"quoted_newline": 0, "quoted_newline_crafted": 1, "lone_cr": 2}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_one_hostile_line_adds_at_most_its_own_row(tmp_path: Path, case: str) -> None:
    before = rows(write(tmp_path, "d"))
    assert sum(before.values()) == len(BASE)
    after = rows(write(tmp_path, "d_plus", HOSTILE[case]))
    assert added_at_most(before, after, MOST.get(case, 1)), (before - after, after - before)


@pytest.mark.parametrize("case", ["quoted_newline", "stray_quote"])
def test_the_quote_honouring_reader_fails_the_same_property(tmp_path: Path, case: str) -> None:
    before = old_rows(write(tmp_path, "d"))
    try:
        after = old_rows(write(tmp_path, "d_plus", HOSTILE[case]))
    except duckdb.Error:
        return  # failing on one person's line is the worst outcome of all
    assert not added_at_most(before, after)


def test_what_each_line_reads_as(tmp_path: Path) -> None:
    path = tmp_path / "rules.csv"
    path.write_bytes(
        b"a,b\n"
        b"1,x\n"  # plain
        b'2,"x, y"\n'  # a quoted delimiter
        b'3,"say ""hi"""\n'  # doubled quotes
        b'4,""\n'  # a quoted empty field is the empty text
        b"5,\n"  # an unquoted empty field is NULL
        b"6\n"  # a short line: NULL
        b"7,x,extra\n"  # extra fields are ignored
        b'8,ab"c\n'  # a quote inside an unquoted field: dropped
        b'9,"open\n'  # an unclosed quote: dropped
        b'10,"x"y\n'  # text after the closing quote: dropped
        b"11,A\rB\n"  # a lone CR ends a line: "11,A" and "B"
        b"\n"  # blank: skipped
        b"a,b\n"  # the header line again: not data
        b"12,\xff\n"  # not UTF-8: dropped
        b"13,NA\n"
    )
    got = sorted(rows(path, CsvOptions(null=("NA",))).elements(), key=str)
    assert got == sorted(
        [
            ("1", "x"),
            ("2", "x, y"),
            ("3", 'say "hi"'),
            ("4", ""),
            ("5", None),
            ("6", None),
            ("7", "x"),
            ("11", "A"),
            ("B", None),
            ("13", None),
        ],
        key=str,
    )


def test_the_check_counts_what_was_dropped(tmp_path: Path) -> None:
    path = write(tmp_path, "d_plus", HOSTILE["stray_quote"] + HOSTILE["invalid_utf8"] + HOSTILE["huge_field"])
    source = CsvFile(path, CsvOptions())
    with duckdb.connect() as con:
        lines, malformed, invalid, headers = con.execute(csv_skipped_sql(source)).fetchone()  # type: ignore[misc]
    assert (lines, malformed, invalid, headers) == (len(BASE) + 2, 1, 0, 1)
    assert csv_unreadable_lines(source) == 2  # not UTF-8, and the 10 MB line


def test_header_names_follow_the_field_rules(tmp_path: Path) -> None:
    path = tmp_path / "h.csv"
    path.write_bytes(b'\xef\xbb\xbf"a,1", b ,"c ""q"""\r\n1,2,3\n')
    assert csv_names(path) == ["a,1", "b", 'c "q"']
    bad = tmp_path / "bad.csv"
    for header in (b'a,"b\n', b"a,,c\n", b"a,a\n", b"\n"):
        bad.write_bytes(header + b"1,2\n")
        with pytest.raises(InvalidParameterError, match="names every column once"):
            csv_names(bad)


def test_spark_reads_the_same_rows(tmp_path: Path, spark) -> None:  # type: ignore[no-untyped-def]
    hostile = b"".join(v for k, v in sorted(HOSTILE.items()) if k != "huge_field") + HOSTILE["huge_field"]
    for options in (CsvOptions(), CsvOptions(null=("NA", "n7")), CsvOptions(header=False, columns=("x", "y", "z"))):
        path = write(tmp_path, "all", hostile)
        on_spark = Counter(tuple(r) for r in read_csv_spark(spark, CsvFile(path, options)).collect())
        assert on_spark == rows(path, options)
    tabs = tmp_path / "tabs.tsv"
    tabs.write_bytes(b'a\tb\n1\t"x\ty"\n2\t"open\n3\tz|w\n')
    options = CsvOptions(delimiter="\t")
    assert Counter(tuple(r) for r in read_csv_spark(spark, CsvFile(tabs, options)).collect()) == rows(tabs, options)
    assert rows(tabs, options) == Counter({("1", "x\ty"): 1, ("3", "z|w"): 1})


@pytest.fixture(scope="module")
def spark():  # type: ignore[no-untyped-def]
    pytest.importorskip("pyspark")
    from dpkit.analytics.engines.spark import spark_session

    return spark_session()  # the process-wide session, left running for later modules


def test_dpkit_check_reports_the_dropped_lines(tmp_path: Path) -> None:
    from dpkit.analytics import Categorical, Metadata, Numeric
    from dpkit.analytics.check import check_data

    path = write(tmp_path, "d_plus", HOSTILE["stray_quote"] + HOSTILE["invalid_utf8"] + HOSTILE["replacement_char"])
    meta = Metadata(columns={"age": Numeric(0, 100), "city": Categorical(("A", "B"))}, row_level=True)
    reading = check_data(path, meta).reading
    assert reading is not None and reading.skipped_records == 3 and reading.csv_lines == len(BASE) + 3
    assert dict(reading.skipped_detail) == {
        "a quote that does not close on its line, or a misplaced quote": 1,
        "not UTF-8, or 2 MiB or longer": 1,
        "holding U+FFFD (the character invalid bytes decode to)": 1,
    }
    clean = check_data(write(tmp_path, "d"), meta).reading
    assert clean is not None and clean.skipped_records == 0 and not clean.repaired
