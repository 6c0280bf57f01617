"""Privacy loss distributions (PLD): tight, sound (ε, δ) for composed mechanisms.

The accountant records events (lazily: ``compose`` validates and counts, nothing more) and,
when asked for ε or δ, turns every distinct event into a discrete *dominating* privacy loss
distribution on the grid h·ℤ (h = ``value_discretization_interval``), composes them all at once
in the frequency domain and reads the hockey-stick divergence off the result (Meiser &
Mohammadi 2018; Sommer, Meiser & Mohammadi 2019; Koskela, Jälkö & Honkela 2020; Doroshenko,
Ghazi, Kamath, Kumar & Manurangsi 2022; Zhu, Dong & Wang 2022).

Theorem (what the numbers mean). Write δ_M(ε) = sup over neighbours D ≃ D' of
H_{e^ε}(M(D) ‖ M(D')), where H_α(P ‖ Q) = Σ_o (P(o) − α Q(o))₊ is the hockey-stick divergence.
For every recorded composition M = M_1 ∘ … ∘ M_n (adaptive) and every ε >= 0, δ ∈ [0, 1)::

    get_delta(ε)   >= δ_M(ε)              get_epsilon(δ) >= inf{ε >= 0 : δ_M(ε) <= δ}.

Proof, one step per approximation; each step can only raise δ(ε), for every ε:

1. *Dominating pairs.* Each event has a pair (P_i, Q_i) with δ_{M_i}(ε) <= H_{e^ε}(P_i ‖ Q_i)
   for all ε ∈ ℝ, per direction of the neighbour relation (``remove``: the record is in the
   first dataset; ``add``: in the second): the Gaussian and Laplace location pairs N(1, σ²) vs
   N(0, σ²) and Lap(1, b) vs Lap(0, b) (noise relative to the sensitivity); their Poisson(q)
   mixtures (qP + (1−q)Q, Q) for ``remove`` and the reverse for ``add`` (Zhu, Dong & Wang 2022,
   subsampling of dominating pairs; dp_accounting's PLD notes); the randomized-response output
   pair; and for ``PureDPEvent`` / ``ExponentialEvent`` / ``ApproxDPEvent`` the canonical binary
   pair of (ε, δ)-DP, which dominates every (ε, δ)-DP mechanism (Kairouz, Oh & Viswanath 2015).
2. *Connect-the-dots discretisation* (Doroshenko et al. 2022, Alg. 1). ε ↦ H_{e^ε} is convex in
   x = e^ε (a supremum of the affine functions P(S) − x Q(S)). Splitting each cell's P-mass
   between its two grid ends so that the cell's P-mass and Q-mass (Σ ω(ℓ)e^{−ℓ}) are both kept
   gives a PMF ω_i whose curve equals H_{e^ε}(P_i ‖ Q_i) at the cell ends and is the chord in x
   between them — above the convex curve; below the lowest point it is the chord from x = 0.
   Mass outside the kept range moves *up*: above it to loss +∞ (counted in δ for every ε),
   below it onto the lowest grid point. Raising a loss raises every δ(ε), since
   (1 − e^{ε−ℓ})₊ grows with ℓ. (Where a block of 64 cells holds < 1e-15 of mass it is one
   wide cell; the argument is unchanged.)
3. *Composition.* If ω_i dominates M_i for all ε ∈ ℝ, ω_1 ∗ … ∗ ω_n dominates the adaptive
   composition (Zhu, Dong & Wang 2022, composition of dominating pairs). The convolution is the
   product Π ẑ_i^{k_i} of the discrete Fourier transforms (k_i copies of event i: one power, not
   k_i convolutions; many events used once are first convolved pairwise on the grid), on a
   cyclic window of N cells chosen by a Chernoff bound: at most τ/2 of
   mass lies above the window — that bound is added to the mass at +∞, because it wraps to lower
   losses — and at most τ/2 below it, which wraps *upward* (harmless). All truncations of one
   evaluation together move at most 1e-15 of mass to +∞.
4. *Reading δ.* δ(ε) = m_∞ + Σ_{ℓ>ε} r(ℓ)(1 − e^{ε−ℓ}). When few Fourier coefficients survive
   the powers (the usual case for many compositions) this sum is evaluated from the spectrum by
   Parseval, the weights' transform being two geometric series in closed form; otherwise the
   spectrum is inverted to the grid and the sum taken there. get_epsilon returns an ε at which δ
   was evaluated to be <= the target (exact piecewise solve on the grid; bracketed search on a
   spectrum), so it is never below the true ε.
5. *Directions.* Under ``add_remove`` both directions are composed and the larger δ (ε) is
   reported, as dp_accounting does. The ``add`` PMF of a subsampled mechanism is the exact
   reversal of its ``remove`` PMF (mass ω(ℓ)e^{−ℓ} at −ℓ; uncovered Q-mass to +∞), which keeps
   domination because reversing a pair inverts its trade-off function.
6. *Round-off* is bounded, not ignored: every PMF carries ``err``, a bound on |δ_computed −
   δ_exact| for every ε, added to every δ reported. Per event: connect-the-dots reproduces the
   hockey-stick values it is given at the grid points, so tail probabilities accurate to a few
   ulps give a curve accurate to 48u (u = 2⁻⁵³) everywhere; composing multiplies that by the
   number of copies at most, since the δ of a composition is an average of one factor's curve
   over the other factors' losses. The FFT: componentwise |ẑ_j − z_j| <= γ‖p‖₁ with
   γ = 8u⌈log₂N⌉ (Higham 2002, ch. 24), through the powers |Π ẑ_i^{k_i} − Π z_i^{k_i}| <=
   Π(|ẑ_i|+γ)^{k_i} Σ k_iγ/(|ẑ_i|+γ), back to losses by Parseval (‖Δr‖₁ <= ‖ΔW‖₂). The floor
   grows about linearly with the number of compositions (~1e-9 for 23,500 DP-SGD steps). A δ at
   or below it is refused with a clear error — except where the exact answer is known
   (bounded losses and no mass at +∞, e.g. Laplace: then ε = the largest loss, which also
   answers δ = 0).

Gaussian events without subsampling compose exactly (Gaussians of σ_i are one Gaussian with
μ² = Σ σ_i^{-2}); they are kept as one exact μ and, when nothing else was recorded, answered by the
analytic Gaussian curve (Balle & Wang 2018, Thm 8) with no discretisation at all.

Neighbours: the accountant has one relation; every event must carry the same one (noise
multipliers are relative to the sensitivity under that relation). Poisson subsampling is
supported under ``add_remove``, randomized response under ``replace`` (one respondent's answer
changes). If a grid would exceed 2²¹ cells (huge ε or huge counts) it is coarsened by a power of
two: the answer stays sound, only less tight.

>>> from dpkit.accounting.events import GaussianEvent, PoissonSampledEvent
>>> acc = PLDAccountant()
>>> _ = acc.compose(PoissonSampledEvent(0.01, GaussianEvent(1.0)), count=1000)
>>> round(acc.get_epsilon(1e-5), 2)   # dp_accounting's PLD: 1.8282
1.83
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
from dpkit.accounting.rounding import down2, log_up, to_float_down, to_float_up, up2
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
    if a == 0 or b == 0:
        return a + b
    return min(1.0, up2(a + b - a * b))


_Tails = Callable[[np.ndarray], tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]
_BLOCK = 64  # coarse cell width (grid steps) where a block holds almost no mass
_THETA = 1e-15  # a coarse cell holding more P-mass than this is refined to single steps


def _masses(T: np.ndarray, C: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Cell masses between consecutive points from upper tails T and lower tails C, each
    difference taken on the side where it is small (accurate); and the magnitude differenced."""
    use = T[:-1] <= 0.5
    m = np.where(use, T[:-1] - T[1:], C[1:] - C[:-1])
    np.maximum(m, 0.0, out=m)
    return m, np.where(use, T[:-1], C[1:])


def _ctd(h: float, j0: int, j1: int, tails: _Tails, *, top: int | None) -> tuple[_PMF, float]:
    """Connect-the-dots PMF on grid points j0..j1 (Doroshenko et al. 2022, Alg. 1).

    ``tails(ε)`` returns (P(L > ε), P(L <= ε), Q(L > ε), Q(L <= ε)). Every cell (a, b] between
    consecutive support points keeps its P-mass and Q-mass, split between a and b; P-mass at or
    below ε_{j0} goes onto ε_{j0}; P-mass above ε_{j1} goes to +∞. Cells are one grid step wide
    except in blocks of ``_BLOCK`` steps holding at most ``_THETA`` of P-mass, which stay one
    cell (still exact at their ends, so still dominating). Returns (pmf, Q-mass not covered by
    the finite grid: Q above ε_{j1} plus the Q-excess of the bottom point), the latter for
    :func:`_reverse_pmf`.
    """
    n = j1 - j0 + 1
    if n > _BLOCK * 4:
        coarse = np.unique(np.r_[np.arange(0, n, _BLOCK), n - 1])
        TP, CP, _, _ = tails((j0 + coarse) * h)
        pm, _ = _masses(TP, CP)
        mask = np.zeros(n, dtype=bool)
        mask[coarse] = True
        for i in np.flatnonzero(pm > _THETA):  # few refined runs; each a slice assignment
            mask[coarse[i] : coarse[i + 1]] = True
        idx = np.flatnonzero(mask)
    else:
        idx = np.arange(n)
    TP, CP, TQ, CQ = tails((j0 + idx) * h)
    probs = np.zeros(n)
    probs[0] = CP[0]
    if idx.size > 1:
        Pm, _ = _masses(TP, CP)
        Qm, _ = _masses(TQ, CQ)
        ea = np.exp(np.minimum((j0 + idx[:-1]) * h, 700.0))
        w = -np.expm1(-np.diff(idx) * h)
        pb = np.clip((Pm - ea * Qm) / w, 0.0, Pm)
        probs[idx[:-1]] += Pm - pb
        probs[idx[1:]] += pb
    # Round-off. Connect-the-dots reproduces the hockey-stick values it is given exactly at
    # the grid points: δ̃(ε_i) = T̃P_i − e^{ε_i} T̃Q_i, chords in between. With tail
    # probabilities accurate to 8u relative (ndtr, a mixture: a few ulps), and e^{ε}·Q(L > ε)
    # <= P(L > ε) (e^{ε}·Q(L <= ε) <= 2 where that branch is used), the curve is off by at most
    # 24u anywhere; rounding in the split (3u·cell mass, moved within the cell) and in the
    # accumulation (2u) add at most 5u more.
    err = 48 * _U
    inf = min(1.0, up2(float(TP[-1]))) if TP[-1] > 0 else 0.0
    low_q = float(CQ[0]) - float(CP[0]) * math.exp(min(-j0 * h, 700.0))
    deficit = float(TQ[-1]) + max(0.0, low_q)
    return _PMF(j0, probs, inf, 0.0, err, top), deficit


def _from_atoms(h: float, losses: list[float], masses: list[float], *, inf: float = 0.0) -> _PMF:
    """Connect-the-dots for a finite PLD: an atom of P-mass m at loss ℓ ∈ [a, a + h) becomes
    m(1 − e^{−(ℓ−a)})/(1 − e^{−h}) at a + h and the rest at a (P-mass and Q-mass kept). The
    cell of each atom is found in exact arithmetic and the upper share is rounded up. Losses
    must already be rounded up; ``inf`` is the mechanism's own mass at loss +∞."""
    fh = Fraction(h)
    cells, shares, ms = [], [], []
    for loss, m in zip(losses, masses):
        if m <= 0:
            continue
        a = math.floor(Fraction(loss) / fh)
        frac = to_float_up(Fraction(loss) - a * fh)
        cells.append(a)
        ms.append(m)
        shares.append(min(m, up2(m * -math.expm1(-frac) / -math.expm1(-h), 4)) if frac > 0 else 0.0)
    if not cells:
        return _PMF(0, np.zeros(1), inf, inf, 0.0, None if inf else 0)
    lo, hi = min(cells), max(cells) + 1
    if hi - lo + 1 > _MAX_BINS:
        raise _Coarsen((hi - lo + 1) / _MAX_BINS)
    probs = np.zeros(hi - lo + 1)
    for a, m, up in zip(cells, ms, shares):
        probs[a - lo] += m - up
        probs[a - lo + 1] += up
    top = None if inf else (hi if probs[-1] > 0 else hi - 1)
    return _PMF(lo, probs, inf, inf, 8 * _U * float(sum(ms)), top)


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
    inf = min(1.0, up2(deficit * (1 + 16 * _U))) if deficit > 0 else 0.0
    # The reversed curve is δ'(ε) = 1 − e^ε + e^ε δ(−ε): an error η in δ becomes e^ε η, and
    # δ' vanishes above the reversed PMF's largest loss −lo·h.
    grow = math.exp(min(max(0.0, -p.lo * h), 700.0))
    return _PMF(-(p.lo + n - 1), q[::-1].copy(), inf, 0.0, p.err * grow + 8 * _U, top)


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


def _grid_index_up(x: float, h: float) -> int:
    """The smallest j with j·h >= x, in exact arithmetic on the two doubles."""
    return math.ceil(Fraction(x) / Fraction(h))


def _grid_index_down(x: float, h: float) -> int:
    return math.floor(Fraction(x) / Fraction(h))


def _gaussian(mu: float, h: float, tau: float) -> _PMF:
    """N(μ²/2, μ²) under P and N(−μ²/2, μ²) under Q (the Gaussian mechanism with μ = Δ/σ);
    symmetric. Loss mass beyond ±z·μ of the mean (z = Φ⁻¹(1 − τ)) moves to +∞ / the bottom."""
    z = -float(ndtri(tau))
    m = mu * mu / 2
    j0 = math.floor((m - z * mu) / h)
    j1 = math.ceil((m + z * mu) / h)
    _grid_size_ok(j0, j1)

    def tails(eps: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        CP, TP = _phi_pair((eps - m) / mu)
        CQ, TQ = _phi_pair((eps + m) / mu)
        return TP, CP, TQ, CQ

    pmf, _ = _ctd(h, j0, j1, tails, top=None)
    return pmf


def _log_ratio_threshold(eps: np.ndarray, q: float) -> np.ndarray:
    """ln r with r = 1 + (e^ε − 1)/q: the un-subsampled loss whose subsampled loss
    ln(1 − q + q e^ρ) equals ε; −∞ where ε <= ln(1 − q)."""
    if q == 1.0:
        return eps.copy()
    out = np.full(eps.shape, -np.inf)
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
    x_lo = -1.0 - z * sigma  # P(x < x_lo) <= Φ(−z) = τ
    lmin = math.log1p(-q)
    lmax = float(np.logaddexp(lmin, math.log(q) - (2 * x_lo + 1) / (2 * s2)))
    j0 = math.floor(lmin / h)  # below ln(1 − q): no loss, the bottom cell is empty
    j1 = math.ceil(lmax / h)
    _grid_size_ok(j0, j1)

    def tails(eps: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        with np.errstate(invalid="ignore"):
            x = -s2 * _log_ratio_threshold(eps, q) - 0.5  # loss > ε ⇔ x < x(ε); +∞ below ln(1−q)
        F1, S1 = _phi_pair(x / sigma)
        F2, S2 = _phi_pair((x + 1.0) / sigma)
        return (1 - q) * F1 + q * F2, (1 - q) * S1 + q * S2, F1, S1

    return _ctd(h, j0, j1, tails, top=None)


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
        lmax, lmin = to_float_up(1 / Fraction(b)), to_float_down(-1 / Fraction(b))
    else:
        lq, l1q = math.log(q), math.log1p(-q)
        lmax = up2(float(np.logaddexp(l1q, lq + ib)), 8)
        lmin = down2(float(np.logaddexp(l1q, lq - ib)), 8)
    j0 = _grid_index_down(lmin, h)
    j1 = _grid_index_up(lmax, h)
    _grid_size_ok(j0, j1)

    def tails(eps: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        lr = _log_ratio_threshold(eps, q)
        x = np.where(lr >= ib, -np.inf, np.where(lr < -ib, np.inf, -(b * np.clip(lr, -ib, ib) + 1.0) / 2.0))
        F1, S1 = _laplace_cdf_pair(x, b)
        F2, S2 = _laplace_cdf_pair(x + 1.0, b)
        return (1 - q) * F1 + q * F2, (1 - q) * S1 + q * S2, F1, S1

    pmf, deficit = _ctd(h, j0, j1, tails, top=j1)
    return pmf, deficit, j0


# ------------------------------------------------------------------- composition by FFT


class _MGF:
    """ln Σ_i p_i e^{λ x_i} (x_i = i·h) of a PMF, evaluated on demand, rounded up."""

    def __init__(self, probs: np.ndarray, h: float) -> None:
        self.probs, self.h = probs, h
        self.lp: np.ndarray | None = None

    def __call__(self, lam: float) -> float:
        if self.lp is None:  # computed on first use
            pos = np.flatnonzero(self.probs > 0)
            self.lp, self.x = np.log(self.probs[pos]), pos * self.h
            self.slack = (pos.size + 8) * 4 * _U
        v = lam * self.x + self.lp
        mx = float(v.max())
        out = mx + math.log(float(np.exp(v - mx).sum()))
        return out + self.slack * (1 + abs(out))


class _ReversedMGF:
    """The MGF of ``_reverse_pmf(p)`` from that of p, without touching the array:
    Σ_j q_j e^{λ x'_j} = e^{λ(n−1)h − lo·h} Σ_i p_i e^{−(1+λ) x_i} (q_j = p_i e^{−ℓ_i} at −ℓ_i)."""

    def __init__(self, base: _MGF, p: _PMF, h: float) -> None:
        self.base, self.span, self.shift = base, (p.probs.size - 1) * h, p.lo * h

    def __call__(self, lam: float) -> float:
        out = lam * self.span - self.shift + self.base(-1.0 - lam)
        return out + 16 * _U * (1 + abs(out))


def _chernoff(logmgf: Callable[[float], float], c: float, lam0: float, sign: int) -> float:
    """min over λ > 0 of (Λ(sign·λ) + c)/λ, by golden-section search on ln λ. The objective is
    quasi-convex in λ; any λ gives a valid Chernoff bound, the search only makes it tight."""

    def f(u: float) -> float:
        lam = math.exp(u)
        return (logmgf(sign * lam) + c) / lam

    a, b = math.log(lam0) - 4.0, math.log(lam0) + 4.0
    g = (math.sqrt(5) - 1) / 2
    x1, x2 = b - g * (b - a), a + g * (b - a)
    f1, f2 = f(x1), f(x2)
    best = min(f1, f2)
    for _ in range(8):
        if f1 <= f2:
            b, x2, f2 = x2, x1, f1
            x1 = b - g * (b - a)
            f1 = f(x1)
        else:
            a, x1, f1 = x1, x2, f2
            x2 = a + g * (b - a)
            f2 = f(x2)
        best = min(best, f1, f2)
    return best


@dataclass(frozen=True)
class _Part:
    """``count`` copies of one PMF in one direction, with the MGF of its offsets."""

    pmf: _PMF
    count: int
    mgf: Callable[[float], float]


@dataclass(frozen=True)
class _Window:
    lo: int  # offsets (from Σ count·lo_i) of the cyclic window
    hi: int
    tail: float  # Chernoff bound on the mass above hi (0 when hi is the true maximum)
    full: int  # number of offsets of the exact result


def _window(parts: list[_Part], h: float, tau: float) -> _Window:
    """Offsets [lo, hi] of the composed PMF with, by Chernoff, <= tau/2 of mass above hi and
    <= tau/2 below lo."""
    full_hi = sum(p.count * (p.pmf.probs.size - 1) for p in parts)
    mean = var = 0.0
    for p in parts:
        pr = p.pmf.probs
        mass = float(pr.sum())
        if mass > 0:
            x = np.arange(pr.size) * h
            mu = float(pr @ x) / mass
            mean += p.count * mu
            var += p.count * float(pr @ (x - mu) ** 2) / mass
    if full_hi == 0:
        return _Window(0, 0, 0.0, 1)
    var = max(var, h * h)
    c = math.log(2.0 / tau)
    lam0 = math.sqrt(2 * c / var)

    def logmgf(lam: float) -> float:
        return sum(p.count * p.mgf(lam) for p in parts)

    t_hi = _chernoff(logmgf, c, lam0, +1)
    t_lo = -_chernoff(logmgf, c, lam0, -1)
    if not math.isfinite(t_hi) or t_hi / h >= full_hi:
        hi, tail = full_hi, 0.0
    else:
        hi, tail = max(0, math.ceil(t_hi / h)), tau / 2
    lo = 0 if not math.isfinite(t_lo) else min(max(0, math.floor(t_lo / h)), hi)
    return _Window(lo, hi, tail, full_hi + 1)


@dataclass(frozen=True)
class _Spectral:
    """A composed PMF kept as its (sparse) DFT: mass r_t at loss (L0 + t)·h, t ∈ [0, N), with
    r = irfft(W) — only the coefficients ``freq`` (0..N/2) with |W| above e^{−745} are kept."""

    N: int
    L0: int
    freq: np.ndarray
    W: np.ndarray
    inf: float
    inf_mech: float
    err: float  # includes the round-off slack of evaluating δ from the spectrum
    top: int | None
    h: float

    def __post_init__(self) -> None:
        j, N, h = self.freq, self.N, self.h
        b = math.pi * j / N
        sb = np.sin(b)
        em = math.exp(-h)
        den = (-math.expm1(-h) + em * 2 * sb**2) - 1j * em * np.sin(2 * b)  # 1 − e^{−h} ω^j
        wgt = np.where((j == 0) | (2 * j == N), 1.0, 2.0) / N
        zero = j == 0
        with np.errstate(divide="ignore", invalid="ignore"):
            t1 = -np.exp(-1j * b) / sb  # Σ_{t>=t0} ω^{jt} = t1 · sin(a) e^{ia}, a = π j t0 / N
        t1[zero] = 0.0
        object.__setattr__(self, "_t1", t1)
        object.__setattr__(self, "_den_inv", 1.0 / den)
        object.__setattr__(self, "_wW", wgt * self.W)
        object.__setattr__(self, "_zero", np.flatnonzero(zero))


_SPARSE_MAX = 4096  # spectra with more kept coefficients are inverted to a grid PMF


class _Spectra:
    """rfft of each PMF at length N, computed once on first use (shared by both directions)."""

    def __init__(self, N: int) -> None:
        self.N = N
        self._cache: dict[int, np.ndarray] = {}

    def of(self, pm: _PMF) -> np.ndarray:
        z = self._cache.get(id(pm))
        if z is None:
            z = self._cache[id(pm)] = _fft.rfft(pm.probs, self.N)
        return z


def _compose(parts: list[_Part], win: _Window, N: int, h: float, spectra: _Spectra) -> _Spectral | _PMF:
    """The product of the parts' powered spectra on a cyclic window of length N (module
    docstring, step 3), with its round-off bound (step 6). Parts used once are multiplied as
    they are; powered parts go through k·ln|ẑ| and k·arg ẑ, on the coefficients that survive."""
    lo_total = sum(p.count * p.pmf.lo for p in parts)
    if win.full <= N:
        start, tail = 0, 0.0
    else:
        start, tail = win.hi - N + 1, win.tail
    L0 = lo_total + start
    if len(parts) == 1 and parts[0].count == 1 and start == 0:  # nothing to compose
        pm = parts[0].pmf
        return _PMF(pm.lo, pm.probs, pm.inf, pm.inf_mech, pm.err, pm.top)
    gam = _fft_gamma(N)
    inf = inf_mech = err = 0.0
    top: int | None = 0
    for p in parts:
        k, pm = p.count, p.pmf
        if pm.inf >= 1:
            inf = 1.0
        elif pm.inf > 0:
            inf = _add_inf(inf, -math.expm1(k * math.log1p(-pm.inf)))
        if pm.inf_mech >= 1:
            inf_mech = 1.0
        elif pm.inf_mech > 0:
            inf_mech = _add_inf(inf_mech, -math.expm1(k * math.log1p(-pm.inf_mech)))
        err += k * pm.err
        top = None if top is None or pm.top is None else top + k * pm.top
    inf = _add_inf(inf, tail)
    mass = {id(p.pmf): max(1.0, float(p.pmf.probs.sum())) for p in parts}
    plain = [p for p in parts if p.count == 1]
    powered = [p for p in parts if p.count > 1]

    # Round-off of the spectrum (module docstring, step 6). For a product of FFTs ẑ_i = z_i + e_i:
    # |Π ẑ_i^{k_i} − Π z_i^{k_i}| <= Σ_i k_i |e_i| M_i, M_i = Π_l (|ẑ_l| + γ_l)^{k_l} / (|ẑ_i| + γ_i),
    # with e_i bounded componentwise (|e_ij| <= γ‖p_i‖₁) or in norm (‖e_i‖₂ <= γ√N‖p_i‖₂).
    plain_max = 1.0
    plain_err = 0.0
    Wp = None
    if plain:
        Wp = spectra.of(plain[0].pmf).copy()
        for p in plain[1:]:
            Wp *= spectra.of(p.pmf)
        bounds = [mass[id(p.pmf)] + gam for p in plain]
        absz = [np.abs(spectra.of(p.pmf)) + gam * mass[id(p.pmf)] for p in plain]
        w_all = np.where((np.arange(N // 2 + 1) == 0) | (2 * np.arange(N // 2 + 1) == N), 1.0, 2.0)
        for i, (p, b_i) in enumerate(zip(plain, bounds)):
            norm = gam * math.sqrt(N) * float(np.sqrt(p.pmf.probs @ p.pmf.probs)) * math.prod(bounds) / b_i
            if len(plain) <= 8:
                others = math.prod([absz[l] for l in range(len(plain)) if l != i]) if len(plain) > 1 else np.ones(N // 2 + 1)
                comp = gam * mass[id(p.pmf)] * float(np.sqrt(np.sum(w_all * others**2)))
                norm = min(norm, comp)
            plain_err += norm
        plain_max = math.prod(bounds)
        plain_err += 4 * _U * len(plain) * math.sqrt(2.0) * float(np.linalg.norm(Wp))  # the products' rounding
    if powered:
        cand = None
        for p in powered:  # coefficients that can survive the powers: Π(|ẑ_i| + γ)^{k_i} > e^{−745}
            thr = math.exp((_LOG_TINY - 1.0) / p.count) - gam * mass[id(p.pmf)]
            ok = np.abs(spectra.of(p.pmf)) > thr if thr > 0 else np.ones(N // 2 + 1, dtype=bool)
            cand = ok if cand is None else cand & ok
        idx = np.flatnonzero(cand)
        full_spectrum = np.where((idx == 0) | (2 * idx == N), 1.0, 2.0)  # rfft holds half of it
        la = np.zeros(idx.size)
        th = np.zeros(idx.size)
        logp = np.zeros(idx.size)
        logz = []
        m_total = 0
        for p in powered:
            k, pm = p.count, p.pmf
            m_total += k
            Zc = spectra.of(pm)[idx]
            absz = np.abs(Zc)
            g = gam * mass[id(pm)]
            with np.errstate(divide="ignore"):
                la += k * np.log(absz)
                lz = np.log(absz + g)
            logp += k * lz
            th += np.angle(Zc) * float(k)
            logz.append((k, g, lz, pm))
        sel = la > _LOG_TINY
        idx, la, th, logp_sel = idx[sel], la[sel], th[sel], logp[sel]
        mag = np.exp(la)
        W = mag * np.exp(1j * th)
        pow_err = 0.0
        big = logp > _LOG_TINY
        for k, g, lz, pm in logz:
            M = np.exp(np.minimum(logp[big] - lz[big], 700.0))
            comp = g * float(np.sqrt(np.sum(full_spectrum[big] * M**2)))
            norm = gam * math.sqrt(N) * float(np.sqrt(pm.probs @ pm.probs)) * (float(M.max()) if M.size else 0.0)
            pow_err += k * min(comp, norm)
        c_pow = mag * (2 * _U * np.abs(th) + 2 * _U * m_total + 4 * _U * np.abs(la) + 16 * _U * len(powered))
        pow_err += float(np.sqrt(np.sum(full_spectrum[sel] * c_pow**2)))
        pow_max = float(np.exp(np.minimum(logp_sel.max(), 700.0))) if logp_sel.size else 0.0
        if Wp is not None:
            W = W * Wp[idx]
            spec_err = plain_err * max(pow_max, 1e-300) + plain_max * pow_err + 4 * _U * math.sqrt(2.0) * float(np.linalg.norm(W))
        else:
            spec_err = pow_err
        freq = idx
    else:
        assert Wp is not None
        freq, W, spec_err = np.arange(N // 2 + 1), Wp, plain_err
    spec_err += N * 1e-300  # coefficients dropped below e^{−745}
    if start:
        W = W * np.exp(2j * math.pi * np.mod(freq * (start % N), N) / N)
    mag_sum = float(np.abs(W).sum())
    if freq.size <= _SPARSE_MAX:
        slack = 256 * _U * mag_sum
        return _Spectral(N, L0, freq, W, min(inf, 1.0), inf_mech, err + spec_err + slack, top, h)
    full = np.zeros(N // 2 + 1, dtype=complex)
    full[freq] = W
    r = _fft.irfft(full, N)
    length = min(N, win.full)
    # inverse FFT: componentwise (γ‖W‖₁/N per cell) or normwise (γ‖r‖₂ in ℓ2, ×√N in ℓ1)
    inv = gam * min(2.0 * mag_sum, math.sqrt(N) * float(np.sqrt(r @ r)) + spec_err)
    r = np.maximum(r[:length], 0.0)
    return _PMF(L0, r, min(inf, 1.0), inf_mech, err + spec_err + inv, top)


def _spectral_delta_fin(s: _Spectral, h: float, eps: float) -> float:
    """Σ_{t: ℓ_t > ε} r_t (1 − e^{ε − ℓ_t}) = (1/N) Σ_j W_j S_j (Parseval), where
    S_j = Σ_{t>=t0} (1 − e^{ε−ℓ_t}) ω^{jt} is two geometric sums in closed form, written with
    sines so that nothing cancels."""
    N, L0 = s.N, s.L0
    t0 = math.floor(eps / h) - L0 + 1
    while t0 > 0 and (L0 + t0 - 1) * h > eps:
        t0 -= 1
    while (L0 + t0) * h <= eps:
        t0 += 1
    t0 = max(t0, 0)
    if t0 >= N:
        return 0.0
    e0 = math.exp(min(eps - (L0 + t0) * h, 0.0))
    a = (math.pi / N) * np.mod(s.freq * t0, 2 * N)  # π j t0 / N (mod 2π)
    eia = np.exp(1j * a)
    S = s._t1 * (np.sin(a) * eia) - e0 * (eia * eia - math.exp(-h * (N - t0))) * s._den_inv  # type: ignore[attr-defined]
    if s._zero.size:  # type: ignore[attr-defined]
        S[s._zero] = (N - t0) - e0 * (-math.expm1(-h * (N - t0))) / (-math.expm1(-h))  # type: ignore[attr-defined]
    wW = s._wW  # type: ignore[attr-defined]
    return float(wW.real @ S.real - wW.imag @ S.imag)


def _search_epsilon(delta_at: Callable[[float], float], delta: float, hi: float) -> float | None:
    """Smallest ε in [0, hi] with delta_at(ε) <= delta, to 1e-12 relative: regula falsi
    (Illinois) on ln δ, always keeping a bracket; returns the bracket's upper end, a point at
    which δ was evaluated to be <= delta (so the answer is sound whatever the search did)."""
    d_lo = delta_at(0.0)
    if d_lo <= delta:
        return 0.0
    d_hi = delta_at(hi)
    if d_hi > delta:
        return None
    lo, ld = 0.0, math.log(delta)
    f_lo, f_hi = math.log(d_lo) - ld, (math.log(d_hi) - ld) if d_hi > 0 else -math.inf
    side = 0
    for _ in range(200):
        if hi - lo <= 1e-12 * max(1.0, hi):
            break
        mid = hi - f_hi * (hi - lo) / (f_hi - f_lo) if math.isfinite(f_hi) and f_lo > 0 > f_hi else 0.5 * (lo + hi)
        if not lo < mid < hi:
            mid = 0.5 * (lo + hi)
        gap = 1e-13 * max(1.0, hi)
        mid = min(max(mid, lo + gap), hi - gap)
        d = delta_at(mid)
        if d <= delta:
            hi, f_hi = mid, (math.log(d) - ld) if d > 0 else -math.inf
            if side == +1:
                f_lo /= 2
            side = +1
        else:
            lo, f_lo = mid, math.log(d) - ld
            if side == -1:
                f_hi /= 2
            side = -1
    return hi


def _top_loss(p: _PMF | _Spectral, h: float) -> float | None:
    """top·h rounded up: no loss of the exact dominating PMF exceeds it (None: unbounded)."""
    return None if p.top is None else max(0.0, to_float_up(p.top * Fraction(h)))


def _delta_of(p: _PMF | _Spectral, h: float, eps: float) -> float:
    """δ(ε) = inf + Σ_{ℓ > ε} ω(ℓ)(1 − e^{ε−ℓ}) + err, rounded up (at most 1); exactly 0
    above the support of a bounded PMF with no mass at +∞ from the mechanisms."""
    top = _top_loss(p, h)
    if top is not None and eps >= top:
        return 0.0
    if isinstance(p, _Spectral):
        fin = max(0.0, _spectral_delta_fin(p, h, eps))
    else:
        n = p.probs.size
        i0 = min(n, max(0, math.floor(eps / h) - p.lo))
        q = p.probs[i0:]
        losses = (p.lo + i0 + np.arange(q.size)) * h
        w = np.maximum(-np.expm1(eps - losses), 0.0)
        fin = float(q @ w) * (1 + (q.size + 8) * _U)
    return min(1.0, up2(p.inf + fin + p.err, 4))


def _epsilon_of(p: _PMF | _Spectral, h: float, delta: float) -> float | None:
    """Smallest ε >= 0 with δ(ε) <= delta (rounded up); None when delta is at or below the
    floor (inf + err). On a grid PMF the piece of the curve is solved exactly; on a spectrum by
    bisection — either way the returned ε is one at which δ was evaluated to be <= delta."""
    if delta - p.inf - p.err <= 0:
        return None
    if isinstance(p, _Spectral):
        return _search_epsilon(lambda e: _delta_of(p, h, e), delta, max(h, (p.L0 + p.N) * h))
    budget = down2(delta - p.inf - p.err)
    n = p.probs.size
    i_start = min(n, max(0, -p.lo))
    q = p.probs[i_start:]
    if q.size == 0 or float(q.sum()) <= budget:
        return 0.0
    l0 = (p.lo + i_start) * h  # loss of q[0], >= 0
    # A_t = Σ_{s>=t} q_s and B_t = Σ_{s>=t} q_s e^{ℓ_t − ℓ_s} (a stable backward recursion).
    A = np.cumsum(q[::-1])[::-1]
    B = lfilter([1.0], [1.0, -math.exp(-h)], q[::-1])[::-1]
    # On ε ∈ [ℓ_{t−1}, ℓ_t] (or [0, ℓ_0]) the finite part is δ(ε) = A_t − e^{ε−ℓ_t} B_t.
    if float(A[0]) - math.exp(-l0) * float(B[0]) <= budget:
        return 0.0
    R = A - B  # δ at ε = ℓ_t
    t = int(np.argmax(R <= budget))
    if not R[t] <= budget:
        t = q.size - 1
    a_t, b_t = float(A[t]), float(B[t])
    lt = l0 + t * h
    eps = lt + math.log((a_t - budget) / b_t) if b_t > 0 and a_t > budget else lt
    left = 0.0 if t == 0 else lt - h
    eps = min(max(eps, left), lt)
    eps = up2(eps * (1 + 64 * _U) + 64 * _U * h, 2)
    for _ in range(60):  # re-check with the direct formula; bump if round-off says so
        if _delta_of(p, h, eps) <= delta:
            return eps
        eps = eps * (1 + 1e-12) + 1e-12 * h
    return eps


def _gaussian_delta_up(mu: float, eps: float) -> float:
    """δ(ε) of the Gaussian mechanism with μ = Δ/σ (Balle & Wang 2018, Thm 8), rounded up."""
    d = gaussian_delta(eps, down2(1.0 / mu))
    return min(1.0, max(up2(d * (1 + 1e-10)), 5e-324))


def _gaussian_epsilon_up(mu: float, delta: float) -> float:
    """Smallest ε >= 0 with the analytic Gaussian δ(ε) <= delta, by bisection, rounded up."""
    if _gaussian_delta_up(mu, 0.0) <= delta:
        return 0.0
    hi = max(1.0, mu * mu)
    while _gaussian_delta_up(mu, hi) > delta:
        hi *= 2.0
    lo = 0.0
    for _ in range(200):
        if hi - lo <= 1e-13 * hi:
            break
        mid = 0.5 * (lo + hi)
        if _gaussian_delta_up(mu, mid) <= delta:
            hi = mid
        else:
            lo = mid
    return up2(hi)


# ---------------------------------------------------------------------------- leaves

# A leaf key names one dominating pair: ("gauss", σ) | ("sgauss", σ, q) | ("lap", b, q) |
# ("rr", p_truth, k) | ("pure", ε) | ("approx", ε, δ).
_Key = tuple
_REVERSED = ("sgauss", "lap")  # leaves whose add PMF is _reverse_pmf of the remove PMF


def _leaf_pmfs(key: _Key, h: float, tau1: float) -> tuple[_PMF, _PMF | None]:
    """(remove PMF, add PMF or None when the pair is symmetric) of one leaf on grid h."""
    kind = key[0]
    if kind == "sgauss":
        rem, deficit = _subsampled_gaussian(key[1], key[2], h, tau1)
        return rem, _reverse_pmf(rem, deficit, h, None)
    if kind == "gauss":
        return _gaussian(1.0 / down2(key[1]), h, tau1), None
    if kind == "lap":
        b, q = key[1], key[2]
        rem, deficit, j0 = _laplace(b, q, h)
        if q == 1.0:
            return rem, None
        return rem, _reverse_pmf(rem, deficit, h, -j0)
    if kind in ("pure", "approx"):
        eps = key[1]
        d = key[2] if kind == "approx" else 0.0
        up = min(1.0 - d, up2((1.0 - d) * float(expit(eps)), 4))
        low = max(0.0, down2((1.0 - d) - up, 4))
        return _from_atoms(h, [eps, -eps], [up, low], inf=up2(d) if d else 0.0), None
    if kind == "rr":
        p, k = Fraction(key[1]), key[2]
        r = (1 - p) / (k - 1)
        big, small, mid = max(p, r), min(p, r), (k - 2) * r
        if small == 0:  # the likelier answer is impossible under the other input: loss +∞
            return _from_atoms(h, [0.0], [to_float_down(mid)], inf=to_float_up(big)), None
        if big == small:
            return _from_atoms(h, [0.0], [1.0]), None
        ratio = big / small
        e_up, e_down = log_up(ratio), down2(math.log(ratio))
        up, mid_f = to_float_up(big), to_float_down(mid)
        low = max(0.0, down2(1.0 - up - mid_f, 4))
        return _from_atoms(h, [e_up, 0.0, -e_down], [up, mid_f, low]), None
    raise AssertionError(kind)  # pragma: no cover


# ---------------------------------------------------------------------------- accountant

_Handler = Callable[["PLDAccountant", DPEvent, int, Counter], None]
_HANDLERS: dict[type, _Handler] = {}


def _handles(*types: type) -> Callable[[_Handler], _Handler]:
    def deco(fn: _Handler) -> _Handler:
        for t in types:
            _HANDLERS[t] = fn
        return fn

    return deco


_SUPPORTED = (
    "GaussianEvent, LaplaceEvent, RandomizedResponseEvent, PureDPEvent, ApproxDPEvent, "
    "ExponentialEvent, PoissonSampledEvent of a GaussianEvent or LaplaceEvent, ComposedEvent, "
    "SelfComposedEvent"
)


def _unsupported(event: object, why: str) -> InvalidParameterError:
    return InvalidParameterError("event", event, f"an event the PLD accountant supports ({_SUPPORTED})", why)


@dataclass(frozen=True)
class _Evaluation:
    """The result of turning the recorded events into PMFs (cached until the next compose)."""

    h: float
    pmfs: tuple[_PMF | _Spectral, ...]  # one per direction (one when every pair is symmetric)
    mu: float  # Gaussian part, when answered analytically (pmfs empty)


class PLDAccountant:
    """Privacy loss distribution accountant: near-exact (ε, δ) for compositions, always an
    upper bound (see the module docstring for the theorem and its proof).

    ``value_discretization_interval`` h is the loss grid (smaller: tighter and slower; the
    discretisation error of connect-the-dots is second order in h). ``neighbours`` is the
    relation every composed event must carry.

    >>> from dpkit.accounting.events import LaplaceEvent
    >>> acc = PLDAccountant().compose(LaplaceEvent(1.0), count=10)
    >>> round(acc.get_epsilon(0.0), 12)   # pure DP: ten Laplace(1) releases are exactly 10-DP
    10.0
    >>> acc.get_epsilon(1e-6) < 10.0
    True
    """

    def __init__(self, value_discretization_interval: float = 1e-4, neighbours: Neighbours = "add_remove") -> None:
        h = value_discretization_interval
        if not isinstance(h, Real) or isinstance(h, bool) or not math.isfinite(float(h)) or not 0 < float(h) <= 1:
            raise InvalidParameterError("value_discretization_interval", h, "a finite number in (0, 1]")
        self._h = float(h)
        self._neighbours: Neighbours = v.neighbours(neighbours)
        self._counts: Counter = Counter()
        self._cache: _Evaluation | None = None

    # -- public ---------------------------------------------------------------------

    @property
    def value_discretization_interval(self) -> float:
        return self._h

    @property
    def neighbours(self) -> Neighbours:
        return self._neighbours

    def supports(self, event: DPEvent) -> bool:
        """Whether :meth:`compose` accepts ``event`` (dry pass; records nothing)."""
        try:
            self._walk(event, 1, Counter())
        except InvalidParameterError:
            return False
        return True

    def compose(self, event: DPEvent, count: int = 1) -> PLDAccountant:
        """Record ``count`` adaptive repetitions of ``event``; returns self.

        The whole event tree is checked first; an unsupported or mismatched event raises
        :class:`~dpkit.errors.InvalidParameterError` naming ``event`` and records nothing.
        """
        if not isinstance(count, Integral) or isinstance(count, bool) or int(count) < 1:
            raise InvalidParameterError("count", count, "an integer >= 1")
        found: Counter = Counter()
        self._walk(event, int(count), found)
        self._counts.update(found)
        self._cache = None
        return self

    def get_delta(self, epsilon: float) -> float:
        """The smallest δ this accountant proves at ``epsilon`` (an upper bound on the true δ)."""
        if not isinstance(epsilon, Real) or isinstance(epsilon, bool) or not math.isfinite(float(epsilon)) or float(epsilon) < 0:
            raise InvalidParameterError("epsilon", epsilon, "a finite number >= 0")
        eps = float(epsilon)
        ev = self._evaluate()
        if not ev.pmfs:
            return 0.0 if ev.mu == 0 else _gaussian_delta_up(ev.mu, eps)
        return max(_delta_of(p, ev.h, eps) for p in ev.pmfs)

    def get_epsilon(self, delta: float) -> float:
        """The smallest ε this accountant proves at ``delta`` (an upper bound on the true ε);
        ``math.inf`` when the recorded mechanisms themselves put more than δ on infinite loss."""
        delta = v.delta(delta)
        ev = self._evaluate()
        if not ev.pmfs:
            if ev.mu == 0:
                return 0.0
            return math.inf if delta == 0 else _gaussian_epsilon_up(ev.mu, delta)
        return max(self._epsilon_one(p, ev.h, delta) for p in ev.pmfs)

    def __repr__(self) -> str:
        return (f"PLDAccountant(value_discretization_interval={self._h!r}, neighbours={self._neighbours!r}, "
                f"events={sum(self._counts.values())})")

    # -- internals --------------------------------------------------------------------

    @staticmethod
    def _epsilon_one(p: _PMF | _Spectral, h: float, delta: float) -> float:
        exact_top = _top_loss(p, h)
        if delta == 0:
            return math.inf if exact_top is None else exact_top
        eps = _epsilon_of(p, h, delta)
        if eps is not None:
            return eps if exact_top is None else min(eps, exact_top)
        if exact_top is not None:
            return exact_top
        if p.inf_mech >= delta:
            return math.inf
        floor = p.inf + p.err
        raise InvalidParameterError(
            "delta", delta, f"a number above {floor:.3g} for the events recorded",
            "Below that, this accountant's numerical floor (tail truncation of at most 1e-15 plus a "
            "proven bound on floating-point error, which grows with the number of compositions) "
            "dominates, so no sound ε can be given",
        )

    def _check_neighbours(self, event: DPEvent) -> None:
        nb = getattr(event, "neighbours", None)
        if nb != self._neighbours:
            raise InvalidParameterError(
                "event", event, f"an event with neighbours={self._neighbours!r} (this accountant's relation)",
                f"The event was calibrated for {nb!r} neighbours; accounting it under {self._neighbours!r} would "
                f"misstate its privacy (the dp_accounting #464 bug class). Use PLDAccountant(neighbours={nb!r})",
            )

    def _walk(self, event: object, count: int, out: Counter) -> None:
        if not isinstance(event, DPEvent):
            raise InvalidParameterError("event", event, "a DPEvent (see dpkit.accounting.events)")
        for cls in type(event).__mro__:
            handler = _HANDLERS.get(cls)
            if handler is not None:
                handler(self, event, count, out)
                return
        raise _unsupported(event, f"{type(event).__name__} has no privacy loss distribution here")

    def _evaluate(self) -> _Evaluation:
        if self._cache is not None:
            return self._cache
        mu2 = Fraction(0)
        parts = []
        for key, c in self._counts.items():
            if key[0] == "gauss":
                mu2 += c / Fraction(key[1]) ** 2
            else:
                parts.append((key, c))
        mu = up2(math.sqrt(to_float_up(mu2))) if mu2 else 0.0
        if not parts:
            self._cache = _Evaluation(self._h, (), mu)
            return self._cache
        if mu:
            parts.append((("gauss", down2(1.0 / mu)), 1))
        h = self._h
        for _ in range(200):
            try:
                self._cache = _evaluate_at(h, parts)
                return self._cache
            except _Coarsen as c:
                h *= 2.0 ** max(1, math.ceil(math.log2(c.factor)))
        raise AssertionError("grid coarsening did not converge")  # pragma: no cover


def _convolve(a: _PMF, b: _PMF) -> _PMF:
    """The exact linear convolution of two PMFs (no truncation), by FFT unless one is tiny,
    with its round-off bound: a δ read from a ∗ b is off by at most err_a·‖b‖₁ + err_b·‖a‖₁
    plus the convolution's own error (normwise FFT bounds, ℓ1 <= √n·ℓ2)."""
    na, nb = a.probs.size, b.probs.size
    ma, mb = max(1.0, float(a.probs.sum())), max(1.0, float(b.probs.sum()))
    if min(na, nb) <= 32:
        r = np.convolve(a.probs, b.probs)
        conv_err = 2 * min(na, nb) * _U * ma * mb
    else:
        n = na + nb - 1
        N = _fft.next_fast_len(n, real=True)
        g = _fft_gamma(N)
        r = _fft.irfft(_fft.rfft(a.probs, N) * _fft.rfft(b.probs, N), N)[:n]
        l2a, l2b = float(np.sqrt(a.probs @ a.probs)), float(np.sqrt(b.probs @ b.probs))
        # In ℓ2 over the cells: forward errors (‖e‖₂ <= γ√N‖·‖₂, times sup|other spectrum| <=
        # ‖other‖₁, over √N by Parseval), the product's rounding, the inverse (γ‖r‖₂); then
        # ℓ1 <= √n·ℓ2.
        l2 = g * (l2a * mb + l2b * ma) + 4 * _U * min(l2a * mb, l2b * ma) + g * float(np.sqrt(r @ r))
        conv_err = math.sqrt(n) * l2
    r = np.maximum(r, 0.0)
    inf = _add_inf(a.inf, b.inf)
    inf_mech = _add_inf(a.inf_mech, b.inf_mech)
    top = None if a.top is None or b.top is None else a.top + b.top
    return _PMF(a.lo + b.lo, r, inf, inf_mech, a.err * mb + b.err * ma + conv_err, top)


def _merge_plain(parts: list[_Part], N: int, h: float) -> list[_Part]:
    """Many parts used once: convolve them pairwise on the grid (a balanced tree of exact
    convolutions, cheap while they are small) instead of one length-N FFT each."""
    plain = sorted((p for p in parts if p.count == 1), key=lambda p: p.pmf.probs.size)
    if len(plain) < 2 or (len(plain) <= 4 and plain[0].pmf.probs.size > 32):
        return parts
    pmfs = [p.pmf for p in plain]
    while len(pmfs) > 1:
        nxt = []
        for i in range(0, len(pmfs) - 1, 2):
            a, b = pmfs[i], pmfs[i + 1]
            nxt.append(_convolve(a, b) if a.probs.size + b.probs.size - 1 <= N else a)
            if nxt[-1] is a:
                nxt.append(b)
        if len(pmfs) % 2:
            nxt.append(pmfs[-1])
        if len(nxt) == len(pmfs):  # nothing fits in N any more
            break
        pmfs = sorted(nxt, key=lambda p: p.probs.size)
    merged = [_Part(pm, 1, _MGF(pm.probs, h)) for pm in pmfs]
    return [p for p in parts if p.count > 1] + merged


def _evaluate_at(h: float, parts: list[tuple[_Key, int]]) -> _Evaluation:
    m = len(parts)
    tau_leaf = _TAIL / (4 * m)  # per part: single-step truncation, over all its copies
    tau_win = _TAIL / 2  # per direction: the cyclic window (half above → +∞, half wraps up)
    rems: list[_Part] = []
    adds: list[_Part] = []
    asym = False
    for key, c in parts:
        rem, add = _leaf_pmfs(key, h, tau_leaf / c)
        mgf = _MGF(rem.probs, h)
        rems.append(_Part(rem, c, mgf))
        if add is None:
            adds.append(rems[-1])
        else:
            asym = True
            rev = _ReversedMGF(mgf, rem, h) if key[0] in _REVERSED else _MGF(add.probs, h)
            adds.append(_Part(add, c, rev))
    directions = [rems, adds] if asym else [rems]
    wins = [_window(d, h, tau_win) for d in directions]
    need = max(max(w.hi - w.lo + 1, max(p.pmf.probs.size for p in d)) for w, d in zip(wins, directions))
    if need > _MAX_BINS:
        raise _Coarsen(need / _MAX_BINS)
    N = _fft.next_fast_len(need, real=True)
    if all(w.full <= N for w in wins):  # nothing wraps: the exact results fit
        N = _fft.next_fast_len(max(max(w.full for w in wins), max(p.pmf.probs.size for d in directions for p in d)), real=True)
    directions = [_merge_plain(d, N, h) for d in directions]
    spectra = _Spectra(N)
    out = tuple(_compose(d, w, N, h, spectra) for d, w in zip(directions, wins))
    return _Evaluation(h, out, 0.0)


@_handles(ComposedEvent)
def _walk_composed(acc: PLDAccountant, event: ComposedEvent, count: int, out: Counter) -> None:
    for e in event.events:
        acc._walk(e, count, out)


@_handles(SelfComposedEvent)
def _walk_self(acc: PLDAccountant, event: SelfComposedEvent, count: int, out: Counter) -> None:
    acc._walk(event.event, event.count * count, out)


@_handles(GaussianEvent)
def _walk_gaussian(acc: PLDAccountant, event: GaussianEvent, count: int, out: Counter) -> None:
    acc._check_neighbours(event)
    out[("gauss", float(event.noise_multiplier))] += count


def _laplace_scale(event: LaplaceEvent) -> float:
    b = event.noise_multiplier
    return to_float_down(b) if isinstance(b, Fraction) else float(b)


@_handles(LaplaceEvent)
def _walk_laplace(acc: PLDAccountant, event: LaplaceEvent, count: int, out: Counter) -> None:
    acc._check_neighbours(event)
    out[("lap", _laplace_scale(event), 1.0)] += count


@_handles(PoissonSampledEvent)
def _walk_poisson(acc: PLDAccountant, event: PoissonSampledEvent, count: int, out: Counter) -> None:
    q = Fraction(event.sampling_probability)
    inner: DPEvent = event.event
    while isinstance(inner, PoissonSampledEvent):  # independent subsampling composes: q·q'
        q *= Fraction(inner.sampling_probability)
        inner = inner.event
    if not isinstance(inner, (GaussianEvent, LaplaceEvent)):
        raise _unsupported(event, f"Poisson subsampling is supported for GaussianEvent and LaplaceEvent, not {type(inner).__name__}")
    if acc.neighbours != "add_remove":
        raise _unsupported(
            event, "Poisson subsampling is accounted under 'add_remove' neighbours (the relation its "
            "amplification theorem uses); this accountant uses 'replace'")
    acc._check_neighbours(inner)
    qf = to_float_up(q)
    if isinstance(inner, GaussianEvent):
        key = ("gauss", float(inner.noise_multiplier)) if qf >= 1 else ("sgauss", float(inner.noise_multiplier), qf)
    else:
        key = ("lap", _laplace_scale(inner), min(qf, 1.0))
    out[key] += count


@_handles(RandomizedResponseEvent)
def _walk_rr(acc: PLDAccountant, event: RandomizedResponseEvent, count: int, out: Counter) -> None:
    p, k = event.p_truth, event.k
    if not isinstance(p, (Real, Fraction)) or isinstance(p, bool) or not math.isfinite(float(p)) or not 0 <= p <= 1:
        raise _unsupported(event, f"p_truth={p!r} must be a probability in [0, 1]")
    if not isinstance(k, Integral) or isinstance(k, bool) or k < 2:
        raise _unsupported(event, f"k={k!r} must be an integer >= 2")
    acc._check_neighbours(event)
    if acc.neighbours != "replace":  # pragma: no cover - the check above already raised
        raise _unsupported(event, "randomized response is accounted under 'replace' neighbours")
    out[("rr", p, int(k))] += count


@_handles(PureDPEvent, ExponentialEvent)
def _walk_pure(acc: PLDAccountant, event: PureDPEvent | ExponentialEvent, count: int, out: Counter) -> None:
    acc._check_neighbours(event)
    out[("pure", float(event.epsilon))] += count


@_handles(ApproxDPEvent)
def _walk_approx(acc: PLDAccountant, event: ApproxDPEvent, count: int, out: Counter) -> None:
    acc._check_neighbours(event)
    key = ("pure", float(event.epsilon)) if event.delta == 0 else ("approx", float(event.epsilon), float(event.delta))
    out[key] += count
