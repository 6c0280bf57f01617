"""The Laplace mechanism (拉普拉斯机制) on counting queries and a histogram (Dwork & Roth 2014, §3.3).

* One count has sensitivity (敏感度) 1: add Laplace(1/ε) noise. The error bound
  P[|Y| ≥ t·b] = e^{-t} gives a 95% bound of b·ln 20.
* A histogram over disjoint bins has ℓ1 sensitivity 1 when a person is added or removed and 2 when
  one person's record is replaced (one bin loses a count, another gains one).
* k counting queries that one person can all change at once have ℓ1 sensitivity k: Laplace(k/ε).

Run:  .venv/bin/python examples/laplace_counting_histogram.py [--seed N]
"""

import argparse
import math

import numpy as np

import dpkit as dp
from dpkit.datasets import people

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--seed", type=int, help="seed the noise: reproducible, NOT secure (default: OS CSPRNG)")
args = parser.parse_args()
rng = None if args.seed is None else np.random.default_rng(args.seed)
eps = 0.5
table = people(n=5_000)

# 1. One count: how many people are 65 or older?
count = dp.Laplace(epsilon=eps, sensitivity=dp.sensitivity.count().l1)
noisy = count.release(float((table.age >= 65).sum()), rng=rng)
low, high = count.confidence_interval(noisy, 0.95)
print(
    f"aged 65+: {noisy:.1f}  (b = {count.scale:g}; 95% bound b·ln 20 = {count.scale * math.log(20):.2f}; "
    f"CI [{low:.1f}, {high:.1f}])"
)

# 2. A histogram of ages; neighbours = "replace" (one person's age changes) → sensitivity 2.
edges = [18, 25, 35, 45, 55, 65, 75, 91]
counts = np.histogram(table.age, bins=edges)[0].astype(float)
hist = dp.Laplace(epsilon=eps, sensitivity=dp.sensitivity.histogram("replace").l1, neighbours="replace")
noisy_hist = hist.release(counts, rng=rng)
lows, highs = hist.confidence_interval(noisy_hist, 0.95)
for lo, hi, y, a, b in zip(edges[:-1], edges[1:], noisy_hist, lows, highs, strict=True):
    print(f"  ages {lo}-{hi - 1}: {y:8.1f}   95% CI [{a:.1f}, {b:.1f}]")
k = len(counts)
print(f"  all {k} bins within ±{hist.error_bound(0.05 / k, size=k):.2f} at once, with probability 0.95")

# 3. k = 10 counting queries "income ≥ t": one person can change every one → ℓ1 sensitivity k.
thresholds = np.arange(10_000, 100_001, 10_000)
answers = np.array([(table.income >= t).sum() for t in thresholds], dtype=float)
sens = dp.sensitivity.counting_queries(len(thresholds))
queries = dp.Laplace(epsilon=eps, sensitivity=sens.l1)
noisy_answers = queries.release(answers, rng=rng)
print(
    f"{len(thresholds)} counting queries: b = k/ε = {queries.scale:g}, "
    f"95% bound per query ±{queries.error_bound(0.05, size=len(thresholds)):.1f}"
)
for t, y in zip(thresholds, noisy_answers, strict=True):
    print(f"  income ≥ {t:>7,}: {y:8.1f}")
