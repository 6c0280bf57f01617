"""DP k-means benchmark: normalised k-means cost of dpkit (both methods) vs diffprivlib's KMeans.

Not a test. Run it from the benchmark environment:

    .venv-bench/bin/python benchmarks/bench_kmeans.py [--seeds 20] [--markdown]

Data: Gaussian blobs from ``sklearn.datasets.make_blobs`` (cluster σ = 1, centres uniform in
[-10, 10]^d), one data set per seed, in three settings (n, d, k). Every library gets the same
declared box [-12, 12]^d (diffprivlib: ``bounds=``; dpkit: ``bounds=``), never bounds read off
the data. Score: cost(private centres) / cost(non-private scikit-learn KMeans, n_init=10) on the
same data (1.00 = as good as non-private); median (and quartiles) over ``--seeds`` seeds, at
ε ∈ {0.5, 1, 4}. All runs use add/remove neighbours and each library's default secure randomness
(dpkit: CSPRNG; diffprivlib: its default).

* dpkit ``method="gaussian"`` (default): (ε, δ = 1e-6)-DP — an approximate-DP guarantee.
* dpkit ``method="textbook"`` run with ``epsilon=2ε``, so that the ε it actually spends under
  add/remove (``epsilon_``, asserted) is ε: the text's Lap(2/ε') is ε/2-DP under add/remove.
* diffprivlib 0.6.6 ``KMeans(epsilon=ε, bounds=...)``: pure ε-DP (its own iteration count,
  Su et al. 2016's heuristic, 2 to 7).

Results: a table (stderr when --markdown), ``benchmarks/results/kmeans.json`` and, with
``--markdown``, Markdown on stdout.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import _report
import _smoke
import numpy as np

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "benchmarks" / "results" / "kmeans.json"
BOX = 12.0
EPSILONS = (0.5, 1.0, 4.0)
DELTA = 1e-6
SETTINGS = ((3_000, 2, 4), (10_000, 2, 4), (10_000, 5, 5))


def cost(X: np.ndarray, C: np.ndarray) -> float:
    d2 = (X * X).sum(1)[:, None] - 2.0 * X @ C.T + (C * C).sum(1)[None, :]
    return float(np.maximum(d2, 0.0).min(axis=1).sum())


def fitters(k: int, d: int, eps: float, peers: list[str]) -> list[tuple[str, Callable[[np.ndarray], np.ndarray]]]:
    lo, hi = np.full(d, -BOX), np.full(d, BOX)

    def dpkit_gaussian(X: np.ndarray) -> np.ndarray:
        from dpkit.ml.kmeans import KMeans  # noqa: PLC0415

        m = KMeans(n_clusters=k, epsilon=eps, delta=DELTA, bounds=(lo, hi)).fit(X)
        assert m.epsilon_ <= eps and m.delta_ == DELTA
        return m.cluster_centers_

    def dpkit_textbook(X: np.ndarray) -> np.ndarray:
        from dpkit.ml.kmeans import KMeans  # noqa: PLC0415

        m = KMeans(n_clusters=k, epsilon=2 * eps, method="textbook", bounds=(lo, hi)).fit(X)
        assert m.epsilon_ <= eps * (1 + 1e-12) and m.delta_ == 0.0
        return m.cluster_centers_

    def diffprivlib(X: np.ndarray) -> np.ndarray:
        from diffprivlib.models import KMeans  # noqa: PLC0415

        return KMeans(n_clusters=k, epsilon=eps, bounds=(lo, hi)).fit(X).cluster_centers_

    return [
        (f"dpkit gaussian (δ={DELTA:g})", dpkit_gaussian),
        ("dpkit textbook", dpkit_textbook),
        *([("diffprivlib", diffprivlib)] if "diffprivlib" in peers else []),
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--markdown", action="store_true")
    _smoke.add_flag(ap)
    args = ap.parse_args(argv)
    settings, epsilons, peers = SETTINGS, EPSILONS, ["diffprivlib"]
    if args.smoke:
        settings, epsilons, args.seeds, args.out = ((500, 2, 3),), (1.0,), 1, _smoke.out_path("kmeans.json")
        peers = _smoke.present(peers)
    warnings.filterwarnings("ignore", module="diffprivlib")
    from sklearn.cluster import KMeans as SkKMeans  # noqa: PLC0415
    from sklearn.datasets import make_blobs  # noqa: PLC0415

    rows: list[dict[str, Any]] = []
    for n, d, k in settings:
        ratios: dict[tuple[float, str], list[float]] = {}
        seconds: dict[tuple[float, str], float] = {}
        errors: dict[tuple[float, str], str] = {}
        print(f"[bench] k-means n={n} d={d} k={k}: {args.seeds} seeds", file=sys.stderr, flush=True)
        for seed in range(args.seeds):
            X, _ = make_blobs(
                n_samples=n, n_features=d, centers=k, cluster_std=1.0, center_box=(-10, 10), random_state=seed
            )
            base = cost(X, SkKMeans(n_clusters=k, n_init=10, random_state=0).fit(X).cluster_centers_)
            for eps in epsilons:
                for name, fit in fitters(k, d, eps, peers):
                    key = (eps, name)
                    if key in errors:
                        continue
                    try:
                        t0 = time.perf_counter()
                        C = fit(X)
                        seconds[key] = seconds.get(key, 0.0) + time.perf_counter() - t0
                    except Exception as exc:  # a library that fails: n/a, the run goes on
                        errors[key] = f"n/a ({type(exc).__name__}: {str(exc)[:80]})"
                        continue
                    ratios.setdefault(key, []).append(cost(X, C) / base)
        for eps in epsilons:
            for name, _ in fitters(k, d, eps, peers):
                key = (eps, name)
                row: dict[str, Any] = {"n": n, "d": d, "k": k, "epsilon": eps, "method": name}
                if key in errors:
                    row["status"] = errors[key]
                else:
                    r = np.array(ratios[key])
                    row.update(
                        status="ok",
                        seeds=int(r.size),
                        median=float(np.median(r)),
                        p25=float(np.quantile(r, 0.25)),
                        p75=float(np.quantile(r, 0.75)),
                        mean=float(r.mean()),
                        worst=float(r.max()),
                        ms_per_fit=1000 * seconds[key] / r.size,
                    )
                rows.append(row)

    meta = {
        "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "cpu_count": os.cpu_count(),
        "versions": {p: _report.version(p) for p in ("dpkit", "diffprivlib", "scikit-learn")},
        "box": [-BOX, BOX],
        "delta_gaussian": DELTA,
        "neighbours": "add_remove",
        "score": "cost(private centres) / cost(scikit-learn KMeans n_init=10), median over seeds",
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2, ensure_ascii=False) + "\n")

    names = [name for name, _ in fitters(2, 2, 1.0, peers)]
    headers = ["data", "ε", *names]
    cells = []
    for n, d, k in settings:
        for eps in epsilons:
            line = [f"n={n:,} d={d} k={k}", f"{eps:g}"]
            for name in names:
                r = next(r for r in rows if (r["n"], r["d"], r["k"], r["epsilon"], r["method"]) == (n, d, k, eps, name))
                line.append(
                    f"{r['median']:.3f} [{r['p25']:.2f}–{r['p75']:.2f}]" if r["status"] == "ok" else r["status"]
                )
            cells.append(line)
    notes = [
        f"normalised cost = cost / non-private scikit-learn cost, median (quartiles p25–p75 in brackets) over {args.seeds} seeds; 1.000 is non-private quality",
        f"same declared box [-{BOX:g}, {BOX:g}]^d for every library; add/remove neighbours",
        f"dpkit gaussian is (ε, {DELTA:g})-DP; dpkit textbook and diffprivlib are pure ε-DP (textbook run at epsilon=2ε, which spends ε under add/remove)",
        "dpkit: 5 iterations (the first a private initialisation for gaussian); diffprivlib: 2–7 by its heuristic",
    ]
    _report.print_table(
        f"DP k-means, normalised cost (Python {meta['python']}, {meta['date']})",
        headers,
        headers[:2],
        [(c, c[0], False) for c in cells],
        notes,
        to_stderr=args.markdown,
        blank_repeats=True,
    )
    print(f"[bench] wrote {args.out}", file=sys.stderr)
    if args.markdown:
        print(
            _report.markdown(
                f"DP k-means on Gaussian blobs. {meta['date']}, {meta['cpu_count']} CPUs.",
                headers,
                headers[:2],
                cells,
                notes,
            )
        )
    if args.smoke:
        return _smoke.finish(
            f"{r['method']} ε={r['epsilon']}: {r['status']}"
            for r in rows
            if r["method"].startswith("dpkit") and r["status"] != "ok"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
