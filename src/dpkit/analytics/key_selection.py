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
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray

from dpkit._validate import decimal_fraction
from dpkit.accounting.rounding import decimal_down, exp_up, to_decimal_down, to_float_down
from dpkit.errors import InvalidParameterError
from dpkit.mechanisms.gaussian import Gaussian
from dpkit.mechanisms.laplace import Geometric
from dpkit.noise.integers import _uniform_below
from dpkit.noise.source import RNG, resolve_rng

__all__ = [
    "KeySelection",
    "KEY_SELECTIONS",
    "KeySelector",
    "key_selector",
    "keep_probabilities",
    "laplace_threshold",
    "select_keys",
]

KeySelection = Literal["truncated_geometric", "laplace", "gaussian"]
KEY_SELECTIONS: tuple[str, ...] = ("truncated_geometric", "laplace", "gaussian")
_DENOM = 1 << 64


def _floor64(x: Fraction) -> Fraction:
    return Fraction(math.floor(x * _DENOM), _DENOM)


def keep_probabilities(epsilon: float, delta: float) -> list[Fraction]:
    """π(0), π(1), ..., up to the first n with π(n) = 1, for one group's (ε, δ)."""
    # <= e^ε (exp is within 1 ulp); beyond 700 a power of two below e^ε does (no overflow)
    e_down = (
        Fraction(math.exp(decimal_down(epsilon))) * (1 - Fraction(1, 2**50)) if epsilon < 700 else Fraction(2) ** 1000
    )
    e_inv_up = Fraction(exp_up(-decimal_fraction(epsilon)))  # >= e^-ε, ε at its decimal value (as charged)
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
            raise InvalidParameterError(
                "epsilon", epsilon, "a larger ε for private key selection (the keep-probability table does not reach 1)"
            )
    return pi


def laplace_threshold(scale: Fraction, delta_each: float) -> int:
    """The least integer m with P(Z >= m) <= delta_each for Z ~ discrete Laplace(scale):
    P(Z >= m) = ρ^m / (1 + ρ), ρ = e^{−1/scale}; computed with ρ rounded up."""
    rho = exp_up(Fraction(-1.0 / float(scale) * (1 - 2.0**-50)))
    m = math.ceil(math.log(delta_each * (1 + rho)) / math.log(rho))
    while rho**m / (1 + rho) > delta_each:  # guard the float logs
        m += 1
    return max(m, 1)


@dataclass(frozen=True)
class KeySelector:
    """A key-selection rule with every parameter-dependent quantity computed (and validated)
    up front, so that :meth:`select` — which runs on data, after the debit — cannot fail."""

    strategy: str
    fan_out: int
    pi: tuple[Fraction, ...] = ()
    mechanism: Any = None
    threshold: float = 0.0

    def select(self, units: NDArray[np.int64], rng: RNG = None) -> NDArray[np.bool_]:
        """Which groups to keep, given each group's number of distinct units (after bounding)."""
        units = np.asarray(units, dtype=np.int64)
        src = resolve_rng(rng)
        if units.size == 0:
            return np.zeros(0, dtype=bool)
        if self.strategy == "truncated_geometric":
            pi = self.pi
            keep = units >= len(pi) - 1
            for n in np.unique(units[~keep]):  # one exact Bernoulli batch per distinct count below π = 1
                if n <= 0:
                    continue
                idx = np.flatnonzero(units == n)
                p = pi[int(n)]
                keep[idx] = _uniform_below(_DENOM, idx.size, src) < np.uint64(p.numerator * (_DENOM // p.denominator))
            return keep
        if self.strategy == "laplace":
            return np.asarray(self.mechanism.release(units, rng=src)) >= self.threshold
        # P(Z >= t) <= exp(−t²/(2σ²)) for the discrete Gaussian (CKS 2020, Prop. 23, one side),
        # plus one lattice step for snapping; σ and the step are those of this vector's length.
        plan = self.mechanism.noise_plan(units.size)
        tau = 1.0 + plan.sigma * self.threshold + plan.lattice.granularity
        return np.asarray(self.mechanism.release(units.astype(np.float64), rng=src)) >= tau


def key_selector(
    *, epsilon: float, delta: float, fan_out: int, strategy: str = "truncated_geometric", neighbours: str = "add_remove"
) -> KeySelector:
    """Validate the selection's parameters and precompute its tables (no data involved)."""
    if strategy not in KEY_SELECTIONS:
        raise InvalidParameterError("key_selection", strategy, "one of " + ", ".join(map(repr, KEY_SELECTIONS)))
    # Each group's share, rounded so that the fan_out groups never cost more than (ε, δ): ε is
    # charged at the decimal value of its double (decimal_fraction), δ at its binary value.
    eps_each = to_decimal_down(decimal_fraction(epsilon) / fan_out)
    delta_each = to_float_down(Fraction(delta) / fan_out)
    if not delta_each >= 2.0**-60:
        raise InvalidParameterError(
            "delta",
            delta,
            f"a number >= {fan_out} × 2**-60 for private key selection (δ is shared by the {fan_out} groups a unit can touch)",
        )
    if strategy == "truncated_geometric":
        return KeySelector(strategy, fan_out, pi=tuple(keep_probabilities(eps_each, delta_each)))
    if strategy == "laplace":
        mech = Geometric(epsilon=epsilon, sensitivity=fan_out, neighbours=neighbours)  # type: ignore[arg-type]
        return KeySelector(
            strategy, fan_out, mechanism=mech, threshold=float(1 + laplace_threshold(mech._scale, delta_each))
        )
    mech_g = Gaussian(epsilon=epsilon, delta=delta / 2, sensitivity=math.sqrt(fan_out), neighbours=neighbours)  # type: ignore[arg-type]
    # ``threshold`` holds the tail in units of σ; select() scales it by the plan's σ
    return KeySelector(strategy, fan_out, mechanism=mech_g, threshold=math.sqrt(2.0 * math.log(2.0 * fan_out / delta)))


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
    return key_selector(epsilon=epsilon, delta=delta, fan_out=fan_out, strategy=strategy, neighbours=neighbours).select(
        units, rng
    )
