"""How a synthetic release splits its budget, and the range its samplers accept.

The :class:`~dpkit.synth.synthesizer.Synthesizer` turns (ε, δ) into ρ-zCDP and shares ρ among its
measurements (discrete Gaussian noise of scale σ) and its selections (the exponential mechanism
with parameter ε_sel). With AIM, each column's one-way marginal gets a share of the one-way ρ in
proportion to its number of cells (public: the domain's): the noise of a marginal, in total
variation, grows with σ·cells, and a column of 42 categories needs the precision more than one of
2 (its rare cells are merged, and then drawn in proportion to their noisy one-way counts). Both samplers accept a bounded range: the exact discrete Gaussian draws σ in
[2**-20, 2**52] (:func:`dpkit.noise.discrete.discrete_gaussian`), the exponential mechanism a
finite ε_sel > 0 (:class:`dpkit.mechanisms.selection.Exponential`). A split outside that range
would be paid for and then fail in the first sampler call, so :func:`split` refuses it at once,
as an ``epsilon`` that is too large (σ below the floor) or too small (σ above :data:`MAX_SIGMA`),
from public facts only: (ε, δ), the method, the number of columns and of rounds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from dpkit.accounting.zcdp import rho_for_approx_dp, zcdp_to_approx_dp
from dpkit.errors import InvalidParameterError

__all__ = ["AIM_ONE_WAY", "AIM_SELECTION", "MAX_SIGMA", "MIN_SIGMA", "Split", "largest_epsilon", "split"]

#: The most noise per count a release may carry: beyond it no table of fewer than about 10⁷
#: rows would show anything but noise; refused as "ε too small" before anything is paid.
MAX_SIGMA = 1e5
#: The least: the exact discrete Gaussian sampler's floor (``dpkit.noise.discrete``). At σ = 2**-20
#: the noise is 0 but with probability about exp(−2**39): a larger ε buys nothing.
MIN_SIGMA = 2.0**-20
#: AIM's share of ρ for its T selections; of the rest, the share of the d one-way measurements (the
#: T pair measurements get the remainder). Chosen on UCI Adult (benchmarks/bench_synth.py): the
#: pair measurements carry the model, and a selection needs little ε to tell a good pair from a bad
#: one (its scores differ by hundreds of rows).
AIM_SELECTION = 0.05
AIM_ONE_WAY = 0.2


@dataclass(frozen=True)
class Split:
    """ρ of the whole release, σ of each column's one-way measurement and of the pair
    measurements, the ε of each of the ``rounds`` selections."""

    rho: float
    sigma_ones: tuple[float, ...]
    sigma_two: float
    selection_epsilon: float
    rounds: int

    @property
    def sigma_one(self) -> float:
        """The least one-way σ."""
        return min(self.sigma_ones)


def _shares(method: str, d: int, rounds: int, rho: float) -> tuple[float, float, float]:
    """(σ of d one-way measurements of equal share, σ pairs, ε of a selection) for ρ: MST gives a
    third of ρ to each of the one-way measurements, the d − 1 selections and the d − 1 pair
    measurements; AIM :data:`AIM_SELECTION` of ρ to T selections of one ε, and of the rest
    :data:`AIM_ONE_WAY` to the d one-way measurements and the remainder to T pair measurements
    of one σ."""
    if method == "mst":
        third = rho / 3
        return math.sqrt(d / (2 * third)), math.sqrt((d - 1) / (2 * third)), math.sqrt(8 * third / (d - 1))
    measured = (1 - AIM_SELECTION) * rho
    return (
        math.sqrt(d / (2 * AIM_ONE_WAY * measured)),
        math.sqrt(rounds / (2 * (1 - AIM_ONE_WAY) * measured)),
        math.sqrt(8 * AIM_SELECTION * rho / rounds),
    )


def _one_way(method: str, sigma: float, cells: Sequence[int]) -> tuple[float, ...]:
    """Each column's one-way σ: with AIM, the one-way ρ (d equal shares of σ) shared in proportion
    to the columns' cells — ρ_i = ρ_one·k_i/Σk, σ_i = σ·√(Σk/(d·k_i)), the same total; with MST,
    σ for every column (as published)."""
    if method == "mst":
        return tuple(sigma for _ in cells)
    total, d = float(sum(cells)), len(cells)
    return tuple(sigma * math.sqrt(total / (d * k)) for k in cells)


def largest_epsilon(method: str, d: int, rounds: int, delta: float, cells: Sequence[int] | None = None) -> float:
    """About the largest ε at ``delta`` whose measurements keep σ >= :data:`MIN_SIGMA` (σ scales
    as 1/√ρ, so the largest ρ is (σ at ρ = 1 / MIN_SIGMA)²)."""
    one, two, _ = _shares(method, d, rounds, 1.0)
    at_one = min(*_one_way(method, one, cells or [1] * d), two)
    return zcdp_to_approx_dp((at_one / MIN_SIGMA) ** 2, delta)


def _three_digits_down(x: float) -> float:
    """``x`` cut (never rounded up) to three significant digits, for a limit quoted to a user: the
    quoted value is itself accepted."""
    step = 10.0 ** (math.floor(math.log10(x)) - 2)
    return math.floor(x / step) * step


def split(method: str, d: int, rounds: int, epsilon: float, delta: float, cells: Sequence[int] | None = None) -> Split:
    """The split of (``epsilon``, ``delta``) over ``d`` columns of ``cells`` cells each (default:
    equal) and ``rounds`` selections, or InvalidParameterError naming ``epsilon`` when a sampler
    would refuse it (module docstring)."""
    cells = [1] * d if cells is None else list(cells)
    try:
        rho = max(rho_for_approx_dp(epsilon, delta), 1e-300)  # (0 only for an ε the MAX_SIGMA check refuses)
    except (InvalidParameterError, OverflowError):  # ε near the largest double: ρ past it, σ 0
        rho = math.inf
    sigma_equal, sigma_two, selection_epsilon = _shares(method, d, rounds, rho)
    sigma_ones = _one_way(method, sigma_equal, cells)
    sigma = min(*sigma_ones, sigma_two)
    if not sigma >= MIN_SIGMA:
        most = largest_epsilon(method, d, rounds, delta, cells)
        selections = f"{rounds} selection{'s' if rounds != 1 else ''}"
        raise InvalidParameterError(
            "epsilon", epsilon,
            f"at most {_three_digits_down(most):g} at δ={delta:g} with {d} columns and {selections} "
            f"(noise of σ >= 2**-20 per count, the least the exact discrete Gaussian sampler draws; "
            f"here σ would be {sigma:.3g})",
            "beyond it the counts would be released exactly (σ = 2**-20 already gives noise 0 but with "
            "probability about exp(-2**39)); ask for that ε or less",
        )  # fmt: skip
    if max(*sigma_ones, sigma_two) > MAX_SIGMA:
        raise InvalidParameterError(
            "epsilon", epsilon,
            f"an ε large enough at δ={delta:g} for noise of σ <= {MAX_SIGMA:g} per count "
            f"(here σ would be {max(*sigma_ones, sigma_two):.3g})",
            "with so little budget every count would be buried in noise",
        )  # fmt: skip
    if not (math.isfinite(selection_epsilon) and selection_epsilon > 0):
        raise InvalidParameterError(
            "epsilon", epsilon,
            f"an ε whose share for each of the {rounds} selections is a finite number > 0, what the "
            f"exponential mechanism accepts (here {selection_epsilon!r})",
        )  # fmt: skip
    return Split(rho, sigma_ones, sigma_two, selection_epsilon, rounds)
