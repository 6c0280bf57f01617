"""Dinur–Nissim reconstruction: recovered fraction and time against n and noise (seed 004 ch. 1).

For n ∈ {100, 500, 1000} and noise bound ∈ {1, √n/4, √n, 4√n} (uniform noise, NaiveCurator),
the attack asks 4n random subset-sum queries and fits them by least squares, rounding at 1/2.
The LP fit (scipy HiGHS, L1 error) is also run for n <= --lp-max-n (default 100): at n = 1000
the LP is too slow for a benchmark (the L∞ LP alone took about 100 s on a 2-core machine), so
the large sizes use least squares. Median over 3 seeds.

    .venv/bin/python benchmarks/bench_reconstruction.py [--out benchmarks/results/reconstruction.json]
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _smoke  # noqa: E402
from _report import markdown, version  # noqa: E402

from dpkit.attacks.reconstruction import NaiveCurator, dinur_nissim_attack  # noqa: E402


def run(n: int, noise: float, method: str, seeds: list[int]) -> dict[str, float]:
    fracs, times = [], []
    for seed in seeds:
        rng = np.random.default_rng([seed, n])
        x = rng.integers(0, 2, n)
        res = dinur_nissim_attack(NaiveCurator(x, noise_bound=noise, rng=rng), n, method=method, rng=rng)  # type: ignore[arg-type]
        fracs.append(res.recovered_fraction)
        times.append(res.seconds)
    return {"recovered_fraction": statistics.median(fracs), "seconds": statistics.median(times)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="100,500,1000")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--lp-max-n", type=int, default=100)
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "reconstruction.json"))
    _smoke.add_flag(ap)
    args = ap.parse_args()
    if args.smoke:
        args.sizes, args.seeds, args.lp_max_n, args.out = "40", 1, 40, str(_smoke.out_path("reconstruction.json"))
    seeds = list(range(args.seeds))
    rows = []
    for n in (int(s) for s in args.sizes.split(",")):
        r = math.sqrt(n)
        for label, noise in (("1", 1.0), ("√n/4", r / 4), ("√n", r), ("4√n", 4 * r)):
            methods = ["lstsq"] + (["lp"] if n <= args.lp_max_n else [])
            for method in methods:
                out = run(n, noise, method, seeds)
                rows.append({"n": n, "noise": label, "noise_value": noise, "queries": 4 * n, "method": method, **out})
                print(f"n={n} noise={label} {method}: {out}", file=sys.stderr)
    result = {
        "benchmark": "reconstruction",
        "what": "Dinur–Nissim attack, 4n random subset-sum queries, uniform noise in [-noise, noise], median of seeds",
        "seeds": seeds,
        "python": platform.python_version(),
        "numpy": version("numpy"),
        "scipy": version("scipy"),
        "machine": platform.machine(),
        "rows": rows,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(
        markdown(
            f"### Dinur–Nissim reconstruction (4n queries, median of {len(seeds)} seeds)",
            ["n", "noise", "method", "recovered", "time (s)"],
            ["noise", "method"],
            (
                [
                    str(r["n"]),
                    f"{r['noise']} ({r['noise_value']:.2f})",
                    r["method"],
                    f"{r['recovered_fraction']:.3f}",
                    f"{r['seconds']:.3f}",
                ]
                for r in rows
            ),
            [
                "time = querying the curator + fitting + rounding, one attack",
                f"LP (L1, scipy HiGHS) only for n <= {args.lp_max_n}; larger n use least squares (LP too slow at n = 1000)",
                f"written to {Path(args.out).resolve().relative_to(Path.cwd().resolve()) if Path(args.out).resolve().is_relative_to(Path.cwd().resolve()) else args.out}",
            ],
        )
    )


if __name__ == "__main__":
    main()
