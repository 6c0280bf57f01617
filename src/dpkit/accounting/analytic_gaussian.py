"""The exact (ε, δ) curve of the Gaussian mechanism and σ calibrations.

Balle & Wang (2018, Thm 8): adding N(0, σ²) to a query of ℓ2 sensitivity Δ is (ε, δ)-DP iff

    δ >= Φ(Δ/(2σ) − εσ/Δ) − e^ε · Φ(−Δ/(2σ) − εσ/Δ).

The classic bound σ = Δ·√(2 ln(1.25/δ))/ε (Dwork & Roth 2014, Thm 3.22; seeds 003, 004) holds
only for ε < 1.
"""

from __future__ import annotations

import math

from scipy.special import log_ndtr, ndtr

from dpkit import _validate as v
from dpkit.errors import InvalidParameterError

__all__ = ["gaussian_delta", "analytic_gaussian_sigma", "classic_gaussian_sigma"]


def gaussian_delta(epsilon: float, noise_multiplier: float) -> float:
    """The smallest δ for which N(0, (m·Δ)²) noise is (ε, δ)-DP, m = noise_multiplier."""
    m = noise_multiplier
    a = 1.0 / (2.0 * m) - epsilon * m
    b = -1.0 / (2.0 * m) - epsilon * m
    second = math.exp(epsilon + float(log_ndtr(b)))  # e^ε·Φ(b) without overflow
    return max(float(ndtr(a)) - second, 0.0)


def analytic_gaussian_sigma(epsilon: float, delta: float, sensitivity: float) -> float:
    """The smallest σ (to 1e-12 relative, rounded up) making N(0, σ²) (ε, δ)-DP; valid for all ε > 0.

    Bisection on the monotone curve above; the returned σ is re-checked against it.
    """
    epsilon = v.epsilon(epsilon)
    delta = v.delta(delta, allow_zero=False)
    sensitivity = v.positive(sensitivity, "sensitivity")
    lo, hi = 1e-6, 1.0
    while gaussian_delta(epsilon, hi) > delta:
        hi *= 2.0
        if hi > 1e12:
            raise InvalidParameterError("delta", delta, "a value the Gaussian mechanism can reach (δ too small for ε)")
    while gaussian_delta(epsilon, lo) <= delta:
        lo /= 2.0
    while hi - lo > 1e-13 * hi:
        mid = 0.5 * (lo + hi)
        if gaussian_delta(epsilon, mid) <= delta:
            hi = mid
        else:
            lo = mid
    sigma = math.nextafter(hi * sensitivity, math.inf)
    if gaussian_delta(epsilon, sigma / sensitivity) > delta:  # re-check the answer (never seen)
        raise ArithmeticError("analytic Gaussian calibration missed its target")
    return sigma


def classic_gaussian_sigma(epsilon: float, delta: float, sensitivity: float) -> float:
    """σ = Δ·√(2 ln(1.25/δ))/ε, Dwork & Roth (2014) Thm 3.22 — only valid for ε < 1."""
    epsilon = v.epsilon(epsilon)
    if epsilon >= 1:
        raise InvalidParameterError(
            "epsilon",
            epsilon,
            "a number in (0, 1) for the classic calibration",
            "Its proof (Dwork & Roth 2014, Thm 3.22) needs ε < 1; use calibration='analytic', which is "
            "valid for every ε and needs less noise",
        )
    delta = v.delta(delta, allow_zero=False)
    sensitivity = v.positive(sensitivity, "sensitivity")
    return math.nextafter(sensitivity * math.sqrt(2.0 * math.log(1.25 / delta)) / epsilon, math.inf)
