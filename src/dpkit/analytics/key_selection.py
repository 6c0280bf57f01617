"""Private selection of group-by keys that are not public.

A key observed in the data may belong to a single privacy unit; releasing it (even with a noisy
count) would reveal that unit. A key is therefore released only with a probability that grows
with the number of distinct units in its group, so that a key held by one unit appears with
probability at most δ. Each unit is in at most F groups (F = max_groups, 2·max_groups under
``replace``), so each group's decision gets ε/F and δ/F and the whole selection is (ε, δ)-DP by
basic composition.

Strategies (``key_selection=``):

* ``"truncated_geometric"`` (default) — the optimal rule of Desfontaines, Voss, Gipson & Mandayam
  (2022, "Differentially private partition selection", PoPETs, Thm 1): keep a group of n units
  with probability π(n), π(0) = 0, π(n) = min(e^ε π(n−1) + δ, 1 − e^{−ε}(1 − π(n−1) − δ), 1).
  The table is computed in exact rational arithmetic, rounding each π(n) down to a multiple of
  2**-64, which keeps both inequalities true for the probabilities actually used, and each
  keep/drop is an exact Bernoulli trial.
* ``"laplace"`` — add discrete Laplace noise of scale F/ε to each group's unit count and keep
  groups whose noisy count reaches τ = 1 + m, with m the least integer such that
  P(Z >= m) <= δ/F (Korolova, Kenthapadi, Mishra & Ntoulas 2009; Wilson et al. 2020).
* ``"gaussian"`` — the same with Gaussian noise (ℓ2 sensitivity √F, calibrated for (ε, δ/2))
  and a threshold whose one-sided tail is below δ/(2F).

>>> import numpy as np
>>> keep = select_keys(np.array([1, 2, 50, 400]), epsilon=1.0, delta=1e-6, fan_out=1, rng=np.random.default_rng(0))
>>> keep.tolist()
[False, False, True, True]
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Literal

import numpy as np
from numpy.typing import NDArray

from dpkit.accounting.rounding import exp_up
from dpkit.errors import InvalidParameterError
from dpkit.mechanisms.gaussian import Gaussian
from dpkit.mechanisms.laplace import Geometric
from dpkit.noise.integers import _uniform_below
from dpkit.noise.source import RNG, resolve_rng

__all__ = ["KeySelection", "KEY_SELECTIONS", "keep_probabilities", "laplace_threshold", "select_keys"]

KeySelection = Literal["truncated_geometric", "laplace", "gaussian"]
KEY_SELECTIONS: tuple[str, ...] = ("truncated_geometric", "laplace", "gaussian")
_DENOM = 1 << 64


def _floor64(x: Fraction) -> Fraction:
    return Fraction(math.floor(x * _DENOM), _DENOM)


def keep_probabilities(epsilon: float, delta: float) -> list[Fraction]:
    """π(0), π(1), ..., up to the first n with π(n) = 1, for one group's (ε, δ)."""
    e_down = Fraction(math.exp(epsilon)) * (1 - Fraction(1, 2**50))  # <= e^ε (exp is within 1 ulp)
    e_inv_up = Fraction(exp_up(-epsilon))  # >= e^-ε
    d = Fraction(delta)
    pi = [Fraction(0)]
    while pi[-1] < 1:
        p = pi[-1]
        nxt = min(e_down * p + d, 1 - e_inv_up * (1 - p - d), Fraction(1))
        nxt = max(p, _floor64(nxt))
        if nxt == p and p < 1:  # can only happen for δ below 2**-64: no progress possible
            raise InvalidParameterError("delta", delta, "a number >= 2**-60 for private key selection")
        pi.append(nxt)
        if len(pi) > 1_000_000:
            raise InvalidParameterError("epsilon", epsilon, "a larger ε for private key selection (the keep-probability table does not reach 1)")
    return pi


def laplace_threshold(scale: Fraction, delta_each: float) -> int:
    """The least integer m with P(Z >= m) <= delta_each for Z ~ discrete Laplace(scale):
    P(Z >= m) = ρ^m / (1 + ρ), ρ = e^{−1/scale}; computed with ρ rounded up."""
    rho = exp_up(-1.0 / float(scale) * (1 - 2.0**-50))
    m = math.ceil(math.log(delta_each * (1 + rho)) / math.log(rho))
    while rho**m / (1 + rho) > delta_each:  # guard the float logs
        m += 1
    return max(m, 1)


def select_keys(
    units: NDArray[np.int64],
    *,
    epsilon: float,
    delta: float,
    fan_out: int,
    strategy: KeySelection = "truncated_geometric",
    neighbours: str = "add_remove",
    rng: RNG = None,
) -> NDArray[np.bool_]:
    """Which groups to keep, given each group's number of distinct units (after bounding)."""
    units = np.asarray(units, dtype=np.int64)
    src = resolve_rng(rng)
    eps_each, delta_each = epsilon / fan_out, delta / fan_out
    if strategy == "truncated_geometric":
        pi = keep_probabilities(eps_each, delta_each)
        keep = units >= len(pi) - 1
        for n in np.unique(units[~keep]):  # one exact Bernoulli batch per distinct count below π = 1
            if n <= 0:
                continue
            idx = np.flatnonzero(units == n)
            p = pi[int(n)]
            keep[idx] = _uniform_below(_DENOM, idx.size, src) < np.uint64(p.numerator * (_DENOM // p.denominator))
        return keep
    if strategy == "laplace":
        mech = Geometric(epsilon=epsilon, sensitivity=fan_out, neighbours=neighbours)  # type: ignore[arg-type]
        tau = 1 + laplace_threshold(mech._scale, delta_each)
        return mech.release(units, rng=src) >= tau
    if strategy == "gaussian":
        mech_g = Gaussian(epsilon=epsilon, delta=delta / 2, sensitivity=math.sqrt(fan_out), neighbours=neighbours)  # type: ignore[arg-type]
        plan = mech_g.noise_plan(max(units.size, 1))
        # P(Z >= t) <= exp(−t²/(2σ²)) for the discrete Gaussian (CKS 2020, Prop. 23, one side),
        # plus one lattice step for snapping.
        tail = plan.sigma * math.sqrt(2.0 * math.log(2.0 * fan_out / delta)) + plan.lattice.granularity
        tau_g = 1.0 + tail
        if units.size == 0:
            return np.zeros(0, dtype=bool)
        return np.asarray(mech_g.release(units.astype(np.float64), rng=src)) >= tau_g
    raise InvalidParameterError("key_selection", strategy, "one of " + ", ".join(map(repr, KEY_SELECTIONS)))
