"""Run every benchmark in smoke mode (``make bench-smoke``, part of ``make test``).

Every ``benchmarks/bench_*.py`` is run with ``--smoke`` (see ``_smoke.py``) by this interpreter,
one after the other, each in its own process with a time limit; a new benchmark is picked up
without being listed, and fails here until it has a smoke mode. One line per script with its wall
time and its CPU time (with the processes it waited for: less disturbed by other load); the output
of a script that failed or timed out is printed in full. Exit status 1 when any failed.

    .venv/bin/python benchmarks/run_smoke.py [--only noise,groupby] [--timeout 180] [-v]
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def scripts(only: str | None) -> list[Path]:
    found = sorted(HERE.glob("bench_*.py"))
    if not only:
        return found
    wanted = {w.strip().removeprefix("bench_").removesuffix(".py") for w in only.split(",") if w.strip()}
    chosen = [p for p in found if p.stem.removeprefix("bench_") in wanted]
    missing = wanted - {p.stem.removeprefix("bench_") for p in chosen}
    if missing:
        raise SystemExit(f"--only: no benchmark named {sorted(missing)}")
    return chosen


def _text(output: bytes | str | None) -> str:
    """A timed-out child's output (bytes, whatever ``text=``)."""
    if isinstance(output, bytes):
        return output.decode(errors="replace")
    return output or ""


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run(script: Path, timeout: float) -> tuple[int | None, float, float, str]:
    """(exit status or None on a timeout, wall seconds, CPU seconds of the script and the processes
    it waited for, the combined output)."""
    t0, cpu0 = time.perf_counter(), _children_cpu()
    try:
        done = subprocess.run(
            [sys.executable, str(script), "--smoke"],
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=HERE.parent,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired as exc:
        return None, time.perf_counter() - t0, _children_cpu() - cpu0, _text(exc.stdout) + _text(exc.stderr)
    return done.returncode, time.perf_counter() - t0, _children_cpu() - cpu0, done.stdout + done.stderr


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", help="comma-separated benchmark names (noise, groupby, ...): these only")
    ap.add_argument("--timeout", type=float, default=180.0, help="seconds per script (default 180)")
    ap.add_argument("-v", "--verbose", action="store_true", help="print every script's output")
    args = ap.parse_args(argv)
    failed = []
    t_all, cpu_all = time.perf_counter(), _children_cpu()
    for script in scripts(args.only):
        status, seconds, cpu, output = run(script, args.timeout)
        ok = status == 0
        verdict = "ok" if ok else ("timed out" if status is None else f"exit {status}")
        skipped = sum(line.startswith("[smoke] skipped") for line in output.splitlines())
        note = f" ({skipped} skipped)" if skipped else ""
        print(f"bench-smoke {script.name:<28} {seconds:5.1f} s (CPU {cpu:4.1f} s)  {verdict}{note}", flush=True)
        if args.verbose or not ok:
            print(output.rstrip() + "\n", flush=True)
        if not ok:
            failed.append(script.name)
    print(
        f"bench-smoke: {time.perf_counter() - t_all:.1f} s in all (CPU {_children_cpu() - cpu_all:.1f} s)", flush=True
    )
    if failed:
        print(f"bench-smoke: FAILED {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
