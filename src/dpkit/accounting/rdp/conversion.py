"""Conversions from an RDP curve to (ε, δ), each rounded up with an allowance for its own
floating-point error (see :mod:`dpkit.accounting.rdp` for the theorems)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

import numpy as np

from dpkit import _validate as v
from dpkit.accounting.accountant import check_epsilon
from dpkit.accounting.rdp.curves import _U, FloatArray, _order_values
from dpkit.errors import InvalidParameterError

__all__ = ["rdp_to_epsilon", "rdp_to_delta"]

# Each returns (value, allowance): the allowance bounds the floating-point error of the value.
EpsilonConversion = Callable[[FloatArray, FloatArray, float, float], tuple[FloatArray, FloatArray]]
DeltaConversion = Callable[[FloatArray, FloatArray, float], tuple[FloatArray, FloatArray]]


def _eps_classic(a: FloatArray, r: FloatArray, delta: float, log_delta: float) -> tuple[FloatArray, FloatArray]:
    """Mironov 2017, Prop 3: ε = R(α) + ln(1/δ)/(α − 1)."""
    t = -log_delta / (a - 1.0)
    return r + t, 8.0 * _U * (np.abs(r) + t)


def _eps_improved(a: FloatArray, r: FloatArray, delta: float, log_delta: float) -> tuple[FloatArray, FloatArray]:
    """Canonne–Kamath–Steinke 2020 Prop 12 (= Balle et al. 2020 Thm 21), the smaller of it and
    Mironov's per order, and 0 where δ >= √(1 − e^{−R}) (KL <= R, Bretagnolle–Huber)."""
    with np.errstate(invalid="ignore"):  # ∞ − ∞ cannot occur: R = ∞ only adds to finite terms
        t2 = np.log1p(-1.0 / a)
        t3 = -(log_delta + np.log(a)) / (a - 1.0)
        eps = r + t2 + t3
        err = 8.0 * _U * (np.abs(r) + np.abs(t2) + np.abs(t3))
        classic, classic_err = _eps_classic(a, r, delta, log_delta)
        use_classic = classic + classic_err < eps + err
        eps = np.where(use_classic, classic, eps)
        err = np.where(use_classic, classic_err, err)
        kl_zero = delta * delta * (1.0 - 8.0 * _U) > -np.expm1(-r)
    return np.where(kl_zero, 0.0, eps), np.where(kl_zero, 0.0, err)


def _log_delta_classic(a: FloatArray, r: FloatArray, eps: float) -> tuple[FloatArray, FloatArray]:
    """Mironov 2017, Prop 3 solved for δ: ln δ = (α − 1)(R − ε)."""
    with np.errstate(invalid="ignore"):
        ld = (a - 1.0) * (r - eps)
    return ld, 8.0 * _U * (a - 1.0) * (np.abs(r) + eps)


def _log_delta_improved(a: FloatArray, r: FloatArray, eps: float) -> tuple[FloatArray, FloatArray]:
    """CKS 2020 Prop 12: ln δ = (α − 1)(R − ε + ln(1 − 1/α)) − ln α; with Mironov's and the
    KL/Bretagnolle–Huber bound ln δ = ½ ln(1 − e^{−R}), the smallest per order."""
    t = np.log1p(-1.0 / a)
    la = np.log(a)
    with np.errstate(invalid="ignore", divide="ignore"):
        ld = (a - 1.0) * (r - eps + t) - la
        err = 8.0 * _U * ((a - 1.0) * (np.abs(r) + eps + np.abs(t)) + la)
        ld_c, err_c = _log_delta_classic(a, r, eps)
        ld_kl = 0.5 * np.log(-np.expm1(-r))
        err_kl = 8.0 * _U * np.abs(ld_kl)
    best, best_err = ld, err
    for cand, cand_err in ((ld_c, err_c), (ld_kl, err_kl)):
        better = cand + cand_err < best + best_err
        best = np.where(better, cand, best)
        best_err = np.where(better, cand_err, best_err)
    return best, best_err


_Conversion = TypeVar("_Conversion", EpsilonConversion, DeltaConversion)

_EPSILON_CONVERSIONS: dict[str, EpsilonConversion] = {"improved": _eps_improved, "classic": _eps_classic}
_DELTA_CONVERSIONS: dict[str, DeltaConversion] = {
    "improved": _log_delta_improved,
    "classic": _log_delta_classic,
}


def _conversion(table: Mapping[str, _Conversion], conversion: object) -> _Conversion:
    fn = table.get(conversion) if isinstance(conversion, str) else None
    if fn is None:
        raise InvalidParameterError("conversion", conversion, " or ".join(repr(k) for k in table))
    return fn


def _epsilon_and_order(a: FloatArray, r: FloatArray, delta: float, conversion: str) -> tuple[float, float]:
    fn = _conversion(_EPSILON_CONVERSIONS, conversion)
    if not np.any(r):  # nothing spent
        return 0.0, float(a[0])
    if delta == 0.0:
        return math.inf, math.inf
    eps, err = fn(a, r, delta, math.log(delta))
    up = eps + err
    i = int(np.argmin(up))
    best = float(up[i])
    if best <= 0.0:
        return 0.0, float(a[i])
    return math.nextafter(best, math.inf), float(a[i])


def _delta_and_order(a: FloatArray, r: FloatArray, epsilon: float, conversion: str) -> tuple[float, float]:
    fn = _conversion(_DELTA_CONVERSIONS, conversion)
    if not np.any(r):
        return 0.0, float(a[0])
    ld, err = fn(a, r, epsilon)
    up = ld + err
    i = int(np.argmin(up))
    best = float(up[i])
    if best >= 0.0:
        return 1.0, float(a[i])
    d = math.nextafter(math.nextafter(math.exp(best), math.inf), math.inf)
    return min(d, 1.0), float(a[i])


def _validate_rdp_curve(orders: Sequence[float], rdp: Sequence[float]) -> tuple[FloatArray, FloatArray]:
    a = np.asarray(_order_values(orders), dtype=np.float64)
    try:
        r = np.asarray(rdp, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise InvalidParameterError("rdp", rdp, "numbers >= 0 (∞ allowed)") from exc
    if r.shape != a.shape:
        raise InvalidParameterError("rdp", rdp, f"one value per order ({a.size})")
    if np.any(np.isnan(r)) or np.any(r < 0):
        raise InvalidParameterError("rdp", rdp, "numbers >= 0 (∞ allowed)")
    return a, r


def rdp_to_epsilon(
    orders: Sequence[float], rdp: Sequence[float], delta: float, conversion: str = "improved"
) -> tuple[float, float]:
    """(ε, best order) from an RDP curve at δ, rounded up (see the module docstring)."""
    a, r = _validate_rdp_curve(orders, rdp)
    return _epsilon_and_order(a, r, v.delta(delta), conversion)


def rdp_to_delta(
    orders: Sequence[float], rdp: Sequence[float], epsilon: float, conversion: str = "improved"
) -> tuple[float, float]:
    """(δ, best order) from an RDP curve at ε >= 0, rounded up and capped at 1."""
    a, r = _validate_rdp_curve(orders, rdp)
    return _delta_and_order(a, r, check_epsilon(epsilon), conversion)
