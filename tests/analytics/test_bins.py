"""A number of equal-width bins over a numeric column's declared bounds (``bins=10``): the edges
come from the metadata alone, and the result is the one the explicit edges give."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import dpkit as dp
from dpkit.analytics import Metadata, Numeric, QueryLimits
from dpkit.errors import InvalidParameterError, LimitExceededError


def _session(limits: QueryLimits | None = None) -> dp.Session:
    rng = np.random.default_rng(3)
    frame = pd.DataFrame({"hours": rng.integers(0, 101, 500).astype(float), "free": rng.normal(size=500)})
    meta = Metadata(columns={"hours": Numeric(0, 100), "free": Numeric()}, row_level=True)
    return dp.Session(frame, metadata=meta, budget=dp.Budget(epsilon=100.0), rng=np.random.default_rng(0), limits=limits)


def test_a_number_of_bins_is_the_equal_width_edges_over_the_declared_bounds() -> None:
    by_count = _session().histogram("hours", bins=4, epsilon=1.0)
    by_edges = _session().histogram("hours", bins=[0, 25, 50, 75, 100], epsilon=1.0)
    pd.testing.assert_frame_equal(by_count.table, by_edges.table)  # same keys, same seeded noise
    assert list(by_count.table["hours"]) == list(by_edges.table["hours"]) and len(by_count.table) == 4
    other = _session().histogram("hours", bins=[0, 20, 50, 75, 100], epsilon=1.0)
    assert list(other.table["hours"]) != list(by_count.table["hours"])  # the comparison can tell


def test_group_by_takes_a_number_of_bins_too() -> None:
    r = _session().query().group_by("hours", bins={"hours": 10}).count(epsilon=1.0)
    assert len(r.table) == 10


@pytest.mark.parametrize("bins", [0, -3])
def test_a_bad_number_of_bins_is_refused(bins: int) -> None:
    with pytest.raises(InvalidParameterError) as info:
        _session().histogram("hours", bins=bins, epsilon=1.0)
    assert info.value.name == "bins['hours']"


def test_a_column_without_declared_bounds_needs_explicit_edges() -> None:
    s = _session()
    with pytest.raises(InvalidParameterError) as info:
        s.histogram("free", bins=5, epsilon=1.0)
    assert info.value.name == "bins['free']" and "declared bounds" in str(info.value)
    assert s.spent == (0.0, 0.0)  # refused before paying


def test_too_many_bins_is_over_the_key_limit_before_any_edge_is_built() -> None:
    s = _session(QueryLimits(max_keys=100))
    with pytest.raises(LimitExceededError):
        s.histogram("hours", bins=10**12, epsilon=1.0)
    assert s.spent == (0.0, 0.0)
