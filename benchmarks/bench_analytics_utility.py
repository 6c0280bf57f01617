"""Private analytics utility benchmark on UCI Adult: dpkit against PipelineDP and OpenDP.

Not a test. Run it from the benchmark environment:

    .venv-bench/bin/python benchmarks/bench_analytics_utility.py [--runs 100] [--libs dpkit,pipelinedp,opendp]

Data: ``<repo>/../shared/data/adult/adult.data`` (32,561 rows; read in place, never copied; the
benchmark prints a message and exits 0 when it is absent). Privacy unit: each row (row-level DP,
add/remove one row). Public keys: the category lists of the Adult data dictionary (``adult.names``),
written below as constants — public knowledge of the schema, never read from the data.

Three queries, each released ``--runs`` (100) times at ε = 1 by each library (pure ε-DP, δ = 0,
Laplace-type noise, the library's default randomness and budget split):

(i)   count of rows by ``sex`` (2 keys);
(ii)  mean ``age`` by ``education`` (16 keys), age bounds [17, 90] (the observed ages are all in
      these bounds, so clipping does not bias the truth);
(iii) histogram (count) of ``marital-status`` (7 keys).

Calls:

- dpkit: ``Session(df, budget=..., metadata=Metadata(columns={age: Numeric(17, 90), sex /
  education / marital-status: Categorical(<constants>)}))`` (``privacy_unit`` None: each row),
  then ``s.group_by("sex").count(epsilon=1)``, ``s.group_by("education").mean("age", epsilon=1)``,
  ``s.histogram("marital-status", epsilon=1)``.
- PipelineDP 0.3.1 (LocalBackend): ``DPEngine.aggregate`` with ``Metrics.COUNT`` / ``Metrics.MEAN``,
  the row index as privacy id, ``max_partitions_contributed=1``,
  ``max_contributions_per_partition=1``, ``min_value=17, max_value=90``, ``public_partitions`` the
  constants, ``NaiveBudgetAccountant(total_epsilon=1, total_delta=0)``, ``NoiseKind.LAPLACE``.
- OpenDP 0.16 (context API, polars): ``Context.compositor(data, privacy_unit=unit_of(contributions=1),
  privacy_loss=loss_of(epsilon=1), split_evenly_over=1, margins=[Margin(max_length=100_000)])``,
  then ``query().group_by(col).agg(dp.len())`` or ``agg(pl.col("age").dp.mean((17.0, 90.0)))``,
  ``.with_keys(<constants>)``, ``.release().collect()``. ``max_length`` is a public upper bound on
  the table's length that OpenDP needs for a float sum.

Relative error: for every run r and key g, |noisy − true| / true, where true is the exact
non-private value on the same rows (count, or mean of the ages clipped to [17, 90]). The headline
is the median of these values pooled over all keys and runs (runs × keys values); the table also
shows their 90th percentile and the worst key (largest median over runs). A release with a key
missing or NaN counts as an infinite error for that key.

Results: a rich table (stderr), ``benchmarks/results/analytics_utility.json`` and Markdown on stdout.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import _report
import _smoke
import numpy as np

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "benchmarks" / "results" / "analytics_utility.json"
ADULT = REPO / ".." / "shared" / "data" / "adult" / "adult.data"
EPSILON = 1.0
AGE_LOWER, AGE_UPPER = 17.0, 90.0
MAX_LENGTH = 100_000  # OpenDP: a public upper bound on the number of rows

# Public keys, as listed in the Adult data dictionary (adult.names).
SEX = ("Female", "Male")
EDUCATION = (
    "Bachelors",
    "Some-college",
    "11th",
    "HS-grad",
    "Prof-school",
    "Assoc-acdm",
    "Assoc-voc",
    "9th",
    "7th-8th",
    "12th",
    "Masters",
    "1st-4th",
    "10th",
    "Doctorate",
    "5th-6th",
    "Preschool",
)
MARITAL = (
    "Married-civ-spouse",
    "Divorced",
    "Never-married",
    "Separated",
    "Widowed",
    "Married-spouse-absent",
    "Married-AF-spouse",
)

# name -> (label, group column, keys, aggregate)
QUERIES: dict[str, tuple[str, str, tuple[str, ...], str]] = {
    "count_by_sex": ("(i) count by sex", "sex", SEX, "count"),
    "mean_age_by_education": ("(ii) mean age by education", "education", EDUCATION, "mean"),
    "marital_histogram": ("(iii) histogram of marital-status", "marital-status", MARITAL, "count"),
}
LIBS = ("dpkit", "pipelinedp", "opendp")
LIB_NAMES = {"dpkit": "dpkit", "pipelinedp": "PipelineDP 0.3.1", "opendp": "OpenDP 0.16"}

Release = Callable[[], dict[str, float]]  # one private release: key -> value


def load_adult(path: Path = ADULT):
    import pandas as pd  # noqa: PLC0415

    df = pd.read_csv(path, skipinitialspace=True, usecols=["age", "education", "marital-status", "sex"])
    df = df.dropna().reset_index(drop=True)
    df["age"] = df["age"].astype("float64")
    for col, keys in (("sex", SEX), ("education", EDUCATION), ("marital-status", MARITAL)):
        unknown = set(df[col].unique()) - set(keys)
        if unknown:
            print(
                f"[bench] note: {col} values outside the data dictionary are dropped by every library: {sorted(unknown)}",
                file=sys.stderr,
            )
    return df


def truth(df, query: str) -> dict[str, float]:
    _, col, keys, agg = QUERIES[query]
    sub = df[df[col].isin(keys)]
    if agg == "count":
        t = sub.groupby(col).size()
    else:
        t = sub.assign(age=sub["age"].clip(AGE_LOWER, AGE_UPPER)).groupby(col)["age"].mean()
    return {k: float(t.get(k, 0.0)) for k in keys}


# ----------------------------------------------------------------------------- libraries


def dpkit_release(df, query: str) -> Release:
    import dpkit as dp  # noqa: PLC0415
    from dpkit.analytics import Categorical, Metadata, Numeric  # noqa: PLC0415

    meta = Metadata(
        columns={
            "age": Numeric(AGE_LOWER, AGE_UPPER),
            "sex": Categorical(SEX),
            "education": Categorical(EDUCATION),
            "marital-status": Categorical(MARITAL),
        },
        row_level=True,
    )  # Adult: one row per person
    s = dp.Session(df, budget=dp.Budget(epsilon=1e9), metadata=meta)
    _, col, _, agg = QUERIES[query]

    def release() -> dict[str, float]:
        if query == "count_by_sex":
            t = s.group_by("sex").count(epsilon=EPSILON).table
            vcol = "count"
        elif query == "mean_age_by_education":
            t = s.group_by("education").mean("age", epsilon=EPSILON).table
            vcol = "mean_age"
        else:
            t = s.histogram("marital-status", epsilon=EPSILON).table
            vcol = "count"
        return dict(zip(t[col].tolist(), t[vcol].astype(float).tolist(), strict=True))

    return release


def pipelinedp_release(df, query: str) -> Release:
    import pipeline_dp  # noqa: PLC0415

    _, col, keys, agg = QUERIES[query]
    rows = list(zip(range(len(df)), df[col].tolist(), df["age"].tolist(), strict=True))
    M = pipeline_dp.Metrics

    def release() -> dict[str, float]:
        budget = pipeline_dp.NaiveBudgetAccountant(total_epsilon=EPSILON, total_delta=0)
        engine = pipeline_dp.DPEngine(budget, pipeline_dp.LocalBackend())
        kw: dict[str, Any] = {"min_value": AGE_LOWER, "max_value": AGE_UPPER} if agg == "mean" else {}
        params = pipeline_dp.AggregateParams(
            noise_kind=pipeline_dp.NoiseKind.LAPLACE,
            metrics=[M.MEAN if agg == "mean" else M.COUNT],
            max_partitions_contributed=1,
            max_contributions_per_partition=1,
            **kw,
        )
        ex = pipeline_dp.DataExtractors(
            privacy_id_extractor=lambda r: r[0], partition_extractor=lambda r: r[1], value_extractor=lambda r: r[2]
        )
        res = engine.aggregate(rows, params, ex, public_partitions=list(keys))
        budget.compute_budgets()
        return {k: float(m.mean if agg == "mean" else m.count) for k, m in res}

    return release


def opendp_release(df, query: str) -> Release:
    import opendp.prelude as dp  # noqa: PLC0415
    import polars as pl  # noqa: PLC0415

    dp.enable_features("contrib")
    _, col, keys, agg = QUERIES[query]
    lf = pl.from_pandas(df[[col, "age"]]).lazy()
    key_frame = pl.LazyFrame({col: list(keys)})

    def release() -> dict[str, float]:
        ctx = dp.Context.compositor(
            data=lf,
            privacy_unit=dp.unit_of(contributions=1),
            privacy_loss=dp.loss_of(epsilon=EPSILON),
            split_evenly_over=1,
            margins=[dp.polars.Margin(max_length=MAX_LENGTH)],
        )
        expr = (
            pl.col("age").fill_null(AGE_LOWER).dp.mean((AGE_LOWER, AGE_UPPER)) if agg == "mean" else dp.len(signed=True)
        )
        out = ctx.query().group_by(col).agg(expr).with_keys(key_frame).release().collect()
        vcol = "age" if agg == "mean" else "len"
        values = [float("nan") if v is None else float(v) for v in out[vcol].to_list()]
        return dict(zip(out[col].to_list(), values, strict=True))

    return release


BUILDERS = {"dpkit": dpkit_release, "pipelinedp": pipelinedp_release, "opendp": opendp_release}


# ----------------------------------------------------------------------------- measuring


def measure(release: Release, true: dict[str, float], runs: int) -> dict[str, Any]:
    keys = list(true)
    err = np.empty((runs, len(keys)))
    t0 = time.perf_counter()
    for r in range(runs):
        out = release()
        for j, k in enumerate(keys):
            v = out.get(k, float("nan"))
            err[r, j] = abs(v - true[k]) / true[k] if np.isfinite(v) else np.inf
    dt = time.perf_counter() - t0
    per_key = np.median(err, axis=0)
    worst = int(np.argmax(per_key))
    return {
        "status": "ok",
        "runs": runs,
        "keys": len(keys),
        "ms_per_release": 1000 * dt / runs,
        "median_rel_error": float(np.median(err)),
        "p90_rel_error": float(np.quantile(err, 0.9)),
        "mean_rel_error": float(np.mean(err)),
        "missing_or_nan": int(np.isinf(err).sum()),
        "worst_key": keys[worst],
        "worst_key_median_rel_error": float(per_key[worst]),
        "per_key_median_rel_error": {k: float(e) for k, e in zip(keys, per_key, strict=True)},
    }


HEADERS = [
    "query",
    "library",
    "keys",
    "runs",
    "median rel. error",
    "mean rel. error",
    "p90 rel. error",
    "worst key (median)",
    "ms / release",
]
LEFT = ["query", "library", "worst key (median)"]
NOTES = [
    f"UCI Adult adult.data, row-level privacy (each row a unit), ε = {EPSILON:g} per release (δ = 0), public keys from the data dictionary, age bounds [{AGE_LOWER:g}, {AGE_UPPER:g}].",
    "relative error |noisy − true| / true for every key and run; 'median', 'mean' and 'p90' pool all runs × keys values; 'worst key' is the key with the largest median over runs.",
    "counts: dpkit and OpenDP add integer (discrete Laplace) noise, PipelineDP continuous Laplace; at scale 1 (ε = 1, sensitivity 1) the integer noise is exactly 0 in 46% of draws and its median |noise| is 1 (continuous: ln 2 ≈ 0.69), its mean |noise| 0.85 (continuous: 1) — so the pooled median and mean can rank them differently on counts.",
    "each library's default randomness and budget split (a mean spends ε/2 on the count and ε/2 on the sum in all three; dpkit sums ages centred on the middle of the bounds, PipelineDP too, OpenDP uncentred).",
    "OpenDP needs a public bound on the table's length for a float sum: max_length = 100,000 (the true length is 32,561).",
    "ms / release: one private release as a user runs it (session or context, query, noise); OpenDP's time is mostly resolving the measurement (noise-scale calibration), about 0.9 s per query.",
]


def fmt(x: float) -> str:
    return f"{x:.3g}" if np.isfinite(x) else "inf"


def cells(r: dict[str, Any]) -> list[str]:
    head = [QUERIES[r["query"]][0], LIB_NAMES[r["library"]]]
    if r["status"] != "ok":
        return head + ["—", "—", r["status"], "—", "—", "—", "—"]
    return head + [
        str(r["keys"]),
        str(r["runs"]),
        fmt(r["median_rel_error"]),
        fmt(r["mean_rel_error"]),
        fmt(r["p90_rel_error"]),
        f"{r['worst_key']} ({fmt(r['worst_key_median_rel_error'])})",
        f"{r['ms_per_release']:,.3g}" if r["ms_per_release"] < 1000 else f"{r['ms_per_release']:,.0f}",
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--libs", default=",".join(LIBS), help="comma-separated subset of: " + ",".join(LIBS))
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument(
        "--render", type=Path, metavar="JSON", help="print the tables of an earlier results file; run nothing"
    )
    _smoke.add_flag(ap)
    args = ap.parse_args(argv)
    if args.render:
        saved = json.loads(args.render.read_text())
        render(saved["meta"], saved["rows"])
        return 0
    adult = ADULT
    if args.smoke:
        args.runs, args.out, adult = 3, _smoke.out_path("analytics_utility.json"), _smoke.adult_dir() / "adult.data"
        args.libs = ",".join(_smoke.present(args.libs.split(","), {"pipelinedp": "pipeline_dp"}))
    if not adult.exists():
        print(
            f"[bench] UCI Adult not found at {ADULT}: nothing to measure (this benchmark only runs where ../shared/data/adult/ exists).",
            file=sys.stderr,
        )
        return 0
    libs = [x.strip() for x in args.libs.split(",") if x.strip()]
    if set(libs) - set(LIBS):
        ap.error(f"unknown libraries {sorted(set(libs) - set(LIBS))}; choose from {', '.join(LIBS)}")
    warnings.filterwarnings("ignore", category=FutureWarning)
    df = load_adult(adult)
    rows: list[dict[str, Any]] = []
    for query in QUERIES:
        true = truth(df, query)
        for lib in libs:
            print(f"[bench] {QUERIES[query][0]}: {LIB_NAMES[lib]}", file=sys.stderr, flush=True)
            try:
                r = measure(BUILDERS[lib](df, query), true, args.runs)
            except Exception as exc:  # a library call failing: reported, the run goes on
                r = {"status": f"error ({type(exc).__name__}: {str(exc)[:100]})"}
            rows.append({"query": query, "library": lib, "epsilon": EPSILON, **r, "truth": true})
    meta = {
        "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "data": "../shared/data/adult/adult.data",
        "rows": int(len(df)),
        "privacy_unit": "row",
        "epsilon": EPSILON,
        "delta": 0.0,
        "age_bounds": [AGE_LOWER, AGE_UPPER],
        "runs": args.runs,
        "opendp_max_length": MAX_LENGTH,
        "keys": {"sex": SEX, "education": EDUCATION, "marital-status": MARITAL},
        "aggregation": "relative error |noisy-true|/true per key and run; median (and p90) pooled over runs x keys; worst key = largest per-key median over runs",
        "python": platform.python_version(),
        "numpy": np.__version__,
        "cpu_count": os.cpu_count(),
        "versions": {
            d: _report.version(d) for d in ("dpkit", "pipeline-dp", "python-dp", "opendp", "polars", "pandas", "duckdb")
        },
        "notes": NOTES,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2, ensure_ascii=False) + "\n")
    print(f"[bench] wrote {args.out.relative_to(REPO) if args.out.is_relative_to(REPO) else args.out}", file=sys.stderr)
    render(meta, rows)
    if args.smoke:
        return _smoke.finish(
            f"{r['query']}: dpkit: {r['status']}" for r in rows if r["library"] == "dpkit" and r["status"] != "ok"
        )
    return 0


def render(meta: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    """The rich table on stderr and the Markdown table on stdout."""
    table = [cells(r) for r in rows]
    title = f"Private analytics utility on UCI Adult ({meta['rows']:,} rows), ε = {meta['epsilon']:g}, {meta['runs']} runs, {meta['date']}"
    _report.print_table(
        title,
        HEADERS,
        LEFT,
        ((c, r["query"], r["library"] == "dpkit") for c, r in zip(table, rows, strict=True)),
        NOTES,
        to_stderr=True,
        width=200,
        blank_repeats=True,
    )
    print(_report.markdown(title, HEADERS, LEFT, table, NOTES))


if __name__ == "__main__":
    sys.exit(main())
