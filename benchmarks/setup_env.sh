#!/usr/bin/env bash
# Create (or update, idempotently) the benchmark-only virtualenv .venv-bench at the repo root.
# Peer libraries (OpenDP, diffprivlib, scikit-learn) live ONLY here, never in dpkit's own deps.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

PYTHON="${PYTHON:-python3}"
VENV=".venv-bench"
BIN="$VENV/bin"
STAMP="$VENV/.installed-bench"

# Pins for the peers. diffprivlib 0.6.6 fails to import with scikit-learn 1.9.x
# ("cannot import name DOUBLE from sklearn.tree._tree"); its mechanisms work with 1.8.0.
PEERS=(
    "opendp==0.16.0"
    "diffprivlib==0.6.6"
    "scikit-learn==1.8.0"
    "dp-accounting==0.6.0"
    "torch==2.13.0"
    "opacus==1.6.0"
    "rich"
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
"$BIN/python" -m pip install --quiet -e . "${PEERS[@]}"
"$BIN/python" - <<'PY'
import importlib, importlib.metadata as md
for name, dist in (("dpkit","dpkit"), ("opendp","opendp"), ("diffprivlib","diffprivlib"), ("sklearn","scikit-learn"), ("rich","rich"), ("numpy","numpy")):
    importlib.import_module(name)
    print(f"  {dist:14s} {md.version(dist)}")
PY
touch "$STAMP"
