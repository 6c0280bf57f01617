"""Through the HTTP API: every answer says what its intervals cover, and the estimate of what
bounding left out is asked for with ``bounding_epsilon`` in the body, priced by ``/query/cost``
and paid in the query's one debit — or refused, unpaid."""

from __future__ import annotations

import pytest

pytest.importorskip("fastapi")

from dpkit.server.queries import query_options  # noqa: E402
from dpkit.server.routes.queries import QueryBody  # noqa: E402
from server._api import World, error_of  # noqa: E402

MEAN_SQL = "SELECT AVG(age) FROM people"


def test_the_body_passes_the_option_on_only_when_given() -> None:
    given = QueryBody.model_validate({"epsilon": 0.1, "sql": MEAN_SQL, "bounding_epsilon": 0.05}).request()
    assert query_options(given)["bounding_epsilon"] == 0.05
    assert "bounding_epsilon" not in query_options(
        QueryBody.model_validate({"epsilon": 0.1, "sql": MEAN_SQL}).request()
    )


def test_an_answer_says_what_its_intervals_cover_and_the_estimate_is_paid(world: World) -> None:
    client, h = world.client(), world.h("alice")
    plain = client.post("/v1/datasets/people/query", headers=h, json={"epsilon": 0.1, "sql": MEAN_SQL})
    assert plain.status_code == 200, plain.text
    bounding = plain.json()["bounding"]
    assert bounding["covers"] == "bounded statistic" and bounding["clipped_columns"] == ["age"]
    assert bounding["max_rows"] is None and "estimate" not in bounding  # row-level: nothing capped
    assert world.spent("alice")[0] == 0.1

    body = {"epsilon": 0.1, "sql": MEAN_SQL, "bounding_epsilon": 0.05}
    cost = client.post("/v1/datasets/people/query/cost", headers=h, json=body)
    assert cost.status_code == 200 and cost.json()["cost"]["epsilon"] == 0.15
    assert world.spent("alice")[0] == 0.1  # a preview spends nothing

    paid = client.post("/v1/datasets/people/query", headers=h, json=body)
    assert paid.status_code == 200, paid.text
    answer = paid.json()
    assert answer["cost"]["epsilon"] == 0.15 and answer["epsilon"] == 0.15
    estimate = answer["bounding"]["estimate"]
    assert estimate["epsilon"] == 0.05 and "units_capped" not in estimate
    assert estimate["rows_clipped"]["sensitivity"] == 1 and estimate["rows_clipped"]["epsilon"] == 0.05
    assert world.spent("alice")[0] == pytest.approx(0.25, abs=1e-12)


def test_an_estimate_of_nothing_is_refused_unpaid(world: World) -> None:
    client = world.client()
    before = world.snapshot()
    body = {"epsilon": 0.1, "sql": "SELECT COUNT(*) FROM people", "bounding_epsilon": 0.05}
    for path in ("/v1/datasets/people/query", "/v1/datasets/people/query/cost"):
        r = client.post(path, headers=world.h("alice"), json=body)
        assert r.status_code == 400
        assert "bounding_epsilon" in error_of(r)["message"]
    assert world.snapshot() == before
