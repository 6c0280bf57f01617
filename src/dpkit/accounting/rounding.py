"""Privacy arithmetic rounded against ourselves.

Budgets and guarantees are doubles, but every conversion between them is rounded in the
direction that can only overstate privacy loss (or understate remaining budget): exact rational
arithmetic with :class:`fractions.Fraction`, then one step with :func:`math.nextafter` where the
result is not exact.
"""

from __future__ import annotations

import math
from fractions import Fraction

__all__ = ["to_float_down", "to_float_up", "reciprocal_down", "reciprocal_up", "sub_down", "log_up"]


def to_float_down(x: Fraction) -> float:
    f = float(x)
    return math.nextafter(f, -math.inf) if Fraction(f) > x else f


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


def log_up(x: Fraction) -> float:
    """A double >= ln(x) for x > 0.

    The argument is rounded up first (log is increasing), near 1 through log1p of x − 1 to keep
    relative precision; ``math.log``/``log1p`` are within one ulp, so two steps up are safe.
    """
    if x < 2:
        y = math.log1p(to_float_up(x - 1))
    else:
        y = math.log(to_float_up(x))
    return math.nextafter(math.nextafter(y, math.inf), math.inf)
