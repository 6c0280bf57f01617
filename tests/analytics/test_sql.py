"""Private SQL: the accepted subset compiles to the right query; everything else is refused
before the engine runs and before any budget is spent."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pandas as pd
import pytest
import sqlglot
from sqlglot import exp

import dpkit as dp
from dpkit.analytics import Categorical, Metadata, Numeric, QueryLimits, sql_parse
from dpkit.analytics import aggregates as A
from dpkit.analytics.plan import And, Between, Compare, InList, IsNull, Not, Or
from dpkit.analytics.sql import compile_sql
from dpkit.analytics.sql_parse import parse_predicate
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


META = Metadata(
    columns={
        "age": Numeric(17, 90),
        "hours": Numeric(1, 99),
        "sex": Categorical(("Female", "Male")),
        "marital-status": Categorical(),
        "uid": Categorical(value_type="integer"),
    }
)


def make_session(privacy_unit: str | None = None) -> dp.Session:
    """The only place a real Session is built (its constructor is being reworked): every test that
    needs one goes through here, or through the ``session`` fixture."""
    unit: dict[str, Any] = {"privacy_unit": privacy_unit} if privacy_unit else {"row_level": True}
    return dp.Session(
        frame(),
        budget=dp.Budget(epsilon=100.0, delta=1e-5),
        metadata=META,
        table="adult",
        rng=np.random.default_rng(1),
        **unit,
    )


@pytest.fixture
def session() -> dp.Session:
    return make_session()


# -- a stand-in session for compile-only tests -------------------------------------------------
# compile_sql reads session.table, session.columns, session.privacy_unit, session.limits and calls
# session.query().where(...).group_by(...); these tests pin down the compiler on its own.


@dataclass(frozen=True)
class FakeQuery:
    predicate: Any = None
    groups: tuple[str, ...] = ()

    def where(self, predicate: Any) -> FakeQuery:
        assert self.predicate is None
        return replace(self, predicate=predicate)

    def group_by(self, *columns: str) -> FakeQuery:
        return replace(self, groups=columns)


class FakeSession:
    limits = QueryLimits()
    table = "adult"
    privacy_unit = "uid"
    columns = {
        "uid": "categorical",
        "age": "numeric",
        "hours": "numeric",
        "sex": "categorical",
        "marital-status": "categorical",
        "count_low": "categorical",
        'odd "name"; --': "categorical",
    }

    def query(self) -> FakeQuery:
        return FakeQuery()


FAKE = FakeSession()


def compile_(text: str) -> tuple[FakeQuery, list[A.Aggregate]]:
    return compile_sql(FAKE, text)  # type: ignore[arg-type,return-value]


# -- end to end (a real Session) ----------------------------------------------------------------


def test_the_issue_example_runs_and_splits_the_budget(session: dp.Session) -> None:
    s = session
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
        ("PERCENTILE_CONT(age, 0.9)", "quantile", "age", 0.9),
        ("QUANTILE(age, 0.1)", "quantile", "age", 0.1),
        ("APPROX_QUANTILE(age, 0.3)", "quantile", "age", 0.3),
        ("PERCENTILE_CONT(0.25) WITHIN GROUP (ORDER BY age)", "quantile", "age", 0.25),
        ("PERCENTILE_CONT(0.25) WITHIN GROUP (ORDER BY age ASC)", "quantile", "age", 0.25),
        ("PERCENTILE_CONT(0.25) WITHIN GROUP (ORDER BY age NULLS LAST)", "quantile", "age", 0.25),
        ("PERCENTILE_CONT(0.25) WITHIN GROUP (ORDER BY age NULLS FIRST)", "quantile", "age", 0.25),
        ("PERCENTILE_CONT(0.9) WITHIN GROUP (ORDER BY age DESC)", "quantile", "age", 0.1),
        ("PERCENTILE_CONT(0.9) WITHIN GROUP (ORDER BY age DESC NULLS FIRST)", "quantile", "age", 0.1),
        ("PERCENTILE_CONT(0.25) WITHIN GROUP (ORDER BY age DESC NULLS LAST)", "quantile", "age", 0.75),
        ("PERCENTILE_CONT(1) WITHIN GROUP (ORDER BY age DESC)", "quantile", "age", 0.0),
    ],
)
def test_accepted_aggregates(item: str, kind: str, column: str | None, q: float | None) -> None:
    _, aggs = compile_(f"SELECT {item} AS x FROM adult")
    (agg,) = aggs
    assert agg.kind == kind and agg.column == column and agg.name == "x"
    if q is not None:
        assert agg.q == q  # type: ignore[union-attr]  # exact: 1 - 0.9 is 0.1, not 0.0999...


def test_accepted_aggregates_compile_against_a_real_session() -> None:
    _, aggs = compile_sql(
        make_session(privacy_unit="uid"),
        "SELECT COUNT(DISTINCT uid) AS u, PERCENTILE_CONT(0.9) WITHIN GROUP (ORDER BY age DESC) FROM adult",
    )
    assert [a.kind for a in aggs] == ["count_units", "quantile"] and aggs[1].q == 0.1  # type: ignore[union-attr]


def test_descending_percentile_keeps_its_meaning_in_the_default_name() -> None:
    # the 0.9-quantile of the descending order *is* the 10th percentile: the name says so
    _, (agg,) = compile_("SELECT PERCENTILE_CONT(0.9) WITHIN GROUP (ORDER BY age DESC) FROM adult")
    assert agg.name == "q10_age" and agg.q == 0.1  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "text, groups, where, aliases",
    [
        # the module docstring's forms
        (
            "SELECT sex, COUNT(*), AVG(age) FROM adult WHERE age > 30 GROUP BY sex",
            ("sex",),
            Compare("age", ">", 30),
            ["count", "mean_age"],
        ),
        ("FROM adult SELECT COUNT(*)", (), None, ["count"]),
        ("SELECT COUNT(*) FROM adult;", (), None, ["count"]),
        ("SELECT COUNT(*) n FROM adult", (), None, ["n"]),
        ("SELECT COUNT(*) FROM adult GROUP BY sex", ("sex",), None, ["count"]),
        ("SELECT sex AS sex, COUNT(*) FROM adult GROUP BY sex", ("sex",), None, ["count"]),
        (
            'SELECT "marital-status", COUNT(*) FROM "adult" GROUP BY "marital-status"',
            ("marital-status",),
            None,
            ["count"],
        ),
        ("select SEX, count(*) from ADULT group by Sex", ("sex",), None, ["count"]),
        (
            'SELECT "odd ""name""; --", COUNT(*) FROM adult GROUP BY "odd ""name""; --"',
            ('odd "name"; --',),
            None,
            ["count"],
        ),
        ("SELECT COUNT(*) /* a plain comment */ FROM adult -- another\n", (), None, ["count"]),
        ("SELECT COUNT(*) FROM adult -- +1, not a hint\n", (), None, ["count"]),
        ("SELECT COUNT(*) FROM adult WHERE sex = '/*+ x */'", (), Compare("sex", "=", "/*+ x */"), ["count"]),
        ("SELECT COUNT(*) AS 'n' FROM adult WHERE age > (3)", (), Compare("age", ">", 3), ["n"]),
        ("SELECT COUNT(*) FROM adult WHERE age == 3", (), Compare("age", "=", 3), ["count"]),
        ("SELECT COUNT(*) FROM adult WHERE age <> -3", (), Compare("age", "!=", -3), ["count"]),
        ("SELECT COUNT(*) FROM adult WHERE age = +3", (), Compare("age", "=", 3), ["count"]),
        ("SELECT COUNT(*) FROM adult WHERE 30 <= age", (), Compare("age", ">=", 30), ["count"]),
        ("SELECT COUNT(*) FROM adult WHERE age > 2.5e1", (), Compare("age", ">", 25.0), ["count"]),
        ("SELECT COUNT(*) FROM adult WHERE sex = 'it''s'", (), Compare("sex", "=", "it's"), ["count"]),
        (
            "SELECT COUNT(*) FROM adult WHERE sex IN ('F', 'M') OR age IS NULL",
            (),
            Or((InList("sex", ("F", "M")), IsNull("age"))),
            ["count"],
        ),
        ("SELECT COUNT(*) FROM adult WHERE age IN [1, 2]", (), InList("age", (1, 2)), ["count"]),
        ("SELECT COUNT(*) FROM adult WHERE NOT (age BETWEEN 1 AND 2)", (), Not(Between("age", 1, 2)), ["count"]),
        (
            "SELECT COUNT(*) FROM adult WHERE NOT (age < 3 AND sex = TRUE)",
            (),
            Not(And((Compare("age", "<", 3), Compare("sex", "=", True)))),
            ["count"],
        ),
        ("SELECT SUM(age) AS s, SUM(hours) AS t, COUNT(*) AS n FROM adult", (), None, ["s", "t", "n"]),
    ],
)
def test_accepted_subset_compiles(text: str, groups: tuple[str, ...], where: Any, aliases: list[str]) -> None:
    query, aggs = compile_(text)
    assert query.groups == groups and query.predicate == where and [a.name for a in aggs] == aliases


def test_where_grammar_and_quoted_identifiers(session: dp.Session) -> None:
    p = parse_predicate(
        "age >= 30 AND NOT (sex = 'Male' OR \"marital-status\" IN ('Married')) AND hours BETWEEN 10 AND 20 AND age IS NOT NULL AND 50 > age AND age NOT IN (1, 2) AND hours NOT BETWEEN -1 AND 0 AND sex IS NULL"
    )
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
    r = session.sql('SELECT "marital-status", COUNT(*) FROM adult GROUP BY "marital-status"', epsilon=1.0, delta=1e-6)
    assert r.groups == ("marital-status",) and r.keys == "truncated_geometric"


def test_string_literals_are_data_not_sql(session: dp.Session) -> None:
    r = session.sql("SELECT COUNT(*) AS n FROM adult WHERE sex = 'Male'' OR 1=1 --'", epsilon=50.0)
    assert abs(r.value) <= 3  # no row has that sex: the quote stayed inside the literal


def test_identifiers_resolve_case_insensitively_when_unambiguous(session: dp.Session) -> None:
    r = session.sql("select SEX, count(*) from ADULT group by Sex", epsilon=1.0)
    assert r.groups == ("sex",)


# -- refusals ------------------------------------------------------------------------------------

REFUSED = [
    # reading rows, DISTINCT
    ("SELECT * FROM adult", "read rows"),
    ("SELECT * EXCLUDE (uid) FROM adult", "read rows"),
    ("SELECT * REPLACE (1 AS age) FROM adult", "read rows"),
    ("SELECT COUNT(* EXCLUDE (age)) FROM adult", "EXCLUDE"),
    ("SELECT age FROM adult", "neither grouped nor aggregated"),
    ("SELECT age, COUNT(*) FROM adult", "neither grouped nor aggregated"),
    ("SELECT DISTINCT sex FROM adult", "DISTINCT"),
    ("SELECT DISTINCT COUNT(*) FROM adult", "DISTINCT"),
    ("SELECT DISTINCT ON (sex) COUNT(*) FROM adult", "DISTINCT ON"),
    ("SELECT COUNT(*) INTO t2 FROM adult", "INTO"),
    # aggregates
    ("SELECT COUNT(DISTINCT age) FROM adult", "privacy unit"),
    ("SELECT COUNT(DISTINCT uid, age) FROM adult", "COUNT takes"),
    ("SELECT COUNT(age) FROM adult", "COUNT takes"),
    ("SELECT COUNT(ALL age) FROM adult", "COUNT takes"),
    ("SELECT COUNT(2) FROM adult", "COUNT takes"),
    ("SELECT COUNT() FROM adult", "COUNT takes"),
    ("SELECT SUM(DISTINCT age) FROM adult", "DISTINCT is accepted only"),
    ("SELECT MAX(age) FROM adult", r"not an accepted aggregate \(Max\)"),
    (
        "SELECT PERCENTILE_DISC(0.5) WITHIN GROUP (ORDER BY age) FROM adult",
        "WITHIN GROUP is accepted only as PERCENTILE_CONT",
    ),
    ("SELECT SUM(age + 1) FROM adult", "plain column names are accepted here, not Add"),
    ("SELECT SUM(age::INT) FROM adult", "Cast"),
    ("SELECT SUM((age)) FROM adult", "plain column"),
    ("SELECT (COUNT(*)) FROM adult", "not an accepted aggregate"),
    ("SELECT COUNT(*) + 1 FROM adult", r"not an accepted aggregate \(Add\)"),
    ("SELECT SUM(age ORDER BY age) FROM adult", "ORDER BY inside an aggregate"),
    ("SELECT MEAN(age ORDER BY age DESC) FROM adult", "ORDER BY inside an aggregate"),
    ("SELECT COUNT(*) FILTER (WHERE age > 30) FROM adult", "FILTER"),
    ("SELECT COUNT(*) OVER () FROM adult", "Window"),
    ("SELECT COUNT(*) OVER w FROM adult WINDOW w AS ()", "WINDOW"),
    ("SELECT upper(sex), COUNT(*) FROM adult GROUP BY sex", "Upper"),
    ("SELECT MEAN(age, hours) FROM adult", "not an accepted aggregate"),
    ("SELECT my_udf(age) FROM adult", "not an accepted aggregate"),
    ("SELECT QUANTILE_CONT(age, 2) FROM adult", "quantile level"),
    ("SELECT QUANTILE_CONT(age, -0.5) FROM adult", "quantile level"),
    ("SELECT QUANTILE_CONT(age, '0.5') FROM adult", "quantile level"),
    ("SELECT QUANTILE_CONT(age, [0.1, 0.9]) FROM adult", "Array"),
    ("SELECT QUANTILE(age) FROM adult", "quantile level"),
    ("SELECT APPROX_QUANTILE(age, 0.5, 10) FROM adult", "not accepted"),
    ("SELECT PERCENTILE_CONT(0.9) FROM adult", "plain column"),
    ("SELECT PERCENTILE_CONT(0.5, 0.9) WITHIN GROUP (ORDER BY age) FROM adult", "WITHIN GROUP is accepted only"),
    ("SELECT PERCENTILE_CONT(age, 0.9) WITHIN GROUP (ORDER BY age) FROM adult", "WITHIN GROUP is accepted only"),
    ("SELECT PERCENTILE_CONT(0.9) WITHIN GROUP (ORDER BY age, hours) FROM adult", "one ordering column"),
    ("SELECT PERCENTILE_CONT(0.9) WITHIN GROUP (ORDER BY age + 1) FROM adult", "not Add"),
    ("SELECT PERCENTILE_CONT(0.9) WITHIN GROUP (ORDER BY 1) FROM adult", "plain column"),
    ("SELECT PERCENTILE_CONT(2) WITHIN GROUP (ORDER BY age DESC) FROM adult", "quantile level"),
    ("SELECT PERCENTILE_CONT(0.9) WITHIN GROUP (ORDER BY adult.age) FROM adult", "table qualifier"),
    # clauses
    ("SELECT sex, COUNT(*) FROM adult GROUP BY sex HAVING COUNT(*) > 5", "HAVING"),
    ("SELECT COUNT(*) FROM adult QUALIFY COUNT(*) > 1", "QUALIFY"),
    ("SELECT COUNT(*) FROM adult ORDER BY 1", "ORDER BY"),
    ("SELECT COUNT(*) FROM adult ORDER BY ALL", "ORDER BY"),
    ("SELECT COUNT(*) FROM adult LIMIT 1", "LIMIT"),
    ("SELECT COUNT(*) FROM adult LIMIT 1 OFFSET 2", "LIMIT"),
    ("SELECT COUNT(*) FROM adult OFFSET 2", "OFFSET"),
    ("SELECT sex, COUNT(*) FROM adult GROUP BY ALL", "GROUP BY ALL"),
    ("SELECT sex, COUNT(*) FROM adult GROUP BY 1", "plain column"),
    ("SELECT sex, COUNT(*) FROM adult GROUP BY (sex)", "plain column"),
    ("SELECT sex, COUNT(*) FROM adult GROUP BY ROLLUP (sex)", "Rollup"),
    ("SELECT sex, COUNT(*) FROM adult GROUP BY CUBE (sex)", "Cube"),
    ("SELECT sex, COUNT(*) FROM adult GROUP BY GROUPING SETS ((sex), ())", "GroupingSets"),
    ("SELECT sex, COUNT(*) FROM adult GROUP BY upper(sex)", "Upper"),
    ("SELECT COUNT(*) FROM adult WHERE age > 3 GROUP BY adult.sex", "table qualifier"),
    # the table
    ("SELECT COUNT(*) FROM other", "table"),
    ("SELECT COUNT(*)", "FROM <table> is required"),
    ("SELECT COUNT(*) FROM adult a", "table alias"),
    ("SELECT COUNT(*) FROM adult AS a", "table alias"),
    ("SELECT COUNT(*) FROM adult FINAL", "table alias"),
    ("SELECT COUNT(*) FROM main.adult", "qualified name"),
    ("SELECT COUNT(*) FROM db.main.adult", "qualified name"),
    ("SELECT COUNT(*) FROM ONLY adult", "ONLY"),
    ("SELECT COUNT(*) FROM adult TABLESAMPLE (10 PERCENT)", "TABLESAMPLE"),
    ("SELECT COUNT(*) FROM adult TABLESAMPLE RESERVOIR (50 ROWS)", "TABLESAMPLE"),
    ("SELECT COUNT(*) FROM adult USING SAMPLE 10%", "SAMPLE"),
    ("SELECT COUNT(*) FROM adult PIVOT (SUM(age) FOR sex IN ('F'))", "PIVOT"),
    ("SELECT COUNT(*) FROM adult UNPIVOT (v FOR k IN (age))", "PIVOT"),
    ("SELECT COUNT(*) FROM adult AT (VERSION => 1)", "time travel"),
    ("SELECT COUNT(*) FROM adult FOR VERSION AS OF 1", "time travel"),
    ("SELECT COUNT(*) FROM adult FOR SYSTEM_TIME AS OF '2020-01-01'", "time travel"),
    ("SELECT COUNT(*) FROM adult WITH (NOLOCK)", "table hint"),
    ("SELECT COUNT(*) FROM adult, adult", "JOIN"),
    ("SELECT COUNT(*) FROM adult JOIN other ON adult.uid = other.uid", "JOIN"),
    ("SELECT COUNT(*) FROM adult CROSS JOIN adult", "JOIN"),
    ("SELECT COUNT(*) FROM adult, LATERAL (SELECT 1)", "JOIN"),
    ("SELECT COUNT(*) FROM (SELECT * FROM adult)", "no subqueries"),
    ("SELECT COUNT(*) FROM (VALUES (1)) t", "VALUES"),
    ("SELECT COUNT(*) FROM UNNEST([1, 2])", "UNNEST"),
    ("SELECT COUNT(*) FROM read_csv('x.csv')", "no table functions"),
    ("SELECT COUNT(*) FROM range(10)", "not accepted"),
    ("WITH t AS (SELECT * FROM adult) SELECT COUNT(*) FROM t", "WITH"),
    ("WITH t AS (SELECT 1) SELECT COUNT(*) FROM adult", "WITH"),
    # statements
    ("SELECT COUNT(*) FROM adult UNION SELECT COUNT(*) FROM adult", "only SELECT"),
    ("SELECT COUNT(*) FROM adult; DROP TABLE adult", "one statement"),
    ("SELECT COUNT(*) FROM adult; SELECT COUNT(*) FROM adult", "one statement"),
    ("DELETE FROM adult", "only SELECT"),
    ("VALUES (1)", "only SELECT"),
    ("SELEC COUNT(*) FROM adult", "parse"),
    ("SELECT FROM adult", "aggregate"),
    ("", "non-empty"),
    ("   ", "non-empty"),
    # hints in comments (plain comments are fine)
    ("SELECT /*+ PARALLEL(4) */ COUNT(*) FROM adult", "hint"),
    ("SELECT COUNT(*) FROM adult /*+ no_noise */", "hint"),
    ("SELECT COUNT(*) FROM adult WHERE age > 3 /*! mysql */", "hint"),
    # conditions
    ("SELECT COUNT(*) FROM adult WHERE age > hours", "literal"),
    ("SELECT COUNT(*) FROM adult WHERE 1 = 1", "a column on one side"),
    ("SELECT COUNT(*) FROM adult WHERE upper(sex) = 'MALE'", "Upper"),
    ("SELECT COUNT(*) FROM adult WHERE age::INT > 3", "Cast"),
    ("SELECT COUNT(*) FROM adult WHERE CAST(age AS INT) > 3", "Cast"),
    ("SELECT COUNT(*) FROM adult WHERE age > '3'::INT", "Cast"),
    ("SELECT COUNT(*) FROM adult WHERE age > DATE '2020-01-01'", "not accepted"),
    ("SELECT COUNT(*) FROM adult WHERE sex = 'a' COLLATE nocase", "COLLATE"),
    ("SELECT COUNT(*) FROM adult WHERE sex COLLATE nocase = 'a'", "COLLATE"),
    ("SELECT COUNT(*) FROM adult WHERE sex ILIKE 'f%'", "ILike"),
    ("SELECT COUNT(*) FROM adult WHERE sex LIKE 'f%'", "Like"),
    ("SELECT COUNT(*) FROM adult WHERE adult.age > 3", "table qualifier"),
    ('SELECT COUNT(*) FROM adult WHERE "adult"."age" > 3', "table qualifier"),
    ("SELECT COUNT(*) FROM adult WHERE age IN (SELECT age FROM adult)", "subquery"),
    ("SELECT COUNT(*) FROM adult WHERE EXISTS (SELECT 1)", "Exists"),
    ("SELECT COUNT(*) FROM adult WHERE age IN (1, age)", "literal"),
    ("SELECT COUNT(*) FROM adult WHERE age IN UNNEST([1])", "UNNEST"),
    ("SELECT COUNT(*) FROM adult WHERE age = ANY([1])", "Any"),
    ("SELECT COUNT(*) FROM adult WHERE (age, hours) IN ((1, 2))", "Tuple"),
    ("SELECT COUNT(*) FROM adult WHERE age BETWEEN SYMMETRIC 3 AND 1", "BETWEEN SYMMETRIC"),
    ("SELECT COUNT(*) FROM adult WHERE age IS NOT DISTINCT FROM 3", "NullSafeEQ"),
    ("SELECT COUNT(*) FROM adult WHERE age = NULL", "literal"),
    ("SELECT COUNT(*) FROM adult WHERE age > 3 IS TRUE", "IS takes NULL"),
    ("SELECT COUNT(*) FROM adult WHERE age", "not accepted as a condition"),
    ("SELECT COUNT(*) FROM adult WHERE TRUE", "not accepted as a condition"),
    ("SELECT COUNT(*) FROM adult WHERE age > 1e400", "finite"),
    ("SELECT COUNT(*) FROM adult WHERE age > - -3", "literal"),
    ("SELECT COUNT(*) FROM adult WHERE age > $1", "placeholder"),
    ("SELECT COUNT(*) FROM adult WHERE age > ?", "placeholder"),
    ("SELECT COUNT(*) FROM adult WHERE age > (SELECT 1)", "Subquery"),
    ("SELECT COUNT(*) FROM adult WHERE COUNT(*) > 3", "a column on one side"),
    ("SELECT COUNT(*) FROM adult WHERE nope = 1", "unknown column"),
    ("SELECT AVG(nope) FROM adult", "unknown column"),
    ('SELECT AVG("age ") FROM adult', "unknown column"),
    # aliases and output names
    ("SELECT sex AS s, COUNT(*) FROM adult GROUP BY sex", "no alias"),
    ("SELECT sex, sex, COUNT(*) FROM adult GROUP BY sex", "selected twice"),
    ('SELECT COUNT(*) AS "" FROM adult', "non-empty name"),
    ('SELECT COUNT(*) AS "a\nb" FROM adult', "control characters"),
    ("SELECT COUNT(*) AS sex, sex FROM adult GROUP BY sex", "two output columns would be named 'sex'"),
]


@pytest.mark.parametrize("text, match", REFUSED)
def test_compile_refuses_everything_outside_the_subset(text: str, match: str) -> None:
    with pytest.raises(InvalidParameterError, match=match) as info:
        compile_(text)
    err = info.value
    assert err.name == "sql" and isinstance(err.value, str) and len(err.value) <= 200
    assert err.accepted  # says what is accepted


@pytest.mark.parametrize(
    "text, name",
    [
        ("SELECT SUM(age) AS a_low, COUNT(*) AS a FROM adult", "a_low"),
        ("SELECT COUNT(*) AS a, SUM(age) AS a_high FROM adult", "a_high"),
        ("SELECT COUNT(*), COUNT(*) FROM adult", "count"),
        ("SELECT COUNT(*), COUNT(1) AS COUNT FROM adult", "COUNT"),
        ("SELECT COUNT(*) AS n, SUM(age) AS N FROM adult", "N"),
        ("SELECT AVG(age), MEAN(age) FROM adult", "mean_age"),
        ("SELECT MEDIAN(age), QUANTILE_CONT(age, 0.5) FROM adult", "median_age"),
        ("SELECT QUANTILE_CONT(age, 0.1), PERCENTILE_CONT(0.9) WITHIN GROUP (ORDER BY age DESC) FROM adult", "q10_age"),
        ("SELECT count_low, COUNT(*) FROM adult GROUP BY count_low", "count_low"),
        ("SELECT COUNT(*) FROM adult GROUP BY count_low", "count_low"),
        ("SELECT sex, COUNT(*) AS SEX FROM adult GROUP BY sex", "SEX"),
        ("SELECT sex, COUNT(*) AS sex_x, SUM(age) AS Sex_X_LOW FROM adult GROUP BY sex", "Sex_X_LOW"),
        ("SELECT COUNT(*) FROM adult GROUP BY sex, SEX", "sex"),
        ("SELECT SUM(age) AS sex FROM adult GROUP BY sex", "sex"),
        ("SELECT COUNT(*) AS count_low_low, SUM(age) AS count_low FROM adult", "count_low_low"),
    ],
)
def test_output_name_collisions_are_refused(text: str, name: str) -> None:
    with pytest.raises(InvalidParameterError, match=f"two output columns would be named {name!r}") as info:
        compile_(text)
    assert info.value.name == "sql" and "X_low and X_high" in info.value.accepted


@pytest.mark.parametrize(
    "text",
    [
        "SELECT sex, COUNT(*) AS sex_count FROM adult GROUP BY sex",
        "SELECT SUM(age) AS sex_low FROM adult GROUP BY sex",  # a group column has no interval columns
        "SELECT COUNT(*) AS a, SUM(age) AS a_lo, AVG(age) AS a_hi FROM adult",
        "SELECT COUNT(*) AS low, SUM(age) AS high FROM adult",
    ],
)
def test_distinct_output_names_are_fine(text: str) -> None:
    compile_(text)


def test_refusals_echo_at_most_200_characters_of_the_fragment() -> None:
    long_alias = "x" * 500
    with pytest.raises(InvalidParameterError) as info:
        compile_(f"SELECT COUNT(*) FROM adult {long_alias}")
    assert info.value.value == long_alias[:200]
    with pytest.raises(InvalidParameterError) as info:
        # a long condition (within the default nesting limit of 32) before the refused LIMIT
        compile_("SELECT COUNT(*) FROM adult WHERE " + " OR ".join(["age > 1000000"] * 30) + " LIMIT 1")
    assert "LIMIT" in str(info.value) and len(info.value.value) <= 200


def test_rejections_name_the_offending_fragment() -> None:
    with pytest.raises(InvalidParameterError) as info:
        compile_("SELECT COUNT(*) FROM adult AT (VERSION => 1)")
    assert info.value.value == "AT (VERSION => 1)"
    with pytest.raises(InvalidParameterError) as info:
        compile_("SELECT COUNT(*) FROM adult WHERE age::INT > 3")
    assert info.value.value == "CAST(age AS INT) > 3"


@pytest.mark.parametrize(
    "text, match",
    [
        ("age::INT > 3", "Cast"),
        ("upper(sex) = 'M'", "Upper"),
        ("adult.age > 3", "table qualifier"),
        ("sex = 'a' COLLATE nocase", "COLLATE"),
        ("age IN (SELECT 1)", "subquery"),
        ("COUNT(*) > 3", "Count"),
        ("age > 3; DROP TABLE adult", "one statement"),
        ("age > 3 /*+ hint */", "hint"),
        ("age BETWEEN SYMMETRIC 1 AND 2", "SYMMETRIC"),
        ("age > hours", "literal"),
        ("age", "not accepted as a condition"),
        ("SELECT 1", "Select"),
        ("", "non-empty"),
    ],
)
def test_parse_predicate_refuses_outside_the_condition_grammar(text: str, match: str) -> None:
    with pytest.raises(InvalidParameterError, match=match):
        parse_predicate(text)


@pytest.mark.parametrize(
    "key, value",
    [
        ("sample", exp.TableSample(size=exp.Literal.number(5))),
        ("only", True),
        ("version", exp.Version(this="VERSION", kind="AS OF", expression=exp.Literal.number(1))),
        ("a_key_sqlglot_adds_one_day", exp.Literal.number(1)),
    ],
)
def test_the_walk_refuses_any_argument_it_does_not_know(key: str, value: object) -> None:
    tree = sqlglot.parse_one("SELECT COUNT(*) FROM adult", read="duckdb")
    sql_parse._check_tree(tree, sql_parse._NODES, "x")  # accepted as parsed
    tree.find(exp.Table).args[key] = value  # type: ignore[union-attr]
    with pytest.raises(InvalidParameterError, match="not accepted"):
        sql_parse._check_tree(tree, sql_parse._NODES, "x")


def test_the_whitelist_matches_this_sqlglot_version() -> None:
    # listed keys are real keys of the node (a stale name would refuse the arg it now spells);
    # "from"/"from_" and Count's "big_int" differ across the supported sqlglot versions
    for cls, keys in sql_parse._NODES.items():
        unknown = set(keys) - set(cls.arg_types) - {"from", "from_", "big_int"}
        assert not unknown, (cls.__name__, unknown)
    assert {"from", "from_"} & set(exp.Select.arg_types)
    assert set(sql_parse._CONDITION_NODES.items()) <= set(sql_parse._NODES.items())


@pytest.mark.parametrize(
    "text, match",
    [
        ("SELECT * FROM adult", "read rows"),
        ("SELECT COUNT(*) FROM adult TABLESAMPLE (10 PERCENT)", "TABLESAMPLE"),
        ("SELECT PERCENTILE_CONT(0.9) WITHIN GROUP (ORDER BY age, hours) FROM adult", "one ordering column"),
        ("SELECT SUM(age) AS a_low, COUNT(*) AS a FROM adult", "two output columns"),
        ("SELECT COUNT(DISTINCT age) FROM adult", "privacy unit"),
        ("SELECT AVG(nope) FROM adult", "unknown column"),
        ("SELECT COUNT(*) FROM adult; DROP TABLE adult", "one statement"),
    ],
)
def test_rejected_sql_spends_nothing(session: dp.Session, text: str, match: str) -> None:
    with pytest.raises(InvalidParameterError, match=match):
        session.sql(text, epsilon=1.0)
    assert session.spent == (0.0, 0.0)


def test_undeclared_bounds_are_refused_by_the_session(session: dp.Session) -> None:
    # compile_sql accepts AVG(uid); the session refuses a column without declared bounds (its
    # wording is the session's, so only the column is checked here)
    with pytest.raises(InvalidParameterError, match="uid"):
        session.sql("SELECT AVG(uid) FROM adult", epsilon=1.0)
    assert session.spent == (0.0, 0.0)


def test_aggregate_specs_validate_their_arguments() -> None:
    with pytest.raises(InvalidParameterError):
        A.Mean("")
    with pytest.raises(InvalidParameterError):
        A.QuantileAgg("age", q=-0.1)
    with pytest.raises(InvalidParameterError):
        A.Count(name="")


def test_an_unquoted_hyphenated_name_gets_a_hint_to_quote_it() -> None:
    frame = pd.DataFrame({"hours-per-week": [40, 50, 60]})
    meta = Metadata(columns={"hours-per-week": Numeric(0, 100)}, row_level=True)
    s = dp.Session(frame, metadata=meta, budget=dp.Budget(epsilon=1.0))
    with pytest.raises(InvalidParameterError) as info:
        s.sql_cost("SELECT AVG(hours-per-week) FROM data", epsilon=0.1)
    assert 'must be double-quoted, as in "hours-per-week"' in str(info.value)
    # Only a chain of bare names gets the hint (it is read from the query text alone).
    with pytest.raises(InvalidParameterError) as other:
        s.sql_cost("SELECT AVG(hours - 1) FROM data", epsilon=0.1)
    assert "double-quoted" not in str(other.value)
    assert s.sql_cost('SELECT AVG("hours-per-week") AS h FROM data', epsilon=0.1).epsilon == pytest.approx(0.1)
