"""Propose-test-release (Dwork & Lei 2009; Dwork & Roth 2014 §7.1).

The analyst **proposes** a bound b on the local sensitivity. The mechanism **tests**, privately,
whether the data are far from every dataset whose local sensitivity exceeds b, and only then
**releases** f(D) with noise calibrated to b:

1. γ = γ(D), the number of records to change before LS_f can exceed b (an integer, or ∞ when it
   never can); γ changes by at most 1 between neighbours.
2. γ̂ = γ + Z, Z discrete Laplace with scale 1/ε_test (exact integer noise: γ is an integer with
   sensitivity 1, so :class:`~dpkit.mechanisms.laplace.Geometric` is exact).
3. If γ̂ ≤ T = ln(1/δ)/ε_test, return ⊥ (``value=None``); else return f(D) + Laplace(b/ε_release)
   with the floating-point-safe :class:`~dpkit.mechanisms.laplace.Laplace`.

Budget split: ``epsilon`` is the **total**; ε_test = ε_release = ε/2.

Totality (docs/architecture.md, "Totality"): a run never raises on a data value. The bounded variants read
data with NaN as 0 and clip every value to [lower, upper] (±inf to the bounds); the released
value goes through :class:`~dpkit.mechanisms.laplace.Laplace`, which clamps. For
:class:`ProposeTestRelease` a query value of NaN counts as 0 (±inf are clamped by the Laplace
release) and a distance that is not an integer >= 0 or ∞ is mapped to min(2^62, max(0, ⌊γ⌋))
(NaN → 0), which keeps both properties the proof needs and errs towards refusing. Only types
raise (a query or distance returning something that is not a real number), naming the type alone.

Theorem ((ε, δ)-DP, with ε the total, under the stated neighbour relation). Let x, y be
neighbours and S a set of outputs (γ̂, value). If γ(x) ≥ 1 then LS(x) ≤ b, so |f(x) − f(y)| ≤ b:
the test is ε/2-DP and the release given the test is ε/2-DP, so P[M(x) ∈ S] ≤ e^ε P[M(y) ∈ S].
If γ(x) = 0 the test passes with probability P[Z > T] ≤ P[Z ≥ ⌊T⌋ + 1] = ρ^{⌊T⌋+1}/(1 + ρ) < e^{−ε_test·T}
= δ (ρ = e^{−ε_test}), and ⊥ is ε/2-indistinguishable; so P[M(x) ∈ S] ≤ e^ε P[M(y) ∈ S] + δ.
(Dwork & Roth §7.1, with the test and the release at ε each, state (2ε, δ); here the two
halves add up to the ``epsilon`` passed.) The event is ``ApproxDPEvent(epsilon, delta)``.

The threshold: Dwork & Roth use ln(1/δ)/ε; a threshold of ln(2/δ)/(2ε), as sometimes taught, with
Laplace noise lets γ = 0 pass with probability ½·√(δ/2) ≫ δ — dpkit uses ln(1/δ)/ε_test. The
slack factor 1/(1 + ρ) ≥ ½ in the bound above absorbs the rounding of T to a float.

>>> import numpy as np
>>> ptr = PTRMedian(epsilon=1.0, delta=1e-6, bound=1.0, lower=0.0, upper=100.0)
>>> data = np.linspace(40.0, 60.0, 2001)       # concentrated: gaps of 0.01 around the median
>>> ptr.release(data, rng=np.random.default_rng(1)).released
True
>>> ptr.release(np.array([0.0, 10.0, 50.0, 90.0, 100.0]), rng=np.random.default_rng(1)).value is None
True
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from numbers import Integral, Real
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from dpkit import _validate as v
from dpkit._validate import Neighbours, decimal_fraction
from dpkit.accounting.events import ApproxDPEvent
from dpkit.accounting.rounding import decimal_down, to_decimal_down
from dpkit.errors import InvalidDataError, InvalidParameterError
from dpkit.mechanisms import local_sensitivity as ls
from dpkit.mechanisms.laplace import Geometric, Laplace
from dpkit.noise.source import RNG, resolve_rng

__all__ = ["PTRResult", "ProposeTestRelease", "PTRMedian", "PTRMean"]

_MAX_DISTANCE = 2**62  # a finite distance is capped here (far above any threshold ln(1/δ)/ε)


@dataclass(frozen=True)
class PTRResult:
    """The outcome of one propose-test-release run (the same fields whether or not it released).

    Attributes:
        value: f(D) + Laplace(b/ε_release), or ``None`` (⊥) when the test refused.
        noisy_distance: γ̂ = γ + discrete Laplace(1/ε_test) (``math.inf`` when γ = ∞); it is part
            of the private output and may be shown.
        threshold: T = ln(1/δ)/ε_test; the mechanism released iff ``noisy_distance > threshold``.
        bound: the proposed local-sensitivity bound b.
        scale: the nominal Laplace scale b/ε_release of the released value's noise.
    """

    value: float | None
    noisy_distance: float
    threshold: float
    bound: float
    scale: float

    @property
    def released(self) -> bool:
        return self.value is not None


@dataclass(frozen=True, kw_only=True)
class _PTRCore:
    epsilon: float
    delta: float
    bound: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "epsilon", v.epsilon(self.epsilon))
        object.__setattr__(self, "delta", v.delta(self.delta, allow_zero=False))
        object.__setattr__(self, "bound", v.positive(self.bound, "bound"))
        self.release_mechanism  # noqa: B018 — checks the noise scale range now, not at release
        self.test_mechanism  # noqa: B018

    # -- what subclasses provide ---------------------------------------------------------------
    @property
    def neighbours(self) -> Neighbours:  # overridden by a field or property
        raise NotImplementedError

    def _evaluate(self, data: Any) -> tuple[float, float]:
        """(f(D), γ(D)) — deterministic, computed before any noise is drawn."""
        raise NotImplementedError

    # -- shared --------------------------------------------------------------------------------
    @property
    def epsilon_test(self) -> float:
        # Half of ε at its decimal value, as a double whose own decimal value is no more: the
        # two halves never cost more than the ε the event charges.
        return to_decimal_down(decimal_fraction(self.epsilon) / 2)

    @property
    def epsilon_release(self) -> float:
        return self.epsilon_test

    @property
    def threshold(self) -> float:
        """T = ln(1/δ)/ε_test (Dwork & Roth 2014 §7.1), with ε_test at most the test's ε."""
        return math.log(1.0 / self.delta) / decimal_down(self.epsilon_test)

    @property
    def test_mechanism(self) -> Geometric:
        return Geometric(epsilon=self.epsilon_test, sensitivity=1, neighbours=self.neighbours)

    @property
    def release_mechanism(self) -> Laplace:
        # The query value is computed in floating point; its rounding error (a margin the
        # subclass states, 0 for an exact order statistic) is added to the bound.
        return Laplace(
            epsilon=self.epsilon_release, sensitivity=self.bound + self._rounding_margin(), neighbours=self.neighbours
        )

    def _rounding_margin(self) -> float:
        return 0.0

    def error_bound(self, beta: float = 0.05) -> float:
        """a with P(|released − f(D)| > a) <= ``beta`` when a value is released (the Laplace
        noise b/ε_release on the lattice; a refusal has no error to bound)."""
        return self.release_mechanism.error_bound(beta)

    @property
    def event(self) -> ApproxDPEvent:
        """(ε, δ)-DP in total: ε/2 for the test, ε/2 for the release, δ for a passed test at γ = 0."""
        return ApproxDPEvent(self.epsilon, self.delta, self.neighbours)

    def release(self, data: Any, *, rng: RNG = None) -> PTRResult:
        """Run propose-test-release once on ``data``; ``value`` is ``None`` (⊥) if the test refuses."""
        values, noisy = self._release_batch(data, 1, rng)
        value = None if math.isnan(values[0]) else float(values[0])
        return PTRResult(value, float(noisy[0]), self.threshold, self.bound, self.release_mechanism.scale)

    def _release_batch(self, data: Any, size: int, rng: RNG) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """``size`` independent runs on the same data: (values with NaN for ⊥, noisy distances).

        :meth:`release` is this with ``size = 1``; the audit tests call it to vectorise.
        """
        value, gamma = self._evaluate(data)
        src = resolve_rng(rng)
        if math.isinf(gamma):
            noisy = np.full(size, math.inf)
        else:
            noisy = self.test_mechanism.release(np.full(size, int(gamma), dtype=np.int64), rng=src).astype(np.float64)
        passed = noisy > self.threshold
        out = np.full(size, np.nan)
        k = int(np.count_nonzero(passed))
        if k:
            out[passed] = self.release_mechanism.release(np.full(k, value), rng=src)
        return out, noisy


def _check_distance(gamma: object) -> float:
    """γ as an integer >= 0 or ∞, total on real values (the distance is computed from the data).

    +inf stays ∞; any other real becomes min(2^62, max(0, ⌊γ⌋)) with NaN → 0. These maps are
    monotone, move values at most 1 apart to values at most 1 apart, never raise γ and keep γ >= 1
    where it was, so a distance with the two properties PTR needs keeps them; a broken one is made
    conservative (γ = 0 refuses except with probability below δ). The cap keeps γ + noise inside
    int64. Only a non-real type raises, naming the type alone.
    """
    if isinstance(gamma, (Integral, Real, np.integer, np.floating)) and not isinstance(gamma, (bool, np.bool_)):
        if isinstance(gamma, (Integral, np.integer)):
            return min(_MAX_DISTANCE, max(0, int(gamma)))
        f = v.real_float(gamma)  # a huge Fraction gives ±inf, not OverflowError
        if f == math.inf:
            return math.inf
        return 0 if math.isnan(f) or f < 0 else min(_MAX_DISTANCE, math.floor(f))
    raise InvalidParameterError(
        "distance", type(gamma), "a callable returning an integer >= 0 or math.inf (the distance to high sensitivity)"
    )


def _check_value(value: object) -> float:
    """f(D) as a float, total on real values: NaN → 0, ±inf kept (the Laplace release clamps
    them). Only a non-real type raises, naming neither the value nor anything computed from it."""
    if isinstance(value, np.ndarray) and value.shape == () and value.dtype.kind in "iuf":
        value = value.item()
    if isinstance(value, (Real, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_)):
        f = v.real_float(value)  # a huge int gives ±inf, not OverflowError
        return 0.0 if math.isnan(f) else f
    raise InvalidDataError("query", f"returned a {type(value).__name__}", "a callable returning a real number")


@dataclass(frozen=True, kw_only=True)
class ProposeTestRelease(_PTRCore):
    """Propose-test-release for any real-valued query (see the module docstring for the theorem).

    Args:
        epsilon: total ε (ε/2 for the test, ε/2 for the release).
        delta: δ ∈ (0, 1): the probability of releasing when γ = 0.
        bound: the proposed local-sensitivity bound b.
        query: f(data) → a finite real number.
        distance: γ(data, b) → an integer ≥ 0 (or ``math.inf``) with two properties the caller
            must guarantee: it changes by at most 1 between neighbours, and γ ≥ 1 implies
            LS_f(data) ≤ b. The exact distance to {D' : LS(D') > b} has both.
        neighbours: the relation the two properties hold for.

    >>> import numpy as np
    >>> ptr = ProposeTestRelease(epsilon=1.0, delta=1e-6, bound=1.0,
    ...                          query=lambda d: float(len(d)), distance=lambda d, b: math.inf)
    >>> ptr.release([1, 2, 3], rng=np.random.default_rng(0)).released
    True
    """

    query: Callable[[Any], float]
    distance: Callable[[Any, float], float]
    neighbours: Neighbours = "add_remove"

    def __post_init__(self) -> None:
        if not callable(self.query):
            raise InvalidParameterError("query", self.query, "a callable query(data) -> float")
        if not callable(self.distance):
            raise InvalidParameterError("distance", self.distance, "a callable distance(data, bound) -> int")
        v.neighbours(self.neighbours)
        super().__post_init__()

    def _evaluate(self, data: Any) -> tuple[float, float]:
        gamma = _check_distance(self.distance(data, self.bound))
        return _check_value(self.query(data)), gamma


@dataclass(frozen=True, kw_only=True)
class _BoundedPTR(_PTRCore):
    """PTR on values clipped to declared bounds [lower, upper]."""

    lower: float
    upper: float

    def __post_init__(self) -> None:
        lo, hi = v.bounds(self.lower, self.upper)
        object.__setattr__(self, "lower", lo)
        object.__setattr__(self, "upper", hi)
        super().__post_init__()


@dataclass(frozen=True, kw_only=True)
class PTRMedian(_BoundedPTR):
    """The median by propose-test-release, (ε, δ)-DP under **replace** (n is public).

    The median is the lower median x_m, m = ⌈n/2⌉, of the values clipped to [lower, upper];
    γ is the exact distance to high sensitivity from the order statistics
    (:func:`~dpkit.mechanisms.local_sensitivity.median_distance_to_high_sensitivity`, NRS 2007).
    Empty data raise :class:`~dpkit.errors.InvalidDataError` (n is public under replace).

    >>> import numpy as np
    >>> PTRMedian(epsilon=1.0, delta=1e-6, bound=0.5, lower=0.0, upper=10.0).event
    ApproxDPEvent(epsilon=1.0, delta=1e-06, neighbours='replace')
    """

    @property
    def neighbours(self) -> Neighbours:
        return "replace"

    def _evaluate(self, data: Any) -> tuple[float, float]:
        x = ls._clipped_sorted(data, self.lower, self.upper)
        gamma = ls.median_distance_to_high_sensitivity(x, self.bound, lower=self.lower, upper=self.upper)
        return float(x[ls.median_index(x.size) - 1]), gamma


@dataclass(frozen=True, kw_only=True)
class PTRMean(_BoundedPTR):
    """The mean by propose-test-release, (ε, δ)-DP under **add/remove** (Dwork & Lei 2009).

    Values are clipped to [lower, upper]. LS ≤ (u − l)/n, so γ = max(0, n − (⌈(u − l)/b⌉ − 1))
    (:func:`~dpkit.mechanisms.local_sensitivity.mean_distance_to_high_sensitivity`). Empty data
    are accepted (γ = 0, so ⊥ except with probability < δ; the value would be (l + u)/2).
    In practice the noisy-sum / noisy-count mean (:class:`BoundedMean`) is usually better.

    >>> import numpy as np
    >>> r = PTRMean(epsilon=1.0, delta=1e-6, bound=0.01, lower=0.0, upper=100.0).release(
    ...     np.full(50_000, 40.0), rng=np.random.default_rng(0))
    >>> r.released and abs(r.value - 40.0) < 1.0
    True
    """

    @property
    def neighbours(self) -> Neighbours:
        return "add_remove"

    def _rounding_margin(self) -> float:
        # np.mean's pairwise sum errs by at most ~(log2 n + 2)·2^-53·max|x| relative to the exact
        # mean (n < 2^60), on each of two neighbours: 2^-45·max(|l|, |u|) covers both.
        return 2.0**-45 * max(abs(self.lower), abs(self.upper))

    def _evaluate(self, data: ArrayLike) -> tuple[float, float]:
        x = ls._clipped_sorted(data, self.lower, self.upper, allow_empty=True)
        gamma = ls.mean_distance_to_high_sensitivity(x, self.bound, lower=self.lower, upper=self.upper)
        value = float(np.mean(x)) if x.size else (self.lower + self.upper) / 2
        return min(max(value, self.lower), self.upper), gamma
