"""Exact uniform integers and rational Bernoulli trials, vectorised over numpy arrays."""

from __future__ import annotations

import numbers
from fractions import Fraction
from typing import cast

import numpy as np
from numpy.typing import NDArray

from dpkit._validate import positive_int
from dpkit.errors import InvalidParameterError
from dpkit.noise.source import RNG, RandomSource, resolve_rng

__all__ = ["uniform_below", "bernoulli"]

_TWO64 = 1 << 64


def _uniform_below(d: int, n: int, src: RandomSource) -> NDArray[np.uint64]:
    """``n`` exact uniform integers in [0, d) for 1 <= d <= 2**64.

    Powers of two are masked; other ``d`` use modulo with rejection of the top partial block
    (words >= floor(2**64 / d) * d), so every residue is equally likely. The rejection chance is
    below d / 2**64 per word; rejected lanes are redrawn together until none remain.
    """
    if d == 1:
        return np.zeros(n, dtype=np.uint64)
    if d & (d - 1) == 0:
        return src.words(n) & np.uint64(d - 1) if d < _TWO64 else src.words(n)
    limit = np.uint64((_TWO64 // d) * d - 1)  # largest accepted word
    dd = np.uint64(d)
    out = src.words(n)
    bad = np.flatnonzero(out > limit)
    while bad.size:
        fresh = src.words(bad.size)
        out[bad] = fresh
        bad = bad[fresh > limit]
    return out % dd


def uniform_below(d: int, size: int, *, rng: RNG = None) -> NDArray[np.int64]:
    """``size`` independent integers, each uniform on {0, …, d − 1}, exactly.

    >>> import numpy as np
    >>> x = uniform_below(6, 5, rng=np.random.default_rng(0))
    >>> bool(((0 <= x) & (x < 6)).all())
    True
    """
    if not isinstance(d, (int, np.integer)) or isinstance(d, bool) or not 1 <= int(d) <= 2**63:
        raise InvalidParameterError("d", d, "an integer in [1, 2**63]")
    return _uniform_below(int(d), positive_int(size, "size", minimum=0), resolve_rng(rng)).astype(np.int64)


def _as_fraction(p: object, name: str) -> Fraction:
    if isinstance(p, bool):
        raise InvalidParameterError(name, p, "a number in [0, 1]")
    try:
        # floats convert exactly; anything Fraction does not take raises TypeError, caught below
        f = Fraction(cast("numbers.Rational | float | str", p))
    except (TypeError, ValueError, OverflowError):
        raise InvalidParameterError(name, p, "a number in [0, 1]") from None
    if not 0 <= f <= 1:
        raise InvalidParameterError(name, p, "a number in [0, 1]")
    return f


def bernoulli(p: Fraction | float | int, size: int, *, rng: RNG = None) -> NDArray[np.bool_]:
    """``size`` independent Bernoulli(p) trials for a rational p in [0, 1], exactly.

    A float p is taken at its exact binary value (``Fraction(0.1)``, not 1/10); pass a
    :class:`fractions.Fraction` for an exact decimal or repeating value. The trial is
    ``uniform_below(den) < num``, so the probability is exactly p.

    >>> import numpy as np
    >>> bernoulli(Fraction(1, 3), 4, rng=np.random.default_rng(1)).dtype
    dtype('bool')
    """
    f = _as_fraction(p, "p")
    n = positive_int(size, "size", minimum=0)
    src = resolve_rng(rng)
    if f == 0 or f == 1:
        return np.full(n, f == 1)
    if f.denominator > _TWO64:
        raise InvalidParameterError("p", p, "a rational with denominator <= 2**64")
    u = _uniform_below(f.denominator, n, src)
    return u < np.uint64(f.numerator)
