"""Systematic sampling: how the synthetic rows get their cells (post-processing only).

A model's rows are drawn clique by clique (:meth:`dpkit.synth.graphical.GraphicalModel.sample`):
for the root, and then for every cell of a separator, the rows that hold it get the next
columns' cells in exactly ⌊n·F(c) + u⌋ differences for one uniform u (systematic, or stratified,
sampling: the counts match the model's to within one row per cell), assigned in a random
permutation. Never in row order: a sampler that hands cells out in the order of the rows
correlates every two columns drawn from the same separator through that order (Private-PGM's
mbi 1.1 did, and its synthetic Adult had twice the two-way error of its own model).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

__all__ = ["systematic_counts"]


def systematic_counts(p: NDArray[np.float64], n: int, u: float) -> NDArray[np.int64]:
    """Counts summing to ``n`` with expectation ``n·p`` (``p`` normalised), by systematic
    sampling with offset ``u`` in [0, 1): cell k gets ⌊n·F_k + u⌋ − ⌊n·F_{k−1} + u⌋.

    >>> systematic_counts(np.array([0.5, 0.25, 0.25]), 10, 0.0).tolist()
    [5, 2, 3]
    """
    total = float(p.sum())
    if n == 0 or total <= 0:
        out = np.zeros(p.size, dtype=np.int64)
        if n:
            out[:] = systematic_counts(np.ones(p.size), n, u)
        return out
    cum = np.floor(np.cumsum(p / total) * n + u).astype(np.int64)
    cum[-1] = n
    np.clip(cum, 0, n, out=cum)
    return np.diff(np.concatenate(([0], cum)))


def _assign(counts: NDArray[np.int64], rng: np.random.Generator) -> NDArray[np.int64]:
    """Cells repeated by ``counts``, in a random order."""
    return rng.permutation(np.repeat(np.arange(counts.size), counts))
