#!/usr/bin/env bash
# Create (or update, idempotently) .venv-synth at the repo root: SmartNoise Synth (MST, AIM) for
# the synthetic-data benchmark (benchmarks/bench_synth.py runs its smartnoise contenders with
# .venv-synth/bin/python when that interpreter exists).
#
# SmartNoise Synth cannot share .venv-bench: smartnoise-synth 1.0.8 pins opacus 0.14 (and with it
# an older torch) and private-pgm as `mbi` 1.1.0, which would downgrade the peers of the other
# benchmarks. dpkit is NOT installed here: the benchmark's child process only fits and samples,
# and writes the rows for the parent to score.
#
# mbi 1.1.0's default sampler (`synthetic_data()` without `method=`) assigns values in row order
# and creates false correlations; the benchmark asks for `method="sample"` (see bench_synth.py).
#
#   bash benchmarks/setup_synth_peers.sh                        # PYTHON=python3.11 to pick the interpreter
#   SYNTH_INSTALL_TIMEOUT=900 bash benchmarks/setup_synth_peers.sh   # give up after that many seconds
#
# The virtualenv holds a .gitignore of its own ("*"), so git never sees it.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

PYTHON="${PYTHON:-python3}"
VENV="${SYNTH_VENV:-.venv-synth}"
BIN="$VENV/bin"
STAMP="$VENV/.installed-synth"
TIMEOUT="${SYNTH_INSTALL_TIMEOUT:-600}"

PACKAGES=(
    "smartnoise-synth==1.0.8"
)

# shellcheck source=benchmarks/peer_venv.sh
source benchmarks/peer_venv.sh
status=0
peer_venv "$VENV" "$STAMP" "$TIMEOUT" "benchmarks/$(basename "${BASH_SOURCE[0]}")" "${PACKAGES[@]}" || status=$?
[ "$status" -eq 2 ] && exit 0
"$BIN/python" - <<'PY'
import importlib, importlib.metadata as md
for name, dist in (("snsynth", "smartnoise-synth"), ("mbi", "mbi"), ("opacus", "opacus"), ("torch", "torch"),
                   ("pandas", "pandas"), ("numpy", "numpy")):
    importlib.import_module(name)
    print(f"  {dist:17s} {md.version(dist)}")
PY
touch "$STAMP"
