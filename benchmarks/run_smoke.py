"""Run every benchmark in smoke mode (``make bench-smoke``, part of ``make test``).

Every ``benchmarks/bench_*.py`` is run with ``--smoke`` (see ``_smoke.py``) by this interpreter,
``--jobs`` at a time (default 2, the cores CI has), each in its own process with a time limit; a
new benchmark is picked up without being listed, and fails here until it has a smoke mode. One
line per script with its wall time and its CPU time (with the processes it waited for: less
disturbed by other load); the output of a script that failed or timed out is printed in full.
Exit status 1 when any failed.

    .venv/bin/python benchmarks/run_smoke.py [--only noise,groupby] [--jobs 2] [--timeout 180] [-v]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
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


def run(script: Path, timeout: float) -> tuple[int | None, float, float, str]:
    """(exit status or None on a timeout, wall seconds, CPU seconds of the script and the processes
    it waited for, the combined output)."""
    t0 = time.perf_counter()
    with tempfile.TemporaryFile() as out:
        proc = subprocess.Popen(
            [sys.executable, str(script), "--smoke"],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=HERE.parent,
            stdin=subprocess.DEVNULL,
        )
        timer = threading.Timer(timeout, proc.kill)
        timer.start()
        # wait4 gives this child's own CPU time: scripts run side by side here.
        _, status, usage = os.wait4(proc.pid, 0)
        timed_out = not timer.is_alive()
        timer.cancel()
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        output = out.read().decode(errors="replace")
    code = None if timed_out else proc.returncode
    return code, time.perf_counter() - t0, usage.ru_utime + usage.ru_stime, output


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", help="comma-separated benchmark names (noise, groupby, ...): these only")
    ap.add_argument("--jobs", type=int, default=2, help="scripts run at once (default 2)")
    ap.add_argument("--timeout", type=float, default=180.0, help="seconds per script (default 180)")
    ap.add_argument("-v", "--verbose", action="store_true", help="print every script's output")
    args = ap.parse_args(argv)
    failed = []
    t_all, cpu_all = time.perf_counter(), 0.0
    chosen = scripts(args.only)
    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        results = list(pool.map(lambda script: run(script, args.timeout), chosen))
    for script, (status, seconds, cpu, output) in zip(chosen, results, strict=True):
        cpu_all += cpu
        ok = status == 0
        verdict = "ok" if ok else ("timed out" if status is None else f"exit {status}")
        skipped = sum(line.startswith("[smoke] skipped") for line in output.splitlines())
        note = f" ({skipped} skipped)" if skipped else ""
        print(f"bench-smoke {script.name:<28} {seconds:5.1f} s (CPU {cpu:4.1f} s)  {verdict}{note}", flush=True)
        if args.verbose or not ok:
            print(output.rstrip() + "\n", flush=True)
        if not ok:
            failed.append(script.name)
    print(f"bench-smoke: {time.perf_counter() - t_all:.1f} s in all (CPU {cpu_all:.1f} s)", flush=True)
    if failed:
        print(f"bench-smoke: FAILED {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
