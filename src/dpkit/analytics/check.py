"""The curator's data check: how well a private table conforms to its declared metadata.

**Curator only — this is not a private release.** :func:`check_data` reads the private rows and
reports exact counts, the most frequent non-conforming values themselves, minima and maxima and
rows per person. It is for the data curator, who already sees the data, to fix the data or the
metadata before analysts query it; it spends no budget, adds no noise and must never be shown to
an analyst (the curator service returns it only to the curator who registers a dataset, in the
response to ``POST /v1/datasets`` and from ``dpkit admin register-dataset``; it is neither stored
nor written to the audit log).

The source is read exactly as a query reads it
(:class:`~dpkit.analytics.engines.duckdb.DuckDBEngine` and its reading rules; docs/architecture.md,
"Declared schema"): every declared column is read as its declared type, and every value of every
declared column (and of the privacy unit) falls into exactly one of these classes:

* ``conforming``: read as a value of the declared type, within the declared bounds (numeric) and
  among the declared categories (categorical with a public list);
* ``null``: NULL (missing) in the source — skipped by sums and means, in no category;
* ``unreadable``: present in the source but NULL once read, because it is not a value of the
  declared type (``'N/A'`` in a numeric column, ``'3.5'`` in an integer column, NaN, ±inf);
* ``below`` / ``above`` (``out_of_bounds``): numeric values outside [lower, upper] — queries
  clip them to the bounds;
* ``outside_categories``: not among the declared categories — a group-by drops the row. For
  text, the nearest declared category is shown when the value is a near miss: surrounding
  whitespace (``' Male'`` with ``strip_strings=False``), case (``'male'``) or a small spelling
  difference.

A column *conforms* when it has no unreadable, out-of-bounds or outside-category values (NULLs
are legitimate missing values, except in the privacy unit — a row without a unit is left out of
every query — and in a column declared ``"nullable": false``, whose NULLs a synthetic table
counts in the column's first category or bin). For the privacy unit the check also shows how many rows each unit has (to choose
``max_rows``) and in how many groups of each categorical column a unit appears (``max_groups``).
Declared columns missing from the source and nested (LIST, STRUCT, …) columns are reported as
problems rather than raised: the check is meant to find them.

What the reader repaired to read the rows by the declaration — nothing a query shows — is in
:attr:`~dpkit.analytics.check_report.DataCheck.reading` (:mod:`dpkit.analytics.check_reading`):
for Parquet data, the files that hold a declared column in another physical type (their values
cast one by one), the partition directories that do not conform or are not UTF-8, the text values
that are not UTF-8 (read with ``'?'``); for CSV, the records the reader dropped.

All counting runs in DuckDB SQL (one scan for the counts, one for the top non-conforming values,
one for the units); only the matching of at most :data:`~dpkit.analytics.check_report.TOP_VALUES`
distinct values per column against the declared categories runs in Python.

>>> import pandas as pd
>>> from dpkit.analytics import Categorical, Metadata, Numeric
>>> df = pd.DataFrame({"age": ["34", "N/A", "150", None], "sex": ["Male", " Female", "male", "Female"]})
>>> meta = Metadata(row_level=True, strip_strings=False,
...                 columns={"age": Numeric(0, 120), "sex": Categorical(["Female", "Male"])})
>>> report = check_data(df, meta)
>>> age, sex = report.columns
>>> age.conforming, age.null, age.unreadable, age.above, sex.outside_categories, report.ok
(1, 1, 1, 1, 2, False)
>>> [(v.value, v.nearest, v.reason) for v in sex.values]
[(' Female', 'Female', 'whitespace'), ('male', 'Male', 'case')]
"""

from __future__ import annotations

import difflib
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from dpkit._validate import short_repr as _short
from dpkit.analytics.check_norms import checked_features, norm_check
from dpkit.analytics.check_reading import reading_check
from dpkit.analytics.check_report import (
    MISSING_MARKERS,
    NEAR_MISS_CUTOFF,
    TOP_VALUES,
    ColumnCheck,
    DataCheck,
    GroupSpread,
    NonconformingValue,
    Reason,
    UnitCheck,
    _num,
)
from dpkit.analytics.engines.base import ColumnKind, ReadType
from dpkit.analytics.engines.base import quote_identifier as q
from dpkit.analytics.metadata import Categorical, Metadata, Numeric
from dpkit.errors import InvalidDataError, InvalidParameterError

__all__ = ["check_data", "nearest_category"]


# ---- near misses ------------------------------------------------------------------------------------


def _norm(text: str) -> str:
    return text.strip().casefold()


def nearest_category(value: str, categories: tuple[str, ...]) -> tuple[str | None, Reason | None]:
    """The declared category a non-conforming text most likely means, and why (whitespace, case
    or spelling), or (None, None).

    >>> nearest_category(" Male", ("Female", "Male")), nearest_category("male", ("Female", "Male"))
    (('Male', 'whitespace'), ('Male', 'case'))
    >>> nearest_category("Femal", ("Female", "Male")), nearest_category("?", ("Female", "Male"))
    (('Female', 'spelling'), (None, None))
    """
    stripped = value.strip()
    if stripped in categories:
        return stripped, "whitespace"
    by_norm: dict[str, str] = {}
    for c in categories:
        by_norm.setdefault(_norm(c), c)
    key = _norm(value)
    if key in by_norm:
        return by_norm[key], "case"
    if key:
        match = difflib.get_close_matches(key, list(by_norm), n=1, cutoff=NEAR_MISS_CUTOFF)
        if match:
            return by_norm[match[0]], "spelling"
    return None, None


# ---- reading ---------------------------------------------------------------------------------------


def _metadata(metadata: object) -> Metadata:
    if isinstance(metadata, Metadata):
        return metadata
    if isinstance(metadata, Mapping):
        return Metadata.from_dict(metadata)
    if isinstance(metadata, (str, os.PathLike)):
        path = Path(metadata)
        if not path.is_file():
            raise InvalidParameterError(
                "metadata", str(path), "an existing JSON file with the declared columns", "no such file"
            )
        return Metadata.from_json(path)
    raise InvalidParameterError(
        "metadata", _short(metadata), "a Metadata, a dict in its JSON layout, or the path of a JSON file"
    )


def _engine(source: object, table: str | None) -> tuple[Any, str, Any]:
    """The DuckDB engine reading ``source`` as queries do, the table's name for the report, and
    the connection opened here (to be closed after the check), if any."""
    import duckdb

    from dpkit.analytics.engines.duckdb import DuckDBEngine

    if table is not None and (not isinstance(table, str) or not table):
        raise InvalidParameterError("table", _short(table), "a non-empty table name, or None")
    if isinstance(source, tuple):
        if (
            len(source) != 2
            or not isinstance(source[0], duckdb.DuckDBPyConnection)
            or not isinstance(source[1], str)
            or not source[1]
        ):
            raise InvalidParameterError("data", _short(source), "a (duckdb connection, table name) pair")
        source, table = source
    if isinstance(source, duckdb.DuckDBPyConnection):
        if table is None:
            raise InvalidParameterError("table", None, "the name of a table or view of the DuckDB connection")
        try:
            return DuckDBEngine(None, connection=source, table=table), table, None
        except duckdb.Error as exc:
            raise InvalidParameterError("table", table, "a table or view of the DuckDB connection", str(exc)) from None
    from dpkit.analytics.engines.csv_source import CsvFile

    if isinstance(source, CsvFile):  # a CSV file and how to read it (Session.from_csv's options)
        if not source.path.is_file():
            raise InvalidParameterError("data", str(source.path), "an existing CSV file", "no such file")
        return DuckDBEngine(source), table or source.path.stem, None
    if isinstance(source, (str, os.PathLike)):
        from dpkit.analytics.engines.parquet_source import parquet_files

        path = Path(source)
        if not path.is_file() and parquet_files(path) is not None:  # a Parquet directory or glob
            return DuckDBEngine(path), table or "data", None
        if not path.is_file():
            raise InvalidParameterError(
                "data", str(path), "an existing CSV, Parquet or DuckDB database file", "no such file"
            )
        if path.suffix.lower() in (".duckdb", ".ddb"):
            if table is None:
                raise InvalidParameterError(
                    "table", None, f"the name of a table or view in the DuckDB database {path.name}"
                )
            try:
                con = duckdb.connect(str(path), read_only=True)
            except duckdb.Error as exc:
                raise InvalidParameterError(
                    "data", str(path), "a DuckDB database file (or a CSV or Parquet file)", str(exc)
                ) from None
            try:
                return DuckDBEngine(None, connection=con, table=table), table, con
            except duckdb.Error as exc:
                con.close()
                raise InvalidParameterError(
                    "table", table, f"a table or view of the DuckDB database {path.name}", str(exc)
                ) from None
        return DuckDBEngine(path), table or path.stem, None
    return DuckDBEngine(source), table or "data", None


def _describe(spec: Numeric | Categorical | None) -> tuple[str, ReadType]:
    if spec is None:
        return "unit (text)", "unit"
    if isinstance(spec, Numeric):
        return "numeric" + (f" [{_num(spec.lower)}, {_num(spec.upper)}]" if spec.bounded else ""), "double"
    vt: ReadType = spec.value_type  # type: ignore[assignment]
    if spec.categories is None:
        return f"{vt}, private keys", vt
    n = len(spec.categories)
    return f"{n} {vt} categor{'y' if n == 1 else 'ies'}", vt


def check_data(
    source: Any,
    metadata: Metadata | Mapping[str, Any] | str | os.PathLike[str],
    *,
    table: str | None = None,
    features: Sequence[str] | None = None,
    data_norm: float | None = None,
) -> DataCheck:
    """Check how well ``source`` conforms to ``metadata`` — a report for the curator only.

    Parameters
    ----------
    source:
        A CSV file (header line first) or Parquet file path, a directory or glob of Parquet
        files (as :meth:`Session.from_parquet <dpkit.analytics.Session.from_parquet>` reads them), a
        :class:`~dpkit.analytics.engines.duckdb.CsvFile` (a CSV path with the reading options of
        :meth:`Session.from_csv <dpkit.analytics.Session.from_csv>`), a pandas DataFrame, a DuckDB
        relation, a ``(duckdb connection, table name)`` pair, a DuckDB connection (with
        ``table=``) or a DuckDB database file (``.duckdb``, with ``table=``). It is read as a
        query reads it (:class:`~dpkit.analytics.engines.duckdb.DuckDBEngine`).
    metadata:
        The declared schema: a :class:`Metadata`, a dict in its JSON layout, or a JSON file path.
    table:
        The table or view to check in a DuckDB connection or database file; otherwise only the
        name shown in the report (default: the file's stem, or ``data``).
    features, data_norm:
        Together: also count the rows whose vector of ``features`` (declared Numeric columns, read
        as declared) has an ℓ2 norm above ``data_norm`` — the rows a :mod:`dpkit.ml` estimator
        given that ``data_norm`` would scale down (:attr:`DataCheck.norms`).

    Returns a :class:`DataCheck` with exact counts of the private data: show it to the curator,
    never to an analyst (it is not a private release and spends no budget).

    Raises :class:`~dpkit.errors.InvalidParameterError` for bad input (an unreadable metadata
    file or JSON, a missing data file, an unknown source type) and
    :class:`~dpkit.errors.InvalidDataError` when the engine cannot read the rows. A declared column that the
    source lacks, or a nested one, does not raise: it is listed in :attr:`DataCheck.problems`.
    """
    import duckdb

    meta = _metadata(metadata)
    norms = checked_features(meta, features, data_norm)
    engine, name, opened = _engine(source, table)
    try:
        return _scan(meta, engine, name, norms)
    except duckdb.Error as exc:  # the curator may see the engine's words
        raise InvalidDataError(
            "data", f"{name} could not be read ({exc})", "a CSV file in UTF-8, a Parquet file or a DuckDB table"
        ) from None
    finally:
        if opened is not None:
            opened.close()


def _scan(meta: Metadata, engine: Any, name: str, norms: tuple[tuple[str, ...], float] | None = None) -> DataCheck:
    physical: dict[str, ColumnKind] = engine.schema()
    unit = meta.privacy_unit
    problems: list[str] = []
    notes: list[str] = []
    if unit is None and not meta.row_level and not meta.public:
        notes.append(
            "the metadata declares neither privacy_unit nor row_level=True: a session must name the unit itself"
        )

    # -- which columns can be read, and as what -----------------------------------------------
    specs: dict[str, Numeric | Categorical | None] = dict(meta.columns)
    if unit is not None and unit not in specs:
        specs[unit] = None
    types: dict[str, ReadType] = {}
    described: dict[str, tuple[str, ReadType]] = {}
    for col, spec in specs.items():
        described[col] = _describe(spec)
        what = "privacy unit" if col == unit else "declared column"
        if col not in physical:
            near = difflib.get_close_matches(col, list(physical), n=1, cutoff=NEAR_MISS_CUTOFF)
            hint = f" (did you mean {near[0]!r}?)" if near else ""
            problems.append(
                f"{what} {col!r} is not in the source{hint}; its columns are: {', '.join(map(repr, physical))}"
            )
        elif physical[col] == "nested":
            problems.append(f"{what} {col!r} has a nested type (LIST, STRUCT, MAP or array), which cannot be declared")
        else:
            types[col] = described[col][1]
    engine.bind(types, strip_strings=meta.strip_strings)  # registers a DataFrame exactly as a session does
    con, raw = engine._con, engine._raw
    rel = con.sql(f"SELECT * FROM {raw} LIMIT 0")
    sql_types = {c: str(t) for c, t in zip(rel.columns, rel.types, strict=True)}
    # a Parquet column whose files disagree on its type: one struct field per type (parquet_source)
    mixed = engine._mixed
    sql_types.update({c: " | ".join(t for _, t, _ in fields) for c, fields in mixed.items()})

    from dpkit.analytics.engines.duckdb import _Params
    from dpkit.analytics.engines.parquet_source import duckdb_mixed_text

    typed = {c: engine._read_column(c, t, meta.strip_strings) for c, t in types.items()}
    stored = {c: duckdb_mixed_text(q(c), mixed[c]) if c in mixed else q(c) for c in types}  # as in the source
    params = _Params()

    def listed(col: str) -> str | None:
        """SQL that is TRUE when the typed value is among the declared categories (None: no list)."""
        spec = specs[col]
        if isinstance(spec, Categorical) and spec.categories is not None:
            return f"({typed[col]} IN ({', '.join(params.add(c) for c in spec.categories)}))"
        return None

    # -- one scan: the counts of every column -----------------------------------------------------
    items = ["count(*)"]
    layout: list[tuple[str, str]] = []
    for col in types:
        x, t, spec = stored[col], typed[col], specs[col]
        items += [f"count(*) FILTER (WHERE {x} IS NULL)", f"count(*) FILTER (WHERE {x} IS NOT NULL AND {t} IS NULL)"]
        layout += [(col, "null"), (col, "unreadable")]
        if isinstance(spec, Numeric):
            items += [f"min({t})", f"max({t})"]
            layout += [(col, "minimum"), (col, "maximum")]
            if spec.bounded:
                items += [
                    f"count(*) FILTER (WHERE {t} < {params.add(spec.lower)})",
                    f"count(*) FILTER (WHERE {t} > {params.add(spec.upper)})",
                ]
                layout += [(col, "below"), (col, "above")]
        else:
            items.append(f"count(DISTINCT {t})")
            layout.append((col, "distinct"))
            inlist = listed(col)
            if inlist is not None:
                items.append(f"count(*) FILTER (WHERE {t} IS NOT NULL AND NOT {inlist})")
                layout.append((col, "outside_categories"))
    row = con.execute(f"SELECT {', '.join(items)} FROM {raw}", params.values).fetchone()
    total = int(row[0])
    stats: dict[str, dict[str, Any]] = {c: {} for c in types}
    for (col, key), value in zip(layout, row[1:], strict=True):
        stats[col][key] = value

    # -- one scan: the most frequent non-conforming values of every column --------------------------
    params = _Params()
    parts = []
    for i, col in enumerate(types):
        x, t = stored[col], typed[col]
        inlist = listed(col)
        bad = f"({x} IS NOT NULL AND {t} IS NULL)" + (
            "" if inlist is None else f" OR ({t} IS NOT NULL AND NOT {inlist})"
        )
        issue = f"CASE WHEN {t} IS NULL THEN 'unreadable' ELSE 'outside_categories' END"
        parts.append(
            f"SELECT {i} AS c, CAST({x} AS VARCHAR) AS v, {issue} AS issue, count(*) AS n FROM {raw} WHERE {bad} GROUP BY ALL"
        )
    top: dict[str, list[NonconformingValue]] = {c: [] for c in types}
    if parts:
        sql = (
            f"SELECT c, v, issue, n FROM ({' UNION ALL '.join(parts)}) "
            f"QUALIFY row_number() OVER (PARTITION BY c ORDER BY n DESC, v) <= {TOP_VALUES} ORDER BY c, n DESC, v"
        )
        cols = list(types)
        for i, value, issue, n in con.execute(sql, params.values).fetchall():
            col = cols[i]
            spec = specs[col]
            nearest: Any = None
            reason: Reason | None = None
            if (
                issue == "outside_categories"
                and isinstance(spec, Categorical)
                and spec.value_type == "string"
                and spec.categories
            ):
                nearest, reason = nearest_category(value, spec.categories)
            if nearest is None and _norm(value) in MISSING_MARKERS:
                reason = "missing marker"
            top[col].append(NonconformingValue(value, int(n), issue, nearest, reason))

    # -- the columns ------------------------------------------------------------------------------
    checks: list[ColumnCheck] = []
    for col in specs:
        declared, read_as = described[col]
        is_unit = col == unit
        if col not in types:
            checks.append(
                ColumnCheck(col, declared, None, physical.get(col, "missing"), None, is_unit, False, total, 0, 0, 0)
            )
            continue
        s, spec = stats[col], specs[col]
        null, unreadable = int(s["null"]), int(s["unreadable"])
        below, above, outside = int(s.get("below", 0)), int(s.get("above", 0)), int(s.get("outside_categories", 0))
        lo, hi = s.get("minimum"), s.get("maximum")
        checks.append(
            ColumnCheck(
                name=col,
                declared=declared,
                read_as=read_as,
                physical=physical[col],
                source_type=sql_types.get(col),
                is_unit=is_unit,
                checked=True,
                rows=total,
                conforming=total - null - unreadable - below - above - outside,
                null=null,
                unreadable=unreadable,
                below=below,
                above=above,
                outside_categories=outside,
                minimum=None if lo is None or not math.isfinite(lo) else float(lo),
                maximum=None if hi is None or not math.isfinite(hi) else float(hi),
                distinct=None if "distinct" not in s else int(s["distinct"]),
                values=tuple(top[col]),
                bounded=isinstance(spec, Numeric) and spec.bounded,
                listed=isinstance(spec, Categorical) and spec.categories is not None,
                nullable=spec is None or spec.nullable,
            )
        )

    # -- the privacy unit ----------------------------------------------------------------------------
    unit_check: UnitCheck | None = None
    if unit is not None and unit in types:
        max_rows, max_groups = meta.max_rows or 1, meta.max_groups or 1
        params = _Params()
        u = typed[unit]
        group_cols = [c for c, spec in specs.items() if isinstance(spec, Categorical) and c in types and c != unit]
        per = [f"{u} AS __u", "count(*) AS __n"]
        for i, col in enumerate(group_cols):
            inlist = listed(col)
            key = typed[col] if inlist is None else f"CASE WHEN {inlist} THEN {typed[col]} END"
            per.append(f"count(DISTINCT {key}) AS __d{i}")
        mr = params.add(max_rows)
        mg = params.add(max_groups) if group_cols else ""  # a parameter DuckDB would find unused is an error
        agg = [
            "count(*)",
            "coalesce(max(__n), 0)",
            "coalesce(quantile_disc(__n, 0.5), 0)",
            "coalesce(quantile_disc(__n, 0.9), 0)",
            "coalesce(quantile_disc(__n, 0.99), 0)",
            f"count(*) FILTER (WHERE __n > {mr})",
            f"coalesce(sum(greatest(__n - {mr}, 0)), 0)",
        ]
        for i in range(len(group_cols)):
            agg += [f"coalesce(max(__d{i}), 0)", f"count(*) FILTER (WHERE __d{i} > {mg})"]
        r = con.execute(
            f"WITH per AS (SELECT {', '.join(per)} FROM {raw} WHERE {u} IS NOT NULL GROUP BY 1) SELECT {', '.join(agg)} FROM per",
            params.values,
        ).fetchone()
        r = [int(x) for x in r]
        uc = next(c for c in checks if c.name == unit)
        unit_check = UnitCheck(
            column=unit,
            units=r[0],
            rows_without_unit=uc.null + uc.unreadable,
            rows_per_unit_median=r[2],
            rows_per_unit_p90=r[3],
            rows_per_unit_p99=r[4],
            rows_per_unit_max=r[1],
            max_rows=max_rows,
            units_over_max_rows=r[5],
            rows_over_max_rows=r[6],
            max_groups=max_groups,
            groups=tuple(GroupSpread(c, r[7 + 2 * i], r[8 + 2 * i]) for i, c in enumerate(group_cols)),
        )
    if total == 0:
        problems.append("the source has no rows")
    return DataCheck(
        name=name,
        rows=total,
        strip_strings=meta.strip_strings,
        row_level=meta.row_level,
        public=meta.public,
        columns=tuple(checks),
        unit=unit_check,
        problems=tuple(problems),
        notes=tuple(notes),
        reading=reading_check(engine, specs, types, meta.strip_strings),
        # A feature missing from the source is already a problem above: then no norm is counted.
        norms=None
        if norms is None or not set(norms[0]) <= set(types)
        else norm_check(con, raw, typed, meta, norms[0], norms[1]),
    )
