"""The CSV reader: one line is one record, on every engine.

A CSV file is read by rules fixed before any row is seen, so that what a line contributes is a
function of that line's bytes and the declared reading options only (DESIGN.md, "Reading is
row-local"). The rules, the same on DuckDB, on Spark, in the curator service's copy, in the
synthesizer and in ``dpkit check``:

* **A line is a record.** Lines end at ``\\n``, ``\\r\\n`` or a lone ``\\r``. A line break inside
  quotes does not continue the record: RFC 4180 allows it, but honouring it lets one stray quote
  swallow every following line (one person's record would change the count by thousands). A
  quoted field broken over lines leaves pieces: the first and the last hold an odd number of
  quotes, so they are malformed and dropped; only a piece wholly inside the field (a record with
  two or more line breaks in one field) can read as a line of its own. The privacy unit of a CSV
  file is therefore a line: a record spanning k ≥ 2 lines adds at most k − 2 rows (none for one
  quoted line break), a line at most one.
* **Fields** are separated by the delimiter (one character, or several: Adult's ``", "``). A field
  that starts with ``"`` is quoted: it runs to the next lone ``"``, ``""`` inside it is one ``"``,
  and only the delimiter may follow it. Any other field is taken as it is, up to the next
  delimiter, and holds no ``"``.
* **Malformed lines are dropped**, each alone: a quoted field that does not close on its line or is
  followed by text, a ``"`` inside an unquoted field, a line that is not valid UTF-8 (or holds U+FFFD, the character invalid bytes
  decode to), a line of :data:`MAX_LINE_BYTES` bytes or more; with a delimiter of several
  characters, a line holding both a ``"`` and U+001F (the character such a delimiter is read as
  inside quoted lines). Blank lines are skipped. With a header, every line equal to the header
  line is the header (not data); with ``skip_rows`` N, the first N lines come before the header
  and every line equal to one of them is skipped too (so that both engines, which read a file in
  parts, skip the same lines). ``dpkit check`` counts what was dropped, for the curator only.
* **Values**: a short line's missing fields are NULL, extra fields are ignored; an unquoted empty
  field, or one equal to a ``null`` text once spaces are trimmed from both ends (the spaces the
  metadata's ``strip_strings`` trims: ``" ?"`` is ``"?"``), is NULL; a quoted field is text, never NULL
  (``""`` is the empty text). Every column is text here; the declared types are applied by the
  engines' total casts.

Lines are split by the engine's own line reader (DuckDB's ``read_csv`` with the line break as the
only delimiter and no quoting; Spark's text source); a line without a ``"`` — nearly every line of
most files — is split with a plain string split, and only lines holding quotes are checked against
the grammar and parsed with a regular expression (RE2 on DuckDB, one match capturing every field;
on Spark, Java's, written with possessive quantifiers so that a long quoted field cannot exhaust
the stack).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dpkit.analytics.engines.base import quote_identifier as q
from dpkit.analytics.engines.base import sql_string
from dpkit.analytics.engines.spark_expressions import _SPACES
from dpkit.errors import InvalidParameterError

__all__ = [
    "MAX_LINE_BYTES",
    "MAX_SKIP_ROWS",
    "CsvFile",
    "CsvOptions",
    "csv_names",
    "csv_skipped_sql",
    "csv_source_sql",
    "csv_unreadable_lines",
    "read_csv_spark",
]

#: Lines of this many bytes or more (without the line break) are dropped, on both engines alike
#: (DuckDB's scanner is given a little more room and the exact rule is a filter).
MAX_LINE_BYTES = 2**21

_LINE_BREAKS = ("\n", "\r")
_REPLACEMENT = "\ufffd"
_BOM = "\ufeff"
#: A delimiter of several characters is read as this one inside lines holding quotes, where the
#: fields are matched by a regular expression (a line holding both is malformed).
_UNIT = "\x1f"
#: At most this many lines before the header (their texts are part of the reading query).
MAX_SKIP_ROWS = 1000


def _is_name_list(value: object) -> bool:
    return isinstance(value, Sequence) and not isinstance(value, (str, bytes))


def _trim(text: str) -> str:
    """``text`` without the spaces DuckDB's ``trim`` removes from its ends (Unicode Zs)."""
    return text.strip(_SPACES)


@dataclass(frozen=True)
class CsvOptions:
    """How a CSV file is read (the options of :meth:`Session.from_csv
    <dpkit.analytics.Session.from_csv>`), checked when made; the defaults are the fixed dialect.

    ``header``: the first line names the columns (True) or is already data (False).
    ``columns``: the columns' names, in order: required with ``header=False``; with a header line
    they replace its names (the line is skipped). ``delimiter``: the text between fields, one
    character or several (``","``, ``";"``, ``"\t"``, ``"|"``, ``", "``). ``null``: texts read as
    NULL besides the empty field (``"NA"``, ``["NA", "?"]``), compared with the field's spaces
    trimmed. ``skip_rows``: how many lines come before the header (or the first data line), e.g.
    a title line. A bad value raises :class:`~dpkit.errors.InvalidParameterError` naming the
    option."""

    header: bool = True
    columns: tuple[str, ...] | None = None
    delimiter: str = ","
    null: tuple[str, ...] = ()
    skip_rows: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.header, bool):
            raise InvalidParameterError("header", self.header, "True (the first line names the columns) or False")
        d = self.delimiter
        if not isinstance(d, str) or not d or any(c in d for c in (*_LINE_BREAKS, '"', "\0", _REPLACEMENT, _UNIT)):
            raise InvalidParameterError(
                "delimiter",
                d,
                "one or more characters, none a double quote, NUL, U+001F or a line break (',', ';', '\\t', '|', ', ')",
            )
        n = self.skip_rows
        if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= MAX_SKIP_ROWS:
            raise InvalidParameterError(
                "skip_rows", n, f"a whole number of lines before the header, from 0 to {MAX_SKIP_ROWS}"
            )
        columns = self.columns
        if columns is not None:
            if not _is_name_list(columns) or not columns:
                raise InvalidParameterError("columns", columns, "a non-empty list of column names, in the file's order")
            names = tuple(columns)
            for name in names:
                if not isinstance(name, str) or not name.strip() or "\0" in name:
                    raise InvalidParameterError(
                        "columns", name, "a list of non-empty column names (text without NUL characters)"
                    )
            if len({n.strip() for n in names}) != len(names):
                raise InvalidParameterError("columns", list(names), "a list of column names without repeats")
            object.__setattr__(self, "columns", tuple(n.strip() for n in names))
        elif not self.header:
            raise InvalidParameterError(
                "columns",
                None,
                "a list of the columns' names when header=False",
                "a file without a header line does not name its columns",
            )
        null = self.null
        texts = (null,) if isinstance(null, str) else null
        if not _is_name_list(texts) or not all(isinstance(t, str) for t in texts):
            raise InvalidParameterError(
                "null", null, "a text or a list of texts read as NULL (e.g. 'NA' or ['NA', '?'])"
            )
        for t in texts:
            if d in t or any(c in t for c in (*_LINE_BREAKS, '"', "\0")):
                raise InvalidParameterError(
                    "null", t, f"a text without the delimiter {d!r}, a double quote, NUL or a line break"
                )
        object.__setattr__(self, "null", tuple(dict.fromkeys(_trim(t) for t in texts)))


@dataclass(frozen=True)
class CsvFile:
    """A CSV file and how to read it: a source of either engine."""

    path: Path
    options: CsvOptions


def _first_lines(path: Path, count: int) -> list[str]:
    """The file's first ``count`` lines as text (the lines skipped and the curator's header; no
    data row is read), without their line breaks (``\n``, ``\r\n`` or a lone ``\r``, as the
    engines split lines) or a leading byte-order mark; fewer when the file has fewer."""
    lines: list[str] = []
    pending = b""
    with path.open("rb") as f:
        while len(lines) < count:
            chunk = f.read(1 << 16)
            pending += chunk
            while len(lines) < count:
                cut = min((i for i in (pending.find(b"\n"), pending.find(b"\r")) if i >= 0), default=-1)
                if cut < 0 or (cut == len(pending) - 1 and pending[cut:] == b"\r" and chunk):
                    break  # no whole line yet (a final \r may be the first half of \r\n)
                lines.append(pending[:cut].decode("utf-8", errors="replace"))
                pending = pending[cut + (2 if pending[cut : cut + 2] == b"\r\n" else 1) :]
            if not chunk:
                if pending and len(lines) < count:
                    lines.append(pending.decode("utf-8", errors="replace"))
                break
            if len(pending) > MAX_LINE_BYTES + 2:
                # A line this long is dropped anyway: hold its start and its last byte (a \r
                # waiting for its \n), so that it still ends where it ends.
                pending = pending[: MAX_LINE_BYTES + 1] + pending[-1:]
    if lines:
        lines[0] = lines[0].removeprefix(_BOM)
    return lines


def _first_line(path: Path, skip_rows: int = 0) -> str:
    """Line ``skip_rows + 1`` of the file (the header), or "" when the file is shorter."""
    lines = _first_lines(path, skip_rows + 1)
    return lines[skip_rows] if len(lines) > skip_rows else ""


def _not_data(path: Path, opts: CsvOptions) -> list[str]:
    """The texts of the lines that are not data: the ``skip_rows`` lines and the header line; every
    line equal to one of them is skipped."""
    lines = _first_lines(path, opts.skip_rows + (1 if opts.header else 0))
    return [line for line in dict.fromkeys(lines) if line]  # a blank line is skipped anyway


def _split_header(line: str, delimiter: str) -> list[str]:
    """The names on a header line, by the same field rules as the data (done in Python: one line)."""
    names: list[str] = []
    i, n = 0, len(line)
    while True:
        if i < n and line[i] == '"':
            j, text = i + 1, []
            while True:
                k = line.find('"', j)
                if k < 0:
                    return []  # an unclosed quote: no names
                text.append(line[j:k])
                if line.startswith('""', k):
                    text.append('"')
                    j = k + 2
                    continue
                i = k + 1
                break
            if i < n and not line.startswith(delimiter, i):
                return []
            names.append("".join(text))
        else:
            k = line.find(delimiter, i)
            k = n if k < 0 else k
            names.append(line[i:k])
            i = k
        if i >= n:
            return [name.strip() for name in names]
        i += len(delimiter)
        if i == n:
            return [*(name.strip() for name in names), ""]


def csv_names(path: str | os.PathLike[str], options: CsvOptions | None = None) -> list[str]:
    """The columns' names: ``options.columns``, else the header line's.

    Raises :class:`~dpkit.errors.InvalidParameterError` (naming only the file) when the header line
    does not name every column once."""
    p = Path(path)
    opts = CsvOptions() if options is None else options
    if opts.columns is not None:
        return list(opts.columns)
    names = _split_header(_first_line(p, opts.skip_rows), opts.delimiter)
    if not names or any(not n for n in names) or len(set(names)) != len(names):
        which = f"line {opts.skip_rows + 1} (after the {opts.skip_rows} skipped)" if opts.skip_rows else "first line"
        accepted = f"a CSV file whose {which} names every column once"
        if opts.delimiter != ",":
            accepted += f", separated by {opts.delimiter!r}"
        raise InvalidParameterError("data", p.name, accepted)
    return names


def _regex_char(c: str) -> str:
    """``c`` as a literal in a regular expression, the same in RE2 and Java."""
    if c == _UNIT:
        return "\\x1f"
    return c if c.isalnum() or ord(c) > 127 or c in " \t" else "\\" + c


def _grammar(delimiter: str) -> tuple[str, str]:
    """(the delimiter as the regular expressions see it, the SQL of line ``l`` as they see it): a
    delimiter of several characters is matched as U+001F (a line holding U+001F and a quote is
    malformed), so that a bare field is simply one without the delimiter's character."""
    if len(delimiter) == 1:
        return delimiter, "l"
    return _UNIT, f"replace(l, {sql_string(delimiter)}, chr(31))"


def _well_formed(delimiter: str) -> str:
    """Whether line ``l`` (holding a quote) is well formed (DuckDB)."""
    d, x = _grammar(delimiter)
    full, _ = _patterns(d, java=False)
    ok = f"regexp_full_match({x}, {sql_string(full)})"
    return ok if d == delimiter else f"({ok} AND NOT contains(l, chr(31)))"


def _field(delimiter: str, *, java: bool) -> str:
    """One field, quoted or bare, as a capturing group of a regular expression."""
    d = _regex_char(delimiter)
    plus, star = ("++", "*+") if java else ("+", "*")  # Java: possessive, so no backtracking stack
    return f'("(?:[^"]{plus}|""){star}"|[^"{d}]{star})'


def _patterns(delimiter: str, *, java: bool) -> tuple[str, str]:
    """(a well-formed line, one field preceded by the delimiter) as regular expressions."""
    d, field = _regex_char(delimiter), _field(delimiter, java=java)
    star = "*+" if java else "*"
    return f"{field}(?:{d}{field}){star}", f"{d}{field}"


def _is_header(not_data: Sequence[str]) -> str:
    """Whether line ``l`` is one of the lines that are not data: the header line and the skipped
    lines (with or without a byte-order mark)."""
    if not not_data:
        return "FALSE"
    return f"l IN ({', '.join(sql_string(p + t) for t in not_data for p in ('', _BOM))})"


def _lines_sql(path: Path) -> str:
    """Every line of the file as ``l`` (DuckDB): the line break is the only delimiter and nothing
    is quoted, so the scanner never joins lines; lines that are not UTF-8 or are too long are
    skipped by the scanner itself (``ignore_errors``)."""
    return (
        f"read_csv({sql_string(str(path))}, columns = {{'l': 'VARCHAR'}}, delim = '\n', quote = '', "
        f"escape = '', header = false, auto_detect = false, null_padding = true, ignore_errors = true, "
        f"strict_mode = false, new_line = '\\n', max_line_size = {MAX_LINE_BYTES + 16})"
    )


def _kept_lines_where(not_data: Sequence[str]) -> str:
    where = ["l IS NOT NULL", "l <> ''", f"NOT contains(l, {sql_string(_REPLACEMENT)})"]
    where.append(f"strlen(l) < {MAX_LINE_BYTES}")
    if not_data:
        where.append(f"NOT {_is_header(not_data)}")
    return " AND ".join(where)


def _captures(delimiter: str, count: int) -> str:
    """A regular expression (RE2) capturing the first ``count`` fields of a well-formed line, each
    in its own group (a field the line lacks captures the empty text): one match per line, where
    extracting every field as a list costs twice as much."""
    d, field = _regex_char(delimiter), _field(delimiter, java=False)
    return "^" + field + "".join(f"(?:{d}{field}" for _ in range(count - 1)) + ")?" * (count - 1)


def _null_or(f: str, null: Sequence[str]) -> str:
    if not null:
        return f"nullif({f}, '')"
    texts = ", ".join(sql_string(t) for t in null)  # trimmed by CsvOptions
    return f"CASE WHEN {f} = '' OR trim({f}) IN ({texts}) THEN NULL ELSE {f} END"


def _value_sql(i: int, null: Sequence[str], delimiter: str) -> str:
    """Column ``i``: from the split list of a line without quotes, else from the captured fields."""
    g = f"__s.g{i}"
    text = f"replace(substr({g}, 2, length({g}) - 2), '\"\"', '\"')"
    if len(delimiter) > 1:  # the delimiter inside a quoted field, matched as U+001F
        text = f"replace({text}, chr(31), {sql_string(delimiter)})"
    quoted = f"CASE WHEN starts_with({g}, '\"') THEN {text} ELSE {_null_or(g, null)} END"
    return f"CASE WHEN __q THEN {quoted} ELSE {_null_or(f'__f[{i + 1}]', null)} END"


def csv_source_sql(path: str | os.PathLike[str], options: CsvOptions | None = None) -> str:
    """The SQL table expression (a subquery) reading a CSV file by the module's rules on DuckDB:
    one line a record, every column as VARCHAR, malformed lines dropped alone. Whoever reads or
    copies a CSV (the session, the curator service, the synthesizer, the check) uses exactly this
    expression. ``options`` (:class:`CsvOptions`) change the delimiter, the texts read as NULL,
    and where the names come from (``columns``, for a file without a header line).

    Raises :class:`~dpkit.errors.InvalidParameterError` (naming only the file) when the header line
    does not name every column once."""
    p = Path(path)
    opts = CsvOptions() if options is None else options
    names = csv_names(p, opts)
    d, x = _grammar(opts.delimiter)
    groups = "[" + ", ".join(f"'g{i}'" for i in range(len(names))) + "]"
    # A line without a quote (nearly all of most files) is split as it is; only a line holding a
    # quote is checked against the grammar and its fields captured, once.
    inner = (
        "SELECT contains(l, '\"') AS __q, "
        f"CASE WHEN NOT contains(l, '\"') THEN string_split(l, {sql_string(opts.delimiter)}) END AS __f, "
        f"CASE WHEN contains(l, '\"') "
        f"THEN regexp_extract({x}, {sql_string(_captures(d, len(names)))}, {groups}) END AS __s "
        f"FROM {_lines_sql(p)} WHERE {_kept_lines_where(_not_data(p, opts))} "
        f"AND (NOT contains(l, '\"') OR {_well_formed(opts.delimiter)})"
    )
    cols = ", ".join(f"{_value_sql(i, opts.null, opts.delimiter)} AS {q(n)}" for i, n in enumerate(names))
    return f"(SELECT {cols} FROM ({inner}))"


def csv_skipped_sql(source: CsvFile) -> str:
    """A query (DuckDB) counting, for the curator's check, the lines the reader kept and those it
    dropped: ``lines`` (non-blank lines read), ``malformed`` (quotes that do not close on the line,
    text after a closing quote), ``invalid_text`` (U+FFFD), ``headers`` (lines equal to the header
    or to a line of ``skip_rows``).
    Lines that are not UTF-8 or too long never reach SQL; :func:`csv_unreadable_lines` counts them."""
    p, opts = source.path, source.options
    is_header = _is_header(_not_data(p, opts))
    return (
        f"SELECT count(*) AS lines, "
        f"count(*) FILTER (WHERE NOT ({is_header}) AND NOT contains(l, {sql_string(_REPLACEMENT)}) "
        f"AND contains(l, '\"') AND NOT {_well_formed(opts.delimiter)}) AS malformed, "
        f"count(*) FILTER (WHERE contains(l, {sql_string(_REPLACEMENT)})) AS invalid_text, "
        f"count(*) FILTER (WHERE {is_header}) AS headers "
        f"FROM {_lines_sql(p)} WHERE l IS NOT NULL AND l <> ''"
    )


def csv_unreadable_lines(source: CsvFile) -> int:
    """The lines DuckDB's line scanner skipped as not UTF-8 or longer than :data:`MAX_LINE_BYTES`
    (curator's check only): its rejects table, read on a connection of its own."""
    import duckdb

    con = duckdb.connect()
    try:
        lines = _lines_sql(source.path).removesuffix(")") + ", store_rejects = true)"
        con.execute(f"SELECT count(*) FROM {lines}").fetchall()
        row = con.execute("SELECT count(DISTINCT line) FROM reject_errors").fetchone()
        return int(row[0]) if row is not None else 0
    finally:
        con.close()


def read_csv_spark(spark: Any, source: CsvFile) -> Any:
    """The CSV file as a Spark DataFrame of text columns, by the same rules as
    :func:`csv_source_sql` (Spark's text source splits lines at ``\\n``, ``\\r\\n`` and ``\\r``, as
    DuckDB's scanner does; the checks DuckDB's scanner makes — UTF-8, the line length — are made
    here as filters)."""
    from pyspark.sql import functions as F

    p, opts = source.path, source.options
    names = csv_names(p, opts)
    not_data = _not_data(p, opts)
    d, multi = opts.delimiter, len(opts.delimiter) > 1
    gd = _UNIT if multi else d  # the delimiter as the regular expressions see it (see _grammar)
    line_re, field_re = _patterns(gd, java=True)
    lines = spark.read.text(str(p))
    l = lines["value"]  # noqa: E741
    # Spark keeps a line's bytes as they are: invalid UTF-8 shows as a re-encoding that differs
    keep = (
        l.isNotNull()
        & (l != F.lit(""))
        & ~l.contains(_REPLACEMENT)
        & (F.octet_length(l) < F.lit(MAX_LINE_BYTES))
        & (F.encode(l, "UTF-8") == l.cast("binary"))
    )
    if not_data:
        keep = keep & ~l.isin(*[b + t for t in not_data for b in ("", _BOM)])
    x = F.replace(l, F.lit(d), F.lit(_UNIT)) if multi else l
    well_formed = x.rlike(f"^{line_re}$") & ~l.contains(_UNIT) if multi else x.rlike(f"^{line_re}$")
    fields = F.when(~l.contains('"'), F.split(l, "".join(_regex_char(c) for c in d), -1)).when(
        well_formed, F.regexp_extract_all(F.concat(F.lit(gd), x), F.lit(field_re), 1)
    )
    split = lines.where(keep).select(fields.alias("__f")).where(F.col("__f").isNotNull())
    cols = []
    for i, name in enumerate(names):
        f = F.try_element_at(F.col("__f"), F.lit(i + 1))
        quoted = F.regexp_replace(f.substr(F.lit(2), F.length(f) - F.lit(2)), '""', '"')
        if multi:
            quoted = F.replace(quoted, F.lit(_UNIT), F.lit(d))
        null = f == F.lit("")
        if opts.null:
            null = null | F.btrim(f, F.lit(_SPACES)).isin(*opts.null)
        cols.append(F.when(f.startswith('"'), quoted).when(null, F.lit(None)).otherwise(f).alias(name))
    return split.select(*cols)
