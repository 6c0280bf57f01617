"""Only analysts the curator names as publishers may publish (issue 27, item 3): anyone else is
refused 403 before anything is paid. The curator names and un-names them on the command line
(``dpkit admin allow-publish NAME [--revoke]``) or over HTTP (``/v1/publishers``), and each
change is chained in the audit log with the change itself.

Deterministic (no assertion reads a noisy value): false-failure rate 0. Before this change any
granted analyst published (200), so the first test fails there.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from dpkit.server import Service
from dpkit.server.cli import admin_app
from server._api import World, error_of
from server._release_world import BODY, LEDGERS, execute, open_world, spends


@pytest.fixture(params=LEDGERS)
def world(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[World]:
    yield from open_world(request, tmp_path)


def _publish(world: World, client: Any, who: str, name: str) -> Any:
    return client.post("/v1/datasets/people/synthetic", json={**BODY, "publish": name}, headers=world.h(who))


def test_an_analyst_not_named_publisher_is_refused_before_paying(world: World) -> None:
    client = world.client()
    r = _publish(world, client, "alice", "t")
    assert r.status_code == 403 and error_of(r)["code"] == "forbidden", r.text
    assert "publish" in error_of(r)["message"] and "nothing was spent" in error_of(r)["message"]
    assert spends(world, "alice") == [] and execute(world, "SELECT * FROM release_names") == []
    assert client.post("/v1/datasets/people/synthetic", json=BODY, headers=world.h("alice")).status_code == 200
    assert world.service.releases() == []


def test_the_curator_names_and_unnames_publishers_over_http_chained(world: World) -> None:
    client = world.client()
    before = len(world.entries())
    r = client.post("/v1/publishers", json={"name": "alice"}, headers=world.h("curator"))
    assert r.status_code == 201 and r.json() == {"name": "alice", "publisher": True, "changed": True}
    (entry,) = world.entries()[before:]  # the change's own entry: the request adds no second one
    assert (entry.actor, entry.action, entry.outcome, entry.detail) == (
        "curator",
        "allow_publish",
        "allowed",
        {"publisher": "alice"},
    )
    listed = client.get("/v1/publishers", headers=world.h("curator")).json()["publishers"]
    assert [(p["name"], p["allowed_by"]) for p in listed] == [("alice", "curator")]
    assert _publish(world, client, "alice", "t").status_code == 200
    r = client.post("/v1/publishers/alice/revoke", headers=world.h("curator"))
    assert r.status_code == 200 and r.json()["changed"] is True
    assert world.last_entry().action == "revoke_publish" and world.last_entry().actor == "curator"
    assert _publish(world, client, "alice", "t2").status_code == 403
    assert [x.name for x in world.service.releases()] == ["t"]  # what was published stays
    # Analysts may not name themselves; curators and unknown names are not publishers.
    assert client.post("/v1/publishers", json={"name": "bob"}, headers=world.h("bob")).status_code == 403
    assert client.post("/v1/publishers", json={"name": "curator"}, headers=world.h("curator")).status_code == 400
    assert client.post("/v1/publishers", json={"name": "nobody"}, headers=world.h("curator")).status_code == 404
    assert client.get("/v1/publishers", headers=world.h("curator")).json()["publishers"] == []
    world.service.verify_log()


def test_the_command_line_names_publishers_chained(tmp_path: Path) -> None:
    ledger = f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    with Service(ledger) as svc:
        svc.create_principal("alice", "analyst")
        svc.create_principal("boss", "curator")
    out = CliRunner().invoke(admin_app, ["allow-publish", "alice", "--ledger", ledger])
    assert out.exit_code == 0 and "'alice' is now a publisher" in out.output, out.output
    again = CliRunner().invoke(admin_app, ["allow-publish", "alice", "--ledger", ledger])
    assert again.exit_code == 0 and "(unchanged)" in again.output
    gone = CliRunner().invoke(admin_app, ["allow-publish", "alice", "--revoke", "--ledger", ledger])
    assert gone.exit_code == 0 and "no longer" in gone.output
    assert CliRunner().invoke(admin_app, ["allow-publish", "boss", "--ledger", ledger]).exit_code == 1
    with Service(ledger) as svc:
        entries = [(e.actor, e.action, e.outcome) for e in svc.audit_entries()]
        assert entries[:3] == [
            ("admin-cli", "allow_publish", "allowed"),
            ("admin-cli", "allow_publish", "already a publisher"),
            ("admin-cli", "revoke_publish", "revoked"),
        ]
        assert entries[3][:2] == ("admin-cli", "allow_publish") and entries[3][2].startswith("error")
        assert svc.publishers() == []
        svc.verify_log()
