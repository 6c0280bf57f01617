"""Private selection: the exponential mechanism and report noisy max.

Only the winning candidate is released — never a score or a noisy value.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from functools import partial
from typing import Any, Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

from dpkit import _validate as v
from dpkit._validate import Neighbours, decimal_fraction
from dpkit.accounting.events import ExponentialEvent, PureDPEvent
from dpkit.errors import InvalidDataError, InvalidParameterError
from dpkit.noise.bernoulli_exp import decide_exp_neg
from dpkit.noise.discrete import _geometric, laplace_plan, sample_discrete_laplace
from dpkit.noise.integers import _uniform_below
from dpkit.noise.lattice import Lattice, snap
from dpkit.noise.source import RNG, RandomSource, resolve_rng

__all__ = ["Exponential", "ReportNoisyMax"]

# Exponential: utilities clamped to ±2^1000, so u_max − u_i (<= 2^1001) never overflows.
_EXPONENTIAL_LIMIT = 2.0**1000
# ReportNoisyMax: a lattice 2^-36 of the noise scale; scores clamped to ±2^61 lattice steps. The
# noise (scale about 2^37 steps) then keeps point + noise inside int64 except with probability
# about e^{-2^24}.
_RNM_LATTICE_BITS = 36
_RNM_POINT_BITS = 61


def _utilities(utilities: ArrayLike, limit: float) -> NDArray[np.float64]:
    """The scores as a 1-D float array, NaN → 0 and clamped to [−limit, limit] (1-Lipschitz).

    Raises only on public facts: dtype, shape, emptiness.
    """
    u = v.data_array(utilities, "utilities")
    if u.ndim != 1:
        raise InvalidDataError("utilities", f"has shape {u.shape}", "a 1-D array with one score per candidate")
    return v.clamp(u, limit)


def _pick(index: int, candidates: Sequence[Any] | None) -> Any:
    return index if candidates is None else candidates[index]


def _check_candidates(candidates: Sequence[Any] | None, n: int) -> None:
    if candidates is not None and len(candidates) != n:
        raise InvalidDataError(
            "candidates", f"has {len(candidates)} entries but utilities has {n}", "one candidate per utility"
        )


def _validate_selection(mech: Exponential | ReportNoisyMax) -> None:
    object.__setattr__(mech, "epsilon", v.epsilon(mech.epsilon))
    object.__setattr__(mech, "sensitivity", v.positive(mech.sensitivity, "sensitivity"))
    v.neighbours(mech.neighbours)
    if not isinstance(mech.monotonic, bool):
        raise InvalidParameterError("monotonic", mech.monotonic, "True or False")


def _gamma_at(factor: Fraction, top: Fraction, u: NDArray[np.float64], idx: NDArray[np.intp], i: int) -> Fraction:
    """The exact γ of lane i: factor·(max u − u[idx[i]])."""
    return factor * (top - Fraction(float(u[idx[i]])))


@dataclass(frozen=True, kw_only=True)
class Exponential:
    """The exponential mechanism: select candidate i with probability ∝ exp(ε·u_i / (2Δ)).

    Guarantee: ε-DP w.r.t. ``neighbours`` when every utility changes by at most ``sensitivity``
    between neighbours (McSherry & Talwar 2007; Dwork & Roth 2014, Thm 3.10).
    With ``monotonic=True`` (all utilities move in the same direction between neighbours, as for
    counts) the factor 2 is dropped (Dwork & Roth 2014, remark after Thm 3.10).

    Sampling is exact for the utilities as given: a uniform candidate is proposed and accepted
    with probability exp(−ε(u_max − u_i)/(2Δ)), decided by exact Bernoulli(exp(−γ)) trials (no
    floating-point exp, no normalisation that could overflow or round). The expected number of
    proposals is n / Σ_i exp(−γ_i) <= n. Proposals are drawn in batches whose size depends on n
    only, never on the utilities.

    Totality: :meth:`release` never raises on a utility value. NaN is treated as 0 (a NaN has no
    place in a score with a declared sensitivity) and every utility is clamped to [−M, M],
    M = 2^1000 (±inf to ±M). Clamping each utility to a fixed interval is 1-Lipschitz, so a
    utility's sensitivity is unchanged and so is the guarantee; monotonicity survives too.
    Only public facts raise: dtype, shape, an empty array, a candidate list of the wrong length.

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
        u = _utilities(utilities, _EXPONENTIAL_LIMIT)
        with np.errstate(over="ignore"):  # a product of −inf gives weight 0, as it should
            w = np.exp(self._factor_float() * (u - u.max()))
        return w / w.sum()

    def _factor(self) -> Fraction:
        # ε at its decimal value, the amount the event charges (decimal_fraction)
        return decimal_fraction(self.epsilon) / (Fraction(self.sensitivity) * (1 if self.monotonic else 2))

    def _factor_float(self) -> float:
        return float(self._factor())  # within half an ulp of the exact factor

    def utility_gap(self, size: int, confidence: float = 0.95) -> float:
        """c such that, whatever the utilities of ``size`` candidates, the selected candidate's
        utility is at most OPT − c with probability at most 1 − ``confidence`` (OPT: the best
        utility). It depends on ε, Δ, ``size`` and ``confidence`` alone, never on the data, so it
        can be published with every release for free.

        Theorem (the utility theorem of McSherry & Talwar 2007; Dwork & Roth 2014, Thm 3.11,
        here with its exact constant): with β = 1 − confidence,

            c = (2Δ/ε)·ln((size − 1)·(1 − β)/β)   (Δ/ε with ``monotonic=True``; 0 for one candidate).

        Proof: a candidate with u <= OPT − c has weight at most e^{−εc/(2Δ)} times an optimal
        candidate's, there are at most size − 1 of them and at least one optimal candidate, so
        P[u(out) <= OPT − c] <= B/(1 + B) with B = (size − 1)·e^{−εc/(2Δ)}; B/(1 + B) = β at the c
        above. The bound is tight: utilities 0 for one candidate and −c for all the others attain
        it. ε is read at its decimal value, as the sampler reads it.

        >>> round(Exponential(epsilon=1.0).utility_gap(101, confidence=0.95), 3)
        15.099
        """
        size = v.positive_int(size, "size")
        beta = 1.0 - v.probability(confidence, "confidence")
        if size == 1:
            return 0.0
        log_odds = math.log(size - 1) + math.log1p(-beta) - math.log(beta)
        # 1/factor = 2Δ/ε (Δ/ε if monotonic); the last factor covers the roundings of the logs.
        return max(0.0, log_odds / self._factor_float() * (1.0 + 2.0**-40))

    def release(self, utilities: ArrayLike, *, candidates: Sequence[Any] | None = None, rng: RNG = None) -> Any:
        """The selected candidate (or its index when ``candidates`` is None). Total on utility
        values (class docstring)."""
        u = _utilities(utilities, _EXPONENTIAL_LIMIT)
        _check_candidates(candidates, u.size)
        return _pick(self._sample(u, resolve_rng(rng)), candidates)

    def _sample(self, u: NDArray[np.float64], src: RandomSource) -> int:
        n = u.size
        top = u.max()
        factor = self._factor()
        c = self._factor_float()
        diff = top - u  # |u| <= 2^1000: no overflow; each correctly rounded, rel. error <= 2^-53
        with np.errstate(over="ignore"):
            gamma_hat = diff * c  # plus the roundings of c and the product: err <= γ̂·2^-50
        # Lanes with γ̂ >= 64 have γ > 48, so e^{−γ} < 2^-69: the enclosure (0, 2·e^{-48}) holds
        # for them with any γ̂ >= 48 and err < 1/2. Passing γ̂ = 64, err = 0 keeps them off the
        # slow exact branch (err > 1/2 would send every such proposal there), so the work per
        # proposal does not depend on how far apart the utilities are.
        far = ~(gamma_hat < 64.0)  # also catches an overflowed product (inf)
        gamma_hat = np.where(far, 64.0, gamma_hat)
        gamma_err = np.where(far, 0.0, gamma_hat * 2.0**-50)
        # The batch size is a function of n alone: sizing it from the utilities (as the expected
        # number of proposals would) made the amount of randomness drawn data-dependent.
        batch = int(min(max(2 * n, 64), 1 << 20))
        top_f = Fraction(float(top))
        while True:
            idx = _uniform_below(n, batch, src).astype(np.intp)
            g = gamma_hat[idx]
            ok = decide_exp_neg(
                g,
                gamma_err[idx],
                src.words(batch) >> np.uint64(11),
                53,
                partial(_gamma_at, factor, top_f, u, idx),
                src,
            )
            hits = np.flatnonzero(ok)
            if hits.size:
                return int(idx[hits[0]])


@dataclass(frozen=True, kw_only=True)
class ReportNoisyMax:
    """Report noisy max: add noise to every score and release only the index of the largest.

    Guarantee: ε-DP w.r.t. ``neighbours`` when each score changes by at most ``sensitivity``
    between neighbours (Dwork & Roth 2014, Claim 3.9 for counts). Noise:
    ``"laplace"`` — Laplace with scale 2Δ/ε (Δ/ε if ``monotonic``); ``"exponential"`` — one-sided
    exponential noise with the same scale, which is the permute-and-flip mechanism (McKenna &
    Sheldon 2020; Ding et al. 2021) and never worse than the exponential mechanism.

    Floating-point safety: scores are snapped to a lattice g = 2^k (between 2^-37 and 2^-36 of
    the scale) and the noise is exact discrete noise on it; ties go to the lowest index (a tie is
    the event "the winner's noise reaches an integer threshold", so the argument below is exact
    with ties too; they have probability about 2^-36 per pair). Snapped neighbours
    differ by at most ⌊Δ/g⌋ + 1 lattice steps per score, and the noise scale is calibrated for
    that integer sensitivity, for which the usual argument (the winner's noise must clear a
    threshold that moves by at most 2Δ, or Δ when monotonic) is exact on the lattice.

    Totality: :meth:`release` never raises on a score value. NaN is treated as 0 (a NaN has no
    place in a score with a declared sensitivity) and every score is clamped to [−M, M] before
    snapping, M = 2^61·g (:meth:`score_limit`; between 2^24 and 2^25 noise scales, fixed by ε, Δ
    and ``monotonic``), so ±inf become ±M and the lattice points plus noise stay inside int64.
    Clamping each score to a fixed interval is 1-Lipschitz, so the sensitivity (and
    monotonicity) are unchanged and so is the guarantee; scores beyond ±M tie at the bound.
    Only public facts raise: dtype, shape, an empty array, a candidate list of the wrong length.

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
        self._plan()  # the lattice is a function of the parameters: refuse a bad scale now

    @property
    def event(self) -> PureDPEvent:
        return PureDPEvent(epsilon=self.epsilon, neighbours=self.neighbours)

    @property
    def scale(self) -> float:
        return self.sensitivity * (1 if self.monotonic else 2) / self.epsilon

    def _plan(self) -> tuple[Lattice, Fraction]:
        # g = 2^-36 of the scale (rounded down to a power of two): the extra lattice step adds at
        # most g/Δ <= 2^-35/ε relative noise, and the int64 range holds ±2^61 steps = 2^24 or more
        # noise scales (a coarser grid than the 2^-47 of Laplace, which left room for only 2^14
        # noise scales — scores of a few ten thousand at ε = 1).
        scale = self.scale
        if not (math.isfinite(scale) and 2.0**-900 <= scale <= 2.0**900):
            raise InvalidParameterError("sensitivity/epsilon", scale, "a noise scale (1 or 2)·Δ/ε in [2**-900, 2**900]")
        lattice = Lattice(math.floor(math.log2(scale)) - _RNM_LATTICE_BITS)
        steps = math.floor(self.sensitivity / lattice.granularity) + 1
        lattice_scale = Fraction(steps * (1 if self.monotonic else 2)) / decimal_fraction(self.epsilon)
        return lattice, lattice_scale

    def score_limit(self) -> float:
        """M = 2^61·g: scores are clamped to [−M, M] (between 2^24 and 2^25 noise scales)."""
        lattice, _ = self._plan()
        return math.ldexp(1.0, lattice.exponent + _RNM_POINT_BITS)

    def noisy_scores(self, utilities: ArrayLike, *, rng: RNG = None) -> NDArray[np.int64]:
        """The noisy scores on the lattice (integers). Internal: releasing them is NOT private."""
        lattice, lattice_scale = self._plan()
        u = _utilities(utilities, self.score_limit())
        points = snap(u, lattice)  # exact integers in [−2^61, 2^61]: M/g = 2^61
        src = resolve_rng(rng)
        plan = laplace_plan(lattice_scale)
        if self.noise == "laplace":
            noise = sample_discrete_laplace(plan, u.size, src)
        else:  # the geometric: P(Z = z) ∝ e^{-z/t}, z >= 0, the lattice version of Exp(t)
            noise, _ = _geometric(plan, u.size, src)
        return points.astype(np.int64) + noise

    def release(self, utilities: ArrayLike, *, candidates: Sequence[Any] | None = None, rng: RNG = None) -> Any:
        """The index (or candidate) with the largest noisy score. Total on score values (class
        docstring)."""
        u = _utilities(utilities, self.score_limit())
        _check_candidates(candidates, u.size)
        return _pick(int(np.argmax(self.noisy_scores(u, rng=rng))), candidates)
