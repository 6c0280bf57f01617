"""The sparse vector technique: AboveThreshold, Sparse and NumericSparse (their applications are
in :mod:`dpkit.mechanisms.svt_applications`).

SVT answers a long (even unbounded) stream of sensitivity-Δ queries with only "below / above a
threshold" and pays for the queries that come out *above*, never for the ones below
(Dwork, Naor, Reingold, Rothblum & Vadhan 2009; Dwork & Roth 2014, §3.6,
"稀疏向量技术").

Every variant here is one of the proven ones. Lyu, Su & Li (2017, "Understanding the Sparse Vector
Technique for Differential Privacy", PVLDB 10(6)) list published variants that are **not**
private — no threshold noise or no query noise, releasing the noisy query value with the index,
not stopping after c positives, reusing one threshold noise for c positives with too little query
noise. Each ships as a broken twin in ``tests/audit/test_sparse_vector_audits.py`` and is caught
there.

Floating-point safety (Mironov 2012): values and the threshold are snapped to a lattice g = 2^k
(about 2^-20 of the noise scale) and compared with exact discrete Laplace noise on that lattice
(Canonne, Kamath & Steinke 2020). Snapped neighbours differ by at most s = ⌊Δ/g⌋ + 1 lattice
steps per query, and the noise scales are calibrated for that integer sensitivity s; the usual
proof (shift the threshold noise by s and the stopping query's noise by 2s, or s when monotonic)
is exact on the integers. No floating-point noise is ever compared.

Neighbours: the guarantees hold for whatever relation (``add_remove`` or ``replace``) under which
every query moves by at most ``sensitivity``; the field only labels the recorded event.

Totality (docs/architecture.md, "Totality"): no run raises on a query *value*. A NaN answer is treated as 0
(a NaN has no place in a query with a declared sensitivity) and every answer is clamped to
[−M, M] with M = 2^60·g (:meth:`SVTNoisePlan.value_limit`; at least 2^39 times the threshold
noise scale, fixed by the parameters), so ±inf become ±M. Clamping each answer to a fixed
interval is 1-Lipschitz: a query's sensitivity (and monotonicity) is unchanged, and so is every
guarantee. Answers beyond ±M compare as ±M. The threshold is a parameter: one too large for the
lattice is refused when the mechanism is built. What still raises is public: the type and shape
of ``queries`` (an answer that is not a real number is a type error), an empty list of queries.
The data-driven applications below read their data the same way (NaN → 0, ±inf clipped to the
declared range or kept where a count needs no bound).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from dpkit import _validate as v
from dpkit._validate import Neighbours, decimal_fraction
from dpkit.accounting.events import ComposedEvent, LaplaceEvent, PureDPEvent, SelfComposedEvent
from dpkit.accounting.rounding import to_decimal_down
from dpkit.errors import InvalidDataError, InvalidParameterError
from dpkit.mechanisms._svt_core import (
    _BATCH_CELLS,
    OnFail,
    SVTNoisePlan,
    _as_array,
    _batch_matrix,
    _check_bool,
    _check_common,
    _NoiseBuffer,
    _Round,
    _stream,
    _svt_plan,
    _threshold_point,
)
from dpkit.mechanisms.laplace import Laplace
from dpkit.noise.discrete import sample_discrete_laplace
from dpkit.noise.integers import _uniform_below
from dpkit.noise.source import RNG, RandomSource, resolve_rng

__all__ = [
    "AboveThreshold",
    "Sparse",
    "NumericSparse",
    "SVTNoisePlan",
]


# --- AboveThreshold ------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class AboveThreshold:
    """AboveThreshold: the index of the first query whose noisy answer clears a noisy threshold.

    Algorithm (Dwork & Roth 2014, Alg. 1): T̂ = T + Lap(2Δ/ε); for i = 0, 1, …,
    draw ν_i ~ Lap(4Δ/ε) and halt with i at the first q_i(D) + ν_i >= T̂. With
    ``monotonic=True`` (between neighbours all queries move in the same direction, e.g. counts
    under add/remove) ν_i ~ Lap(2Δ/ε) suffices (Lyu, Su & Li 2017, Thm 4 with ε1 = ε2 = ε/2).
    If the queries run out, ``on_fail="none"`` returns None (the ⊥ of Dwork & Roth's Alg. 1) and
    ``"random"`` a uniformly random index among the queries seen (post-processing of ⊥).

    Guarantee: ε-DP w.r.t. ``neighbours`` however many queries are asked, when every query has
    sensitivity at most ``sensitivity`` (Dwork & Roth 2014, Thm 3.23; Lyu et al. 2017, Thm 2).
    Only the index is released — never T̂, ν_i or a noisy value (releasing them is one of the
    broken variants of Lyu et al.). Noise is exact discrete Laplace on a 2^k lattice (module
    docstring), calibrated for the lattice sensitivity ⌊Δ/g⌋ + 1 (see :meth:`noise_plan`).

    Queries may be an array of answers q_i(D) (noise for all of them drawn in vectorised
    blocks), a lazy iterable/generator of answers, or callables evaluated as q_i(data); streams
    are consumed one item at a time and never past the first positive. Total on answer values:
    NaN counts as 0 and answers are clamped to ±M (:meth:`SVTNoisePlan.value_limit`, module
    docstring), which leaves every sensitivity and the guarantee unchanged.

    >>> import numpy as np
    >>> at = AboveThreshold(epsilon=1.0, threshold=50.0)
    >>> at.release([0.0, 3.0, 1.0, 500.0, 2.0], rng=np.random.default_rng(1))
    3
    >>> at.event.epsilon
    1.0
    """

    epsilon: float
    threshold: float
    sensitivity: float = 1.0
    on_fail: OnFail = "none"
    monotonic: bool = False
    neighbours: Neighbours = "add_remove"

    def __post_init__(self) -> None:
        _check_common(self)
        if self.on_fail not in ("none", "random"):
            raise InvalidParameterError("on_fail", self.on_fail, "'none' or 'random'")
        _check_bool(self.monotonic, "monotonic")
        # Both checks look at parameters only, so they belong here, before any data is read.
        _threshold_point(_svt_plan(self.epsilon, self.sensitivity, self.monotonic), self.threshold)

    @property
    def event(self) -> PureDPEvent:
        return PureDPEvent(epsilon=self.epsilon, neighbours=self.neighbours)

    def noise_plan(self) -> SVTNoisePlan:
        """The lattice and the exact noise scales (in lattice units) one run draws."""
        return _svt_plan(self.epsilon, self.sensitivity, self.monotonic)

    @property
    def threshold_scale(self) -> float:
        """Nominal scale of the threshold noise, 2Δ/ε."""
        return 2 * self.sensitivity / self.epsilon

    @property
    def query_scale(self) -> float:
        """Nominal scale of each query's noise, 4Δ/ε (2Δ/ε when monotonic)."""
        return (2 if self.monotonic else 4) * self.sensitivity / self.epsilon

    def release(self, queries: ArrayLike | Iterable[Any], data: Any = None, *, rng: RNG = None) -> int | None:
        """The index of the first (noisily) positive query, or the ``on_fail`` answer."""
        src = resolve_rng(rng)
        rnd = _Round(self.noise_plan(), self.threshold, src)
        arr = _as_array(queries) if data is None else None
        if arr is not None:
            hit = rnd.first_in_array(rnd.plan.snap_values(arr), 0)
            n = arr.size
        else:
            counter = [0]
            found = rnd.first_in_stream(_stream(queries, data), counter, _NoiseBuffer(rnd.q_noise, src))
            n = counter[0]
            if n == 0:
                raise InvalidDataError("queries", "is empty", "at least one query")
            hit = None if found is None else found[0]
        if hit is None and self.on_fail == "random":
            return int(_uniform_below(n, 1, src)[0])
        return hit

    def release_batch(self, queries: ArrayLike, size: int, *, rng: RNG = None) -> NDArray[np.int64]:
        """``size`` independent runs on the same answers, vectorised; -1 marks "no positive".

        For audits and simulations: each entry is distributed exactly as :meth:`release`'s output
        (with ``on_fail="random"`` the -1 entries are replaced by uniform indices).
        """
        arr, size = _batch_matrix(queries, size)
        src = resolve_rng(rng)
        plan = self.noise_plan()
        points = plan.snap_values(arr)
        t_point = _threshold_point(plan, self.threshold)
        out = np.empty(size, dtype=np.int64)
        rows = max(1, _BATCH_CELLS // arr.size)
        for s in range(0, size, rows):
            k = min(rows, size - s)
            t_hat = t_point + sample_discrete_laplace(plan.threshold_noise(), k, src)
            noisy = points + sample_discrete_laplace(plan.query_noise(), k * arr.size, src).reshape(k, arr.size)
            ok = noisy >= t_hat[:, None]
            out[s : s + k] = np.where(ok.any(axis=1), ok.argmax(axis=1), -1)
        if self.on_fail == "random":
            miss = np.flatnonzero(out < 0)
            out[miss] = _uniform_below(arr.size, miss.size, src).astype(np.int64)
        return out


# --- Sparse --------------------------------------------------------------------------------------


def _check_sparse(mech: Any) -> None:
    _check_common(mech)
    object.__setattr__(mech, "max_positives", v.positive_int(mech.max_positives, "max_positives"))


@dataclass(frozen=True, kw_only=True)
class Sparse:
    """Sparse: AboveThreshold restarted after each positive, at most ``max_positives`` = c times.

    Algorithm (Dwork & Roth 2014, Alg. 2 with δ = 0): each round is AboveThreshold
    with ε/c — a *fresh* noisy threshold T + Lap(2cΔ/ε) and query noise Lap(4cΔ/ε) (Lap(2cΔ/ε)
    if monotonic) — started at the query after the last positive. It stops after c positives or
    when the queries run out, and releases the list of positive indices only.

    Guarantee: ε-DP w.r.t. ``neighbours`` for any number of queries of sensitivity <= Δ
    (Dwork & Roth 2014, Thm 3.25: c-fold sequential composition of ε/c-DP AboveThreshold runs;
    Lyu et al. 2017, Thm 2). Streams are consumed lazily and never past the c-th positive.

    >>> import numpy as np
    >>> sp = Sparse(epsilon=3.0, threshold=50.0, max_positives=2)
    >>> sp.release([0, 900, 0, 0, 800, 700], rng=np.random.default_rng(0))
    [1, 4]
    """

    epsilon: float
    threshold: float
    max_positives: int
    sensitivity: float = 1.0
    monotonic: bool = False
    neighbours: Neighbours = "add_remove"

    def __post_init__(self) -> None:
        _check_sparse(self)
        _check_bool(self.monotonic, "monotonic")
        _threshold_point(self.noise_plan(), self.threshold)  # parameters only: refuse now

    @property
    def event(self) -> PureDPEvent:
        return PureDPEvent(epsilon=self.epsilon, neighbours=self.neighbours)

    @property
    def epsilon_per_round(self) -> Fraction:
        """ε/c, exactly (the noise scales are computed from it without rounding)."""
        return decimal_fraction(self.epsilon) / self.max_positives

    def noise_plan(self) -> SVTNoisePlan:
        """One round's lattice and noise: AboveThreshold's plan with ε/c (scales ×c, exactly)."""
        c = self.max_positives
        base = _svt_plan(self.epsilon / c, self.sensitivity, self.monotonic)  # validates the scale
        lattice = base.lattice
        steps = base.steps
        eps = self.epsilon_per_round  # exact ε/c, not the rounded float
        return SVTNoisePlan(
            lattice, steps, Fraction(2 * steps) / eps, Fraction((2 if self.monotonic else 4) * steps) / eps
        )

    def _positives(self, queries: Any, data: Any, src: RandomSource) -> list[tuple[int, float]]:
        rnd = _Round(self.noise_plan(), self.threshold, src)
        found: list[tuple[int, float]] = []
        arr = _as_array(queries) if data is None else None
        if arr is not None:
            points = rnd.plan.snap_values(arr)
            start = 0
            while len(found) < self.max_positives and start < arr.size:
                hit = rnd.first_in_array(points, start)
                if hit is None:
                    break
                found.append((hit, float(arr[hit])))
                start = hit + 1
            return found
        values = _stream(queries, data)
        counter = [0]
        noise = _NoiseBuffer(rnd.q_noise, src)
        while len(found) < self.max_positives:
            positive = rnd.first_in_stream(values, counter, noise)
            if positive is None:
                break
            found.append(positive)
        if counter[0] == 0:
            raise InvalidDataError("queries", "is empty", "at least one query")
        return found

    def release(self, queries: ArrayLike | Iterable[Any], data: Any = None, *, rng: RNG = None) -> list[int]:
        """The indices of the (at most c) queries found above the threshold, in order."""
        return [i for i, _ in self._positives(queries, data, resolve_rng(rng))]

    def release_batch(self, queries: ArrayLike, size: int, *, rng: RNG = None) -> NDArray[np.bool_]:
        """``size`` independent runs, vectorised: a (size, m) boolean matrix of positives."""
        arr, size = _batch_matrix(queries, size)
        src = resolve_rng(rng)
        plan = self.noise_plan()
        points = plan.snap_values(arr)
        t_point = _threshold_point(plan, self.threshold)
        m = arr.size
        out = np.zeros((size, m), dtype=bool)
        cols = np.arange(m)
        rows = max(1, _BATCH_CELLS // m)
        for s in range(0, size, rows):
            k = min(rows, size - s)
            start = np.zeros(k, dtype=np.int64)
            live = np.arange(k)
            for _ in range(self.max_positives):
                if not live.size:
                    break
                t_hat = t_point + sample_discrete_laplace(plan.threshold_noise(), live.size, src)
                noisy = points + sample_discrete_laplace(plan.query_noise(), live.size * m, src).reshape(live.size, m)
                ok = (noisy >= t_hat[:, None]) & (cols >= start[live][:, None])
                has = ok.any(axis=1)
                first = ok.argmax(axis=1)
                out[s + live[has], first[has]] = True
                start[live[has]] = first[has] + 1
                live = live[has & (first + 1 < m)]
        return out


# --- NumericSparse -------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class NumericSparse:
    """NumericSparse: Sparse, plus a Laplace-noised value for each positive query.

    Algorithm (Dwork & Roth 2014, Alg. 3 with δ = 0): ``split = (a, b)`` spends ε_sel = a·ε on
    Sparse (selection; a fresh threshold per positive) and ε_val = b·ε on the values; each of the
    at most c released values is q_i(D) + Lap(cΔ/ε_val), i.e. ε_val/c each. With the default
    (8/9, 1/9) this is DR's Lap(2cΔ/ε2) with ε2 = 2ε/9 (DR count the value noise at ε2/2). The
    value noise is fresh — never the selection noise (reusing it is a broken variant, Lyu et al.
    2017, Alg. 2) — and floating-point safe (:class:`~dpkit.mechanisms.laplace.Laplace`).

    Guarantee: ε-DP w.r.t. ``neighbours`` (Dwork & Roth 2014, Thm 3.28): ε_sel for Sparse by
    Thm 3.25 plus c Laplace releases of ε_val/c by sequential composition. ``.event`` records
    exactly that: ``ComposedEvent((PureDPEvent(ε_sel), SelfComposedEvent(LaplaceEvent(ε_val/c),
    c)))`` — charged for c values even when fewer positives are found (conservative). ε_sel and
    ε_val are rounded down so that ε_sel + ε_val <= ε exactly.

    >>> import numpy as np
    >>> ns = NumericSparse(epsilon=9.0, threshold=50.0, max_positives=1)
    >>> [(i, round(x, -1)) for i, x in ns.release([0, 0, 1000], rng=np.random.default_rng(0))]
    [(2, 1000.0)]
    """

    epsilon: float
    threshold: float
    max_positives: int
    sensitivity: float = 1.0
    split: tuple[float, float] = (8 / 9, 1 / 9)
    monotonic: bool = False
    neighbours: Neighbours = "add_remove"
    _eps_sel: float = field(init=False, repr=False, compare=False)
    _eps_val: float = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        _check_sparse(self)
        _check_bool(self.monotonic, "monotonic")
        split = self.split
        if not isinstance(split, (tuple, list)) or len(split) != 2:
            raise InvalidParameterError(
                "split", split, "a pair (selection share, value share) of numbers in (0, 1) summing to <= 1"
            )
        a = v.probability(split[0], "split[0]")
        b = v.probability(split[1], "split[1]")
        total = Fraction(a) + Fraction(b)
        if total > 1 + Fraction(1, 10**9):
            raise InvalidParameterError("split", split, "shares summing to at most 1")
        norm = max(total, Fraction(1))
        eps = decimal_fraction(self.epsilon)
        # Each part is charged the decimal value of its double (decimal_fraction): to_decimal_down
        # keeps each within its exact share, so the two never cost more than ε.
        e_sel = to_decimal_down(eps * Fraction(a) / norm)
        e_val = to_decimal_down(eps * Fraction(b) / norm)
        while decimal_fraction(e_sel) + decimal_fraction(e_val) > eps:  # pragma: no cover - to_decimal_down ensures it
            e_val = math.nextafter(e_val, 0.0)
        object.__setattr__(self, "split", (a, b))
        object.__setattr__(self, "_eps_sel", e_sel)
        object.__setattr__(self, "_eps_val", e_val)
        self._selector()
        self._valuer()

    @property
    def epsilon_selection(self) -> float:
        return self._eps_sel

    @property
    def epsilon_values(self) -> float:
        return self._eps_val

    def _selector(self) -> Sparse:
        return Sparse(
            epsilon=self._eps_sel,
            threshold=self.threshold,
            max_positives=self.max_positives,
            sensitivity=self.sensitivity,
            monotonic=self.monotonic,
            neighbours=self.neighbours,
        )

    def _valuer(self) -> Laplace:
        per_value = to_decimal_down(decimal_fraction(self._eps_val) / self.max_positives)
        return Laplace(epsilon=per_value, sensitivity=self.sensitivity, neighbours=self.neighbours)

    @property
    def value_scale(self) -> float:
        """Nominal scale of each released value's noise, cΔ/ε_val."""
        return self._valuer().scale

    @property
    def event(self) -> ComposedEvent:
        lap = self._valuer()
        return ComposedEvent(
            (
                PureDPEvent(epsilon=self._eps_sel, neighbours=self.neighbours),
                SelfComposedEvent(LaplaceEvent.for_epsilon(lap.epsilon, self.neighbours), self.max_positives),
            )
        )

    def release(
        self, queries: ArrayLike | Iterable[Any], data: Any = None, *, rng: RNG = None
    ) -> list[tuple[int, float]]:
        """(index, noisy value) for each of the at most c positive queries, in order."""
        src = resolve_rng(rng)
        found = self._selector()._positives(queries, data, src)
        if not found:
            return []
        noisy = self._valuer().release(np.array([x for _, x in found]), rng=src)
        return [(i, float(y)) for (i, _), y in zip(found, np.atleast_1d(noisy), strict=True)]
