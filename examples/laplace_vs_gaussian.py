"""Laplace vs Gaussian (高斯机制) noise: which one gives the smaller error? (seeds 003 and 004 ch. 4)

Laplace is ε-DP with scale b = Δ₁/ε; Gaussian is (ε, δ)-DP with σ ∝ Δ₂. For one count
(Δ₁ = Δ₂ = 1) Laplace wins: E|error| is b against σ·√(2/π). For k counting queries Δ₁ = k but
Δ₂ = √k, and the Gaussian's expected squared ℓ2 error k·σ² beats Laplace's 2k·b² once k is
larger than about ε²σ₁²/2 (σ₁: the σ for Δ₂ = 1). Numbers below: formula / measured on dpkit
releases. `dpkit demo` draws the same comparison as a figure.

Run:  .venv/bin/python examples/laplace_vs_gaussian.py [--seed N]
"""

import argparse
import math

import numpy as np

import dpkit as dp

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--seed", type=int, help="seed the noise: reproducible, NOT secure (default: OS CSPRNG)")
args = parser.parse_args()
rng = None if args.seed is None else np.random.default_rng(args.seed)
delta, k, reps = 1e-5, 100, 2_000

print(f"{'ε':>5} | {'one count: E|error|':^31} | {f'{k} counting queries: E‖error‖²':^39}")
print(f"{'':>5} | {'Laplace':^15} {'Gaussian':^15} | {'Laplace':^19} {'Gaussian':^19}")
for eps in (0.25, 0.5, 1.0, 2.0):
    lap = dp.Laplace(epsilon=eps, sensitivity=1.0)
    gau = dp.Gaussian(epsilon=eps, delta=delta, sensitivity=1.0)  # analytic σ, valid for every ε
    # 100,000 independent counts (each coordinate of a batch gets independent noise of this scale)
    lap_err = np.abs(lap.release(np.zeros(100_000), rng=rng)).mean()
    gau_err = np.abs(gau.release(np.zeros(100_000), rng=rng)).mean()

    sens = dp.sensitivity.counting_queries(k)  # ℓ1 = k, ℓ2 = √k
    lap_k = dp.Laplace(epsilon=eps, sensitivity=sens.l1)
    gau_k = dp.Gaussian(epsilon=eps, delta=delta, sensitivity=sens.l2)
    lap_sq = (lap_k.release(np.zeros((reps, k)), rng=rng) ** 2).sum(axis=1).mean()  # reps releases
    gau_sq = (gau_k.release(np.zeros((reps, k)), rng=rng) ** 2).sum(axis=1).mean()
    print(
        f"{eps:>5g} | {lap.scale:6.3f} / {lap_err:6.3f} {gau.sigma * math.sqrt(2 / math.pi):6.3f} / {gau_err:6.3f} | "
        f"{2 * k * lap_k.scale**2:8.3g} / {lap_sq:<8.3g} {k * gau_k.sigma**2:8.3g} / {gau_sq:<8.3g}"
    )
