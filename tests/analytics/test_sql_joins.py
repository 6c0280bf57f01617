"""Joins in private SQL: on a session over several tables, ``FROM t [AS a] JOIN t2 [AS b] ON ... /
USING (...)`` and qualified columns compile to the builder's query — the same
:class:`~dpkit.analytics.spec.QuerySpec` and the same seeded release — and every other shape of
FROM is refused, naming the fragment, before anything is paid. The semantic refusals (which
tables may be joined, on what) are the core's, and come through SQL unchanged.

The answers are compared with the same seeded generator both ways, so equal queries give equal
answers exactly (no statistical test: no false-failure rate); each comparison is checked to be
able to fail (a different query gives a different spec and a different answer)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np
import pandas as pd
import pytest

import dpkit as dp
from dpkit.analytics import Categorical, Count, CountUnits, Mean, Metadata, Numeric, Sum
from dpkit.analytics.aggregates import Aggregate
from dpkit.analytics.dataset_metadata import DatasetMetadata
from dpkit.analytics.query import Query
from dpkit.analytics.spec import Join, QuerySpec
from dpkit.analytics.sql import compile_spec, compile_sql
from dpkit.errors import InvalidParameterError

EPSILON = 1e6  # tiny noise: a wrong join shows in the answer, not only in the spec


def dataset(**public: Metadata) -> DatasetMetadata:
    return DatasetMetadata(
        tables={
            "visits": Metadata(
                columns={
                    "postcode": Categorical(("A", "B", "C", "D", "Z")),
                    "cost": Numeric(0, 100),
                    "ward": Categorical(("w1", "w2")),
                },
                privacy_unit="patient_id",
                join_rows=3,
            ),
            "prescriptions": Metadata(
                columns={"drug": Categorical(("x", "y")), "dose": Numeric(0, 10)},
                privacy_unit="patient_id",
                join_rows=2,
            ),
            "regions": Metadata(
                columns={"postcode": Categorical(), "region": Categorical()}, public=True, max_matches=1
            ),
            "wards": Metadata(columns={"ward": Categorical()}, public=True, max_matches=1),
            **public,
        },
        max_groups=1,
        max_rows=20,
    )


def tables() -> dict[str, pd.DataFrame]:
    rng = np.random.default_rng(7)
    return {
        "visits": pd.DataFrame(
            {
                "patient_id": rng.integers(0, 50, 400),
                "postcode": rng.choice(np.array(["A", "B", "C", "D", "Z"]), 400),
                "cost": rng.uniform(0, 100, 400),
                "ward": rng.choice(np.array(["w1", "w2"]), 400),
            }
        ),
        "prescriptions": pd.DataFrame(
            {
                "patient_id": rng.integers(0, 60, 300),
                "drug": rng.choice(np.array(["x", "y"]), 300),
                "dose": rng.uniform(0, 10, 300),
            }
        ),
        "regions": pd.DataFrame(
            {"postcode": ["A", "B", "C", "D", "E"], "region": ["north", "north", "south", "south", "east"]}
        ),
        "wards": pd.DataFrame({"ward": ["w1", "w2", "w3"]}),
    }


def session(meta: DatasetMetadata | None = None, data: dict[str, pd.DataFrame] | None = None) -> dp.Session:
    return dp.Session(
        data if data is not None else tables(),
        metadata=meta if meta is not None else dataset(),
        budget=dp.Budget(epsilon=EPSILON * 100),
    )


Builder = Callable[[dp.Session], Query]

# (SQL, the builder's query, its aggregates): each pair is one query written twice.
EQUIVALENT: list[tuple[str, Builder, list[Aggregate]]] = [
    (  # a public join, grouped by the public table's column (its keys: the table's values)
        "SELECT r.region, COUNT(*) FROM visits v JOIN regions r ON v.postcode = r.postcode GROUP BY r.region",
        lambda s: s.query("visits").join("regions", on={"visits.postcode": "postcode"}).group_by("region"),
        [Count()],
    ),
    (  # a left join: unmatched visits (postcode Z) form the NULL region's rows
        "SELECT SUM(cost) AS total, COUNT(*) FROM visits LEFT OUTER JOIN regions ON visits.postcode = regions.postcode "
        "WHERE region IS NULL",
        lambda s: (
            s.query("visits").join("regions", on=[("visits.postcode", "postcode")], how="left").where("region IS NULL")
        ),
        [Sum("cost", name="total"), Count()],
    ),
    (  # a private join on the unit, with COUNT(DISTINCT unit) and qualified aggregate arguments
        "SELECT p.drug, SUM(p.dose), COUNT(DISTINCT v.patient_id) FROM visits AS v "
        "INNER JOIN prescriptions AS p ON v.patient_id = p.patient_id GROUP BY p.drug",
        lambda s: s.query("visits").join("prescriptions", on={"visits.patient_id": "patient_id"}).group_by("drug"),
        [Sum("dose"), CountUnits()],
    ),
    (  # USING, and two joins; bare names where one table has them
        "SELECT region, AVG(cost) FROM visits JOIN regions USING (postcode) LEFT JOIN wards USING (ward) "
        "WHERE ward = 'w1' GROUP BY region",
        lambda s: (
            s.query("visits")
            .join("regions", on={"visits.postcode": "postcode"})
            .join("wards", on={"visits.ward": "ward"}, how="left")
            .where("ward = 'w1'")
            .group_by("region")
        ),
        [Mean("cost")],
    ),
    (  # qualified columns in WHERE, GROUP BY, BIN and aggregates; r.postcode is regions.postcode
        "SELECT r.postcode, BIN(v.cost, 0, 50, 100) AS c, COUNT(*), SUM(v.cost) FROM visits v JOIN regions r "
        "ON r.postcode = v.postcode WHERE v.cost > 10 AND r.region IN ('north', 'south') GROUP BY r.postcode, c",
        lambda s: (
            s.query("visits")
            .join("regions", on={"visits.postcode": "postcode"})
            .where("cost > 10 AND region IN ('north', 'south')")
            .group_by("regions.postcode", "cost", bins={"cost": [0, 50, 100]})
        ),
        [Count(), Sum("cost")],
    ),
    (  # FROM public JOIN private: the private table is read (the core swaps the inner join)
        "SELECT region, COUNT(*) FROM regions r JOIN visits v ON r.postcode = v.postcode GROUP BY region",
        lambda s: s.query("visits").join("regions", on={"visits.postcode": "postcode"}).group_by("region"),
        [Count()],
    ),
    (  # one table of the dataset, under an alias
        "SELECT p.drug, COUNT(*) FROM prescriptions p WHERE p.dose >= 5 GROUP BY p.drug",
        lambda s: s.query("prescriptions").where("dose >= 5").group_by("drug"),
        [Count()],
    ),
]


@pytest.mark.parametrize("sql, build, aggregates", EQUIVALENT)
def test_sql_is_the_builders_query(sql: str, build: Builder, aggregates: list[Aggregate]) -> None:
    s = session()
    query = build(s)
    # the text leaves the contribution bounds to the session, as a query that sets none
    assert compile_spec(s, sql) == replace(query.spec(aggregates), max_groups=None, max_rows=None)
    compiled, compiled_aggregates = compile_sql(s, sql)
    assert compiled.spec(compiled_aggregates) == query.spec(aggregates)
    by_sql = s.sql(sql, epsilon=EPSILON, rng=np.random.default_rng(0))
    by_builder = query.aggregate(aggregates, epsilon=EPSILON, rng=np.random.default_rng(0))
    pd.testing.assert_frame_equal(by_sql.table, by_builder.table)
    assert by_sql.event == by_builder.event
    # the comparisons can fail: the same query under other contribution bounds differs in both
    other = build(s).bound(max_rows=1)
    assert compiled.spec(compiled_aggregates) != other.spec(aggregates)
    moved = other.aggregate(aggregates, epsilon=EPSILON, rng=np.random.default_rng(0))
    assert not moved.table.equals(by_sql.table)


def test_group_columns_are_named_as_the_builder_names_them() -> None:
    s = session()
    sql = (
        "SELECT r.region, r.postcode, v.postcode, COUNT(*) FROM visits v JOIN regions r USING (postcode) "
        "GROUP BY r.region, r.postcode, v.postcode"
    )
    spec = compile_spec(s, sql)
    assert spec.group_by == ("region", "regions.postcode", "postcode")
    result = s.sql(sql, epsilon=EPSILON, rng=np.random.default_rng(0))
    assert list(result.table.columns[:3]) == ["region", "regions.postcode", "postcode"]


def test_the_spec_carries_the_joins_for_the_canonical_text() -> None:
    spec = compile_spec(
        session(),
        "SELECT COUNT(*) FROM visits v JOIN regions r ON v.postcode = r.postcode AND v.ward = r.region "
        "LEFT JOIN prescriptions p USING (patient_id)",
    )
    assert spec.table == "visits"
    assert spec.joins == (
        Join("regions", (("visits.postcode", "postcode"), ("visits.ward", "region"))),
        Join("prescriptions", (("visits.patient_id", "patient_id"),), "left"),
    )
    again = QuerySpec.from_json(spec.to_dict())
    assert again.table == spec.table and again.joins == spec.joins


def test_names_resolve_case_insensitively_as_in_duckdb() -> None:
    s = session()
    spec = compile_spec(
        s, "select R.Region, count(*) from Visits V join Regions r on v.PostCode = R.postcode group by r.region"
    )
    query = s.query("visits").join("regions", on={"visits.postcode": "postcode"}).group_by("region")
    assert spec == replace(query.spec([Count()]), max_groups=None, max_rows=None)


# -- refusals: the fragment, what is accepted, and nothing paid -------------------------------------

REFUSED = [
    ("SELECT COUNT(*) FROM visits, regions", ", regions", "comma join"),
    ("SELECT COUNT(*) FROM visits CROSS JOIN regions", "CROSS JOIN regions", "cross join"),
    ("SELECT COUNT(*) FROM visits NATURAL JOIN regions", "NATURAL JOIN regions", "NATURAL JOIN"),
    ("SELECT COUNT(*) FROM visits RIGHT JOIN regions USING (postcode)", "RIGHT JOIN regions", "RIGHT JOIN"),
    ("SELECT COUNT(*) FROM visits FULL OUTER JOIN regions USING (postcode)", "FULL OUTER JOIN", "FULL OUTER JOIN"),
    ("SELECT COUNT(*) FROM visits SEMI JOIN regions USING (postcode)", "SEMI JOIN", "SEMI JOIN"),
    ("SELECT COUNT(*) FROM visits ASOF JOIN regions USING (postcode)", "ASOF JOIN", "ASOF JOIN"),
    ("SELECT COUNT(*) FROM visits LEFT JOIN regions", "LEFT JOIN regions", "without ON / USING"),
    ("SELECT COUNT(*) FROM visits v JOIN regions r ON v.postcode < r.postcode", "v.postcode < r.postcode", "LT"),
    ("SELECT COUNT(*) FROM visits v JOIN regions r ON v.postcode = r.postcode OR v.ward = r.region", "OR", "Or"),
    ("SELECT COUNT(*) FROM visits v JOIN regions r ON v.postcode = 'A'", "v.postcode = 'A'", "a literal"),
    ("SELECT COUNT(*) FROM visits v JOIN regions r ON TRUE", "ON TRUE", "a literal"),
    ("SELECT COUNT(*) FROM visits v JOIN regions r ON LOWER(v.postcode) = r.postcode", "LOWER(v.postcode)", "Lower"),
    ("SELECT COUNT(*) FROM visits v JOIN regions r ON v.postcode = v.ward", "v.postcode = v.ward", "both columns"),
    (
        "SELECT COUNT(*) FROM visits v JOIN regions r ON v.postcode = r.postcode JOIN wards w ON v.ward = r.region",
        "v.ward = r.region",
        "the table this JOIN adds",
    ),
    (
        "SELECT COUNT(*) FROM visits v JOIN regions r ON v.postcode IS NOT DISTINCT FROM r.postcode",
        "IS NOT DISTINCT FROM",
        "NullSafeEQ",
    ),
    ("SELECT COUNT(*) FROM visits v JOIN regions r ON postcode = region", "postcode = region", "qualify it"),
    (
        "SELECT COUNT(*) FROM (SELECT * FROM visits v JOIN regions r USING (postcode))",
        "JOIN regions AS r USING (postcode)",
        "subquery",
    ),
    (
        "SELECT COUNT(*) FROM visits WHERE postcode IN (SELECT postcode FROM regions JOIN wards ON region = ward)",
        "SELECT postcode FROM regions JOIN wards",
        "subquery",
    ),
    (
        "SELECT COUNT(*) FROM visits v JOIN (regions r JOIN wards w ON r.region = w.ward) ON v.postcode = r.postcode",
        "JOIN (regions AS r JOIN wards",
        "subquer",
    ),
    ("SELECT COUNT(*) FROM visits regions JOIN regions r USING (postcode)", "visits AS regions", "another table"),
    ("SELECT COUNT(*) FROM visits v JOIN regions wards USING (postcode)", "regions AS wards", "another table"),
    ("SELECT COUNT(*) FROM visits a JOIN regions a USING (postcode)", "regions AS a", "two tables are called 'a'"),
    (
        "SELECT COUNT(*) FROM visits v JOIN regions r USING (postcode) WHERE x.cost > 1",
        "x.cost",
        "not a table or alias",
    ),
    ("SELECT COUNT(*) FROM visits v WHERE visits.cost > 1", "visits.cost", "called 'v' in this query"),
    (
        "SELECT COUNT(*) FROM visits v JOIN regions r ON v.postcode = w.ward JOIN wards w USING (ward)",
        "w.ward",
        "not a table or alias of the query at this point (v = visits, r = regions)",
    ),
    ("SELECT COUNT(*) FROM visits v JOIN visits w USING (postcode)", "visits AS w", "read twice"),
    ("SELECT COUNT(*) FROM visits JOIN regions USING (postcode) JOIN Visits USING (ward)", "Visits", "read twice"),
    ("SELECT COUNT(*) FROM visits v JOIN regions r USING (nope)", "r.nope", "not declared"),
    ("SELECT COUNT(*) FROM visits v JOIN nowhere r USING (postcode)", "nowhere", "a table of the dataset"),
    ("SELECT COUNT(*) FROM visits AS v(a, b)", "v(a, b)", "column aliases"),
    ("SELECT v.*, COUNT(*) FROM visits v", "v.*", "read rows"),
    ("SELECT COUNT(*) FROM visits v WHERE v.a.b > 1", "v.a.b", "<table or alias>.<column>"),
    (
        "SELECT COUNT(*) FROM visits v JOIN prescriptions p USING (patient_id) WHERE p.patient_id > 3",
        "p.patient_id",
        "privacy unit of 'prescriptions'",
    ),
    (
        "SELECT COUNT(*) FROM visits JOIN regions USING (region)",
        "USING (region)",
        "exactly one table before the JOIN (none of the tables before it)",
    ),
]


def assert_refused_unpaid(s: dp.Session, sql: str, parameter: str, fragment: str, reason: str) -> None:
    before = s.remaining
    for run in (lambda: compile_spec(s, sql), lambda: s.sql(sql, epsilon=1.0), lambda: s.sql_cost(sql, epsilon=1.0)):
        with pytest.raises(InvalidParameterError) as info:
            run()
        assert info.value.name == parameter
        assert fragment in str(info.value.value), (info.value.value, fragment)
        assert reason in str(info.value), (str(info.value), reason)
    assert s.remaining == before


@pytest.mark.parametrize("sql, fragment, reason", REFUSED)
def test_refused_naming_the_fragment_before_any_debit(sql: str, fragment: str, reason: str) -> None:
    assert_refused_unpaid(session(), sql, "sql", fragment, reason)


def test_join_refusals_say_what_is_accepted() -> None:
    with pytest.raises(InvalidParameterError) as info:
        compile_spec(session(), "SELECT COUNT(*) FROM visits CROSS JOIN regions")
    assert "LEFT [OUTER] JOIN" in info.value.accepted and "USING" in info.value.accepted
    with pytest.raises(InvalidParameterError) as info:
        compile_spec(session(), "SELECT COUNT(*) FROM visits v JOIN regions r ON v.postcode > r.postcode")
    assert "ON a.x = b.y [AND a.z = b.w ...]" in info.value.accepted


# the core's refusals (dpkit.analytics.joins), through SQL: the builder's, word for word
CORE_REFUSED: list[tuple[str, Callable[[dp.Session], Any], str, str]] = [
    (
        "SELECT COUNT(*) FROM visits v JOIN prescriptions p ON v.ward = p.drug",
        lambda s: s.query("visits").join("prescriptions", on={"visits.ward": "drug"}),
        "on",
        "privacy units of two private tables",
    ),
    (
        "SELECT COUNT(*) FROM visits v JOIN regions r ON v.cost = r.postcode",
        lambda s: s.query("visits").join("regions", on={"visits.cost": "postcode"}),
        "on",
        "same declared type",
    ),
    (
        "SELECT COUNT(*) FROM visits JOIN postcodes USING (postcode)",
        lambda s: s.query("visits").join("postcodes", on={"visits.postcode": "postcode"}),
        "join.table",
        "max_matches",
    ),
    ("SELECT COUNT(*) FROM regions", lambda s: s.query("regions"), "from", "private table"),
]


def with_postcodes() -> dp.Session:
    """The dataset with a public table that declares no ``max_matches``."""
    meta = dataset(postcodes=Metadata(columns={"postcode": Categorical(), "area": Categorical()}, public=True))
    return session(meta, {**tables(), "postcodes": pd.DataFrame({"postcode": ["A"], "area": ["x"]})})


@pytest.mark.parametrize("sql, build, parameter, reason", CORE_REFUSED)
def test_the_cores_refusals_come_through(
    sql: str, build: Callable[[dp.Session], Any], parameter: str, reason: str
) -> None:
    s = with_postcodes()
    with pytest.raises(InvalidParameterError) as info:
        build(s)
    assert_refused_unpaid(s, sql, parameter, str(info.value.value), reason)
    with pytest.raises(InvalidParameterError) as again:
        s.sql(sql, epsilon=1.0)
    assert str(again.value) == str(info.value)


def test_a_public_table_left_joined_to_a_private_one_is_refused() -> None:
    s = session()
    assert_refused_unpaid(
        s, "SELECT COUNT(*) FROM regions LEFT JOIN visits USING (postcode)", "from", "regions", "LEFT JOIN"
    )


def test_an_ambiguous_using_column_is_refused() -> None:
    s = with_postcodes()
    sql = "SELECT COUNT(*) FROM visits JOIN regions USING (postcode) JOIN postcodes USING (postcode)"
    assert_refused_unpaid(s, sql, "sql", "USING (postcode)", "(visits.postcode, regions.postcode)")


def test_a_session_over_one_table_still_refuses_joins_and_aliases() -> None:
    frame = pd.DataFrame({"uid": [1, 2], "age": [30.0, 40.0]})
    s = dp.Session(
        frame,
        metadata=Metadata(columns={"age": Numeric(0, 100)}, privacy_unit="uid"),
        budget=dp.Budget(epsilon=1.0),
    )
    for sql, reason in [
        ("SELECT COUNT(*) FROM data JOIN other ON data.uid = other.uid", "JOIN"),
        ("SELECT COUNT(*) FROM data d", "table alias"),
        ("SELECT SUM(data.age) FROM data", "table qualifier"),
    ]:
        with pytest.raises(InvalidParameterError, match=reason):
            s.sql(sql, epsilon=1.0)
    assert s.remaining == 1.0


def test_refusals_depend_on_the_text_and_metadata_only() -> None:
    """The same refusal, word for word, whatever the rows (here: no rows at all)."""
    empty = {name: frame.iloc[:0] for name, frame in tables().items()}
    for sql, _, _ in REFUSED[:8]:
        messages: list[Any] = []
        for data in (tables(), empty):
            with pytest.raises(InvalidParameterError) as info:
                compile_spec(session(data=data), sql)
            messages.append(str(info.value))
        assert messages[0] == messages[1]
