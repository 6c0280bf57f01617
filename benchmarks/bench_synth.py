"""Private synthetic data on UCI Adult: dpkit.synth against SmartNoise Synth, a floor and a reference.

Data: the UCI Adult files beside the repository, ``../shared/data/adult/`` from the repo root
(``adult.data``, 32,561 training rows; ``adult.test``, 16,281 test rows, whose labels lose their
trailing '.'). They are read in place, never copied; without them the benchmark says so and
exits 0.

Discretisation (14 attributes; ``fnlwgt`` dropped). Every contender is scored on these cells:

* ``age``: 10-wide bins from 17 (17–26, 27–36, …, 87–96); ``hours-per-week``: 10-wide bins
  0–9, 10–19, …, 90–99; ``education-num``: its 16 values (unit bins from 1 to 16);
  ``capital-gain``: 4 bins (0, 1–4,999, 5,000–9,999, 10,000 and more); ``capital-loss``: 3 bins
  (0, 1–1,999, 2,000 and more). Values beyond the first or last edge count in the edge bins.
* The categorical columns as they are, with '?' (unknown) a category of its own; the label ``Y``
  (``<=50K`` / ``>50K``).

The domain is public: the bin edges above and the category lists of ``adult.names`` (plus '?',
the file's unknown marker, for every categorical attribute) are written here as literals; nothing
about the domain is read from the data.

Contenders, each in a subprocess of its own (its wall time for fit + sample and its peak resident
memory, ``VmHWM``, are measured inside it; the data are loaded before the clock starts):

* ``resample`` — the noise floor: a bootstrap sample of the real training rows (not private).
* ``independent`` — each column drawn independently from its true one-way marginal (not
  private): what a synthesizer scores that keeps no correlation at all.
* ``dpkit`` — ``dpkit.synth.Synthesizer`` (its default method) with the Adult metadata below
  (row-level privacy, every column declared ``nullable: false``, numeric columns with the bin
  edges above), fitted on the raw training
  frame; ``dpkit-mst`` — the same with ``method="mst"``. The rows it samples (numeric values
  drawn inside their bin) are discretised like the real ones.
* ``smartnoise-mst`` — SmartNoise Synth 1.0.8 ``Synthesizer.create("mst", epsilon=ε, delta=δ)``
  on the discretised columns, all categorical, run by ``.venv-synth/bin/python``
  (``benchmarks/setup_synth_peers.sh``) when it exists. Its rows are drawn with mbi's
  ``synthetic_data(method="sample")``: mbi 1.1.0's default sampler assigns values in row order and
  creates false correlations. SmartNoise reads the category lists from the data (not charged to
  ε) and its noise comes from OpenDP (not seedable: only its selection and sampling follow the seed).
* ``smartnoise-aim`` — ``Synthesizer.create("aim", ...)``, only with ``--aim`` (stock AIM takes
  over 25 minutes on Adult on 2 cores; ``--aim-rounds`` caps its rounds, which must exceed the
  number of columns: SmartNoise measures the one-way marginals with the per-round σ, so with
  fewer rounds they alone overspend ρ and its selection fails on NaN probabilities).

Every contender samples as many rows as the training file has. Privacy: add/remove one row,
ε ∈ {0.3, 1, 3}, δ = 1e-9, 3 seeds (the seed drives dpkit's ``rng=`` — a seeded fit is for
benchmarks only — and numpy's global generator in the SmartNoise child).

Metrics, on the discretised columns: the average total variation distance (½ L1 between
normalised counts) over all 91 two-way marginals and over a fixed sample of 100 of the 364
three-way marginals (the same triples for every run), one-way too in the JSON
(:func:`dpkit.synth.evaluate.marginal_tvd`); train-on-synthetic, test-on-real accuracy of a
logistic regression predicting ``Y`` from the 13 other columns one-hot
(:func:`dpkit.synth.evaluate.tstr_accuracy`); the missing cells of the synthetic table (Adult
has none: each is invented); fit + sample seconds; peak MiB of the process.

``--census-rows N`` adds dpkit on the project's census generator (``dpkit.datasets.census``,
privacy unit ``person_id``, its ``CENSUS_METADATA``, default bins) for time and memory only: N
rows written to a Parquet file first, then fitted from the file and N rows sampled;
``--census-spark`` fits the same file on Spark too (``local[2]``, 1 GB driver), and the
``dpkit-spark`` contender fits Adult on Spark (the same marginals as on DuckDB: with the same seed,
the same table). Spark rows record Spark's start-up apart and the driver JVM's peak RSS.

    .venv-bench/bin/python benchmarks/bench_synth.py                        # all contenders, 3 ε × 3 seeds
    .venv-bench/bin/python benchmarks/bench_synth.py --only resample,independent,smartnoise-mst --epsilons 1
    .venv-bench/bin/python benchmarks/bench_synth.py --only dpkit --seeds 0 --epsilons 1 --out /tmp/synth.json
    .venv-bench/bin/python benchmarks/bench_synth.py --census-rows 1000000 --only none
    .venv-bench/bin/python benchmarks/bench_synth.py --only dpkit,dpkit-spark --epsilons 1 --census-rows 1000000 --census-spark
    .venv-bench/bin/python benchmarks/bench_synth.py --render benchmarks/results/synth.json

Results: ``benchmarks/results/synth.json`` (every run, then mean ± sd over seeds) and a Markdown
table on stdout. The load average is recorded for each run: this is meant for a shared 2-core
machine.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import _report
import _smoke

REPO = Path(__file__).resolve().parent.parent
ADULT_DIR = REPO / ".." / "shared" / "data" / "adult"
DEFAULT_OUT = REPO / "benchmarks" / "results" / "synth.json"
SYNTH_PYTHON = REPO / ".venv-synth" / "bin" / "python"

DELTA = 1e-9
EPSILONS = (0.3, 1.0, 3.0)
SEEDS = (0, 1, 2)
THREE_WAY = 100  # three-way marginals sampled, the same for every run
THREE_WAY_SEED = 0
TARGET = "Y"
CONTENDERS = ("resample", "independent", "dpkit", "dpkit-mst", "dpkit-spark", "smartnoise-mst", "smartnoise-aim")
DEFAULT_CONTENDERS = ("resample", "independent", "dpkit", "dpkit-mst", "smartnoise-mst")
NOT_PRIVATE = ("resample", "independent")
LABELS = {
    "resample": "resampling the real rows (floor, not private)",
    "independent": "independent columns (reference, not private)",
    "dpkit": "dpkit Synthesizer (default method)",
    "dpkit-mst": "dpkit Synthesizer, method='mst'",
    "dpkit-spark": "dpkit Synthesizer, marginals counted on Spark local[2]",
    "smartnoise-mst": "SmartNoise MST",
    "smartnoise-aim": "SmartNoise AIM",
}

# -- the public schema of UCI Adult (adult.names), written out: never read from the data ----------

UNKNOWN = "?"  # adult.names: "Convert Unknown to '?'"
CATEGORIES: dict[str, tuple[str, ...]] = {
    "workclass": (
        "Private", "Self-emp-not-inc", "Self-emp-inc", "Federal-gov", "Local-gov", "State-gov", "Without-pay",
        "Never-worked",
    ),
    "education": (
        "Bachelors", "Some-college", "11th", "HS-grad", "Prof-school", "Assoc-acdm", "Assoc-voc", "9th", "7th-8th",
        "12th", "Masters", "1st-4th", "10th", "Doctorate", "5th-6th", "Preschool",
    ),
    "marital-status": (
        "Married-civ-spouse", "Divorced", "Never-married", "Separated", "Widowed", "Married-spouse-absent",
        "Married-AF-spouse",
    ),
    "occupation": (
        "Tech-support", "Craft-repair", "Other-service", "Sales", "Exec-managerial", "Prof-specialty",
        "Handlers-cleaners", "Machine-op-inspct", "Adm-clerical", "Farming-fishing", "Transport-moving",
        "Priv-house-serv", "Protective-serv", "Armed-Forces",
    ),
    "relationship": ("Wife", "Own-child", "Husband", "Not-in-family", "Other-relative", "Unmarried"),
    "race": ("White", "Asian-Pac-Islander", "Amer-Indian-Eskimo", "Other", "Black"),
    "sex": ("Female", "Male"),
    "native-country": (
        "United-States", "Cambodia", "England", "Puerto-Rico", "Canada", "Germany", "Outlying-US(Guam-USVI-etc)",
        "India", "Japan", "Greece", "South", "China", "Cuba", "Iran", "Honduras", "Philippines", "Italy", "Poland",
        "Jamaica", "Vietnam", "Mexico", "Portugal", "Ireland", "France", "Dominican-Republic", "Laos", "Ecuador",
        "Taiwan", "Haiti", "Columbia", "Hungary", "Guatemala", "Nicaragua", "Scotland", "Thailand", "Yugoslavia",
        "El-Salvador", "Trinadad&Tobago", "Peru", "Hong", "Holand-Netherlands",
    ),
}  # fmt: skip
LABEL_VALUES = ("<=50K", ">50K")
# Numeric columns: declared bounds (adult.names' census domains) and the benchmark's bin edges.
BOUNDS: dict[str, tuple[float, float]] = {
    "age": (17, 90),
    "education-num": (1, 16),
    "capital-gain": (0, 99_999),
    "capital-loss": (0, 4_356),
    "hours-per-week": (1, 99),
}
BINS: dict[str, tuple[float, ...]] = {
    "age": tuple(range(17, 98, 10)),  # 17, 27, …, 97: 8 bins
    "education-num": tuple(range(1, 18)),  # 16 unit bins: the values themselves
    "capital-gain": (0, 1, 5_000, 10_000, 100_000),
    "capital-loss": (0, 1, 2_000, 4_357),
    "hours-per-week": tuple(range(0, 101, 10)),  # 0, 10, …, 100: 10 bins
}
# The 14 attributes, in the file's order (fnlwgt dropped).
COLUMNS = (
    "age", "workclass", "education", "education-num", "marital-status", "occupation", "relationship", "race",
    "sex", "capital-gain", "capital-loss", "hours-per-week", "native-country", TARGET,
)  # fmt: skip
MISSING = "(missing)"
SMOKE_ROUNDS = 2  # dpkit's AIM rounds in a smoke run (its default spends most of a minute on them)


def adult_metadata() -> Any:
    """The curator's metadata for the 14 attributes (row-level privacy). Every column is declared
    never missing (``nullable=False``): adult.names marks unknown values with '?', a category of
    its own, so no value is NULL, and a synthetic table needs no missing cell."""
    from dpkit.analytics import Categorical, Metadata, Numeric

    columns: dict[str, Any] = {}
    for name in COLUMNS:
        if name in BOUNDS:
            columns[name] = Numeric(*BOUNDS[name], nullable=False)
        elif name == TARGET:
            columns[name] = Categorical(LABEL_VALUES, nullable=False)
        else:
            columns[name] = Categorical((*CATEGORIES[name], UNKNOWN), nullable=False)
    return Metadata(columns=columns, row_level=True)


def load_adult(split: str, folder: Path = ADULT_DIR) -> Any:
    """The raw 14 attributes of ``adult.data`` (``"train"``) or ``adult.test`` (``"test"``)."""
    import pandas as pd

    path = folder / ("adult.data" if split == "train" else "adult.test")
    text = {c: str for c in (*CATEGORIES, TARGET)}
    frame = pd.read_csv(path, skipinitialspace=True, dtype=text, keep_default_na=False, na_values=[""])
    frame = frame[list(COLUMNS)].copy()
    frame[TARGET] = frame[TARGET].str.strip().str.rstrip(".")
    return frame


def discretise(frame: Any) -> Any:
    """The benchmark's cells, as text labels: numeric columns binned by :data:`BINS` (clipped into
    the edge bins), categorical columns as they are; missing values one label."""
    import numpy as np
    import pandas as pd

    out = {}
    for name in COLUMNS:
        col = frame[name]
        if name in BINS:
            e = np.asarray(BINS[name], dtype=float)
            labels = np.array([f"[{e[i]:g}, {e[i + 1]:g})" for i in range(e.size - 1)] + [MISSING], dtype=object)
            x = pd.to_numeric(col, errors="coerce").to_numpy(dtype=float, na_value=np.nan)
            k = np.searchsorted(e[1:-1], x, side="right")
            k[np.isnan(x)] = e.size - 1
            out[name] = labels[k]
        else:
            out[name] = col.astype(object).where(col.notna(), MISSING).astype(str).to_numpy()
    return pd.DataFrame(out)


# -- the child: one fit + sample, measured inside its own process ----------------------------------


def _versions(names: tuple[str, ...]) -> dict[str, str | None]:
    return {n: _report.version(n) for n in names}


def child(spec: dict[str, Any]) -> dict[str, Any]:
    import numpy as np
    import pandas as pd

    contender, seed, eps = spec["contender"], int(spec["seed"]), spec.get("epsilon")
    out: dict[str, Any] = {}
    if contender == "census-data":
        from dpkit.datasets import census

        rows = int(spec["rows"])
        frame = census(people=math.ceil(rows / 1.38 * 1.05), seed=seed).head(rows)
        frame.to_parquet(spec["output"], index=False)
        return {"rows": len(frame)}
    if contender.startswith(("dpkit", "census-dpkit")):
        from dpkit.synth import Synthesizer

        spark = None
        if contender.endswith("-spark"):
            from dpkit.analytics.engines.spark import spark_session

            started = time.perf_counter()
            spark = spark_session(
                spec.get("master") or "local[2]",
                {
                    "spark.driver.memory": "1g",
                    "spark.sql.shuffle.partitions": "4",
                    "spark.ui.enabled": "false",
                    "spark.sql.execution.arrow.pyspark.enabled": "true",
                },
                app_name="bench_synth",
            )
            spark.sparkContext.setLogLevel("ERROR")
            out["spark_start_seconds"] = time.perf_counter() - started
            from bench_scale import _JvmPeak  # the driver JVM's sampler of the scale benchmark

            jvm_peak = _JvmPeak()

        method = {"dpkit-mst": {"method": "mst"}}.get(contender.removeprefix("census-"), {})
        if spec.get("rounds") and not method:  # a smoke run's few AIM rounds
            method = {"rounds": int(spec["rounds"])}
        if contender.startswith("census-"):
            from dpkit.datasets import CENSUS_METADATA

            data: Any = spec["input"]
            n, meta, bins = int(spec["rows"]), CENSUS_METADATA, None
        else:
            data = load_adult("train", Path(spec.get("adult", ADULT_DIR)))
            n, meta, bins = len(data), adult_metadata(), {k: list(v) for k, v in BINS.items()}
        if spark is not None:  # the same rows as a Spark DataFrame: Parquet read in place, or Adult from pandas
            if contender.startswith("census-"):
                from dpkit.analytics.engines.spark_parquet import read_parquet

                data = read_parquet(spark, data)
            else:
                data = spark.createDataFrame(data)
        start = time.perf_counter()
        syn = Synthesizer(
            epsilon=eps,
            delta=DELTA,
            metadata=meta,
            bins=bins,
            rng=np.random.default_rng(seed),
            progress=False,
            **method,
        )
        syn.fit(data)
        rows = syn.sample(n)
        seconds = time.perf_counter() - start
        if not contender.startswith("census-"):
            discretise(rows).to_csv(spec["output"], index=False)
        report = syn.report
        out["report"] = {
            "method": getattr(report, "method", None),
            "pairs": [list(p) for p in getattr(report, "selected", None) or getattr(report, "tree", ())],
            "estimated_rows": getattr(report, "rows", None),
        }
        out["versions"] = _versions(("numpy", "pandas", "duckdb", "pyspark"))
        if spark is not None:
            out.update(jvm_peak.stop())  # jvm_peak_mib (no executors in local mode)
    else:
        train = pd.read_csv(spec["input"], dtype=str, keep_default_na=False)
        n = len(train)
        if contender == "resample":
            rng = np.random.default_rng(seed)
            start = time.perf_counter()
            rows = train.iloc[rng.integers(0, n, n)].reset_index(drop=True)
        elif contender == "independent":
            rng = np.random.default_rng(seed)
            start = time.perf_counter()
            rows = pd.DataFrame({c: train[c].to_numpy()[rng.integers(0, n, n)] for c in train.columns})
        else:  # smartnoise-mst, smartnoise-aim
            np.random.seed(seed)
            from snsynth import Synthesizer as SNSynthesizer

            kind = contender.removeprefix("smartnoise-")
            kwargs = {"rounds": spec["aim_rounds"]} if kind == "aim" and spec.get("aim_rounds") else {}
            start = time.perf_counter()
            syn = SNSynthesizer.create(kind, epsilon=float(eps), delta=DELTA, **kwargs)
            syn.fit(train, categorical_columns=list(train.columns), preprocessor_eps=0.0)
            # mbi 1.1.0's default sampler ("round") assigns values in row order: i.i.d. sampling instead.
            data = syn.synthesizer.synthetic_data(rows=n, method="sample")
            if kind == "mst":
                cells = syn.undo_compress_fn(data).df
            else:
                cells = data.df[["col" + str(i) for i in range(syn._transformer.output_width)]]
            rows = syn._transformer.inverse_transform([tuple(t[1:]) for t in cells.itertuples()])
            out["versions"] = _versions(("smartnoise-synth", "mbi", "opendp", "numpy", "pandas", "torch", "jax"))
        seconds = time.perf_counter() - start
        rows = pd.DataFrame(rows, columns=list(train.columns))
        rows.to_csv(spec["output"], index=False)
    out.update(seconds=seconds, rows=len(rows))
    return out


def peak_mib() -> float:
    """This process's peak resident memory. On Linux, the high-water mark of its own address space
    (``VmHWM``): ``ru_maxrss`` would also count the parent's memory, inherited by the fork before
    the interpreter was exec'd."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024  # kB
    except OSError:
        pass
    scale = 1 if sys.platform == "darwin" else 1024  # ru_maxrss: bytes on macOS, KiB elsewhere
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale / 2**20


def _child_main(arg: str) -> None:
    spec = json.loads(arg)
    result = child(spec)
    result["peak_mib"] = peak_mib()
    print(json.dumps(result))


# -- the parent: run the children, score their rows ------------------------------------------------


def git_state() -> str | None:
    """The commit measured, with ``+dirty`` when src/dpkit has uncommitted changes."""
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO, check=True
        ).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "src/dpkit"], capture_output=True, text=True, cwd=REPO)
    except (OSError, subprocess.CalledProcessError):
        return None
    return commit + ("+dirty" if dirty.stdout.strip() else "")


def run_child(spec: dict[str, Any], python: str, timeout: float, *, here: bool = False) -> dict[str, Any]:
    """One contender's run in a fresh process (``here``: in this one, for a smoke run, whose time
    would go mostly to the child's start-up; an exception is then raised, not recorded)."""
    load = os.getloadavg()
    started = time.perf_counter()
    if here:
        return {"load_1min": load[0], **child(spec), "peak_mib": peak_mib(), "wall_s": time.perf_counter() - started}
    try:
        proc = subprocess.run(
            [python, str(Path(__file__).resolve()), "--child", json.dumps(spec)],
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=REPO,
        )
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:g} s", "load_1min": load[0]}
    result: dict[str, Any] = {"load_1min": load[0], "load_5min": load[1], "wall_s": time.perf_counter() - started}
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        result["error"] = f"exit {proc.returncode}: " + " / ".join(tail)
        return result
    result.update(json.loads(lines[-1]))
    result["load_1min_end"] = os.getloadavg()[0]
    return result


def score(rows_path: str, real: Any, test: Any, triples_rng_seed: int) -> dict[str, float]:
    import numpy as np
    import pandas as pd

    from dpkit.synth.evaluate import marginal_tvd, tstr_accuracy

    synthetic = pd.read_csv(rows_path, dtype=str, keep_default_na=False)
    return {
        # Adult has no missing value: every missing cell of a synthetic table is invented
        "missing_cells": int((synthetic == MISSING).to_numpy().sum()),
        "tvd_1way": marginal_tvd(real, synthetic, way=1),
        "tvd_2way": marginal_tvd(real, synthetic, way=2),
        "tvd_3way": marginal_tvd(
            real, synthetic, way=3, max_marginals=THREE_WAY, rng=np.random.default_rng(triples_rng_seed)
        ),
        "tstr_accuracy": tstr_accuracy(synthetic, test, target=TARGET),
    }


def _mean_sd(values: list[float]) -> tuple[float, float | None]:
    m = sum(values) / len(values)
    if len(values) < 2:
        return m, None
    return m, math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1))


METRICS = ("tvd_1way", "tvd_2way", "tvd_3way", "tstr_accuracy", "missing_cells", "seconds", "peak_mib", "load_1min")


def summarise(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    groups: dict[tuple[str, float | None], list[dict[str, Any]]] = {}
    for r in runs:
        groups.setdefault((r["contender"], r.get("epsilon")), []).append(r)
    out = []
    for (contender, eps), rs in groups.items():
        ok = [r for r in rs if "error" not in r]
        row: dict[str, Any] = {"contender": contender, "epsilon": eps, "runs": len(rs), "ok": len(ok)}
        for m in METRICS:
            values = [float(r[m]) for r in ok if r.get(m) is not None]
            if values:
                row[m], row[m + "_sd"] = _mean_sd(values)
        errors = sorted({r["error"] for r in rs if "error" in r})
        if errors:
            row["errors"] = errors
        out.append(row)
    order = {c: i for i, c in enumerate(CONTENDERS)}
    out.sort(key=lambda r: (order.get(r["contender"], 99), -1 if r["epsilon"] is None else r["epsilon"]))
    return out


def _fmt(row: dict[str, Any], m: str, digits: int) -> str:
    if m not in row:
        return "–"
    sd = row.get(m + "_sd")
    value = f"{row[m]:.{digits}f}"
    return value if sd is None else f"{value} ± {sd:.{digits}f}"


def table(summary: list[dict[str, Any]]) -> str:
    headers = [
        "method",
        "ε",
        "seeds",
        "2-way TVD",
        "3-way TVD",
        "TSTR accuracy",
        "missing cells",
        "fit + sample (s)",
        "peak MiB",
        "load",
    ]
    rows = []
    for r in summary:
        eps = "–" if r["epsilon"] is None else f"{r['epsilon']:g}"
        seeds = f"{r['ok']}" if r["ok"] == r["runs"] else f"{r['ok']} of {r['runs']}"
        rows.append(
            [
                LABELS.get(r["contender"], r["contender"]),
                eps,
                seeds,
                _fmt(r, "tvd_2way", 4),
                _fmt(r, "tvd_3way", 4),
                _fmt(r, "tstr_accuracy", 4),
                _fmt(r, "missing_cells", 0),
                _fmt(r, "seconds", 1),
                _fmt(r, "peak_mib", 0),
                f"{r['load_1min']:.1f}" if "load_1min" in r else "–",
            ]
        )
    notes = [
        f"mean ± sd over seeds; TVD over all 2-way and {THREE_WAY} fixed 3-way marginals of the 14 discretised "
        f"attributes; TSTR: logistic regression trained on the synthetic rows, tested on adult.test; δ = {DELTA:g}",
        "load: 1-minute load average when the runs started (2 cores)",
    ]
    for r in summary:
        for e in r.get("errors", []):
            notes.append(f"{r['contender']} ε={r['epsilon']}: {e}")
    return _report.markdown("", headers, ["method"], rows, notes).lstrip("\n")


def goals(summary: list[dict[str, Any]], census: list[dict[str, Any]]) -> list[str]:
    by = {(r["contender"], r["epsilon"]): r for r in summary}
    lines = []
    d = by.get(("dpkit", 1.0))
    if d and "tvd_2way" in d:
        checks = [
            ("2-way TVD", d["tvd_2way"], "<=", 0.020),
            ("3-way TVD", d["tvd_3way"], "<=", 0.050),
            ("TSTR accuracy", d["tstr_accuracy"], ">=", 0.81),
            ("invented missing cells", d.get("missing_cells", math.nan), "<=", 0),
            ("fit + sample s", d["seconds"], "<=", 60),
            ("peak MiB", d["peak_mib"], "<=", 1024),
        ]
        for name, value, op, goal in checks:
            ok = value <= goal if op == "<=" else value >= goal  # (NaN, not measured: missed)
            lines.append(f"ε = 1, {name}: {value:.4g} (goal {op} {goal:g}) — {'met' if ok else 'MISSED'}")
    for (contender, eps), r in sorted(by.items(), key=lambda kv: (kv[0][0], kv[0][1] or 0)):
        if contender != "dpkit" or (("smartnoise-mst", eps) not in by) or "tvd_2way" not in r:
            continue
        m = by[("smartnoise-mst", eps)]
        if "tvd_2way" not in m:
            continue
        worse = [
            name
            for name, key, lower_is_better in (
                ("2-way", "tvd_2way", True),
                ("3-way", "tvd_3way", True),
                ("TSTR", "tstr_accuracy", False),
            )
            if (r[key] > m[key] if lower_is_better else r[key] < m[key])
        ]
        verdict = "never worse" if not worse else "worse on " + ", ".join(worse)
        lines.append(
            f"ε = {eps:g} against SmartNoise MST: {verdict} (2-way {r['tvd_2way']:.4f} vs {m['tvd_2way']:.4f}, "
            f"3-way {r['tvd_3way']:.4f} vs {m['tvd_3way']:.4f}, TSTR {r['tstr_accuracy']:.4f} vs {m['tstr_accuracy']:.4f})"
        )
    for c in census:
        if "error" in c:
            lines.append(f"census {c['rows_asked']:,} rows ({c['contender']}): {c['error']}")
        else:
            lines.append(
                f"census {c['rows']:,} rows ({c['contender']}, ε = {c['epsilon']:g}): fit + sample {c['seconds']:.1f} s, "
                f"peak {c['peak_mib']:.0f} MiB"
                + (f" (+ driver JVM {c['jvm_peak_mib']:.0f} MiB)" if "jvm_peak_mib" in c else "")
                + f" (load {c['load_1min']:.1f})"
            )
    return lines


def render(result: dict[str, Any]) -> str:
    parts = [table(result["summary"])] if result["summary"] else []
    lines = goals(result["summary"], result.get("census", []))
    if lines:
        parts.append("Against the goals:\n\n" + "\n".join(f"- {line}" for line in lines))
    return "\n\n".join(parts)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument(
        "--only", default=",".join(DEFAULT_CONTENDERS), help="contenders, comma-separated ('none': skip Adult)"
    )
    parser.add_argument("--seeds", default=",".join(map(str, SEEDS)))
    parser.add_argument("--epsilons", default=",".join(f"{e:g}" for e in EPSILONS))
    parser.add_argument("--aim", action="store_true", help="also run smartnoise-aim (slow)")
    parser.add_argument(
        "--aim-rounds",
        type=int,
        default=None,
        help="SmartNoise AIM's rounds (default: its own, 16 per column); more than the 14 columns, or its "
        "one-way measurements alone overspend ρ and its selection fails on NaN probabilities",
    )
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per fit + sample (default 1800)")
    parser.add_argument("--aim-timeout", type=float, default=1800.0, help="seconds per SmartNoise AIM run")
    parser.add_argument("--census-rows", type=int, default=0, help="also time dpkit on this many census rows")
    parser.add_argument(
        "--census-spark", action="store_true", help="with --census-rows: dpkit on Spark local[2] too (1 GB driver)"
    )
    parser.add_argument("--synth-python", default=str(SYNTH_PYTHON), help="the interpreter with smartnoise-synth")
    parser.add_argument("--out", default=str(DEFAULT_OUT))
    parser.add_argument("--render", metavar="JSON", help="print the table of a saved result and exit")
    _smoke.add_flag(parser)
    args = parser.parse_args()
    if args.child:
        _child_main(args.child)
        return 0
    if args.render:
        print(render(json.loads(Path(args.render).read_text())))
        return 0

    contenders = [] if args.only == "none" else [c.strip() for c in args.only.split(",") if c.strip()]
    if args.aim and "smartnoise-aim" not in contenders:
        contenders.append("smartnoise-aim")
    unknown = sorted(set(contenders) - set(CONTENDERS))
    if unknown:
        parser.error(f"unknown contenders {unknown}: choose from {', '.join(CONTENDERS)}")
    adult = ADULT_DIR
    failures: list[str] = []
    if args.smoke:
        args.seeds, args.epsilons, args.census_rows, args.out = "0", "1", 1_000, str(_smoke.out_path("synth.json"))
        adult = _smoke.adult_dir()
        for c in [c for c in contenders if c == "dpkit-spark"] + (["census-dpkit-spark"] if args.census_spark else []):
            _smoke.skip(c, "a Spark session takes longer to start than a whole smoke run")
            failures += _smoke.missing("dpkit.analytics.engines.spark", "spark_session")
            failures += _smoke.missing("dpkit.analytics.engines.spark_parquet", "read_parquet")
        contenders = [c for c in contenders if c != "dpkit-spark"]
        args.census_spark = False
    seeds = [int(s) for s in args.seeds.split(",")]
    epsilons = [float(e) for e in args.epsilons.split(",")]
    if contenders and not (adult / "adult.data").exists():
        print(
            f"[bench] UCI Adult not found at {adult}: nothing to measure (this benchmark runs only where "
            "../shared/data/adult/ exists beside the repository).",
            file=sys.stderr,
        )
        contenders = []
        if not args.census_rows:
            return 0
    smartnoise = [c for c in contenders if c.startswith("smartnoise")]
    if smartnoise and (args.smoke or not Path(args.synth_python).exists()):
        why = "its own virtualenv" if args.smoke else f"{args.synth_python} not found"
        for c in smartnoise:
            _smoke.skip(c, f"{why} (bash benchmarks/setup_synth_peers.sh)")
        contenders = [c for c in contenders if c not in smartnoise]

    commit = git_state()  # before the runs: the code measured
    runs: list[dict[str, Any]] = []
    census_runs: list[dict[str, Any]] = []
    peer_versions: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench_synth_") as tmp:
        if contenders:
            real, test = discretise(load_adult("train", adult)), discretise(load_adult("test", adult))
            train_csv = str(Path(tmp) / "train.csv")
            real.to_csv(train_csv, index=False)
            plan: list[tuple[str, float | None, int]] = []
            for i, eps in enumerate(epsilons):
                for seed in seeds:
                    for c in contenders:
                        if c in NOT_PRIVATE:
                            if i == 0:
                                plan.append((c, None, seed))
                        else:
                            plan.append((c, eps, seed))
            for k, (c, eps, seed) in enumerate(plan, 1):
                output = str(Path(tmp) / f"{c}_{eps}_{seed}.csv")
                spec = {
                    "contender": c, "epsilon": eps, "seed": seed, "input": train_csv, "output": output,
                    "aim_rounds": args.aim_rounds, "adult": str(adult), "rounds": SMOKE_ROUNDS if args.smoke else None,
                }  # fmt: skip
                python = args.synth_python if c.startswith("smartnoise") else sys.executable
                timeout = args.aim_timeout if c == "smartnoise-aim" else args.timeout
                print(
                    f"[bench] {k}/{len(plan)} {c} ε={eps} seed={seed} (load {os.getloadavg()[0]:.1f})", file=sys.stderr
                )
                result = run_child(spec, python, timeout, here=args.smoke)
                if "error" not in result:
                    result.update(score(output, real, test, THREE_WAY_SEED))
                    if c.startswith("smartnoise"):
                        peer_versions.update(result.get("versions", {}))
                    result.pop("versions", None)
                    print(
                        f"[bench]   2-way {result['tvd_2way']:.4f}  3-way {result['tvd_3way']:.4f}  "
                        f"TSTR {result['tstr_accuracy']:.4f}  {result['seconds']:.1f} s  {result['peak_mib']:.0f} MiB",
                        file=sys.stderr,
                    )
                else:
                    print(f"[bench]   {result['error']}", file=sys.stderr)
                runs.append({"contender": c, "epsilon": eps, "seed": seed, **result})
        if args.census_rows:
            path = str(Path(tmp) / "census.parquet")
            print(f"[bench] generating {args.census_rows:,} census rows", file=sys.stderr)
            made = run_child(
                {"contender": "census-data", "seed": 0, "rows": args.census_rows, "output": path},
                sys.executable,
                args.timeout,
                here=args.smoke,
            )
            if "error" in made:
                census_runs.append({"contender": "census-dpkit", "rows_asked": args.census_rows, **made})
            else:
                for c in ("census-dpkit", *(("census-dpkit-spark",) if args.census_spark else ())):
                    print(f"[bench] {c} on {args.census_rows:,} rows", file=sys.stderr)
                    spec = {"contender": c, "epsilon": 1.0, "seed": 0, "input": path, "rows": args.census_rows,
                            "rounds": SMOKE_ROUNDS if args.smoke else None}  # fmt: skip
                    result = run_child(spec, sys.executable, args.timeout, here=args.smoke)
                    result.pop("versions", None)
                    census_runs.append({"contender": c, "epsilon": 1.0, "rows_asked": args.census_rows, **result})
                    print(f"[bench]   {json.dumps(result)}", file=sys.stderr)

    summary = summarise(runs)
    result = {
        "benchmark": "synth",
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "date_utc": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M"),
        "dpkit_commit": commit,
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
        "versions": {
            **_versions(("dpkit", "numpy", "pandas", "duckdb", "scikit-learn")),
            **{f"smartnoise env: {k}": v for k, v in peer_versions.items()},
        },
        "settings": {
            "delta": DELTA,
            "epsilons": epsilons,
            "seeds": seeds,
            "contenders": contenders,
            "three_way_sample": THREE_WAY,
            "three_way_seed": THREE_WAY_SEED,
            "bins": BINS,
            "target": TARGET,
            "columns": list(COLUMNS),
        },  # fmt: skip
        "runs": runs,
        "summary": summary,
        "census": census_runs,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(render(result))
    print(f"\n[bench] wrote {out}", file=sys.stderr)
    failures += [f"{r['contender']}: {r['error']}" for r in runs + census_runs if "error" in r]
    return _smoke.finish(failures) if args.smoke else 0


if __name__ == "__main__":
    sys.exit(main())
