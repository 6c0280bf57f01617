"""The model fitted to noisy marginals, and rows sampled from it (post-processing only).

The model is a tree over the columns (a Chow–Liu-shaped graphical model, as in MST: McKenna,
Miklau & Sheldon, "Winning the NIST Contest", JPC 2021): one-way distributions for every
column and a joint table for every edge, all made consistent with one another.

Estimation: each column's distribution is the inverse-variance weighted average of its own
noisy one-way counts and the row sums of every noisy edge table that contains it; each edge
table (negative counts set to zero) is then fitted to its two columns' distributions by
iterative proportional fitting. The tree's joint distribution is the root's distribution times
each child's conditional given its parent.

Sampling is systematic (stratified), never by row order: the root's cells get exactly
⌊n·F(c) + u⌋ differences of rows for one uniform u; then, for each parent cell, the rows that
hold it are given child cells the same way and in a random permutation. The sample's marginals on
every tree edge therefore match the model's to within one row per cell, and no column is
correlated with row position (a sampler assigning cells in row order would correlate children
with one another through the order; Mckenna et al.'s mbi 1.1 did).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

__all__ = ["TreeModel", "systematic_counts"]

_IPF_ROUNDS = 50


def systematic_counts(p: NDArray[np.float64], n: int, u: float) -> NDArray[np.int64]:
    """Counts summing to ``n`` with expectation ``n·p`` (``p`` normalised), by systematic
    sampling with offset ``u`` in [0, 1): cell k gets ⌊n·F_k + u⌋ − ⌊n·F_{k−1} + u⌋."""
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


@dataclass(frozen=True)
class TreeModel:
    """Column distributions ``node[i]`` and edge tables ``edge[(i, j)]`` (joint, i < j, rows
    indexed by column i), both normalised, over the tree ``edges``; ``rows`` the estimated
    number of rows."""

    sizes: tuple[int, ...]
    node: tuple[NDArray[np.float64], ...]
    edge: dict[tuple[int, int], NDArray[np.float64]]
    rows: float

    @classmethod
    def fit(
        cls,
        sizes: Sequence[int],
        one_way: Sequence[NDArray[np.float64]],
        one_way_var: Sequence[NDArray[np.float64]],
        two_way: dict[tuple[int, int], NDArray[np.float64]],
        two_way_var: float,
    ) -> TreeModel:
        """Fit to noisy counts: ``one_way[i]`` with per-cell variances ``one_way_var[i]``,
        ``two_way[(i, j)]`` (i < j) with per-cell variance ``two_way_var``."""
        d = len(sizes)
        # The number of rows: every one-way measurement estimates it.
        totals = np.array([float(y.sum()) for y in one_way])
        weights = np.array([1.0 / float(v.sum()) for v in one_way_var])
        rows = max(float((totals * weights).sum() / weights.sum()), 1.0)
        num = [np.asarray(one_way[i], dtype=float) / one_way_var[i] for i in range(d)]
        den = [1.0 / np.asarray(one_way_var[i], dtype=float) for i in range(d)]
        for (i, j), y in two_way.items():
            for axis, k, other in ((1, i, sizes[j]), (0, j, sizes[i])):
                var = two_way_var * other
                num[k] = num[k] + y.sum(axis=axis) / var
                den[k] = den[k] + 1.0 / var
        node = []
        for i in range(d):
            p = np.maximum(num[i] / den[i], 0.0)
            node.append(p / p.sum() if p.sum() > 0 else np.full(sizes[i], 1.0 / sizes[i]))
        edge = {}
        for (i, j), y in two_way.items():
            edge[(i, j)] = _ipf(np.maximum(np.asarray(y, dtype=float), 0.0), node[i], node[j])
        return cls(tuple(int(s) for s in sizes), tuple(node), edge, rows)

    def sample(self, n: int, rng: np.random.Generator) -> NDArray[np.int64]:
        """``n`` rows of cells (an n × d array), systematic per tree edge."""
        d = len(self.sizes)
        out = np.zeros((n, d), dtype=np.int64)
        neighbours: dict[int, list[int]] = {i: [] for i in range(d)}
        for i, j in self.edge:
            neighbours[i].append(j)
            neighbours[j].append(i)
        done = [False] * d
        for root in range(d):  # a forest: every component gets its own root
            if done[root]:
                continue
            out[:, root] = _assign(systematic_counts(self.node[root], n, rng.random()), rng)
            done[root] = True
            queue = [root]
            while queue:
                parent = queue.pop(0)
                for child in neighbours[parent]:
                    if done[child]:
                        continue
                    self._children(out, parent, child, rng)
                    done[child] = True
                    queue.append(child)
        return out[rng.permutation(n)]

    def conditional(self, parent: int, child: int) -> NDArray[np.float64]:
        """P(child | parent) as a (parent cells × child cells) array."""
        joint = self.edge[(parent, child)] if (parent, child) in self.edge else self.edge[(child, parent)].T
        rows = joint.sum(axis=1, keepdims=True)
        uniform = np.full(joint.shape, 1.0 / joint.shape[1])
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(rows > 0, joint / np.where(rows > 0, rows, 1.0), uniform)

    def _children(self, out: NDArray[np.int64], parent: int, child: int, rng: np.random.Generator) -> None:
        cond = self.conditional(parent, child)
        order = np.argsort(out[:, parent], kind="stable")
        starts = np.searchsorted(out[order, parent], np.arange(self.sizes[parent] + 1))
        values = np.empty(out.shape[0], dtype=np.int64)
        for a in range(self.sizes[parent]):  # per parent cell (a public count), not per row
            lo, hi = int(starts[a]), int(starts[a + 1])
            if hi > lo:
                values[lo:hi] = _assign(systematic_counts(cond[a], hi - lo, rng.random()), rng)
        out[order, child] = values


def _assign(counts: NDArray[np.int64], rng: np.random.Generator) -> NDArray[np.int64]:
    """Cells repeated by ``counts``, in a random order."""
    return rng.permutation(np.repeat(np.arange(counts.size), counts))


def _ipf(table: NDArray[np.float64], rows: NDArray[np.float64], cols: NDArray[np.float64]) -> NDArray[np.float64]:
    """``table`` scaled to the row and column distributions (a small floor keeps every cell
    reachable, so cells the noise zeroed can still receive the margins' mass)."""
    t = table / table.sum() if table.sum() > 0 else np.ones_like(table) / table.size
    t = t + 1e-9
    for _ in range(_IPF_ROUNDS):
        t *= _ratio(rows, t.sum(axis=1))[:, None]
        t *= _ratio(cols, t.sum(axis=0))[None, :]
    return t / t.sum() if t.sum() > 0 else np.ones_like(t) / t.size


def _ratio(want: NDArray[np.float64], have: NDArray[np.float64]) -> NDArray[np.float64]:
    return np.divide(want, have, out=np.zeros_like(want), where=have > 0)
