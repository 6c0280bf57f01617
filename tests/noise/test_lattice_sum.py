"""The one exact lattice sum and the one δ margin of lattice Gaussian noise."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from dpkit.noise.lattice import DELTA_MARGIN, exact_lattice_sum


def test_delta_margin_is_one_minus_two_to_the_minus_twenty() -> None:
    assert Fraction(DELTA_MARGIN) == 1 - Fraction(1, 2**20)


def test_sum_matches_python_integers_beyond_int64() -> None:
    rng = np.random.default_rng(7)
    steps = rng.integers(-(2**62), 2**62, size=(5000, 3))
    got = exact_lattice_sum(steps)
    assert got.shape == (3,)
    assert [int(g) for g in got] == [sum(int(x) for x in steps[:, j]) for j in range(3)]
    one = exact_lattice_sum(steps[:, 0])
    assert int(one) == sum(int(x) for x in steps[:, 0])  # 1-D input: one Python integer


def test_grouped_sums_match_per_group_sums() -> None:
    rng = np.random.default_rng(8)
    steps = rng.integers(-(2**61), 2**61, size=(3000, 2))
    labels = rng.integers(0, 4, size=3000)
    got = exact_lattice_sum(steps, labels=labels, groups=5)
    assert got.shape == (5, 2)
    for g in range(5):
        for j in range(2):
            assert int(got[g, j]) == sum(int(x) for x in steps[labels == g, j])
    assert int(got[4, 0]) == 0  # an empty group sums to zero


@pytest.mark.parametrize("n", [0, 1, (1 << 20) + 3])
def test_chunk_boundaries(n: int) -> None:
    steps = np.full(n, 2**40 + 1, dtype=np.int64)
    assert int(exact_lattice_sum(steps)) == n * (2**40 + 1)
