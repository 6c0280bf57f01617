"""Certified fixed-point arithmetic for the rare, exact branches of the samplers.

The vectorised samplers decide almost every lane with 32- or 53-bit comparisons whose correctness
is proven with margins. The few lanes that land inside a margin (or tie a threshold) are decided
here, exactly: a uniform U in [0, 1) is compared with a real number v by reading more random bits
of U until the comparison is settled, while v is enclosed in ever tighter certified intervals.
These branches run on a handful of lanes per ten million samples, so plain Python is fine.
"""

from __future__ import annotations

from collections.abc import Callable
from fractions import Fraction
from functools import lru_cache

from dpkit.noise.source import RandomSource

Bounds = Callable[[int], tuple[int, int]]
"""``bounds(prec)`` returns integers (lo, hi) with lo <= v * 2**prec <= hi."""


def _exp_neg_unit(f: Fraction, prec: int) -> tuple[int, int]:
    """Enclose e^{-f}·2^prec for 0 <= f <= 1 by its alternating Taylor series.

    Work with G = prec + 64 guard bits. x = floor(f·2^G) is within one unit of f·2^G, which moves
    e^{-x} by at most one unit (|d/dx e^{-x}| <= 1). Each term is truncated (error <= 1 unit, and
    earlier errors shrink by the factor x/k <= 1), and the series stops once a term is below one
    unit, so the total error is below 3 units per term plus two. The guard bits leave that far
    below one unit at precision ``prec``.
    """
    g = prec + 64
    one = 1 << g
    x = (f.numerator << g) // f.denominator
    term, total, k = one, one, 1
    while term:
        term = term * x // (k << g)
        total += -term if k & 1 else term
        k += 1
    err = 3 * k + 2
    return (total - err) >> 64, ((total + err) >> 64) + 1


@lru_cache(maxsize=64)
def _exp_neg_one(prec: int) -> tuple[int, int]:
    return _exp_neg_unit(Fraction(1), prec)


def exp_neg_bounds(gamma: Fraction, prec: int) -> tuple[int, int]:
    """Integers (lo, hi) with lo <= e^{-gamma}·2^prec <= hi, for rational gamma >= 0."""
    if gamma < 0:
        raise ValueError("gamma must be >= 0")
    n = gamma.numerator // gamma.denominator
    if n > 2 * prec + 64:  # e^{-n} < 2^{-prec-1}: the value is below one unit
        return 0, 1
    f = gamma - n
    w = prec + 2 * n.bit_length() + 16  # work precision: headroom for n interval products
    lo, hi = _exp_neg_unit(f, w)
    e_lo, e_hi = _exp_neg_one(w)
    for _ in range(n):
        lo = lo * e_lo >> w
        hi = -((-hi * e_hi) >> w)  # ceiling division keeps hi an upper bound
    shift = w - prec
    return lo >> shift, -((-hi) >> shift)


def exp_neg_bounds_fn(gamma: Fraction) -> Bounds:
    return lambda prec: exp_neg_bounds(gamma, prec)


def fraction_bounds_fn(v: Fraction) -> Bounds:
    def bounds(prec: int) -> tuple[int, int]:
        lo = (v.numerator << prec) // v.denominator
        return lo, -((-v.numerator << prec) // v.denominator)

    return bounds


def lazy_less(prefix: int, bits: int, bounds: Bounds, src: RandomSource) -> tuple[bool, int, int]:
    """Decide U < v exactly, where U's first ``bits`` binary digits are ``prefix``.

    U lies in [prefix, prefix + 1)·2^-bits. While the interval for v overlaps that of U, read 64
    more bits of U and tighten v. Returns the answer and U's (possibly longer) known prefix, so a
    caller can go on comparing the same U with other numbers. Terminates with probability 1 (each
    extra round is needed with probability about 2^-60).
    """
    while True:
        prec = bits + 64
        lo, hi = bounds(prec)
        scale = 1 << (prec - bits)
        if (prefix + 1) * scale <= lo:
            return True, prefix, bits
        if prefix * scale >= hi:
            return False, prefix, bits
        prefix = (prefix << 64) | int(src.words(1)[0])
        bits += 64


def interval_quotient(num: tuple[int, int], den: tuple[int, int], prec: int) -> tuple[int, int]:
    """Enclose (a/b)·2^prec given a in [num], b in [den] (both scaled by the same power, b > 0)."""
    lo = (max(num[0], 0) << prec) // den[1]
    hi = -((-num[1] << prec) // den[0])
    return lo, hi
