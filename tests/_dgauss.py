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
