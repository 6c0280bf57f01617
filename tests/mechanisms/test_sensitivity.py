"""Tests for dpkit.mechanisms.sensitivity: global sensitivities under each neighbour relation.

Every value is checked against a hand computation and, for the small queries, against a brute
force over neighbouring data sets drawn from a tiny universe.
"""

from __future__ import annotations

import dataclasses
import itertools
import math

import numpy as np
import pytest

from dpkit.errors import InvalidParameterError
from dpkit.mechanisms import sensitivity
from dpkit.mechanisms.sensitivity import Sensitivity, bounded_sum, count, counting_queries, histogram


@pytest.mark.parametrize("nb", ["add_remove", "replace"])
def test_count(nb):
    s = count(nb)
    assert isinstance(s, Sensitivity)
    assert (s.l1, s.l2, s.neighbours) == (1.0, 1.0, nb)


def test_count_default_is_add_remove():
    assert count().neighbours == "add_remove"


@pytest.mark.parametrize(
    "lower, upper, add_remove, replace",
    [
        (-3, 2, 3.0, 5.0),
        (0, 10, 10.0, 10.0),
        (2, 5, 5.0, 3.0),
        (-5, -2, 5.0, 3.0),
        (-1.5, 1.5, 1.5, 3.0),
        (0.25, 0.5, 0.5, 0.25),
    ],
)
def test_bounded_sum(lower, upper, add_remove, replace):
    s = bounded_sum(lower, upper, "add_remove")
    assert (s.l1, s.l2, s.neighbours) == (add_remove, add_remove, "add_remove")
    s = bounded_sum(lower, upper, "replace")
    assert (s.l1, s.l2, s.neighbours) == (replace, replace, "replace")


def _brute_force_sum(lower: float, upper: float, nb: str) -> float:
    """Largest |sum(D) − sum(D')| over data sets of up to 3 values from a grid of [lower, upper]."""
    grid = np.linspace(lower, upper, 5)
    worst = 0.0
    for n in range(0, 4):
        for d in itertools.product(grid, repeat=n):
            if nb == "add_remove":
                for extra in grid:  # D' = D + one record
                    worst = max(worst, abs(extra))
            elif n:
                for new in grid:  # replace the first record
                    worst = max(worst, abs(new - d[0]))
    return worst


@pytest.mark.parametrize("lower, upper", [(-3, 2), (2, 5), (-5, -2)])
@pytest.mark.parametrize("nb", ["add_remove", "replace"])
def test_bounded_sum_matches_brute_force(lower, upper, nb):
    assert bounded_sum(lower, upper, nb).l1 == pytest.approx(_brute_force_sum(lower, upper, nb), abs=1e-12)


def test_histogram():
    s = histogram("add_remove")
    assert (s.l1, s.l2, s.neighbours) == (1.0, 1.0, "add_remove")
    s = histogram("replace")
    assert (s.l1, s.neighbours) == (2.0, "replace")
    assert s.l2 == math.sqrt(2.0)
    assert histogram().neighbours == "add_remove"


def test_histogram_replace_brute_force():
    # Moving one record between bins of a 4-bin histogram: ℓ1 change 2, ℓ2 change √2.
    k = 4
    l1 = l2 = 0.0
    for a, b in itertools.product(range(k), repeat=2):
        diff = np.zeros(k)
        diff[a] -= 1
        diff[b] += 1
        l1, l2 = max(l1, np.abs(diff).sum()), max(l2, np.sqrt((diff**2).sum()))
    assert (histogram("replace").l1, histogram("replace").l2) == (l1, l2)


@pytest.mark.parametrize("k", [1, 2, 9, 100])
@pytest.mark.parametrize("nb", ["add_remove", "replace"])
def test_counting_queries(k, nb):
    s = counting_queries(k, nb)
    assert s.l1 == float(k)
    assert s.l2 == math.sqrt(k)
    assert s.neighbours == nb


def test_counting_queries_accepts_numpy_integers():
    assert counting_queries(np.int64(4)).l2 == 2.0


def test_sensitivity_is_frozen():
    s = count()
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.l1 = 0.0  # type: ignore[misc]


def test_module_is_reexported():
    import dpkit

    assert dpkit.sensitivity is sensitivity
    assert sensitivity.count is count


# ------------------------------------------------------------------------------------------------
# bad input
# ------------------------------------------------------------------------------------------------

BAD_NEIGHBOURS = ["add-remove", "Replace", "bounded", "", None, 0, ("add_remove",)]


@pytest.mark.parametrize("nb", BAD_NEIGHBOURS)
@pytest.mark.parametrize(
    "query",
    [
        lambda nb: count(nb),
        lambda nb: bounded_sum(0, 1, nb),
        lambda nb: histogram(nb),
        lambda nb: counting_queries(3, nb),
    ],
    ids=["count", "bounded_sum", "histogram", "counting_queries"],
)
def test_bad_neighbours(query, nb):
    with pytest.raises(InvalidParameterError) as info:
        query(nb)
    assert info.value.name == "neighbours"
    assert "'add_remove' or 'replace'" in str(info.value)


@pytest.mark.parametrize("lower, upper", [(2, 1), (1, 1), (0.0, -0.0), (5.0, -5.0)])
def test_bounded_sum_reversed_or_equal_bounds(lower, upper):
    with pytest.raises(InvalidParameterError) as info:
        bounded_sum(lower, upper)
    assert info.value.name == "bounds"
    assert "lower < upper" in str(info.value)


@pytest.mark.parametrize(
    "lower, upper, name",
    [
        (float("nan"), 1.0, "bounds.lower"),
        (0.0, float("nan"), "bounds.upper"),
        (-float("inf"), 1.0, "bounds.lower"),
        (0.0, float("inf"), "bounds.upper"),
        ("0", 1.0, "bounds.lower"),
        (0.0, None, "bounds.upper"),
        (False, 1.0, "bounds.lower"),
    ],
)
def test_bounded_sum_non_finite_bounds(lower, upper, name):
    with pytest.raises(InvalidParameterError) as info:
        bounded_sum(lower, upper)
    assert info.value.name == name
    assert name in str(info.value)


@pytest.mark.parametrize("k", [0, -1, 2.0, 1.5, "3", True, None])
def test_counting_queries_bad_k(k):
    with pytest.raises(InvalidParameterError) as info:
        counting_queries(k)
    assert info.value.name == "k"
    assert "integer" in str(info.value)
