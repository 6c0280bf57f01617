"""Joins: what is refused before anything is paid, the joined table's declared facts, and the price.

Refusals (:mod:`dpkit.analytics.joins`) are decided from the request and the metadata alone: each
is an InvalidParameterError naming the parameter and the value, nothing is spent, the engine
never runs and no private table is read (public tables may be: their values are public).
The price of a joined query is the contribution bounds, or the join's own bound T (the product
of ``join_rows`` and ``max_matches``) when it is smaller — each case here states its number.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pandas as pd
import pytest

import dpkit as dp
from analytics._joins_data import (
    AREA_MATCHES,
    JOIN_ROWS,
    REGIONS,
    exact_run,
    metadata,
    session,
    tables,
)
from dpkit.analytics import Categorical, Count, CountUnits, Metadata, Numeric, QueryLimits, Sum
from dpkit.analytics.dataset_metadata import DatasetMetadata
from dpkit.analytics.engines.duckdb import DuckDBEngine
from dpkit.analytics.plan import And, Compare, IsNull
from dpkit.analytics.pricing import price_built
from dpkit.analytics.query import Query
from dpkit.analytics.spec import Join, QueryOptions
from dpkit.errors import InvalidParameterError

TRUNCATED = JOIN_ROWS["visits"] * JOIN_ROWS["prescriptions"]


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[str, Any]]]:
    """Every engine computation and every read of a table's values, as (what, engine)."""
    log: list[tuple[str, Any]] = []
    compute, distinct = DuckDBEngine.compute, DuckDBEngine.distinct_rows

    def spy_compute(self: DuckDBEngine, plan: Any) -> Any:
        log.append(("compute", self))
        return compute(self, plan)

    def spy_distinct(self: DuckDBEngine, columns: tuple[str, ...]) -> Any:
        log.append(("distinct", self))
        return distinct(self, columns)

    monkeypatch.setattr(DuckDBEngine, "compute", spy_compute)
    monkeypatch.setattr(DuckDBEngine, "distinct_rows", spy_distinct)
    yield log


def _extra(name: str, frame: pd.DataFrame, meta: Metadata) -> dp.Session:
    """The test dataset with one more table."""
    base = metadata()
    m = DatasetMetadata(tables={**base.tables, name: meta}, max_groups=base.max_groups, max_rows=base.max_rows)
    return session({**tables(), name: frame}, m, epsilon=10)


def _without(table: str, **changes: Any) -> dp.Session:
    """The test dataset with ``table``'s metadata changed."""
    base = metadata()
    old = base.tables[table].to_dict()
    old.update(changes)
    old = {k: v for k, v in old.items() if v is not None}
    m = DatasetMetadata(tables={**base.tables, table: Metadata.from_dict(old)}, max_groups=1, max_rows=1)
    return session(tables(), m, epsilon=10)


def _v(s: dp.Session) -> Query:
    return s.query("visits")


NUMS = pd.DataFrame({"code": [1.0, 2.0], "label": ["a", "b"]})
NUMS_META = Metadata(columns={"code": Numeric(0, 10), "label": Categorical()}, public=True, max_matches=1)

#: (case, the session, the query — refused somewhere along the way —, parameter, value)
REFUSED: list[tuple[str, Callable[[], dp.Session], Callable[[dp.Session], Any], str, Any]] = [
    (
        "undeclared column",
        lambda: session(tables(), metadata()),
        lambda s: _v(s).join("regions", on="zip"),
        "on",
        "visits.zip",
    ),
    (
        "undeclared right column",
        lambda: session(tables(), metadata()),
        lambda s: _v(s).join("regions", on={"postcode": "zip"}),
        "on",
        "regions.zip",
    ),
    (
        "private tables on a non-unit column",
        lambda: session(tables(), metadata()),
        lambda s: _v(s).join("prescriptions", on={"ward": "drug"}),
        "on",
        "visits.ward = prescriptions.drug",
    ),
    (
        "private tables on the unit and another column",
        lambda: session(tables(), metadata()),
        lambda s: _v(s).join("prescriptions", on=["pid", ("ward", "drug")]),
        "on",
        "visits.ward = prescriptions.drug",
    ),
    ("cross join", lambda: session(tables(), metadata()), lambda s: _v(s).join("regions", on=[]), "on", "[]"),
    (
        "right join",
        lambda: session(tables(), metadata()),
        lambda s: _v(s).join("regions", on="postcode", how="right"),
        "how",
        "'right'",
    ),
    (
        "public table without max_matches",
        lambda: _without("regions", max_matches=None),
        lambda s: _v(s).join("regions", on="postcode"),
        "join.table",
        "regions",
    ),
    (
        "private join without join_rows",
        lambda: _without("prescriptions", join_rows=None),
        lambda s: _v(s).join("prescriptions", on="pid"),
        "tables.prescriptions.join_rows",
        None,
    ),
    (
        "type mismatch",
        lambda: _extra("nums", NUMS, NUMS_META),
        lambda s: _v(s).join("nums", on={"postcode": "code"}),
        "on",
        "visits.postcode = nums.code",
    ),
    (
        "the unit against a public column",
        lambda: session(tables(), metadata()),
        lambda s: _v(s).join("wards", on={"pid": "ward"}),
        "on",
        "visits.pid = wards.ward",
    ),
    (
        "a table twice",
        lambda: session(tables(), metadata()),
        lambda s: _v(s).join("regions", on="postcode").join("regions", on="postcode"),
        "join.table",
        "regions",
    ),
    (
        "ambiguous column",
        lambda: session(tables(), metadata()),
        lambda s: _v(s).join("regions", on="postcode").join("areas", on="postcode"),
        "on",
        "postcode",
    ),
    (
        "unknown table",
        lambda: session(tables(), metadata()),
        lambda s: _v(s).join("nowhere", on="postcode"),
        "join.table",
        "'nowhere'",
    ),
    ("from a public table", lambda: session(tables(), metadata()), lambda s: s.query("regions"), "from", "regions"),
    (
        "a public table left join a private one",
        lambda: session(tables(), metadata()),
        lambda s: s._tables.joined("regions", [Join("visits", "postcode", "left")]),
        "from",
        "regions",
    ),
    ("from an unknown table", lambda: session(tables(), metadata()), lambda s: s.query("nowhere"), "from", "'nowhere'"),
    (
        "which private table",
        lambda: session(tables(), metadata()),
        lambda s: s.query().count(epsilon=1),
        "table",
        None,
    ),
    (
        "a join on a one-table session",
        lambda: dp.Session(
            tables()["visits"],
            metadata=Metadata(columns={"postcode": Categorical()}, privacy_unit="pid"),
            budget=dp.Budget(epsilon=10),
        ),
        lambda s: s.query().join("regions", on="postcode"),
        "join.table",
        "'regions'",
    ),
    (
        "keys_from on a one-table session",
        lambda: dp.Session(
            tables()["visits"],
            metadata=Metadata(columns={"ward": Categorical()}, privacy_unit="pid"),
            budget=dp.Budget(epsilon=10),
        ),
        lambda s: s.query().group_by("ward", keys_from="wards"),
        "keys_from",
        "'wards'",
    ),
    (
        "a join after where",
        lambda: session(tables(), metadata()),
        lambda s: _v(s).where("cost > 1").join("regions", on="postcode"),
        "join",
        "'regions'",
    ),
    (
        "a join after group_by",
        lambda: session(tables(), metadata()),
        lambda s: _v(s).group_by("ward", keys=["w1"]).join("regions", on="postcode"),
        "join",
        "'regions'",
    ),
    (
        "keys from a private table",
        lambda: session(tables(), metadata()),
        lambda s: _v(s).group_by("ward", keys_from="prescriptions"),
        "keys_from",
        "prescriptions",
    ),
    (
        "keys from a table without the column",
        lambda: session(tables(), metadata()),
        lambda s: _v(s).group_by("ward", keys_from="regions"),
        "keys_from",
        "regions.ward",
    ),
    (
        "keys_from with keys",
        lambda: session(tables(), metadata()),
        lambda s: _v(s).group_by("ward", keys_from="wards", keys=["w1"]),
        "keys_from",
        "'wards'",
    ),
]


@pytest.mark.parametrize(("case", "make", "build", "name", "value"), REFUSED, ids=[c[0] for c in REFUSED])
def test_a_refused_join_costs_nothing_runs_nothing_and_names_the_parameter(
    reads: list[tuple[str, Any]],
    case: str,
    make: Callable[[], dp.Session],
    build: Callable[[dp.Session], Any],
    name: str,
    value: Any,
) -> None:
    s = make()
    before = s.spent
    with pytest.raises(InvalidParameterError) as info:
        q = build(s)
        q.count(epsilon=1)  # (refused before this, when the query is built)
    err = info.value
    assert (err.name, err.value) == (name, value), str(err)
    assert name in str(err)
    assert s.spent == before == (0.0, 0.0)
    assert not [r for r in reads if r[0] == "compute"]
    tables_ = getattr(s, "_tables", None)
    if tables_ is not None:  # only public tables' values were read, if any
        public = {id(tables_.engines[t]) for t in tables_.dataset.public_tables}
        assert all(id(engine) in public for _, engine in reads)


def test_refusals_name_what_to_declare() -> None:
    with pytest.raises(InvalidParameterError) as info:
        _v(_without("regions", max_matches=None)).join("regions", on="postcode")
    assert info.value.fix is not None and info.value.fix.kind == "declare_max_matches"
    assert info.value.fix.facts == {"table": "regions"}
    with pytest.raises(InvalidParameterError) as info:
        _v(_without("prescriptions", join_rows=None)).join("prescriptions", on="pid")
    assert info.value.fix is not None and info.value.fix.kind == "declare_join_rows"
    with pytest.raises(InvalidParameterError, match="privacy units of two private tables"):
        _v(session(tables(), metadata())).join("prescriptions", on={"ward": "drug"})
    with pytest.raises(InvalidParameterError, match="cross join"):
        _v(session(tables(), metadata())).join("regions", on={})


def test_private_tables_of_a_row_level_dataset_cannot_be_joined() -> None:
    m = DatasetMetadata(
        tables={
            "visits": Metadata(
                columns={"postcode": Categorical(), "pid": Categorical(value_type="integer")}, row_level=True
            ),
            "prescriptions": Metadata(columns={"pid": Categorical(value_type="integer")}, row_level=True),
        }
    )
    d = tables()
    s = dp.Session(
        {"visits": d["visits"], "prescriptions": d["prescriptions"]}, metadata=m, budget=dp.Budget(epsilon=1)
    )
    with pytest.raises(InvalidParameterError) as info:
        s.query("visits").join("prescriptions", on="pid")
    assert info.value.name in ("on", "join.table")
    assert s.spent == (0.0, 0.0)


# -- the joined table's declared facts ------------------------------------------------------------------


def test_joined_columns_are_qualified_and_bare_where_unambiguous() -> None:
    s = session(tables(), metadata())
    t = _v(s).join("prescriptions", on="pid").join("regions", on="postcode")._t
    assert t.table == "visits ⋈ prescriptions ⋈ regions" and t.tables == ("visits", "prescriptions", "regions")
    assert t.unit == "pid" and t.columns["pid"] == "unit"
    for table, cols in (
        ("visits", ("postcode", "cost", "ward")),
        ("prescriptions", ("drug", "dose")),
        ("regions", ("postcode", "region")),
    ):
        assert all(f"{table}.{c}" in t.columns for c in cols)
    # bare names: where one table has the column; the join pair's bare name is the left one
    assert {"cost", "ward", "drug", "dose", "region", "postcode"} <= set(t.columns)
    assert ("postcode", "postcode") in t.join.base.columns  # type: ignore[union-attr]
    assert ("postcode", "postcode") not in t.join.steps[1].source.columns  # type: ignore[union-attr]


def test_a_public_tables_categories_are_its_own_values() -> None:
    s = session(tables(), metadata())
    t = _v(s).join("regions", on="postcode")._t
    want = tuple(sorted(REGIONS["region"].unique()))
    assert t.metadata.columns["region"] == Categorical(want) == t.metadata.columns["regions.region"]
    assert t.metadata.columns["visits.postcode"] == Categorical()  # a private column's are not read
    # more values than max_keys: no public categories, so a group-by needs private key selection
    small = dp.Session(
        tables(),
        metadata=metadata(),
        budget=dp.Budget(epsilon=10),
        limits=QueryLimits(max_keys=3),
        rng=np.random.default_rng(0),
    )
    q = small.query("visits").join("regions", on="postcode")
    assert q._t.metadata.columns["region"].categories is None  # type: ignore[union-attr]
    with pytest.raises(InvalidParameterError) as info:
        q.group_by("region").count(epsilon=1)
    assert info.value.name == "delta" and small.spent == (0.0, 0.0)


def test_an_inner_join_from_a_public_table_reads_the_private_table_first() -> None:
    s = session(tables(), metadata())
    flipped = s._tables.joined("regions", [Join("visits", "postcode")])  # type: ignore[union-attr]
    direct = s._tables.joined("visits", [Join("regions", "postcode")])  # type: ignore[union-attr]
    assert flipped.join == direct.join and flipped.unit == direct.unit == "pid"


def test_bare_and_qualified_names_read_the_same_column() -> None:
    s = session(tables(), metadata())
    q = _v(s).join("regions", on="postcode", how="left")
    with exact_run():
        bare = q.group_by("region").count(epsilon=1).table["count"].tolist()
        qualified = q.group_by("regions.region").count(epsilon=1).table["count"].tolist()
        # the bare join column is the left one: a visit in Z keeps its postcode, and has no region's
        z_left = q.where(And((Compare("postcode", "=", "Z"), IsNull("regions.postcode")))).count(epsilon=1).value
    assert bare == qualified
    assert z_left == (tables()["visits"]["postcode"] == "Z").sum() > 0


# -- the price -------------------------------------------------------------------------------------------


def _l1(q: Query, aggregates: list[Any]) -> list[int]:
    """Each noisy part's ℓ1 sensitivity, in the engine's integer units, as priced."""
    priced = price_built(q._built(), tuple(aggregates), QueryOptions(epsilon=1.0), q._t)
    return [int(m[3]) for _, kind, mechs in priced.pending if kind == "noisy" for m in mechs]


@pytest.mark.parametrize(
    ("case", "build", "max_unit_rows", "count_l1"),
    [
        ("public, bounded by G·R", lambda s: _v(s).join("regions", on="postcode").group_by("region"), None, 2 * 5),
        ("duplicate keys, G·R", lambda s: _v(s).join("areas", on="postcode").group_by("area"), None, 2 * 5),
        ("private, T < G·R", lambda s: _v(s).join("prescriptions", on="pid").group_by("drug"), TRUNCATED, TRUNCATED),
        ("private left, ungrouped", lambda s: _v(s).join("prescriptions", on="pid", how="left"), TRUNCATED, 5),
        (
            "chain, T > G·R",
            lambda s: _v(s).join("prescriptions", on="pid").join("areas", on="postcode").group_by("area"),
            TRUNCATED * AREA_MATCHES,
            2 * 5,
        ),
    ],
)
def test_the_count_of_a_joined_query_is_priced_at_min_of_g_r_and_t(
    case: str, build: Callable[[dp.Session], Query], max_unit_rows: int | None, count_l1: int
) -> None:
    s = session(tables(), metadata(max_groups=2, max_rows=5))
    q = build(s)
    assert q._t.max_unit_rows == max_unit_rows
    assert _l1(q, [Count()])[0] == count_l1


def test_a_private_joins_sum_and_units_are_priced_from_t() -> None:
    s = session(tables(), metadata(max_groups=4, max_rows=10))
    q = _v(s).join("prescriptions", on="pid").group_by("drug")
    count, units, total = _l1(q, [Count(), CountUnits(), Sum("dose")])
    dose_bound = price_built(q._built(), (Sum("dose"),), QueryOptions(epsilon=1.0), q._t).plan.sums[0].bound
    assert (count, units, total) == (TRUNCATED, 4, TRUNCATED * dose_bound)  # ℓ1 = min(4·10, 6); G = min(4, 6)


def test_a_row_level_join_is_priced_by_the_public_tables_max_matches() -> None:
    s = session(tables(), metadata(row_level=True))
    grouped = _v(s).join("areas", on="postcode").group_by("area")
    assert grouped._t.max_unit_rows == AREA_MATCHES and grouped._t.unit is None
    # a row meets up to 2 areas: 2 rows, in up to 2 groups; as many "units" (rows count as units)
    assert _l1(grouped, [Count(), CountUnits()]) == [AREA_MATCHES, AREA_MATCHES]
    assert _l1(_v(s).join("regions", on="postcode"), [Count()]) == [1]
    chain = _v(s).join("areas", on="postcode").join("regions", on="areas.postcode")
    assert chain._t.max_unit_rows == AREA_MATCHES * 1


def test_cost_reads_no_data_and_matches_what_the_query_debits(reads: list[tuple[str, Any]]) -> None:
    s = session(tables(), metadata(max_groups=2, max_rows=5), epsilon=10)
    q = _v(s).join("prescriptions", on="pid").group_by("drug")
    cost = q.cost([Count(), Sum("dose")], epsilon=1.5)
    assert reads == [] and s.spent == (0.0, 0.0)
    r = q.aggregate([Count(), Sum("dose")], epsilon=1.5)
    assert s.spent == (1.5, 0.0) and r.epsilon == cost.epsilon
    assert "visits ⋈ prescriptions" in cost.text
