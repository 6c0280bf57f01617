"""Property-based tests of the lattice snap (Hypothesis, https://hypothesis.readthedocs.io).

:func:`dpkit.noise.lattice.snap` is the rounding step of the floating-point-safe release (Mironov
2012, "On significance of the least significant bits for differential privacy"): a value x becomes
the lattice point g·round(x/g), g = 2^k. The privacy argument needs, for every double x the release
can see (after :func:`~dpkit.noise.lattice.clamp_to_lattice`) and every lattice the mechanisms can
choose:

* the point lies on the grid: round(x/g) is an integer and g·round(x/g) is computed exactly;
* snapping moves x by at most half a step, |g·round(x/g) − x| <= g/2 (this is the rounding the
  mechanisms add to the sensitivity before calibrating);
* snapping is idempotent (a lattice point snaps to itself) and monotone (x <= y ⇒ snap(x) <= snap(y));
* clamping then snapping is total: no value, NaN and ±inf included, makes it raise.

All distances are checked in exact rational arithmetic. Runs are derandomized and bounded.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpkit.errors import InvalidDataError
from dpkit.noise.lattice import Lattice, choose_lattice, clamp_to_lattice, snap, value_limit

SETTINGS = settings(derandomize=True, database=None, max_examples=300, deadline=None)

# The exponents choose_lattice can return (it refuses scales outside them).
lattices = st.integers(min_value=-1000, max_value=960).map(Lattice)
any_doubles = st.lists(st.floats(width=64), min_size=1, max_size=16)
finite_doubles = st.lists(st.floats(allow_nan=False, allow_infinity=False, width=64), min_size=1, max_size=16)


def _clamped_points(values: list[float], lattice: Lattice) -> tuple[np.ndarray, np.ndarray]:
    x = clamp_to_lattice(np.array(values, dtype=np.float64), lattice)
    return x, snap(x, lattice)


@SETTINGS
@given(any_doubles, lattices)
def test_snapped_values_lie_on_the_grid(values: list[float], lattice: Lattice) -> None:
    _, points = _clamped_points(values, lattice)
    g = lattice.granularity
    assert np.isfinite(points).all()
    assert (np.rint(points) == points).all()
    for p in points.tolist():
        assert Fraction(p * g) == Fraction(p) * Fraction(g)  # the release's g·point is exact


@SETTINGS
@given(any_doubles, lattices)
def test_snapping_moves_a_value_by_at_most_half_a_step(values: list[float], lattice: Lattice) -> None:
    x, points = _clamped_points(values, lattice)
    half = Fraction(lattice.granularity) / 2
    for xi, p in zip(x.tolist(), points.tolist(), strict=True):
        assert abs(Fraction(p) * Fraction(lattice.granularity) - Fraction(xi)) <= half


@SETTINGS
@given(any_doubles, lattices)
def test_snapping_is_idempotent(values: list[float], lattice: Lattice) -> None:
    _, points = _clamped_points(values, lattice)
    on_grid = points * lattice.granularity
    np.testing.assert_array_equal(snap(clamp_to_lattice(on_grid, lattice), lattice), points)


@SETTINGS
@given(finite_doubles, lattices)
def test_snapping_is_monotone(values: list[float], lattice: Lattice) -> None:
    x = np.sort(np.array(values, dtype=np.float64))
    _, points = _clamped_points(x.tolist(), lattice)
    assert (np.diff(points) >= 0).all()


@SETTINGS
@given(any_doubles, lattices)
def test_snap_alone_returns_or_refuses_with_a_dpkit_error(values: list[float], lattice: Lattice) -> None:
    x = np.array(values, dtype=np.float64)
    try:
        points = snap(x, lattice)
    except InvalidDataError:
        assert not (np.isfinite(x).all() and (np.abs(x) <= value_limit(lattice)).all())
    else:
        assert np.isfinite(points).all()


@SETTINGS
@given(
    st.floats(min_value=2.0**-900, max_value=2.0**900),
    st.integers(min_value=1, max_value=10**7),
    st.sampled_from([1, 2]),
)
def test_the_lattice_is_a_fine_power_of_two_of_the_scale(scale: float, size: int, norm: int) -> None:
    g = choose_lattice(scale, size, norm=norm).granularity
    assert math.frexp(g)[0] == 0.5  # a power of two
    assert scale * 2.0**-48 < g <= scale * 2.0**-40


@pytest.mark.parametrize("value", [0.5, 1.5, 2.5, -0.5, -2.5])
def test_ties_round_to_even(value: float) -> None:
    assert snap(np.array([value]), Lattice(0))[0] == np.rint(value)
