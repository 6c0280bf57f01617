"""Adding one person to a joined query moves its pre-noise answer by at most what it is priced at.

For each kind of join, a base dataset D and D plus one hostile person — 40 visits and 40
prescriptions, every value at or beyond its declared bounds, all in the postcode with the most
public rows (``_joins_data``) — run the same query with the noise off and the same salt. Every
noisy part (counts, sums, per group) must move by at most its mechanism's ℓ1 sensitivity, which
the price states (``AggregateInfo.sensitivity``, the mechanism in the priced event). The theorem
of :mod:`dpkit.analytics.joins` says more for a private join: the person's joined rows are at
most ``join_rows(visits) · join_rows(prescriptions)``, and every other person keeps exactly the
rows they kept (each truncation depends on a person's own rows); both are checked on the joined
relation itself, and the bound is attained, so it is tight.

Deterministic (noise off, fixed salts): false-failure rate 0.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import pytest

import dpkit as dp
from analytics._joins_data import (
    AREA_MATCHES,
    HOSTILE,
    JOIN_ROWS,
    SEED,
    exact_run,
    joined_relation,
    metadata,
    session,
    tables,
)
from dpkit.analytics import Count, CountUnits, Sum
from dpkit.analytics.dataset_metadata import DatasetMetadata
from dpkit.analytics.query import Query

TRUNCATED = JOIN_ROWS["visits"] * JOIN_ROWS["prescriptions"]


@dataclass(frozen=True)
class Kind:
    """One kind of joined query: its metadata, the query, and the ℓ1 of its count as the joins
    module prices it (the contribution bounds G·R, or T = the product of the join's bounds)."""

    meta: DatasetMetadata
    query: Callable[[dp.Session], Query]
    count_l1: int
    aggregates: tuple[Any, ...] = (Count(), Sum("cost"))


def _v(s: dp.Session) -> Query:
    return s.query("visits")


KINDS: dict[str, Kind] = {
    "public inner": Kind(
        metadata(max_groups=2, max_rows=3), lambda s: _v(s).join("regions", on="postcode").group_by("region"), 6
    ),
    "public left": Kind(
        metadata(max_groups=2, max_rows=3),
        lambda s: _v(s).join("regions", on="postcode", how="left").group_by("region"),
        6,
    ),
    "duplicate keys": Kind(
        metadata(max_groups=2, max_rows=3), lambda s: _v(s).join("areas", on="postcode").group_by("area"), 6
    ),
    "private inner": Kind(
        metadata(),
        lambda s: _v(s).join("prescriptions", on="pid").group_by("drug"),
        TRUNCATED,
        (Count(), Sum("cost"), Sum("dose"), CountUnits()),
    ),
    "private left": Kind(
        metadata(),
        lambda s: _v(s).join("prescriptions", on="pid", how="left"),
        TRUNCATED,
        (Count(), Sum("cost"), Sum("dose")),
    ),
    "chain": Kind(
        metadata(),
        lambda s: _v(s).join("prescriptions", on="pid").join("areas", on="postcode").group_by("area"),
        TRUNCATED * AREA_MATCHES,
        (Count(), Sum("dose")),
    ),
    "keys_from": Kind(metadata(max_groups=2, max_rows=3), lambda s: _v(s).group_by("ward", keys_from="wards"), 6),
    "row-level": Kind(
        metadata(row_level=True), lambda s: _v(s).join("areas", on="postcode").group_by("area"), AREA_MATCHES
    ),
}


def _run(kind: Kind, data: dict[str, pd.DataFrame]) -> tuple[dp.Session, Any, Any]:
    s = session(data, kind.meta, seed=SEED)
    with exact_run() as run:
        r = kind.query(s).aggregate(list(kind.aggregates), epsilon=1)
    return s, r, run


def _tables(seed: int, row_level: bool, hostile: bool) -> dict[str, pd.DataFrame]:
    d = tables(seed, hostile=hostile and not row_level)
    if row_level and hostile:  # one more row: a visit in A, its cost far beyond the bounds
        extra = pd.DataFrame({"pid": [HOSTILE], "postcode": ["A"], "cost": [1e6], "ward": ["w1"]})
        d["visits"] = pd.concat([d["visits"], extra], ignore_index=True)
    return d


@pytest.mark.parametrize("name", list(KINDS))
def test_one_person_moves_every_noisy_part_by_at_most_its_priced_sensitivity(name: str) -> None:
    kind = KINDS[name]
    row_level = "prescriptions" not in kind.meta.tables
    moved = []
    for seed in (SEED, SEED + 1, SEED + 2):
        _, a, run_a = _run(kind, _tables(seed, row_level, hostile=False))
        _, b, run_b = _run(kind, _tables(seed, row_level, hostile=True))
        assert run_a.salt == run_b.salt
        # the analyst sees the same shape: the keys are public
        assert list(a.table.columns) == list(b.table.columns) and a.table.shape == b.table.shape
        for g in a.groups:
            assert a.table[g].tolist() == b.table[g].tolist()
        assert len(run_a.parts) == len(run_b.parts) > 0
        for (sens_a, ints_a), (sens_b, ints_b) in zip(run_a.parts, run_b.parts, strict=True):
            assert sens_a == sens_b
            assert int(np.abs(ints_b - ints_a).sum()) <= sens_a
        # the price: the count's ℓ1 is the contribution bounds or the join's bound T
        assert a.aggregates[0].sensitivity == kind.count_l1
        moved.append(int(np.abs(run_b.parts[0][1] - run_a.parts[0][1]).sum()))
    assert max(moved) > 0  # the hostile person is seen at all


@pytest.mark.parametrize("name", ["private inner", "private left", "chain", "row-level"])
def test_the_join_bound_is_attained(name: str) -> None:
    """The hostile person's visits all meet their prescriptions and the postcode with the most
    areas: their joined rows are exactly the product of the bounds, the count moves by exactly
    the priced ℓ1, and a sum of values at the upper bound by exactly its sensitivity."""
    kind = KINDS[name]
    row_level = "prescriptions" not in kind.meta.tables
    _, a, run_a = _run(kind, _tables(SEED, row_level, hostile=False))
    _, b, run_b = _run(kind, _tables(SEED, row_level, hostile=True))
    count = int(np.abs(run_b.parts[0][1] - run_a.parts[0][1]).sum())
    assert count == kind.count_l1 == run_a.parts[0][0]
    sums = [i for i, agg in enumerate(kind.aggregates) if isinstance(agg, Sum)]
    for i in sums:  # (one part per aggregate here: counts and sums)
        sens, ints = run_a.parts[i]
        assert int(np.abs(run_b.parts[i][1] - ints).sum()) == sens


@pytest.mark.parametrize("name", ["private inner", "private left", "chain", "public inner", "duplicate keys"])
def test_the_other_people_keep_exactly_their_joined_rows(name: str) -> None:
    kind = KINDS[name]
    for seed in (SEED, SEED + 1):
        s_a, _, run = _run(kind, _tables(seed, False, hostile=False))
        s_b, _, _ = _run(kind, _tables(seed, False, hostile=True))
        plan = run.plans[-1].join
        assert plan is not None
        before = joined_relation(s_a, plan, run.salt)
        after = joined_relation(s_b, plan, run.salt)
        cols = sorted(before.columns)
        others = after[after["pid"] != HOSTILE]
        pd.testing.assert_frame_equal(
            before[cols].sort_values(cols, na_position="last").reset_index(drop=True),
            others[cols].sort_values(cols, na_position="last").reset_index(drop=True),
        )
        mine = int((after["pid"] == HOSTILE).sum())
        bound = kind.query(s_a)._t.max_unit_rows  # the person's joined rows are within it
        assert bound is None or mine <= bound
        if name.startswith("private") or name == "chain":
            assert mine == bound  # 40 rows a side, all matching: the product is reached


def test_a_row_level_row_meets_at_most_max_matches_public_rows_and_changes_nobody_elses() -> None:
    kind = KINDS["row-level"]
    s_a, _, run = _run(kind, _tables(SEED, True, hostile=False))
    s_b, _, _ = _run(kind, _tables(SEED, True, hostile=True))
    plan = run.plans[-1].join
    assert plan is not None
    before = joined_relation(s_a, plan, run.salt)
    after = joined_relation(s_b, plan, run.salt)
    cols = sorted(before.columns)
    others = after[after["cost"] != 1e6]  # (no row of D costs 1e6)
    pd.testing.assert_frame_equal(
        before[cols].sort_values(cols).reset_index(drop=True), others[cols].sort_values(cols).reset_index(drop=True)
    )
    assert len(after) - len(before) == AREA_MATCHES  # postcode A has 5 areas; the join keeps 2


@pytest.mark.parametrize("neighbours", ["add_remove", "replace"])
def test_the_priced_sensitivities_of_a_private_join(neighbours: str) -> None:
    """The event of a private-join query: ℓ1 = min(G·R, T) per count, T·(sum bound) per sum,
    G per count of units, twice as much when a person is replaced rather than added."""
    twice = 2 if neighbours == "replace" else 1
    d = tables()
    meta = metadata(max_groups=2, max_rows=4)
    s = dp.Session(d, metadata=meta, budget=dp.Budget(epsilon=10), neighbours=neighbours)
    q = s.query("visits").join("prescriptions", on="pid").group_by("drug")
    with exact_run():
        r = q.aggregate([Count(), CountUnits(), Sum("dose")], epsilon=1)
    sens = [a.sensitivity for a in r.aggregates]
    assert sens[0] == twice * min(2 * 4, TRUNCATED)
    assert sens[1] == twice * 2
    assert sens[2] == pytest.approx(twice * min(2 * 4, TRUNCATED) * 8)
    assert q.cost([Count(), CountUnits(), Sum("dose")], epsilon=1).event == r.event  # priced as it ran
