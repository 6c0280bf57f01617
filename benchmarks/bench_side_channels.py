"""Side-channel benchmark: does a refusal's latency depend on the data?

Not a test (timings belong here, not in the suite; the suite proves the property by instrumenting
the engine). Run it from either environment:

    .venv/bin/python benchmarks/bench_side_channels.py [--others 1000] [--repeats 15] [--json FILE]

The table holds ``--others`` people with one row each and one person, pid 7, with 1 or 150,000
rows (the review's attack). The analyst's budget is spent; they ask
``SELECT SUM(age) FROM t WHERE pid = 7`` again and again and time the refusal.

Rows, each the median of ``--repeats`` runs (wall clock, ``time.perf_counter``):

* **refused (dpkit)** — the query as dpkit runs it now: validate, price, debit refused. The engine
  is never called, so the time cannot depend on pid 7's rows.
* **refused, old order (emulated)** — the order of earlier versions: the engine's bounded
  aggregation first, then the refused debit (``engine.aggregate(plan)`` timed together with the
  refusal). This is what leaked 27 ms vs 123 ms in the review.
* **paid query** — a query that is paid for and answered. Its time does grow with the rows the
  filter keeps: the residual timing channel documented in docs/guide/analytics.md ("What an analyst can and cannot learn") (not covered by the noise; the
  service does not pad it).

A second table prices the declared schema on a CSV of ``--csv-rows`` rows (pid, age, sex, zip,
income): the same bounded aggregation (``DuckDBEngine.aggregate`` of one plan: a count, a mean of
age and a sum of income by sex) over (a) DuckDB's own reader, which sniffs the types from the rows
(what earlier versions did), and (b) dpkit's fixed reader — every field as text, then the
declared types by total casts. Best of ``--repeats`` after one warm-up.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _plan  # noqa: E402
import _report  # noqa: E402
import _smoke  # noqa: E402

import dpkit as dp  # noqa: E402
from dpkit.analytics import Categorical, Metadata, Numeric  # noqa: E402
from dpkit.errors import BudgetExceededError  # noqa: E402

QUERY = "SELECT SUM(age) FROM t WHERE pid = 7"
BIG = 150_000  # pid 7's rows in the second table (the review's attack)
META = Metadata(
    columns={"age": Numeric(0, 100), "pid": Categorical(value_type="integer")}, privacy_unit="pid", max_rows=1
)


def table(rows_of_7: int, others: int) -> pd.DataFrame:
    pid = np.r_[np.full(rows_of_7, 7), np.arange(100, 100 + others)]
    return pd.DataFrame({"pid": pid, "age": np.random.default_rng(0).integers(18, 90, pid.size)})


def median_seconds(fn: Any, repeats: int) -> float:
    fn()  # warm-up: imports, prepared statements, caches
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure(rows_of_7: int, others: int, repeats: int) -> dict[str, float]:
    """Median seconds of the three requests of the module docstring, pid 7 holding ``rows_of_7`` rows."""
    df = table(rows_of_7, others)
    spent = dp.Budget(epsilon=0.1)
    spent.spend(dp.Laplace(epsilon=0.1).event)
    refused_session = dp.Session(df, table="t", budget=spent, metadata=META)

    def refused() -> None:
        try:
            refused_session.sql(QUERY, epsilon=0.1)
        except BudgetExceededError:
            return
        raise AssertionError("the query was answered with the budget spent")

    def refused_old_order() -> None:
        from dpkit.analytics.sql import compile_sql  # noqa: PLC0415

        query, aggs = compile_sql(refused_session, QUERY)
        plan = _plan.plan_of(query, aggs, epsilon=0.1)
        refused_session.engine.aggregate(plan)  # earlier versions computed before paying
        refused()

    paid_session = dp.Session(df, table="t", budget=dp.Budget(epsilon=1e9), metadata=META)
    return {
        "refused": median_seconds(refused, repeats),
        "refused_old_order": median_seconds(refused_old_order, repeats),
        "paid": median_seconds(lambda: paid_session.sql(QUERY, epsilon=0.1), repeats),
    }


def csv_cost(rows: int, repeats: int, directory: Path) -> dict[str, float]:
    from dpkit.analytics.engines.duckdb import DuckDBEngine  # noqa: PLC0415
    from dpkit.analytics.plan import AggregationPlan, GroupKey, quantize_spec  # noqa: PLC0415

    rng = np.random.default_rng(1)
    path = directory / f"people-{rows}.csv"
    if not path.exists():
        pd.DataFrame(
            {
                "pid": np.arange(rows) // 2,
                "age": rng.integers(18, 90, rows),
                "sex": rng.choice(["Female", "Male"], rows),
                "zip": rng.integers(10000, 99999, rows),
                "income": rng.gamma(2.0, 20_000.0, rows).round(2),
            }
        ).to_csv(path, index=False)
    plan = AggregationPlan(
        unit="pid",
        where=None,
        groups=(GroupKey("sex"),),
        key_filter=(("Female", "Male"),),
        max_groups=1,
        max_rows=2,
        sums=(
            quantize_spec("s0", "age", 0, 100, centered=True),
            quantize_spec("s1", "income", 0, 250_000, centered=False),
        ),
        values=(),
        salt=12345,
    )
    out = {}
    for label, bind in (("sniffed", False), ("declared", True)):
        if bind:
            engine = DuckDBEngine(path)
            engine.bind(
                {"pid": "unit", "age": "double", "sex": "string", "zip": "integer", "income": "double"},
                strip_strings=True,
            )
        else:
            engine = DuckDBEngine(None, connection=_sniffed(path), table="t")
        engine.aggregate(plan)
        out[label] = min(median_seconds(lambda e=engine: e.aggregate(plan), 1) for _ in range(repeats))
    return out


def _sniffed(path: Path) -> Any:
    import duckdb  # noqa: PLC0415

    con = duckdb.connect()
    con.read_csv(str(path)).create_view("t")
    return con


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--others", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--csv-rows", type=int, default=2_000_000)
    ap.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "dpkit-bench")
    _smoke.add_flag(ap)
    args = ap.parse_args(argv)
    big = BIG
    if args.smoke:
        args.others, args.repeats, args.csv_rows, big = 100, 1, 2_000, 1_000
        args.cache, args.json = _smoke.temp_dir(), None
    results = {n: measure(n, args.others, args.repeats) for n in (1, big)}
    labels = {
        "refused": "refused (dpkit: debit before the engine)",
        "refused_old_order": "refused, old order (engine, then debit; emulated)",
        "paid": "paid query (answered)",
    }
    rows = []
    for key, label in labels.items():
        a, b = results[1][key], results[big][key]
        rows.append([label, f"{a * 1e3:.2f}", f"{b * 1e3:.2f}", f"{b / a:.2f}"])
    print(
        _report.markdown(
            f"Refusal latency with a spent budget, median of {args.repeats} (dpkit {_report.version('dpkit')}, duckdb {_report.version('duckdb')})",
            ["request", "pid 7 has 1 row: ms", f"pid 7 has {big:,} rows: ms", "ratio"],
            ["request"],
            rows,
            [
                f"query: {QUERY}; {args.others:,} other people with one row each; DuckDB engine.",
                "The suite proves the refusal never calls the engine (tests/analytics/test_side_channels.py); this table shows what that buys.",
            ],
        )
    )
    args.cache.mkdir(parents=True, exist_ok=True)
    csv = csv_cost(args.csv_rows, args.repeats, args.cache)
    print()
    print(
        _report.markdown(
            f"Reading a CSV of {args.csv_rows:,} rows by the declared schema, best of {args.repeats}",
            ["reader", "aggregate s", "× sniffed"],
            ["reader"],
            [
                ["DuckDB's reader, types sniffed from the rows (earlier versions)", f"{csv['sniffed']:.3f}", "1"],
                [
                    "dpkit's fixed reader: text, then declared types (total casts)",
                    f"{csv['declared']:.3f}",
                    f"{csv['declared'] / csv['sniffed']:.2f}",
                ],
            ],
            [
                "The same plan (count, mean of age, sum of income by sex; unit pid, max_rows 2) through DuckDBEngine.aggregate; the file is read on every run."
            ],
        )
    )
    if args.json:
        args.json.write_text(json.dumps({"refusal": results, "csv": csv}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
