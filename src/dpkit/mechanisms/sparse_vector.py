"""The sparse vector technique: AboveThreshold, Sparse, NumericSparse and their applications.

SVT answers a long (even unbounded) stream of sensitivity-Δ queries with only "below / above a
threshold" and pays for the queries that come out *above*, never for the ones below
(Dwork, Naor, Reingold, Rothblum & Vadhan 2009; Dwork & Roth 2014, §3.6; seed 004 ch. 7,
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

Totality (DESIGN.md, core idea 1): no run raises on a query *value*. A NaN answer is treated as 0
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
import numbers
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

from dpkit import _validate as v
from dpkit._validate import Neighbours
from dpkit.accounting.events import ComposedEvent, LaplaceEvent, PureDPEvent, SelfComposedEvent
from dpkit.accounting.rounding import to_float_down
from dpkit.errors import InvalidDataError, InvalidParameterError
from dpkit.mechanisms.laplace import Laplace
from dpkit.mechanisms.mean import release_exact_sum
from dpkit.noise.discrete import LaplacePlan, laplace_plan, sample_discrete_laplace
from dpkit.noise.integers import _uniform_below
from dpkit.noise.lattice import Lattice, snap
from dpkit.noise.source import RNG, RandomSource, resolve_rng

__all__ = [
    "AboveThreshold",
    "Sparse",
    "NumericSparse",
    "SVTNoisePlan",
    "SVTMeanResult",
    "choose_clipping_bound",
    "clipping_queries",
    "svt_private_mean",
    "range_queries_above_threshold",
    "range_queries_event",
]

OnFail = Literal["none", "random"]
_FIRST_CHUNK = 64
_MAX_CHUNK = 1 << 16
_MAX_POINT = 2.0**61  # the threshold point must lie below this: far inside int64 with noise
_POINT_BITS = 60  # answers are clamped to ±2^60 lattice steps (so below _MAX_POINT, too)
_BATCH_CELLS = 1 << 22
#: g = 2^-20 of the noise scale: the extra lattice step costs 2^-20 relative noise, and values
#: up to 2^40 noise scales compare exactly in int64.
_LATTICE_BITS = 20  # run_batch: at most this many noise draws per block


# --- the lattice plan ----------------------------------------------------------------------------


@dataclass(frozen=True)
class SVTNoisePlan:
    """Exactly the noise one AboveThreshold round draws, on the lattice g·ℤ.

    ``steps`` is the integer sensitivity on the lattice (⌊Δ/g⌋ + 1); the threshold gets discrete
    Laplace noise with scale ``threshold_scale`` (2·steps/ε) and every query ``query_scale``
    (4·steps/ε, or 2·steps/ε when monotonic), both in lattice units and sampled exactly.
    """

    lattice: Lattice
    steps: int
    threshold_scale: Fraction
    query_scale: Fraction

    @property
    def granularity(self) -> float:
        return self.lattice.granularity

    def threshold_noise(self) -> LaplacePlan:
        return laplace_plan(self.threshold_scale)

    def query_noise(self) -> LaplacePlan:
        return laplace_plan(self.query_scale)

    @property
    def value_limit(self) -> float:
        """M = 2^60·g: answers are clamped to [−M, M] (at least 2^40·Δ/ε per round)."""
        return math.ldexp(1.0, self.lattice.exponent + _POINT_BITS)

    def clamp(self, values: NDArray[np.float64]) -> NDArray[np.float64]:
        """NaN → 0 and every answer clamped to [−M, M] (1-Lipschitz; module docstring)."""
        return v.clamp(np.asarray(values, dtype=np.float64), self.value_limit)

    def snap_values(self, values: NDArray[np.float64], name: str = "queries") -> NDArray[np.int64]:
        """round(clamp(x) / g) as int64: exact integers in [−2^60, 2^60], for any input values."""
        return snap(self.clamp(values), self.lattice).astype(np.int64)


def _svt_plan(epsilon: float, sensitivity: float, monotonic: bool) -> SVTNoisePlan:
    """The plan of one AboveThreshold round with privacy parameter ``epsilon`` (exact in ε)."""
    base = 2.0 * sensitivity / epsilon
    if not (math.isfinite(base) and 2.0**-900 <= base <= 2.0**900):
        raise InvalidParameterError("sensitivity/epsilon", sensitivity / epsilon, "a ratio in [2**-901, 2**899]")
    k = math.floor(math.log2(base)) - _LATTICE_BITS  # g about 2^-20 of the scale
    if not -1000 <= k <= 960:
        raise InvalidParameterError("sensitivity/epsilon", sensitivity / epsilon, "a ratio giving a noise scale in [2**-980, 2**980]")
    lattice = Lattice(k)
    steps = math.floor(sensitivity / lattice.granularity) + 1
    eps = Fraction(epsilon)
    return SVTNoisePlan(lattice, steps, Fraction(2 * steps) / eps, Fraction((2 if monotonic else 4) * steps) / eps)


def _threshold_point(plan: SVTNoisePlan, threshold: float) -> int:
    """The snapped threshold; a parameter, checked when a mechanism is built (never on data)."""
    with np.errstate(over="ignore"):
        scaled = threshold * math.ldexp(1.0, -plan.lattice.exponent)
    if not abs(scaled) < _MAX_POINT:
        raise InvalidParameterError(
            "threshold",
            threshold,
            f"a value below 2**{61 + plan.lattice.exponent} in magnitude (2**61 steps of the noise lattice; "
            "that is at least 2**41 × Δ/ε per round)",
        )
    return int(np.rint(scaled))


# --- query input: arrays (vectorised) or lazy streams ---------------------------------------------


def _real_value(x: object) -> float:
    """A streamed answer as a float (NaN → 0; ±inf kept for the clamp). A value that is not a
    real number is a type error; the message names neither the value nor its position."""
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, (numbers.Real, np.floating, np.integer)):
        raise InvalidDataError("queries", "holds an answer that is not a real number", "real numbers (int or float)")
    f = v.real_float(x)  # a huge int gives ±inf, not OverflowError
    return 0.0 if math.isnan(f) else f


def _as_array(queries: object) -> NDArray[np.float64] | None:
    """The query answers as a 1-D float array, or None when they must be streamed."""
    if isinstance(queries, (np.ndarray, list, tuple)):
        if isinstance(queries, (list, tuple)) and any(callable(q) for q in queries):
            return None
        arr = v.data_array(queries, "queries")  # NaN → 0; the plan clamps the rest
        if arr.ndim != 1:
            raise InvalidDataError("queries", f"has shape {arr.shape}", "a 1-D array with one answer per query")
        return arr
    return None


def _stream(queries: object, data: Any) -> Iterator[float]:
    """Lazily validated values: q_i itself, or q_i(data) when ``data`` is given."""
    if isinstance(queries, (str, bytes)) or not isinstance(queries, Iterable):
        raise InvalidDataError("queries", f"is of type {type(queries).__name__}", "an array of query answers or an iterable of them")

    def gen() -> Iterator[float]:
        for i, q in enumerate(queries):  # type: ignore[arg-type]
            if data is not None:
                if not callable(q):
                    raise InvalidDataError(f"queries[{i}]", "is not callable (data was given)", "a callable q(data)")
                q = q(data)
            elif callable(q):
                raise InvalidDataError(f"queries[{i}]", "is a callable but no data was given", "pass data=... or query answers")
            yield _real_value(q)

    return gen()


class _NoiseBuffer:
    """Per-query noise drawn in growing chunks (a stream's length is not known in advance)."""

    def __init__(self, plan: LaplacePlan, src: RandomSource) -> None:
        self.plan, self.src = plan, src
        self.buf: list[int] = []
        self.pos = 0
        self.size = _FIRST_CHUNK

    def next(self) -> int:
        if self.pos == len(self.buf):
            self.buf = sample_discrete_laplace(self.plan, self.size, self.src).tolist()
            self.pos = 0
            self.size = min(2 * self.size, _MAX_CHUNK)
        y = self.buf[self.pos]
        self.pos += 1
        return y


class _Round:
    """Shared machinery: one noisy threshold, then the first noisy query at or above it."""

    def __init__(self, plan: SVTNoisePlan, threshold: float, src: RandomSource) -> None:
        self.plan, self.src = plan, src
        self.t_point = _threshold_point(plan, threshold)  # checked at construction already
        self.limit = plan.value_limit
        self.t_noise = plan.threshold_noise()
        self.q_noise = plan.query_noise()

    def noisy_threshold(self) -> int:
        return self.t_point + int(sample_discrete_laplace(self.t_noise, 1, self.src)[0])

    def first_in_array(self, points: NDArray[np.int64], start: int) -> int | None:
        """First index >= start with point + noise >= a fresh noisy threshold (vectorised)."""
        t_hat = self.noisy_threshold()
        chunk = _FIRST_CHUNK
        while start < points.size:
            block = points[start : start + chunk]
            hits = np.flatnonzero(block + sample_discrete_laplace(self.q_noise, block.size, self.src) >= t_hat)
            if hits.size:
                return start + int(hits[0])
            start += block.size
            chunk = min(2 * chunk, _MAX_CHUNK)
        return None

    def first_in_stream(self, values: Iterator[float], counter: list[int], noise: _NoiseBuffer) -> tuple[int, float] | None:
        """Pull values one at a time; stop right after the first positive (index, value)."""
        t_hat = self.noisy_threshold()
        g_inv = math.ldexp(1.0, -self.plan.lattice.exponent)
        for x in values:
            i = counter[0]
            counter[0] += 1
            clamped = min(max(x, -self.limit), self.limit)  # as SVTNoisePlan.clamp (x is not NaN)
            scaled = clamped * g_inv  # exact: a power-of-two scaling, |scaled| <= 2^60
            if round(scaled) + noise.next() >= t_hat:  # round(): ties to even, as snap()
                return i, x
        return None


def _check_common(mech: Any) -> None:
    object.__setattr__(mech, "epsilon", v.epsilon(mech.epsilon))
    object.__setattr__(mech, "sensitivity", v.positive(mech.sensitivity, "sensitivity"))
    t = mech.threshold
    if isinstance(t, bool) or not isinstance(t, (numbers.Real, np.floating, np.integer)) or not math.isfinite(float(t)):
        raise InvalidParameterError("threshold", t, "a finite number")
    object.__setattr__(mech, "threshold", float(t))
    v.neighbours(mech.neighbours)


def _check_bool(value: object, name: str) -> None:
    if not isinstance(value, bool):
        raise InvalidParameterError(name, value, "True or False")


def _batch_matrix(values: ArrayLike, size: object) -> tuple[NDArray[np.float64], int]:
    arr = _as_array(values)
    if arr is None:
        raise InvalidDataError("queries", "is not an array of numbers", "a 1-D array of query answers")
    return arr, v.positive_int(size, "size")


# --- AboveThreshold ------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class AboveThreshold:
    """AboveThreshold: the index of the first query whose noisy answer clears a noisy threshold.

    Algorithm (Dwork & Roth 2014, Alg. 1; seed 004 §7.1): T̂ = T + Lap(2Δ/ε); for i = 0, 1, …,
    draw ν_i ~ Lap(4Δ/ε) and halt with i at the first q_i(D) + ν_i >= T̂. With
    ``monotonic=True`` (between neighbours all queries move in the same direction, e.g. counts
    under add/remove) ν_i ~ Lap(2Δ/ε) suffices (Lyu, Su & Li 2017, Thm 4 with ε1 = ε2 = ε/2).
    If the queries run out, ``on_fail="none"`` returns None (the "fail signal" of the notes) and
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
    >>> at.run([0.0, 3.0, 1.0, 500.0, 2.0], rng=np.random.default_rng(1))
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

    def run(self, queries: ArrayLike | Iterable[Any], data: Any = None, *, rng: RNG = None) -> int | None:
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

    def run_batch(self, queries: ArrayLike, size: int, *, rng: RNG = None) -> NDArray[np.int64]:
        """``size`` independent runs on the same answers, vectorised; -1 marks "no positive".

        For audits and simulations: each entry is distributed exactly as :meth:`run`'s output
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

    Algorithm (Dwork & Roth 2014, Alg. 2 with δ = 0; seed 004 §7.3): each round is AboveThreshold
    with ε/c — a *fresh* noisy threshold T + Lap(2cΔ/ε) and query noise Lap(4cΔ/ε) (Lap(2cΔ/ε)
    if monotonic) — started at the query after the last positive. It stops after c positives or
    when the queries run out, and releases the list of positive indices only.

    Guarantee: ε-DP w.r.t. ``neighbours`` for any number of queries of sensitivity <= Δ
    (Dwork & Roth 2014, Thm 3.25: c-fold sequential composition of ε/c-DP AboveThreshold runs;
    Lyu et al. 2017, Thm 2). Streams are consumed lazily and never past the c-th positive.

    >>> import numpy as np
    >>> sp = Sparse(epsilon=3.0, threshold=50.0, max_positives=2)
    >>> sp.run([0, 900, 0, 0, 800, 700], rng=np.random.default_rng(0))
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
        return Fraction(self.epsilon) / self.max_positives

    def noise_plan(self) -> SVTNoisePlan:
        """One round's lattice and noise: AboveThreshold's plan with ε/c (scales ×c, exactly)."""
        c = self.max_positives
        base = _svt_plan(self.epsilon / c, self.sensitivity, self.monotonic)  # validates the scale
        lattice = base.lattice
        steps = base.steps
        eps = self.epsilon_per_round  # exact ε/c, not the rounded float
        return SVTNoisePlan(lattice, steps, Fraction(2 * steps) / eps, Fraction((2 if self.monotonic else 4) * steps) / eps)

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
            hit = rnd.first_in_stream(values, counter, noise)
            if hit is None:
                break
            found.append(hit)
        if counter[0] == 0:
            raise InvalidDataError("queries", "is empty", "at least one query")
        return found

    def run(self, queries: ArrayLike | Iterable[Any], data: Any = None, *, rng: RNG = None) -> list[int]:
        """The indices of the (at most c) queries found above the threshold, in order."""
        return [i for i, _ in self._positives(queries, data, resolve_rng(rng))]

    def run_batch(self, queries: ArrayLike, size: int, *, rng: RNG = None) -> NDArray[np.bool_]:
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
    >>> [(i, round(x, -1)) for i, x in ns.run([0, 0, 1000], rng=np.random.default_rng(0))]
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
            raise InvalidParameterError("split", split, "a pair (selection share, value share) of numbers in (0, 1) summing to <= 1")
        a = v.probability(split[0], "split[0]")
        b = v.probability(split[1], "split[1]")
        total = Fraction(a) + Fraction(b)
        if total > 1 + Fraction(1, 10**9):
            raise InvalidParameterError("split", split, "shares summing to at most 1")
        norm = max(total, Fraction(1))
        eps = Fraction(self.epsilon)
        e_sel = to_float_down(eps * Fraction(a) / norm)
        e_val = to_float_down(eps * Fraction(b) / norm)
        while Fraction(e_sel) + Fraction(e_val) > eps:
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
        per_value = to_float_down(Fraction(self._eps_val) / self.max_positives)
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

    def run(self, queries: ArrayLike | Iterable[Any], data: Any = None, *, rng: RNG = None) -> list[tuple[int, float]]:
        """(index, noisy value) for each of the at most c positive queries, in order."""
        src = resolve_rng(rng)
        found = self._selector()._positives(queries, data, src)
        if not found:
            return []
        noisy = self._valuer().release(np.array([x for _, x in found]), rng=src)
        return [(i, float(y)) for (i, _), y in zip(found, np.atleast_1d(noisy))]


# --- applications (seed 004 §7.2 and §7.4) --------------------------------------------------------


def _data_values(values: ArrayLike, name: str = "values") -> NDArray[np.float64]:
    """Private data as a 1-D float array: NaN → 0, ±inf kept (each use clips or counts them)."""
    x = v.data_array(values, name)
    if x.ndim != 1:
        raise InvalidDataError(name, f"has shape {x.shape}", "a 1-D array")
    return x


def _candidates(max_bound: object, step: object) -> NDArray[np.float64]:
    hi = v.positive_int(max_bound, "max_bound")
    st = v.positive_int(step, "step")
    if hi > 10**8:
        raise InvalidParameterError("max_bound", max_bound, "an integer in [1, 10**8]")
    return np.arange(1, hi + 1, st, dtype=np.float64)


def clipping_queries(values: ArrayLike, bounds: ArrayLike) -> NDArray[np.float64]:
    """q_b(D) = Σ clip(x, 0, b) − Σ clip(x, 0, b + 1) for every b, vectorised (seed 004 §7.2).

    Each q_b equals −Σ_x clip(x − b, 0, 1), so adding, removing or changing one record moves it by
    at most 1: sensitivity 1 under both neighbour relations. It rises to 0 as b passes the data.

    >>> clipping_queries([0.5, 2.0, 7.0], [1, 2, 8]).tolist()
    [-2.0, -1.0, -0.0]
    """
    x = np.sort(np.clip(_data_values(values), 0.0, None))
    b = np.asarray(bounds, dtype=np.float64)
    lo = np.searchsorted(x, b, side="right")
    hi = np.searchsorted(x, b + 1, side="right")
    # Σ (x − b) over b < x <= b + 1, summed slice by slice (terms in (0, 1], so the float error
    # is below m·2^-53 for m terms — no prefix sums, whose error grows with the data's total).
    partial = np.array([float(np.sum(x[i:j] - bb)) for i, j, bb in zip(lo, hi, b)])
    return -((x.size - hi) + partial)


def choose_clipping_bound(
    values: ArrayLike,
    *,
    epsilon: float,
    max_bound: int,
    step: int = 1,
    threshold: float = 0.0,
    rng: RNG = None,
) -> int:
    """A clipping bound b for sums of non-negative values, chosen with AboveThreshold (ε-DP).

    Seed 004 §7.2 ("应用稀疏向量技术"): candidates b = 1, 1 + step, …, <= ``max_bound``; query
    q_b(D) = Σ clip(x, 0, b) − Σ clip(x, 0, b + 1) has sensitivity 1 (:func:`clipping_queries`)
    and rises to 0 once raising the bound no longer changes the sum; AboveThreshold with the
    notes' threshold 0 returns the first b whose noisy q_b clears the noisy threshold. The cost
    is ε however many candidates there are (Dwork & Roth 2014, Thm 3.23). If no candidate is
    found positive, the largest candidate is returned (post-processing of ⊥). Neighbours:
    add/remove or replace (both give sensitivity 1). Values below 0 count as 0, NaN counts as 0
    and +inf as a value above every candidate (total: nothing raises on a value).

    >>> import numpy as np
    >>> ages = np.random.default_rng(0).integers(18, 90, size=20_000)
    >>> b = choose_clipping_bound(ages, epsilon=1.0, max_bound=200, rng=np.random.default_rng(1))
    >>> 80 <= b <= 110
    True
    """
    bs = _candidates(max_bound, step)
    # Sensitivity 1, plus 2^-20 for the float error of the slice sums (below n·2^-53 <= 2^-20
    # for up to 2^33 records).
    at = AboveThreshold(epsilon=epsilon, threshold=threshold, sensitivity=1.0 + 2.0**-20)
    q = clipping_queries(values, bs)
    idx = at.run(q, rng=rng)
    return int(bs[-1] if idx is None else bs[idx])


@dataclass(frozen=True)
class SVTMeanResult:
    """A private mean from :func:`svt_private_mean` and the three releases it came from."""

    mean: float
    bound: int
    noisy_sum: float
    noisy_count: float
    event: ComposedEvent


def svt_private_mean(values: ArrayLike, *, epsilon: float, max_bound: int, step: int = 1, rng: RNG = None) -> SVTMeanResult:
    """ε-DP mean of non-negative values with an automatically chosen clipping bound.

    Seed 004 §7.2 (``auto_avg``): ε/3 chooses the bound b with :func:`choose_clipping_bound`,
    ε/3 releases Σ clip(x, 0, b) with Laplace noise (sensitivity b), ε/3 the count (sensitivity
    1); mean = noisy sum / noisy count (post-processing, the count floored at 1 and the mean
    clamped to [0, b]). Sequential composition gives ε (Dwork & Roth 2014, Thm 3.16). Neighbours:
    add/remove. The event is ``ComposedEvent((PureDPEvent(ε/3), LaplaceEvent(ε/3),
    LaplaceEvent(ε/3)))``, each third rounded down. NaN counts as 0 and ±inf are clipped to
    [0, b] like every value (total: nothing raises on a value).

    >>> import numpy as np
    >>> ages = np.random.default_rng(0).integers(18, 90, size=20_000)
    >>> r = svt_private_mean(ages, epsilon=1.0, max_bound=200, rng=np.random.default_rng(2))
    >>> bool(abs(r.mean - ages.mean()) < 1.0)
    True
    """
    eps = v.epsilon(epsilon)
    third = to_float_down(Fraction(eps) / 3)
    # Parameters first: a refusal never reads the data. The sum's sensitivity is the bound chosen
    # privately, somewhere in [1, max_bound]; the scale check is monotone in it, so checking both
    # ends now means no choice can make the Laplace construction fail later.
    _candidates(max_bound, step)
    for sens in (1.0, float(v.positive_int(max_bound, "max_bound"))):
        Laplace(epsilon=third, sensitivity=sens)
    x = _data_values(values)
    src = resolve_rng(rng)
    bound = choose_clipping_bound(x, epsilon=third, max_bound=max_bound, step=step, rng=src)
    sum_mech = Laplace(epsilon=third, sensitivity=float(bound))
    count_mech = Laplace(epsilon=third, sensitivity=1.0)
    noisy_sum = release_exact_sum(sum_mech, np.clip(x, 0.0, bound), src)  # exact, not a float sum
    noisy_count = float(count_mech.release(float(x.size), rng=src))
    mean = float(np.clip(noisy_sum / max(noisy_count, 1.0), 0.0, bound))
    event = ComposedEvent((PureDPEvent(epsilon=third), sum_mech.event, count_mech.event))
    return SVTMeanResult(mean, bound, noisy_sum, noisy_count, event)


def _check_ranges(ranges: Sequence[tuple[float, float]]) -> NDArray[np.float64]:
    try:
        r = np.asarray(ranges, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise InvalidDataError("ranges", f"cannot be read as (lower, upper) pairs ({exc})", "a list of (lower, upper) pairs") from exc
    if r.ndim != 2 or r.shape[1] != 2 or r.shape[0] == 0:
        raise InvalidDataError("ranges", f"has shape {r.shape}", "a non-empty list of (lower, upper) pairs")
    if not np.isfinite(r).all() or np.any(r[:, 0] > r[:, 1]):
        raise InvalidDataError("ranges", "holds a non-finite or reversed pair", "finite pairs with lower <= upper")
    return r


def range_queries_above_threshold(
    data: ArrayLike,
    ranges: Sequence[tuple[float, float]],
    *,
    epsilon: float,
    threshold: float,
    max_answers: int,
    rng: RNG = None,
) -> list[tuple[tuple[float, float], float]]:
    """Answer only the range counts that are large, paying for at most ``max_answers`` of them.

    Seed 004 §7.4 ("应用: 范围问询"): the count of rows with lower < x < upper (sensitivity 1,
    add/remove) for each range; ε/2 runs :class:`Sparse` with c = ``max_answers`` to find the
    ranges whose count is above ``threshold``, and ε/(2c) releases each selected count with
    Laplace noise — ε in total by sequential composition (Dwork & Roth 2014, Thm 3.16 and 3.25),
    however many ranges are asked. Returns ((lower, upper), noisy count) for each selected range.
    The event is ``ComposedEvent((PureDPEvent(ε/2), SelfComposedEvent(LaplaceEvent(ε/(2c)), c)))``
    (see :func:`range_queries_event`). A NaN data value counts as 0 and ±inf fall in no range
    (total: nothing raises on a data value; bad ``ranges`` are refused before anything runs).

    >>> import numpy as np
    >>> ages = np.random.default_rng(0).integers(18, 90, size=10_000)
    >>> out = range_queries_above_threshold(ages, [(20, 22), (30, 60), (85, 86), (18, 90)],
    ...     epsilon=1.0, threshold=1000, max_answers=2, rng=np.random.default_rng(3))
    >>> [r for r, _ in out]
    [(30.0, 60.0), (18.0, 90.0)]
    """
    # Every parameter is checked (and both mechanisms built) before the data is read.
    r = _check_ranges(ranges)
    eps = v.epsilon(epsilon)
    c = v.positive_int(max_answers, "max_answers")
    half = to_float_down(Fraction(eps) / 2)
    sparse = Sparse(epsilon=half, threshold=threshold, max_positives=c)
    lap = Laplace(epsilon=to_float_down(Fraction(half) / c), sensitivity=1.0)
    src = resolve_rng(rng)
    x = np.sort(_data_values(data, "data"))
    counts = (np.searchsorted(x, r[:, 1], side="left") - np.searchsorted(x, r[:, 0], side="right")).clip(0).astype(np.float64)
    chosen = sparse.run(counts, rng=src)
    if not chosen:
        return []
    noisy = np.atleast_1d(lap.release(counts[chosen], rng=src))
    return [((float(r[i, 0]), float(r[i, 1])), float(y)) for i, y in zip(chosen, noisy)]


def range_queries_event(epsilon: float, max_answers: int) -> ComposedEvent:
    """The event :func:`range_queries_above_threshold` spends (add/remove neighbours)."""
    eps = v.epsilon(epsilon)
    c = v.positive_int(max_answers, "max_answers")
    half = to_float_down(Fraction(eps) / 2)
    per = to_float_down(Fraction(half) / c)
    return ComposedEvent((PureDPEvent(epsilon=half), SelfComposedEvent(LaplaceEvent.for_epsilon(per), c)))
