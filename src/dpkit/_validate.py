"""Validation helpers shared by every public constructor.

Each helper returns the validated value or raises an error from :mod:`dpkit.errors`. Errors
about *parameters* name the parameter, the value received and what is accepted. Errors about
*data* name the argument and what is accepted, and never quote a data value or the position of
an offending element (docs/architecture.md, "Core ideas"): such a message would itself be a release.

Data helpers check only public facts — the dtype, the shape, emptiness — and are total on
values: :func:`data_array` maps NaN to 0 and :func:`clamp` brings every value into a range
fixed by the parameters (docs/architecture.md, "Core ideas", 1: after the debit nothing fails on data).
"""

from __future__ import annotations

import math
from fractions import Fraction
from numbers import Integral, Rational, Real
from typing import Any, Literal, cast

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


def decimal_fraction(value: float) -> Fraction:
    """The exact value of an ε as the user wrote it: a double is read as the shortest decimal
    that prints as it (``repr(0.1) == "0.1"``, so 1/10, not the double's binary value
    0.1000000000000000055...); exact rationals are themselves.

    Every ε in dpkit is read this way, by the mechanism that calibrates its noise and by every
    accountant and budget that charges for it, so ten spends of ε = 0.1 cost exactly 1. The
    decimal differs from the double by less than half a unit in the last place; mechanisms whose
    calibration is computed in floating point use the double just below it
    (:func:`dpkit.accounting.rounding.decimal_down`), so the noise is never calibrated to more
    than what is charged. Raises ValueError or OverflowError for NaN and infinities."""
    if isinstance(value, Rational):
        return Fraction(value)
    return Fraction(repr(float(value)))


def exact_amount(
    name: str, value: object, *, positive: bool = False, upper: Fraction | None = None, decimal: bool = False
) -> Fraction:
    """A privacy amount as an exact fraction: a finite real (not bool), >= 0 (> 0 if
    ``positive``) and < ``upper`` when given. Budgets and costs are compared exactly. With
    ``decimal``, a double is read as the decimal it prints as (:func:`decimal_fraction`: how ε
    is read everywhere); without, at its exact binary value (δ)."""
    exact: Fraction | None = None
    if _is_real(value):
        try:
            # Fraction takes the rationals and floats; any other real raises TypeError, caught below.
            exact = Fraction(cast("Rational | float", value))
            if decimal:
                exact = decimal_fraction(cast("float", value))
        except (ValueError, OverflowError, TypeError):  # nan, inf, exotic reals
            exact = None
    if exact is None or exact < 0 or (positive and exact == 0) or (upper is not None and exact >= upper):
        accepted = ("a finite number > 0" if positive else "a finite number >= 0") + (
            f" and < {upper}" if upper is not None else ""
        )
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


NAN_RULE = "a NaN has no place in a query with a declared sensitivity; it is treated as 0"


def real_float(x: object) -> float:
    """float(x) for a real number x, ±inf where x is an integer beyond the double range (instead
    of Python's OverflowError: a value must not decide whether a conversion fails)."""
    try:
        return float(x)  # type: ignore[arg-type]
    except OverflowError:
        return math.inf if x > 0 else -math.inf  # type: ignore[operator]


def as_array(value: ArrayLike, name: str, accepted: str = "a number or an array of numbers") -> NDArray[Any]:
    """np.asarray(value), with a dtype that depends on the input's types only, never its values.

    numpy turns a Python integer, or a list of them, into an object array once one passes 2^64
    (and refuses one beyond the double range): a real scalar or a list/tuple whose elements are
    all real numbers is then read as float64 instead (±inf beyond the double range). Input that
    cannot be read raises, naming no value (numpy's own text may quote elements).
    """
    arr: NDArray[Any] | None
    try:
        arr = np.asarray(value)
    except Exception:  # ragged lists, integers beyond the double range, …
        arr = None
    if (arr is None or arr.dtype == object) and (isinstance(value, (list, tuple)) or _is_real(value)):
        try:
            obj = arr if arr is not None else np.array(value, dtype=object)
            flat = obj.ravel()
            if flat.size and all(_is_real(e) for e in flat):
                arr = np.array([real_float(e) for e in flat], dtype=np.float64).reshape(obj.shape)
        except Exception:  # ragged after all
            arr = None
    if arr is None:
        raise InvalidDataError(name, "cannot be read as an array", accepted)
    return arr


def _numeric(value: ArrayLike, name: str) -> NDArray[Any]:
    """``value`` as a non-empty numeric numpy array; raises only on public facts (type, emptiness).

    The messages name no value: the exception text of numpy (which may quote elements) is not
    passed on.
    """
    arr = as_array(value, name)
    if arr.dtype == bool or arr.dtype.kind not in "iuf":
        raise InvalidDataError(name, f"has dtype {arr.dtype}", "numbers (int or float)")
    if arr.size == 0:
        raise InvalidDataError(name, "is empty", "at least one value")
    return arr


def finite_array(
    value: ArrayLike, name: str = "value", *, integer: bool = False
) -> NDArray[np.float64] | NDArray[np.int64]:
    """Numeric input as a numpy array; rejects non-numeric dtypes, NaN and ±inf, empty arrays.

    For inputs that are *not* private data (released values, declared parameters given as
    arrays): it raises on values. Mechanisms read private data with :func:`data_array` /
    :func:`clamp` instead, which are total on values.
    """
    arr = _numeric(value, name)
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
        raise InvalidDataError(name, "holds a non-finite value (NaN or ±inf)", "finite numbers")
    return arr


def data_array(value: ArrayLike, name: str = "value") -> NDArray[np.float64]:
    """Private numeric data as a float64 array, total on values.

    Raises only on public facts: a non-numeric dtype (or booleans), input that is not an array,
    an empty array. NaN becomes 0 (:data:`NAN_RULE`); ±inf are kept for the caller to clamp or
    clip. Always a new array, so callers may modify it in place.
    """
    arr = np.array(_numeric(value, name), dtype=np.float64)  # a copy
    np.copyto(arr, 0.0, where=np.isnan(arr))
    return arr


def clamp(x: NDArray[np.float64], limit: float) -> NDArray[np.float64]:
    """Each coordinate clamped to [−limit, limit], NaN → 0 and ±inf → ±limit.

    Clamping every coordinate to one fixed interval is 1-Lipschitz in each coordinate, so it
    never increases a query's ℓ1 or ℓ2 sensitivity: a guarantee proven for the query holds for the
    clamped query. ``limit`` must come from parameters only.
    """
    out = np.nan_to_num(np.asarray(x, dtype=np.float64), nan=0.0, posinf=limit, neginf=-limit)
    return np.clip(out, -limit, limit)


def integer_data(value: ArrayLike, name: str = "value", *, limit: int = 2**62) -> NDArray[np.int64]:
    """Private integer data as int64 in [−limit, limit], total on values.

    Integer dtypes are clamped; float input has NaN → 0, is clamped (±inf → ±limit) and rounded
    to the nearest integer (ties to even). On integer-valued data rounding is the identity and
    clamping is 1-Lipschitz, so an integer query's sensitivity is unchanged. Raises only on public
    facts (dtype, emptiness), like :func:`data_array`.
    """
    arr = _numeric(value, name)
    if arr.dtype.kind == "u":
        return np.minimum(arr, np.uint64(limit)).astype(np.int64)
    if arr.dtype.kind == "i":
        return np.clip(arr.astype(np.int64), -limit, limit)
    return np.rint(clamp(arr.astype(np.float64), float(limit))).astype(np.int64)
