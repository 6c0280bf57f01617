"""Private SQL: the accepted subset compiles to the right query; everything else is refused
before the engine runs and before any budget is spent."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import dpkit as dp
from dpkit.analytics import Categorical, Metadata, Numeric
from dpkit.analytics import aggregates as A
from dpkit.analytics.plan import And, Between, Compare, InList, IsNull, Not, Or
from dpkit.analytics.sql import compile_sql, parse_predicate
from dpkit.errors import InvalidParameterError


def frame() -> pd.DataFrame:
    rng = np.random.default_rng(7)
    n = 2000
    return pd.DataFrame(
        {
            "uid": rng.integers(0, 500, n),
            "age": rng.integers(17, 90, n),
            "sex": rng.choice(np.array(["Female", "Male"]), n),
            "marital-status": rng.choice(np.array(["Married", "Never-married"]), n),
            "hours": rng.uniform(1, 99, n),
        }
    )


META = Metadata(columns={"age": Numeric(17, 90), "hours": Numeric(1, 99), "sex": Categorical(("Female", "Male"))})


def session(**kw) -> dp.Session:  # type: ignore[no-untyped-def]
    return dp.Session(frame(), budget=dp.Budget(epsilon=100.0, delta=1e-5), metadata=META, table="adult",
                      rng=np.random.default_rng(1), **kw)


def test_the_issue_example_runs_and_splits_the_budget() -> None:
    s = session()
    r = s.sql("SELECT sex, COUNT(*), AVG(age) FROM adult WHERE age > 30 GROUP BY sex", epsilon=1.0)
    assert r.groups == ("sex",) and [a.name for a in r.aggregates] == ["count", "mean_age"]
    assert [a.epsilon for a in r.aggregates] == pytest.approx([0.5, 0.5])
    assert r.epsilon == 1.0 and s.spent[0] == pytest.approx(1.0)
    df = frame()
    want = df[df.age > 30].groupby("sex").size()
    exact = s.sql("SELECT sex, COUNT(*) AS n FROM adult WHERE age > 30 GROUP BY sex", epsilon=50.0)
    assert exact["n"].tolist() == pytest.approx(want.tolist(), abs=2)


@pytest.mark.parametrize(
    "item, kind, column, q",
    [
        ("COUNT(*)", "count", None, None),
        ("COUNT(1)", "count", None, None),
        ("COUNT(DISTINCT uid)", "count_units", None, None),
        ("SUM(age)", "sum", "age", None),
        ("AVG(age)", "mean", "age", None),
        ("MEAN(age)", "mean", "age", None),
        ("VARIANCE(age)", "var", "age", None),
        ("VAR_POP(age)", "var", "age", None),
        ("VAR_SAMP(age)", "var", "age", None),
        ("STDDEV(hours)", "std", "hours", None),
        ("STDDEV_POP(hours)", "std", "hours", None),
        ("STDDEV_SAMP(hours)", "std", "hours", None),
        ("MEDIAN(age)", "quantile", "age", 0.5),
        ("QUANTILE_CONT(age, 0.9)", "quantile", "age", 0.9),
        ("QUANTILE(age, 0.1)", "quantile", "age", 0.1),
        ("PERCENTILE_CONT(0.25) WITHIN GROUP (ORDER BY age)", "quantile", "age", 0.25),
    ],
)
def test_accepted_aggregates(item: str, kind: str, column: str | None, q: float | None) -> None:
    s = session(privacy_unit="uid")
    _, aggs = compile_sql(s, f"SELECT {item} AS x FROM adult")
    (agg,) = aggs
    assert agg.kind == kind and agg.column == column and agg.alias == "x"
    if q is not None:
        assert agg.q == q  # type: ignore[union-attr]


def test_where_grammar_and_quoted_identifiers() -> None:
    p = parse_predicate("age >= 30 AND NOT (sex = 'Male' OR \"marital-status\" IN ('Married')) AND hours BETWEEN 10 AND 20 AND age IS NOT NULL AND 50 > age AND age NOT IN (1, 2) AND hours NOT BETWEEN -1 AND 0 AND sex IS NULL")
    assert isinstance(p, And)
    flat = []

    def walk(x):  # type: ignore[no-untyped-def]
        if isinstance(x, (And, Or)):
            for y in x.parts:
                walk(y)
        else:
            flat.append(x)

    walk(p)
    assert Compare("age", ">=", 30) in flat and Compare("age", "<", 50) in flat  # 50 > age flipped
    assert Not(Or((Compare("sex", "=", "Male"), InList("marital-status", ("Married",))))) in flat
    assert Between("hours", 10, 20) in flat and Between("hours", -1, 0, negated=True) in flat
    assert IsNull("age", negated=True) in flat and IsNull("sex") in flat and InList("age", (1, 2), negated=True) in flat
    r = session().sql('SELECT "marital-status", COUNT(*) FROM adult GROUP BY "marital-status"', epsilon=1.0, delta=1e-6)
    assert r.groups == ("marital-status",) and r.keys == "truncated_geometric"


def test_string_literals_are_data_not_sql() -> None:
    s = session()
    r = s.sql("SELECT COUNT(*) AS n FROM adult WHERE sex = 'Male'' OR 1=1 --'", epsilon=50.0)
    assert abs(r.value) <= 3  # no row has that sex: the quote stayed inside the literal


def test_identifiers_resolve_case_insensitively_when_unambiguous() -> None:
    r = session().sql("select SEX, count(*) from ADULT group by Sex", epsilon=1.0)
    assert r.groups == ("sex",)


@pytest.mark.parametrize(
    "sql, match",
    [
        ("SELECT * FROM adult", "read rows"),
        ("SELECT age FROM adult", "neither grouped nor aggregated"),
        ("SELECT age, COUNT(*) FROM adult", "neither grouped nor aggregated"),
        ("SELECT DISTINCT sex FROM adult", "DISTINCT"),
        ("SELECT COUNT(DISTINCT age) FROM adult", "privacy unit"),
        ("SELECT COUNT(age) FROM adult", "COUNT takes"),
        ("SELECT MAX(age) FROM adult", "not an accepted aggregate"),
        ("SELECT SUM(age + 1) FROM adult", "plain column"),
        ("SELECT COUNT(*) FROM other", "table"),
        ("SELECT COUNT(*) FROM adult a", "aliases"),
        ("SELECT COUNT(*) FROM adult JOIN other ON adult.uid = other.uid", "JOIN"),
        ("SELECT COUNT(*) FROM (SELECT * FROM adult)", "subqueries"),
        ("WITH t AS (SELECT * FROM adult) SELECT COUNT(*) FROM t", "WITH"),
        ("SELECT COUNT(*) FROM adult UNION SELECT COUNT(*) FROM adult", "SELECT"),
        ("SELECT sex, COUNT(*) FROM adult GROUP BY sex HAVING COUNT(*) > 5", "HAVING"),
        ("SELECT COUNT(*) FROM adult ORDER BY 1", "ORDER"),
        ("SELECT COUNT(*) FROM adult LIMIT 1", "LIMIT"),
        ("SELECT COUNT(*) OVER () FROM adult", "Window"),
        ("SELECT COUNT(*) FROM adult WHERE age > hours", "literal"),
        ("SELECT COUNT(*) FROM adult WHERE upper(sex) = 'MALE'", "column"),
        ("SELECT COUNT(*) FROM adult WHERE age IN (SELECT age FROM adult)", "Subquery"),
        ("SELECT COUNT(*) FROM adult WHERE nope = 1", "unknown column"),
        ("SELECT AVG(nope) FROM adult", "unknown column"),
        ("SELECT AVG(uid) FROM adult", "declared bounds"),
        ("SELECT QUANTILE_CONT(age, 2) FROM adult", "quantile level"),
        ("SELECT COUNT(*) FROM adult; DROP TABLE adult", "one statement"),
        ("DELETE FROM adult", "only SELECT"),
        ("SELEC COUNT(*) FROM adult", "parse"),
        ("SELECT FROM adult", "aggregate"),
        ("", "non-empty"),
        ("SELECT sex AS s, COUNT(*) FROM adult GROUP BY sex", "alias"),
        ("SELECT COUNT(*) AS sex, sex FROM adult GROUP BY sex", "distinct output names"),
    ],
)
def test_rejected_sql_spends_nothing(sql: str, match: str) -> None:
    s = session()
    with pytest.raises(InvalidParameterError, match=match):
        s.sql(sql, epsilon=1.0)
    assert s.spent == (0.0, 0.0)


def test_aggregate_specs_validate_their_arguments() -> None:
    with pytest.raises(InvalidParameterError):
        A.Mean("")
    with pytest.raises(InvalidParameterError):
        A.Quantile("age", q=-0.1)
    with pytest.raises(InvalidParameterError):
        A.Count(name="")
