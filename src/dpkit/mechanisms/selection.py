"""Private selection: the exponential mechanism and report noisy max.

Only the winning candidate is released — never a score or a noisy value.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

from dpkit import _validate as v
from dpkit._validate import Neighbours
from dpkit.accounting.events import ExponentialEvent, PureDPEvent
from dpkit.errors import InvalidDataError, InvalidParameterError
from dpkit.noise.bernoulli_exp import decide_exp_neg
from dpkit.noise.discrete import _geometric, laplace_plan, sample_discrete_laplace
from dpkit.noise.integers import _uniform_below
from dpkit.noise.lattice import choose_lattice, snap
from dpkit.noise.source import RNG, RandomSource, resolve_rng

__all__ = ["Exponential", "ReportNoisyMax"]


def _utilities(utilities: ArrayLike) -> NDArray[np.float64]:
    u = v.finite_array(utilities, "utilities")
    if u.ndim != 1:
        raise InvalidDataError("utilities", f"has shape {u.shape}", "a 1-D array with one score per candidate")
    return u


def _pick(index: int, candidates: Sequence[Any] | None) -> Any:
    return index if candidates is None else candidates[index]


def _check_candidates(candidates: Sequence[Any] | None, n: int) -> None:
    if candidates is not None and len(candidates) != n:
        raise InvalidDataError("candidates", f"has {len(candidates)} entries but utilities has {n}", "one candidate per utility")


def _validate_selection(mech: Exponential | ReportNoisyMax) -> None:
    object.__setattr__(mech, "epsilon", v.epsilon(mech.epsilon))
    object.__setattr__(mech, "sensitivity", v.positive(mech.sensitivity, "sensitivity"))
    v.neighbours(mech.neighbours)
    if not isinstance(mech.monotonic, bool):
        raise InvalidParameterError("monotonic", mech.monotonic, "True or False")


@dataclass(frozen=True, kw_only=True)
class Exponential:
    """The exponential mechanism: select candidate i with probability ∝ exp(ε·u_i / (2Δ)).

    Guarantee: ε-DP w.r.t. ``neighbours`` when every utility changes by at most ``sensitivity``
    between neighbours (McSherry & Talwar 2007; Dwork & Roth 2014, Thm 3.10; seed 004 ch. 6).
    With ``monotonic=True`` (all utilities move in the same direction between neighbours, as for
    counts) the factor 2 is dropped (Dwork & Roth 2014, remark after Thm 3.10).

    Sampling is exact for the utilities as given: a uniform candidate is proposed and accepted
    with probability exp(−ε(u_max − u_i)/(2Δ)), decided by exact Bernoulli(exp(−γ)) trials (no
    floating-point exp, no normalisation that could overflow or round). The expected number of
    proposals is n / Σ_i exp(−γ_i) <= n.

    >>> import numpy as np
    >>> mech = Exponential(epsilon=2.0, sensitivity=1.0)
    >>> mech.release([1.0, 5.0, 2.0], candidates=["a", "b", "c"], rng=np.random.default_rng(3))
    'b'
    """

    epsilon: float
    sensitivity: float = 1.0
    monotonic: bool = False
    neighbours: Neighbours = "add_remove"

    def __post_init__(self) -> None:
        _validate_selection(self)

    @property
    def event(self) -> ExponentialEvent:
        return ExponentialEvent(epsilon=self.epsilon, neighbours=self.neighbours)

    def probabilities(self, utilities: ArrayLike) -> NDArray[np.float64]:
        """The selection probabilities (floating point, for display and tests only)."""
        u = _utilities(utilities)
        w = np.exp(self._factor_float() * (u - u.max()))
        return w / w.sum()

    def _factor(self) -> Fraction:
        return Fraction(self.epsilon) / (Fraction(self.sensitivity) * (1 if self.monotonic else 2))

    def _factor_float(self) -> float:
        return self.epsilon / (self.sensitivity * (1 if self.monotonic else 2))

    def release(self, utilities: ArrayLike, *, candidates: Sequence[Any] | None = None, rng: RNG = None) -> Any:
        """The selected candidate (or its index when ``candidates`` is None)."""
        u = _utilities(utilities)
        _check_candidates(candidates, u.size)
        return _pick(self._sample(u, resolve_rng(rng)), candidates)

    def _sample(self, u: NDArray[np.float64], src: RandomSource) -> int:
        n = u.size
        top = u.max()
        factor = self._factor()
        c = self._factor_float()
        diff = top - u  # each one correctly rounded: relative error <= 2^-53
        gamma_hat = diff * c  # plus the roundings of c and the product: err <= γ̂·2^-50
        weight = float(np.exp(-gamma_hat).sum())  # only sizes the batches
        batch = int(min(max(2.0 * n / max(weight, 1e-300), 64), 1 << 20))
        top_f = Fraction(float(top))
        while True:
            idx = _uniform_below(n, batch, src).astype(np.intp)
            g = gamma_hat[idx]
            ok = decide_exp_neg(
                g,
                g * 2.0**-50,
                src.words(batch) >> np.uint64(11),
                53,
                lambda i, idx=idx: factor * (top_f - Fraction(float(u[idx[i]]))),
                src,
            )
            hits = np.flatnonzero(ok)
            if hits.size:
                return int(idx[hits[0]])


@dataclass(frozen=True, kw_only=True)
class ReportNoisyMax:
    """Report noisy max: add noise to every score and release only the index of the largest.

    Guarantee: ε-DP w.r.t. ``neighbours`` when each score changes by at most ``sensitivity``
    between neighbours (Dwork & Roth 2014, Claim 3.9 for counts; seed 004 ch. 6). Noise:
    ``"laplace"`` — Laplace with scale 2Δ/ε (Δ/ε if ``monotonic``); ``"exponential"`` — one-sided
    exponential noise with the same scale, which is the permute-and-flip mechanism (McKenna &
    Sheldon 2020; Ding et al. 2021) and never worse than the exponential mechanism.

    Floating-point safety: scores are snapped to a lattice g = 2^k (2^-47 of the scale) and
    the noise is exact discrete noise on it; ties go to the lowest index. Snapped neighbours
    differ by at most ⌊Δ/g⌋ + 1 lattice steps per score, and the noise scale is calibrated for
    that integer sensitivity, for which the usual argument (the winner's noise must clear a
    threshold that moves by at most 2Δ, or Δ when monotonic) is exact on the lattice.

    >>> import numpy as np
    >>> ReportNoisyMax(epsilon=1.0).release([10, 50, 20], rng=np.random.default_rng(0))
    1
    """

    epsilon: float
    sensitivity: float = 1.0
    noise: Literal["laplace", "exponential"] = "laplace"
    monotonic: bool = False
    neighbours: Neighbours = "add_remove"

    def __post_init__(self) -> None:
        _validate_selection(self)
        if self.noise not in ("laplace", "exponential"):
            raise InvalidParameterError("noise", self.noise, "'laplace' or 'exponential'")

    @property
    def event(self) -> PureDPEvent:
        return PureDPEvent(epsilon=self.epsilon, neighbours=self.neighbours)

    @property
    def scale(self) -> float:
        return self.sensitivity * (1 if self.monotonic else 2) / self.epsilon

    def _plan(self) -> tuple[Any, Fraction]:
        lattice = choose_lattice(self.scale, 1 << 10)  # 2^-47 of the scale: ties are negligible
        steps = math.floor(self.sensitivity / lattice.granularity) + 1
        lattice_scale = Fraction(steps * (1 if self.monotonic else 2)) / Fraction(self.epsilon)
        return lattice, lattice_scale

    def noisy_scores(self, utilities: ArrayLike, *, rng: RNG = None) -> NDArray[np.int64]:
        """The noisy scores on the lattice (integers). Internal: releasing them is NOT private."""
        u = _utilities(utilities)
        lattice, lattice_scale = self._plan()
        points = snap(u, lattice)
        if np.any(np.abs(points) >= 2.0**62):
            raise InvalidDataError("utilities", "are too large relative to the noise scale", "|u| < 2**12 × scale")
        src = resolve_rng(rng)
        plan = laplace_plan(lattice_scale)
        if self.noise == "laplace":
            noise = sample_discrete_laplace(plan, u.size, src)
        else:  # the geometric: P(Z = z) ∝ e^{-z/t}, z >= 0, the lattice version of Exp(t)
            noise, _ = _geometric(plan, u.size, src)
        return points.astype(np.int64) + noise

    def release(self, utilities: ArrayLike, *, candidates: Sequence[Any] | None = None, rng: RNG = None) -> Any:
        """The index (or candidate) with the largest noisy score."""
        u = _utilities(utilities)
        _check_candidates(candidates, u.size)
        return _pick(int(np.argmax(self.noisy_scores(u, rng=rng))), candidates)
