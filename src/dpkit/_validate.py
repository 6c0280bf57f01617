"""Validation helpers shared by every public constructor.

Each helper returns the validated value or raises an error from :mod:`dpkit.errors` that names
the parameter, the value received and what is accepted.
"""

from __future__ import annotations

import math
from fractions import Fraction
from numbers import Integral, Real
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

from dpkit.errors import InvalidDataError, InvalidParameterError

Neighbours = Literal["add_remove", "replace"]
NEIGHBOUR_RELATIONS: tuple[str, ...] = ("add_remove", "replace")


def _is_real(value: object) -> bool:
    return isinstance(value, Real) and not isinstance(value, bool)


def short_repr(obj: object, limit: int = 200) -> str:
    """repr() cut to ``limit`` characters, for error messages."""
    text = repr(obj)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def epsilon(value: object, name: str = "epsilon") -> float:
    """ε must be a finite real number > 0."""
    if not _is_real(value) or not math.isfinite(float(value)) or float(value) <= 0:  # type: ignore[arg-type]
        raise InvalidParameterError(name, value, "a finite number > 0")
    return float(value)  # type: ignore[arg-type]


def delta(value: object, name: str = "delta", *, allow_zero: bool = True) -> float:
    """δ must lie in [0, 1) (or (0, 1) where a mechanism needs δ > 0)."""
    accepted = "a number in [0, 1)" if allow_zero else "a number in (0, 1)"
    if not _is_real(value) or not math.isfinite(float(value)):  # type: ignore[arg-type]
        raise InvalidParameterError(name, value, accepted)
    v = float(value)  # type: ignore[arg-type]
    if v < 0 or v >= 1 or (v == 0 and not allow_zero):
        raise InvalidParameterError(name, value, accepted)
    return v


def exact_amount(name: str, value: object, *, positive: bool = False, upper: Fraction | None = None) -> Fraction:
    """A privacy amount as an exact fraction: a finite real (not bool), >= 0 (> 0 if
    ``positive``) and < ``upper`` when given. Budgets and costs are compared exactly."""
    exact: Fraction | None = None
    if _is_real(value):
        try:
            exact = Fraction(value)  # type: ignore[arg-type]
        except (ValueError, OverflowError, TypeError):  # nan, inf, exotic reals
            exact = None
    if exact is None or exact < 0 or (positive and exact == 0) or (upper is not None and exact >= upper):
        accepted = ("a finite number > 0" if positive else "a finite number >= 0") + (f" and < {upper}" if upper is not None else "")
        raise InvalidParameterError(name, value, accepted)
    return exact


def positive(value: object, name: str) -> float:
    """A finite real number > 0 (sensitivities, scales)."""
    if not _is_real(value) or not math.isfinite(float(value)) or float(value) <= 0:  # type: ignore[arg-type]
        raise InvalidParameterError(name, value, "a finite number > 0")
    return float(value)  # type: ignore[arg-type]


def probability(value: object, name: str, *, low_open: bool = True, high_open: bool = True) -> float:
    lo, hi = ("(" if low_open else "["), (")" if high_open else "]")
    accepted = f"a number in {lo}0, 1{hi}"
    if not _is_real(value) or not math.isfinite(float(value)):  # type: ignore[arg-type]
        raise InvalidParameterError(name, value, accepted)
    v = float(value)  # type: ignore[arg-type]
    if v < 0 or v > 1 or (low_open and v == 0) or (high_open and v == 1):
        raise InvalidParameterError(name, value, accepted)
    return v


def positive_int(value: object, name: str, *, minimum: int = 1) -> int:
    if not isinstance(value, Integral) or isinstance(value, bool) or int(value) < minimum:
        raise InvalidParameterError(name, value, f"an integer >= {minimum}")
    return int(value)


def bounds(lower: object, upper: object, name: str = "bounds") -> tuple[float, float]:
    """Declared data bounds: finite reals with lower < upper."""
    for part, v in ((f"{name}.lower", lower), (f"{name}.upper", upper)):
        if not _is_real(v) or not math.isfinite(float(v)):  # type: ignore[arg-type]
            raise InvalidParameterError(part, v, "a finite number")
    lo, hi = float(lower), float(upper)  # type: ignore[arg-type]
    if not lo < hi:
        raise InvalidParameterError(name, (lower, upper), "(lower, upper) with lower < upper")
    return lo, hi


def neighbours(value: object, name: str = "neighbours") -> Neighbours:
    if value not in NEIGHBOUR_RELATIONS:
        raise InvalidParameterError(name, value, "'add_remove' or 'replace'")
    return value  # type: ignore[return-value]


def finite_array(value: ArrayLike, name: str = "value", *, integer: bool = False) -> NDArray[np.float64] | NDArray[np.int64]:
    """Numeric data as a numpy array; rejects non-numeric dtypes, NaN and ±inf, empty arrays."""
    try:
        arr = np.asarray(value)
    except Exception as exc:  # ragged lists and the like
        raise InvalidDataError(name, f"cannot be read as an array ({exc})", "a number or an array of numbers") from exc
    if arr.dtype == bool or arr.dtype.kind not in "iuf":
        raise InvalidDataError(name, f"has dtype {arr.dtype}", "numbers (int or float)")
    if arr.size == 0:
        raise InvalidDataError(name, "is empty", "at least one value")
    if integer:
        if arr.dtype.kind == "f":
            if not np.all(np.isfinite(arr)) or not np.all(arr == np.round(arr)):
                raise InvalidDataError(name, "holds non-integer or non-finite values", "integers")
            if np.any(np.abs(arr) > 2.0**62):
                raise InvalidDataError(name, "holds values beyond ±2**62", "integers within ±2**62")
        elif arr.dtype.kind == "u" and np.any(arr > np.uint64(2**62)):
            raise InvalidDataError(name, "holds values beyond 2**62", "integers within ±2**62")
        return arr.astype(np.int64)
    arr = arr.astype(np.float64)
    if not np.all(np.isfinite(arr)):
        bad = arr[~np.isfinite(arr)].ravel()[0]
        raise InvalidDataError(name, f"holds a non-finite value ({bad})", "finite numbers")
    return arr
