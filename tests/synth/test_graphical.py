"""The graphical model of dpkit.synth: its junction tree, its fit to marginals, and its sampler
(systematic within each separator cell; a row-order twin fails the same check).

Deterministic (fixed seeds); the sampling checks allow more than 6 standard deviations of
sampling error (false-failure rate below 1e-8 each)."""

from __future__ import annotations

import numpy as np
import pytest

from dpkit.synth import graphical
from dpkit.synth.graphical import GraphicalModel, JunctionTree, tree_size

SIZES = (3, 4, 5, 2)


def _data(n: int = 20_000) -> np.ndarray:
    rng = np.random.default_rng(0)
    a = rng.integers(0, 3, n)
    b = (a + rng.integers(0, 2, n)) % 4
    c = (b + a + rng.integers(0, 2, n)) % 5
    d = (c > 2).astype(int) ^ (rng.random(n) < 0.1)
    return np.stack([a, b, c, d], 1)


def _marginal(x: np.ndarray, clique: tuple[int, ...]) -> np.ndarray:
    shape = [SIZES[i] for i in clique]
    idx = np.ravel_multi_index(tuple(x[:, i] for i in clique), shape)
    return np.bincount(idx, minlength=int(np.prod(shape))).reshape(shape).astype(float)


def test_the_junction_tree_holds_every_measured_clique() -> None:
    measured = [(0, 1), (1, 2), (0, 2), (2, 3)]
    tree = JunctionTree.build(SIZES, measured)
    assert sorted(tree.cliques) == [(0, 1, 2), (2, 3)]
    assert all(any(set(m) <= set(c) for c in tree.cliques) for m in measured)
    assert tree_size(SIZES, measured) == 3 * 4 * 5 + 5 * 2
    # a chain needs no fill-in; a 4-cycle gets one chord
    assert tree_size(SIZES, [(0, 1), (1, 2), (2, 3)]) == 12 + 20 + 10
    assert max(len(c) for c in JunctionTree.build(SIZES, [(0, 1), (1, 2), (2, 3), (0, 3)]).cliques) == 3


def test_the_fit_reproduces_consistent_marginals() -> None:
    x = _data()
    measured = [(0, 1), (1, 2), (0, 2), (2, 3)]
    model = GraphicalModel(JunctionTree.build(SIZES, measured), float(len(x)))
    model.fit([(c, _marginal(x, c), 1.0) for c in measured], 300)
    mu = model.marginals()
    for c in measured:
        assert np.abs(model.project(mu, c) - _marginal(x, c)).sum() / len(x) < 0.01
    assert all(abs(m.sum() - len(x)) < 1e-6 * len(x) for m in mu)


def _siblings_model() -> GraphicalModel:
    """Column 1 at the root, columns 2 and 3 each tied to it and independent given it."""
    x = _data()
    measured = [(1, 2), (1, 3)]
    model = GraphicalModel(JunctionTree.build(SIZES, measured), 1.0)
    model.fit([(c, _marginal(x, c) / len(x), 1e-3) for c in measured], 300)
    return model


def _siblings_tvd(sample: np.ndarray, model: GraphicalModel) -> float:
    mu = model.marginals()
    p12, p13 = model.project(mu, (1, 2)), model.project(mu, (1, 3))
    p1 = p12.sum(axis=1)
    want = np.einsum("ab,ac->bc", p12, p13 / p1[:, None])
    got = np.bincount(sample[:, 2] * 2 + sample[:, 3], minlength=10).reshape(5, 2) / len(sample)
    return 0.5 * float(np.abs(got - want / want.sum()).sum())


def test_the_sample_has_the_models_marginals() -> None:
    model = _siblings_model()
    n = 40_000
    s = model.sample(n, np.random.default_rng(1))
    mu = model.marginals()
    for c in [(1, 2), (1, 3)]:
        want = model.project(mu, c) / model.total * n
        assert np.abs(_marginal(s, c) - want).max() <= 2 + 1e-9  # systematic: within a row or two per cell
    assert _siblings_tvd(s, model) < 0.02


def test_a_row_order_sampler_fails_the_same_check(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(graphical, "_assign", lambda counts, rng: np.repeat(np.arange(counts.size), counts))
    model = _siblings_model()
    s = model.sample(40_000, np.random.default_rng(1))
    assert _siblings_tvd(s, model) > 0.05
