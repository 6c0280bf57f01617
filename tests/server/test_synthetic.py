"""Synthetic tables through the service: paid from the analyst's budget like a query, with its
audit entry in the same transaction; refused before paying on bad settings, limits and budgets.

Deterministic: the noise is the service's secure source, and nothing here depends on its value
beyond the shape of the answer and the exact amounts spent."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from server._api import World, error_of, make_world

BODY = {"epsilon": 1.0, "delta": 1e-6, "columns": ["age", "sex"], "bins": {"age": 5}, "rows": 200}


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    w = make_world(tmp_path)
    try:
        yield w
    finally:
        w.close()


def test_an_analyst_gets_a_table_paid_once_and_logged(world: World) -> None:
    client = world.client()
    before = len(world.entries())
    r = client.post("/v1/datasets/people/synthetic", json=BODY, headers=world.h("alice"))
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["columns"] == ["age", "sex"] and len(body["rows"]) == 200
    assert all((row[0] is None or 0 <= row[0] <= 100) and row[1] in ("F", "M", "O'Brien", None) for row in body["rows"])
    assert body["cost"] == {"epsilon": 1.0, "delta": 1e-6}
    assert world.spent("alice") == (1.0, 1e-6)
    assert body["budget"]["spent_epsilon"] == 1.0 and "spent ε=1" in body["report"]["text"]
    paid = [e for e in world.entries()[before:] if e.outcome == "paid"]
    assert len(paid) == 1 and paid[0].detail["query"].startswith("SYNTHESIZE ")
    assert world.service.verify_log().entries == len(world.entries())  # raises if the ledger and the log disagree
    whole = client.post("/v1/datasets/people/synthetic", json={**BODY, "integers": ["age"]}, headers=world.h("alice"))
    assert whole.status_code == 200, whole.text
    assert all(row[0] is None or isinstance(row[0], int) for row in whole.json()["rows"])


@pytest.mark.parametrize(
    ("change", "parameter"),
    [
        ({"columns": ["age", "city"]}, "metadata.columns.city.categories"),  # private keys
        ({"columns": ["age", "income"], "bins": None}, "bins.income"),  # no bounds, no edges
        ({"bins": {"age": [3, 2]}}, "bins.age"),
        ({"method": "gan"}, "method"),
        ({"delta": 0.0}, "delta"),
        ({"epsilon": 1e-7}, "epsilon"),
        ({"rows": 10**9}, "rows"),
        ({"integers": ["sex"]}, "integers"),
    ],
)
def test_bad_requests_are_refused_before_paying(world: World, change: dict, parameter: str) -> None:
    r = world.client().post("/v1/datasets/people/synthetic", json={**BODY, **change}, headers=world.h("alice"))
    assert r.status_code == 400, r.text
    assert error_of(r)["parameter"] == parameter
    assert world.spent("alice") == (0.0, 0.0)


def test_a_budget_that_cannot_pay_is_refused_with_409(world: World) -> None:
    r = world.client().post("/v1/datasets/people/synthetic", json={**BODY, "epsilon": 11.0}, headers=world.h("alice"))
    assert r.status_code == 409 and error_of(r)["code"] == "budget_exceeded"
    assert world.spent("alice") == (0.0, 0.0)


def test_only_analysts_with_a_grant(world: World) -> None:
    client = world.client()
    assert client.post("/v1/datasets/people/synthetic", json=BODY, headers=world.h("curator")).status_code == 403
    assert client.post("/v1/datasets/secret/synthetic", json={**BODY, "columns": None, "bins": None}, headers=world.h("bob")).status_code == 404


# -- published releases -------------------------------------------------------------------------------


def test_a_published_table_is_downloaded_by_anyone_without_spending(world: World) -> None:
    client = world.client()
    r = client.post("/v1/datasets/people/synthetic", json={**BODY, "publish": "people_2026"}, headers=world.h("alice"))
    assert r.status_code == 200, r.text
    paid = r.json()
    assert paid["release"] == "people_2026" and world.spent("alice") == (1.0, 1e-6)
    # Everyone the service knows may list and download it: bob (another analyst) and the curator.
    listing = client.get("/v1/releases", headers=world.h("bob")).json()["releases"]
    assert [(x["name"], x["dataset"], x["published_by"], x["rows"], x["epsilon"]) for x in listing] == [
        ("people_2026", "people", "alice", 200, 1.0)
    ]
    assert "spend_id" not in listing[0] and listing[0]["columns"] == ["age", "sex"]
    assert world.service.release("people_2026")[0].spend_id == paid["spend_id"]
    got = client.get("/v1/releases/people_2026", headers=world.h("curator"))
    assert got.status_code == 200
    body = got.json()
    assert body["rows"] == paid["rows"] and body["report"] == paid["report"] and body["row_count"] == 200
    csv_text = client.get("/v1/releases/people_2026?format=csv", headers=world.h("bob")).text
    lines = csv_text.strip().split("\n")
    assert lines[0] == "age,sex" and len(lines) == 201
    assert world.spent("bob") == (0.0, 0.0) and world.spent("alice") == (1.0, 1e-6)
    actions = [e.action for e in world.entries()]
    assert actions.count("get_release") == 2 and "list_releases" in actions
    assert world.service.verify_log().entries == len(world.entries())


@pytest.mark.parametrize("name", ["people_2026", "2026", "a-b", "x" * 64])
def test_a_taken_or_bad_release_name_is_refused_before_paying(world: World, name: str) -> None:
    client = world.client()
    first = client.post("/v1/datasets/people/synthetic", json={**BODY, "publish": "people_2026"}, headers=world.h("alice"))
    assert first.status_code == 200
    r = client.post("/v1/datasets/people/synthetic", json={**BODY, "publish": name}, headers=world.h("bob"))
    assert r.status_code == 400 and error_of(r)["parameter"] == "publish", r.text
    assert world.spent("bob") == (0.0, 0.0)
    assert [x["name"] for x in client.get("/v1/releases", headers=world.h("bob")).json()["releases"]] == ["people_2026"]


def test_an_unknown_release_and_a_bad_format(world: World) -> None:
    client = world.client()
    assert client.get("/v1/releases/nothing", headers=world.h("bob")).status_code == 404
    assert client.get("/v1/releases/bad-name", headers=world.h("bob")).status_code == 400
    client.post("/v1/datasets/people/synthetic", json={**BODY, "publish": "t"}, headers=world.h("alice"))
    r = client.get("/v1/releases/t?format=xml", headers=world.h("bob"))
    assert r.status_code == 400 and error_of(r)["parameter"] == "format"
    assert client.get("/v1/releases").status_code == 401
