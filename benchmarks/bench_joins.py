"""Join benchmark: a private table joined with a public one, and two private tables joined on the
privacy unit, dpkit against the same bounding written by hand in DuckDB SQL, and Tumult Analytics.

Not a test. Run it from the benchmark environment:

    .venv-bench/bin/python benchmarks/bench_joins.py --rows 10000000
        [--only dpkit-duckdb,hand-duckdb,dpkit-spark,hand-spark,tumult-spark] [--workloads public,private]
        [--repeats 3] [--memory-limit 4GB] [--spark-master local[2]] [--driver-memory 2g]
        [--tumult-python .venv-tumult/bin/python] [--timeout 1200] [--out FILE]

Data (numpy, seeded, written once as one Parquet file per table under ``--cache``):

* ``visits``: ``--rows`` rows; ``patient_id`` uniform over rows/10 patients (about 10 visits
  each), ``postcode`` in 0..999 (a patient's home postcode for 80 % of the visits, any postcode
  for the rest), ``cost`` uniform in [0, 5000];
* ``prescriptions``: ``--rows`` rows over the same patients; ``drug`` in 0..99, ``dose`` uniform
  in [0, 100];
* ``regions`` (public): the 1,000 postcodes, each in one of 20 regions.

Workloads (max_groups = 1, max_rows = 10 per patient on the joined rows, ε = 1):

* ``public``: ``visits JOIN regions USING (postcode)``, count and sum of cost by region (the keys
  are the public table's regions; it has at most one row per postcode);
* ``private``: ``visits JOIN prescriptions USING (patient_id)``, each side first truncated to
  k = 5 rows per patient (so at most 25 joined rows per patient), then the count and the sum of
  dose over the joined rows, at most 10 per patient.

Contenders, each in its own subprocess (its peak resident memory, ``ru_maxrss``, is its own; for
Spark the driver JVM's peak RSS is sampled too, as ``bench_scale.py`` does):

* ``dpkit-duckdb``: ``dp.Session({"visits": …, "prescriptions": …, "regions": …}, metadata=
  DatasetMetadata(...), budget=…)`` over the three Parquet files, then
  ``query("visits").join("regions", on="postcode").group_by("region").aggregate([Count(),
  Sum("cost")])`` or ``query("visits").join("prescriptions", on="patient_id").aggregate([Count(),
  Sum("dose")])``;
* ``hand-duckdb``: the same bounding hand-written in DuckDB SQL over ``read_parquet`` — for the
  public join, the public table cut to one row per postcode, the join, then one window per patient
  ordered by (keyed group hash, group, keyed row hash) keeping 1 group and 10 rows; for the
  private join, ``row_number() OVER (PARTITION BY patient_id ORDER BY hash(…)) <= 5`` on each
  side, the join, then ``row_number()`` per patient ``<= 10`` — exact (no clipping, no noise);
* ``dpkit-spark`` / ``hand-spark``: the same on Spark (``spark.read.parquet``), the hand-written
  one with the DataFrame API and xxhash64 priorities;
* ``tumult-spark`` (only with ``--tumult-python``): Tumult Analytics 0.21 in its own virtualenv
  (``benchmarks/setup_tumult.sh``), on its own Spark. A session of both private tables in one ID
  space (``AddRowsWithID("patient_id", "patients")``) and the public table; public:
  ``join_public("regions")``, ``MaxGroupsPerID("region", 1)``, ``MaxRowsPerGroupPerID("region",
  10)``; private: each side ``enforce(MaxRowsPerID(5))``, ``join_private`` on ``patient_id``, then
  ``MaxRowsPerID(10)``. The bounded table is a cached view; the count and the sum are two queries
  of ε = 1/2 each (a Tumult query answers one aggregation); the time covers the view and both.

Timing: wall clock of the query alone (the session built first: its time is recorded apart), the
median of ``--repeats`` runs in one process for the DuckDB contenders, one run on Spark. Every
contender gets ``--timeout`` seconds; one that does not finish is recorded as such. Results: JSON
(``--out``) and a Markdown table on stdout. The load is the 1-minute load average when the
contender starts.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import _smoke
import numpy as np
from bench_scale import _error, _JvmPeak, _peak_mib, _spark, _versions

SEED = 20261203
CONTENDERS = ("dpkit-duckdb", "hand-duckdb", "dpkit-text-duckdb", "dpkit-spark", "hand-spark", "tumult-spark")
WORKLOADS = ("public", "private")
POSTCODES, REGIONS, DRUGS = 1000, 20, 100
COST, DOSE = (0.0, 5000.0), (0.0, 100.0)
#: Contribution bounds on the joined rows (per patient), rows kept per side of a private join,
#: rows of the public table per postcode.
MAX_GROUPS, MAX_ROWS, JOIN_ROWS, MAX_MATCHES = 1, 10, 5, 1
SALTS = {"s0": 11, "s1": 12345, "s2": 67890, "s3": 24680}

HAND_PUBLIC = """
WITH r AS (SELECT postcode, region FROM read_parquet($regions)
           QUALIFY row_number() OVER (PARTITION BY postcode ORDER BY hash(postcode, region, $s0)) <= $matches),
j AS (SELECT v.patient_id AS u, r.region AS g, v.cost AS x, hash(v.patient_id, r.region, $s1) AS gh,
             hash(v.patient_id, r.region, v.postcode, v.cost, $s2) AS rh
      FROM read_parquet($visits) v JOIN r ON v.postcode = r.postcode),
b AS (SELECT g, x,
             row_number() OVER (PARTITION BY u ORDER BY gh, g, rh) - rank() OVER (PARTITION BY u ORDER BY gh, g) + 1 AS ri,
             dense_rank() OVER (PARTITION BY u ORDER BY gh, g) AS gi FROM j QUALIFY gi <= $groups AND ri <= $rows)
SELECT g AS region, count(*) AS n, sum(x) AS s FROM b GROUP BY g
"""
HAND_PRIVATE = """
WITH v AS (SELECT patient_id AS u, cost FROM read_parquet($visits)
           QUALIFY row_number() OVER (PARTITION BY patient_id ORDER BY hash(patient_id, postcode, cost, $s1)) <= $k),
p AS (SELECT patient_id AS u, dose FROM read_parquet($prescriptions)
      QUALIFY row_number() OVER (PARTITION BY patient_id ORDER BY hash(patient_id, drug, dose, $s2)) <= $k),
j AS (SELECT v.u, v.cost, p.dose FROM v JOIN p ON v.u = p.u),
b AS (SELECT dose FROM j QUALIFY row_number() OVER (PARTITION BY u ORDER BY hash(u, cost, dose, $s3)) <= $rows)
SELECT count(*) AS n, sum(dose) AS s FROM b
"""


def write_data(rows: int, cache: Path) -> Path:
    """The three tables as Parquet files under ``cache`` (written once per size)."""
    out = cache / f"joins-{rows}"
    if (out / "_done").exists():
        return out
    import pyarrow as pa
    import pyarrow.parquet as pq

    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(SEED)
    patients = max(rows // 10, 1)
    home = rng.integers(0, POSTCODES, patients, dtype=np.int64)
    chunk = 1_000_000
    for name in ("visits", "prescriptions"):
        with pq.ParquetWriter(out / f"{name}.parquet", _schema(name)) as writer:
            for lo in range(0, rows, chunk):
                n = min(chunk, rows - lo)
                pid = rng.integers(0, patients, n, dtype=np.int64)
                if name == "visits":
                    away = rng.random(n) < 0.2
                    postcode = np.where(away, rng.integers(0, POSTCODES, n, dtype=np.int64), home[pid])
                    cols = {"patient_id": pid, "postcode": postcode, "cost": rng.uniform(*COST, n)}
                else:
                    cols = {"patient_id": pid, "drug": rng.integers(0, DRUGS, n, dtype=np.int64),
                            "dose": rng.uniform(*DOSE, n)}  # fmt: skip
                writer.write_table(pa.table(cols, schema=_schema(name)), row_group_size=chunk)
    region = rng.permutation(np.arange(POSTCODES, dtype=np.int64) % REGIONS)
    pq.write_table(pa.table({"postcode": np.arange(POSTCODES, dtype=np.int64), "region": region}),
                   out / "regions.parquet")  # fmt: skip
    (out / "_done").write_text("ok")
    return out


def _schema(name: str) -> Any:
    import pyarrow as pa

    second = ("postcode", pa.int64()) if name == "visits" else ("drug", pa.int64())
    value = ("cost", pa.float64()) if name == "visits" else ("dose", pa.float64())
    return pa.schema([("patient_id", pa.int64()), second, value])


def _paths(data: Path) -> dict[str, str]:
    return {t: str(data / f"{t}.parquet") for t in ("visits", "prescriptions", "regions")}


def _metadata(text_keys: bool = False) -> Any:
    """The dataset's declaration: the integer keys as integer categoricals (with ``text_keys``,
    the default ``Categorical()``, which reads them as text)."""
    from dpkit.analytics import Categorical, DatasetMetadata, Metadata, Numeric

    def key() -> Any:
        return Categorical() if text_keys else Categorical(value_type="integer")

    return DatasetMetadata(
        tables={
            "visits": Metadata(
                columns={"postcode": key(), "cost": Numeric(*COST)}, privacy_unit="patient_id", join_rows=JOIN_ROWS
            ),
            "prescriptions": Metadata(
                columns={"drug": key(), "dose": Numeric(*DOSE)}, privacy_unit="patient_id", join_rows=JOIN_ROWS
            ),
            "regions": Metadata(columns={"postcode": key(), "region": key()}, public=True, max_matches=MAX_MATCHES),
        },
        max_groups=MAX_GROUPS,
        max_rows=MAX_ROWS,
    )


def _dpkit_query(session: Any, workload: str) -> dict[str, Any]:
    from dpkit.analytics import Count, Sum

    if workload == "public":
        q = session.query("visits").join("regions", on="postcode").group_by("region")
        t = q.aggregate([Count(), Sum("cost")], epsilon=1.0).table
        total = t["sum_cost"]
    else:
        q = session.query("visits").join("prescriptions", on="patient_id")
        t = q.aggregate([Count(), Sum("dose")], epsilon=1.0).table
        total = t["sum_dose"]
    return {"groups": len(t), "rows_kept": round(float(t["count"].sum())), "value_sum": float(total.sum()),
            "noisy": True}  # fmt: skip


def _hand_spark(frames: dict[str, Any], workload: str) -> dict[str, Any]:
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    v, p, r = frames["visits"], frames["prescriptions"], frames["regions"]
    if workload == "public":
        r = r.withColumn("_i", F.row_number().over(Window.partitionBy("postcode").orderBy(
            F.xxhash64("postcode", "region", F.lit(SALTS["s0"]))))).where(F.col("_i") <= MAX_MATCHES)  # fmt: skip
        j = v.join(r, "postcode").select(
            F.col("patient_id").alias("u"), F.col("region").alias("g"), F.col("cost").alias("x"),
            F.xxhash64("patient_id", "region", F.lit(SALTS["s1"])).alias("gh"),
            F.xxhash64("patient_id", "region", "postcode", "cost", F.lit(SALTS["s2"])).alias("rh"),
        )  # fmt: skip
        by_g = Window.partitionBy("u").orderBy("gh", "g")
        by_r = Window.partitionBy("u").orderBy("gh", "g", "rh")
        b = j.select("g", "x", (F.row_number().over(by_r) - F.rank().over(by_g) + 1).alias("ri"),
                     F.dense_rank().over(by_g).alias("gi"))  # fmt: skip
        b = b.where((F.col("gi") <= MAX_GROUPS) & (F.col("ri") <= MAX_ROWS))
        frame = b.groupBy("g").agg(F.count(F.lit(1)).alias("n"), F.sum("x").alias("s")).toPandas()
    else:

        def cut(df: Any, cols: list[str], salt: int) -> Any:
            w = Window.partitionBy("patient_id").orderBy(F.xxhash64(*cols, F.lit(salt)))
            return df.withColumn("_i", F.row_number().over(w)).where(F.col("_i") <= JOIN_ROWS).drop("_i")

        j = cut(v, ["patient_id", "postcode", "cost"], SALTS["s1"]).join(
            cut(p, ["patient_id", "drug", "dose"], SALTS["s2"]), "patient_id")  # fmt: skip
        w = Window.partitionBy("patient_id").orderBy(F.xxhash64("patient_id", "cost", "dose", F.lit(SALTS["s3"])))
        b = j.withColumn("_i", F.row_number().over(w)).where(F.col("_i") <= MAX_ROWS)
        frame = b.agg(F.count(F.lit(1)).alias("n"), F.sum("dose").alias("s")).toPandas()
    return {"groups": len(frame), "rows_kept": int(frame["n"].sum()), "value_sum": float(frame["s"].sum())}


def _tumult(spark: Any, frames: dict[str, Any], workload: str) -> dict[str, Any]:
    """One run of Tumult (its session built outside the time: ``seconds`` is the view and both
    queries)."""
    from tmlt.analytics import (
        AddRowsWithID,
        KeySet,
        MaxGroupsPerID,
        MaxRowsPerGroupPerID,
        MaxRowsPerID,
        PureDPBudget,
        QueryBuilder,
        Session,
    )

    t0 = time.perf_counter()
    builder = Session.Builder().with_privacy_budget(PureDPBudget(1)).with_id_space("patients")
    for name in ("visits", "prescriptions"):
        builder = builder.with_private_dataframe(
            name, frames[name], protected_change=AddRowsWithID("patient_id", "patients")
        )
    session = builder.with_public_dataframe("regions", frames["regions"]).build()
    setup = time.perf_counter() - t0
    t = time.perf_counter()
    if workload == "public":
        bounded = (
            QueryBuilder("visits").join_public("regions").enforce(MaxGroupsPerID("region", MAX_GROUPS))
            .enforce(MaxRowsPerGroupPerID("region", MAX_ROWS))
        )  # fmt: skip
        session.create_view(bounded, "bounded", cache=True)
        keys = KeySet.from_dataframe(frames["regions"].select("region").distinct())
        count = QueryBuilder("bounded").groupby(keys).count()
        total = QueryBuilder("bounded").groupby(keys).sum("cost", *COST)
        value = "cost_sum"
    else:
        left = QueryBuilder("visits").enforce(MaxRowsPerID(JOIN_ROWS))
        right = QueryBuilder("prescriptions").enforce(MaxRowsPerID(JOIN_ROWS))
        bounded = left.join_private(right, join_columns=["patient_id"]).enforce(MaxRowsPerID(MAX_ROWS))
        session.create_view(bounded, "bounded", cache=True)
        count = QueryBuilder("bounded").count()
        total = QueryBuilder("bounded").sum("dose", *DOSE)
        value = "dose_sum"
    counts = session.evaluate(count, PureDPBudget(0.5)).toPandas()
    sums = session.evaluate(total, PureDPBudget(0.5)).toPandas()
    seconds = time.perf_counter() - t
    session.delete_view("bounded")
    return {"seconds": seconds, "setup_seconds": setup, "groups": len(counts), "rows_kept": int(counts["count"].sum()),
            "value_sum": float(sums[value].sum()), "noisy": True}  # fmt: skip


def _timed(fn: Any, repeats: int) -> dict[str, Any]:
    times, got = [], {}
    for _ in range(repeats):
        t = time.perf_counter()
        got = fn()
        times.append(time.perf_counter() - t)
    return {"seconds": statistics.median(times), "runs": times, **got}


def child(name: str, workload: str, data: Path, args: argparse.Namespace) -> dict[str, Any]:
    spark_side = name.endswith("-spark")
    jvm = _JvmPeak() if spark_side else None
    out: dict[str, Any] = {"name": name, "workload": workload}
    paths = _paths(data)
    with tempfile.TemporaryDirectory() as spill:
        if spark_side:
            conf = {"spark.app.name": f"bench_joins {name}", "spark.sql.warehouse.dir": spill}
            spark = _spark(args.spark_master, args.driver_memory, **conf)
            frames = {t: spark.read.parquet(p) for t, p in paths.items()}
            if name == "tumult-spark":  # Tumult's own interpreter, without dpkit
                out.update(_tumult(spark, frames, workload))
                out["runs"] = [out["seconds"]]
                from tmlt.analytics.utils import cleanup

                cleanup()
            elif name == "hand-spark":
                out.update(_timed(lambda: _hand_spark(frames, workload), args.spark_repeats))
            else:
                import dpkit as dp

                t = time.perf_counter()
                s = dp.Session(frames, engine="spark", metadata=_metadata(), budget=dp.Budget(epsilon=100.0))
                out["setup_seconds"] = time.perf_counter() - t
                out.update(_timed(lambda: _dpkit_query(s, workload), args.spark_repeats))
            spark.stop()
        elif name == "hand-duckdb":
            import duckdb

            t = time.perf_counter()
            con = duckdb.connect()
            if args.memory_limit:
                con.execute(f"SET memory_limit = '{args.memory_limit}'")
                con.execute(f"SET temp_directory = '{spill}'")
            params: dict[str, Any] = {"visits": paths["visits"], "rows": MAX_ROWS}
            if workload == "public":
                sql = HAND_PUBLIC
                params.update(regions=paths["regions"], matches=MAX_MATCHES, groups=MAX_GROUPS,
                              s0=SALTS["s0"], s1=SALTS["s1"], s2=SALTS["s2"])  # fmt: skip
            else:
                sql = HAND_PRIVATE
                params.update(prescriptions=paths["prescriptions"], k=JOIN_ROWS, s1=SALTS["s1"], s2=SALTS["s2"],
                              s3=SALTS["s3"])  # fmt: skip
            out["setup_seconds"] = time.perf_counter() - t

            def run() -> dict[str, Any]:
                frame = con.execute(sql, params).df()
                return {"groups": len(frame), "rows_kept": int(frame["n"].sum()), "value_sum": float(frame["s"].sum())}

            out.update(_timed(run, args.repeats))
        else:
            import dpkit as dp

            limits = {"memory_limit": args.memory_limit, "temp_directory": spill} if args.memory_limit else {}
            t = time.perf_counter()
            meta = _metadata(text_keys=name == "dpkit-text-duckdb")
            s = dp.Session(paths, metadata=meta, budget=dp.Budget(epsilon=100.0), **limits)
            out["setup_seconds"] = time.perf_counter() - t
            out.update(_timed(lambda: _dpkit_query(s, workload), args.repeats))
    out["python_peak_mib"] = _peak_mib()
    if jvm is not None:
        out.update(jvm.stop())
    out["versions"] = _versions()
    return out


LABELS = {
    "dpkit-duckdb": "dpkit, DuckDB",
    "dpkit-text-duckdb": "dpkit, DuckDB, keys declared as text",
    "hand-duckdb": "hand-written, DuckDB (exact)",
    "dpkit-spark": "dpkit, Spark",
    "hand-spark": "hand-written, Spark (exact)",
    "tumult-spark": "Tumult Analytics 0.21, Spark",
}


def _run_child(cmd: list[str], env: dict[str, str], timeout: float) -> tuple[int | None, str, str]:
    """(exit status or None past ``timeout``, stdout, stderr) of a contender's process, run in a
    process group of its own: past the time limit the group goes, with Spark's JVM."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)  # fmt: skip
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return None, "", ""
    return proc.returncode, out, err


def _summary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One line per (workload, contender): the median of every timed run of its processes, their
    largest peak memory, the mean load at their starts."""
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for r in rows:
        s = out.setdefault((r["workload"], r["name"]), {"workload": r["workload"], "name": r["name"], "runs": [],
                                                        "loads": [], "errors": []})  # fmt: skip
        s["loads"].append(r["load"])
        if "error" in r:
            s["errors"].append(r["error"])
            continue
        s["runs"] += r["runs"]
        s["python_peak_mib"] = max(s.get("python_peak_mib", 0.0), r["python_peak_mib"])
        if "jvm_peak_mib" in r:
            s["jvm_peak_mib"] = max(s.get("jvm_peak_mib", 0.0), r["jvm_peak_mib"])
        s["rows_kept"], s["noisy"] = r["rows_kept"], r.get("noisy", False)
    for s in out.values():
        if s["runs"]:
            s["seconds"] = statistics.median(s["runs"])
    return list(out.values())


def _row(s: dict[str, Any]) -> str:
    head = f"| {s['workload']} | {LABELS.get(s['name'], s['name'])} |"
    load = f"{statistics.mean(s['loads']):.2f}"
    if "seconds" not in s:
        first = (s["errors"][0].strip().splitlines() or [""])[0]
        return f"{head} {first[:160]!r} | | | | | {load} |"
    runs = ", ".join(f"{x:.2f}" for x in s["runs"])
    jvm = f"{s['jvm_peak_mib']:,.0f}" if "jvm_peak_mib" in s else "—"
    kept = f"{s['rows_kept']:,}" + (" (noisy)" if s["noisy"] else "")
    failed = f" ({len(s['errors'])} failed)" if s["errors"] else ""
    return f"{head} **{s['seconds']:.2f}**{failed} | {runs} | {s['python_peak_mib']:,.0f} | {jvm} | {kept} | {load} |"


def _contender(name: str, workload: str, data: Path, args: argparse.Namespace) -> dict[str, Any]:
    load = os.getloadavg()[0]
    print(f"[bench] {workload} {name} (load {load:.2f})", file=sys.stderr, flush=True)
    python = str(args.tumult_python.absolute()) if name == "tumult-spark" else sys.executable
    started = _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")
    if args.smoke:  # in this process: a child's start-up would be most of a smoke run's time
        try:
            got = child(name, workload, data, args)
        except Exception as exc:  # noqa: BLE001 - reported as the row's error, and fails the smoke run
            got = {"name": name, "workload": workload, "error": f"{type(exc).__name__}: {exc}"}
    else:
        cmd = [python, __file__, "--child", name, "--workload", workload, "--data", str(data),
               "--memory-limit", args.memory_limit, "--spark-master", args.spark_master,
               "--driver-memory", args.driver_memory, "--repeats", str(args.repeats),
               "--spark-repeats", str(args.spark_repeats)]  # fmt: skip
        # PySpark's Python workers run the contender's interpreter (Tumult's functions need its packages)
        env = {**os.environ, "PYSPARK_PYTHON": python, "PYSPARK_DRIVER_PYTHON": python}
        code, out, err = _run_child(cmd, env, args.timeout)
        if code is None:
            got = {"name": name, "workload": workload, "error": f"did not finish in {args.timeout:.0f} s"}
        elif code == 0:
            got = json.loads(out.strip().splitlines()[-1])
        else:
            got = {"name": name, "workload": workload, "error": _error(err)}
    got.update(load=load, started=started)
    print(f"[bench]   {got}", file=sys.stderr, flush=True)
    return got


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--only", default="dpkit-duckdb,hand-duckdb,tumult-spark")
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--repeats", type=int, default=3, help="runs of each DuckDB query (the median is reported)")
    ap.add_argument("--spark-repeats", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=1, help="runs of the DuckDB contenders' processes, interleaved")
    ap.add_argument("--memory-limit", default="4GB", help="DuckDB's memory limit for both DuckDB contenders ('' none)")
    ap.add_argument("--spark-master", default="local[2]")
    ap.add_argument("--driver-memory", default="2g")
    ap.add_argument("--tumult-python", type=Path, help="the python of Tumult's virtualenv (benchmarks/setup_tumult.sh)")
    ap.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "dpkit-bench")
    ap.add_argument("--timeout", type=float, default=1200, help="seconds each contender may take")
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "joins.json")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--workload", help=argparse.SUPPRESS)
    ap.add_argument("--data", type=Path, help=argparse.SUPPRESS)
    _smoke.add_flag(ap)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.workload, args.data, args)))
        return 0
    names = [n for n in args.only.split(",") if n]
    unknown = sorted(set(names) - set(CONTENDERS)) + sorted(set(args.workloads.split(",")) - set(WORKLOADS))
    if unknown:
        ap.error(f"unknown contender or workload: {unknown}")
    failures: list[str] = []
    if args.smoke:
        args.rows, args.cache, args.repeats = 20_000, _smoke.temp_dir(), 1
        args.out = _smoke.out_path("joins.json")
        if any(n.endswith("-spark") for n in names):
            _smoke.skip("the Spark contenders", "a Spark session takes longer to start than a whole smoke run")
            failures += _smoke.missing("dpkit.analytics.engines.spark", "_ensure_java")
        names = ["dpkit-duckdb", "hand-duckdb"]
    if "tumult-spark" in names and args.tumult_python is None:
        names.remove("tumult-spark")
        print("[bench] tumult-spark skipped: no --tumult-python", file=sys.stderr)
    t0 = time.perf_counter()
    data = write_data(args.rows, args.cache)
    print(f"[bench] data: 2 × {args.rows:,} rows in {data} ({time.perf_counter() - t0:.0f} s)", file=sys.stderr)
    rows: list[dict[str, Any]] = []
    for workload in args.workloads.split(","):
        for round_ in range(args.rounds):
            for name in names:
                if round_ and not name.endswith("-duckdb"):
                    continue  # the Spark contenders run once
                rows.append(_contender(name, workload, data, args))
    meta = {"rows": args.rows, "patients": max(args.rows // 10, 1), "memory_limit": args.memory_limit,
            "spark_master": args.spark_master, "driver_memory": args.driver_memory, "repeats": args.repeats,
            "rounds": args.rounds, "timeout": args.timeout, "max_groups": MAX_GROUPS, "max_rows": MAX_ROWS,
            "join_rows": JOIN_ROWS, "max_matches": MAX_MATCHES,
            "epsilon": 1.0, "when": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
            "cpus": os.cpu_count(), "argv": sys.argv[1:] if argv is None else argv}  # fmt: skip
    summary = _summary(rows)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"meta": meta, "summary": summary, "rows": rows}, indent=2) + "\n")
    print(f"| workload | contender | median s | runs s | Python peak MiB | JVM peak MiB | rows kept | load |"
          f"  ({args.rows:,} rows a table, {meta['when']})")  # fmt: skip
    print("|---|---|--:|---|--:|--:|--:|--:|")
    for s in summary:
        print(_row(s))
    by = {(s["workload"], s["name"]): s for s in summary if "seconds" in s}
    for workload in args.workloads.split(","):
        for a, b in (("dpkit-duckdb", "hand-duckdb"), ("dpkit-spark", "hand-spark"), ("tumult-spark", "dpkit-duckdb"),
                     ("tumult-spark", "dpkit-spark"), ("tumult-spark", "hand-spark")):  # fmt: skip
            if (workload, a) in by and (workload, b) in by:
                ratio = by[workload, a]["seconds"] / by[workload, b]["seconds"]
                print(f"{workload}: {a} / {b} = {ratio:.2f}×")
    failures += [
        f"{r['workload']} {r['name']}: {r['error']}" for r in rows if r["name"].startswith("dpkit") and "error" in r
    ]
    return _smoke.finish(failures)


if __name__ == "__main__":
    raise SystemExit(main())
