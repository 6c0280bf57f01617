"""Binned histograms over HTTP: the JSON query's ``bins`` takes edges or a number of equal-width
bins over the declared bounds (as ``group_by(bins=)`` does), SQL's ``BIN(...)`` works through
``sql``, both give the builder's labels and cost, and a bad bin is a 400 that spends nothing.

The service draws its noise from the OS CSPRNG (seeds are refused), so released counts are
checked against the true counts with a stated tail: with ε = 1 on a count the noise is discrete
Laplace of scale 1, and |noise| > 30 has probability below 2e-13 per bin."""

from __future__ import annotations

import json
from typing import Any

import pandas as pd
import pytest

pytest.importorskip("fastapi")

import dpkit as dp  # noqa: E402
from dpkit.analytics import Metadata  # noqa: E402
from server._api import PEOPLE_METADATA, World, error_of  # noqa: E402

QUARTERS = ["[0, 25)", "[25, 50)", "[50, 75)", "[75, 100]"]  # age is declared on [0, 100]


def post(world: World, body: dict[str, Any], endpoint: str = "query") -> Any:
    return world.client().post(f"/v1/datasets/people/{endpoint}", json=body, headers=world.h("alice"))


def builder_labels(world: World, bins: int | list[float]) -> list[str]:
    """The labels the Python builder gives the same bins on the same file and metadata."""
    s = dp.Session(world.people, metadata=Metadata.from_dict(PEOPLE_METADATA), budget=dp.Budget(epsilon=1.0))
    return list(s.histogram("age", bins=bins, epsilon=1.0).table["age"])


def true_counts(world: World, edges: list[float]) -> list[int]:
    age = pd.read_csv(world.people)["age"]
    last = len(edges) - 2
    return [
        int(((age >= lo) & ((age < hi) if k < last else (age <= hi))).sum())
        for k, (lo, hi) in enumerate(zip(edges, edges[1:], strict=False))
    ]


@pytest.mark.parametrize(
    "body",
    [
        {"sql": "SELECT BIN(age, 4) AS a, COUNT(*) FROM people GROUP BY a"},
        {"sql": "SELECT COUNT(*) FROM people GROUP BY BIN(age, 4)"},
        {"sql": "SELECT BIN(age, 0, 25, 50, 75, 100) AS a, COUNT(*) FROM people GROUP BY a"},
        {"query": {"aggregates": [{"kind": "count"}], "group_by": ["age"], "bins": {"age": 4}}},
        {"query": {"aggregates": [{"kind": "count"}], "group_by": ["age"], "bins": {"age": [0, 25, 50, 75, 100]}}},
    ],
)
def test_a_binned_histogram_over_http(world: World, body: dict[str, Any]) -> None:
    cost = post(world, {"epsilon": 1.0, **body}, "query/cost")
    assert cost.status_code == 200, cost.text
    assert cost.json()["cost"]["epsilon"] == pytest.approx(1.0) and world.spent("alice") == (0.0, 0.0)
    r = post(world, {"epsilon": 1.0, **body})
    assert r.status_code == 200, r.text
    rows = r.json()["rows"]
    assert [row["age"] for row in rows] == QUARTERS == builder_labels(world, 4)
    for row, true in zip(rows, true_counts(world, [0, 25, 50, 75, 100]), strict=True):
        assert abs(row["count"] - true) <= 30, (row, true)
    assert world.spent("alice")[0] == pytest.approx(1.0)
    recorded = world.service.ledger.list_spends("people", "alice")[0].query_text
    assert recorded == body["sql"] if "sql" in body else json.loads(recorded)["bins"] == body["query"]["bins"]


def test_bins_with_a_categorical_column_over_http(world: World) -> None:
    sql = "SELECT sex, BIN(age, 18, 30, 50, 90) AS a, COUNT(*) FROM people GROUP BY sex, a"
    r = post(world, {"epsilon": 1.0, "sql": sql})
    assert r.status_code == 200, r.text
    pairs = [(row["sex"], row["age"]) for row in r.json()["rows"]]
    labels = builder_labels(world, [18, 30, 50, 90])
    assert labels == ["[18, 30)", "[30, 50)", "[50, 90]"]
    assert pairs == [(sex, label) for sex in ("F", "M", "O'Brien") for label in labels]


@pytest.mark.parametrize(
    "body, parameter, needles",
    [
        (
            {"sql": "SELECT BIN(age, 0) AS a, COUNT(*) FROM people GROUP BY a"},
            "sql",
            ("BIN(age, 0)", "whole number >= 1"),
        ),
        (
            {"sql": "SELECT BIN(income, 3) AS a, COUNT(*) FROM people GROUP BY a"},
            "sql",
            ("BIN(income, 3)", "declared bounds"),
        ),
        ({"sql": "SELECT BIN(sex, 3) AS a, COUNT(*) FROM people GROUP BY a"}, "sql", ("BIN(sex, 3)", "numeric column")),
        ({"sql": "SELECT COUNT(*) FROM people WHERE BIN(age, 3) = 1"}, "sql", ("BIN(age, 3)", "GROUP BY item")),
        (
            {"query": {"aggregates": [{"kind": "count"}], "group_by": ["age"], "bins": {"age": 0}}},
            "bins['age']",
            ("number of bins >= 1",),
        ),
        (
            {"query": {"aggregates": [{"kind": "count"}], "group_by": ["income"], "bins": {"income": 3}}},
            "bins['income']",
            ("declared bounds",),
        ),
        (
            {"query": {"aggregates": [{"kind": "count"}], "group_by": ["sex"], "bins": {"sex": 3}}},
            "bins['sex']",
            ("numeric",),
        ),
        ({"query": {"aggregates": [{"kind": "count"}], "group_by": ["age"], "bins": {"age": 2.5}}}, None, ("bins",)),
        ({"query": {"aggregates": [{"kind": "count"}], "group_by": ["age"], "bins": {"age": True}}}, None, ("bins",)),
    ],
)
def test_a_bad_bin_over_http_is_a_400_that_spends_nothing(
    world: World, body: dict[str, Any], parameter: str | None, needles: tuple[str, ...]
) -> None:
    for endpoint in ("query", "query/cost"):
        r = post(world, {"epsilon": 1.0, **body}, endpoint)
        assert r.status_code == 400, r.text
        err = error_of(r)
        for needle in needles:
            assert needle in err["message"], err
        if parameter is not None:
            assert err.get("parameter") == parameter, err
    assert world.spent("alice") == (0.0, 0.0)
    assert world.service.ledger.list_spends("people", "alice") == []
