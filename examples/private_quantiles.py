"""Private median and quartiles of ages (中位数, 四分位数) with Smith's exponential mechanism.

The ages of ``dpkit.datasets.people`` lie in [18, 90]; the bounds [0, 100] are declared without
looking at the data. The median spends ε; the three quartiles together spend ε (ε/3 each, basic
composition). Outputs lie on a fine lattice (2^-34 for [0, 100]) and are sampled exactly.

Run:  .venv/bin/python examples/private_quantiles.py [--seed N]
"""

import argparse

import numpy as np

from dpkit.datasets import people
from dpkit.mechanisms.quantiles import Median, Quantiles

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--seed", type=int, help="seed the noise: reproducible, NOT secure (default: OS CSPRNG)")
args = parser.parse_args()
rng = None if args.seed is None else np.random.default_rng(args.seed)

ages = people(n=5_000).age
true_q = np.quantile(ages, [0.25, 0.5, 0.75])
print(f"{ages.size} people; true quartiles {true_q[0]:.1f}, {true_q[1]:.1f}, {true_q[2]:.1f}")
print(f"{'ε':>6} | {'median':>8} | {'Q1':>8} {'Q2':>8} {'Q3':>8}")
for eps in (1.0, 0.1, 0.01):
    med = Median(epsilon=eps, lower=0.0, upper=100.0).release(ages, rng=rng)
    qs = Quantiles(epsilon=eps, qs=[0.25, 0.5, 0.75], lower=0.0, upper=100.0).release(ages, rng=rng)
    print(f"{eps:>6} | {med:8.2f} | {qs[0]:8.2f} {qs[1]:8.2f} {qs[2]:8.2f}")
