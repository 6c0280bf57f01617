"""The discrete Gaussian's PMF binned for χ² tests of exact samplers (torch device and CPU loop)."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
from scipy import special

from _stats import chi2_pvalue


def dgauss_bins(sigma: Fraction) -> tuple[np.ndarray, np.ndarray, int, int]:
    """(support, probabilities, offset, width): exact PMF on integers, binned by ``width`` for
    σ > 100; for σ = 2^30 bins of σ/16 whose mass is the normal's over [a − ½, b − ½) (the
    midpoint rule's relative error is O(σ^-2), below 2^-59)."""
    s = float(sigma)
    if s <= 100:
        support = np.arange(-int(12 * s) - 5, int(12 * s) + 6)
        return support, np.exp(-(support.astype(float) ** 2) / (2 * s * s)), 0, 1
    if s < 2**20:
        w = int(s // 32)
        support = np.arange(-int(12 * s), int(12 * s) + 1)
        pmf = np.exp(-(support.astype(float) ** 2) / (2 * s * s))
        return (
            np.arange((support.size + w - 1) // w),
            np.bincount((support - support[0]) // w, weights=pmf),
            int(support[0]),
            w,
        )
    w = int(s) // 16
    edges = np.arange(-12 * 16, 12 * 16 + 1) * w
    probs = np.diff(special.ndtr((edges - 0.5) / s))
    return np.arange(probs.size), probs, int(edges[0]), w


def pmf_pvalue(y: np.ndarray, sigma: Fraction) -> float:
    support, pmf, offset, w = dgauss_bins(sigma)
    if w == 1:
        return chi2_pvalue(y, support, pmf)
    lo, hi = offset, offset + w * support.size - 1
    return chi2_pvalue((np.clip(y, lo, hi) - offset) // w, support, pmf)


def tail_probability(sigma: Fraction, t: float) -> float:
    """P(|Y| > t·σ) for the discrete Gaussian: the exact PMF summed over |k| <= 40σ for σ < 100,
    else the normal's 2Φ(−t) (error O(1/σ))."""
    s = float(sigma)
    if s < 100:
        k = np.arange(-int(40 * s), int(40 * s) + 1)
        pmf = np.exp(-(k.astype(float) ** 2) / (2 * s * s))
        return float(pmf[np.abs(k) > t * s].sum() / pmf.sum())
    return float(2 * special.ndtr(-t))


def lattice_noise_pvalue(y: np.ndarray, lattice_sigma: float) -> float:
    """χ² p-value of release noise y (in lattice steps) against a normal with σ_lattice (about
    2^47 on the DP-SGD path): bins of σ_lattice/16 over ±12σ, normal masses (error O(1/σ))."""
    edges = np.arange(-12 * 16, 12 * 16 + 1) * (lattice_sigma / 16)
    probs = np.diff(special.ndtr(edges / lattice_sigma))
    idx = np.clip(np.searchsorted(edges, y, side="right") - 1, 0, probs.size - 1)
    return chi2_pvalue(idx, np.arange(probs.size), probs)
