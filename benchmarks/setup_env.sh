#!/usr/bin/env bash
# Create (or update, idempotently) the benchmark-only virtualenv .venv-bench at the repo root.
# Peer libraries (OpenDP, diffprivlib, scikit-learn, PipelineDP, polars, Spark) live ONLY here,
# never in dpkit's own deps.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

PYTHON="${PYTHON:-python3}"
VENV=".venv-bench"
BIN="$VENV/bin"
STAMP="$VENV/.installed-bench"

# Pins for the peers. diffprivlib 0.6.6 fails to import with scikit-learn 1.9.x
# ("cannot import name DOUBLE from sklearn.tree._tree"); its mechanisms work with 1.8.0.
# opendp[polars] pins polars==1.36.1 (its context API is a polars plugin built for that version),
# which is also the polars of the group-by benchmark. pipeline-dp 0.3.1 brings python-dp 1.1.x.
# dpkit is installed with its [server] extra (FastAPI, uvicorn, psycopg) and httpx is added for the
# HTTP benchmark of the curator service (bench_server.py).
# Tumult Analytics (tmlt.analytics 0.21) is NOT installed: it pins pandas<2 and numpy 1.26 and
# pyspark<3.6, which would downgrade dpkit's own pandas.
PEERS=(
    "opendp[polars]==0.16.0"
    "diffprivlib==0.6.6"
    "scikit-learn==1.8.0"
    "dp-accounting==0.6.0"
    "torch==2.13.0"
    "opacus==1.6.0"
    "rich"
    "pipeline-dp==0.3.1"
    "duckdb"
    "pandas"
    "psutil"
    "pyspark>=3.5"
    "httpx>=0.27"
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

echo "installing dpkit (editable) and peers into $VENV"
"$BIN/python" -m pip install --quiet -e ".[server]" "${PEERS[@]}"
"$BIN/python" - <<'PY'
import importlib, importlib.metadata as md
for name, dist in (("dpkit","dpkit"), ("opendp","opendp"), ("diffprivlib","diffprivlib"), ("sklearn","scikit-learn"), ("rich","rich"), ("numpy","numpy"),
                   ("pipeline_dp","pipeline-dp"), ("duckdb","duckdb"), ("pandas","pandas"), ("polars","polars"), ("pyspark","pyspark"),
                   ("fastapi","fastapi"), ("uvicorn","uvicorn"), ("httpx","httpx"), ("psycopg","psycopg")):
    importlib.import_module(name)
    print(f"  {dist:14s} {md.version(dist)}")
PY
touch "$STAMP"
