"""Propose-test-release for the median and the mean (Dwork & Lei 2009), at ε = 1, δ = 1e-6.

Run:  python examples/propose_test_release.py

Local sensitivity depends on the data, so it cannot calibrate noise directly (that leaks); PTR
tests, privately, that the data are far from any dataset whose local sensitivity exceeds the
proposed bound b, and only then releases f(D) + Laplace(b/(ε/2)). On concentrated data it
releases; on spread-out data it answers ⊥ (None).
"""

from __future__ import annotations

import numpy as np

from dpkit.datasets import AGE_MAX, AGE_MIN, people
from dpkit.mechanisms import local_sensitivity as ls
from dpkit.mechanisms.ptr import PTRMean, PTRMedian

EPSILON, DELTA = 1.0, 1e-6


def show(label: str, ptr, data) -> None:
    r = ptr.release(data)  # secure default randomness
    outcome = f"released {r.value:.3f}" if r.released else "⊥ (refused)"
    print(f"  {label:<28} noisy distance {r.noisy_distance:8.1f} vs threshold {r.threshold:.1f}: {outcome}")


def main() -> None:
    ages = people(n=5_000).age.astype(float)
    spread = np.array([18.0, 25.0, 37.0, 52.0, 64.0, 77.0, 90.0])
    lo, hi = float(AGE_MIN), float(AGE_MAX)

    print("Local sensitivity of the median (replace) and the mean (add/remove):")
    for name, data in (("5,000 ages", ages), ("7 spread-out ages", spread)):
        med = ls.local_sensitivity_median(data, lower=lo, upper=hi)
        mean = ls.local_sensitivity_mean(data, lower=lo, upper=hi)
        gamma = ls.median_distance_to_high_sensitivity(data, 1.0, lower=lo, upper=hi)
        print(
            f"  {name:<18} LS(median) = {med:.3f}, LS(mean) = {mean:.5f}, "
            f"records to change before LS(median) > 1: {gamma}"
        )

    print(f"\nPTR median, bound b = 1 year, ε = {EPSILON}, δ = {DELTA:g}:")
    median = PTRMedian(epsilon=EPSILON, delta=DELTA, bound=1.0, lower=lo, upper=hi)
    print(f"  true median of the 5,000 ages: {np.sort(ages)[(ages.size + 1) // 2 - 1]:.0f}")
    show("5,000 ages (concentrated)", median, ages)
    show("7 ages (spread out)", median, spread)

    need = int(np.ceil((hi - lo) / 0.05))  # LS <= (u − l)/n <= b needs n >= (u − l)/b
    print(f"\nPTR mean, bound b = 0.05 years (LS ≤ (u − l)/n ≤ b needs n ≥ {need}):")
    mean = PTRMean(epsilon=EPSILON, delta=DELTA, bound=0.05, lower=lo, upper=hi)
    print(f"  true mean of the 5,000 ages: {ages.mean():.3f}")
    show("5,000 ages", mean, ages)
    show("500 ages", mean, ages[:500])
    print(f"\nEach run spends {median.event}.")


if __name__ == "__main__":
    main()
