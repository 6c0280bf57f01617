"""Floating-point-safe release: values snapped to a 2^k lattice plus exact lattice noise.

Mironov (2012) showed that ``x + laplace(b)`` in floating point leaks ``x`` through which doubles
are reachable. Here every output is g·(round(x/g) + Y) with g = 2^k chosen from the noise scale
alone (never from the data) and Y an exactly sampled integer, so the set of reachable outputs does
not depend on x beyond the lattice point it rounds to, and the distribution on the lattice is
exactly the one the privacy proof is about.

Rounding moves each coordinate by at most g/2, so two neighbouring inputs whose query values
differ by Δ (ℓ1) round to lattice points that differ by at most Δ/g + d lattice steps (d the
number of coordinates), or Δ/g + √d in ℓ2. The mechanisms add that to the sensitivity before
calibrating; choosing g about 2^-40 of the noise scale (less for long vectors) keeps the extra
noise, size·g/Δ relative, negligible: below 2^-39 up to 2^7 coordinates and below
size/(ε·2^47) beyond.

Totality (docs/architecture.md, "Totality"): a release never fails on a value. Before snapping, every
coordinate is clamped to [−M, M] with M = :func:`value_limit` (lattice) = min(2^1000, 2^1000·g),
a function of the lattice — of the noise scale and the size — alone; NaN becomes 0 and ±inf
become ±M. Clamping each coordinate to a fixed interval is 1-Lipschitz, so it never increases
the ℓ1 or ℓ2 distance between neighbouring queries: every guarantee stated for the query holds
unchanged. For the noise scales the mechanisms accept (at most 2^900) M is at least 2^100 noise
scales, and 2^952 or more for scales below 2^40; |x/g| <= 2^1000 and the output stays finite.

Arithmetic: x·2^-k and the rounding are exact in IEEE double; the noise, an int64 below 2^53 in
magnitude, converts exactly; the one rounding in ``round(x/g) + Y`` is the correctly rounded sum
of two exact numbers — a function of the exact lattice point alone — so it is post-processing.
Noise of 2^53 or more (about e^-32 per value at the largest lattice scale) is added in exact
integer arithmetic and rounded once.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np
from numpy.typing import NDArray

from dpkit._validate import clamp
from dpkit.errors import InvalidDataError, InvalidParameterError
from dpkit.noise.bernoulli_exp import CHUNK
from dpkit.noise.discrete import laplace_plan, sample_discrete_gaussian, sample_discrete_laplace
from dpkit.noise.source import RandomSource

__all__ = [
    "Lattice",
    "choose_lattice",
    "value_limit",
    "clamp_to_lattice",
    "snap",
    "add_lattice_noise",
    "lattice_laplace",
    "lattice_gaussian",
    "exact_lattice_sum",
    "DELTA_MARGIN",
]

#: Mechanisms that draw discrete Gaussian noise on a lattice calibrate (and report ε) at
#: δ·DELTA_MARGIN instead of δ. At σ/g of about 2^40 the privacy curve of the discrete Gaussian
#: differs from the continuous one by O(g²/σ²), below 2^-78 (Canonne, Kamath & Steinke 2020,
#: Sec. 4), so keeping δ·2^-20 aside covers that difference for every δ >= 2^-58. The one
#: definition: every lattice Gaussian in dpkit uses it.
DELTA_MARGIN: float = 1.0 - 2.0**-20

#: Rows summed per chunk by :func:`exact_lattice_sum`: 2^20 summands of 32-bit halves stay below
#: 2^52, so each chunk's float64 sum is exact.
_SUM_CHUNK = 1 << 20

_BASE_BITS = 40
_MAX_BITS = 47  # lattice scales below 2^48: inside the samplers' fast ranges
_MIN_EXPONENT = -1000  # keeps g·|y| clear of subnormals
_MAX_EXPONENT = 960
_LIMIT_EXPONENT = 1000  # values are clamped to ±2^1000 and to ±2^1000 lattice steps


@dataclass(frozen=True)
class Lattice:
    """The lattice g·ℤ, g = 2^exponent."""

    exponent: int

    @property
    def granularity(self) -> float:
        return math.ldexp(1.0, self.exponent)


def choose_lattice(scale: float, size: int, *, norm: int = 1) -> Lattice:
    """A lattice about 2^-40 of ``scale`` (finer for long vectors), independent of the data.

    For ``size`` coordinates the rounding adds size·g (ℓ1) or √size·g (ℓ2) to the sensitivity;
    taking g smaller by that factor keeps the added noise below 2^-39 of the noise scale, up to a
    lattice of 2^-47 of the scale (then the extra noise is at most size·2^-47·scale/Δ).
    """
    if not (math.isfinite(scale) and scale > 0):
        raise InvalidParameterError("scale", scale, "a finite number > 0")
    growth = size if norm == 1 else math.sqrt(size)
    bits = min(_BASE_BITS + max(0, math.ceil(math.log2(max(growth, 1.0)))), _MAX_BITS)
    k = math.floor(math.log2(scale)) - bits
    if not _MIN_EXPONENT <= k <= _MAX_EXPONENT:
        raise InvalidParameterError("scale", scale, f"between 2**{_MIN_EXPONENT + _MAX_BITS} and 2**{_MAX_EXPONENT}")
    return Lattice(k)


def value_limit(lattice: Lattice) -> float:
    """M = min(2^1000, 2^1000·g): the clamping bound of a release on ``lattice``.

    A function of the lattice only (never of the data). |x| <= M keeps x/g within 2^1000 (exact
    and finite) and the released g·(x/g + Y) finite for every noise scale accepted.
    """
    return math.ldexp(1.0, min(_LIMIT_EXPONENT, lattice.exponent + _LIMIT_EXPONENT))


def clamp_to_lattice(x: NDArray[np.float64], lattice: Lattice) -> NDArray[np.float64]:
    """x with NaN → 0 and each coordinate clamped to [−M, M], M = :func:`value_limit` (1-Lipschitz)."""
    return clamp(x, value_limit(lattice))


def snap(x: NDArray[np.float64], lattice: Lattice) -> NDArray[np.float64]:
    """round(x / g) as exact integer-valued doubles (ties to even).

    Multiplying by 2^-k is exact for normal results; a result small enough to be subnormal is
    below 1/2 and rounds to 0 either way. ``x`` must be finite with |x| < 2^(1024 + k): releases
    call :func:`clamp_to_lattice` first, so for them this never raises; the check stays as a guard
    for direct callers (its message names no value).
    """
    with np.errstate(over="ignore", invalid="ignore"):
        scaled = x * math.ldexp(1.0, -lattice.exponent)
    if not np.isfinite(scaled).all():
        raise InvalidDataError(
            "value",
            f"holds a NaN, ±inf or a value too large for a noise lattice of granularity 2**{lattice.exponent}",
            f"finite values below 2**{1024 + lattice.exponent} in magnitude (releases clamp to value_limit first)",
        )
    return np.rint(scaled)


def add_lattice_noise(points: NDArray[np.float64], noise: NDArray[np.int64], lattice: Lattice) -> NDArray[np.float64]:
    """g·(points + noise), rounding only the exact sum (see the module docstring)."""
    if noise.size and (noise.max() >= 2**53 or noise.min() <= -(2**53)):
        return _add_exactly(points, noise) * lattice.granularity
    out = points + noise  # both exact doubles: one correctly rounded sum
    out *= lattice.granularity
    return out


def _add_exactly(points: NDArray[np.float64], noise: NDArray[np.int64]) -> NDArray[np.float64]:
    """The sum for noise of 2^53 or more (which a double cannot hold): in int64 where the points
    fit, converted once with round-to-nearest; in Python integers beyond that."""
    out = np.empty(points.shape, dtype=np.float64)
    small = np.abs(points) < 2.0**62
    out[small] = (points[small].astype(np.int64) + noise[small]).astype(np.float64)
    for i in np.flatnonzero(~small):
        out.flat[i] = float(int(points.flat[i]) + int(noise.flat[i]))
    return out


def _release(x: NDArray[np.float64], lattice: Lattice, draw: Callable[[int], NDArray[np.int64]]) -> NDArray[np.float64]:
    flat = x.ravel()
    out = np.empty(flat.size, dtype=np.float64)
    limit = value_limit(lattice)
    for s in range(0, flat.size, CHUNK):  # cache-sized blocks
        # Clamped first (module docstring, "Totality"): snapping can then never fail on a value.
        points = snap(clamp(flat[s : s + CHUNK], limit), lattice)
        out[s : s + CHUNK] = add_lattice_noise(points, draw(points.size), lattice)
    return out.reshape(x.shape)


def lattice_laplace(
    x: NDArray[np.float64], lattice: Lattice, lattice_scale: Fraction, src: RandomSource
) -> NDArray[np.float64]:
    """x clamped (:func:`clamp_to_lattice`) and snapped to the lattice, plus
    g·DiscreteLaplace(lattice_scale), for every coordinate. Total on values."""
    plan = laplace_plan(lattice_scale)
    return _release(x, lattice, lambda n: sample_discrete_laplace(plan, n, src))


def lattice_gaussian(
    x: NDArray[np.float64], lattice: Lattice, lattice_sigma: Fraction, src: RandomSource
) -> NDArray[np.float64]:
    """x clamped (:func:`clamp_to_lattice`) and snapped to the lattice, plus
    g·DiscreteGaussian(lattice_sigma), for every coordinate. Total on values."""
    return _release(x, lattice, lambda n: sample_discrete_gaussian(lattice_sigma, n, src))


def exact_lattice_sum(
    steps: NDArray[np.int64], *, labels: NDArray[np.int64] | None = None, groups: int = 1
) -> NDArray[Any]:
    """Σ of lattice points given as integer steps round(x/g) (from :func:`snap`), exactly, as
    Python integers (a numpy object array).

    A floating-point sum is not sensitivity-bounded: adding one record can move a rounded sum by
    more than the record (Casacuberta et al. 2022, "Widespread underestimation of sensitivity in
    differentially private libraries"). Summing the snapped points exactly keeps the sensitivity
    on the lattice at Δ/g plus the rounding the noise is calibrated for.

    ``steps`` is 1-D (n,) or 2-D (n, d). Without ``labels`` the result has shape () for 1-D
    input or (d,) for 2-D; with ``labels`` (integers in [0, groups)) it holds one sum per group:
    (groups,) or (groups, d). Each step is split into a signed high and an unsigned low 32-bit
    half; the halves are summed over chunks of 2^20 rows (in int64, or in float64 per group:
    partial sums below 2^53 either way, hence exact) and recombined in Python integers.
    """
    steps = np.asarray(steps, dtype=np.int64)
    flat = steps.ndim == 1
    if flat:
        steps = steps[:, None]
    n, d = steps.shape
    grouped = labels is not None
    lab = np.zeros(n, dtype=np.int64) if labels is None else np.asarray(labels, dtype=np.int64)
    k = groups if grouped else 1
    hi_tot = np.zeros((k, d), dtype=np.int64)
    lo_tot = np.zeros((k, d), dtype=np.int64)
    for s in range(0, n, _SUM_CHUNK):
        part, lb = steps[s : s + _SUM_CHUNK], lab[s : s + _SUM_CHUNK]
        hi, lo = part >> 32, part & 0xFFFFFFFF
        if not grouped:  # int64 column sums: below 2^20 · 2^32 per chunk, exact
            hi_tot[0] += hi.sum(axis=0)
            lo_tot[0] += lo.sum(axis=0)
            continue
        for j in range(d):
            hi_tot[:, j] += np.bincount(lb, weights=hi[:, j], minlength=k).astype(np.int64)
            lo_tot[:, j] += np.bincount(lb, weights=lo[:, j], minlength=k).astype(np.int64)
    total = (hi_tot.astype(object) << 32) + lo_tot.astype(object)
    if flat:
        total = total[:, 0]
    return total if grouped else total[0]
