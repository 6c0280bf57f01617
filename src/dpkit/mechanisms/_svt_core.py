"""The machinery the sparse vector technique shares: the lattice plan, one noisy round over an
array or a stream, and the checks of queries and parameters.

See :mod:`dpkit.mechanisms.sparse_vector` for the guarantees (Dwork & Roth 2014, §3.6; Lyu, Su &
Li 2017) and the floating-point safety argument (Mironov 2012; Canonne, Kamath & Steinke 2020)
that this code implements.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

from dpkit import _validate as v
from dpkit._validate import decimal_fraction
from dpkit.errors import InvalidDataError, InvalidParameterError
from dpkit.noise.discrete import LaplacePlan, laplace_plan, sample_discrete_laplace
from dpkit.noise.lattice import Lattice, snap
from dpkit.noise.source import RandomSource

OnFail = Literal["none", "random"]
_FIRST_CHUNK = 64
_MAX_CHUNK = 1 << 16
_MAX_POINT = 2.0**61  # the threshold point must lie below this: far inside int64 with noise
_POINT_BITS = 60  # answers are clamped to ±2^60 lattice steps (so below _MAX_POINT, too)
_BATCH_CELLS = 1 << 22
#: g = 2^-20 of the noise scale: the extra lattice step costs 2^-20 relative noise, and values
#: up to 2^40 noise scales compare exactly in int64.
_LATTICE_BITS = 20  # release_batch: at most this many noise draws per block


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
        raise InvalidParameterError(
            "sensitivity/epsilon", sensitivity / epsilon, "a ratio giving a noise scale in [2**-980, 2**980]"
        )
    lattice = Lattice(k)
    steps = math.floor(sensitivity / lattice.granularity) + 1
    eps = decimal_fraction(epsilon)  # ε at its decimal value: what the event charges
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
        raise InvalidDataError(
            "queries", f"is of type {type(queries).__name__}", "an array of query answers or an iterable of them"
        )

    def gen() -> Iterator[float]:
        for i, q in enumerate(queries):
            if data is not None:
                if not callable(q):
                    raise InvalidDataError(f"queries[{i}]", "is not callable (data was given)", "a callable q(data)")
                q = q(data)
            elif callable(q):
                raise InvalidDataError(
                    f"queries[{i}]", "is a callable but no data was given", "pass data=... or query answers"
                )
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

    def first_in_stream(
        self, values: Iterator[float], counter: list[int], noise: _NoiseBuffer
    ) -> tuple[int, float] | None:
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
