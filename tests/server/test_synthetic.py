"""Synthetic tables through the service: paid from the analyst's budget like a query, with its
audit entry in the same transaction; refused before paying on bad settings, limits and budgets.

Deterministic: the noise is the service's secure source, and nothing here depends on its value
beyond the shape of the answer and the exact amounts spent."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from server._api import World, error_of

BODY = {"epsilon": 1.0, "delta": 1e-6, "columns": ["age", "sex"], "bins": {"age": 5}, "rows": 200}


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
    # ε too small for the table's measured size: warned in the report object and its text
    assert all(f"warning: {w}" in body["report"]["text"] for w in body["report"]["warnings"])
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
        # Before, these three were paid: the first failed after paying (an infinite bin width
        # draws infinities, which JSON cannot carry), the others answered nonsense.
        ({"bins": {"age": [-1e308, 1e308]}}, "bins.age"),
        ({"bins": {"age": [-1e300, 0, 1e300]}, "integers": ["age"]}, "bins.age"),  # beyond exact int64
        ({"columns": ["sex", "sex"], "bins": None}, "columns"),
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
    assert (
        client.post(
            "/v1/datasets/secret/synthetic", json={**BODY, "columns": None, "bins": None}, headers=world.h("bob")
        ).status_code
        == 404
    )


# -- published releases -------------------------------------------------------------------------------


def test_a_published_table_is_downloaded_by_anyone_without_spending(world: World) -> None:
    client = world.client()
    world.service.allow_publish("alice")
    r = client.post("/v1/datasets/people/synthetic", json={**BODY, "publish": "people_2026"}, headers=world.h("alice"))
    assert r.status_code == 200, r.text
    paid = r.json()
    assert paid["release"] == "people_2026" and world.spent("alice") == (1.0, 1e-6)
    # Those granted its dataset may list and download it: bob (another analyst; without who
    # published it or what it cost) and the curator (who sees both).
    listing = client.get("/v1/releases", headers=world.h("curator")).json()["releases"]
    assert [(x["name"], x["dataset"], x["published_by"], x["rows"], x["epsilon"]) for x in listing] == [
        ("people_2026", "people", "alice", 200, 1.0)
    ]
    assert "spend_id" not in listing[0] and listing[0]["columns"] == ["age", "sex"]
    (seen,) = client.get("/v1/releases", headers=world.h("bob")).json()["releases"]
    assert seen == {k: v for k, v in listing[0].items() if k not in ("published_by", "epsilon", "delta")}
    assert world.service.release("people_2026")[0].spend_id == paid["spend_id"]
    got = client.get("/v1/releases/people_2026", headers=world.h("curator"))
    assert got.status_code == 200
    body = got.json()
    assert body["rows"] == paid["rows"] and body["report"] == paid["report"] and body["row_count"] == 200
    csv_text = client.get("/v1/releases/people_2026?format=csv", headers=world.h("bob")).text
    lines = csv_text.splitlines()  # (RFC 4180 line ends: CR LF)
    assert lines[0] == "age,sex" and len(lines) == 201
    assert world.spent("bob") == (0.0, 0.0) and world.spent("alice") == (1.0, 1e-6)
    actions = [e.action for e in world.entries()]
    assert actions.count("get_release") == 2 and "list_releases" in actions
    assert world.service.verify_log().entries == len(world.entries())


@pytest.mark.parametrize("name", ["people_2026", "2026", "a-b", "x" * 64])
def test_a_taken_or_bad_release_name_is_refused_before_paying(world: World, name: str) -> None:
    client = world.client()
    world.service.allow_publish("alice")
    world.service.allow_publish("bob")
    first = client.post(
        "/v1/datasets/people/synthetic", json={**BODY, "publish": "people_2026"}, headers=world.h("alice")
    )
    assert first.status_code == 200
    r = client.post("/v1/datasets/people/synthetic", json={**BODY, "publish": name}, headers=world.h("bob"))
    assert r.status_code == 400 and error_of(r)["parameter"] == "publish", r.text
    assert world.spent("bob") == (0.0, 0.0)
    assert [x["name"] for x in client.get("/v1/releases", headers=world.h("bob")).json()["releases"]] == ["people_2026"]


def test_an_unknown_release_and_a_bad_format(world: World) -> None:
    client = world.client()
    assert client.get("/v1/releases/nothing", headers=world.h("bob")).status_code == 404
    assert client.get("/v1/releases/bad-name", headers=world.h("bob")).status_code == 400
    world.service.allow_publish("alice")
    client.post("/v1/datasets/people/synthetic", json={**BODY, "publish": "t"}, headers=world.h("alice"))
    r = client.get("/v1/releases/t?format=xml", headers=world.h("bob"))
    assert r.status_code == 400 and error_of(r)["parameter"] == "format"
    assert client.get("/v1/releases").status_code == 401


# -- the answer's size: bounded before paying, never over max_response_bytes ----------------------------

LIMIT = 1_048_576


def _widest_world(directory: Path) -> tuple[Any, Any]:
    """A service limited to ``max_response_bytes=1048576`` over a dataset whose every cell takes
    the most bytes its metadata allows: negative doubles of 17 digits with three-digit exponents
    (24 bytes, the longest a double takes), and categories of escaped non-ASCII text, all of the
    longest declared length; long column names of escaped characters too."""
    import numpy as np
    import pandas as pd

    from dpkit.analytics.limits import QueryLimits
    from dpkit.server import Service

    rng = np.random.default_rng(3)
    n = 20_000
    wide = ["\u00e9\U0001f600" * 8 + f"{i:02d}" for i in range(12)]  # 18 characters, 16 escaped
    x, c = "x\u00e9" * 20, "c\u00e9" * 20
    pd.DataFrame({x: rng.uniform(-2e-250, -1e-250, n), c: rng.choice(wide, n)}).to_csv(
        directory / "wide.csv", index=False
    )
    meta = {
        "row_level": True,
        "columns": {
            x: {"type": "numeric", "lower": -2e-250, "upper": -1e-250},
            c: {"type": "categorical", "categories": wide},
        },
    }
    service = Service(f"sqlite:///{directory / 'wide.sqlite'}", limits=QueryLimits(max_response_bytes=LIMIT))
    service.register_dataset("wide", directory / "wide.csv", meta)
    _, key = service.create_principal("alice", "analyst")
    service.grant("alice", "wide", epsilon=10.0, delta=1e-5)
    return service, service.authenticate(key)


def test_a_synthetic_answer_never_exceeds_max_response_bytes(tmp_path: Path) -> None:
    """Before, the bound counted 1e308 (6 bytes) for a double and nothing for the row's own
    brackets: the measured number of rows came back as 2.3 MB under a 1 MiB limit, and a
    request of that many rows was not refused. Now: the measured table is cut to the rows that
    fit and its encoding is within the limit; the most rows that fit, asked for, fit too; one
    row more is refused before paying, naming ``max_response_bytes``."""
    import json

    from dpkit.errors import LimitExceededError
    from dpkit.server.synth_size import SynthSize
    from dpkit.server.synthetic import SynthRequest
    from dpkit.synth import Synthesizer

    service, alice = _widest_world(tmp_path)
    try:
        request = SynthRequest(epsilon=1.0, delta=1e-6, bins={"x\u00e9" * 20: 8}, method="aim", rounds=20)
        answer, encoded = service.synthesize(alice, "wide", request)
        assert answer["truncated"] and len(encoded.encode()) <= LIMIT, len(encoded)
        assert len(json.dumps(answer, ensure_ascii=False).encode()) <= LIMIT  # as UTF-8 too
        fill = len(encoded) / LIMIT
        assert fill > 0.5, fill  # the bound is not so loose that the limit means half of itself
        meta = service.dataset("wide").metadata
        size = SynthSize.of(
            Synthesizer(epsilon=1.0, delta=1e-6, metadata=meta, bins=request.bins, rounds=20).domain, rounds=20
        )
        most = size.most_rows(service._queries.limits)
        assert len(answer["rows"]) == most
        exact, encoded = service.synthesize(alice, "wide", SynthRequest(**{**request.__dict__, "rows": most}))
        assert len(exact["rows"]) == most and len(encoded.encode()) <= LIMIT
        spent = service.ledger.get_budget("wide", "alice").spent_epsilon
        with pytest.raises(LimitExceededError) as err:
            service.synthesize(alice, "wide", SynthRequest(**{**request.__dict__, "rows": most + 1}))
        assert err.value.setting == "max_response_bytes" and err.value.limit == LIMIT
        assert "max_response_bytes=1048576" in str(err.value)
        assert service.ledger.get_budget("wide", "alice").spent_epsilon == spent
    finally:
        service.close()


def test_an_oversized_synthetic_request_is_refused_over_http_naming_the_setting(tmp_path: Path) -> None:
    from fastapi.testclient import TestClient

    from dpkit.server import create_app

    service, alice = _widest_world(tmp_path)
    try:
        key = service.issue_key("alice")
        body = {"epsilon": 1.0, "delta": 1e-6, "bins": {"x\u00e9" * 20: 8}, "rows": 30_000}
        app = create_app(service, _hold_answers=False, synth_seconds=600.0)  # (fixed times: test_pacing.py)
        with TestClient(app, raise_server_exceptions=False) as client:
            r = client.post("/v1/datasets/wide/synthetic", json=body, headers={"Authorization": f"Bearer {key}"})
            err = error_of(r)
            assert (r.status_code, err["code"], err["setting"], err["limit"]) == (
                400,
                "limit_exceeded",
                "max_response_bytes",
                LIMIT,
            )
            ok = client.post(
                "/v1/datasets/wide/synthetic", json={**body, "rows": None}, headers={"Authorization": f"Bearer {key}"}
            )
            assert ok.status_code == 200 and len(ok.content) <= LIMIT, ok.text[:200]
        assert service.ledger.get_budget("wide", "alice").spent_epsilon == 1.0
    finally:
        service.close()
