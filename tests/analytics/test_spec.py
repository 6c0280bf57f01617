"""The query spec: QueryOptions and QuerySpec (the JSON form the service reads and records),
pricing a spec without data, executing it, the aggregates' names, and no import cycles."""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import dpkit as dp
import dpkit.analytics as analytics
from dpkit.analytics import Categorical, Count, Mean, Metadata, Numeric, QuantileAgg, QueryOptions, QuerySpec, Sum
from dpkit.analytics.execute import execute
from dpkit.analytics.pricing import cost, price
from dpkit.analytics.sql import compile_spec
from dpkit.errors import BudgetExceededError, InvalidParameterError

META = Metadata(columns={"age": Numeric(0, 100), "sex": Categorical(("F", "M"))}, row_level=True)


def frame() -> pd.DataFrame:
    rng = np.random.default_rng(7)
    return pd.DataFrame({"age": rng.integers(0, 100, 400), "sex": rng.choice(np.array(["F", "M"]), 400)})


def session(seed: int = 3, epsilon: float = 10.0) -> dp.Session:
    return dp.Session(frame(), budget=dp.Budget(epsilon=epsilon), metadata=META, rng=np.random.default_rng(seed))


# -- options ---------------------------------------------------------------------------------------


def test_options_defaults_and_checks() -> None:
    o = QueryOptions(epsilon=1)
    assert (o.epsilon, o.delta, o.noise, o.confidence, o.key_selection, o.split) == (
        1.0,
        0.0,
        "laplace",
        0.95,
        "truncated_geometric",
        None,
    )
    assert QueryOptions(epsilon=1.0, split=[1, 3]).weights(2, selection=False) == (0.25, 0.75)
    for kwargs, name in [
        ({"epsilon": 0}, "epsilon"),
        ({"epsilon": 1, "delta": 1}, "delta"),
        ({"epsilon": 1, "noise": "cauchy"}, "noise"),
        ({"epsilon": 1, "confidence": 1}, "confidence"),
        ({"epsilon": 1, "key_selection": "all"}, "key_selection"),
    ]:
        with pytest.raises(InvalidParameterError) as info:
            QueryOptions(**kwargs)
        assert info.value.name == name
    with pytest.raises(InvalidParameterError, match="a list of 2 positive finite weights"):
        QueryOptions(epsilon=1.0, split=[1]).weights(2, selection=False)


def test_option_defaults_are_written_once() -> None:
    """The front ends' signatures read their defaults from QueryOptions, and ε is required."""
    for method in (
        dp.Session.count,
        dp.Session.mean,
        dp.Session.aggregate,
        analytics.Query.aggregate,
        analytics.Query.cost,
        analytics.Query.histogram,
    ):
        params = inspect.signature(method).parameters
        assert (
            params["epsilon"].kind is inspect.Parameter.KEYWORD_ONLY
            and params["epsilon"].default is inspect.Parameter.empty
        )
        for name in ("delta", "noise", "confidence", "key_selection", "split"):
            assert params[name].kind is inspect.Parameter.KEYWORD_ONLY
            assert params[name].default == getattr(QueryOptions, name)


# -- the JSON form ------------------------------------------------------------------------------


def test_from_json_and_canonical_text() -> None:
    obj = {
        "aggregates": [
            {"kind": "count"},
            {"kind": "variance", "column": "age", "name": "v"},
            {"kind": "quantile", "column": "age", "q": 1, "column_": None},
        ],
    }
    with pytest.raises(InvalidParameterError, match="only the fields kind, column, q and name"):
        QuerySpec.from_json(obj)
    obj["aggregates"][2].pop("column_")  # type: ignore[union-attr]
    obj |= {"where": "age > 3", "group_by": ["sex"], "bins": None, "keys": [["F"], ["M"]], "max_rows": 1}
    spec = QuerySpec.from_json(obj)
    assert spec.aggregates == (Count(), dp.analytics.Variance("age", name="v"), QuantileAgg("age", 1.0))
    text = spec.to_json()
    assert json.loads(text) == {
        "aggregates": [
            {"kind": "count"},
            {"column": "age", "kind": "variance", "name": "v"},
            {"column": "age", "kind": "quantile", "q": 1.0},
        ],
        "group_by": ["sex"],
        "keys": [["F"], ["M"]],
        "max_rows": 1,
        "where": "age > 3",
    }
    assert QuerySpec.from_json(json.loads(text)).to_json() == text
    # integer bin edges are read as the numbers they are (one query, one recorded text)
    assert QuerySpec.from_json({"aggregates": [{"kind": "count"}], "bins": {"age": [0, 50]}}).bins == {
        "age": (0.0, 50.0)
    }


@pytest.mark.parametrize(
    "item, name, accepted",
    [
        (
            {"kind": "median", "column": "age"},
            "aggregates[0].kind",
            "'count', 'count_units', 'sum', 'mean', 'variance', 'std', 'quantile'",
        ),
        ({"kind": "count", "column": "age"}, "aggregates[0]", "count without column or q"),
        ({"kind": "mean", "column": "age", "q": 0.5}, "aggregates[0].q", "no q for mean"),
        ({"kind": "sum"}, "column", "a column name"),
        ({"kind": "quantile", "column": "age"}, "q", "a number in [0, 1]"),
    ],
)
def test_from_json_refusals(item: dict[str, object], name: str, accepted: str) -> None:
    with pytest.raises(InvalidParameterError) as info:
        QuerySpec.from_json({"aggregates": [item]})
    assert info.value.name == name and info.value.accepted == accepted


# -- price, then execute ------------------------------------------------------------------------


def test_price_reads_declared_facts_and_matches_the_session() -> None:
    s = session()
    spec = QuerySpec(aggregates=(Count(), Mean("age")), group_by=("sex",), options=QueryOptions(epsilon=1.0))
    priced = price(spec, s._declared)
    assert priced.cost() == s.group_by("sex").cost([Count(), Mean("age")], epsilon=1.0)
    assert cost(spec, s._declared, options=QueryOptions(epsilon=2.0)).epsilon == 2.0
    with pytest.raises(InvalidParameterError, match="keys and bins only with group_by"):
        price(QuerySpec(aggregates=(Count(),), keys=("F",), options=QueryOptions(epsilon=1.0)), s._declared)
    # the same seed gives the same release through the session and through price/execute
    a = session(seed=11).group_by("sex").aggregate([Count(), Mean("age")], epsilon=1.0)
    s2 = session(seed=11)
    b = execute(price(spec, s2._declared), s2.engine, s2._payer, s2._rng)
    pd.testing.assert_frame_equal(a.table, b.table)
    assert s2.remaining == pytest.approx(9.0)


def test_execute_pays_before_the_engine_runs() -> None:
    s = session(epsilon=0.5)

    class Untouchable:
        def aggregate(self, plan: object) -> None:
            raise AssertionError("the engine ran before the debit")

        def compute(self, plan: object) -> None:
            raise AssertionError("the engine ran before the debit")

    with pytest.raises(BudgetExceededError):
        execute(
            price(QuerySpec(aggregates=(Sum("age"),), options=QueryOptions(epsilon=1.0)), s._declared),
            Untouchable(),
            s._payer,
            None,
        )  # type: ignore[arg-type]


def test_sql_compiles_to_a_spec() -> None:
    s = session()
    spec = compile_spec(s, "SELECT sex, COUNT(*) AS n, AVG(age) FROM data WHERE age > 3 GROUP BY sex")
    assert spec.group_by == ("sex",) and [a.name for a in spec.aggregates] == ["n", "mean_age"]
    assert compile_spec(s._declared, "SELECT COUNT(*) FROM data") == QuerySpec(aggregates=(Count(),))


# -- names -----------------------------------------------------------------------------------


def test_one_name_for_the_quantile_aggregate() -> None:
    # dpkit.Quantile is the mechanism; the aggregate that runs it per group is QuantileAgg only.
    import dpkit.analytics.aggregates as aggregates

    assert not hasattr(analytics, "Quantile") and not hasattr(aggregates, "Quantile")
    assert QuantileAgg("age", 0.9).name == "q90_age" and Sum("age", name="t").name == "t"


# -- imports ------------------------------------------------------------------------------------

_ROOT = Path(dp.__file__).parent / "analytics"
_MODULES = sorted(
    ".".join(("dpkit",) + p.relative_to(_ROOT.parent).with_suffix("").parts)
    for p in _ROOT.rglob("*.py")
    if p.name != "__init__.py"
)


@pytest.mark.parametrize(
    "module",
    [
        "dpkit.analytics.spec",
        "dpkit.analytics.sql",
        "dpkit.analytics.query",
        "dpkit.analytics.pricing",
        "dpkit.analytics.execute",
        "dpkit.analytics.session",
    ],
)
def test_module_imports_first_in_a_fresh_interpreter(module: str) -> None:
    assert module in _MODULES
    subprocess.run([sys.executable, "-c", f"import {module}"], check=True, timeout=120)


def test_a_built_query_round_trips_through_its_spec() -> None:
    s = session()
    aggs = [Count(), QuantileAgg("age", 0.25)]
    for q in (
        s.where("age > 3").group_by("sex", keys=["F"]),
        s.group_by("age", bins={"age": [0, 50, 100]}),
        s.query().bound(max_rows=1),
    ):
        spec = q.spec(aggs, QueryOptions(epsilon=1.0))
        assert price(spec, s._declared).cost() == q.cost(aggs, epsilon=1.0)
        assert QuerySpec.from_json(json.loads(spec.to_json()) | {"where": None}).group_by == spec.group_by
