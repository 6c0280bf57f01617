"""Group-by benchmark: a user-level private count/sum/mean by category on 10 million rows.

Not a test. Run it from the benchmark environment:

    .venv-bench/bin/python benchmarks/bench_groupby.py [--rows 10000000] [--only dpkit,duckdb] [--markdown]

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
(h) dpkit on Spark (``engine="spark"``, ``local[2]``) when ``dpkit.analytics.engines.spark``
    exists: the same query as (f) on a cached Spark DataFrame.

Timing: wall clock (``time.perf_counter``) of the query alone, input already in memory; best of
``--repeats`` (3) for the fast contenders, one run for PipelineDP and Spark. Setup (building the
contender's own input: polars frame, DuckDB registration, PipelineDP's row list, Spark DataFrame)
is timed separately. Peak memory: the subprocess's peak resident set size (``VmHWM``, reset with
``/proc/self/clear_refs`` after the input DataFrame is built and the library imported) minus its
resident set size at that moment, so it covers setup and the timed runs; for Spark the JVM's peak
RSS (sampled with psutil every 50 ms) is added. DuckDB runs with 2 threads, polars with
``POLARS_MAX_THREADS=2``.

Results: ``benchmarks/results/groupby.json``, a rich table on stderr, Markdown on stdout.
"""

from __future__ import annotations

import argparse
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
from pathlib import Path
from typing import Any, Callable

import numpy as np

import _report

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
    "dpkit-spark": ("(h) dpkit Session on Spark local[2], ε=1 Laplace", True),
}

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
    """Peak RSS of this process's children (Spark's JVM), sampled every 50 ms with psutil."""

    def __init__(self) -> None:
        self.peak = 0.0
        self._stop = threading.Event()
        try:
            import psutil  # noqa: PLC0415

            self._proc = psutil.Process()
        except ImportError:
            self._proc = None
        self._t = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            total = 0
            for c in self._proc.children(recursive=True):
                try:
                    total += c.memory_info().rss
                except Exception:  # noqa: BLE001  (a child that just exited)
                    pass
            self.peak = max(self.peak, total / 2**20)
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


def _duckdb_con(df):
    import duckdb  # noqa: PLC0415

    con = duckdb.connect()
    con.execute(f"SET threads = {THREADS}")
    con.register("t", df)
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
        out = pf.group_by("category").agg(pl.len().alias("n"), pl.col("value").sum().alias("s"), pl.col("value").mean().alias("m"))
        return _check(out.to_pandas(), "n", "s")

    return run


def _sql_setup(sql: str, params: list[Any] | None):
    def setup(df, ctx):
        con = _duckdb_con(df)

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

    return dp.Session(data, privacy_unit="user_id", budget=dp.Budget(epsilon=1e9), metadata=_metadata(),
                      max_groups=MAX_GROUPS, max_rows=MAX_ROWS, **kw)


def dpkit_plan(session):
    """The AggregationPlan dpkit builds for query (f) (through the session's own planner)."""
    from dpkit.analytics.session import _Runner  # noqa: PLC0415

    q = session.group_by("category")
    runner = _Runner(q, _aggregates(), EPSILON, 0.0, "laplace", 0.95, "truncated_geometric", None, None, None)
    plan, _ = runner._plan(SALT_G >> 2)
    return plan


def setup_dpkit_sql(df, ctx):
    from dpkit.analytics.engines.duckdb import DuckDBEngine  # noqa: PLC0415

    con = _duckdb_con(df)
    engine = DuckDBEngine(df, connection=con)
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


def setup_dpkit(df, ctx):
    import duckdb  # noqa: PLC0415

    from dpkit.analytics.engines.duckdb import DuckDBEngine  # noqa: PLC0415

    con = duckdb.connect()
    con.execute(f"SET threads = {THREADS}")

    def run():
        # Session(df) with the engine on a 2-thread connection: the same path as Session(df).
        s = _session(None, engine=DuckDBEngine(df, connection=con))
        r = s.group_by("category").aggregate(_aggregates(), epsilon=EPSILON)
        t = r.table
        return {"groups": int(len(t)), "rows_kept": int(round(float(t["count"].sum()))), "value_sum": float(t["sum_value"].sum()),
                "noisy": True}

    return run


def setup_pipelinedp(df, ctx):
    import pipeline_dp  # noqa: PLC0415

    rows = list(zip(df["user_id"].tolist(), df["category"].tolist(), df["value"].tolist()))
    M = pipeline_dp.Metrics

    def run():
        budget = pipeline_dp.NaiveBudgetAccountant(total_epsilon=EPSILON, total_delta=0)
        engine = pipeline_dp.DPEngine(budget, pipeline_dp.LocalBackend())
        params = pipeline_dp.AggregateParams(
            noise_kind=pipeline_dp.NoiseKind.LAPLACE, metrics=[M.COUNT, M.SUM, M.MEAN],
            max_partitions_contributed=MAX_GROUPS, max_contributions_per_partition=MAX_ROWS,
            min_value=LOWER, max_value=UPPER)
        ex = pipeline_dp.DataExtractors(privacy_id_extractor=lambda r: r[0], partition_extractor=lambda r: r[1],
                                        value_extractor=lambda r: r[2])
        res = engine.aggregate(rows, params, ex, public_partitions=list(range(N_CATEGORIES)))
        budget.compute_budgets()
        out = list(res)
        return {"groups": len(out), "rows_kept": int(round(sum(m.count for _, m in out))),
                "value_sum": float(sum(m.sum for _, m in out)), "noisy": True}

    return run


def setup_dpkit_spark(df, ctx):
    import importlib.util  # noqa: PLC0415

    if importlib.util.find_spec("dpkit.analytics.engines.spark") is None:
        raise _report.NotAvailable("dpkit.analytics.engines.spark does not exist")
    from pyspark.sql import SparkSession  # noqa: PLC0415

    spark = (SparkSession.builder.master(f"local[{THREADS}]").appName("dpkit-bench-groupby")
             .config("spark.driver.memory", "8g").config("spark.sql.execution.arrow.pyspark.enabled", "true")
             .config("spark.ui.enabled", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    sdf = spark.createDataFrame(df).cache()
    sdf.count()
    ctx["spark"] = spark.version

    def run():
        s = _session(sdf, engine="spark")
        r = s.group_by("category").aggregate(_aggregates(), epsilon=EPSILON)
        t = r.table
        return {"groups": int(len(t)), "rows_kept": int(round(float(t["count"].sum()))), "value_sum": float(t["sum_value"].sum()),
                "noisy": True}

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
}

IMPORTS = {"polars": "polars", "pipelinedp": "pipeline_dp", "dpkit-spark": "pyspark"}


def child(name: str, data: Path, repeats: int) -> dict[str, Any]:
    """Runs one contender in this (fresh) process and returns its measurements."""
    df = load_frame(data)
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
        "status": "ok", "seconds": min(times), "all_seconds": times, "runs": repeats, "setup_seconds": setup_s,
        "peak_rss_delta_mib": (peak - (base_rss if exact else base_hwm)) + jvm.peak,
        "peak_rss_mib": peak, "base_rss_mib": base_rss, "jvm_peak_rss_mib": jvm.peak or None,
        "peak_method": "VmHWM after clear_refs" if exact else "VmHWM delta (clear_refs unavailable: a lower bound)",
        "check": check,
    }
    out.update({k: v for k, v in ctx.items()})
    return out


# ----------------------------------------------------------------------------- parent


def run_child(name: str, data: Path, repeats: int, timeout: float) -> dict[str, Any]:
    env = dict(os.environ, POLARS_MAX_THREADS=str(THREADS), PYTHONHASHSEED="0")
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", name, "--data", str(data), "--repeats", str(repeats)]
    t0 = time.perf_counter()
    # Own process group, so that a timeout also ends what the contender started (Spark's JVM).
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
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


HEADERS = ["contender", "rows", "runs", "query s", "M rows/s", "× pandas", "setup s", "peak RSS Δ MiB", "groups", "rows kept"]
LEFT = ["contender"]
NOTES = [
    "query s: best of the runs (wall clock), the input already in memory; setup s: building the contender's own input (polars frame, DuckDB registration, PipelineDP's list of row tuples, Spark's cached DataFrame).",
    "peak RSS Δ: the contender subprocess's peak resident set size during setup and runs, above its size with the input pandas DataFrame (24 bytes a row) loaded; Spark adds its JVM's sampled peak.",
    "(d), (e) hand-written SQL with the same keyed hashes: they keep exactly the same rows. (e') is the statement dpkit generates (DuckDBEngine.aggregate_sql): (e) plus clipping and integer quantisation of the sums.",
    "(f), (g), (h) add noise (ε = 1, Laplace, public keys 0..99): their rows-kept column is a noisy count.",
    "DuckDB with 2 threads, polars with POLARS_MAX_THREADS=2, Spark local[2]; 2-core machine, compare rows from the same run only.",
]


def _num(x: float) -> str:
    return f"{x:,.0f}" if x >= 1000 else f"{x:.3g}"


def cells(r: dict[str, Any], pandas_s: float | None) -> list[str]:
    label = CONTENDERS[r["name"]][0] + (f" — on {r['rows']:,} rows" if r.get("fallback") else "")
    if r["status"] != "ok":
        return [label, f"{r['rows']:,}", "—", r["status"], "—", "—", "—", "—", "—", "—"]
    s = r["seconds"]
    chk = r.get("check") or {}
    kept = f"{chk.get('rows_kept', 0):,}" + (" (noisy)" if chk.get("noisy") else "")
    times = _num(s / pandas_s * (r.get("full_rows", r["rows"]) / r["rows"] if r.get("fallback") else 1)) if pandas_s else "—"
    setup = r["setup_seconds"]
    return [label, f"{r['rows']:,}", str(r["runs"]), _num(s), f"{r['rows'] / s / 1e6:.3g}", times + ("*" if r.get("fallback") else ""),
            f"{setup:.3g}" if setup >= 0.001 else "< 0.001", f"{r['peak_rss_delta_mib']:,.0f}", str(chk.get("groups", "—")), kept]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--fallback-rows", type=int, default=1_000_000, help="rows for a slow contender that timed out")
    ap.add_argument("--repeats", type=int, default=3, help="best-of for the fast contenders")
    ap.add_argument("--slow-timeout", type=float, default=720.0, help="seconds for PipelineDP / Spark on --rows (load + setup + 1 run)")
    ap.add_argument("--fast-timeout", type=float, default=600.0)
    ap.add_argument("--only", default=",".join(CONTENDERS), help="comma-separated subset of: " + ",".join(CONTENDERS))
    ap.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "dpkit-bench", help="where the generated data is cached (.npy)")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--markdown", action="store_true", help="(Markdown is always printed on stdout; kept for symmetry)")
    ap.add_argument("--render", type=Path, metavar="JSON", help="print the tables of an earlier results file; run nothing")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--data", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.render:
        saved = json.loads(args.render.read_text())
        render(saved["meta"], saved["rows"])
        return 0
    if args.child:
        r = child(args.child, args.data, args.repeats)
        print("RESULT " + json.dumps(r), flush=True)
        return 0

    names = [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = set(names) - set(CONTENDERS)
    if unknown:
        ap.error(f"unknown contenders {sorted(unknown)}; choose from {', '.join(CONTENDERS)}")
    data = ensure_cache(args.cache, args.rows)
    n_users = int(np.unique(np.load(data / "user_id.npy")).size)
    rows: list[dict[str, Any]] = []
    for name in names:
        label, slow = CONTENDERS[name]
        print(f"[bench] {label} on {args.rows:,} rows", file=sys.stderr, flush=True)
        r = run_child(name, data, 1 if slow else args.repeats, args.slow_timeout if slow else args.fast_timeout)
        r.update(name=name, label=label, rows=args.rows, fallback=False)
        if slow and r["status"].startswith("timeout") and args.fallback_rows < args.rows:
            rows.append(r)
            print(f"[bench]   {r['status']}; rerunning on {args.fallback_rows:,} rows", file=sys.stderr, flush=True)
            small = ensure_cache(args.cache, args.fallback_rows)
            r = run_child(name, small, 1, args.slow_timeout)
            r.update(name=name, label=label, rows=args.fallback_rows, fallback=True, full_rows=args.rows)
        print(f"[bench]   {r['status']}" + (f": {r['seconds']:.3g} s, peak Δ {r['peak_rss_delta_mib']:,.0f} MiB" if r["status"] == "ok" else ""),
              file=sys.stderr, flush=True)
        rows.append(r)

    by = {r["name"]: r for r in rows if r["status"] == "ok" and not r["fallback"]}
    if "duckdb-textbook" in by and "duckdb-onewindow" in by:
        a, b = by["duckdb-textbook"]["check"], by["duckdb-onewindow"]["check"]
        same = a["groups"] == b["groups"] and a["rows_kept"] == b["rows_kept"] and abs(a["value_sum"] - b["value_sum"]) <= 1e-9 * abs(a["value_sum"])
        print(f"[bench] (d) and (e) keep the same rows: {same} ({a['rows_kept']:,} vs {b['rows_kept']:,})", file=sys.stderr)

    import duckdb  # noqa: PLC0415

    meta = {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "rows": args.rows, "users": n_users, "rows_per_user": "uniform 1..20 (last user truncated)", "categories": N_CATEGORIES,
        "value": "uniform [0, 100]", "seed": SEED, "repeats": args.repeats,
        "max_groups": MAX_GROUPS, "max_rows": MAX_ROWS, "epsilon": EPSILON, "noise": "laplace (dpkit: geometric on the integer grid)",
        "threads": THREADS, "duckdb_default_threads": duckdb.connect().execute("SELECT current_setting('threads')").fetchone()[0],
        "python": platform.python_version(), "numpy": np.__version__, "platform": platform.platform(), "cpu_count": os.cpu_count(),
        "versions": {d: _report.version(d) for d in ("dpkit", "duckdb", "pandas", "polars", "pipeline-dp", "python-dp", "pyspark", "opendp")},
        "timer": "time.perf_counter wall clock of the query alone; best of `repeats` for fast contenders, one run for PipelineDP and Spark",
        "memory": "peak RSS (VmHWM, reset via /proc/self/clear_refs) of the contender's subprocess minus its RSS after loading the input DataFrame; + JVM peak RSS for Spark",
        "sql": {"plain": SQL_PLAIN, "textbook": SQL_TEXTBOOK, "one_window": SQL_ONE_WINDOW,
                "dpkit": next((r.get("sql") for r in rows if r["name"] == "dpkit-sql" and r.get("sql")), None)},
        "notes": NOTES,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2, ensure_ascii=False) + "\n")
    print(f"[bench] wrote {args.out.relative_to(REPO) if args.out.is_relative_to(REPO) else args.out}", file=sys.stderr)
    render(meta, rows)
    return 0


def render(meta: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    """The rich table on stderr and the Markdown table on stdout."""
    pandas_s = next((r["seconds"] for r in rows if r["name"] == "pandas" and r["status"] == "ok" and not r["fallback"]), None)
    table = [cells(r, pandas_s) for r in rows]
    notes = NOTES + (["*: measured on the fallback row count; × pandas scaled linearly to the full row count."] if any(r["fallback"] for r in rows) else [])
    title = f"Group-by count/sum/mean on {meta['rows']:,} rows ({meta['users']:,} users), {meta['date']}, {meta['cpu_count']} CPUs"
    _report.print_table(title, HEADERS, LEFT, ((c, 0, r["name"].startswith("dpkit")) for c, r in zip(table, rows)), notes,
                        to_stderr=True, width=220)
    print(_report.markdown(title, HEADERS, LEFT, table, notes))


if __name__ == "__main__":
    sys.exit(main())
