"""Group-by benchmark: a user-level private count/sum/mean by category on 10 million rows.

Not a test. Run it from the benchmark environment:

    .venv-bench/bin/python benchmarks/bench_groupby.py [--rows 10000000] [--only dpkit,duckdb] [--markdown]
    .venv-bench/bin/python benchmarks/bench_groupby.py --parquet --only dpkit-spark,spark-hand,dpkit-spark-median \
        [--spark-master local[2]] [--driver-memory 1g] [--spark-repeats 2]
    .venv-bench/bin/python benchmarks/bench_groupby.py --rows 100000000 --duckdb-parquet --only dpkit,duckdb-onewindow \
        --duckdb-memory-limit 4GB --duckdb-temp-dir /tmp/dpkit-bench/duckdb-tmp

Data (numpy, seeded): ``--rows`` rows (default 10,000,000) from about rows/10.5 users (≈ 950,000)
with 1–20 rows each (uniform), rows shuffled; ``category`` an integer uniform in 0..99, ``value`` a
float uniform in [0, 100]. The input of every contender is the same pandas DataFrame
(user_id int64, category int64, value float64).

Contenders, side by side, each in its own subprocess (so that peak memory is its own):

(a) pandas ``groupby("category")["value"].agg(["count", "sum", "mean"])`` — no bounding, no noise;
(b) polars ``group_by("category").agg(len, sum, mean)`` — same;
(c) DuckDB ``SELECT category, count(*), sum(value), avg(value) ... GROUP BY category`` — same;
(d) DuckDB, hand-written textbook contribution bounding: ``row_number() OVER (PARTITION BY user,
    category ORDER BY hash) <= 2``, then ``dense_rank() OVER (PARTITION BY user ORDER BY keyed
    group hash) <= 5``, then count/sum/avg by category (two window sorts);
(e) DuckDB, hand-written, the same bounding with dpkit's single window (``row_number − rank + 1``
    and ``dense_rank`` over one ``PARTITION BY user ORDER BY group hash, group, row hash``) —
    (d) and (e) keep exactly the same rows (the script checks it);
(e') the statement dpkit itself generates for (f) (``DuckDBEngine.aggregate_sql``), run raw:
    (e) plus value clipping and quantisation to exact integer sums;
(f) dpkit end to end: ``Session(...).group_by("category").aggregate([Count(), Sum("value"),
    Mean("value")], epsilon=1.0)`` with privacy unit user_id, max_groups=5, max_rows=2, public keys
    0..99 (declared categories), Laplace noise — session creation, SQL, noise and result table;
(g) PipelineDP 0.3.1, LocalBackend: COUNT, SUM, MEAN, max_partitions_contributed=5,
    max_contributions_per_partition=2, bounds [0, 100], public partitions 0..99, ε = 1 (Laplace);
    falls back to ``--fallback-rows`` (1,000,000) rows, labelled, when it does not finish within
    ``--slow-timeout`` seconds;
(h) dpkit on Spark (``engine="spark"``, on ``--spark-master``, default ``local[2]``, with a
    ``--driver-memory`` driver, default 1g) when ``dpkit.analytics.engines.spark`` exists: the same
    query as (f) on one Spark DataFrame — a cached one converted from pandas, or with ``--parquet``
    ``spark.read.parquet(dir)`` (not cached: every run reads the files);
(i) ``spark-hand``: the same bounding hand-written with the PySpark DataFrame API on the same Spark
    DataFrame as (h): keyed ``xxhash64`` group and row hashes computed once, one window per user
    ordered by (group hash, category, row hash) with ``row_number − rank + 1`` as the row index and
    ``dense_rank`` as the group index, ``max_groups`` = 5 / ``max_rows`` = 2 filters, then
    ``groupBy(category).agg(count, sum, avg)`` — Spark's counterpart of (e), so that the report
    gives dpkit-on-Spark / hand-written Spark;
(j) ``dpkit-spark-median``: dpkit on Spark, ``SELECT category, MEDIAN(value) FROM data GROUP BY
    category`` (``Session.sql``, ε = 1) on the same DataFrame as (h): a private median per group
    (counted over a candidate grid inside Spark), with the driver's peak memory — the Python
    process's ``VmHWM`` and the JVM's sampled RSS, reported separately.

Inputs at scale:

``--parquet`` writes the generated data once more, cached next to the ``.npy`` files, as a Parquet
directory of ``--parquet-files`` (8) part files (pyarrow, snappy), and the Spark contenders read it
with ``spark.read.parquet(dir)`` instead of converting the pandas frame (which yields ~1,000 tiny
partitions). ``--duckdb-parquet`` (implies ``--parquet``) makes the DuckDB contenders read the same
directory instead of the in-memory frame: (c)–(e') through ``read_parquet`` on their connection,
(f) through ``dp.Session.from_parquet(dir, ...)``; those subprocesses then never build the pandas
frame. ``--duckdb-memory-limit 4GB`` and ``--duckdb-temp-dir DIR`` set DuckDB's ``memory_limit``
and ``temp_directory`` (out of core: the window sort and the group-by spill to DIR) on every DuckDB
contender's connection — for (f) through the session's own ``memory_limit=`` / ``temp_directory=``
keywords (``Session.from_parquet``, or ``DuckDBEngine`` for the in-memory frame).

Spark: ``--spark-master URL`` (default ``local[2]``) and ``--driver-memory`` (default ``1g``) build
the SparkSession of (h)–(j); ``--spark-repeats`` (1) runs each Spark query more than once (best
of). Against the throwaway standalone cluster of ``scripts/spark-cluster.sh`` (one master and two
workers of 1 core and 1 GB each on 127.0.0.1; the cluster must run the same pyspark as the bench):

    export PYTHON=.venv-bench/bin/python DPKIT_SPARK_CLUSTER_DIR=/tmp/dpkit-bench/spark-cluster  # its own state dir
    url=$(scripts/spark-cluster.sh start)
    .venv-bench/bin/python benchmarks/bench_groupby.py --parquet --spark-master "$url" \
        --only dpkit-spark,spark-hand,dpkit-spark-median --out benchmarks/results/groupby_cluster.json
    scripts/spark-cluster.sh stop

On a cluster the executors are the workers' children, not the bench's: their RSS is sampled too
(the processes whose command line carries this application's id) and added to the peak.

Timing: wall clock (``time.perf_counter``) of the query alone, input already in memory; best of
``--repeats`` (3) for the fast contenders, one run for PipelineDP and Spark. Setup (building the
contender's own input: polars frame, DuckDB registration, PipelineDP's row list, Spark DataFrame)
is timed separately. Peak memory: the subprocess's peak resident set size (``VmHWM``, reset with
``/proc/self/clear_refs`` after the input DataFrame is built and the library imported) minus its
resident set size at that moment, so it covers setup and the timed runs; for Spark the JVM's peak
RSS (sampled with psutil every 50 ms; on a cluster the executors' too) is added. The table also
gives the absolute peaks: the Python process's ``VmHWM`` and the driver JVM's sampled RSS. DuckDB
runs with 2 threads, polars with ``POLARS_MAX_THREADS=2``. The 1-minute load average is recorded
at the start of the run and of each contender.

Results: ``benchmarks/results/groupby.json`` (``--out``), a rich table on stderr, Markdown on stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import gc
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import _plan
import _report
import _smoke
import numpy as np

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "benchmarks" / "results" / "groupby.json"
SEED = 20261126
N_CATEGORIES = 100
LOWER, UPPER = 0.0, 100.0
MAX_GROUPS, MAX_ROWS = 5, 2
EPSILON = 1.0
THREADS = 2
# Fixed keys for the hand-written bounding queries (d) and (e); dpkit draws its own per query.
SALT_G = 0x1D2C3B4A59687766
SALT_R = SALT_G ^ 0x2545F4914F6CDD1D

# name -> (label, slow)
CONTENDERS: dict[str, tuple[str, bool]] = {
    "pandas": ("(a) pandas groupby (no bounding, no noise)", False),
    "polars": ("(b) polars group_by (no bounding, no noise)", False),
    "duckdb": ("(c) DuckDB SQL GROUP BY (no bounding, no noise)", False),
    "duckdb-textbook": ("(d) DuckDB SQL, textbook bounding (two windows)", False),
    "duckdb-onewindow": ("(e) DuckDB SQL, dpkit-style bounding (one window)", False),
    "dpkit-sql": ("(e') dpkit's generated SQL, run raw (no noise)", False),
    "dpkit": ("(f) dpkit Session end to end, ε=1 Laplace", False),
    "pipelinedp": ("(g) PipelineDP 0.3.1 LocalBackend, ε=1 Laplace", True),
    "dpkit-spark": ("(h) dpkit Session on Spark, ε=1 Laplace", True),
    "spark-hand": ("(i) Spark DataFrame API, dpkit-style bounding (one window)", True),
    "dpkit-spark-median": ("(j) dpkit on Spark: SELECT category, MEDIAN(value), ε=1", True),
}
SPARK = ("dpkit-spark", "spark-hand", "dpkit-spark-median")
DUCKDB = ("duckdb", "duckdb-textbook", "duckdb-onewindow", "dpkit-sql", "dpkit")

KEYS_SQL = ", ".join(str(k) for k in range(N_CATEGORIES))

BASE_CTE = (
    "base AS (SELECT user_id AS u, category AS g, least(greatest(value, 0.0), 100.0) AS x FROM t "
    f"WHERE user_id IS NOT NULL AND category IN ({KEYS_SQL}))"
)

SQL_PLAIN = "SELECT category, count(*) AS n, sum(value) AS s, avg(value) AS m FROM t GROUP BY category"

SQL_TEXTBOOK = f"""WITH {BASE_CTE},
per_group AS (
  SELECT * FROM base
  QUALIFY row_number() OVER (PARTITION BY u, g ORDER BY hash(u, g, x, $2)) <= {MAX_ROWS}),
per_user AS (
  SELECT * FROM per_group
  QUALIFY dense_rank() OVER (PARTITION BY u ORDER BY hash(u, g, $1), g) <= {MAX_GROUPS})
SELECT g AS category, count(*) AS n, sum(x) AS s, avg(x) AS m FROM per_user GROUP BY g"""

SQL_ONE_WINDOW = f"""WITH {BASE_CTE},
w AS (SELECT *, hash(u, g, $1) AS gh, hash(u, g, x, $2) AS rh FROM base),
r AS (
  SELECT *,
         row_number() OVER (PARTITION BY u ORDER BY gh, g, rh) - rank() OVER (PARTITION BY u ORDER BY gh, g) + 1 AS ri,
         dense_rank() OVER (PARTITION BY u ORDER BY gh, g) AS gi
  FROM w
  QUALIFY gi <= {MAX_GROUPS} AND ri <= {MAX_ROWS})
SELECT g AS category, count(*) AS n, sum(x) AS s, avg(x) AS m FROM r GROUP BY g"""


# ----------------------------------------------------------------------------- data


def generate(rows: int, seed: int = SEED) -> dict[str, np.ndarray]:
    """user_id (1–20 rows per user, uniform; rows shuffled), category 0..99, value in [0, 100]."""
    rng = np.random.default_rng(seed)
    counts = rng.integers(1, 21, size=int(round(rows / 10.5)))
    while counts.sum() < rows:
        counts = np.concatenate([counts, rng.integers(1, 21, size=max(1000, rows // 100))])
    cs = np.cumsum(counts)
    last = int(np.searchsorted(cs, rows))  # the user holding row number `rows`
    counts = counts[: last + 1].copy()
    counts[-1] -= int(cs[last]) - rows  # truncate the last user
    user = np.repeat(np.arange(last + 1, dtype=np.int64), counts)[rng.permutation(rows)]
    category = rng.integers(0, N_CATEGORIES, size=rows, dtype=np.int64)
    value = rng.uniform(LOWER, UPPER, size=rows)
    return {"user_id": user, "category": category, "value": value}


def cache_dir(base: Path, rows: int) -> Path:
    return base / f"groupby_{rows}_{SEED}"


def ensure_cache(base: Path, rows: int) -> Path:
    d = cache_dir(base, rows)
    if all((d / f"{c}.npy").exists() for c in ("user_id", "category", "value")):
        return d
    d.mkdir(parents=True, exist_ok=True)
    print(f"[bench] generating {rows:,} rows into {d}", file=sys.stderr, flush=True)
    for name, arr in generate(rows).items():
        np.save(d / f"{name}.npy", arr)
    return d


def ensure_parquet(d: Path, files: int) -> Path:
    """The cached data as a Parquet directory of ``files`` part files (written once, atomically)."""
    out = d / f"parquet-{files}"
    if (out / "_SUCCESS").exists():
        return out
    import shutil  # noqa: PLC0415

    import pyarrow as pa  # noqa: PLC0415
    import pyarrow.parquet as pq  # noqa: PLC0415

    print(f"[bench] writing {out} ({files} Parquet files)", file=sys.stderr, flush=True)
    tmp = d / f".parquet-{files}.{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    cols = {c: np.load(d / f"{c}.npy", mmap_mode="r") for c in ("user_id", "category", "value")}
    n = len(cols["user_id"])
    edges = np.linspace(0, n, files + 1).astype(np.int64)
    for i in range(files):
        lo, hi = int(edges[i]), int(edges[i + 1])
        table = pa.table({c: np.ascontiguousarray(a[lo:hi]) for c, a in cols.items()})
        pq.write_table(table, tmp / f"part-{i:05d}.parquet", compression="snappy")
        del table
    (tmp / "_SUCCESS").touch()
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def load_frame(d: Path):
    import pandas as pd  # noqa: PLC0415

    return pd.DataFrame({c: np.load(d / f"{c}.npy") for c in ("user_id", "category", "value")})


# ----------------------------------------------------------------------------- memory


def _status_mib(field: str) -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return float("nan")


def reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


class ChildSampler:
    """Peak RSS of this process's children (Spark's driver JVM), sampled every 50 ms with psutil;
    once ``app_id`` is set (a Spark cluster), also of the executors of that application, which are
    the workers' children: the processes whose command line carries ``--app-id <app_id>``."""

    def __init__(self) -> None:
        self.peak = 0.0
        self.executors_peak = 0.0
        self.app_id: str | None = None
        self._stop = threading.Event()
        try:
            import psutil  # noqa: PLC0415

            self._psutil = psutil
            self._proc = psutil.Process()
        except ImportError:
            self._proc = None
        self._t = threading.Thread(target=self._loop, daemon=True)
        self._executors: list[Any] = []
        self._scanned = 0.0

    def _executor_rss(self) -> float:
        now = time.monotonic()
        if now - self._scanned > 1.0:  # look for new executors once a second
            self._scanned = now
            found = []
            for p in self._psutil.process_iter(["cmdline"]):
                try:
                    cmd = p.info["cmdline"] or []
                    if "--app-id" in cmd and self.app_id in cmd:
                        found.append(p)
                except Exception:  # noqa: BLE001, S112
                    continue
            self._executors = found
        total = 0
        for p in self._executors:
            with contextlib.suppress(Exception):  # an executor that just exited
                total += p.memory_info().rss
        return total / 2**20

    def _loop(self) -> None:
        while not self._stop.is_set():
            total = 0
            for c in self._proc.children(recursive=True):
                with contextlib.suppress(Exception):  # a child that just exited
                    total += c.memory_info().rss
            self.peak = max(self.peak, total / 2**20)
            if self.app_id:
                self.executors_peak = max(self.executors_peak, self._executor_rss())
            self._stop.wait(0.05)

    def __enter__(self) -> ChildSampler:
        if self._proc is not None:
            self._t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._proc is not None:
            self._t.join()


# ----------------------------------------------------------------------------- contenders
# Each setup(df) returns run() -> check dict (groups, kept rows, total of the value sums).


#: The child's options (from the parent's command line): parquet dir, DuckDB and Spark settings.
OPTS: dict[str, Any] = {}
#: The child's memory sampler (Spark contenders tell it their application id).
SAMPLER: ChildSampler | None = None


def _parquet_glob() -> str:
    return str(Path(OPTS["parquet"]) / "*.parquet")


def _duckdb_settings(con, ctx) -> None:
    con.execute(f"SET threads = {THREADS}")
    if OPTS.get("duckdb_memory_limit"):
        con.execute("SET memory_limit = ?", [OPTS["duckdb_memory_limit"]])
    if OPTS.get("duckdb_temp_dir"):
        con.execute("SET temp_directory = ?", [OPTS["duckdb_temp_dir"]])
    ctx["duckdb_settings"] = dict(
        zip(
            ("threads", "memory_limit", "temp_directory"),
            con.execute(
                "SELECT current_setting('threads'), current_setting('memory_limit'), current_setting('temp_directory')"
            ).fetchall()[0],
            strict=True,
        )
    )


def _duckdb_con(df, ctx):
    """A 2-thread connection (with the memory limit and spill directory asked for) and table ``t``:
    the pandas frame, or a view over the Parquet directory with ``--duckdb-parquet``."""
    import duckdb  # noqa: PLC0415

    con = duckdb.connect()
    _duckdb_settings(con, ctx)
    if OPTS.get("duckdb_parquet"):
        con.read_parquet(_parquet_glob()).create_view("t")
        ctx["input"] = "parquet (read_parquet)"
    else:
        con.register("t", df)
        ctx["input"] = "pandas (registered)"
    return con


def _check(frame, n_col: str, s_col: str) -> dict[str, Any]:
    return {"groups": int(len(frame)), "rows_kept": int(frame[n_col].sum()), "value_sum": float(frame[s_col].sum())}


def setup_pandas(df, ctx):
    def run():
        out = df.groupby("category")["value"].agg(["count", "sum", "mean"])
        return _check(out, "count", "sum")

    return run


def setup_polars(df, ctx):
    import polars as pl  # noqa: PLC0415

    pf = pl.from_pandas(df)

    def run():
        out = pf.group_by("category").agg(
            pl.len().alias("n"), pl.col("value").sum().alias("s"), pl.col("value").mean().alias("m")
        )
        return _check(out.to_pandas(), "n", "s")

    return run


def _sql_setup(sql: str, params: list[Any] | None):
    def setup(df, ctx):
        con = _duckdb_con(df, ctx)

        def run():
            out = con.execute(sql, params or []).df()
            return _check(out, "n", "s")

        return run

    return setup


def _metadata():
    from dpkit.analytics import Categorical, Metadata, Numeric  # noqa: PLC0415

    return Metadata(columns={"value": Numeric(LOWER, UPPER), "category": Categorical(tuple(range(N_CATEGORIES)))})


def _aggregates():
    import dpkit as dp  # noqa: PLC0415

    return [dp.analytics.Count(), dp.analytics.Sum("value"), dp.analytics.Mean("value")]


def _session(data, **kw):
    import dpkit as dp  # noqa: PLC0415

    return dp.Session(
        data,
        privacy_unit="user_id",
        budget=dp.Budget(epsilon=1e9),
        metadata=_metadata(),
        max_groups=MAX_GROUPS,
        max_rows=MAX_ROWS,
        **kw,
    )


def dpkit_plan(session):
    """The AggregationPlan dpkit builds for query (f) (through the session's own planner)."""
    return _plan.plan_of(session.group_by("category"), _aggregates(), epsilon=EPSILON, salt=SALT_G >> 2)


def _duckdb_kw() -> dict[str, Any]:
    """dpkit's own out-of-core keywords (memory_limit=, temp_directory=), when asked for."""
    kw = {}
    if OPTS.get("duckdb_memory_limit"):
        kw["memory_limit"] = OPTS["duckdb_memory_limit"]
    if OPTS.get("duckdb_temp_dir"):
        kw["temp_directory"] = OPTS["duckdb_temp_dir"]
    return kw


def setup_dpkit_sql(df, ctx):
    from dpkit.analytics.engines.duckdb import DuckDBEngine  # noqa: PLC0415

    con = _duckdb_con(df, ctx)
    # the engine over the same input: the frame, or its own view over the Parquet directory
    engine = DuckDBEngine(Path(OPTS["parquet"]) if OPTS.get("duckdb_parquet") else df, connection=con)
    plan = dpkit_plan(_session(None, engine=engine))
    sql, params = engine.aggregate_sql(plan)
    ctx["sql"] = sql
    plain = next(s for s in plan.sums if not s.square and s.center == 0.0)  # Sum("value"): uncentred

    def run():
        out = con.execute(sql, params).df()
        chk = _check(out, "rows", plain.name)
        chk["value_sum"] *= plain.unit  # the engine's sums are in grid units
        return chk

    return run


def _noisy_check(t) -> dict[str, Any]:
    return {
        "groups": int(len(t)),
        "rows_kept": int(round(float(t["count"].sum()))),
        "value_sum": float(t["sum_value"].sum()),
        "noisy": True,
    }


def setup_dpkit(df, ctx):
    import duckdb  # noqa: PLC0415

    import dpkit as dp  # noqa: PLC0415
    from dpkit.analytics.engines.duckdb import DuckDBEngine  # noqa: PLC0415

    kw = _duckdb_kw()
    if OPTS.get("duckdb_parquet"):
        # dpkit reads the directory itself, with its own out-of-core keywords; its connection has
        # DuckDB's default thread count (the machine's cores, 2 here).
        directory = OPTS["parquet"]
        ctx["input"] = "parquet (Session.from_parquet(dir))"
        ctx["duckdb_settings"] = {
            "threads": duckdb.connect().execute("SELECT current_setting('threads')").fetchone()[0],
            "memory_limit": kw.get("memory_limit", "default"),
            "temp_directory": kw.get("temp_directory", "default"),
            "via": "Session.from_parquet keywords",
        }

        def make():
            return dp.Session.from_parquet(
                directory,
                privacy_unit="user_id",
                budget=dp.Budget(epsilon=1e9),
                metadata=_metadata(),
                max_groups=MAX_GROUPS,
                max_rows=MAX_ROWS,
                **kw,
            )
    else:
        from dpkit.errors import InvalidParameterError  # noqa: PLC0415

        con = duckdb.connect()
        con.execute(f"SET threads = {THREADS}")
        ctx["input"] = "pandas (DuckDBEngine(df))"
        via = "DuckDBEngine keywords"
        try:
            DuckDBEngine(df, connection=con, **kw)
        except (TypeError, InvalidParameterError):  # keywords missing, or refused on a caller's connection
            _duckdb_settings(con, {})
            kw, via = {}, "SET on the engine's connection by the bench"
        ctx["duckdb_settings"] = {
            "threads": THREADS,
            "memory_limit": OPTS.get("duckdb_memory_limit") or "default",
            "temp_directory": OPTS.get("duckdb_temp_dir") or "default",
            "via": via,
        }

        def make():
            # Session(df) with the engine on a 2-thread connection: the same path as Session(df).
            return _session(None, engine=DuckDBEngine(df, connection=con, **kw))

    def run():
        r = make().group_by("category").aggregate(_aggregates(), epsilon=EPSILON)
        return _noisy_check(r.table)

    return run


def setup_pipelinedp(df, ctx):
    import pipeline_dp  # noqa: PLC0415

    rows = list(zip(df["user_id"].tolist(), df["category"].tolist(), df["value"].tolist(), strict=True))
    M = pipeline_dp.Metrics

    def run():
        budget = pipeline_dp.NaiveBudgetAccountant(total_epsilon=EPSILON, total_delta=0)
        engine = pipeline_dp.DPEngine(budget, pipeline_dp.LocalBackend())
        params = pipeline_dp.AggregateParams(
            noise_kind=pipeline_dp.NoiseKind.LAPLACE,
            metrics=[M.COUNT, M.SUM, M.MEAN],
            max_partitions_contributed=MAX_GROUPS,
            max_contributions_per_partition=MAX_ROWS,
            min_value=LOWER,
            max_value=UPPER,
        )
        ex = pipeline_dp.DataExtractors(
            privacy_id_extractor=lambda r: r[0], partition_extractor=lambda r: r[1], value_extractor=lambda r: r[2]
        )
        res = engine.aggregate(rows, params, ex, public_partitions=list(range(N_CATEGORIES)))
        budget.compute_budgets()
        out = list(res)
        return {
            "groups": len(out),
            "rows_kept": int(round(sum(m.count for _, m in out))),
            "value_sum": float(sum(m.sum for _, m in out)),
            "noisy": True,
        }

    return run


def _spark_frame(df, ctx):
    """The SparkSession (``--spark-master``, ``--driver-memory``) and the input DataFrame shared by
    (h)–(j): ``spark.read.parquet(dir)`` with ``--parquet``, else the pandas frame converted
    through Arrow and cached."""
    from pyspark.sql import SparkSession  # noqa: PLC0415

    master = OPTS.get("spark_master") or f"local[{THREADS}]"
    spark = (
        SparkSession.builder.master(master)
        .appName("dpkit-bench-groupby")
        .config("spark.driver.memory", OPTS.get("driver_memory") or "1g")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    if SAMPLER is not None and master.startswith("spark://"):
        SAMPLER.app_id = spark.sparkContext.applicationId
    ctx.update(
        spark=spark.version,
        spark_master=master,
        driver_memory=spark.conf.get("spark.driver.memory"),
        spark_default_parallelism=spark.sparkContext.defaultParallelism,
    )
    if OPTS.get("parquet"):
        sdf = spark.read.parquet(OPTS["parquet"])
        ctx["input"] = "parquet (spark.read.parquet(dir), not cached)"
    else:
        sdf = spark.createDataFrame(df).cache()
        sdf.count()
        ctx["input"] = "pandas (createDataFrame, cached)"
    ctx["spark_partitions"] = sdf.rdd.getNumPartitions()
    return sdf


def _need_spark_engine() -> None:
    import importlib.util  # noqa: PLC0415

    if importlib.util.find_spec("dpkit.analytics.engines.spark") is None:
        raise _report.NotAvailable("dpkit.analytics.engines.spark does not exist")


def setup_dpkit_spark(df, ctx):
    _need_spark_engine()
    sdf = _spark_frame(df, ctx)

    def run():
        s = _session(sdf, engine="spark")
        r = s.group_by("category").aggregate(_aggregates(), epsilon=EPSILON)
        return _noisy_check(r.table)

    return run


def setup_spark_hand(df, ctx):
    """(i): the bounding of (e) / dpkit's SparkEngine._base, hand-written with the DataFrame API."""
    from pyspark.sql import Window  # noqa: PLC0415
    from pyspark.sql import functions as F  # noqa: PLC0415

    sdf = _spark_frame(df, ctx)
    keys = [F.lit(k) for k in range(N_CATEGORIES)]

    def run():
        base = sdf.where(F.col("user_id").isNotNull() & F.col("category").isin(*keys)).select(
            F.col("user_id").alias("u"),
            F.col("category").alias("g"),
            F.least(F.greatest(F.col("value"), F.lit(LOWER)), F.lit(UPPER)).alias("x"),
        )
        # the keyed hashes, once (xxhash64 with the key as the last input, as dpkit's portable=False)
        w = base.select(
            "*", F.xxhash64("u", "g", F.lit(SALT_G)).alias("gh"), F.xxhash64("u", "g", "x", F.lit(SALT_R)).alias("rh")
        )
        by_group = Window.partitionBy("u").orderBy("gh", "g")
        by_row = Window.partitionBy("u").orderBy("gh", "g", "rh")
        r = w.select(
            "g",
            "x",
            (F.row_number().over(by_row) - F.rank().over(by_group) + F.lit(1)).alias("ri"),
            F.dense_rank().over(by_group).alias("gi"),
        ).where((F.col("gi") <= MAX_GROUPS) & (F.col("ri") <= MAX_ROWS))
        out = r.groupBy("g").agg(F.count(F.lit(1)).alias("n"), F.sum("x").alias("s"), F.avg("x").alias("m")).toPandas()
        return _check(out, "n", "s")

    return run


MEDIAN_SQL = "SELECT category, MEDIAN(value) AS median_value FROM data GROUP BY category"


def setup_dpkit_spark_median(df, ctx):
    _need_spark_engine()
    sdf = _spark_frame(df, ctx)
    ctx["sql"] = MEDIAN_SQL

    def run():
        s = _session(sdf, engine="spark")
        t = s.sql(MEDIAN_SQL, epsilon=EPSILON).table
        med = t["median_value"].astype(float)
        return {
            "groups": int(len(t)),
            "rows_kept": None,
            "median_min": float(med.min()),
            "median_mean": float(med.mean()),
            "median_max": float(med.max()),
            "noisy": True,
        }

    return run


SETUPS: dict[str, Callable[..., Callable[[], dict[str, Any]]]] = {
    "pandas": setup_pandas,
    "polars": setup_polars,
    "duckdb": _sql_setup(SQL_PLAIN, None),
    "duckdb-textbook": _sql_setup(SQL_TEXTBOOK, [SALT_G, SALT_R]),
    "duckdb-onewindow": _sql_setup(SQL_ONE_WINDOW, [SALT_G, SALT_R]),
    "dpkit-sql": setup_dpkit_sql,
    "dpkit": setup_dpkit,
    "pipelinedp": setup_pipelinedp,
    "dpkit-spark": setup_dpkit_spark,
    "spark-hand": setup_spark_hand,
    "dpkit-spark-median": setup_dpkit_spark_median,
}

IMPORTS = {
    "polars": "polars",
    "pipelinedp": "pipeline_dp",
    "dpkit-spark": "pyspark",
    "spark-hand": "pyspark",
    "dpkit-spark-median": "pyspark",
}


def needs_frame(name: str, opts: dict[str, Any]) -> bool:
    """Whether the contender reads the pandas frame (not when it reads the Parquet directory)."""
    if name in SPARK and opts.get("parquet"):
        return False
    return not (name in DUCKDB and opts.get("duckdb_parquet"))


def child(name: str, data: Path, repeats: int, opts: dict[str, Any] | None = None) -> dict[str, Any]:
    """Runs one contender in this (fresh) process and returns its measurements."""
    global SAMPLER  # noqa: PLW0603
    OPTS.clear()
    OPTS.update(opts or {})
    load_1min = os.getloadavg()[0]
    df = load_frame(data) if needs_frame(name, OPTS) else None
    if name.startswith(("duckdb", "dpkit")):
        import duckdb  # noqa: F401, PLC0415
    if name.startswith("dpkit"):
        import dpkit  # noqa: F401, PLC0415
    if name in IMPORTS:
        try:
            __import__(IMPORTS[name])
        except ImportError as exc:
            return {"status": f"n/a ({IMPORTS[name]} not installed: {exc})"}
    gc.collect()
    exact = reset_peak()
    base_rss = _status_mib("VmRSS")
    base_hwm = _status_mib("VmHWM")
    ctx: dict[str, Any] = {}
    with ChildSampler() as jvm:
        SAMPLER = jvm
        t0 = time.perf_counter()
        try:
            run = SETUPS[name](df, ctx)
        except _report.NotAvailable as exc:
            return {"status": f"n/a ({exc})"}
        setup_s = time.perf_counter() - t0
        times, check = [], None
        for _ in range(repeats):
            t0 = time.perf_counter()
            check = run()
            times.append(time.perf_counter() - t0)
    peak = _status_mib("VmHWM")
    out = {
        "status": "ok",
        "seconds": min(times),
        "all_seconds": times,
        "runs": repeats,
        "setup_seconds": setup_s,
        "peak_rss_delta_mib": (peak - (base_rss if exact else base_hwm)) + jvm.peak + jvm.executors_peak,
        "peak_rss_mib": peak,
        "base_rss_mib": base_rss,
        "jvm_peak_rss_mib": jvm.peak or None,
        "executors_peak_rss_mib": jvm.executors_peak or None,
        "python_peak_rss_mib": peak,
        "peak_method": "VmHWM after clear_refs" if exact else "VmHWM delta (clear_refs unavailable: a lower bound)",
        "input_frame": df is not None,
        "load_1min_at_start": load_1min,
        "check": check,
    }
    out.update({k: v for k, v in ctx.items()})
    return out


# ----------------------------------------------------------------------------- parent


def run_child(
    name: str, data: Path, repeats: int, timeout: float, opts: dict[str, Any] | None = None
) -> dict[str, Any]:
    env = dict(os.environ, POLARS_MAX_THREADS=str(THREADS), PYTHONHASHSEED="0")
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--child",
        name,
        "--data",
        str(data),
        "--repeats",
        str(repeats),
        "--child-opts",
        json.dumps(opts or {}),
    ]
    t0 = time.perf_counter()
    # Own process group, so that a timeout also ends what the contender started (Spark's JVM).
    p = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True
    )
    try:
        stdout, stderr = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        return {"status": f"timeout (> {timeout:.0f} s)", "wall_seconds": time.perf_counter() - t0}
    for line in stdout.splitlines():
        if line.startswith("RESULT "):
            r = json.loads(line[7:])
            r["wall_seconds"] = time.perf_counter() - t0
            return r
    tail = (stderr or stdout).strip().splitlines()[-3:]
    return {"status": f"error (exit {p.returncode}): {' / '.join(tail)[:300]}"}


HEADERS = [
    "contender",
    "rows",
    "runs",
    "query s",
    "M rows/s",
    "× pandas",
    "setup s",
    "peak RSS Δ MiB",
    "py / JVM peak MiB",
    "groups",
    "rows kept",
]
LEFT = ["contender"]
NOTES = [
    "query s: best of the runs (wall clock), the input already in memory (or, read from Parquet, the files read by the query itself); setup s: building the contender's own input (polars frame, DuckDB registration, PipelineDP's list of row tuples, Spark's session and DataFrame).",
    "peak RSS Δ: the contender subprocess's peak resident set size during setup and runs, above its size with its input loaded (the pandas DataFrame, 24 bytes a row, unless it reads Parquet); Spark adds its JVM's sampled peak (and on a cluster its executors'). py / JVM peak: the absolute peaks of the Python process (VmHWM) and of the driver JVM (sampled).",
    "(d), (e) hand-written SQL with the same keyed hashes: they keep exactly the same rows. (e') is the statement dpkit generates (DuckDBEngine.aggregate_sql): (e) plus clipping and integer quantisation of the sums.",
    "(i) is (e) hand-written with the Spark DataFrame API (keyed xxhash64, one window); it keeps other rows than (h) (dpkit draws its own key per query and hashes quantised values), the same number up to noise.",
    "(f), (g), (h), (j) add noise (ε = 1, Laplace, public keys 0..99): their rows-kept column is a noisy count; (j) releases medians only.",
    "DuckDB with 2 threads, polars with POLARS_MAX_THREADS=2; 2-core machine, compare rows from the same run only.",
]


def run_notes(opts: dict[str, Any], names: list[str]) -> list[str]:
    """What this run's inputs and settings were (stored in the results file with the rows)."""
    notes = []
    if any(n in SPARK for n in names):
        notes.append(
            f"Spark: master {opts.get('spark_master')}, driver memory {opts.get('driver_memory')}; input: "
            + (
                "spark.read.parquet of the Parquet directory (not cached)."
                if opts.get("parquet")
                else "the pandas frame through createDataFrame (Arrow), cached."
            )
        )
    if any(n in DUCKDB for n in names):
        notes.append(
            "DuckDB input: "
            + (
                "the Parquet directory (read_parquet; dpkit: Session.from_parquet(dir))"
                if opts.get("duckdb_parquet")
                else "the in-memory pandas frame"
            )
            + f"; memory_limit {opts.get('duckdb_memory_limit') or 'default (80% of RAM)'}, temp_directory "
            + f"{opts.get('duckdb_temp_dir') or 'default'}."
        )
    if opts.get("parquet"):
        notes.append(f"Parquet: {opts.get('parquet_files')} part files (pyarrow, snappy) in {opts.get('parquet')}.")
    return notes


def ratio_notes(rows: list[dict[str, Any]]) -> list[str]:
    """dpkit / the hand-written bounding, on each engine, when both ran."""
    by = {r["name"]: r for r in rows if r["status"] == "ok" and not r.get("fallback")}
    out = []
    for mine, hand, what in (
        ("dpkit", "duckdb-onewindow", "DuckDB: (f) dpkit end to end / (e) hand-written SQL"),
        ("dpkit-spark", "spark-hand", "Spark: (h) dpkit end to end / (i) hand-written DataFrame API"),
    ):
        if mine in by and hand in by:
            a, b = by[mine]["seconds"], by[hand]["seconds"]
            out.append(f"{what}: {a:.3g} s / {b:.3g} s = **{a / b:.2f}×**.")
    return out


def _num(x: float) -> str:
    return f"{x:,.0f}" if x >= 1000 else f"{x:.3g}"


def cells(r: dict[str, Any], pandas_s: float | None) -> list[str]:
    label = CONTENDERS[r["name"]][0] + (f" — on {r['rows']:,} rows" if r.get("fallback") else "")
    if r["status"] != "ok":
        return [label, f"{r['rows']:,}", "—", r["status"], "—", "—", "—", "—", "—", "—", "—"]
    s = r["seconds"]
    chk = r.get("check") or {}
    if chk.get("rows_kept") is None and "median_mean" in chk:
        kept = f"medians {chk['median_min']:.1f}–{chk['median_max']:.1f} (noisy)"
    else:
        kept = f"{chk.get('rows_kept', 0):,}" + (" (noisy)" if chk.get("noisy") else "")
    py = r.get("python_peak_rss_mib", r.get("peak_rss_mib"))
    jvm = r.get("jvm_peak_rss_mib")
    peaks = (f"{py:,.0f}" if py is not None else "—") + (f" / {jvm:,.0f}" if jvm else "")
    if r.get("executors_peak_rss_mib"):
        peaks += f" (+ executors {r['executors_peak_rss_mib']:,.0f})"
    times = (
        _num(s / pandas_s * (r.get("full_rows", r["rows"]) / r["rows"] if r.get("fallback") else 1))
        if pandas_s
        else "—"
    )
    setup = r["setup_seconds"]
    return [
        label,
        f"{r['rows']:,}",
        str(r["runs"]),
        _num(s),
        f"{r['rows'] / s / 1e6:.3g}",
        times + ("*" if r.get("fallback") else ""),
        f"{setup:.3g}" if setup >= 0.001 else "< 0.001",
        f"{r['peak_rss_delta_mib']:,.0f}",
        peaks,
        str(chk.get("groups", "—")),
        kept,
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--fallback-rows", type=int, default=1_000_000, help="rows for a slow contender that timed out")
    ap.add_argument("--repeats", type=int, default=3, help="best-of for the fast contenders")
    ap.add_argument(
        "--slow-timeout",
        type=float,
        default=720.0,
        help="seconds for PipelineDP / Spark on --rows (load + setup + 1 run)",
    )
    ap.add_argument("--fast-timeout", type=float, default=600.0)
    ap.add_argument("--only", default=",".join(CONTENDERS), help="comma-separated subset of: " + ",".join(CONTENDERS))
    ap.add_argument(
        "--cache",
        type=Path,
        default=Path(tempfile.gettempdir()) / "dpkit-bench",
        help="where the generated data is cached (.npy)",
    )
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--markdown", action="store_true", help="(Markdown is always printed on stdout; kept for symmetry)")
    ap.add_argument(
        "--render", type=Path, metavar="JSON", help="print the tables of an earlier results file; run nothing"
    )
    ap.add_argument(
        "--parquet",
        action="store_true",
        help="also write the data as a Parquet directory (cached) and have the Spark contenders read it",
    )
    ap.add_argument("--parquet-files", type=int, default=8, help="part files in the Parquet directory")
    ap.add_argument(
        "--duckdb-parquet",
        action="store_true",
        help="the DuckDB contenders read the Parquet directory too (implies --parquet)",
    )
    ap.add_argument(
        "--duckdb-memory-limit", metavar="SIZE", help="DuckDB's memory_limit for the DuckDB contenders, e.g. 4GB"
    )
    ap.add_argument(
        "--duckdb-temp-dir", metavar="DIR", help="DuckDB's temp_directory (where it spills) for the DuckDB contenders"
    )
    ap.add_argument(
        "--spark-master",
        default=f"local[{THREADS}]",
        help="the Spark contenders' master URL (local[2], spark://host:port)",
    )
    ap.add_argument("--driver-memory", default="1g", help="spark.driver.memory of the Spark contenders")
    ap.add_argument("--spark-repeats", type=int, default=1, help="runs of each Spark query (best of)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--data", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--child-opts", default="{}", help=argparse.SUPPRESS)
    _smoke.add_flag(ap)
    args = ap.parse_args(argv)

    if args.render:
        saved = json.loads(args.render.read_text())
        render(saved["meta"], saved["rows"])
        return 0
    if args.child:
        r = child(args.child, args.data, args.repeats, json.loads(args.child_opts))
        print("RESULT " + json.dumps(r), flush=True)
        return 0

    names = [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = set(names) - set(CONTENDERS)
    if unknown:
        ap.error(f"unknown contenders {sorted(unknown)}; choose from {', '.join(CONTENDERS)}")
    if args.smoke:
        args.rows, args.repeats, args.out, args.cache = 20_000, 1, _smoke.out_path("groupby.json"), _smoke.temp_dir()
        for name in [n for n in names if n in SPARK]:
            _smoke.skip(name, "a Spark session takes longer to start than a whole smoke run")
            names.remove(name)
        names = [n for n in names if n not in IMPORTS or _smoke.present([n], IMPORTS)]
    load_start = os.getloadavg()
    started = _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")
    print(
        f"[bench] start {started}, load average {load_start[0]:.2f} {load_start[1]:.2f} {load_start[2]:.2f}",
        file=sys.stderr,
        flush=True,
    )
    parquet = args.parquet or args.duckdb_parquet
    if args.duckdb_temp_dir:
        Path(args.duckdb_temp_dir).mkdir(parents=True, exist_ok=True)

    def options(d: Path) -> dict[str, Any]:
        return {
            "parquet": str(ensure_parquet(d, args.parquet_files)) if parquet else None,
            "parquet_files": args.parquet_files,
            "duckdb_parquet": args.duckdb_parquet,
            "duckdb_memory_limit": args.duckdb_memory_limit,
            "duckdb_temp_dir": args.duckdb_temp_dir,
            "spark_master": args.spark_master,
            "driver_memory": args.driver_memory,
        }

    data = ensure_cache(args.cache, args.rows)
    opts = options(data)
    n_users = int(np.load(data / "user_id.npy", mmap_mode="r").max()) + 1  # users 0..n-1, each with at least one row
    rows: list[dict[str, Any]] = []
    for name in names:
        label, slow = CONTENDERS[name]
        repeats = args.spark_repeats if name in SPARK else 1 if slow else args.repeats
        print(f"[bench] {label} on {args.rows:,} rows (load {os.getloadavg()[0]:.2f})", file=sys.stderr, flush=True)
        if args.smoke:  # in this process: a child's start-up would be most of a smoke run's time
            r = child(name, data, repeats, opts)
        else:
            r = run_child(name, data, repeats, args.slow_timeout if slow else args.fast_timeout, opts)
        r.update(name=name, label=label, rows=args.rows, fallback=False)
        if slow and r["status"].startswith("timeout") and args.fallback_rows < args.rows:
            rows.append(r)
            print(f"[bench]   {r['status']}; rerunning on {args.fallback_rows:,} rows", file=sys.stderr, flush=True)
            small = ensure_cache(args.cache, args.fallback_rows)
            r = run_child(name, small, repeats, args.slow_timeout, options(small))
            r.update(name=name, label=label, rows=args.fallback_rows, fallback=True, full_rows=args.rows)
        print(
            f"[bench]   {r['status']}"
            + (f": {r['seconds']:.3g} s, peak Δ {r['peak_rss_delta_mib']:,.0f} MiB" if r["status"] == "ok" else ""),
            file=sys.stderr,
            flush=True,
        )
        rows.append(r)

    by = {r["name"]: r for r in rows if r["status"] == "ok" and not r["fallback"]}
    if "duckdb-textbook" in by and "duckdb-onewindow" in by:
        a, b = by["duckdb-textbook"]["check"], by["duckdb-onewindow"]["check"]
        same = (
            a["groups"] == b["groups"]
            and a["rows_kept"] == b["rows_kept"]
            and abs(a["value_sum"] - b["value_sum"]) <= 1e-9 * abs(a["value_sum"])
        )
        print(
            f"[bench] (d) and (e) keep the same rows: {same} ({a['rows_kept']:,} vs {b['rows_kept']:,})",
            file=sys.stderr,
        )

    import duckdb  # noqa: PLC0415

    meta = {
        "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "started": started,
        "load_average_at_start": {"1min": load_start[0], "5min": load_start[1], "15min": load_start[2]},
        "command": " ".join([Path(sys.executable).name, *sys.argv]) if argv is None else " ".join(argv),
        "options": opts,
        "spark_repeats": args.spark_repeats,
        "rows": args.rows,
        "users": n_users,
        "rows_per_user": "uniform 1..20 (last user truncated)",
        "categories": N_CATEGORIES,
        "value": "uniform [0, 100]",
        "seed": SEED,
        "repeats": args.repeats,
        "max_groups": MAX_GROUPS,
        "max_rows": MAX_ROWS,
        "epsilon": EPSILON,
        "noise": "laplace (dpkit: geometric on the integer grid)",
        "threads": THREADS,
        "duckdb_default_threads": duckdb.connect().execute("SELECT current_setting('threads')").fetchone()[0],
        "python": platform.python_version(),
        "numpy": np.__version__,
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "versions": {
            d: _report.version(d)
            for d in ("dpkit", "duckdb", "pandas", "polars", "pipeline-dp", "python-dp", "pyspark", "opendp")
        },
        "timer": "time.perf_counter wall clock of the query alone; best of `repeats` for fast contenders, one run for PipelineDP, `spark_repeats` for Spark",
        "memory": "peak RSS (VmHWM, reset via /proc/self/clear_refs) of the contender's subprocess minus its RSS after loading its input; + JVM peak RSS for Spark (+ executors on a cluster)",
        "sql": {
            "plain": SQL_PLAIN,
            "textbook": SQL_TEXTBOOK,
            "one_window": SQL_ONE_WINDOW,
            "dpkit": next((r.get("sql") for r in rows if r["name"] == "dpkit-sql" and r.get("sql")), None),
        },
        "notes": NOTES + run_notes(opts, names),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2, ensure_ascii=False) + "\n")
    print(f"[bench] wrote {args.out.relative_to(REPO) if args.out.is_relative_to(REPO) else args.out}", file=sys.stderr)
    render(meta, rows)
    if args.smoke:
        return _smoke.finish(
            f"{r['name']}: {r['status']}" for r in rows if r["name"].startswith("dpkit") and r["status"] != "ok"
        )
    return 0


def render(meta: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    """The rich table on stderr and the Markdown table on stdout."""
    pandas_s = next(
        (r["seconds"] for r in rows if r["name"] == "pandas" and r["status"] == "ok" and not r["fallback"]), None
    )
    table = [cells(r, pandas_s) for r in rows]
    notes = list(meta.get("notes", NOTES)) + ratio_notes(rows)
    notes += (
        ["*: measured on the fallback row count; × pandas scaled linearly to the full row count."]
        if any(r["fallback"] for r in rows)
        else []
    )
    load = meta.get("load_average_at_start")
    title = (
        f"Group-by count/sum/mean on {meta['rows']:,} rows ({meta['users']:,} users), {meta.get('started', meta['date'])}"
        + (f" (load {load['1min']:.2f})" if load else "")
        + f", {meta['cpu_count']} CPUs"
    )
    _report.print_table(
        title,
        HEADERS,
        LEFT,
        ((c, 0, r["name"].startswith("dpkit")) for c, r in zip(table, rows, strict=True)),
        notes,
        to_stderr=True,
        width=220,
    )
    print(_report.markdown(title, HEADERS, LEFT, table, notes))


if __name__ == "__main__":
    sys.exit(main())
