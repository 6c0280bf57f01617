"""Scaling features by their declared bounds, so that a declared ``data_norm`` fits the rows.

The estimators of :mod:`dpkit.ml` clip every row to the declared ℓ2 norm ``data_norm``: a row
with a larger norm is scaled down to it, silently (saying which rows were scaled would say
something about the data). Features in raw units — grams, millimetres, dollars — have norms in
the thousands, so with a small ``data_norm`` nearly every row is scaled onto the same sphere and
dominated by its largest-unit feature (a logistic regression on such rows can fall to chance),
while a ``data_norm`` large enough for the raw rows makes the noise, calibrated to it, swamp the
small-unit features. :class:`BoundsScaler` maps each feature from its *declared* range
[lower, upper] onto [-1, 1], so every row has norm at most √d, which is :attr:`BoundsScaler.data_norm`.

It reads nothing from the data: the bounds are declared (directly or by the metadata's
:class:`~dpkit.analytics.Numeric` columns, :meth:`BoundsScaler.from_metadata`), ``fit`` records
the number of features and their names only, and ``transform`` is a fixed, public map of each
row on its own. Scaling therefore costs no privacy budget and changes no guarantee: the
estimator after it clips to ``data_norm`` as always, and now clips nothing.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

import numpy as np
from numpy.typing import ArrayLike, NDArray
from sklearn.base import BaseEstimator, OneToOneFeatureMixin, TransformerMixin

from dpkit._validate import short_repr
from dpkit.errors import InvalidDataError, InvalidParameterError
from dpkit.ml._noisy_gd import check_X

if TYPE_CHECKING:
    from dpkit.analytics.metadata import Metadata

__all__ = ["BoundsScaler"]


class BoundsScaler(OneToOneFeatureMixin, TransformerMixin, BaseEstimator):
    """Map each feature from its declared range [lower, upper] onto [-1, 1] (values outside the
    range are clipped), so that every row has ℓ2 norm at most √d.

    Guarantee
        No value of the data is read to build the map: it comes from ``bounds`` alone, and
        ``fit`` only records ``n_features_in_`` (and ``feature_names_in_`` for a DataFrame). The
        scaled rows satisfy ‖x‖₂ <= :attr:`data_norm` = √d, so an estimator given that
        ``data_norm`` clips no row. (Each value is clipped to [-1, 1] after the map, so this
        holds for values outside the declared range too.)

    Parameters (keyword-only)
        bounds: a pair (lower, upper) of numbers (the same range for every feature) or of
            length-d arrays, lower < upper in every feature — the form the estimators'
            ``bounds`` take.
        columns: the feature names, in the order of the bounds (set by :meth:`from_metadata`).
            With it, a DataFrame must have exactly these columns in this order, so that no
            feature is scaled by another's range.

    Example
        >>> import numpy as np
        >>> s = BoundsScaler(bounds=([2500, 170], [6500, 235]))
        >>> s.data_norm  # √2: two features
        1.4142135623730951
        >>> s.fit_transform(np.array([[4500.0, 202.5], [7000.0, 170.0]]))
        array([[ 0.,  0.],
               [ 1., -1.]])
    """

    def __init__(self, *, bounds: Any = None, columns: Sequence[str] | None = None) -> None:
        self.bounds = bounds
        self.columns = columns

    @classmethod
    def from_metadata(cls, metadata: Metadata, columns: Sequence[str]) -> BoundsScaler:
        """A scaler for ``columns`` from their declared bounds: each must be declared in
        ``metadata`` as :class:`~dpkit.analytics.Numeric` with ``lower`` and ``upper``."""
        from dpkit.analytics.metadata import Metadata, Numeric

        if not isinstance(metadata, Metadata):
            raise InvalidParameterError("metadata", short_repr(metadata), "a dpkit.analytics.Metadata")
        if isinstance(columns, str) or not isinstance(columns, Sequence) or not columns:
            raise InvalidParameterError("columns", short_repr(columns), "a non-empty list of declared column names")
        if len(set(columns)) != len(columns):
            raise InvalidParameterError("columns", short_repr(columns), "distinct column names")
        lower, upper = [], []
        for name in columns:
            spec = metadata.columns.get(name) if isinstance(name, str) else None
            if not isinstance(spec, Numeric) or not spec.bounded:
                declared = ", ".join(
                    repr(c) for c, s in metadata.columns.items() if isinstance(s, Numeric) and s.bounded
                )
                raise InvalidParameterError(
                    "columns",
                    short_repr(name),
                    f"a column declared as Numeric(lower, upper) in the metadata (those: {declared or 'none'})",
                    "the scale comes from the declared bounds, never from the data",
                )
            lower.append(cast(float, spec.lower))
            upper.append(cast(float, spec.upper))
        return cls(bounds=(tuple(lower), tuple(upper)), columns=tuple(columns))

    # -- the declared map ----------------------------------------------------------------------

    def _declared_width(self) -> int | None:
        """The number of features the parameters declare (None: a scalar range, any width)."""
        if self.columns is not None:
            return len(self.columns)
        try:
            lower, upper = cast("tuple[Any, Any]", self.bounds)
            shapes = [np.shape(lower), np.shape(upper)]
        except (TypeError, ValueError):
            return None  # refused with its message by _range
        widths = [shape[0] for shape in shapes if len(shape) == 1]
        return widths[0] if widths else None

    def _range(self, d: int) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """The midpoints and half-widths of the ``d`` declared ranges."""
        accepted = f"a pair (lower, upper) of finite numbers or length-{d} arrays with lower < upper in every feature"
        if self.bounds is None:
            raise InvalidParameterError(
                "bounds",
                None,
                accepted,
                "the scale is declared, never derived from the data's range (that would leak it)",
            )
        try:
            lower, upper = (np.asarray(b, dtype=np.float64) for b in cast("tuple[Any, Any]", self.bounds))
        except (TypeError, ValueError) as exc:
            raise InvalidParameterError("bounds", short_repr(self.bounds), accepted) from exc
        if not all(b.shape in ((), (d,)) for b in (lower, upper)):  # no other broadcast: one range a feature
            raise InvalidParameterError("bounds", short_repr(self.bounds), accepted)
        lo, hi = np.broadcast_to(lower, (d,)), np.broadcast_to(upper, (d,))
        if not (np.all(np.isfinite(lo)) and np.all(np.isfinite(hi)) and np.all(lo < hi)):
            raise InvalidParameterError("bounds", short_repr(self.bounds), accepted)
        # Halves first: hi − lo could overflow for bounds near the largest double.
        return lo / 2 + hi / 2, hi / 2 - lo / 2

    @property
    def data_norm(self) -> float:
        """√d: the ℓ2 norm that no scaled row exceeds — the ``data_norm`` to give the estimator.
        Known from per-feature ``bounds`` or ``columns``; with one range for every feature, after
        ``fit``."""
        d = self._declared_width()
        if d is None:
            d = getattr(self, "n_features_in_", None)
        if d is None:
            raise InvalidParameterError(
                "bounds",
                short_repr(self.bounds),
                "length-d arrays (or columns=), or call fit first, for data_norm to know the number of features d",
            )
        self._range(d)
        return math.sqrt(d)

    # -- fit / transform -----------------------------------------------------------------------

    def _checked(self, X: ArrayLike, *, fitted: bool) -> NDArray[np.float64]:
        names = getattr(X, "columns", None)
        if self.columns is not None and names is not None and [str(c) for c in names] != list(self.columns):
            raise InvalidDataError(
                "X",
                f"has the columns {short_repr([str(c) for c in names])}",
                f"the scaler's columns in its order: {short_repr(list(self.columns))}",
            )
        arr = check_X(X)
        d = self.n_features_in_ if fitted else self._declared_width()
        if d is not None and arr.shape[1] != d:
            raise InvalidDataError("X", f"has {arr.shape[1]} features", f"{d} features, one per declared range")
        return arr

    def fit(self, X: ArrayLike, y: object = None) -> BoundsScaler:
        """Check the bounds and record the number of features (and their names); no value of
        ``X`` is learnt. Returns self."""
        arr = self._checked(X, fitted=False)
        self._range(arr.shape[1])
        self.n_features_in_ = arr.shape[1]
        names = getattr(X, "columns", None)
        if names is not None and all(isinstance(c, str) for c in names):
            self.feature_names_in_ = np.asarray(list(names), dtype=object)
        elif hasattr(self, "feature_names_in_"):
            del self.feature_names_in_
        return self

    def transform(self, X: ArrayLike) -> NDArray[np.float64]:
        """Each value mapped from its feature's declared range onto [-1, 1], then clipped to it."""
        from sklearn.utils.validation import check_is_fitted

        check_is_fitted(self, "n_features_in_")
        arr = self._checked(X, fitted=True)
        mid, half = self._range(arr.shape[1])
        return np.clip((arr - mid) / half, -1.0, 1.0)

    def inverse_transform(self, X: ArrayLike) -> NDArray[np.float64]:
        """Scaled values back in the declared units (clipped values stay at their bound)."""
        from sklearn.utils.validation import check_is_fitted

        check_is_fitted(self, "n_features_in_")
        arr = check_X(X)
        if arr.shape[1] != self.n_features_in_:
            raise InvalidDataError("X", f"has {arr.shape[1]} features", f"{self.n_features_in_} features, as in fit")
        mid, half = self._range(arr.shape[1])
        return arr * half + mid
