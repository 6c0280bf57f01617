"""Empirical audits of joined queries, end to end through the Session, and of their broken twins.

For each kind of join, a base dataset D and D plus one hostile person, and the released count
sampled 500 times on each (``dpkit.audit.estimate_epsilon``). The guarantee check passes unless
the real ε exceeds the claim (false failure <= 1e-6); the power check runs the same query with
one safeguard removed, and must be caught:

* a private join (visits ⋈ prescriptions on the unit, join_rows 2 and 3, max_rows 100): the
  person's 40 × 40 rows are truncated to 2 × 3 = 6 joined rows, the count's ℓ1 (tight). Twin: an
  engine that runs the join untruncated (priced as if truncated): the person then adds 100 rows
  (max_rows), 17× the charge.
* a public join on a row-level dataset, count by region: the table of zones has 30 rows for the
  person's postcode and ``max_matches=2``, so the row adds 2 (tight). Twin: an engine that joins
  every zone (the max_matches truncation removed): 30, 15× the charge.
* ``keys_from``: a count by ward with the keys from the public ``wards`` table; the person's 30
  visits in w1 add max_rows = 2 (tight). Twin: the keys read from the private table's own values
  (the key table ignored), and the person has one more visit in w9, a ward no one else has: it
  appears in the answer (the audited number counts the answer's keys too).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

import dpkit as dp
from dpkit.analytics import Categorical, Metadata
from dpkit.analytics.dataset_metadata import DatasetMetadata
from dpkit.analytics.engines.duckdb import DuckDBEngine
from dpkit.analytics.plan import AggregationPlan, JoinPlan
from dpkit.analytics.session_tables import TableSet
from dpkit.audit import estimate_epsilon

SEED = 20261130
STRICT = 1 - 1e-6
TRIALS = 500
EPSILON = 1.0

Tables = dict[str, pd.DataFrame]


def _untruncated(plan: AggregationPlan, *, public_only: bool) -> AggregationPlan:
    """The plan with the join's truncations removed (of public tables only, or of all)."""
    j = plan.join
    assert j is not None

    def cut(src):  # type: ignore[no-untyped-def]
        return replace(src, keep=None) if src.public or not public_only else src

    return replace(plan, join=JoinPlan(cut(j.base), tuple(replace(s, source=cut(s.source)) for s in j.steps)))


#: A query: from the session, the built query (once per sample) and how to read one release.
Query = Callable[[dp.Session], Callable[[], int]]


def _sampler(meta: DatasetMetadata, query: Query):  # type: ignore[no-untyped-def]
    def sample(data: Tables, n: int, rng: np.random.Generator) -> np.ndarray:
        s = dp.Session(data, metadata=meta, budget=dp.Budget(epsilon=1e9), rng=rng)
        release = query(s)
        return np.array([release() for _ in range(n)])

    return sample


def _audit(meta: DatasetMetadata, query: Query, pair: tuple[Tables, Tables]) -> float:
    d0, d1 = pair
    res = estimate_epsilon(
        _sampler(meta, query), d0, d1, trials=TRIALS, confidence=STRICT, rng=np.random.default_rng(SEED)
    )
    return float(res.epsilon_lower)


# -- a private join ---------------------------------------------------------------------------------------

PRIVATE = DatasetMetadata(
    tables={
        "visits": Metadata(columns={"ward": Categorical()}, privacy_unit="pid", join_rows=2),
        "prescriptions": Metadata(columns={"drug": Categorical()}, privacy_unit="pid", join_rows=3),
    },
    max_groups=1,
    max_rows=100,
)


def _private_pair() -> tuple[Tables, Tables]:
    rng = np.random.default_rng(SEED)
    v = pd.DataFrame({"pid": rng.integers(0, 30, 80), "ward": rng.choice(np.array(["w1", "w2"]), 80)})
    p = pd.DataFrame({"pid": rng.integers(0, 30, 80), "drug": rng.choice(np.array(["x", "y"]), 80)})
    hv = pd.DataFrame({"pid": np.full(40, 999), "ward": ["w1"] * 40})
    hp = pd.DataFrame({"pid": np.full(40, 999), "drug": ["x"] * 40})
    base = {"visits": v, "prescriptions": p}
    return base, {
        "visits": pd.concat([v, hv], ignore_index=True),
        "prescriptions": pd.concat([p, hp], ignore_index=True),
    }


def _private_count(s: dp.Session) -> Callable[[], int]:
    q = s.query("visits").join("prescriptions", on="pid")
    return lambda: int(q.count(epsilon=EPSILON).value)


def test_a_private_join_count_keeps_its_epsilon() -> None:
    s = dp.Session(_private_pair()[0], metadata=PRIVATE, budget=dp.Budget(epsilon=10))
    r = s.query("visits").join("prescriptions", on="pid").count(epsilon=EPSILON)
    assert r.aggregates[0].sensitivity == 6  # the person's 40 × 40 rows add exactly 6: the claim is tight
    assert _audit(PRIVATE, _private_count, _private_pair()) <= EPSILON


def test_a_private_join_run_untruncated_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    real = DuckDBEngine.compute
    monkeypatch.setattr(DuckDBEngine, "compute", lambda self, plan: real(self, _untruncated(plan, public_only=False)))
    assert _audit(PRIVATE, _private_count, _private_pair()) > EPSILON


# -- a public join with duplicate keys, row-level ---------------------------------------------------------

ZONES = pd.DataFrame(
    {
        "postcode": ["A"] * 30 + ["B", "C"],
        "zone": [f"z{i}" for i in range(30)] + ["zb", "zc"],
        "region": ["north"] * 30 + ["north", "south"],
    }
)
PUBLIC = DatasetMetadata(
    tables={
        "visits": Metadata(columns={"postcode": Categorical()}, row_level=True),
        "zones": Metadata(
            columns={"postcode": Categorical(), "zone": Categorical(), "region": Categorical()},
            public=True,
            max_matches=2,
        ),
    }
)


def _public_pair() -> tuple[Tables, Tables]:
    rng = np.random.default_rng(SEED + 1)
    v = pd.DataFrame({"postcode": rng.choice(np.array(["B", "C"]), 60)})
    row = pd.DataFrame({"postcode": ["A"]})
    return {"visits": v, "zones": ZONES}, {"visits": pd.concat([v, row], ignore_index=True), "zones": ZONES}


def _north(s: dp.Session) -> Callable[[], int]:
    q = s.query("visits").join("zones", on="postcode").group_by("region")
    return lambda: int(q.count(epsilon=EPSILON).table["count"][0])  # (north, then south)


def test_a_public_join_count_by_region_keeps_its_epsilon() -> None:
    assert _audit(PUBLIC, _north, _public_pair()) <= EPSILON


def test_a_public_join_without_its_max_matches_truncation_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    real = DuckDBEngine.compute
    monkeypatch.setattr(DuckDBEngine, "compute", lambda self, plan: real(self, _untruncated(plan, public_only=True)))
    assert _audit(PUBLIC, _north, _public_pair()) > EPSILON


# -- keys from a public table ----------------------------------------------------------------------------

KEYS = DatasetMetadata(
    tables={
        "visits": Metadata(columns={"ward": Categorical()}, privacy_unit="pid"),
        "wards": Metadata(columns={"ward": Categorical()}, public=True, max_matches=1),
    },
    max_groups=1,
    max_rows=2,
)


def _keys_pair(*, elsewhere: bool) -> tuple[Tables, Tables]:
    """D, and D plus a person with 30 visits in w1 (which add max_rows = 2 to its count: tight)
    and, when ``elsewhere``, one in w9, a ward that nobody else has and the key table lacks."""
    rng = np.random.default_rng(SEED + 2)
    v = pd.DataFrame({"pid": rng.integers(0, 40, 100), "ward": rng.choice(np.array(["w1", "w2"]), 100)})
    wards = pd.DataFrame({"ward": ["w1", "w2", "w3"]})
    person = pd.DataFrame({"pid": 999, "ward": ["w1"] * 30 + (["w9"] if elsewhere else [])})
    return {"visits": v, "wards": wards}, {"visits": pd.concat([v, person], ignore_index=True), "wards": wards}


def _w1_and_shape(s: dp.Session) -> Callable[[], int]:
    """The count of w1, and (far above it) how many keys the answer has beyond the 3 of the table."""
    q = s.query("visits").group_by("ward", keys_from="wards")

    def release() -> int:
        t = q.count(epsilon=EPSILON).table
        return int(t["count"][0]) + 10**6 * (len(t) - 3)  # (w1 first: the keys are sorted)

    return release


def test_a_count_with_keys_from_a_public_table_keeps_its_epsilon() -> None:
    assert _audit(KEYS, _w1_and_shape, _keys_pair(elsewhere=False)) <= EPSILON


def test_keys_read_from_the_private_table_instead_are_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    def private_keys(self: TableSet, table: object, columns: tuple[str, ...]) -> object:
        return self.engines["visits"].distinct_rows(tuple(columns))  # type: ignore[attr-defined]

    monkeypatch.setattr(TableSet, "keys", private_keys)
    assert _audit(KEYS, _w1_and_shape, _keys_pair(elsewhere=True)) > EPSILON
