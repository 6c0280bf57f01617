"""Exact Bernoulli(exp(−γ)) trials, vectorised.

Every lane compares a uniform U (known to its first ``bits`` binary digits) with e^{−γ}. Almost
all lanes are settled by a certified floating-point enclosure of e^{−γ}; the rest, about one in
2^28, are settled exactly by :func:`dpkit.noise._exact.lazy_less`, so each trial succeeds with
probability exactly e^{−γ}.

The enclosure never calls a library ``exp``. With the approximation γ̂ (|γ − γ̂| <= err <= 1/2),
j = ⌊512·γ̂⌋ and f = γ̂ − j/512 ∈ [0, 1/512):

    e^{−γ} >= E⁻[j] · (1 − (f + err))                   since e^{−x} >= 1 − x
    e^{−γ} <= E⁺[j] · (1 − f + f²/2) · (1 + 2·err)      since e^{−f} <= 1 − f + f²/2 for f >= 0
                                                         and e^{err} <= 1 + 2·err for err <= 1/2

where E⁻ <= e^{−j/512} <= E⁺ are certified table entries rounded outwards. The factors are near 1
and evaluated in IEEE double (each operation correctly rounded), so an absolute slack of 2^−48
covers their rounding. The bounds are 2^−19 apart at worst: that is the share of lanes sent to
the exact branch.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from fractions import Fraction
from functools import lru_cache, partial

import numpy as np
from numpy.typing import ArrayLike, NDArray

from dpkit.errors import InvalidParameterError
from dpkit.noise._exact import _exp_neg_unit, exp_neg_bounds_fn, lazy_less
from dpkit.noise.source import RNG, RandomSource, resolve_rng

__all__ = ["bernoulli_exp"]

_STEPS = 512  # table resolution: e^{-j/512}
_GMAX = 48  # beyond γ = 48, e^{-γ} < 2^-69: only the bound E⁺[48·512]·2 is used
_JMAX = _STEPS * _GMAX
_SLACK = 2.0**-48
CHUNK = 1 << 15  # samplers work in cache-sized blocks: numpy is ~2x faster than on whole arrays


def _to_float(x: int, prec: int, up: bool) -> float:
    """x·2^-prec as a double, rounded down (or up), exactly: keep 53 significant bits."""
    shift = max(x.bit_length() - 53, 0)
    mant = (x >> shift) + (1 if up and x & ((1 << shift) - 1) else 0)
    return math.ldexp(mant, shift - prec)


@lru_cache(maxsize=1)
def _table() -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Certified outward-rounded doubles around e^{-j/512}, j = 0..JMAX."""
    prec = 160
    step_lo, step_hi = _exp_neg_unit(Fraction(1, _STEPS), prec)
    lo_i = hi_i = 1 << prec
    los, his = [], []
    for _ in range(_JMAX + 1):
        los.append(_to_float(lo_i, prec, up=False))
        his.append(_to_float(hi_i, prec, up=True))
        lo_i = lo_i * step_lo >> prec
        hi_i = -((-hi_i * step_hi) >> prec)
    return np.array(los), np.array(his)


def exp_neg_enclosure(
    gamma_hat: NDArray[np.float64], err: NDArray[np.float64] | float
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Doubles (lower, upper) with lower <= e^{-γ} <= upper whenever |γ − gamma_hat| <= err.

    ``gamma_hat`` must be >= 0. Lanes with err > 1/2 or γ̂ >= 48 get the trivial bounds (the
    exact branch then decides them, which is rare by construction).
    """
    tab_lo, tab_hi = _table()
    j = np.minimum(gamma_hat * _STEPS, _JMAX).astype(np.intp)  # truncation = floor for γ̂ >= 0
    f = gamma_hat - j * (1.0 / _STEPS)  # exact: Sterbenz for j >= 1, f = γ̂ for j = 0
    lower = tab_lo[j] * (1.0 - (f + err + _SLACK))
    upper = tab_hi[j] * ((1.0 - f + 0.5 * f * f) * (1.0 + 2.0 * err) + _SLACK)
    big_err = np.max(err) > 0.5
    if big_err or gamma_hat.size and gamma_hat.max() >= _GMAX:
        far = gamma_hat >= _GMAX
        lower = np.where(far | (err > 0.5), 0.0, lower)
        upper = np.where(far, tab_hi[_JMAX] * 2.0, upper)
        upper = np.where(err > 0.5, 1.0, upper)
    return lower, upper


def _ratio_at(num: NDArray[np.int64], den: NDArray[np.int64], i: int) -> Fraction:
    """The exact γ of lane i, num[i]/den[i]."""
    return Fraction(int(num[i]), int(den[i]))


def decide_exp_neg(
    gamma_hat: NDArray[np.float64],
    err: NDArray[np.float64] | float,
    prefix: NDArray[np.uint64],
    bits: int,
    exact_gamma: Callable[[int], Fraction],
    src: RandomSource,
) -> NDArray[np.bool_]:
    """U < e^{−γ} for each lane, exactly.

    ``prefix`` holds the first ``bits`` binary digits of each lane's uniform U, as an integer
    below 2^53 (so it converts to a double exactly); ``bits`` may exceed 53 — leading zero digits,
    i.e. U scaled into [0, 2^(53−bits)) — as long as 2^−bits is a normal double;
    ``gamma_hat`` approximates γ within ``err``; ``exact_gamma(i)`` returns lane i's exact γ for
    the rare lanes the enclosure cannot settle.
    """
    lower, upper = exp_neg_enclosure(gamma_hat, err)
    ulp = 2.0**-bits
    u = prefix.view(np.int64).astype(np.float64) * ulp  # exact: prefix < 2^53
    accept = (u + ulp) <= lower
    unsure = np.flatnonzero(~accept & (u < upper))
    for i in unsure:  # about one lane in 2^28: the exact branch
        accept[i] = lazy_less(int(prefix[i]), bits, exp_neg_bounds_fn(exact_gamma(int(i))), src)[0]
    return accept


def decide_exp_neg_small(
    gamma_hat: NDArray[np.float64],
    prefix: NDArray[np.uint64],
    bits: int,
    exact_gamma: Callable[[int], Fraction],
    src: RandomSource,
) -> NDArray[np.bool_]:
    """:func:`decide_exp_neg` for small γ, with ``gamma_hat`` within 2^−50 relative of γ.

    Most lanes are accepted by e^{−γ} >= 1 − γ >= 1 − γ̂(1 + 2^−50): the float evaluation errs by
    less than 2^−52 absolute, so 2^−50 more slack keeps it a lower bound. The rest (a share of
    about γ) take the full decision.
    """
    ulp = 2.0**-bits
    u = prefix.view(np.int64).astype(np.float64) * ulp
    ok = u + ulp <= 1.0 - gamma_hat * (1.0 + 2.0**-50) - 2.0**-50
    rest = np.flatnonzero(~ok)
    if rest.size:
        g = gamma_hat[rest]
        ok[rest] = decide_exp_neg(g, g * 2.0**-50, prefix[rest], bits, lambda i: exact_gamma(int(rest[i])), src)
    return ok


def bernoulli_exp(
    gamma_numerator: ArrayLike, gamma_denominator: ArrayLike = 1, *, rng: RNG = None
) -> NDArray[np.bool_]:
    """Independent Bernoulli(exp(−γ)) trials for rational γ = numerator / denominator >= 0, exactly.

    Vectorised over numpy arrays of integer numerators and denominators (broadcast together).
    The answer is exact — each trial is true with probability exactly e^{−γ} — although no
    per-lane exact arithmetic runs except in about one lane in 2^28 (see the module docstring).
    This is the primitive of Canonne, Kamath & Steinke (2020, Alg. 1) delivered without their
    per-sample loop.

    >>> import numpy as np
    >>> trials = bernoulli_exp(np.ones(100_000, dtype=np.int64), 1, rng=np.random.default_rng(0))
    >>> bool(abs(trials.mean() - np.exp(-1)) < 0.01)
    True
    """
    num = np.asarray(gamma_numerator)
    den = np.asarray(gamma_denominator)
    for name, arr in (("gamma_numerator", num), ("gamma_denominator", den)):
        if arr.dtype.kind not in "iu":
            raise InvalidParameterError(name, arr.dtype, "integers (numpy int arrays or Python ints)")
    num, den = np.broadcast_arrays(num.astype(np.int64), den.astype(np.int64))
    if np.any(num < 0):
        raise InvalidParameterError("gamma_numerator", int(num.min()), "integers >= 0 (γ >= 0)")
    if np.any(den <= 0):
        raise InvalidParameterError("gamma_denominator", int(den.min()), "integers > 0")
    shape = num.shape
    num, den = num.ravel(), den.ravel()
    src = resolve_rng(rng)
    out = np.empty(num.size, dtype=bool)
    for s in range(0, num.size, CHUNK):
        n_c, d_c = num[s : s + CHUNK], den[s : s + CHUNK]
        gamma_hat = n_c.astype(np.float64) / d_c.astype(np.float64)
        err = gamma_hat * 2.0**-50  # two int→float roundings and one division: <= 3·2^-53 relative
        prefix = src.words(n_c.size) >> np.uint64(11)
        out[s : s + CHUNK] = decide_exp_neg(gamma_hat, err, prefix, 53, partial(_ratio_at, n_c, d_c), src)
    return out.reshape(shape)
