"""Private medians and means from local sensitivity: smooth sensitivity and sample-and-aggregate.

Seed 004 §5.3–5.4 (Nissim, Raskhodnikova & Smith 2007). On generated ages (dpkit.datasets.people),
at ε = 1 (δ = 1e-6 for the Laplace smooth-sensitivity median), each private answer is compared
with the truth. Run: ``python examples/smooth_sensitivity_and_sample_aggregate.py``.
"""

from __future__ import annotations

import numpy as np

from dpkit.datasets import AGE_MAX, AGE_MIN, people
from dpkit.mechanisms.sample_aggregate import SampleAndAggregate
from dpkit.mechanisms.smooth_sensitivity import SmoothSensitivityMedian

EPSILON, DELTA = 1.0, 1e-6


def main() -> None:
    ages = people(n=5_000).age.astype(np.float64)
    lower, upper = float(AGE_MIN), float(AGE_MAX)  # declared bounds, not read from the data
    print(f"{ages.size} people, true median age {np.median(ages):.1f}, true mean age {ages.mean():.2f}\n")

    for noise, kw in (("laplace", {"delta": DELTA}), ("cauchy", {})):
        mech = SmoothSensitivityMedian(epsilon=EPSILON, lower=lower, upper=upper, noise=noise, **kw)
        released = mech.release(ages)  # secure randomness (rng=None)
        print(
            f"smooth-sensitivity median ({noise:7s}, {mech.event}):\n"
            f"  released {released:8.3f}   truth {np.median(ages):.1f}   "
            f"95% error bound (public, worst case) ±{mech.error_bound(0.05):.1f}, "
            f"(curator only, from this data's S = {mech.smooth_sensitivity(ages):.3g}) ±{mech.error_bound(0.05, values=ages):.2f}"
        )

    for name, f, lo, hi in (("mean", np.mean, 20.0, 80.0), ("median", np.median, 20.0, 80.0)):
        sa = SampleAndAggregate(epsilon=EPSILON, blocks=100, lower=lo, upper=hi, function=f)
        released = sa.release(ages)
        truth = f(ages)
        print(
            f"sample-and-aggregate {name:6s} (k = 100, outputs clipped to [{lo:g}, {hi:g}], ε = {sa.event.epsilon:g}):\n"
            f"  released {released:8.3f}   truth {truth:.2f}   95% noise bound ±{sa.error_bound(0.05):.2f}"
        )


if __name__ == "__main__":
    main()
