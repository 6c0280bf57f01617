"""BIN benchmark: does a binned group-by cost more with more bins than its output does?

Not a test (timings belong here; tests/analytics/test_bins.py proves that neither the statement
nor the Spark plan grows with the bins). Run it from either environment:

    .venv/bin/python benchmarks/bench_bins.py [--rows 1000000] [--bins 10,1000,5000,100000]
        [--repeats 3] [--engines duckdb,spark] [--case] [--json benchmarks/results/bins.json]

The table holds ``--rows`` people, one row each, ``age`` uniform in [0, 100) declared
``Numeric(0, 100)``. The analyst asks ``SELECT BIN(age, n) AS b, COUNT(*) FROM t GROUP BY b``
through ``Session.sql`` (compile, price, pay, the engine's bounded count, noise on every one of
the n public keys, the bin labels): best of ``--repeats`` (wall clock, ``time.perf_counter``),
each run a fresh query. Rows:

* **DuckDB** — the bins found by a binary search over the edges (engines/bins.py): ⌈log2 n⌉
  projections, the edges one ``DOUBLE[]`` parameter.
* **Spark (local[2])** — the same search, the edges a one-row frame joined by broadcast; the
  table is cached in Spark's memory first.
* **DuckDB, one WHEN per bin (earlier versions, emulated; ``--case``)** — the statement earlier
  versions generated for this query, run raw: a CASE with one WHEN per bin in the SELECT and
  again twice in the WHERE (``IS NOT NULL``, ``IN (0, …, n − 1)``). Its cost grows with n
  whatever the table (16–19 s for 5,000 bins on any table in the report that found it), so it
  is timed once, for n <= ``--case-max``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _report  # noqa: E402
import _smoke  # noqa: E402

import dpkit as dp  # noqa: E402
from dpkit.analytics import Metadata, Numeric, QueryLimits  # noqa: E402

META = Metadata(columns={"age": Numeric(0, 100)}, row_level=True)
QUERY = "SELECT BIN(age, {n}) AS b, COUNT(*) FROM t GROUP BY b"


def ages(rows: int) -> pd.DataFrame:
    return pd.DataFrame({"age": np.random.default_rng(0).uniform(0.0, 100.0, rows)})


def session(data: Any) -> dp.Session:
    return dp.Session(
        data, table="t", metadata=META, budget=dp.Budget(epsilon=1e9), limits=QueryLimits(max_keys=100_000)
    )


def measure(data: Any, counts: list[int], repeats: int) -> dict[int, float]:
    s = session(data)
    out = {}
    for n in counts:
        sql = QUERY.format(n=n)
        result = s.sql(sql, epsilon=1.0)  # a first run, checked: every bin is a row
        assert len(result.table) == n, (n, len(result.table))
        out[n] = _report.best_seconds(lambda sql=sql: s.sql(sql, epsilon=1.0), repeats)
        print(f"  {n:>7,} bins: {out[n]:.3f} s", file=sys.stderr, flush=True)
    return out


def spark_frame(rows: int) -> Any:
    from pyspark.sql import functions as F

    from dpkit.analytics.engines.spark import spark_session

    spark = spark_session()
    frame = spark.range(rows).select((F.rand(0) * F.lit(100.0)).alias("age")).cache()
    frame.count()
    return frame


def case_statement(table: str, n: int) -> tuple[str, list[float | int]]:
    """The statement earlier versions generated for the query (DuckDBEngine.aggregate_sql of a
    row-level count by BIN(age, n) with the planner's key filter), and its parameters."""
    edges = [100.0 * i / n for i in range(n)] + [100.0]
    params: list[float | int] = []

    def add(v: float | int) -> str:
        params.append(v)
        return f"${len(params)}"

    def group() -> str:
        x = 'CASE WHEN isnan(CAST("age" AS DOUBLE)) THEN NULL ELSE CAST("age" AS DOUBLE) END'
        whens = [
            f"WHEN {x} >= {add(edges[i])} AND {x} {'<=' if i == n - 1 else '<'} {add(edges[i + 1])} THEN {i}"
            for i in range(n)
        ]
        return f"(CASE {' '.join(whens)} END)"

    inner = group()
    g = group()
    where = f"TRUE AND {g} IS NOT NULL AND {group()} IN ({', '.join(add(k) for k in range(n))})"
    sql = (
        f"WITH src AS (SELECT {inner} AS g0 FROM {table} WHERE {where}), base AS (SELECT g0 FROM src), "
        "r AS (SELECT * FROM base) SELECT g0, count(*) AS rows, count(*) AS units FROM r GROUP BY g0"
    )
    return sql, params


def measure_case(data: pd.DataFrame, counts: list[int]) -> dict[int, float]:
    import duckdb

    con = duckdb.connect()
    con.register("t", data)
    out = {}
    for n in counts:
        sql, params = case_statement("t", n)
        t0 = time.perf_counter()
        con.execute(sql, params).df()
        out[n] = time.perf_counter() - t0
        print(f"  {n:>7,} bins, one WHEN per bin: {out[n]:.3f} s", file=sys.stderr, flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--bins", default="10,1000,5000,100000")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--engines", default="duckdb,spark")
    ap.add_argument("--case", action="store_true", help="also time the statement of earlier versions (DuckDB)")
    ap.add_argument("--case-max", type=int, default=5000)
    ap.add_argument("--json", type=Path, default=None)
    _smoke.add_flag(ap)
    args = ap.parse_args(argv)
    failures: list[str] = []
    if args.smoke:
        args.rows, args.bins, args.repeats, args.case, args.case_max, args.json = 2_000, "10,100", 1, True, 100, None
        if "spark" in args.engines.split(","):
            _smoke.skip("spark", "a Spark session takes longer to start than a whole smoke run")
            failures += _smoke.missing("dpkit.analytics.engines.spark", "spark_session")
            args.engines = ",".join(e for e in args.engines.split(",") if e != "spark")
    counts = [int(b) for b in args.bins.split(",")]
    engines = args.engines.split(",")
    data = ages(args.rows)
    results: dict[str, dict[int, float]] = {}
    if "duckdb" in engines:
        print("DuckDB", file=sys.stderr)
        results["duckdb"] = measure(data, counts, args.repeats)
    if "spark" in engines:
        print("Spark (local[2])", file=sys.stderr)
        results["spark"] = measure(spark_frame(args.rows), counts, args.repeats)
    if args.case:
        print("DuckDB, one WHEN per bin (earlier versions)", file=sys.stderr)
        results["duckdb_case"] = measure_case(data, [n for n in counts if n <= args.case_max])
    labels = {
        "duckdb": "DuckDB: binary search (dpkit)",
        "spark": "Spark local[2]: binary search (dpkit)",
        "duckdb_case": "DuckDB: one WHEN per bin (earlier versions, emulated, one run)",
    }
    rows = [[labels[k], *[f"{v[n]:.3f}" if n in v else "—" for n in counts]] for k, v in results.items()]
    print(
        _report.markdown(
            f"BIN(age, n) through Session.sql on {args.rows:,} rows, best of {args.repeats}, seconds "
            f"(dpkit {_report.version('dpkit')}, duckdb {_report.version('duckdb')}, pyspark {_report.version('pyspark')})",
            ["engine", *[f"n = {n:,}" for n in counts]],
            ["engine"],
            rows,
            [
                f"query: {QUERY.format(n='n')}; one row per person, age uniform in [0, 100) declared Numeric(0, 100).",
                "Each run is a whole release: compile, price, pay, the engine's count, noise on all n keys, the labels.",
                "The emulated row runs the statement of earlier versions raw (no noise, no labels): a lower bound on their cost.",
            ],
        )
    )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        payload = {
            "rows": args.rows,
            "repeats": args.repeats,
            "query": QUERY,
            "versions": {p: _report.version(p) for p in ("dpkit", "duckdb", "pyspark")},
            "seconds": {k: {str(n): t for n, t in v.items()} for k, v in results.items()},
        }
        args.json.write_text(json.dumps(payload, indent=2) + "\n")
    return _smoke.finish(failures)


if __name__ == "__main__":
    raise SystemExit(main())
