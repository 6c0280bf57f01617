#!/usr/bin/env bash
# Every DP-SGD GPU row in one run (benchmarks/bench_dpsgd_gpu.py): noise vs torch.randn on the
# device, GPT-2 small, BERT-base full and LoRA, ResNet-18 GroupNorm — non-private, Opacus ghost,
# dpkit exact and continuous noise. A few minutes on an H100; stops at once without CUDA.
#
#   bash benchmarks/gpu_dpsgd.sh [bench_dpsgd_gpu.py options]   # on the GPU machine
#   bash benchmarks/gpu_dpsgd.sh --wheels                        # here, with PyPI: fetch the wheels a
#                                                                # GPU image without them needs (below)
#
# Python: $PYTHON, else .venv-bench/bin/python when its torch sees CUDA, else python3. dpkit is
# imported from this checkout's src/ (no install needed). Packages the GPU image may lack
# (opacus; dpkit's cryptography with cffi/pycparser) are installed from $WHEELS
# (default build/gpu-wheels, git-ignored) into a temporary folder when that folder has wheels;
# `--wheels` downloads them for CPython 3.12 on x86-64 Linux. A package still missing is
# reported as "skipped" in its rows, never fatal. Results: $OUT/dpsgd_gpu.{json,md} when $OUT is
# set, else benchmarks/results/dpsgd_gpu.{json,md}.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
WHEELS="${WHEELS:-build/gpu-wheels}"

if [ "${1:-}" = "--wheels" ]; then
    mkdir -p "$WHEELS"
    python3 -m pip download --no-deps --only-binary=:all: --python-version "${WHEEL_PY:-3.12}" --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d "$WHEELS" opacus==1.6.0 cryptography cffi pycparser
    ls -la "$WHEELS"
    exit 0
fi

if [ -z "${PYTHON:-}" ]; then
    PYTHON=python3
    if [ -x .venv-bench/bin/python ] && .venv-bench/bin/python -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
        PYTHON=.venv-bench/bin/python
    fi
fi

# Fail fast, before installing anything, where there is no GPU.
if ! "$PYTHON" - <<'PY'
import sys
try:
    import torch
except ImportError as exc:
    sys.exit(f"gpu_dpsgd.sh: {sys.executable} cannot import torch ({exc}); set PYTHON to a Python with CUDA torch")
if not torch.cuda.is_available():
    sys.exit(f"gpu_dpsgd.sh: no CUDA device visible to torch {torch.__version__} (CUDA build {torch.version.cuda}); "
             "the DP-SGD GPU rows need a GPU machine (nothing was run)")
print(f"gpu_dpsgd.sh: {torch.cuda.get_device_name()} with torch {torch.__version__}", file=sys.stderr)
PY
then
    exit 2
fi

if compgen -G "$WHEELS/*.whl" >/dev/null; then
    SITE="$(mktemp -d /tmp/dpkit-gpu-site.XXXXXX)"
    # only what the Python lacks: never shadow the image's own numpy/torch
    missing=()
    for whl in "$WHEELS"/*.whl; do
        mod="$(basename "$whl" | cut -d- -f1 | tr 'A-Z-' 'a-z_')"
        "$PYTHON" -c "import $mod" 2>/dev/null || missing+=("$whl")
    done
    if [ "${#missing[@]}" -gt 0 ]; then
        "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" "${missing[@]}"
        export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
    fi
fi
export PYTHONPATH="$ROOT/src${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1

"$PYTHON" -c 'import dpkit.torch' || echo "gpu_dpsgd.sh: warning: dpkit.torch does not import (see above); its rows will record the error" >&2
exec "$PYTHON" benchmarks/bench_dpsgd_gpu.py "$@"
