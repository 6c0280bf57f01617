"""Noise benchmark: dpkit's secure samplers against numpy (insecure) and the DP peers.

Not a test. Run it from the benchmark environment (``make bench`` creates it):

    .venv-bench/bin/python benchmarks/bench_noise.py [--n 10000000] [--peer-n 100000] [--markdown]

Every row does the same work: an input array of zeros plus noise, returned as a new array/list.
numpy and dpkit are timed on ``--n`` values (best of ``--repeats``, after a small warm-up call).
OpenDP and diffprivlib are far slower, so they are timed once on ``--peer-n`` values (diffprivlib
loops in Python, additionally capped by ``--peer-budget`` seconds) and their time is extrapolated
linearly to ``--n``; such rows are labelled "extrapolated from <count>".

A dpkit call whose attribute does not exist (yet) prints "n/a (not available)" instead of failing;
any other failure of a row prints "error: ..." and the run goes on.

Results: a rich table (stderr when --markdown), ``benchmarks/results/noise.json`` and, with
``--markdown``, a Markdown table on stdout.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import platform
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import _report  # benchmarks/_report.py: shared table and version helpers
import _smoke
import numpy as np

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "benchmarks" / "results" / "noise.json"

WARMUP_N = 1_000
PEER_CHUNK = 1_000

Runner = Callable[[], Any]
Prepare = Callable[[int], Runner]  # builds inputs for n values (untimed), returns the timed call


NotAvailable = _report.NotAvailable


@dataclass
class Candidate:
    library: str
    label: str  # short name of the implementation, for the tables
    call: str  # the call being timed, as the user would write it (JSON only)
    prepare: Prepare
    peer: bool = False  # slow peer: timed once on peer-n values, extrapolated to n
    python_loop: bool = False  # scalar API looped in Python (chunked, time-budgeted)
    params: dict[str, Any] = field(default_factory=dict)


@dataclass
class Work:
    key: str
    title: str
    candidates: list[Candidate]


# --------------------------------------------------------------------------- numpy (insecure)


def numpy_candidates(rng: np.random.Generator) -> dict[str, list[Candidate]]:
    def lap(n: int) -> Runner:
        x = np.zeros(n)
        return lambda: x + rng.laplace(0.0, 1.0, n)

    def gauss(n: int) -> Runner:
        x = np.zeros(n)
        return lambda: x + rng.normal(0.0, 1.0, n)

    def geo_diff(scale: float) -> Prepare:
        p = -math.expm1(-1.0 / scale)  # P(success) = 1 - exp(-1/scale)

        def prep(n: int) -> Runner:
            x = np.zeros(n, dtype=np.int64)
            return lambda: x + (rng.geometric(p, n) - rng.geometric(p, n))

        return prep

    def rounded_normal(sigma: float) -> Prepare:
        def prep(n: int) -> Runner:
            x = np.zeros(n, dtype=np.int64)
            return lambda: x + np.rint(rng.normal(0.0, sigma, n)).astype(np.int64)

        return prep

    def geo(scale: float) -> Candidate:
        return Candidate(
            "numpy",
            "geometric − geometric",
            f"x + (rng.geometric(p, n) - rng.geometric(p, n)), p = 1-exp(-1/{scale:g})",
            geo_diff(scale),
            params={"scale": scale},
        )

    def rnorm(sigma: float) -> Candidate:
        return Candidate(
            "numpy",
            "rint(normal), not exact",
            f"x + rint(rng.normal(0, {sigma:g}, n)) (not an exact discrete Gaussian)",
            rounded_normal(sigma),
            params={"sigma": sigma},
        )

    return {
        "laplace": [Candidate("numpy", "laplace", "x + rng.laplace(0, 1, n)", lap, params={"scale": 1.0})],
        "gaussian": [Candidate("numpy", "normal", "x + rng.normal(0, 1, n)", gauss, params={"sigma": 1.0})],
        "dlap1": [geo(1.0)],
        "dgauss1": [rnorm(1.0)],
        "dlap1000": [geo(1000.0)],
        "dgauss1000": [rnorm(1000.0)],
    }


# --------------------------------------------------------------------------- dpkit


def dpkit_candidates() -> tuple[dict[str, list[Candidate]], str | None]:
    """dpkit rows. The API is resolved lazily, at prepare time, so a missing name is per row."""
    import_error: str | None = None
    try:
        import dpkit as dp  # noqa: PLC0415
    except Exception as exc:  # a half-written package must not stop the benchmark
        dp = None
        import_error = f"import dpkit failed: {type(exc).__name__}: {exc}"

    def attr(path: str) -> Any:
        if dp is None:
            raise NotAvailable(import_error)
        obj: Any = dp
        for part in path.split("."):
            try:
                obj = getattr(obj, part)
            except AttributeError as exc:
                raise NotAvailable(f"dpkit.{path} missing") from exc
        return obj

    def laplace(n: int) -> Runner:
        mech = attr("Laplace")(epsilon=1.0, sensitivity=1.0)
        x = np.zeros(n)
        return lambda: mech.release(x)

    def gaussian(n: int) -> Runner:
        mech = attr("Gaussian")(epsilon=1.0, delta=1e-6, sensitivity=1.0)
        x = np.zeros(n)
        return lambda: mech.release(x)

    def dlap(scale: float) -> Prepare:
        def prep(n: int) -> Runner:
            fn = attr("noise.discrete_laplace")
            x = np.zeros(n, dtype=np.int64)
            return lambda: x + fn(scale=scale, size=n)

        return prep

    def dgauss(sigma: float) -> Prepare:
        def prep(n: int) -> Runner:
            fn = attr("noise.discrete_gaussian")
            x = np.zeros(n, dtype=np.int64)
            return lambda: x + fn(sigma=sigma, size=n)

        return prep

    rows = {
        "laplace": [
            Candidate(
                "dpkit",
                "Laplace.release",
                "dp.Laplace(epsilon=1, sensitivity=1).release(x)",
                laplace,
                params={"epsilon": 1.0, "sensitivity": 1.0},
            )
        ],
        "gaussian": [
            Candidate(
                "dpkit",
                "Gaussian.release",
                "dp.Gaussian(epsilon=1, delta=1e-6, sensitivity=1).release(x)",
                gaussian,
                params={"epsilon": 1.0, "delta": 1e-6, "sensitivity": 1.0},
            )
        ],
        "dlap1": [
            Candidate(
                "dpkit",
                "noise.discrete_laplace",
                "x + dp.noise.discrete_laplace(scale=1, size=n)",
                dlap(1.0),
                params={"scale": 1.0},
            )
        ],
        "dgauss1": [
            Candidate(
                "dpkit",
                "noise.discrete_gaussian",
                "x + dp.noise.discrete_gaussian(sigma=1, size=n)",
                dgauss(1.0),
                params={"sigma": 1.0},
            )
        ],
        "dlap1000": [
            Candidate(
                "dpkit",
                "noise.discrete_laplace",
                "x + dp.noise.discrete_laplace(scale=1000, size=n)",
                dlap(1000.0),
                params={"scale": 1000.0},
            )
        ],
        "dgauss1000": [
            Candidate(
                "dpkit",
                "noise.discrete_gaussian",
                "x + dp.noise.discrete_gaussian(sigma=1000, size=n)",
                dgauss(1000.0),
                params={"sigma": 1000.0},
            )
        ],
    }
    return rows, import_error


# --------------------------------------------------------------------------- OpenDP 0.16


def opendp_candidates() -> dict[str, list[Candidate]]:
    def make(kind: str, T: str, scale: float) -> Prepare:
        def prep(n: int) -> Runner:
            try:
                import opendp.prelude as odp  # noqa: PLC0415
            except ImportError as exc:
                raise NotAvailable(f"opendp not installed: {exc}") from exc
            odp.enable_features("contrib")
            if T == "f64":
                domain = odp.vector_domain(odp.atom_domain(T=float, nan=False))
                x: Any = np.zeros(n, dtype=np.float64)
                metric_T: Any = float
            else:
                # T=int is i32 in OpenDP; i64 matches numpy's int64 input.
                domain = odp.vector_domain(odp.atom_domain(T="i64"))
                x = np.zeros(n, dtype=np.int64)
                metric_T = "i64"
            if kind == "laplace":
                meas = odp.m.make_laplace(domain, odp.l1_distance(T=metric_T), scale=scale)
            else:
                meas = odp.m.make_gaussian(domain, odp.l2_distance(T=metric_T), scale=scale)
            return lambda: meas(x)

        return prep

    def cand(kind: str, T: str, scale: float) -> Candidate:
        fn = "make_laplace" if kind == "laplace" else "make_gaussian"
        metric = "l1_distance" if kind == "laplace" else "l2_distance"
        dom = "atom_domain(T=float, nan=False)" if T == "f64" else 'atom_domain(T="i64")'
        return Candidate(
            "OpenDP 0.16",
            f"{fn}, vector {T}",
            f"m.{fn}(vector_domain({dom}), {metric}, scale={scale:g})(x)",
            make(kind, T, scale),
            peer=True,
            params={"scale": scale, "T": T},
        )

    return {
        "laplace": [cand("laplace", "f64", 1.0)],
        "gaussian": [cand("gaussian", "f64", 1.0)],
        "dlap1": [cand("laplace", "i64", 1.0)],
        "dgauss1": [cand("gaussian", "i64", 1.0)],
        "dlap1000": [cand("laplace", "i64", 1000.0)],
        "dgauss1000": [cand("gaussian", "i64", 1000.0)],
    }


# --------------------------------------------------------------------------- diffprivlib 0.6.6


def diffprivlib_candidates() -> dict[str, list[Candidate]]:
    def make(name: str, kwargs: dict[str, Any], integer: bool, force_sigma: float | None = None) -> Prepare:
        def prep(n: int) -> Runner:
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    import diffprivlib.mechanisms as dpm  # noqa: PLC0415
            except ImportError as exc:
                raise NotAvailable(f"diffprivlib not importable: {exc}") from exc
            mech = getattr(dpm, name)(**kwargs)
            if force_sigma is not None:
                # GaussianDiscrete only takes (epsilon, delta); set its sigma directly (private
                # attribute) so that the work matches sigma = 1 / 1000 of the other rows.
                mech._scale = float(force_sigma)
            xs = [0] * n if integer else [0.0] * n
            rand = mech.randomise
            return lambda: [rand(v) for v in xs]

        return prep

    def cand(
        name: str, kwargs: dict[str, Any], integer: bool, note: str = "", force_sigma: float | None = None
    ) -> Candidate:
        args = ", ".join(f"{k}={v:g}" for k, v in kwargs.items())
        call = f"[{name}({args}).randomise(v) for v in x]{note}"
        params = dict(kwargs)
        if force_sigma is not None:
            params["sigma"] = force_sigma
        return Candidate(
            "diffprivlib 0.6.6",
            f"{name}.randomise loop",
            call,
            make(name, kwargs, integer, force_sigma),
            peer=True,
            python_loop=True,
            params=params,
        )

    gd = {"epsilon": 1.0, "delta": 1e-6}
    return {
        "laplace": [cand("Laplace", {"epsilon": 1.0, "sensitivity": 1.0}, False)],
        "gaussian": [
            cand("Gaussian", {"epsilon": 1.0, "delta": 1e-6, "sensitivity": 1.0}, False),
            cand("GaussianAnalytic", {"epsilon": 1.0, "delta": 1e-6, "sensitivity": 1.0}, False),
        ],
        "dlap1": [cand("Geometric", {"epsilon": 1.0, "sensitivity": 1}, True)],
        "dgauss1": [cand("GaussianDiscrete", gd, True, "; _scale := 1", force_sigma=1.0)],
        "dlap1000": [cand("Geometric", {"epsilon": 0.001, "sensitivity": 1}, True)],
        "dgauss1000": [cand("GaussianDiscrete", gd, True, "; _scale := 1000", force_sigma=1000.0)],
    }


# --------------------------------------------------------------------------- timing


WORK_TITLES = [
    ("laplace", "float + Laplace (scale 1)"),
    ("gaussian", "float + Gaussian (see note)"),
    ("dlap1", "int + discrete Laplace (scale 1)"),
    ("dgauss1", "int + discrete Gaussian (σ=1)"),
    ("dlap1000", "int + discrete Laplace (scale 1000)"),
    ("dgauss1000", "int + discrete Gaussian (σ=1000)"),
]


def _sample_std(out: Any) -> float | None:
    try:
        return float(np.std(np.asarray(out, dtype=np.float64)))
    except Exception:
        return None


def _count_label(k: int) -> str:
    if k >= 1_000_000 and k % 1_000_000 == 0:
        return f"{k // 1_000_000}M"
    if k >= 1_000 and k % 1_000 == 0:
        return f"{k // 1_000}k"
    return f"{k:,}"


def measure(c: Candidate, n: int, peer_n: int, repeats: int, peer_budget: float) -> dict[str, Any]:
    row: dict[str, Any] = {"library": c.library, "impl": c.label, "call": c.call, "params": c.params}
    try:
        c.prepare(WARMUP_N if not c.peer else min(100, peer_n))()  # warm-up (imports, caches)
        if not c.peer:
            run = c.prepare(n)
            best = math.inf
            out = None
            for _ in range(repeats):
                t0 = time.perf_counter()
                out = run()
                best = min(best, time.perf_counter() - t0)
            measured, seconds, runs = n, best, repeats
        elif c.python_loop:
            # Scalar API: loop in chunks so the time budget can stop a very slow sampler early.
            runners: dict[int, Runner] = {}
            done, seconds, outs = 0, 0.0, []
            while done < peer_n and (done == 0 or seconds < peer_budget):
                k = min(PEER_CHUNK, peer_n - done)
                run = runners.get(k) or runners.setdefault(k, c.prepare(k))
                t0 = time.perf_counter()
                outs.append(run())
                seconds += time.perf_counter() - t0
                done += k
            out = [v for chunk in outs for v in chunk]
            measured, runs = done, 1
        else:
            run = c.prepare(peer_n)
            t0 = time.perf_counter()
            out = run()
            seconds = time.perf_counter() - t0
            measured, runs = peer_n, 1
    except NotAvailable as exc:
        row.update(status="n/a", error=str(exc))
        return row
    except Exception as exc:  # noqa: BLE001 - report and go on
        row.update(status="error", error=f"{type(exc).__name__}: {exc}")
        return row

    extrapolated = measured != n
    seconds_n = seconds * n / measured
    row.update(
        status="ok",
        values_measured=measured,
        seconds_measured=seconds,
        runs=runs,
        extrapolated=extrapolated,
        extrapolated_from=measured if extrapolated else None,
        seconds_for_n=seconds_n,
        mvalues_per_s=n / seconds_n / 1e6,
        sample_std=_sample_std(out),
    )
    return row


def build_works(libs: set[str]) -> tuple[list[Work], dict[str, str | None]]:
    rng = np.random.default_rng()
    sources: list[dict[str, list[Candidate]]] = []
    notes: dict[str, str | None] = {}
    if "numpy" in libs:
        sources.append(numpy_candidates(rng))
    if "dpkit" in libs:
        rows, err = dpkit_candidates()
        sources.append(rows)
        notes["dpkit_import_error"] = err
    if "opendp" in libs:
        sources.append(opendp_candidates())
    if "diffprivlib" in libs:
        sources.append(diffprivlib_candidates())
    works = []
    for key, title in WORK_TITLES:
        cands = [c for src in sources for c in src.get(key, [])]
        works.append(Work(key, title, cands))
    return works, notes


def add_ratios(rows: list[dict[str, Any]]) -> None:
    by_work: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by_work.setdefault(r["work_key"], []).append(r)
    for group in by_work.values():
        ok = [r for r in group if r["status"] == "ok"]
        base = next((r for r in ok if r["library"] == "numpy"), None)
        mine = next((r for r in ok if r["library"] == "dpkit"), None)
        for r in group:
            r["ratio_vs_numpy"] = r["seconds_for_n"] / base["seconds_for_n"] if base and r["status"] == "ok" else None
            peer = r["library"] not in ("numpy", "dpkit")
            r["dpkit_speedup"] = (
                r["seconds_for_n"] / mine["seconds_for_n"] if peer and mine and r["status"] == "ok" else None
            )


# --------------------------------------------------------------------------- output


HEADERS = [
    "work",
    "library",
    "implementation",
    "values measured",
    "seconds for N",
    "M values/s",
    "× numpy time",
    "dpkit speedup",
    "std",
]
LEFT = {"work", "library", "implementation"}

NOTES = [
    "numpy rows are insecure baselines (PCG64, floating-point inverse-CDF samplers).",
    "Gaussian: numpy and OpenDP use σ = 1; dpkit and diffprivlib calibrate σ from ε = 1, δ = 1e-6, "
    "Δ = 1 (the std column, the sample std of the noise, shows the σ each drew); continuous samplers' time does not "
    "depend on σ.",
    "diffprivlib GaussianDiscrete only takes (ε, δ): its private _scale is set to σ (1 or 1000); "
    "its sampler loops O(σ) times per value.",
    "'extrapolated from k': timed once on k values and scaled linearly to N.",
    "× numpy time: seconds / numpy's seconds for the same work; dpkit speedup: peer seconds / dpkit seconds.",
]


def _fmt_seconds(r: dict[str, Any]) -> str:
    s = r["seconds_for_n"]
    txt = f"{s:.3g}" if s < 10 else f"{s:,.1f}"
    if r["extrapolated"]:
        txt += f" (extrapolated from {_count_label(r['extrapolated_from'])})"
    return txt


def _fmt_ratio(v: float | None) -> str:
    if v is None:
        return "—"
    return f"{v:.2f}×" if v < 10 else f"{v:,.0f}×"


def table_cells(r: dict[str, Any]) -> list[str]:
    head = [r["work"], r["library"], r["impl"]]
    if r["status"] != "ok":
        msg = "n/a (not available)" if r["status"] == "n/a" else f"error: {r['error']}"
        return head + ["—", msg, "—", "—", "—", "—"]
    std = r.get("sample_std")
    return head + [
        f"{r['values_measured']:,}",
        _fmt_seconds(r),
        f"{r['mvalues_per_s']:.3g}",
        _fmt_ratio(r["ratio_vs_numpy"]),
        _fmt_ratio(r["dpkit_speedup"]),
        f"{std:.4g}" if std is not None else "—",
    ]


def print_rich(rows: list[dict[str, Any]], meta: dict[str, Any], to_stderr: bool) -> None:
    title = (
        f"Noise: N = {meta['n']:,} values  (Python {meta['python']}, numpy "
        f"{meta['numpy']}, {meta['cpu_count']} CPUs, {meta['date']})"
    )
    cells = ((table_cells(r), r["work"], r["library"] == "dpkit") for r in rows)
    _report.print_table(title, HEADERS, LEFT, cells, NOTES, to_stderr=to_stderr, width=200, blank_repeats=True)


def markdown(rows: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    title = (
        f"N = {meta['n']:,} values; OpenDP and diffprivlib timed on ≤ {meta['peer_n']:,} values and "
        f"extrapolated linearly. Python {meta['python']}, numpy {meta['numpy']}, "
        f"{meta['cpu_count']} CPUs, {meta['date']}."
    )
    return _report.markdown(title, HEADERS, LEFT, (table_cells(r) for r in rows), NOTES)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=10_000_000, help="values per run (default 10M)")
    ap.add_argument(
        "--peer-n",
        type=int,
        default=100_000,
        help="values timed for OpenDP/diffprivlib, extrapolated to --n (default 100k)",
    )
    ap.add_argument(
        "--peer-budget",
        type=float,
        default=30.0,
        help="seconds after which a diffprivlib Python loop stops early (default 30)",
    )
    ap.add_argument("--repeats", type=int, default=3, help="best-of for numpy and dpkit (default 3)")
    ap.add_argument(
        "--libs",
        default="numpy,dpkit,opendp,diffprivlib",
        help="comma-separated subset of numpy,dpkit,opendp,diffprivlib",
    )
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON results path")
    ap.add_argument(
        "--markdown", action="store_true", help="print a Markdown table on stdout (the rich table then goes to stderr)"
    )
    _smoke.add_flag(ap)
    args = ap.parse_args(argv)
    if args.smoke:
        args.n, args.peer_n, args.repeats, args.out = 10_000, 1_000, 1, _smoke.out_path("noise.json")
        args.libs = ",".join(_smoke.present(args.libs.split(",")))
    if args.n <= 0 or args.peer_n <= 0 or args.repeats <= 0:
        ap.error("--n, --peer-n and --repeats must be positive")
    peer_n = min(args.peer_n, args.n)
    libs = {s.strip().lower() for s in args.libs.split(",") if s.strip()}

    works, notes = build_works(libs)
    rows: list[dict[str, Any]] = []
    for w in works:
        for c in w.candidates:
            print(f"[bench] {w.title}: {c.library} …", file=sys.stderr, flush=True)
            r = measure(c, args.n, peer_n, args.repeats, args.peer_budget)
            r["work"], r["work_key"] = w.title, w.key
            rows.append(r)
    add_ratios(rows)

    meta = {
        "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "n": args.n,
        "peer_n": peer_n,
        "peer_budget_s": args.peer_budget,
        "repeats": args.repeats,
        "warmup_n": WARMUP_N,
        "python": platform.python_version(),
        "numpy": np.__version__,
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "versions": {d: _report.version(d) for d in ("dpkit", "opendp", "diffprivlib", "scikit-learn")},
        "timer": "time.perf_counter wall clock; best of `repeats` for numpy/dpkit, one run for peers",
        "work": "every row: an all-zeros input array (float64 or int64) plus noise",
        "notes": NOTES,
        **notes,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2, ensure_ascii=False) + "\n")

    print_rich(rows, meta, to_stderr=args.markdown)
    print(f"[bench] wrote {args.out}", file=sys.stderr)
    if args.markdown:
        print(markdown(rows, meta))
    if args.smoke:
        return _smoke.finish(
            f"{r['work']}: dpkit {r['impl']}: {r['status']} {r.get('error', '')}"
            for r in rows
            if r["library"] == "dpkit" and r["status"] != "ok"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
