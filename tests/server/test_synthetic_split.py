"""A synthetic table through the service with an ε whose noise the samplers cannot draw (σ below
the discrete Gaussian's floor 2**-20): a 400 naming ``epsilon`` before paying, even for an analyst
whose grant covers it — no spend, no ``paid`` audit entry. Before the check the service paid and
then answered the fixed 500 ``query_failed``. Deterministic: nothing depends on the noise."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from server._api import World, error_of, make_world

BODY = {"delta": 1e-6, "columns": ["age", "sex"], "bins": {"age": 5}, "rows": 20}


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    w = make_world(
        tmp_path,
        grants=(("alice", "people", 1e20, 1e-5), ("bob", "people", 10.0, 1e-5), ("alice", "secret", 5.0, 0.0)),
        max_grant_epsilon=1e20,
    )
    try:
        yield w
    finally:
        w.close()


@pytest.mark.parametrize("method", ["aim", "mst"])
def test_an_epsilon_past_the_samplers_floor_is_refused_before_paying(world: World, method: str) -> None:
    before = len(world.entries())
    r = world.client().post(
        "/v1/datasets/people/synthetic", json={**BODY, "epsilon": 1e14, "method": method}, headers=world.h("alice")
    )
    assert r.status_code == 400, r.text
    error = error_of(r)
    assert error["parameter"] == "epsilon" and "2**-20" in error["message"]
    assert world.spent("alice") == (0.0, 0.0)
    assert not [e for e in world.entries()[before:] if e.outcome == "paid"]


def test_the_epsilon_it_quotes_is_answered(world: World) -> None:
    """The largest ε the refusal quotes is paid and answered (a table whose counts are exact)."""
    client = world.client()
    refused = client.post("/v1/datasets/people/synthetic", json={**BODY, "epsilon": 1e14}, headers=world.h("alice"))
    quoted = float(error_of(refused)["message"].split("at most ")[1].split(" ")[0])
    r = client.post("/v1/datasets/people/synthetic", json={**BODY, "epsilon": quoted}, headers=world.h("alice"))
    assert r.status_code == 200, r.text
    assert len(r.json()["rows"]) == 20 and world.spent("alice")[0] == pytest.approx(quoted)
