"""Accounting benchmark: ε of DP-SGD (MNIST-style) by dpkit and the peer accountants, and time.

Not a test. Run it from the benchmark environment (``make bench`` creates it):

    .venv-bench/bin/python benchmarks/bench_accounting.py [--epochs 1,10,60,100] [--markdown]

The setting is the one of the Opacus MNIST example and of dpkit's PLD issue: Poisson sampling
with q = 256/60000, noise multiplier σ = 1.1, 235 steps per epoch, δ = 1e-5. Every row builds
a fresh accountant, composes ``epochs × 235`` subsampled-Gaussian steps and asks for ε; the
time is the median of a few such runs (wall clock, after an untimed warm-up run when one run
takes under a second; slow rows are timed until ``--budget`` seconds are used, at least once).

Rows: dpkit's PLD accountant (default grid 1e-4, and 1e-5), dpkit's RDP accountant (when
``dpkit.accounting.rdp`` exists), Google's dp_accounting RDP and PLD (default grid 1e-4, and
1e-5: the reference, the most accurate number here), Opacus RDP and PRV (when importable). A
library or call that is missing prints "n/a (not available)"; any other failure prints
"error: ..." and the run goes on.

Results: a rich table (stderr when --markdown), ``benchmarks/results/accounting.json`` and, with
``--markdown``, a Markdown table on stdout.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import importlib
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import _report  # benchmarks/_report.py: shared table and version helpers
import _smoke
import numpy as np

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "benchmarks" / "results" / "accounting.json"

Q = 256 / 60000
SIGMA = 1.1
STEPS_PER_EPOCH = 235
DELTA = 1e-5
REFERENCE = ("dp_accounting", "PLD h=1e-5")  # the most accurate row: other ε are compared to it


NotAvailable = _report.NotAvailable


@dataclass
class Candidate:
    library: str
    label: str  # short name of the accountant, for the tables
    call: str  # what is timed, as a user would write it (JSON only)
    make: Callable[[int], Callable[[], float]]  # steps -> the timed call returning ε
    params: dict[str, Any] = field(default_factory=dict)


def _import(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise NotAvailable(f"{name} is not importable ({exc})") from exc


# --------------------------------------------------------------------------- dpkit


def dpkit_candidates() -> list[Candidate]:
    def pld(h: float) -> Callable[[int], Callable[[], float]]:
        def make(steps: int) -> Callable[[], float]:
            mod = _import("dpkit.accounting.pld")
            events = _import("dpkit.accounting.events")
            ev = events.SelfComposedEvent(events.PoissonSampledEvent(Q, events.GaussianEvent(SIGMA)), steps)
            return lambda: mod.PLDAccountant(value_discretization_interval=h).compose(ev).get_epsilon(DELTA)

        return make

    def rdp(steps: int) -> Callable[[], float]:
        mod = _import("dpkit.accounting.rdp")
        events = _import("dpkit.accounting.events")
        if not hasattr(mod, "RDPAccountant"):
            raise NotAvailable("dpkit.accounting.rdp has no RDPAccountant")
        ev = events.SelfComposedEvent(events.PoissonSampledEvent(Q, events.GaussianEvent(SIGMA)), steps)
        return lambda: mod.RDPAccountant().compose(ev).get_epsilon(DELTA)

    return [
        Candidate(
            "dpkit",
            "PLD h=1e-4 (default)",
            "dp.PLDAccountant().compose(event).get_epsilon(1e-5)",
            pld(1e-4),
            {"value_discretization_interval": 1e-4},
        ),
        Candidate(
            "dpkit",
            "PLD h=1e-5",
            "dp.PLDAccountant(1e-5).compose(event).get_epsilon(1e-5)",
            pld(1e-5),
            {"value_discretization_interval": 1e-5},
        ),
        Candidate("dpkit", "RDP", "dpkit.accounting.rdp.RDPAccountant().compose(event).get_epsilon(1e-5)", rdp),
    ]


# --------------------------------------------------------------------------- dp_accounting


def dp_accounting_candidates() -> list[Candidate]:
    def event(steps: int) -> Any:
        dpa = _import("dp_accounting")
        return dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(Q, dpa.GaussianDpEvent(SIGMA)), steps)

    def pld(h: float) -> Callable[[int], Callable[[], float]]:
        def make(steps: int) -> Callable[[], float]:
            mod = _import("dp_accounting.pld.pld_privacy_accountant")
            ev = event(steps)

            def run() -> float:
                acc = mod.PLDAccountant(value_discretization_interval=h)
                acc.compose(ev)
                return float(acc.get_epsilon(DELTA))

            return run

        return make

    def rdp(steps: int) -> Callable[[], float]:
        mod = _import("dp_accounting.rdp.rdp_privacy_accountant")
        ev = event(steps)

        def run() -> float:
            acc = mod.RdpAccountant()
            acc.compose(ev)
            return float(acc.get_epsilon(DELTA))

        return run

    return [
        Candidate(
            "dp_accounting",
            "PLD h=1e-4 (default)",
            "PLDAccountant().compose(event).get_epsilon(1e-5)",
            pld(1e-4),
            {"value_discretization_interval": 1e-4},
        ),
        Candidate(
            "dp_accounting",
            "PLD h=1e-5",
            "PLDAccountant(value_discretization_interval=1e-5)…",
            pld(1e-5),
            {"value_discretization_interval": 1e-5},
        ),
        Candidate("dp_accounting", "RDP", "RdpAccountant().compose(event).get_epsilon(1e-5)", rdp),
    ]


# --------------------------------------------------------------------------- Opacus


def opacus_candidates() -> list[Candidate]:
    def make_for(cls_name: str) -> Callable[[int], Callable[[], float]]:
        def make(steps: int) -> Callable[[], float]:
            mod = _import("opacus.accountants")
            cls = getattr(mod, cls_name, None)
            if cls is None:
                raise NotAvailable(f"opacus.accountants has no {cls_name}")

            def run() -> float:
                acc = cls()
                acc.history = [(SIGMA, Q, steps)]  # what acc.step() records, without 23,500 calls
                return float(acc.get_epsilon(delta=DELTA))

            return run

        return make

    return [
        Candidate(
            "opacus", "RDP", "RDPAccountant(); history=[(σ, q, steps)]; get_epsilon(1e-5)", make_for("RDPAccountant")
        ),
        Candidate(
            "opacus",
            "PRV",
            "PRVAccountant(); history=[(σ, q, steps)]; get_epsilon(1e-5) (eps_error default)",
            make_for("PRVAccountant"),
        ),
    ]


# --------------------------------------------------------------------------- measuring


def measure(c: Candidate, steps: int, repeats: int, budget: float) -> dict[str, Any]:
    row: dict[str, Any] = {"library": c.library, "accountant": c.label, "call": c.call, "params": c.params}
    try:
        run = c.make(steps)
        t0 = time.perf_counter()
        eps = run()  # first run: warm-up when fast, counted when slow
        first = time.perf_counter() - t0
        times = [first] if first >= 1.0 else []
        spent = first
        while len(times) < repeats and (not times or spent < budget):
            t0 = time.perf_counter()
            e = run()
            dt = time.perf_counter() - t0
            times.append(dt)
            spent += dt
            if e != eps:
                row["nondeterministic"] = True
    except NotAvailable as exc:
        row.update(status="n/a", error=str(exc))
        return row
    except Exception as exc:  # noqa: BLE001 - report and go on
        row.update(status="error", error=f"{type(exc).__name__}: {exc}")
        return row
    row.update(
        status="ok",
        epsilon=eps,
        ms=statistics.median(times) * 1e3,
        ms_min=min(times) * 1e3,
        runs=len(times),
        warmup_excluded=first < 1.0,
    )
    return row


def add_comparisons(rows: list[dict[str, Any]]) -> None:
    by_epochs: dict[int, list[dict[str, Any]]] = {}
    for r in rows:
        by_epochs.setdefault(r["epochs"], []).append(r)
    for group in by_epochs.values():
        ok = [r for r in group if r["status"] == "ok"]
        ref = next((r for r in ok if (r["library"], r["accountant"]) == REFERENCE), None)
        mine = next((r for r in ok if r["library"] == "dpkit" and r["accountant"].startswith("PLD h=1e-4")), None)
        for r in group:
            ok_r = r["status"] == "ok"
            r["rel_to_reference"] = (r["epsilon"] / ref["epsilon"] - 1) if ok_r and ref else None
            peer = r["library"] != "dpkit"
            r["dpkit_pld_speedup"] = (r["ms"] / mine["ms"]) if ok_r and peer and mine else None


# --------------------------------------------------------------------------- output


HEADERS = [
    "epochs",
    "steps",
    "library",
    "accountant",
    "ε (δ=1e-5)",
    "vs reference",
    "ms (median)",
    "runs",
    "dpkit PLD speedup",
]
LEFT = {"library", "accountant"}

NOTES = [
    "Setting: Poisson sampling q = 256/60000, noise multiplier σ = 1.1, 235 steps per epoch, δ = 1e-5, "
    "add/remove neighbours (both directions for the PLDs).",
    "Reference: dp_accounting's PLD with value_discretization_interval = 1e-5, the most accurate row; "
    "'vs reference' is ε / ε_reference − 1.",
    "dpkit PLD: a proven upper bound (connect-the-dots, pessimistic truncation, and a bound on "
    "floating-point error added to δ); RDP rows are upper bounds too, looser by construction; Opacus PRV "
    "is an estimate within its eps_error.",
    "ms: median wall clock of fresh accountant + compose + get_epsilon; fast rows exclude an untimed warm-up "
    "run; dpkit PLD speedup = peer ms / dpkit PLD (h=1e-4) ms, same epochs.",
]


def _fmt_ms(v: float) -> str:
    return f"{v:.3g}" if v < 100 else f"{v:,.0f}"


def table_cells(r: dict[str, Any]) -> list[str]:
    head = [str(r["epochs"]), f"{r['steps']:,}", r["library"], r["accountant"]]
    if r["status"] != "ok":
        msg = "n/a (not available)" if r["status"] == "n/a" else f"error: {r['error']}"
        return head + [msg, "—", "—", "—", "—"]
    rel = r.get("rel_to_reference")
    sp = r.get("dpkit_pld_speedup")
    return head + [
        f"{r['epsilon']:.6f}",
        "reference"
        if (r["library"], r["accountant"]) == REFERENCE
        else (f"{rel * 100:+.4f}%" if rel is not None else "—"),
        _fmt_ms(r["ms"]),
        str(r["runs"]),
        (f"{sp:.1f}×" if sp < 100 else f"{sp:,.0f}×") if sp is not None else "—",
    ]


def print_rich(rows: list[dict[str, Any]], meta: dict[str, Any], to_stderr: bool) -> None:
    title = (
        f"Accounting: DP-SGD q = 256/60000, σ = 1.1, δ = 1e-5  (Python {meta['python']}, numpy "
        f"{meta['numpy']}, {meta['cpu_count']} CPUs, {meta['date']})"
    )
    cells = ((table_cells(r), r["epochs"], r["library"] == "dpkit") for r in rows)
    _report.print_table(title, HEADERS, LEFT, cells, NOTES, to_stderr=to_stderr)


def markdown(rows: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    title = (
        f"DP-SGD accounting, q = 256/60000, σ = 1.1, δ = 1e-5. Python {meta['python']}, numpy {meta['numpy']}, "
        f"{meta['cpu_count']} CPUs, {meta['date']}."
    )
    return _report.markdown(title, HEADERS, LEFT, (table_cells(r) for r in rows), NOTES)


def _display_path(p: Path) -> str:
    """A path for the logs: relative to the repository when inside it (never absolute in JSON)."""
    try:
        return str(p.resolve().relative_to(REPO))
    except ValueError:
        return p.name


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--epochs", default="1,10,60,100", help="comma-separated epoch counts (default 1,10,60,100)")
    ap.add_argument("--repeats", type=int, default=5, help="timed runs per row, median reported (default 5)")
    ap.add_argument(
        "--budget",
        type=float,
        default=10.0,
        help="seconds after which a slow row stops repeating (at least one run; default 10)",
    )
    ap.add_argument(
        "--libs", default="dpkit,dp_accounting,opacus", help="comma-separated subset of dpkit,dp_accounting,opacus"
    )
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON results path")
    ap.add_argument(
        "--markdown", action="store_true", help="print a Markdown table on stdout (the rich table then goes to stderr)"
    )
    _smoke.add_flag(ap)
    args = ap.parse_args(argv)
    if args.smoke:
        args.epochs, args.repeats, args.budget, args.out = "1", 1, 1.0, _smoke.out_path("accounting.json")
        args.libs = ",".join(_smoke.present(args.libs.split(",")))
    try:
        epochs = [int(e) for e in args.epochs.split(",") if e.strip()]
    except ValueError:
        ap.error("--epochs must be comma-separated integers")
    if not epochs or min(epochs) <= 0 or args.repeats <= 0 or args.budget <= 0:
        ap.error("--epochs, --repeats and --budget must be positive")
    libs = {s.strip().lower() for s in args.libs.split(",") if s.strip()}

    cands: list[Candidate] = []
    if "dpkit" in libs:
        cands += dpkit_candidates()
    if "dp_accounting" in libs:
        cands += dp_accounting_candidates()
    if "opacus" in libs:
        cands += opacus_candidates()
    if args.smoke:  # a peer's PLD takes seconds (dpkit's own: a third of one); its RDP checks the plumbing
        for c in [c for c in cands if c.library != "dpkit" and c.label.startswith("PLD")]:
            _smoke.skip(f"{c.library} {c.label}", "seconds of work")
            cands.remove(c)

    rows: list[dict[str, Any]] = []
    for ep in epochs:
        steps = ep * STEPS_PER_EPOCH
        for c in cands:
            print(f"[bench] {ep} epochs ({steps:,} steps): {c.library} {c.label} …", file=sys.stderr, flush=True)
            r = measure(c, steps, args.repeats, args.budget)
            r["epochs"], r["steps"] = ep, steps
            rows.append(r)
    add_comparisons(rows)

    meta = {
        "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "setting": {
            "sampling_probability": Q,
            "noise_multiplier": SIGMA,
            "steps_per_epoch": STEPS_PER_EPOCH,
            "delta": DELTA,
            "epochs": epochs,
            "neighbours": "add_remove",
        },
        "reference": " ".join(REFERENCE),
        "repeats": args.repeats,
        "budget_s": args.budget,
        "python": platform.python_version(),
        "numpy": np.__version__,
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "versions": {d: _report.version(d) for d in ("dpkit", "dp-accounting", "opacus", "torch", "scipy", "numpy")},
        "timer": "time.perf_counter wall clock; median of the timed runs",
        "notes": NOTES,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2, ensure_ascii=False, default=str) + "\n")

    print_rich(rows, meta, to_stderr=args.markdown)
    print(f"[bench] wrote {_display_path(args.out)}", file=sys.stderr)
    if args.markdown:
        print(markdown(rows, meta))
    if args.smoke:
        return _smoke.finish(
            f"dpkit {r['accountant']}: {r['status']} {r.get('error', '')}"
            for r in rows
            if r["library"] == "dpkit" and r["status"] != "ok"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
