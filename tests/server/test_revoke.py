"""Revoking keys: a key by its id, or every key of a principal by name, through separate
endpoints and commands, so that a name can never be taken for a key id (or the reverse).
Deterministic (false-failure rate 0)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dpkit.server.cli import admin_app
from dpkit.server.keys import key_id
from server._api import World, error_of, make_world


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    w = make_world(tmp_path, analysts=("alice",), grants=(("alice", "people", 1.0, 0.0),))
    yield w
    w.close()


def _impostor(world: World) -> str:
    """An analyst whose name is the curator's key id (names of 16 hex digits are valid)."""
    name = key_id(world.keys["curator"])
    _, world.keys[name] = world.service.create_principal(name, "analyst")
    return name


def test_revoking_an_analyst_named_like_the_curators_key_keeps_the_curator_in(world: World) -> None:
    client = world.client()
    name = _impostor(world)
    r = client.post(f"/v1/principals/{name}/revoke", headers=world.h("curator"))
    assert r.status_code == 200 and r.json() == {"revoked": [key_id(world.keys[name])]}
    assert client.get("/v1/me", headers=world.h("curator")).status_code == 200, "the curator was locked out"
    assert client.get("/v1/me", headers=world.h(name)).status_code == 401
    assert client.get("/v1/me", headers=world.h("alice")).status_code == 200


def test_revoking_the_curators_key_id_leaves_the_namesake_analyst(world: World) -> None:
    client = world.client()
    name = _impostor(world)
    _, spare = world.service.create_principal("curator2", "curator")
    r = client.post(f"/v1/keys/{name}/revoke", headers={"Authorization": f"Bearer {spare}"})
    assert r.status_code == 200 and r.json() == {"revoked": [name]}
    assert client.get("/v1/me", headers=world.h("curator")).status_code == 401
    assert client.get("/v1/me", headers=world.h(name)).status_code == 200, "the analyst of that name lost their key"


def test_a_key_endpoint_refuses_names_and_a_principal_endpoint_refuses_nothing_else(world: World) -> None:
    client = world.client()
    cur = world.h("curator")
    for bad in ("alice", "0123456789ABCDEF", "0123456789abcde", "0123456789abcdef0"):
        r = client.post(f"/v1/keys/{bad}/revoke", headers=cur)
        assert r.status_code == 400 and error_of(r)["parameter"] == "key_id", (bad, r.text)
    missing = client.post("/v1/principals/nobody/revoke", headers=cur)
    assert missing.status_code == 404 and error_of(missing)["code"] == "not_found"
    assert client.get("/v1/me", headers=world.h("alice")).status_code == 200
    # the old ambiguous endpoint is gone for names: the analyst keeps their key
    assert client.post("/v1/keys/alice/revoke", headers=cur).status_code == 400
    assert client.get("/v1/me", headers=world.h("alice")).status_code == 200


def test_the_admin_commands_are_separate(world: World) -> None:
    name = _impostor(world)
    ledger = world.service.url
    out = CliRunner().invoke(admin_app, ["revoke-principal", name, "--ledger", ledger])
    assert out.exit_code == 0, out.output
    assert world.service.authenticate(world.keys["curator"]).name == "curator"
    out = CliRunner().invoke(admin_app, ["revoke-key", "alice", "--ledger", ledger])
    assert out.exit_code == 1 and "key_id" in out.output
    out = CliRunner().invoke(admin_app, ["revoke-key", key_id(world.keys["alice"]), "--ledger", ledger])
    assert out.exit_code == 0 and "revoked key" in out.output
    actions = [e.action for e in world.entries() if e.actor == "admin-cli"]
    assert actions[-3:] == ["revoke_principal", "revoke_key", "revoke_key"]
