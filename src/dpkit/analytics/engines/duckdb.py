"""The DuckDB engine: embedded, columnar, the default.

The whole bounded aggregation is one SQL statement with quoted identifiers and bound parameters.
Contribution bounding uses a single window over the privacy unit: rows are ordered by a keyed
group priority (then the group key, which breaks any hash tie) and a keyed row priority, so
``dense_rank`` numbers a unit's groups and ``row_number − rank + 1`` numbers its rows within a
group — one sort instead of the two a textbook ``row_number() OVER (PARTITION BY unit, group)``
followed by a per-unit window needs (2× faster and 3.5× less memory on 10,000,000 rows; see
BENCHMARKS.md).
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from dpkit.analytics.engines import bins
from dpkit.analytics.engines.base import EXACT_INTEGER_LIMIT, ROW_SALT_MASK, SUM_LIMIT, ColumnKind, ReadType, sql_string
from dpkit.analytics.engines.base import quote_identifier as q
from dpkit.analytics.engines.csv_source import CsvFile, CsvOptions, csv_source_sql
from dpkit.analytics.engines.duckdb_joins import Relation, join_sql
from dpkit.analytics.engines.duckdb_settings import (
    MIN_MEMORY_PER_THREAD,
    checked_memory_limit,
    checked_temp_directory,
    memory_bytes,
)
from dpkit.analytics.engines.pandas_source import pandas_kind, text_column
from dpkit.analytics.engines.parquet_source import (
    MIXED_FIELD,
    duckdb_parquet,
    duckdb_read_mixed,
    mixed_kind,
    parquet_files,
    parquet_layout,
)
from dpkit.analytics.plan import (
    AggregationPlan,
    And,
    Between,
    Compare,
    GroupKey,
    InList,
    IsNull,
    Not,
    Or,
    Predicate,
    SumSpec,
    ValueSpec,
)
from dpkit.errors import InvalidParameterError

__all__ = ["DuckDBEngine"]

_counter = itertools.count()
_INTEGER_TYPES = (
    "TINYINT",
    "SMALLINT",
    "INTEGER",
    "BIGINT",
    "HUGEINT",
    "UTINYINT",
    "USMALLINT",
    "UINTEGER",
    "UBIGINT",
    "UHUGEINT",
)
_FLOAT_TYPES = ("FLOAT", "DOUBLE", "REAL")


class _Params:
    """Collects bound parameters; ``add`` returns the placeholder."""

    def __init__(self) -> None:
        self.values: list[Any] = []

    def add(self, value: Any) -> str:
        self.values.append(value)
        return f"${len(self.values)}"


def _kind(type_name: str) -> ColumnKind:
    t = type_name.upper()
    if t.endswith("]") or t.startswith(("STRUCT", "MAP", "UNION", "LIST")):
        return "nested"
    if t == "BOOLEAN":
        return "boolean"
    if t.startswith((*_INTEGER_TYPES, *_FLOAT_TYPES, "DECIMAL")):
        return "numeric"
    if t in ("VARCHAR", "STRING", "TEXT") or t.startswith("VARCHAR") or t.startswith("ENUM"):
        return "string"
    return "other"


def _number_text(x: str, sql_type: str) -> str:
    """A number's canonical text, whatever its physical type: an integral value within ±2**53 as
    an integer (``1``, and ``0`` for −0.0, whether the column is BIGINT, DOUBLE or DECIMAL), any
    other finite value as the engine writes it; NaN and ±inf are NULL. So a pandas column that turns
    float64 when one row holds NaN still reads ``"1"``, not ``"1.0"``."""
    if sql_type in _INTEGER_TYPES:
        return f"CAST({x} AS VARCHAR)"
    finite = f"isfinite({x})" if sql_type in _FLOAT_TYPES else "TRUE"
    return (
        f"CASE WHEN {finite} AND abs({x}) <= {EXACT_INTEGER_LIMIT} AND {x} = round({x}) "
        f"THEN CAST(CAST({x} AS BIGINT) AS VARCHAR) WHEN {finite} THEN CAST({x} AS VARCHAR) END"
    )


def _read(x: str, read: ReadType, kind: ColumnKind, strip: bool, sql_type: str = "") -> str:
    """The total SQL expression reading the physical column ``x`` as its declared type.

    ``sql_type`` (the physical type's name, when known) selects a cheaper expression with the same
    values (integers and floats need no text parsing) and the canonical forms of floats: −0.0 is
    0.0 and NaN is NULL, so that hashing and grouping see one value each."""
    if read == "unit" and kind in ("numeric", "boolean"):
        if sql_type in _FLOAT_TYPES:
            return f"CASE WHEN {x} = 0 THEN CAST(0 AS {sql_type}) WHEN NOT isnan({x}) THEN {x} END"
        return x  # compared and hashed only: kept native (sorting 10^7 integers, not their text)
    if read == "double" and sql_type in _INTEGER_TYPES:
        return f"CAST({x} AS DOUBLE)"
    if read == "double" and sql_type in _FLOAT_TYPES:
        return f"CASE WHEN {x} = 0 THEN 0.0 WHEN isfinite({x}) THEN CAST({x} AS DOUBLE) END"
    if read == "integer" and sql_type in _INTEGER_TYPES:
        return f"CASE WHEN {x} BETWEEN {-EXACT_INTEGER_LIMIT} AND {EXACT_INTEGER_LIMIT} THEN CAST({x} AS BIGINT) END"
    if kind != "string":
        if read in ("string", "unit"):
            return _number_text(x, sql_type) if kind == "numeric" else f"CAST({x} AS VARCHAR)"
        cast_from = x  # numbers and booleans cast directly, not through their text
    else:
        text = f"trim({x})" if strip else x
        if read in ("string", "unit"):
            return text
        cast_from = text
    if read == "boolean":
        return f"TRY_CAST({cast_from} AS BOOLEAN)"
    if kind == "string" and strip:
        # = TRY_CAST(trim(x) AS DOUBLE): the cast already skips plain surrounding spaces, and a
        # text it parses untrimmed parses to the same number trimmed; trim only where it fails
        # (NBSP and other Unicode spaces). A fifth cheaper on text-heavy CSVs.
        d = f"coalesce(TRY_CAST({x} AS DOUBLE), TRY_CAST({cast_from} AS DOUBLE))"
    else:
        d = f"TRY_CAST({cast_from} AS DOUBLE)"
    if read == "double":
        return f"CASE WHEN {d} = 0 THEN 0.0 WHEN isfinite({d}) THEN {d} END"
    # integer: an exact double with an integral value (3.5 and 1e300 are not integers)
    return f"CASE WHEN isfinite({d}) AND abs({d}) <= {EXACT_INTEGER_LIMIT} AND {d} = round({d}) THEN CAST({d} AS BIGINT) END"


class DuckDBEngine:
    """Runs aggregation plans on a DuckDB table, view, pandas DataFrame, CSV or Parquet file.

    A CSV file is read with a fixed dialect (comma-separated, double quotes, a header line) and
    every column as text; a row with missing fields is padded with NULLs, extra fields are
    dropped, and a line that cannot be parsed at all is skipped — all rules written down before
    any row is read, so no row can make the read fail or change a column's type. The declared
    types are applied by :meth:`bind`.
    """

    name = "duckdb"

    def __init__(
        self,
        source: Any,
        *,
        connection: Any = None,
        table: str | None = None,
        memory_limit: str | None = None,
        temp_directory: str | os.PathLike[str] | None = None,
    ) -> None:
        import duckdb

        limit, spill = checked_memory_limit(memory_limit), checked_temp_directory(temp_directory)
        if connection is None and table is None and isinstance(source, duckdb.DuckDBPyRelation):
            for name, value in (("memory_limit", memory_limit), ("temp_directory", temp_directory)):
                if value is not None:
                    raise InvalidParameterError(
                        name,
                        value if isinstance(value, str) else os.fspath(value),
                        "None with a DuckDB relation",
                        "a relation runs on DuckDB's default connection, whose settings are yours: SET it there",
                    )
        self._con = connection if connection is not None else duckdb.connect()
        self._set_out_of_core(limit, spill)
        self._view = f"__dpkit_t{os.getpid()}_{next(_counter)}"
        self._frame: pd.DataFrame | None = None
        self._sql_types: dict[str, str] = {}
        #: Mixed columns (a Parquet column whose files disagree on its type): each file type's
        #: field, its type and kind (parquet_source).
        self._mixed: dict[str, tuple[tuple[str, str, ColumnKind], ...]] = {}
        #: A Parquet source as read (its files' layout and the query), else None.
        self.parquet: Any = None
        #: A CSV source as read (its path and options), else None.
        self.csv: CsvFile | None = None
        self._bound: tuple[Any, bool] | None = None
        if table is not None:  # an existing table or view of ``connection``
            self._raw = q(table)
        elif isinstance(source, pd.DataFrame):
            self._frame = source
            self._raw = q(self._view)
        elif isinstance(source, (str, os.PathLike, CsvFile)):
            csv_file = source if isinstance(source, CsvFile) else None
            path = csv_file.path if csv_file is not None else Path(source)  # type: ignore[arg-type]
            parquet = None if csv_file is not None else parquet_files(path)
            if parquet is None and not path.is_file():
                raise InvalidParameterError(
                    "data", path.name, "an existing CSV or Parquet file, a directory of Parquet files or a glob"
                )
            if parquet is not None:
                # every footer is read (no row is): files are grouped by physical schema, each
                # read by its own types, partition directories as text (parquet_source)
                layout = parquet_layout(parquet, path.name)
                try:
                    self.parquet = duckdb_parquet(self._con, layout)
                    self._con.execute(f"CREATE VIEW {q(self._view)} AS {self.parquet.sql}")
                except duckdb.Error:
                    raise InvalidParameterError("data", path.name, "readable Parquet files") from None
            else:
                self.csv = csv_file if csv_file is not None else CsvFile(path, CsvOptions())
                self._con.execute(
                    f"CREATE VIEW {q(self._view)} AS SELECT * FROM {csv_source_sql(path, self.csv.options)}"
                )
            self._raw = q(self._view)
        elif isinstance(source, duckdb.DuckDBPyRelation):
            self._con = duckdb.default_connection() if connection is None else connection
            try:
                source.create_view(self._view)
                self._con.execute(f"SELECT * FROM {q(self._view)} LIMIT 0")
            except duckdb.Error:
                raise InvalidParameterError(
                    "data",
                    "a DuckDB relation",
                    "a relation of the default connection (duckdb.sql(...)), or Session.from_duckdb(connection, table)",
                ) from None
            self._raw = q(self._view)
        else:
            raise InvalidParameterError(
                "data", type(source).__name__, "a pandas DataFrame, a CSV or Parquet path, or a DuckDB relation"
            )
        if self._frame is not None:  # a pandas frame is registered at bind, from its dtypes until then
            self._kinds = {str(c): pandas_kind(t) for c, t in self._frame.dtypes.items()}
        else:
            self._read_sql_types()
            self._kinds = {name: _kind(t) for name, t in self._sql_types.items()}
            self._kinds.update({c: mixed_kind([k for _, _, k in f]) for c, f in self._mixed.items()})
        self._from = self._raw
        #: The dataset's tables a join may read (name -> engine on this connection), set by attach.
        self._tables: dict[str, DuckDBEngine] = {}

    def attach(self, tables: Mapping[str, DuckDBEngine]) -> None:
        """The tables of this engine's dataset, bound and on this engine's connection: a plan with
        a ``join`` reads them by name."""
        if any(e._con is not self._con for e in tables.values()):
            raise InvalidParameterError("tables", sorted(tables), "engines on one DuckDB connection")
        self._tables = dict(tables)

    def relation(self) -> Relation:
        """This table as a join reads it (its typed view, once bound)."""
        return Relation(
            self._from,
            dict(self._sql_types),
            lambda c, x: _read(x, "string", self._kinds[c], False, self._sql_types.get(c, "")),
        )

    def distinct_rows(self, columns: tuple[str, ...]) -> tuple[tuple[Any, ...], ...]:
        """The distinct rows of a *public* table over declared ``columns``, sorted (its values are
        public: a public key table's keys)."""
        cols = ", ".join(q(c) for c in columns)
        return tuple(
            self._con.execute(f"SELECT DISTINCT {cols} FROM {self._from} ORDER BY {cols} NULLS LAST").fetchall()
        )

    def _set_out_of_core(self, limit: str | None, spill: Path | None) -> None:
        """Out of core: past ``limit``, DuckDB spills the bounding's window sort and the group-by
        into ``spill`` (DuckDB's default: ``.tmp`` in the working directory). Both are settings of
        this engine's connection, checked here before any row is read."""
        import duckdb

        if limit is not None:
            row = self._con.execute("SELECT current_setting('threads')").fetchone()
            threads = max(int(row[0]) if row is not None else 1, 1)
            least = MIN_MEMORY_PER_THREAD * threads
            if memory_bytes(limit) < least:
                raise InvalidParameterError(
                    "memory_limit",
                    limit,
                    f"at least {least // 2**20}MiB: {MIN_MEMORY_PER_THREAD // 2**20}MiB for each of DuckDB's {threads} threads",
                    "with less, DuckDB runs out of memory while bounding, and a query that runs out fails after it is paid for",
                )
            try:
                self._con.execute(f"SET memory_limit = {sql_string(limit)}")
            except duckdb.Error:
                raise InvalidParameterError("memory_limit", limit, "a size DuckDB accepts, such as '4GB'") from None
        if spill is not None:
            try:
                self._con.execute(f"SET temp_directory = {sql_string(str(spill))}")
            except duckdb.Error:
                raise InvalidParameterError("temp_directory", str(spill), "a directory DuckDB can spill to") from None

    def _read_sql_types(self) -> None:
        """The physical SQL type of every column of ``_raw`` (from the schema; no row is read)."""
        rel = self._con.sql(f"SELECT * FROM {self._raw} LIMIT 0")
        self._sql_types = {name: str(t).upper() for name, t in zip(rel.columns, rel.types, strict=True)}
        self._mixed = {}
        for name, t in zip(rel.columns, rel.types, strict=True):
            fields = t.children if t.id == "struct" else []
            if fields and all(f.startswith(MIXED_FIELD) for f, _ in fields):
                self._mixed[name] = tuple((f, str(ft).upper(), _kind(str(ft))) for f, ft in fields)

    def _read_column(self, c: str, t: ReadType, strip: bool) -> str:
        """The total expression reading column ``c`` as ``t`` (a mixed column field by field)."""
        if c in self._mixed:
            return duckdb_read_mixed(_read, q(c), t, self._mixed[c], strip)
        return _read(q(c), t, self._kinds[c], strip, self._sql_types.get(c, ""))

    # -- schema -----------------------------------------------------------------------------------

    def schema(self) -> dict[str, ColumnKind]:
        return dict(self._kinds)

    def bind(self, types: Mapping[str, ReadType], *, strip_strings: bool) -> None:
        if self._frame is not None:
            # Object columns hold arbitrary Python values: turn them into text here so that
            # DuckDB's scan never infers a per-row type (a list in one row would otherwise make
            # the column nested, or the scan fail).
            # (a new frame of the same column objects: pandas copies nothing it does not convert)
            columns = {c: self._frame[c] for c in types} or {"__dpkit_one": pd.Series(1, index=self._frame.index)}
            for c, col in columns.items():
                if self._kinds.get(c) == "string":
                    columns[c] = text_column(col)
            self._con.register(self._view, pd.DataFrame(columns, copy=False))
            self._frame = None
            self._read_sql_types()
        signature = (tuple(types.items()), strip_strings)
        if signature == self._bound:
            return  # the typed view of these exact declarations exists (an engine reused by the service)
        items = [f"{self._read_column(c, t, strip_strings)} AS {q(c)}" for c, t in types.items()]
        typed = f"{self._view}_typed"
        self._con.execute(
            f"CREATE OR REPLACE TEMP VIEW {q(typed)} AS SELECT {', '.join(items) or '1 AS __one'} FROM {self._raw}"
        )
        self._from = q(typed)
        self._bound = signature

    # -- SQL generation ---------------------------------------------------------------------------

    def _predicate(self, p: Predicate, params: _Params) -> str:
        if isinstance(p, Compare):
            return f"({q(p.column)} {'<>' if p.op == '!=' else p.op} {params.add(p.value)})"
        if isinstance(p, InList):
            items = ", ".join(params.add(x) for x in p.values)
            return f"({q(p.column)} {'NOT IN' if p.negated else 'IN'} ({items}))"
        if isinstance(p, Between):
            return f"({q(p.column)} {'NOT BETWEEN' if p.negated else 'BETWEEN'} {params.add(p.low)} AND {params.add(p.high)})"
        if isinstance(p, IsNull):
            return f"({q(p.column)} IS {'NOT NULL' if p.negated else 'NULL'})"
        if isinstance(p, And):
            return "(" + " AND ".join(self._predicate(x, params) for x in p.parts) + ")"
        if isinstance(p, Or):
            return "(" + " OR ".join(self._predicate(x, params) for x in p.parts) + ")"
        if isinstance(p, Not):
            return f"(NOT {self._predicate(p.part, params)})"
        raise TypeError(f"not a predicate: {p!r}")

    @staticmethod
    def _clean(column: str) -> str:
        x = f"CAST({q(column)} AS DOUBLE)"
        return f"CASE WHEN isnan({x}) THEN NULL ELSE {x} END"

    def _summand(self, s: SumSpec, x: str, params: _Params) -> str:
        """The integer summand of ``s`` from ``x``, the column already cleaned (NaN → NULL)."""
        lo, hi, c = params.add(s.lower), params.add(s.upper), params.add(s.center)
        inv, b = params.add(2.0**-s.grid_exp), params.add(s.bound)
        # least/greatest skip NULLs in DuckDB (greatest(NULL, lo) = lo), so NULL must be kept explicitly
        v = f"CASE WHEN {x} IS NOT NULL THEN least(greatest(CAST(round((least(greatest({x}, {lo}), {hi}) - {c}) * {inv}) AS BIGINT), -{b}), {b}) END"
        if s.square:
            v = f"(({v}) * ({v}) + {params.add(1 << s.shift >> 1)}) >> {params.add(s.shift)}"
        return v

    def _group(self, g: GroupKey, params: _Params) -> str:
        """The group column; for bins, the cleaned value, which the searches of :meth:`_base`
        (engines.bins) turn into its bin."""
        return q(g.column) if g.edges is None else self._clean(g.column)

    @staticmethod
    def _cell(x: ValueSpec, xc: str, params: _Params) -> str:
        """The row's cell on the quantile's candidate grid (plan.ValueSpec), NULL for NULL."""
        lo, hi, sc = params.add(x.lower), params.add(x.upper), params.add(x.scale)
        t = f"((least(greatest({xc}, {lo}), {hi}) - {lo}) * {sc})"
        cell = f"2 * CAST(floor({t}) AS BIGINT) + CAST({t} <> floor({t}) AS BIGINT)"
        return f"CASE WHEN {xc} IS NOT NULL THEN least({cell}, {params.add(2 * x.cells)}) END"

    def _base(
        self, plan: AggregationPlan, params: _Params, *, materialize: bool = False, every_row: bool = False
    ) -> tuple[str, list[str], list[str], list[str]]:
        """The bounded rows as a CTE chain ending in ``r`` (computed once however often it is
        read, with ``materialize``); returns (sql, group cols, sum cols, value cols: cells).

        With ``every_row`` (:meth:`bounding_counts`), ``r`` keeps the rows bounding drops too,
        numbered by the same window (``__gi``, ``__ri``), and ``__out`` says whether a row has a
        value of a bounded column outside its declared bounds."""
        gcols = [f"g{i}" for i in range(len(plan.groups))]
        scols = [s.name for s in plan.sums]
        xcols = [f"x{i}" for i in range(len(plan.values))]
        hcols = [f"__{s.name}" for s in plan.hash_specs()[len(plan.sums) :]]
        # ``src`` casts and cleans each numeric column once; ``base`` derives the summands from it.
        numeric = list(dict.fromkeys([s.column for s in plan.hash_specs()] + [x.column for x in plan.values]))
        clean = {c: f"__c{i}" for i, c in enumerate(numeric)}
        inner = [f"{q(plan.unit)} AS __u"] if plan.unit is not None else []
        inner += [f"{self._group(g, params)} AS {c}" for g, c in zip(plan.groups, gcols, strict=True)]
        inner += [f"{self._clean(c)} AS {alias}" for c, alias in clean.items()]
        select = (["__u"] if plan.unit is not None else []) + gcols
        select += [f"{self._summand(s, clean[s.column], params)} AS {s.name}" for s in plan.sums]
        for x, c in zip(plan.values, xcols, strict=True):
            select.append(f"{self._cell(x, clean[x.column], params)} AS {c}")
        select += [
            f"{self._summand(s, clean[s.column], params)} AS {c}"
            for s, c in zip(plan.hash_specs()[len(plan.sums) :], hcols, strict=True)
        ]
        if every_row:
            ranges = {s.column: (s.lower, s.upper) for s in plan.sums}
            ranges.update({x.column: (x.lower, x.upper) for x in plan.values})
            out = [f"{clean[c]} < {params.add(lo)} OR {clean[c]} > {params.add(hi)}" for c, (lo, hi) in ranges.items()]
            select.append(f"coalesce({' OR '.join(out) or 'FALSE'}, FALSE) AS __out")
        where = ["TRUE"]
        if plan.where is not None:
            where.append(self._predicate(plan.where, params))
        if plan.unit is not None:
            where.append(f"{q(plan.unit)} IS NOT NULL")
        # bins: searched after src; a key filter short of every bin, after that
        binned: list[bins.Search] = []
        kept: list[str] = []
        for g, allowed, c in zip(plan.groups, plan.key_filter, gcols, strict=True):
            gexpr = self._group(g, params)
            if g.edges is not None:
                where.append(bins.duckdb_in_bins(gexpr, g.edges, params.add))
                binned.append(bins.Search.of_edges(c, g.edges))
                if not bins.full_range(allowed, g.edges):
                    kept.append(f"{c} IN ({', '.join(params.add(a) for a in allowed or ())})")
                continue
            where.append(f"{gexpr} IS NOT NULL")
            if allowed is not None:
                where.append(f"{gexpr} IN ({', '.join(params.add(a) for a in allowed)})")
        table = self._from
        if plan.join is not None:
            relations = {n: e.relation() for n, e in self._tables.items()}
            table = join_sql(plan.join, relations, plan.salt, plan.portable, params.add) + " AS __j"
        src = f"src AS (SELECT {', '.join(inner) or '1 AS __one'} FROM {table} WHERE {' AND '.join(where)})"
        stages, last = bins.duckdb_stages("src", binned, params.add) if binned else ([], "src")
        src = ", ".join([src, *stages])
        kept_where = f" WHERE {' AND '.join(kept)}" if kept else ""
        base = f"{src}, base AS (SELECT {', '.join(select) or '1 AS __one'} FROM {last}{kept_where})"
        r_as = "r AS MATERIALIZED" if materialize else "r AS"
        if plan.unit is None:
            return f"WITH {base}, {r_as} (SELECT * FROM base)", gcols, scols, xcols
        salt_g, salt_r = params.add(plan.salt), params.add(plan.salt ^ ROW_SALT_MASK)
        row_cols = ["__u", *gcols, *scols, *hcols]
        if plan.portable:
            gh = f"md5(concat_ws('|', {salt_g}, {', '.join(['__u', *gcols])}))"
            rh = f"md5(concat_ws('|', {salt_r}, {', '.join(row_cols)}))"
        else:
            gh = f"hash({', '.join(['__u', *gcols])}, {salt_g})"
            rh = f"hash({', '.join(row_cols)}, {salt_r})"
        gorder = ", ".join(["__gh", *gcols])
        # (every_row: no QUALIFY, the rows the caps drop are counted by bounding_counts)
        cap = ""
        if not every_row:
            cap = f" QUALIFY __gi <= {params.add(plan.max_groups)} AND __ri <= {params.add(plan.max_rows)}"
        window = (
            f"w AS (SELECT *, {gh} AS __gh, {rh} AS __rh FROM base), "
            f"{r_as} (SELECT *, row_number() OVER (PARTITION BY __u ORDER BY {gorder}, __rh) "
            f"- rank() OVER (PARTITION BY __u ORDER BY {gorder}) + 1 AS __ri, "
            f"dense_rank() OVER (PARTITION BY __u ORDER BY {gorder}) AS __gi FROM w{cap})"
        )
        return f"WITH {base}, {window}", gcols, scols, xcols

    def aggregate_sql(self, plan: AggregationPlan) -> tuple[str, list[Any]]:
        """The statement and parameters :meth:`compute` runs (for inspection and benchmarks): the
        aggregates, and with quantiles their cell counts appended (``UNION ALL BY NAME``, rows
        told apart by ``__k``: −1 for the aggregates, the value spec's index for its cells), all
        read from one materialised bounding."""
        params = _Params()
        ctes, gcols, scols, xcols = self._base(plan, params, materialize=bool(plan.values))
        # Row-level data: every row is its own unit, so units = rows (a plain count is several
        # times cheaper than the filtered one DuckDB cannot push down).
        units = "count(*)" if plan.unit is None else "count(*) FILTER (WHERE __ri = 1)"
        aggs = ["count(*) AS rows", f"{units} AS units"]
        for s in scols:
            # clamped, not overflowing: a failure after the debit would itself be a release
            aggs += [
                f"CAST(greatest(least(coalesce(sum({s}), 0), {SUM_LIMIT}), {-SUM_LIMIT}) AS BIGINT) AS {s}",
                f"count({s}) AS {s}_n",
            ]
        group = f" GROUP BY {', '.join(gcols)}" if gcols else ""
        if not xcols:
            return f"{ctes} SELECT {', '.join([*gcols, *aggs])} FROM r{group}", params.values
        parts = [f"SELECT {', '.join([*gcols, '-1 AS __k', *aggs])} FROM r{group}"]
        for k, x in enumerate(xcols):
            cols = ", ".join([*gcols, f"{k} AS __k", f"{x} AS __cell", "count(*) AS rows"])
            parts.append(f"SELECT {cols} FROM r WHERE {x} IS NOT NULL GROUP BY {', '.join([*gcols, x])}")
        return f"{ctes} {' UNION ALL BY NAME '.join(parts)}", params.values

    def compute(self, plan: AggregationPlan) -> tuple[pd.DataFrame, pd.DataFrame | None]:
        sql, params = self.aggregate_sql(plan)
        frame = self._run(sql, params)
        cells = None
        if plan.values:
            is_cell = frame["__k"].to_numpy() >= 0
            gcols = [f"g{i}" for i in range(len(plan.groups))]
            cells = frame.loc[is_cell, [*gcols, "__k", "__cell", "rows"]]
            cells = cells.astype({"__k": "int64", "__cell": "int64", "rows": "int64"}).reset_index(drop=True)
            frame = frame.loc[~is_cell].drop(columns=["__k", "__cell"]).reset_index(drop=True)
        sums = {s.name for s in plan.sums}
        for c in frame.columns:
            if (c == "rows" or c == "units" or c in sums or c.endswith("_n")) and frame[c].dtype != np.int64:
                frame[c] = frame[c].astype("int64")
        return frame, cells

    def aggregate(self, plan: AggregationPlan) -> pd.DataFrame:
        return self.compute(plan)[0]

    def bounding_sql(self, plan: AggregationPlan) -> tuple[str, list[Any]]:
        """The statement and parameters :meth:`bounding_counts` runs: the plan's rows before the
        caps, numbered by the same window as :meth:`aggregate_sql`'s (same salt, same rows kept)."""
        params = _Params()
        ctes, _, _, _ = self._base(plan, params, every_row=True)
        if plan.unit is None:  # every row is its own unit: nothing is capped
            return f"{ctes} SELECT 0 AS units, count(*) FILTER (WHERE __out) AS clipped FROM r", params.values
        kept = f"__gi <= {params.add(plan.max_groups)} AND __ri <= {params.add(plan.max_rows)}"
        return (
            f"{ctes} SELECT count(DISTINCT __u) FILTER (WHERE NOT ({kept})) AS units, "
            f"count(*) FILTER (WHERE ({kept}) AND __out) AS clipped FROM r",
            params.values,
        )

    def bounding_counts(self, plan: AggregationPlan) -> tuple[int, int]:
        """(privacy units that lost at least one row to ``max_rows`` / ``max_groups``, kept rows
        with a value of a bounded column outside its declared bounds): the exact counts the
        estimate of :mod:`dpkit.analytics.bounding` adds noise to. Runs after the debit."""
        sql, params = self.bounding_sql(plan)
        frame = self._run(sql, params)
        return int(frame["units"].iloc[0]), int(frame["clipped"].iloc[0])

    def _run(self, sql: str, params: list[Any]) -> pd.DataFrame:
        # Runs only after the debit; the session turns any failure into one generic error.
        if self._frame is not None:  # used without bind (engine tests, benchmarks): as given
            self._con.register(self._view, self._frame)
            self._frame = None
        return self._con.execute(sql, params).df()
