"""Scale benchmark: private group-bys and medians from Parquet, dpkit against the same bounding
written by hand, on DuckDB (with a memory limit: out of core) and on Spark.

Not a test. Run it from the benchmark environment:

    .venv-bench/bin/python benchmarks/bench_scale.py --rows 10000000 [--engines duckdb,spark]
        [--memory-limit 4GB] [--spark-master local[2]] [--driver-memory 1g] [--out FILE]

Data (numpy, seeded): ``--rows`` rows from about rows/10.5 users with 1–20 rows each, ``category``
uniform in 0..99, ``value`` uniform in [0, 100], written once as a directory of 8 Parquet files
(cached under ``--cache``). Every contender reads that directory and runs in its own subprocess,
so its peak resident memory (``ru_maxrss``) is its own; for Spark the driver JVM's peak RSS is
sampled too (psutil, every 50 ms).

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

Timing: wall clock of the query alone (the session or DataFrame built first), one run each.
Results: JSON (``--out``) and a Markdown table on stdout.
"""

from __future__ import annotations

import argparse
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

import numpy as np

SEED = 20261126
CONTENDERS = ("dpkit-duckdb", "hand-duckdb", "dpkit-spark", "hand-spark", "dpkit-spark-median")
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
    """The peak RSS of this process's child JVMs, sampled every 50 ms."""

    def __init__(self) -> None:
        self.peak = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        import psutil

        me = psutil.Process()
        while not self._stop.is_set():
            try:
                rss = sum(c.memory_info().rss for c in me.children(recursive=True))
                self.peak = max(self.peak, rss / 2**20)
            except psutil.Error:
                pass
            time.sleep(0.05)

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return self.peak


def _metadata() -> Any:
    from dpkit.analytics import Categorical, Metadata, Numeric

    return Metadata(columns={"category": Categorical(tuple(range(100))), "value": Numeric(0.0, 100.0)})


#: The session's unit and contribution bounds (public keys come from the metadata).
BOUNDS = {"privacy_unit": "user_id", "max_groups": 5, "max_rows": 2}


def _spark(master: str, driver_memory: str) -> Any:
    from pyspark.sql import SparkSession

    from dpkit.analytics.engines.spark import _ensure_java

    _ensure_java()
    return (
        SparkSession.builder.master(master)
        .appName("dpkit bench_scale")
        .config("spark.driver.memory", driver_memory)
        .config("spark.sql.shuffle.partitions", "8")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .getOrCreate()
    )


def child(name: str, data: Path, args: argparse.Namespace) -> dict[str, Any]:
    import dpkit as dp
    from dpkit.analytics import Count, Mean, Sum

    files = sorted(str(p) for p in data.glob("*.parquet"))
    jvm = _JvmPeak() if "spark" in name else None
    out: dict[str, Any] = {"name": name}
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
            df = spark.read.parquet(str(data))
            if name == "hand-spark":
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
        out["jvm_peak_mib"] = jvm.stop()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--engines", default="duckdb,spark")
    ap.add_argument("--only", default=",".join(CONTENDERS))
    ap.add_argument("--memory-limit", default="4GB")
    ap.add_argument("--spark-master", default="local[2]")
    ap.add_argument("--driver-memory", default="1g")
    ap.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "dpkit-bench")
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "scale.json")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--data", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.data, args)))
        return 0
    engines = set(args.engines.split(","))
    names = [n for n in args.only.split(",") if n.split("-")[1] in engines]
    t0 = time.perf_counter()
    data = write_data(args.rows, args.cache)
    print(f"[bench] data: {args.rows:,} rows in {data} ({time.perf_counter() - t0:.0f} s)", file=sys.stderr)
    rows: list[dict[str, Any]] = []
    for name in names:
        load = os.getloadavg()[0]
        print(f"[bench] {name} (load {load:.2f})", file=sys.stderr, flush=True)
        cmd = [sys.executable, __file__, "--child", name, "--data", str(data), "--memory-limit", args.memory_limit,
               "--spark-master", args.spark_master, "--driver-memory", args.driver_memory]  # fmt: skip
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, check=False)
            got = (
                json.loads(done.stdout.strip().splitlines()[-1])
                if done.returncode == 0
                else {"name": name, "error": done.stderr[-800:]}
            )
        except subprocess.TimeoutExpired:
            got = {"name": name, "error": f"timed out after {args.timeout:.0f} s"}
        got["load"] = load
        rows.append(got)
        print(f"[bench]   {got}", file=sys.stderr, flush=True)
    meta = {"rows": args.rows, "memory_limit": args.memory_limit, "spark_master": args.spark_master,
            "driver_memory": args.driver_memory, "when": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
            "cpus": os.cpu_count()}  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    by = {r["name"]: r for r in rows}
    print(f"| contender | seconds | Python peak MiB | JVM peak MiB | load |  ({args.rows:,} rows, {meta['when']})")
    print("|---|--:|--:|--:|--:|")
    for r in rows:
        if "error" in r:
            print(f"| {r['name']} | error: {r['error'][-120:]!r} | | | {r['load']:.2f} |")
            continue
        jvm = f"{r['jvm_peak_mib']:,.0f}" if "jvm_peak_mib" in r else "—"
        print(f"| {r['name']} | {r['seconds']:.2f} | {r['python_peak_mib']:,.0f} | {jvm} | {r['load']:.2f} |")
    for engine in ("duckdb", "spark"):
        a, b = by.get(f"dpkit-{engine}", {}), by.get(f"hand-{engine}", {})
        if "seconds" in a and "seconds" in b:
            print(f"\ndpkit / hand-written on {engine}: {a['seconds'] / b['seconds']:.2f}×")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
