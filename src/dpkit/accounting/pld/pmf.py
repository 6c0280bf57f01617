"""Privacy loss distributions on a grid: the PMF type and connect-the-dots discretisation.

Proof step 2 (*connect-the-dots*, Doroshenko, Ghazi, Kamath, Kumar & Manurangsi 2022, Alg. 1).
ε ↦ H_{e^ε} is convex in x = e^ε (a supremum of the affine functions P(S) − x Q(S)). Splitting
each cell's P-mass between its two grid ends so that the cell's P-mass and Q-mass
(Σ ω(ℓ)e^{−ℓ}) are both kept gives a PMF ω whose curve equals H_{e^ε}(P ‖ Q) at the cell ends
and is the chord in x between them — above the convex curve; below the lowest point it is the
chord from x = 0. Mass outside the kept range moves *up*: above it to loss +∞ (counted in δ for
every ε), below it onto the lowest grid point. Raising a loss raises every δ(ε), since
(1 − e^{ε−ℓ})₊ grows with ℓ. (Where a block of 64 cells holds < 1e-15 of mass it is one wide
cell; the argument is unchanged.)

Proof step 5, the reversal: the ``add`` PMF of a subsampled mechanism is the exact reversal of
its ``remove`` PMF (mass ω(ℓ)e^{−ℓ} at −ℓ; uncovered Q-mass to +∞), which keeps domination
because reversing a pair inverts its trade-off function (:func:`_reverse_pmf`).

Proof step 6, per event: every PMF carries ``err``, a bound on |δ_computed − δ_exact| for every
ε. Connect-the-dots reproduces the hockey-stick values it is given at the grid points, so tail
probabilities accurate to a few ulps give a curve accurate to 48u (u = 2⁻⁵³) everywhere.
The numbered steps are those of :mod:`dpkit.accounting.pld`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from dpkit.accounting.rounding import to_float_up, up2

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
    for loss, m in zip(losses, masses, strict=False):
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
    for a, m, up in zip(cells, ms, shares, strict=True):
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
