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
    """A double >= ln(x): math.log is within one ulp, so two steps up are safe."""
    return math.nextafter(math.nextafter(math.log(x), math.inf), math.inf)
