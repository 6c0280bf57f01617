"""How a synthetic release splits its budget, and the range its samplers accept.

The :class:`~dpkit.synth.synthesizer.Synthesizer` turns (ε, δ) into ρ-zCDP and shares ρ among its
measurements (discrete Gaussian noise of scale σ) and its selections (the exponential mechanism
with parameter ε_sel). Both samplers accept a bounded range: the exact discrete Gaussian draws σ in
[2**-20, 2**52] (:func:`dpkit.noise.discrete.discrete_gaussian`), the exponential mechanism a
finite ε_sel > 0 (:class:`dpkit.mechanisms.selection.Exponential`). A split outside that range
would be paid for and then fail in the first sampler call, so :func:`split` refuses it at once,
as an ``epsilon`` that is too large (σ below the floor) or too small (σ above :data:`MAX_SIGMA`),
from public facts only: (ε, δ), the method, the number of columns and of rounds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dpkit.accounting.zcdp import rho_for_approx_dp, zcdp_to_approx_dp
from dpkit.errors import InvalidParameterError

__all__ = ["MAX_SIGMA", "MIN_SIGMA", "Split", "largest_epsilon", "split"]

#: The most noise per count a release may carry: beyond it no table of fewer than about 10⁷
#: rows would show anything but noise; refused as "ε too small" before anything is paid.
MAX_SIGMA = 1e5
#: The least: the exact discrete Gaussian sampler's floor (``dpkit.noise.discrete``). At σ = 2**-20
#: the noise is 0 but with probability about exp(−2**39): a larger ε buys nothing.
MIN_SIGMA = 2.0**-20


@dataclass(frozen=True)
class Split:
    """ρ of the whole release, σ of the one-way and of the pair measurements, the ε of each of
    the ``rounds`` selections."""

    rho: float
    sigma_one: float
    sigma_two: float
    selection_epsilon: float
    rounds: int


def _shares(method: str, d: int, rounds: int, rho: float) -> tuple[float, float, float]:
    """(σ one-way, σ pairs, ε of a selection) for ρ: MST gives a third of ρ to each of the one-way
    measurements, the d − 1 selections and the d − 1 pair measurements; AIM 90 % to d + T
    measurements of one σ and 10 % to T selections of one ε."""
    if method == "mst":
        third = rho / 3
        return math.sqrt(d / (2 * third)), math.sqrt((d - 1) / (2 * third)), math.sqrt(8 * third / (d - 1))
    sigma = math.sqrt((d + rounds) / (2 * 0.9 * rho))
    return sigma, sigma, math.sqrt(8 * 0.1 * rho / rounds)


def largest_epsilon(method: str, d: int, rounds: int, delta: float) -> float:
    """About the largest ε at ``delta`` whose measurements keep σ >= :data:`MIN_SIGMA` (σ scales
    as 1/√ρ, so the largest ρ is (σ at ρ = 1 / MIN_SIGMA)²)."""
    at_one = min(_shares(method, d, rounds, 1.0)[:2])
    return zcdp_to_approx_dp((at_one / MIN_SIGMA) ** 2, delta)


def _three_digits_down(x: float) -> float:
    """``x`` cut (never rounded up) to three significant digits, for a limit quoted to a user: the
    quoted value is itself accepted."""
    step = 10.0 ** (math.floor(math.log10(x)) - 2)
    return math.floor(x / step) * step


def split(method: str, d: int, rounds: int, epsilon: float, delta: float) -> Split:
    """The split of (``epsilon``, ``delta``) over ``d`` columns and ``rounds`` selections, or
    InvalidParameterError naming ``epsilon`` when a sampler would refuse it (module docstring)."""
    try:
        rho = max(rho_for_approx_dp(epsilon, delta), 1e-300)  # (0 only for an ε the MAX_SIGMA check refuses)
    except (InvalidParameterError, OverflowError):  # ε near the largest double: ρ past it, σ 0
        rho = math.inf
    sigma_one, sigma_two, selection_epsilon = _shares(method, d, rounds, rho)
    sigma = min(sigma_one, sigma_two)
    if not sigma >= MIN_SIGMA:
        most = largest_epsilon(method, d, rounds, delta)
        selections = f"{rounds} selection{'s' if rounds != 1 else ''}"
        raise InvalidParameterError(
            "epsilon", epsilon,
            f"at most {_three_digits_down(most):g} at δ={delta:g} with {d} columns and {selections} "
            f"(noise of σ >= 2**-20 per count, the least the exact discrete Gaussian sampler draws; "
            f"here σ would be {sigma:.3g})",
            "beyond it the counts would be released exactly (σ = 2**-20 already gives noise 0 but with "
            "probability about exp(-2**39)); ask for that ε or less",
        )  # fmt: skip
    if max(sigma_one, sigma_two) > MAX_SIGMA:
        raise InvalidParameterError(
            "epsilon", epsilon,
            f"an ε large enough at δ={delta:g} for noise of σ <= {MAX_SIGMA:g} per count "
            f"(here σ would be {max(sigma_one, sigma_two):.3g})",
            "with so little budget every count would be buried in noise",
        )  # fmt: skip
    if not (math.isfinite(selection_epsilon) and selection_epsilon > 0):
        raise InvalidParameterError(
            "epsilon", epsilon,
            f"an ε whose share for each of the {rounds} selections is a finite number > 0, what the "
            f"exponential mechanism accepts (here {selection_epsilon!r})",
        )  # fmt: skip
    return Split(rho, sigma_one, sigma_two, selection_epsilon, rounds)
