"""A graphical model fitted to noisy marginals (the estimator of Private-PGM: McKenna, Sheldon &
Miklau, "Graphical-model based estimation and inference for differential privacy", ICML 2019).

The measured cliques (sets of columns) are joined into a junction tree: the graph linking every
two columns measured together is triangulated by greedy min-fill elimination, its maximal
cliques are the tree's nodes, and a maximum spanning tree on separator sizes links them. The model
is p(x) ∝ exp(Σ_C θ_C(x_C)); its clique marginals come from belief propagation in log space, and
θ is fitted by entropic mirror descent with an Armijo line search to minimise

    Σ_r ‖μ_r − y_r‖² / (2σ_r²)        (μ_r: the model's marginal counts on clique r)

over the measurements (y_r, σ_r) — the maximum-likelihood estimate under Gaussian noise, within
the model family. Every array is over a clique's columns in increasing column order.

Sampling is systematic, clique by clique along the tree (see :mod:`dpkit.synth.model`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from dpkit._cancel import checkpoint
from dpkit.synth.model import _assign, systematic_counts

__all__ = ["JunctionTree", "GraphicalModel", "tree_size"]

Clique = tuple[int, ...]


def _triangulate(d: int, cliques: Sequence[Clique]) -> list[Clique]:
    """The maximal cliques of a min-fill triangulation of the graph the cliques span."""
    adj: list[set[int]] = [set() for _ in range(d)]
    for c in cliques:
        for a in c:
            adj[a].update(b for b in c if b != a)
    remaining = set(range(d))
    found: list[set[int]] = []
    while remaining:

        def fill(v: int) -> tuple[int, int, int]:
            nb = adj[v] & remaining
            missing = sum(1 for a in nb for b in nb if a < b and b not in adj[a])
            return (missing, len(nb), v)

        v = min(remaining, key=fill)
        nb = adj[v] & remaining
        for a in nb:
            adj[a].update(nb - {a})
        found.append(nb | {v})
        remaining.discard(v)
    maximal = [m for m in found if not any(m < other for other in found)]
    unique: list[Clique] = []
    for m in maximal:
        t = tuple(sorted(m))
        if t not in unique:
            unique.append(t)
    return unique


def tree_size(sizes: Sequence[int], cliques: Sequence[Clique]) -> int:
    """The number of cells of the junction tree the cliques would give (what one belief
    propagation touches)."""
    return sum(int(np.prod([sizes[a] for a in c])) for c in _triangulate(len(sizes), cliques))


@dataclass(frozen=True)
class JunctionTree:
    """The tree's ``cliques``, its ``order`` (a root-first traversal: (clique, parent) pairs,
    parent −1 for each component's root), each clique's ``children`` and ``separator`` with its
    parent (() for a root), and where each measured clique lives."""

    sizes: tuple[int, ...]
    cliques: tuple[Clique, ...]
    order: tuple[tuple[int, int], ...]
    children: tuple[tuple[int, ...], ...]
    separator: tuple[Clique, ...]

    @classmethod
    def build(cls, sizes: Sequence[int], measured: Sequence[Clique]) -> JunctionTree:
        d = len(sizes)
        cliques = _triangulate(d, [*measured, *[(i,) for i in range(d)]])
        # Maximum spanning tree on separator sizes (Prim), a forest when components are apart.
        n = len(cliques)
        inside = [False] * n
        order: list[tuple[int, int]] = []
        for root in range(n):
            if inside[root]:
                continue
            inside[root] = True
            order.append((root, -1))
            while True:
                best = (0, -1, -1)
                for a in range(n):
                    if not inside[a]:
                        continue
                    for b in range(n):
                        if inside[b]:
                            continue
                        w = len(set(cliques[a]) & set(cliques[b]))
                        if w > best[0]:
                            best = (w, a, b)
                if best[1] < 0:
                    break
                inside[best[2]] = True
                order.append((best[2], best[1]))
        children: list[list[int]] = [[] for _ in range(n)]
        separator: list[Clique] = [() for _ in range(n)]
        for c, p in order:
            if p >= 0:
                children[p].append(c)
                separator[c] = tuple(sorted(set(cliques[c]) & set(cliques[p])))
        return cls(
            tuple(int(s) for s in sizes), tuple(cliques), tuple(order),
            tuple(tuple(k) for k in children), tuple(separator),
        )  # fmt: skip

    def home(self, clique: Clique) -> int:
        """The first tree clique containing ``clique``."""
        want = set(clique)
        return next(i for i, c in enumerate(self.cliques) if want <= set(c))

    def shape(self, clique: Clique) -> tuple[int, ...]:
        return tuple(self.sizes[a] for a in clique)


def logsumexp(arr: NDArray[np.float64], axis: int | tuple[int, ...] | None = None) -> NDArray[np.float64]:
    """log Σ exp over ``axis`` (all axes when None), stable, in plain numpy (scipy's version
    spends more time checking its arguments than summing these small arrays)."""
    top = np.max(arr, axis=axis, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)
    out = np.log(np.sum(np.exp(arr - top), axis=axis, keepdims=True)) + top
    return out.reshape(()) if axis is None else np.squeeze(out, axis=axis)


def _expand(arr: NDArray[np.float64], attrs: Clique, target: Clique) -> NDArray[np.float64]:
    """``arr`` (over ``attrs``, a subset of ``target``) with singleton axes for the rest."""
    shape = [arr.shape[attrs.index(a)] if a in attrs else 1 for a in target]
    return arr.reshape(shape)


def _pool(
    measurements: Sequence[tuple[Clique, NDArray[np.float64], float | NDArray[np.float64]]],
) -> list[tuple[Clique, NDArray[np.float64], NDArray[np.float64]]]:
    """One (clique, precision-weighted mean, precision 1/σ²) per measured clique, in first-seen order."""
    sums: dict[Clique, list[NDArray[np.float64]]] = {}
    for clique, y, sigma in measurements:
        precision = np.broadcast_to(1.0 / (np.asarray(sigma, dtype=float) ** 2), y.shape)
        if clique in sums:
            sums[clique][0] = sums[clique][0] + y * precision
            sums[clique][1] = sums[clique][1] + precision
        else:
            sums[clique] = [y * precision, precision]
    return [(clique, weighted / precision, precision) for clique, (weighted, precision) in sums.items()]


def _project(arr: NDArray[np.float64], attrs: Clique, keep: Clique, *, log: bool = False) -> NDArray[np.float64]:
    axes = tuple(i for i, a in enumerate(attrs) if a not in keep)
    if not axes:
        return arr
    return logsumexp(arr, axis=axes) if log else arr.sum(axis=axes)


@dataclass
class GraphicalModel:
    """Log-potentials ``theta`` on the tree's cliques; ``total`` the number of rows they model."""

    tree: JunctionTree
    total: float
    theta: list[NDArray[np.float64]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.theta:
            self.theta = [np.zeros(self.tree.shape(c)) for c in self.tree.cliques]

    # -- inference ---------------------------------------------------------------------------------

    def marginals(self, theta: list[NDArray[np.float64]] | None = None) -> list[NDArray[np.float64]]:
        """Every tree clique's marginal counts (summing to ``total``), by two-pass belief
        propagation in log space."""
        theta = self.theta if theta is None else theta
        tree = self.tree
        children, sep = tree.children, tree.separator
        up: dict[int, NDArray[np.float64]] = {}  # message child → parent, over the separator
        for c, p in reversed(tree.order):
            if p < 0:
                continue
            belief = theta[c].copy()
            for k in children[c]:
                belief = belief + _expand(up[k], sep[k], tree.cliques[c])
            up[c] = _project(belief, tree.cliques[c], sep[c], log=True)
        beliefs: dict[int, NDArray[np.float64]] = {}
        down: dict[int, NDArray[np.float64]] = {}
        for c, p in tree.order:
            belief = theta[c].copy()
            if p >= 0:
                belief = belief + _expand(down[c], sep[c], tree.cliques[c])
            for k in children[c]:
                belief = belief + _expand(up[k], sep[k], tree.cliques[c])
            beliefs[c] = belief
            for k in children[c]:
                down[k] = _project(belief - _expand(up[k], sep[k], tree.cliques[c]), tree.cliques[c], sep[k], log=True)
        out = []
        for i in range(len(tree.cliques)):
            b = beliefs[i]
            out.append(np.exp(b - logsumexp(b)) * self.total)
        return out

    def project(self, mu: list[NDArray[np.float64]], clique: Clique) -> NDArray[np.float64]:
        """The model's marginal counts on ``clique`` (a subset of some tree clique)."""
        h = self.tree.home(clique)
        return _project(mu[h], self.tree.cliques[h], clique)

    def extended(self, measured: Sequence[Clique]) -> GraphicalModel:
        """The same distribution on the junction tree of ``measured`` (which must include every
        clique of this tree's graph): each old clique lies inside a new one, and carries its θ
        there."""
        tree = JunctionTree.build(self.tree.sizes, [*measured, *self.tree.cliques])
        theta = [np.zeros(tree.shape(c)) for c in tree.cliques]
        for clique, t in zip(self.tree.cliques, self.theta, strict=True):
            h = tree.home(clique)
            theta[h] = theta[h] + _expand(t, clique, tree.cliques[h])
        return GraphicalModel(tree, self.total, theta)

    def rebuilt(self, measured: Sequence[Clique]) -> GraphicalModel:
        """A model on the junction tree of ``measured`` alone (its size is what
        :func:`tree_size` predicts), started from this one's θ where an old clique fits in a new
        one (a warm start for :meth:`fit`; the distribution may differ until refitted)."""
        tree = JunctionTree.build(self.tree.sizes, measured)
        theta = [np.zeros(tree.shape(c)) for c in tree.cliques]
        for clique, t in zip(self.tree.cliques, self.theta, strict=True):
            want = set(clique)
            h = next((i for i, c in enumerate(tree.cliques) if want <= set(c)), None)
            if h is not None:
                theta[h] = theta[h] + _expand(t, clique, tree.cliques[h])
        return GraphicalModel(tree, self.total, theta)

    # -- estimation --------------------------------------------------------------------------------

    def fit(
        self,
        measurements: Sequence[tuple[Clique, NDArray[np.float64], float | NDArray[np.float64]]],
        iterations: int,
    ) -> None:
        """Mirror descent on θ towards the measurements ((clique, noisy counts, σ) each; σ a
        number, or one per cell where cells carry different noise). Measurements of the same
        clique are first pooled into one, their precision-weighted mean (the loss changes by a
        constant: the same fit, with one projection per clique instead of one per measurement)."""
        tree = self.tree
        pooled = _pool(measurements)
        homes = [tree.home(c) for c, _, _ in pooled]

        def loss_grad(mu: list[NDArray[np.float64]], grad: bool) -> tuple[float, list[NDArray[np.float64]]]:
            loss = 0.0
            grads = [np.zeros_like(m) for m in mu] if grad else []
            for (clique, y, precision), h in zip(pooled, homes, strict=True):
                weighted = (_project(mu[h], tree.cliques[h], clique) - y) * precision
                loss += float((weighted * weighted / precision).sum()) / 2
                if grad:
                    grads[h] = grads[h] + _expand(weighted, clique, tree.cliques[h])
            return loss, grads

        mu = self.marginals()
        loss, grad = loss_grad(mu, True)
        alpha = 1.0 / max(self.total, 1.0)
        for _ in range(iterations):
            checkpoint()  # a fit the curator service cancelled stops here (dpkit._cancel)
            omega, nu, current = self.theta, mu, loss
            alpha *= 2
            for _ in range(25):
                theta = [o - alpha * g for o, g in zip(omega, grad, strict=True)]
                mu = self.marginals(theta)
                loss = loss_grad(mu, False)[0]
                gain = 0.5 * alpha * sum(float((g * (n - m)).sum()) for g, n, m in zip(grad, nu, mu, strict=True))
                if current - loss >= gain:
                    break
                alpha *= 0.5
            self.theta = theta
            grad = loss_grad(mu, True)[1]

    # -- sampling ----------------------------------------------------------------------------------

    def sample(self, n: int, rng: np.random.Generator) -> NDArray[np.int64]:
        """``n`` rows of cells: each tree clique's new columns given its separator with the
        parent, systematically within every separator cell (no row-order artefacts)."""
        tree = self.tree
        mu = self.marginals()
        out = np.zeros((n, len(tree.sizes)), dtype=np.int64)
        for c, _ in tree.order:
            clique = tree.cliques[c]
            sep = tree.separator[c]
            new = tuple(a for a in clique if a not in sep)
            if not new:
                continue
            # the clique's table as (separator cells) × (new cells)
            axes = [clique.index(a) for a in (*sep, *new)]
            table = np.transpose(mu[c], axes).reshape(int(np.prod(tree.shape(sep))) if sep else 1, -1)
            if not sep:
                values = _assign(systematic_counts(table[0], n, rng.random()), rng)
            else:
                key = np.ravel_multi_index(tuple(out[:, a] for a in sep), tree.shape(sep))
                order = np.argsort(key, kind="stable")
                starts = np.searchsorted(key[order], np.arange(table.shape[0] + 1))
                values = np.empty(n, dtype=np.int64)
                sorted_values = np.empty(n, dtype=np.int64)
                for s in np.flatnonzero(np.diff(starts)):  # per separator cell present, not per row
                    lo, hi = int(starts[s]), int(starts[s + 1])
                    row = table[s] if table[s].sum() > 0 else np.ones(table.shape[1])
                    sorted_values[lo:hi] = _assign(systematic_counts(row, hi - lo, rng.random()), rng)
                values[order] = sorted_values
            cells = np.unravel_index(values, tree.shape(new))
            for a, v in zip(new, cells, strict=True):
                out[:, a] = v
        return out[rng.permutation(n)]
