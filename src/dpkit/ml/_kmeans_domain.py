"""The declared data domain of :class:`dpkit.ml.KMeans`: a box of per-feature bounds or a ball
of radius ``data_norm``, the map of rows into the unit ball (where the sensitivities hold), and
uniform random points of the domain (public randomness for the initial centres).

The domain is declared, never read from the data: bounds computed from the private data would
leak it (Su et al. 2016, "Differentially private k-means clustering", Sec. 3).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
from numpy.typing import NDArray
from scipy.special import ndtri

from dpkit import _validate as v
from dpkit.errors import InvalidParameterError
from dpkit.noise.source import RandomSource

# Randomness that is not privacy noise (random centres): uniform doubles from the same source
# ---------------------------------------------------------------------------------------------

#: Rows are scaled by (1 − 2^-20)/r after clipping, so that their norm is strictly below 1 in
#: exact arithmetic whatever the rounding of the clipping and centring (the sensitivity proofs
#: need ‖y‖ <= 1 exactly); the factor is undone on the centres, so it costs nothing but 1e-6
#: of the noise-to-signal ratio.
_SHRINK = 1.0 - 2.0**-20


def _uniform(src: RandomSource, shape: tuple[int, ...]) -> NDArray[np.float64]:
    """Uniform doubles in (0, 1) from the top 53 bits of the source's words."""
    n = int(np.prod(shape)) if shape else 1
    words = src.words(n) if n else np.zeros(0, dtype=np.uint64)
    return (((words >> np.uint64(11)).astype(np.float64) + 0.5) * 2.0**-53).reshape(shape)


# ---------------------------------------------------------------------------------------------
# The declared data domain
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Domain:
    """Where the rows live, declared by the user, and the map to normalised coordinates.

    ``kind``: ``"box"`` (bounds), ``"l1"`` or ``"l2"`` (a ball of radius ``data_norm`` around 0).
    Rows are first moved into the domain (clipped to the box, or scaled onto the ball's sphere
    when outside it), then mapped to y = (x − offset)·factor with factor = (1 − 2^-20)/radius,
    where radius is the domain's ℓ1 radius (textbook) or ℓ2 radius (gaussian) about ``offset``.
    Normalised rows therefore have norm < 1: the textbook's unit ℓ1 ball, or the unit ℓ2 ball.
    """

    kind: str
    offset: NDArray[np.float64]  # box midpoint or 0
    lower: NDArray[np.float64] | None  # box only
    upper: NDArray[np.float64] | None
    radius: float  # in data units, in the norm the method needs
    norm: int  # 1 (textbook) or 2 (gaussian)

    @property
    def factor(self) -> float:
        return _SHRINK / self.radius

    @property
    def dim(self) -> int:
        return int(self.offset.shape[0])

    def into_domain(self, X: NDArray[np.float64]) -> NDArray[np.float64]:
        """Rows moved into the declared domain, in data units."""
        if self.kind == "box":
            return np.clip(X, self.lower, self.upper)
        norms = np.abs(X).sum(axis=1) if self.kind == "l1" else np.sqrt(np.einsum("ij,ij->i", X, X))
        scale = np.where(norms > self.radius, self.radius / np.maximum(norms, 1e-300), 1.0)
        return X * scale[:, None]

    def normalise(self, X: NDArray[np.float64]) -> NDArray[np.float64]:
        return (self.into_domain(X) - self.offset) * self.factor

    def denormalise(self, C: NDArray[np.float64]) -> NDArray[np.float64]:
        return C / self.factor + self.offset

    def _box_half(self) -> NDArray[np.float64]:
        assert self.lower is not None and self.upper is not None
        return (self.upper - self.lower) / 2.0 * self.factor

    def project(self, C: NDArray[np.float64]) -> NDArray[np.float64]:
        """The nearest points of the (normalised) domain: a convex set holding every row, so
        projecting a centre onto it never moves the centre away from any row."""
        if self.kind == "box":
            h = self._box_half()
            return np.clip(C, -h, h)
        r = _SHRINK
        norms = np.abs(C).sum(axis=1) if self.kind == "l1" else np.sqrt(np.einsum("ij,ij->i", C, C))
        scale = np.where(norms > r, r / np.maximum(norms, 1e-300), 1.0)
        return C * scale[:, None]

    def uniform(self, n: int, src: RandomSource) -> NDArray[np.float64]:
        """n points uniform in the (normalised) domain."""
        d = self.dim
        if self.kind == "box":
            return (2.0 * _uniform(src, (n, d)) - 1.0) * self._box_half()
        if self.kind == "l1":
            # (E_1..E_d)/(E_0 + … + E_d) is uniform on {y >= 0, Σy <= 1}; random signs.
            e = -np.log(_uniform(src, (n, d + 1)))
            y = e[:, 1:] / e.sum(axis=1, keepdims=True)
            signs = np.where(_uniform(src, (n, d)) < 0.5, -1.0, 1.0)
            return _SHRINK * y * signs
        g = ndtri(_uniform(src, (n, d)))
        g /= np.maximum(np.sqrt(np.einsum("ij,ij->i", g, g)), 1e-300)[:, None]
        return _SHRINK * g * _uniform(src, (n, 1)) ** (1.0 / d)


def _domain(bounds: object, data_norm: object, d: int, norm: int) -> _Domain:
    if bounds is None and data_norm is None:
        raise InvalidParameterError(
            "bounds",
            None,
            "a pair (lower, upper) of numbers or length-n_features arrays, or give data_norm=R instead",
            "dpkit never derives the data's range from the data (that would leak it); declare the domain",
        )
    if bounds is not None and data_norm is not None:
        raise InvalidParameterError("data_norm", data_norm, "None when bounds is given (declare one domain, not two)")
    if data_norm is not None:
        r = v.positive(data_norm, "data_norm")
        return _Domain("l1" if norm == 1 else "l2", np.zeros(d), None, None, r, norm)
    accepted = f"a pair (lower, upper) of finite numbers or length-{d} arrays with lower < upper in every feature"
    try:
        lower, upper = cast("tuple[Any, Any]", bounds)  # anything else fails here and is refused below
        lo = np.broadcast_to(np.asarray(lower, dtype=np.float64), (d,)).copy()
        hi = np.broadcast_to(np.asarray(upper, dtype=np.float64), (d,)).copy()
    except (TypeError, ValueError) as exc:
        raise InvalidParameterError("bounds", v.short_repr(bounds), accepted) from exc
    if not (np.all(np.isfinite(lo)) and np.all(np.isfinite(hi)) and np.all(lo < hi)):
        raise InvalidParameterError("bounds", v.short_repr(bounds), accepted)
    mid = (lo + hi) / 2.0
    half = np.maximum(hi - mid, mid - lo)  # covers the rounding of the midpoint
    radius = float(np.sum(half)) if norm == 1 else float(np.sqrt(np.sum(half * half)))
    radius = math.nextafter(radius * (1.0 + 2.0**-40), math.inf)  # float sums rounded up
    return _Domain("box", mid, lo, hi, radius, norm)
