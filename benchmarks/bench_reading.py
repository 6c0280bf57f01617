"""What row-local reading costs: dpkit's CSV reader against DuckDB's own, on one bounded aggregation.

Not a test (timings belong here). Run it from either environment:

    .venv/bin/python benchmarks/bench_reading.py [--rows 2000000] [--repeats 7] [--json FILE] [--spark]

Two files of ``--rows`` rows (pid, age, sex, zip, income; a person has two rows): **plain**, with no
quotes (most exported tables, UCI Adult among them), and **quoted**, where every line also holds a
quoted field with a comma (``"Springfield, IL"``), the worst case for dpkit's reader, which parses
only lines holding a quote with a regular expression. On each, the same plan (count, mean of age,
sum of income by sex; unit pid, max_rows 2) runs through ``DuckDBEngine.aggregate``, reading the
file every time, over:

* **DuckDB sniffing** — ``read_csv(path)`` with types sniffed from the rows: the baseline the goal is
  measured against (≤ 1.5×), and what a hand-written DuckDB query would do;
* **previous fixed reader** — DuckDB's scanner with the fixed dialect (quotes honoured across lines,
  every column as text): what dpkit read with before row-local reading, and what let one stray quote
  swallow the file;
* **dpkit (row-local)** — :mod:`dpkit.analytics.engines.csv_source`: one line a record.

With ``--spark``, the plain file is also read on a local Spark session by dpkit's reader and by
``spark.read.csv`` (every column as text), counted by sex. Best of ``--repeats`` after a warm-up.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _report  # noqa: E402
import _smoke  # noqa: E402

from dpkit.analytics.engines.base import sql_string  # noqa: E402
from dpkit.analytics.engines.csv_source import CsvFile, CsvOptions  # noqa: E402
from dpkit.analytics.engines.duckdb import DuckDBEngine  # noqa: E402
from dpkit.analytics.plan import AggregationPlan, GroupKey, quantize_spec  # noqa: E402

TYPES = {"pid": "unit", "age": "double", "sex": "string", "zip": "integer", "income": "double"}
PLAN = AggregationPlan(
    unit="pid", where=None, groups=(GroupKey("sex"),), key_filter=(("Female", "Male"),), max_groups=1, max_rows=2,
    sums=(quantize_spec("s0", "age", 0, 100, centered=True), quantize_spec("s1", "income", 0, 250_000, centered=False)),
    values=(), salt=12345,
)  # fmt: skip


def write(rows: int, directory: Path, quoted: bool) -> Path:
    path = directory / f"people-{rows}{'-quoted' if quoted else ''}.csv"
    if not path.exists():
        rng = np.random.default_rng(1)
        frame = pd.DataFrame({
            "pid": np.arange(rows) // 2, "age": rng.integers(18, 90, rows), "sex": rng.choice(["Female", "Male"], rows),
            "zip": rng.integers(10000, 99999, rows), "income": rng.gamma(2.0, 20_000.0, rows).round(2),
        })  # fmt: skip
        if quoted:
            frame["city"] = rng.choice(["Springfield, IL", "Portland, OR", "Salem, MA"], rows)
        frame.to_csv(path, index=False)  # pandas quotes the fields holding a comma
    return path


def _connection(sql: str) -> Any:
    import duckdb  # noqa: PLC0415

    con = duckdb.connect()
    con.execute(f"CREATE VIEW t AS SELECT * FROM {sql}")
    return con


def previous_reader(path: Path) -> str:
    """The fixed-dialect expression dpkit used before row-local reading."""
    with path.open() as f:
        names = f.readline().strip().split(",")
    columns = "{" + ", ".join(f"{sql_string(n)}: 'VARCHAR'" for n in names) + "}"
    return (
        f"read_csv({sql_string(str(path))}, header = true, auto_detect = false, columns = {columns}, delim = ',', "
        "quote = '\"', escape = '\"', null_padding = true, ignore_errors = true, strict_mode = false)"
    )


def duckdb_times(path: Path, repeats: int) -> dict[str, float]:
    engines = {
        "sniffed": DuckDBEngine(None, connection=_connection(f"read_csv({sql_string(str(path))})"), table="t"),
        "previous": DuckDBEngine(None, connection=_connection(previous_reader(path)), table="t"),
        "dpkit": DuckDBEngine(CsvFile(path, CsvOptions())),
    }
    for label in ("previous", "dpkit"):
        engines[label].bind(TYPES, strip_strings=True)
    return {
        label: _report.best_seconds(lambda e=e: e.aggregate(PLAN), repeats, warm_up=True)
        for label, e in engines.items()
    }


def spark_times(path: Path, repeats: int) -> dict[str, float]:
    from pyspark.sql import functions as F  # noqa: PLC0415

    from dpkit.analytics.engines.csv_source import read_csv_spark  # noqa: PLC0415
    from dpkit.analytics.engines.spark import spark_session  # noqa: PLC0415

    spark = spark_session()
    ours = read_csv_spark(spark, CsvFile(path, CsvOptions()))
    theirs = spark.read.csv(str(path), header=True)
    return {
        label: _report.best_seconds(
            lambda f=frame: f.groupBy("sex").agg(F.count("*"), F.avg(F.col("age").try_cast("double"))).collect(),
            repeats,
            warm_up=True,
        )
        for label, frame in (("spark_csv", theirs), ("dpkit", ours))
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=2_000_000)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "dpkit-bench")
    ap.add_argument("--spark", action="store_true", help="also read the plain file on a local Spark session")
    ap.add_argument("--json", type=Path, default=None)
    _smoke.add_flag(ap)
    args = ap.parse_args(argv)
    failures: list[str] = []
    if args.smoke:
        args.rows, args.repeats, args.cache, args.json = 2_000, 1, _smoke.temp_dir(), None
        if args.spark:
            _smoke.skip("spark", "a Spark session takes longer to start than a whole smoke run")
            args.spark = False
        failures += _smoke.missing("dpkit.analytics.engines.csv_source", "read_csv_spark")
        failures += _smoke.missing("dpkit.analytics.engines.spark", "spark_session")
    args.cache.mkdir(parents=True, exist_ok=True)
    results: dict[str, dict[str, float]] = {}
    rows = []
    for kind in ("plain", "quoted"):
        t = results[kind] = duckdb_times(write(args.rows, args.cache, kind == "quoted"), args.repeats)
        for label, name in (("sniffed", "DuckDB read_csv, types sniffed"), ("previous", "previous fixed reader (quotes span lines)"),
                            ("dpkit", "dpkit, one line a record")):  # fmt: skip
            rows.append([kind, name, f"{t[label]:.3f}", f"{t[label] / t['sniffed']:.2f}"])
    print(_report.markdown(
        f"Reading a CSV of {args.rows:,} rows by the declared schema, best of {args.repeats} "
        f"(dpkit {_report.version('dpkit')}, duckdb {_report.version('duckdb')})",
        ["file", "reader", "aggregate s", "× sniffed"], ["file", "reader"], rows,
        ["The same plan (count, mean of age, sum of income by sex; unit pid, max_rows 2) through DuckDBEngine.aggregate; "
         "the file is read on every run.", "quoted: every line also holds a quoted field with a comma."],
    ))  # fmt: skip
    if args.spark:
        t = results["spark"] = spark_times(write(args.rows, args.cache, False), args.repeats)
        print()
        print(_report.markdown(
            f"The plain file on a local Spark session (count and mean of age by sex), best of {args.repeats}",
            ["reader", "s", "× spark.read.csv"], ["reader"],
            [["spark.read.csv, every column as text", f"{t['spark_csv']:.3f}", "1"],
             ["dpkit, one line a record", f"{t['dpkit']:.3f}", f"{t['dpkit'] / t['spark_csv']:.2f}"]],
            [f"Spark {_report.version('pyspark')}, local[*]."],
        ))  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return _smoke.finish(failures)


if __name__ == "__main__":
    raise SystemExit(main())
