"""Privacy loss distributions (PLD): tight, sound (ε, δ) for composed mechanisms.

The accountant records events (lazily: ``compose`` only validates and counts) and, when asked
for ε or δ, turns every distinct event into a discrete *dominating* privacy loss distribution
on the grid h·ℤ (h = ``value_discretization_interval``), composes them by FFT and reads the
hockey-stick divergence off the result (Meiser & Mohammadi 2018; Sommer, Meiser & Mohammadi
2019; Koskela, Jälkö & Honkela 2020; Doroshenko, Ghazi, Kamath, Kumar & Manurangsi 2022).

Theorem (what the numbers mean). Write δ_M(ε) = sup over neighbours D ≃ D' of
H_{e^ε}(M(D) ‖ M(D')), where H_α(P ‖ Q) = Σ_o (P(o) − α Q(o))₊ is the hockey-stick divergence.
For every recorded composition M = M_1 ∘ … ∘ M_n (adaptive) and every ε ≥ 0, δ ∈ [0, 1)::

    get_delta(ε)   >= δ_M(ε)              get_epsilon(δ) >= inf{ε >= 0 : δ_M(ε) <= δ}.

Proof sketch, one step per approximation, each of which can only raise every δ(ε):

1. *Dominating pairs.* Each event has a pair (P_i, Q_i) of distributions with
   δ_{M_i}(ε) <= H_{e^ε}(P_i ‖ Q_i) for all ε ∈ ℝ, in each direction of the neighbour relation
   (``remove``: D' = D minus one record; ``add``: the reverse): the Gaussian and Laplace
   location pairs, their Poisson-subsampled mixtures (Zhu, Dong & Wang 2022, Thm 11 / Prop. 30),
   the randomized-response output pair, and for ``PureDPEvent`` / ``ApproxDPEvent`` /
   ``ExponentialEvent`` the canonical binary pair of (ε, δ)-DP, which dominates every
   (ε, δ)-DP mechanism (Kairouz, Oh & Viswanath 2015, Thm 2.1).
2. *Connect-the-dots discretisation* (Doroshenko et al. 2022, Alg. 1). ε ↦ H_{e^ε} is a convex
   function of x = e^ε (a supremum of affine functions P(S) − x Q(S)). The grid PMF ω_i that, in
   every grid cell (a, a + h], splits the cell's P-mass between a and a + h so that the P-mass and
   the Q-mass (Σ ω(ℓ) e^{−ℓ}) of the cell are both preserved has δ_{ω_i}(ε) = H_{e^ε}(P_i ‖ Q_i) at
   every grid point and the chord in x between them — above a convex function. Mass outside the
   kept loss range moves *up*: above it to loss +∞ (counted in δ for every ε), below it onto
   the lowest grid point. Raising a loss raises every δ(ε), since (1 − e^{ε−ℓ})₊ grows with ℓ.
3. *Composition.* If ω_i dominates M_i (all ε ∈ ℝ), ω_1 ∗ … ∗ ω_n dominates the adaptive
   composition (Zhu, Dong & Wang 2022, Thm 10). k copies are one FFT power. The FFT is cyclic:
   the grid window [lo, hi] is chosen by Chernoff bounds so that at most τ mass lies above hi —
   that bound is added to the +∞ mass, because wrapped mass lands lower — and mass below lo wraps
   *upward* (harmless). All truncations together move at most 1e-15 of mass to +∞.
4. *Directions.* Under ``add_remove`` both directions are composed separately and the maximum
   δ (maximum ε) is reported, as dp_accounting does. The ``add`` PMF of a Poisson-subsampled
   mechanism is the exact reversal of its ``remove`` PMF (ω(ℓ) e^{−ℓ} at −ℓ), which preserves
   domination because reversing a pair inverts its trade-off function.
5. *Round-off* is bounded, not ignored: each PMF carries ``err``, a bound on how far any δ(ε)
   read from it can be from the exact arithmetic value — the componentwise FFT error bound
   |Ê_j| <= γ·‖p‖₁, γ = 8u·⌈log₂N⌉ (Higham 2002, §24.1), propagated through the k-th power
   (|ẑ^k − z^k| <= k|ẑ − z|(|ẑ| + γ)^{k−1}) and back by Parseval (‖Δr‖₁ <= ‖ΔW‖₂); CDF round-off
   moves mass by at most one cell, which changes δ by at most (mass moved)·h. ``err`` is added to
   every δ. A δ below the resulting numerical floor (at most ~1e-9 for 10⁵ DP-SGD steps) is
   refused with a clear error, except where the exact answer is known (bounded losses: δ = 0).

Gaussian events without subsampling compose exactly (k Gaussians of σ_i are one Gaussian with
μ² = Σ σ_i^{-2}); they are kept as one exact μ and, when nothing else was recorded, answered by the
analytic Gaussian curve (Balle & Wang 2018, Thm 8) with no discretisation at all.

Neighbours: the accountant has one relation; every event must carry the same one (noise
multipliers are relative to the sensitivity under that relation). Poisson subsampling is
supported under ``add_remove``; randomized response under ``replace`` (one respondent's answer
changes). If a grid would exceed 2²¹ cells (huge ε or huge counts) the grid is coarsened by a
power of two; the result stays sound, only looser.

>>> from dpkit.accounting.events import GaussianEvent, PoissonSampledEvent
>>> acc = PLDAccountant()
>>> _ = acc.compose(PoissonSampledEvent(0.01, GaussianEvent(1.0)), count=1000)
>>> round(acc.get_epsilon(1e-5), 2)
1.67
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from numbers import Integral, Real

import numpy as np
import scipy.fft as _fft
from scipy.signal import lfilter
from scipy.special import expit, ndtr, ndtri

from dpkit import _validate as v
from dpkit._validate import Neighbours
from dpkit.accounting.analytic_gaussian import gaussian_delta
from dpkit.accounting.events import (
    ApproxDPEvent,
    ComposedEvent,
    DPEvent,
    ExponentialEvent,
    GaussianEvent,
    LaplaceEvent,
    PoissonSampledEvent,
    PureDPEvent,
    RandomizedResponseEvent,
    SelfComposedEvent,
)
from dpkit.accounting.rounding import log_up, to_float_down, to_float_up
from dpkit.errors import InvalidParameterError

__all__ = ["PLDAccountant"]

_U = 2.0**-53  # unit round-off of float64
_TAIL = 1e-15  # total mass all tail truncations of one evaluation may move to loss +∞
_MAX_BINS = 1 << 21  # largest grid an FFT runs on; beyond it the grid coarsens (soundly)
_LOG_TINY = -745.0  # exp() of anything below is 0 in float64


class _Coarsen(Exception):
    """Internal: the grid needs to be ``factor`` times coarser to stay within _MAX_BINS."""

    def __init__(self, factor: float) -> None:
        super().__init__(factor)
        self.factor = factor


def _up(x: float, steps: int = 2) -> float:
    for _ in range(steps):
        x = math.nextafter(x, math.inf)
    return x


def _down(x: float, steps: int = 2) -> float:
    for _ in range(steps):
        x = math.nextafter(x, -math.inf)
    return x


# ----------------------------------------------------------------------------------------- PMF


@dataclass(frozen=True)
class _PMF:
    """A dominating PLD on the grid h·ℤ: mass ``probs[i]`` at loss (lo + i)·h, ``inf`` at +∞.

    ``inf_mech`` is the part of ``inf`` that the mechanisms themselves put there (no δ below it
    is reachable); ``err`` bounds the round-off in any δ(ε) read from this PMF; ``top`` (when
    not None) is a grid index no loss of the exact dominating PMF exceeds, and then that PMF has
    no mechanism mass at +∞ — so δ(ε) = 0 exactly for ε >= top·h.
    """

    lo: int
    probs: np.ndarray
    inf: float = 0.0
    inf_mech: float = 0.0
    err: float = 0.0
    top: int | None = None


def _fft_gamma(n: int) -> float:
    """Componentwise error bound factor of a length-n FFT: |fl(FFT x) − FFT x|_j <= γ·‖x‖₁."""
    return 8.0 * _U * max(1, math.ceil(math.log2(max(n, 2))))


def _add_inf(a: float, b: float) -> float:
    """1 − (1 − a)(1 − b), rounded up."""
    return min(1.0, _up(a + b - a * b))


def _split_cells(h: float, j0: int, TP: np.ndarray, CP: np.ndarray, TQ: np.ndarray, CQ: np.ndarray) -> tuple[np.ndarray, float]:
    """Connect-the-dots masses on grid points j0..j0+n−1 from tail probabilities there.

    TP[i] = P(L > ε_i), CP[i] = P(L <= ε_i) (both given so that each is accurate where small),
    same for Q. Cell (ε_i, ε_{i+1}] keeps its P-mass and its Q-mass; the P-mass at or below ε_0
    goes onto ε_0. Returns (probs, err) where err bounds the effect of round-off on any δ(ε).
    """
    n = TP.size
    probs = np.zeros(n)
    probs[0] = CP[0]
    if n == 1:
        return probs, 4 * _U
    useP = TP[:-1] <= 0.5
    Pm = np.where(useP, TP[:-1] - TP[1:], CP[1:] - CP[:-1])
    sP = np.where(useP, TP[:-1], CP[1:])
    useQ = TQ[:-1] <= 0.5
    Qm = np.where(useQ, TQ[:-1] - TQ[1:], CQ[1:] - CQ[:-1])
    sQ = np.where(useQ, TQ[:-1], CQ[1:])
    np.maximum(Pm, 0.0, out=Pm)
    np.maximum(Qm, 0.0, out=Qm)
    ea = np.exp(np.minimum((j0 + np.arange(n - 1)) * h, 700.0))
    w = -math.expm1(-h)
    pb = np.clip((Pm - ea * Qm) / w, 0.0, Pm)
    probs[:-1] += Pm - pb
    probs[1:] += pb
    # Round-off: tail probabilities are accurate to a few ulps; an error there (or in the split)
    # only moves mass by at most one cell, changing any δ(ε) by at most (mass moved)·h.
    moved = 16 * _U * float(np.sum(sP + Pm + np.minimum(ea * sQ, 1.0)))
    err = moved * h / w * 1.0001 + 16 * _U * (n * h + 1.0)
    return probs, err


def _from_tails(h: float, j0: int, TP: np.ndarray, CP: np.ndarray, TQ: np.ndarray, CQ: np.ndarray,
                *, top: int | None, inf_mech: float = 0.0) -> tuple[_PMF, float]:
    """A PMF from tail probabilities on the grid, plus the Q-mass it leaves uncovered (for
    the reversal): Q above the top grid point and the Q-excess of the bottom cell."""
    probs, err = _split_cells(h, j0, TP, CP, TQ, CQ)
    inf = _up(float(TP[-1]) + inf_mech) if TP[-1] > 0 or inf_mech > 0 else 0.0
    low_q = float(CQ[0]) - float(CP[0]) * math.exp(min(-j0 * h, 700.0))
    deficit = float(TQ[-1]) + max(0.0, low_q)
    return _PMF(j0, probs, min(inf, 1.0), inf_mech, err, top), deficit


def _from_atoms(h: float, losses: list[float], masses: list[float], *, inf: float = 0.0) -> _PMF:
    """Connect-the-dots for a finite PLD: each atom is split between its two grid neighbours
    keeping its P-mass and Q-mass. Losses must already be rounded up."""
    ls = np.asarray(losses, dtype=float)
    ms = np.asarray(masses, dtype=float)
    keep = ms > 0
    ls, ms = ls[keep], ms[keep]
    top = None
    if ls.size == 0:
        return _PMF(0, np.zeros(1), inf, inf, 0.0, 0 if inf == 0 else None)
    a = np.floor(ls / h)
    if np.max(np.abs(a)) > 2**52 or (a.max() - a.min() + 2) > _MAX_BINS:
        raise _Coarsen(max(2.0, (a.max() - a.min() + 2) / _MAX_BINS))
    frac = np.clip(ls - a * h, 0.0, h)
    frac = np.minimum(frac + 8 * _U * (np.abs(ls) + h), h)  # round the split up
    pb = ms * (-np.expm1(-frac)) / (-math.expm1(-h))
    pb = np.minimum(pb, ms)
    ai = a.astype(np.int64)
    lo = int(ai.min())
    size = int(ai.max()) - lo + 2
    probs = np.bincount(ai - lo, weights=ms - pb, minlength=size) + np.bincount(ai - lo + 1, weights=pb, minlength=size)
    if inf == 0:
        top = lo + size - 1
    return _PMF(lo, probs[:size], inf, inf, 8 * _U * float(ms.sum()), top)


def _reverse_pmf(p: _PMF, deficit: float, h: float, top: int | None) -> _PMF:
    """The PMF of the reversed pair (Q, P): mass ω(ℓ)e^{−ℓ} at −ℓ. The Q-mass the grid leaves
    uncovered (``deficit``) has P-mass 0, i.e. loss +∞ in the reversed pair; P's +∞ mass has
    Q-mass 0 and disappears. ``top`` is the exact support bound when the caller knows one."""
    n = p.probs.size
    losses = (p.lo + np.arange(n)) * h
    pos = p.probs > 0
    lp = np.full(n, -np.inf)
    np.log(p.probs, out=lp, where=pos)
    q = np.exp(np.minimum(lp - losses, 0.0))  # the exact value is a Q-mass, <= 1
    inf = min(1.0, _up(deficit + 8 * _U))
    return _PMF(-(p.lo + n - 1), q[::-1].copy(), inf, 0.0, p.err + 8 * _U, top)


# ------------------------------------------------------------------------------ mechanisms


def _grid_size_ok(j0: int, j1: int) -> None:
    if j1 - j0 + 1 > _MAX_BINS:
        raise _Coarsen((j1 - j0 + 1) / _MAX_BINS)


def _phi_pair(y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(Φ(y), Φ(−y)), each accurate to a few ulps relative where it is the smaller one."""
    small = ndtr(-np.abs(y))
    big = 1.0 - small
    neg = y < 0
    return np.where(neg, small, big), np.where(neg, big, small)


def _gaussian(mu: float, h: float, tau: float) -> _PMF:
    """N(μ²/2, μ²) under P and N(−μ²/2, μ²) under Q (the Gaussian mechanism with μ = Δ/σ);
    symmetric. Loss mass beyond ±z·μ of the mean (z = Φ⁻¹(1 − τ)) moves to +∞ / the bottom."""
    z = -float(ndtri(tau))
    m = mu * mu / 2
    j0 = math.floor((m - z * mu) / h)
    j1 = math.ceil((m + z * mu) / h)
    _grid_size_ok(j0, j1)
    eps = (j0 + np.arange(j1 - j0 + 1)) * h
    CP, TP = _phi_pair((eps - m) / mu)
    CQ, TQ = _phi_pair((eps + m) / mu)
    pmf, _ = _from_tails(h, j0, TP, CP, TQ, CQ, top=None)
    return pmf


def _log_ratio_threshold(eps: np.ndarray, q: float) -> np.ndarray:
    """ln r with r = 1 + (e^ε − 1)/q: the un-subsampled loss whose subsampled loss
    ln(1 − q + q e^ρ) equals ε; −∞ where ε <= ln(1 − q)."""
    out = np.full(eps.shape, -np.inf)
    if q == 1.0:
        return eps.copy()
    lmin = math.log1p(-q)
    ok = eps > lmin
    small = ok & (eps < 1.0)
    big = ok & ~small
    with np.errstate(divide="ignore", invalid="ignore"):
        out[small] = np.log1p(np.expm1(eps[small]) / q)
        out[big] = eps[big] - math.log(q) + np.log1p(-(1 - q) * np.exp(-eps[big]))
    return out


def _subsampled_gaussian(sigma: float, q: float, h: float, tau: float) -> tuple[_PMF, float]:
    """``remove`` PMF of Poisson(q)-subsampled N(0, σ²) with sensitivity 1:
    P = (1−q)N(0, σ²) + qN(−1, σ²), Q = N(0, σ²), loss ln(1 − q + q e^{−(2x+1)/(2σ²)}),
    decreasing in x. Returns (pmf, Q-mass not covered) for the reversal to ``add``."""
    z = -float(ndtri(tau))
    s2 = sigma * sigma
    x_lo = -1.0 - z * sigma  # P(x < x_lo) <= Φ(−z) <= τ
    lmin = math.log1p(-q)
    lmax = float(np.logaddexp(lmin, math.log(q) - (2 * x_lo + 1) / (2 * s2)))
    j0 = math.floor(lmin / h)
    j1 = math.ceil(lmax / h)
    _grid_size_ok(j0, j1)
    eps = (j0 + np.arange(j1 - j0 + 1)) * h
    lr = _log_ratio_threshold(eps, q)
    with np.errstate(invalid="ignore"):
        x = -s2 * lr - 0.5  # loss > ε  ⇔  x < x(ε); +∞ where lr = −∞
    F1, S1 = _phi_pair(x / sigma)
    F2, S2 = _phi_pair((x + 1.0) / sigma)
    TP = (1 - q) * F1 + q * F2
    CP = (1 - q) * S1 + q * S2
    return _from_tails(h, j0, TP, CP, F1, S1, top=None)


def _laplace_cdf_pair(x: np.ndarray, b: float) -> tuple[np.ndarray, np.ndarray]:
    """(F(x), 1 − F(x)) of Laplace(0, b), each accurate where small."""
    small = 0.5 * np.exp(-np.abs(x) / b)
    big = 1.0 - small
    neg = x < 0
    return np.where(neg, small, big), np.where(neg, big, small)


def _laplace(b: float, q: float, h: float) -> tuple[_PMF, float, int]:
    """``remove`` PMF of Poisson(q)-subsampled Laplace(b) with sensitivity 1 (q = 1: plain):
    P = (1−q)Lap(0, b) + qLap(−1, b), Q = Lap(0, b); loss ln(1 − q + q e^{ρ(x)}) with
    ρ(x) = (|x| − |x+1|)/b ∈ [−1/b, 1/b]. Bounded losses, no truncation, no mass at +∞.
    Returns (pmf, Q-mass not covered, lowest grid index)."""
    ib = 1.0 / b
    if q == 1.0:
        lmax, lmin = ib, -ib
    else:
        lq, l1q = math.log(q), math.log1p(-q)
        lmax = float(np.logaddexp(l1q, lq + ib))
        lmin = float(np.logaddexp(l1q, lq - ib))
    j0 = math.floor(_down(lmin, 4) / h)
    j1 = math.ceil(_up(lmax, 4) / h)
    _grid_size_ok(j0, j1)
    eps = (j0 + np.arange(j1 - j0 + 1)) * h
    lr = _log_ratio_threshold(eps, q)
    x = np.where(lr >= ib, -np.inf, np.where(lr < -ib, np.inf, -(b * np.clip(lr, -ib, ib) + 1.0) / 2.0))
    F1, S1 = _laplace_cdf_pair(x, b)
    F2, S2 = _laplace_cdf_pair(x + 1.0, b)
    TP = (1 - q) * F1 + q * F2
    CP = (1 - q) * S1 + q * S2
    pmf, deficit = _from_tails(h, j0, TP, CP, F1, S1, top=j1)
    return pmf, deficit, j0


# ------------------------------------------------------------------- composition by FFT


def _log_mgf(probs: np.ndarray, x: np.ndarray, lams: np.ndarray) -> np.ndarray:
    """ln Σ_i p_i e^{λ x_i} for each λ, rounded up (an upper bound)."""
    pos = probs > 0
    lp = np.log(probs[pos])
    xs = x[pos]
    v = lams[:, None] * xs[None, :] + lp[None, :]
    mx = v.max(axis=1)
    s = np.exp(v - mx[:, None]).sum(axis=1)
    return mx + np.log(s) + (xs.size + 8) * 4 * _U * (1 + np.abs(mx))


def _window(probs: np.ndarray, k: int, h: float, tau: float) -> tuple[int, int, float]:
    """Index offsets [lo, hi] of the k-fold sum of offsets of ``probs`` such that, by
    Chernoff, mass above hi is <= tau/2 and mass below lo is <= tau/2. Returns (lo, hi,
    bound on the mass above hi — 0 when hi is the true maximum)."""
    n = probs.size
    full_hi = k * (n - 1)
    x = np.arange(n) * h
    mass = float(probs.sum())
    if mass <= 0:
        return 0, 0, 0.0
    mean = float(probs @ x) / mass
    var = max(float(probs @ (x - mean) ** 2) / mass, (h * h) / 12)
    c = math.log(2.0 / tau)
    lam0 = math.sqrt(2 * c / (k * var))
    lams = lam0 * 2.0 ** (np.arange(-8, 9) / 2.0)
    lm_pos = _log_mgf(probs, x, lams)
    lm_neg = _log_mgf(probs, x, -lams)
    t_hi = float(np.min((k * lm_pos + c) / lams))
    t_lo = float(np.max(-(k * lm_neg + c) / lams))
    if not math.isfinite(t_hi) or t_hi / h >= full_hi:
        hi, tail = full_hi, 0.0
    else:
        hi, tail = max(0, math.ceil(t_hi / h)), tau / 2
    lo = 0 if not math.isfinite(t_lo) else min(max(0, math.floor(t_lo / h)), hi)
    return lo, hi, tail


def _trim(lo: int, probs: np.ndarray, tau: float) -> tuple[int, np.ndarray, float]:
    """Drop top cells holding <= tau/2 in total (to +∞; returned) and bottom cells holding
    <= tau/2 (their mass moves up onto the lowest kept cell)."""
    n = probs.size
    if n <= 1 or tau <= 0:
        return lo, probs, 0.0
    top_c = np.cumsum(probs[::-1])
    k_top = int(np.searchsorted(top_c, tau / 2, side="right"))  # cells at the top with sum <= tau/2
    k_top = min(k_top, n - 1)
    to_inf = float(top_c[k_top - 1]) if k_top > 0 else 0.0
    bot_c = np.cumsum(probs)
    k_bot = int(np.searchsorted(bot_c, tau / 2, side="right"))
    k_bot = min(k_bot, n - 1 - k_top)
    out = probs[k_bot : n - k_top].copy()
    if k_bot > 0:
        out[0] += float(bot_c[k_bot - 1])
    return lo + k_bot, out, _up(to_inf * (1 + n * _U)) if to_inf > 0 else 0.0


def _power(p: _PMF, k: int, h: float, tau: float) -> _PMF:
    """k-fold self-convolution by one FFT power (cyclic, on a Chernoff-sized window)."""
    if k == 1:
        return p
    inf_mech = 1.0 if p.inf_mech >= 1 else min(1.0, _up(-math.expm1(k * math.log1p(-p.inf_mech))))
    inf = 1.0 if p.inf >= 1 else min(1.0, _up(-math.expm1(k * math.log1p(-p.inf)), 4))
    top = None if p.top is None else k * p.top
    n = p.probs.size
    if n == 1:
        mass = float(p.probs[0]) ** k
        return _PMF(k * p.lo, np.array([_up(mass)]), inf, inf_mech, k * p.err + 4 * _U, top)
    lo_o, hi_o, tail = _window(p.probs, k, h, tau)
    width = hi_o - lo_o + 1
    if width > _MAX_BINS:
        raise _Coarsen(width / _MAX_BINS)
    full = k * (n - 1) + 1
    N = _fft.next_fast_len(max(width, n), real=True)
    if N >= full:
        N = _fft.next_fast_len(full, real=True)
        start, tail, length = 0, 0.0, full
    else:
        start, length = hi_o - N + 1, N
    Z = _fft.rfft(p.probs, N)
    re, im = Z.real, Z.imag
    with np.errstate(divide="ignore"):
        la = 0.5 * k * np.log(re * re + im * im)  # k·ln|ẑ|
    keep = np.flatnonzero(la > _LOG_TINY)
    kth = np.arctan2(im[keep], re[keep]) * float(k)
    mag = np.exp(la[keep])
    W = np.zeros_like(Z)
    W.real[keep] = mag * np.cos(kth)
    W.imag[keep] = mag * np.sin(kth)
    r = _fft.irfft(W, N)
    if start:
        r = np.roll(r, -(start % N))
    r = np.maximum(r[:length], 0.0)
    # Round-off bound (see the module docstring, step 5).
    gam = _fft_gamma(N) * max(1.0, float(np.sum(p.probs)))
    absz = np.sqrt(re * re + im * im)
    with np.errstate(divide="ignore"):
        lg = (k - 1) * np.log(absz + gam)
    c_fwd = k * gam * np.exp(np.minimum(lg, 700.0))
    c_pow = mag * (2 * _U * np.abs(kth) + 2 * _U * k + 4 * _U * np.abs(la[keep]) + 8 * _U)
    l2 = math.sqrt(2.0 * (float(c_fwd @ c_fwd) + float(c_pow @ c_pow)))
    inv = _fft_gamma(N) * min(2.0 * float(mag.sum()), math.sqrt(N) * max(1.0, float(np.linalg.norm(r))))
    err = k * p.err + l2 + inv + N * 1e-300
    lo_new, probs, to_inf = _trim(k * p.lo + start, r, tau / 2)
    inf = _add_inf(_add_inf(inf, tail), to_inf)
    return _PMF(lo_new, probs, inf, inf_mech, err, top)


def _convolve(a: _PMF, b: _PMF, tau: float) -> _PMF:
    """Linear convolution (FFT, or direct when one side is tiny), tails trimmed by tau."""
    na, nb = a.probs.size, b.probs.size
    n = na + nb - 1
    if min(na, nb) <= 64:
        r = np.convolve(a.probs, b.probs)
        fft_err = min(na, nb) * 2 * _U * float(a.probs.sum()) * float(b.probs.sum())
    else:
        N = _fft.next_fast_len(n, real=True)
        A = _fft.rfft(a.probs, N)
        B = _fft.rfft(b.probs, N)
        W = A * B
        r = _fft.irfft(W, N)[:n]
        g = _fft_gamma(N)
        ga, gb = g * float(a.probs.sum()), g * float(b.probs.sum())
        absA, absB = np.abs(A), np.abs(B)
        c = ga * (absB + gb) + gb * absA + 2 * _U * absA * absB
        l2 = math.sqrt(2.0 * float(c @ c))
        inv = g * min(2.0 * float(np.sum(absA * absB)), math.sqrt(N) * max(1.0, float(np.linalg.norm(r))))
        fft_err = l2 + inv
    r = np.maximum(r, 0.0)
    inf = _add_inf(a.inf, b.inf)
    inf_mech = _add_inf(a.inf_mech, b.inf_mech) if (a.inf_mech or b.inf_mech) else 0.0
    top = None if a.top is None or b.top is None else a.top + b.top
    lo, probs, to_inf = _trim(a.lo + b.lo, r, tau)
    if probs.size > _MAX_BINS:
        raise _Coarsen(probs.size / _MAX_BINS)
    return _PMF(lo, probs, _add_inf(inf, to_inf), inf_mech, a.err + b.err + fft_err, top)


# ----------------------------------------------------------------------------- queries


def _delta_of(p: _PMF, h: float, eps: float) -> float:
    """δ(ε) = inf + Σ_{ℓ > ε} ω(ℓ)(1 − e^{ε−ℓ}) + err, rounded up (at most 1)."""
    if p.top is not None and eps >= p.top * h:
        return 0.0
    n = p.probs.size
    i0 = min(n, max(0, math.floor(eps / h) - p.lo))
    q = p.probs[i0:]
    losses = (p.lo + i0 + np.arange(q.size)) * h
    w = np.maximum(-np.expm1(eps - losses), 0.0)
    fin = float(q @ w) * (1 + (q.size + 8) * _U)
    return min(1.0, _up(p.inf + fin + p.err, 4))


