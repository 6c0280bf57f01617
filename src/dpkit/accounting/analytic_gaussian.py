"""The exact (ε, δ) curve of the Gaussian mechanism and σ calibrations.

Balle & Wang (2018, Thm 8): adding N(0, σ²) to a query of ℓ2 sensitivity Δ is (ε, δ)-DP iff

    δ >= Φ(Δ/(2σ) − εσ/Δ) − e^ε · Φ(−Δ/(2σ) − εσ/Δ).

The classic bound σ = Δ·√(2 ln(1.25/δ))/ε (Dwork & Roth 2014, Thm 3.22; seeds 003, 004) holds
only for ε < 1.
"""

from __future__ import annotations

import math

from scipy.special import log_ndtr

from dpkit import _validate as v
from dpkit.errors import InvalidParameterError

__all__ = ["gaussian_delta", "analytic_gaussian_sigma", "classic_gaussian_sigma"]


def gaussian_delta(epsilon: float, noise_multiplier: float) -> float:
    """The smallest δ for which N(0, (m·Δ)²) noise is (ε, δ)-DP, m = noise_multiplier.

    Evaluated as Φ(a)·(1 − e^{ε + lnΦ(b) − lnΦ(a)}) with ``expm1``, which keeps full relative
    precision where the two terms nearly cancel (small ε, small δ).
    """
    m = noise_multiplier
    a = 1.0 / (2.0 * m) - epsilon * m
    b = -1.0 / (2.0 * m) - epsilon * m
    la, lb = float(log_ndtr(a)), float(log_ndtr(b))
    return max(-math.exp(la) * math.expm1(epsilon + lb - la), 0.0)


def analytic_gaussian_sigma(epsilon: float, delta: float, sensitivity: float) -> float:
    """The smallest σ (to about 1e-11 relative, rounded up) making N(0, σ²) (ε, δ)-DP, any ε > 0.

    Bisection on the monotone curve above, then σ is raised by 1e-11 relative — far more than
    the curve's floating-point error — and re-checked.
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
    unit = hi * (1.0 + 1e-11)
    for _ in range(60):  # re-check the answer; each retry adds another 1e-10 (never needed so far)
        if gaussian_delta(epsilon, unit) <= delta:
            return math.nextafter(unit * sensitivity, math.inf)
        unit *= 1.0 + 1e-11
    raise InvalidParameterError("delta", delta, "a value the analytic Gaussian calibration can reach for this ε")


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
