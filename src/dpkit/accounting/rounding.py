"""Privacy arithmetic rounded against ourselves.

Budgets and guarantees are doubles, but every conversion between them is rounded in the
direction that can only overstate privacy loss (or understate remaining budget): exact rational
arithmetic with :class:`fractions.Fraction`, then one step with :func:`math.nextafter` where the
result is not exact.
"""

from __future__ import annotations

import math
from fractions import Fraction

from dpkit._validate import decimal_fraction

__all__ = [
    "to_float_down",
    "to_float_up",
    "reciprocal_down",
    "reciprocal_up",
    "sub_down",
    "up",
    "up2",
    "down2",
    "down",
    "exp_up",
    "expm1_up",
    "log_up",
    "log_down",
    "sqrt_up",
    "decimal_down",
    "decimal_up",
    "to_decimal_down",
    "to_decimal_up",
]


def to_float_down(x: Fraction) -> float:
    f = float(x)
    return math.nextafter(f, -math.inf) if Fraction(f) > x else f


def decimal_down(epsilon: float) -> float:
    """The largest double <= the decimal value of ``epsilon`` (``decimal_fraction``): the ε a
    mechanism uses where its calibration is computed in floating point, so that the noise is
    never calibrated to more than the ε charged for it. Equal to ``epsilon`` or one ulp below."""
    return to_float_down(decimal_fraction(epsilon))


def decimal_up(epsilon: float) -> float:
    """The smallest double >= the decimal value of ``epsilon``: how an accountant that works in
    floating point reads an event's ε (never below what the mechanism calibrated to)."""
    return to_float_up(decimal_fraction(epsilon))


def to_decimal_down(x: Fraction) -> float:
    """A double whose decimal value is <= ``x`` (the nearest one, or the next below): the ε to
    hand a part of a mechanism whose parts must not cost more than their exact share ``x``
    (``float(x)`` alone is not enough: the part is charged the decimal its double prints as), and
    how an exact budget is shown (9/10 as 0.9, where the largest double below it is 0.8999...)."""
    return _step_to_decimal(x, -math.inf)


def to_decimal_up(x: Fraction) -> float:
    """A double whose decimal value is >= ``x`` (the nearest one, or the next above): how an exact
    amount spent is shown (7/10 as 0.7, where the smallest double above it is 0.7000000000000001)."""
    return _step_to_decimal(x, math.inf)


def _step_to_decimal(x: Fraction, toward: float) -> float:
    """The double nearest ``x``, stepped toward ``toward`` (±inf) until its decimal value is on
    that side of ``x`` (one step at most: the decimal is within half an ulp of its double)."""
    try:
        f = float(x)
    except OverflowError:
        return math.inf
    while math.isfinite(f) and (decimal_fraction(f) > x if toward < 0 else decimal_fraction(f) < x):
        f = math.nextafter(f, toward)
    return f


def to_float_up(x: Fraction) -> float:
    f = float(x)
    return math.nextafter(f, math.inf) if Fraction(f) < x else f


def reciprocal_down(x: float) -> float:
    """The largest double <= 1/x."""
    return to_float_down(1 / Fraction(x))


def reciprocal_up(x: float) -> float:
    """The smallest double >= 1/x."""
    return to_float_up(1 / Fraction(x))


def sub_down(a: float, b: float) -> float:
    """The largest double <= a − b."""
    return to_float_down(Fraction(a) - Fraction(b))


def up(x: Fraction) -> float:
    """The smallest double >= x, or +inf beyond the largest double."""
    try:
        return to_float_up(x)
    except OverflowError:
        return math.inf


def up2(x: float, steps: int = 2) -> float:
    """``steps`` ulps up (two: past the one-ulp error of the C library's exp/log/expm1)."""
    for _ in range(steps):
        x = math.nextafter(x, math.inf)
    return x


def down2(x: float, steps: int = 2) -> float:
    """``steps`` ulps down."""
    for _ in range(steps):
        x = math.nextafter(x, -math.inf)
    return x


def down(x: Fraction) -> float:
    """The largest double <= x; +inf when x is beyond the largest double (as :func:`up`)."""
    try:
        return to_float_down(x)
    except OverflowError:
        return math.inf


def exp_up(x: Fraction) -> float:
    """A double >= e^x (exactly 1.0 at x = 0)."""
    if x == 0:
        return 1.0
    try:
        return up2(math.exp(up(x)))
    except OverflowError:
        return math.inf


def expm1_up(x: float) -> float:
    """A double >= e^x − 1."""
    try:
        return up2(math.expm1(x))
    except OverflowError:
        return math.inf


def log_up(x: Fraction) -> float:
    """A double >= ln(x) for x > 0. The argument is rounded up *before* the log; near 1 that is
    done to x − 1 and log1p is used, so a small ln(x) keeps its relative precision."""
    if x >= Fraction(1, 2):
        return up2(math.log1p(up(x - 1)))
    return up2(math.log(up(x)))


def log_down(x: float) -> float:
    """A double <= ln(x) for a double x > 0."""
    return down2(math.log(x))


def sqrt_up(x: Fraction) -> float:
    """A double >= √x (math.sqrt is correctly rounded, so one step suffices)."""
    return math.nextafter(math.sqrt(up(x)), math.inf)
