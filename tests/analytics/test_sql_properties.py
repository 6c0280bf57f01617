"""Property-based tests of the private SQL compiler (Hypothesis, https://hypothesis.readthedocs.io).

Two properties of :func:`dpkit.analytics.sql.compile_sql`, checked on generated text:

* a random well-formed query over a small schema — built from a grammar of the accepted subset —
  compiles, and compiles to the same plan (filter, group keys, aggregates) as its pretty-printed
  form: the compiler reads the parse tree, never the layout of the text;
* random text — arbitrary characters, or SQL-looking token soup — is either compiled or refused
  with a :class:`~dpkit.errors.DPError`; no parser or engine exception escapes to the analyst.

Runs are derandomized (fixed examples from run to run) and bounded so each test takes seconds.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, replace
from typing import Any

import pytest
import sqlglot
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dpkit.analytics import QueryLimits
from dpkit.analytics.sql import compile_sql
from dpkit.errors import DPError

SETTINGS = settings(
    derandomize=True, database=None, max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


# -- a stand-in session: compile_sql reads table, columns, privacy_unit, limits and query() ------


@dataclass(frozen=True)
class _Query:
    predicate: Any = None
    groups: tuple[str, ...] = ()

    def where(self, predicate: Any) -> _Query:
        return replace(self, predicate=predicate)

    def group_by(self, *columns: str) -> _Query:
        return replace(self, groups=columns)


class _Session:
    limits = QueryLimits()
    table = "people"
    privacy_unit = "uid"
    columns = {
        "uid": "categorical",
        "age": "numeric",
        "hours": "numeric",
        "sex": "categorical",
        "marital-status": "categorical",
    }

    def query(self) -> _Query:
        return _Query()


SESSION = _Session()
NUMERIC = ["age", "hours"]
CATEGORICAL = ["sex", '"marital-status"']


def _compile(text: str) -> tuple[_Query, list[Any]]:
    return compile_sql(SESSION, text)  # type: ignore[arg-type,return-value,unused-ignore]


# -- the grammar ----------------------------------------------------------------------------------

_ints = st.integers(min_value=-(10**6), max_value=10**6).map(str)
_floats = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False, allow_infinity=False).map(repr)
_strings = st.text(alphabet="abcXYZ _-'é", max_size=8).map(lambda s: "'" + s.replace("'", "''") + "'")
_literals = st.one_of(_ints, _floats, _strings, st.sampled_from(["TRUE", "FALSE"]))
_columns = st.sampled_from(["age", "hours", "sex", "uid", '"marital-status"', "AGE", '"age"'])


@st.composite
def _comparison(draw: st.DrawFn) -> str:
    column, literal = draw(_columns), draw(_literals)
    op = draw(st.sampled_from(["=", "==", "<>", "!=", "<", "<=", ">", ">="]))
    return f"{literal} {op} {column}" if draw(st.booleans()) else f"{column} {op} {literal}"


@st.composite
def _atom(draw: st.DrawFn) -> str:
    column = draw(_columns)
    kind = draw(st.sampled_from(["compare", "in", "between", "null"]))
    if kind == "compare":
        return draw(_comparison())
    if kind == "in":
        values = draw(st.lists(_literals, min_size=1, max_size=4))
        negated = "NOT " if draw(st.booleans()) else ""
        return f"{column} {negated}IN ({', '.join(values)})"
    if kind == "between":
        low, high = draw(_ints), draw(_ints)
        negated = "NOT " if draw(st.booleans()) else ""
        return f"{column} {negated}BETWEEN {low} AND {high}"
    return f"{column} IS {'NOT ' if draw(st.booleans()) else ''}NULL"


_conditions = st.recursive(
    _atom(),
    lambda inner: st.one_of(
        st.tuples(inner, st.sampled_from(["AND", "OR"]), inner).map(lambda t: f"{t[0]} {t[1]} {t[2]}"),
        inner.map(lambda c: f"NOT ({c})"),
        inner.map(lambda c: f"({c})"),
    ),
    max_leaves=5,
)


@st.composite
def _aggregate(draw: st.DrawFn, *, within_group: bool) -> str:
    column = draw(st.sampled_from(NUMERIC))
    q = draw(st.sampled_from(["0", "0.1", "0.5", "0.9", "1"]))
    forms = [
        "COUNT(*)",
        "COUNT(1)",
        "COUNT(DISTINCT uid)",
        f"SUM({column})",
        f"AVG({column})",
        f"MEAN({column})",
        f"VARIANCE({column})",
        f"VAR_POP({column})",
        f"STDDEV({column})",
        f"STDDEV_SAMP({column})",
        f"MEDIAN({column})",
        f"QUANTILE_CONT({column}, {q})",
        f"PERCENTILE_CONT({column}, {q})",
    ]
    if within_group:
        forms += [
            f"PERCENTILE_CONT({q}) WITHIN GROUP (ORDER BY {column} DESC)",
            f"PERCENTILE_CONT({q}) WITHIN GROUP (ORDER BY {column})",
        ]
    return draw(st.sampled_from(forms))


@st.composite
def _queries(draw: st.DrawFn, *, within_group: bool = True) -> str:
    groups = draw(st.lists(st.sampled_from(CATEGORICAL), unique=True, max_size=2))
    aggregates = draw(st.lists(_aggregate(within_group=within_group), min_size=1, max_size=4))
    # Unique aliases: default output names may collide (two SUM(age)), which is refused by design.
    items = [g for g in groups if draw(st.booleans())]
    items += [f"{a}{' AS' if draw(st.booleans()) else ''} a{i}" for i, a in enumerate(aggregates)]
    items = draw(st.permutations(items))
    text = f"SELECT {', '.join(items)} FROM people"
    if draw(st.booleans()):
        text += f" WHERE {draw(_conditions)}"
    if groups:
        text += f" GROUP BY {', '.join(groups)}"
    return text + (";" if draw(st.booleans()) else "")


# -- properties -----------------------------------------------------------------------------------


@SETTINGS
@given(_queries())
def test_every_query_of_the_grammar_is_accepted(text: str) -> None:
    query, aggregates = _compile(text)
    assert len(aggregates) >= 1
    assert bool(query.groups) == ("GROUP BY" in text)
    assert (query.predicate is not None) == (" WHERE " in text)


# sqlglot's DuckDB writer renders ``PERCENTILE_CONT(q) WITHIN GROUP (ORDER BY c)`` as
# ``QUANTILE_CONT(c, q ORDER BY c)``: an ORDER BY inside an aggregate, which the subset refuses.
# That is the writer changing the statement, not its layout, so the round trip leaves WITHIN GROUP out.
@SETTINGS
@given(_queries(within_group=False))
def test_a_well_formed_query_compiles_like_its_pretty_printed_form(text: str) -> None:
    pretty = sqlglot.transpile(text, read="duckdb", write="duckdb", pretty=True)[0]
    assert _compile(text) == _compile(pretty)


_TOKENS = [
    "SELECT", "FROM", "WHERE", "GROUP", "BY", "AND", "OR", "NOT", "IN", "IS", "NULL", "BETWEEN",
    "COUNT", "SUM", "AVG", "DISTINCT", "AS", "ORDER", "HAVING", "LIMIT", "WITH", "UNION", "JOIN",
    "people", "age", "sex", "uid", "*", ",", "(", ")", "[", "]", "=", "<", ">=", "'x'", "1", "-2.5",
    ";", "--", "/*", "*/", "/*+", '"', "'", "::", "?", "$1", "OVER", "WITHIN", "::INT", "e", "\n",
]  # fmt: skip


@SETTINGS
@given(st.one_of(st.text(max_size=120), st.lists(st.sampled_from(_TOKENS), max_size=30).map(" ".join)))
def test_random_text_is_compiled_or_refused_with_a_dpkit_error(text: str) -> None:
    with contextlib.suppress(DPError):
        _compile(text)


@pytest.mark.parametrize(
    "text",
    [
        "SELECT COUNT(*) FROM people",
        "SELECT sex, AVG(age) AS a FROM people WHERE age > 30 AND sex IN ('F', 'M') GROUP BY sex",
    ],
)
def test_the_grammar_examples_compile(text: str) -> None:
    _compile(text)
