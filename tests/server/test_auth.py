"""Authentication, roles, analyst isolation and API keys of the curator service's HTTP API.

Every ``/v1`` route of the application is enumerated from ``app.routes`` (not listed by hand),
so an endpoint added later is covered by the 401 tests at once and fails
``test_every_route_is_classified`` until someone decides which role may call it.
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path
from typing import Any

import pytest

from dpkit.server import Service, create_app
from dpkit.server.keys import key_hash, key_id, new_key
from server._api import COUNT_SQL, PEOPLE_METADATA, World, error_of, find_keys, make_world

# ------------------------------------------------------------------------------------------------
# the routes
# ------------------------------------------------------------------------------------------------


def _v1_routes() -> list[tuple[str, str]]:
    """(method, path template) of every /v1 route of a freshly built application."""
    with tempfile.TemporaryDirectory() as d:
        svc = Service(f"sqlite:///{Path(d) / 'routes.sqlite'}")
        try:
            app = create_app(svc)
        finally:
            svc.close()
    out = []
    for route in app.routes:
        path = getattr(route, "path", "") or ""
        if not path.startswith("/v1"):
            continue
        methods = getattr(route, "methods", None)
        # A mount or other method-less route under /v1 would escape these tests: refuse it.
        assert methods, f"{path} is a /v1 route without methods ({type(route).__name__}): extend test_auth"
        out += [(m, path) for m in methods if m not in ("HEAD", "OPTIONS")]
    return sorted(set(out))


ROUTES = _v1_routes()

#: Who may call each route: "any" authenticated principal, only the "curator", only "analyst"s.
ROLES: dict[tuple[str, str], str] = {
    ("GET", "/v1/me"): "any",
    ("GET", "/v1/datasets"): "any",
    ("GET", "/v1/datasets/{name}"): "any",
    ("GET", "/v1/budgets"): "any",
    ("GET", "/v1/history"): "any",
    ("POST", "/v1/datasets/{name}/query"): "analyst",
    ("POST", "/v1/datasets/{name}/query/cost"): "analyst",
    ("POST", "/v1/datasets/{name}/synthetic"): "analyst",
    ("GET", "/v1/releases"): "any",
    ("GET", "/v1/releases/{name}"): "any",
    ("GET", "/v1/publishers"): "curator",
    ("POST", "/v1/publishers"): "curator",
    ("POST", "/v1/publishers/{name}/revoke"): "curator",
    ("POST", "/v1/datasets"): "curator",
    ("GET", "/v1/analysts"): "curator",
    ("POST", "/v1/analysts"): "curator",
    ("POST", "/v1/analysts/{name}/keys"): "curator",
    ("POST", "/v1/keys/{key}/revoke"): "curator",
    ("POST", "/v1/principals/{name}/revoke"): "curator",
    ("GET", "/v1/refusals"): "curator",
    ("POST", "/v1/grants"): "curator",
    ("GET", "/v1/spending"): "curator",
    ("GET", "/v1/audit"): "curator",
    ("GET", "/v1/audit/verify"): "curator",
}

_ID = [f"{m} {p}" for m, p in ROUTES]
_FILL = {
    "datasets": "people", "analysts": "bob", "principals": "bob", "keys": "0123456789abcdef", "releases": "people_2026",
    "publishers": "bob",
}  # fmt: skip


def concrete(path: str, world: World | None = None) -> str:
    """The path with each parameter filled with an existing name (chosen by the segment before
    it; a key id is bob's, when the world is given)."""

    def value(m: re.Match[str]) -> str:
        segment = path[: m.start()].rstrip("/").rsplit("/", 1)[-1]
        assert segment in _FILL, (
            f"no value to fill {{{m.group(1)}}} after /{segment}/ in {path}: extend _FILL in test_auth"
        )
        if segment == "keys" and world is not None:
            return key_id(world.keys["bob"])
        return _FILL[segment]

    return re.sub(r"\{(\w+)(?::\w+)?\}", value, path)


def body_for(method: str, path: str, world: World) -> dict[str, Any] | None:
    """A valid body for the route, so that the key is the only thing wrong with the request."""
    if method != "POST":
        return None
    if path.endswith(("/query", "/query/cost")):
        return {"epsilon": 0.1, "sql": COUNT_SQL}
    if path.endswith("/synthetic"):
        return {"epsilon": 0.5, "delta": 1e-6, "columns": ["age", "sex"], "rows": 10}
    if path == "/v1/datasets":
        return {"name": "extra", "source": str(world.people), "metadata": PEOPLE_METADATA}
    if path == "/v1/analysts":
        return {"name": "mallory"}
    if path == "/v1/grants":
        return {"analyst": "bob", "dataset": "secret", "epsilon": 1.0}
    if path == "/v1/publishers":
        return {"name": "bob"}
    return None


def call(client: Any, method: str, path: str, world: World, headers: dict[str, str] | None = None) -> Any:
    body = body_for(method, path, world)
    kwargs: dict[str, Any] = {"headers": headers or {}}
    if body is not None:
        kwargs["json"] = body
    return client.request(method, concrete(path, world), **kwargs)


# ------------------------------------------------------------------------------------------------
# fixtures
# ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """One world for the refusal tests (a refused request changes nothing, which each test checks),
    with a revoked analyst key (revoked by principal name) and a revoked curator key (by key id)."""
    world = make_world(tmp_path_factory.mktemp("auth"), analysts=("alice", "bob", "eve"))
    _, world.keys["curator2"] = world.service.create_principal("curator2", "curator")
    world.service.revoke_principal("eve")
    world.service.revoke_key(key_id(world.keys["curator2"]))
    client = world.client()
    yield world, client
    world.close()


# ------------------------------------------------------------------------------------------------
# coverage of the route table
# ------------------------------------------------------------------------------------------------


def test_every_route_is_classified() -> None:
    assert ROUTES, "no /v1 routes found"
    unclassified = sorted(set(ROUTES) - set(ROLES))
    assert not unclassified, f"new /v1 endpoints: say who may call them in ROLES: {unclassified}"
    gone = sorted(set(ROLES) - set(ROUTES))
    assert not gone, f"ROLES lists endpoints the app no longer has: {gone}"


@pytest.mark.parametrize(("method", "path"), ROUTES, ids=_ID)
def test_right_key_is_accepted(method: str, path: str, world: World) -> None:
    """With a key of the right role each route answers (so the refusals below are about the key
    alone: the path, parameters and body are valid)."""
    role = ROLES.get((method, path))
    assert role is not None, f"{method} {path} is not in ROLES"
    client = world.client()
    whom = ["alice", "curator"] if role == "any" else ["alice"] if role == "analyst" else ["curator"]
    if path == "/v1/releases/{name}":  # a release to download: published by alice first
        world.service.allow_publish("alice")
        body = {"epsilon": 0.5, "delta": 1e-6, "columns": ["age", "sex"], "rows": 10, "publish": "people_2026"}
        assert client.post("/v1/datasets/people/synthetic", json=body, headers=world.h("alice")).status_code == 200
    for who in whom:
        r = call(client, method, path, world, world.h(who))
        assert r.status_code < 400, (who, r.status_code, r.text)
        assert world.last_entry().actor == who


# ------------------------------------------------------------------------------------------------
# 401: missing, malformed, unknown, revoked keys
# ------------------------------------------------------------------------------------------------


def _malformed(valid: str) -> list[dict[str, str]]:
    return [
        {"Authorization": "Bearer"},
        {"Authorization": "Bearer "},
        {"Authorization": "Bearer not-a-key"},
        {"Authorization": "Bearer dpk_short"},
        {"Authorization": f"Bearer {valid}A"},  # one character too many
        {"Authorization": f"Bearer {valid[:-1]}"},  # one too few
        {"Authorization": f"Bearer {valid} {valid}"},
        {"Authorization": f"Basic {valid}"},  # a valid key under another scheme
        {"Authorization": f"Token {valid}"},
        {"Authorization": valid},  # no scheme
        {"Authorization": "Bearer ' OR '1'='1"},
        {"Authorization": "Bearer dpk_" + "'" * 43},
        {"Authorization": f"Bearer {key_hash(valid)}"},  # the stored hash is not a credential
        {"Authorization": f"Bearer {key_id(valid)}"},  # nor is the public key id
        {"X-API-Key": ""},
        {"X-API-Key": "garbage"},
        {"X-API-Key": f"dpk_{key_hash(valid)[:43]}"},
    ]


def _check_401(world: World, r: Any, method: str, path: str, presented: str | None) -> None:
    assert r.status_code == 401, (r.status_code, r.text)
    assert r.headers.get("www-authenticate") == "Bearer"
    err = error_of(r)
    assert err["code"] == "unauthenticated"
    assert "API key" in err["message"]
    assert "rows" not in r.json()
    if presented and len(presented) >= 16:  # (short values like "Bearer" occur in the message itself)
        assert presented not in r.text, "a presented key was echoed"


@pytest.mark.parametrize(("method", "path"), ROUTES, ids=_ID)
@pytest.mark.parametrize("kind", ["missing", "malformed", "unknown", "revoked"])
def test_bad_key_is_401(method: str, path: str, kind: str, shared: Any) -> None:
    world, client = shared
    before = world.snapshot()
    n_before = len(world.entries())
    valid = world.keys["alice"]
    if kind == "missing":
        attempts: list[tuple[dict[str, str], str | None]] = [({}, None)]
    elif kind == "malformed":
        attempts = [(h, next(iter(h.values()))) for h in _malformed(valid)]
    elif kind == "unknown":
        unknown = new_key()
        attempts = [({"Authorization": f"Bearer {unknown}"}, unknown), ({"X-API-Key": unknown}, unknown)]
    else:
        attempts = [
            ({"Authorization": f"Bearer {world.keys['eve']}"}, world.keys["eve"]),  # revoked by name
            ({"X-API-Key": world.keys["curator2"]}, world.keys["curator2"]),  # revoked by key id
        ]
    counted = world_refusals(client, world)
    for headers, presented in attempts:
        r = call(client, method, path, world, headers)
        _check_401(world, r, method, path, presented)
    # Unauthenticated requests are counted, not chained: nobody without a key grows the audit log.
    assert len(world.entries()) == n_before, "a refused unauthenticated request was appended to the audit chain"
    assert world_refusals(client, world) == counted + len(attempts)
    assert world.snapshot() == before, "a refused request changed the service's state"


def world_refusals(client: Any, world: World) -> int:
    """The requests refused as unauthenticated so far (the counters of the client's app)."""
    return int(client.app.state.refusals.total("unauthenticated"))


def test_401_messages_do_not_say_why(shared: Any) -> None:
    """Unknown and revoked keys get the same answer (no oracle for which keys once existed)."""
    world, client = shared
    unknown = client.get("/v1/me", headers={"Authorization": f"Bearer {new_key()}"})
    revoked = client.get("/v1/me", headers={"Authorization": f"Bearer {world.keys['eve']}"})
    assert unknown.status_code == revoked.status_code == 401
    assert unknown.json() == revoked.json()


# ------------------------------------------------------------------------------------------------
# 403: the wrong role
# ------------------------------------------------------------------------------------------------


_ROLE_ROUTES = [(m, p) for m, p in ROUTES if ROLES.get((m, p), "?") != "any"]


@pytest.mark.parametrize(("method", "path"), _ROLE_ROUTES, ids=[f"{m} {p}" for m, p in _ROLE_ROUTES])
def test_wrong_role_is_403(method: str, path: str, shared: Any) -> None:
    world, client = shared
    role = ROLES.get((method, path))
    assert role in ("curator", "analyst"), f"{method} {path} is not in ROLES"
    callers = ["alice", "bob"] if role == "curator" else ["curator"]
    before = world.snapshot()
    for who in callers:
        r = call(client, method, path, world, world.h(who))
        assert r.status_code == 403, (who, r.status_code, r.text)
        err = error_of(r)
        assert err["code"] == "forbidden"
        assert ("curator" if role == "curator" else "analyst") in err["message"]
        assert "rows" not in r.json() and find_keys(r.text) == []
        entry = world.last_entry()
        assert (entry.status, entry.actor, entry.action) == (403, who, f"{method} {concrete(path, world)}")
        assert entry.outcome.startswith("forbidden") and entry.epsilon is None
    assert world.snapshot() == before, "a refused request changed the service's state"


def test_every_refusal_is_audited_with_its_status(world: World) -> None:
    """403s (a known principal) are chained entries; 401s (no principal) are counted instead."""
    client = world.client()
    n_before = len(world.entries())
    expected = {401: 0, 403: 0}
    for method, path in ROUTES:
        r = call(client, method, path, world, {})
        expected[401] += r.status_code == 401
        if ROLES.get((method, path)) == "curator":
            r = call(client, method, path, world, world.h("alice"))
            expected[403] += r.status_code == 403
        elif ROLES.get((method, path)) == "analyst":
            r = call(client, method, path, world, world.h("curator"))
            expected[403] += r.status_code == 403
    r = client.get("/v1/history", params={"analyst_name": "alice"}, headers=world.h("bob"))
    assert r.status_code == 403
    expected[403] += 1
    entries = world.entries()[n_before:]
    assert expected[401] == len(ROUTES)
    assert sum(e.status == 401 for e in entries) == 0
    assert client.app.state.refusals.total("unauthenticated") == expected[401]
    assert sum(e.status == 403 for e in entries) == expected[403]
    assert len(entries) == expected[403]
    world.service.verify_log()


# ------------------------------------------------------------------------------------------------
# analyst isolation
# ------------------------------------------------------------------------------------------------

MARKER = "Zanzibar"  # a value only alice's query texts hold


def _alice_activity(world: World, client: Any) -> None:
    h = world.h("alice")
    ok = client.post(
        "/v1/datasets/people/query",
        headers=h,
        json={"epsilon": 0.1, "sql": f"SELECT COUNT(*) FROM people WHERE city = '{MARKER}'"},
    )
    assert ok.status_code == 200, ok.text
    cost = client.post(
        "/v1/datasets/people/query/cost",
        headers=h,
        json={"epsilon": 0.1, "query": {"aggregates": [{"kind": "count"}], "where": f"city = '{MARKER}2'"}},
    )
    assert cost.status_code == 200, cost.text
    secret = client.post(
        "/v1/datasets/secret/query",
        headers=h,
        json={"epsilon": 0.1, "sql": f"SELECT SUM(salary) AS {MARKER}3 FROM secret"},
    )
    assert secret.status_code == 200, secret.text
    bad = client.post(
        "/v1/datasets/people/query", headers=h, json={"epsilon": 0.1, "sql": f"SELECT AVG({MARKER}4) FROM people"}
    )
    assert bad.status_code == 400


def test_budgets_are_private(world: World) -> None:
    client = world.client()
    _alice_activity(world, client)
    mine = client.get("/v1/budgets", headers=world.h("bob")).json()["budgets"]
    assert [(b["dataset"], b["analyst"]) for b in mine] == [("people", "bob")]
    assert mine[0]["spent_epsilon"] == 0
    hers = client.get("/v1/budgets", headers=world.h("alice")).json()["budgets"]
    assert sorted((b["dataset"], b["analyst"]) for b in hers) == [("people", "alice"), ("secret", "alice")]
    everyone = client.get("/v1/budgets", headers=world.h("curator")).json()["budgets"]
    assert len(everyone) == 3


def test_history_is_private(world: World) -> None:
    client = world.client()
    _alice_activity(world, client)
    r = client.post(
        "/v1/datasets/people/query",
        headers=world.h("bob"),
        json={"epsilon": 0.1, "sql": "SELECT COUNT(*) FROM people WHERE city = 'Lyon'"},
    )
    assert r.status_code == 200
    for params in ({"analyst_name": "alice"}, {"analyst_name": "curator"}, {"analyst_name": "nobody"}):
        r = client.get("/v1/history", params=params, headers=world.h("bob"))
        assert r.status_code == 403, (params, r.text)
        assert error_of(r)["code"] == "forbidden" and MARKER not in r.text
    for params in ({}, {"analyst_name": "bob"}):
        r = client.get("/v1/history", params=params, headers=world.h("bob"))
        assert r.status_code == 200
        entries = r.json()["entries"]
        assert [e["analyst"] for e in entries] == ["bob"]
        assert entries[0]["query"] == "SELECT COUNT(*) FROM people WHERE city = 'Lyon'"
        assert MARKER not in r.text
    own = client.get("/v1/history", headers=world.h("alice")).json()["entries"]
    assert {e["analyst"] for e in own} == {"alice"} and len(own) == 4
    assert all(MARKER in e["query"] for e in own)
    curator = client.get("/v1/history", params={"analyst_name": "alice"}, headers=world.h("curator")).json()["entries"]
    assert [e["seq"] for e in curator] == [e["seq"] for e in own]


def test_ungranted_dataset_looks_like_a_missing_one(world: World) -> None:
    client = world.client()
    h = world.h("bob")
    listed = client.get("/v1/datasets", headers=h).json()["datasets"]
    assert [d["name"] for d in listed] == ["people"]
    assert all("source" not in d for d in listed), "analysts never see where the rows are"
    before = world.snapshot()
    body = {"epsilon": 0.1, "sql": "SELECT SUM(salary) FROM secret"}
    for path, kwargs in (
        ("/v1/datasets/{}", {}),
        ("/v1/datasets/{}/query", {"json": body}),
        ("/v1/datasets/{}/query/cost", {"json": body}),
    ):
        method = "GET" if not kwargs else "POST"
        hidden = client.request(method, path.format("secret"), headers=h, **kwargs)
        missing = client.request(method, path.format("nosuch"), headers=h, **kwargs)
        assert hidden.status_code == missing.status_code == 404, (path, hidden.text, missing.text)
        assert error_of(hidden)["code"] == error_of(missing)["code"] == "not_found"
        assert hidden.json()["error"]["message"].replace("secret", "X") == missing.json()["error"]["message"].replace(
            "nosuch", "X"
        )
        assert "salary" not in hidden.text and "rows" not in hidden.json()
    assert world.snapshot() == before
    # alice, who was granted it, sees it
    assert client.get("/v1/datasets/secret", headers=world.h("alice")).json()["name"] == "secret"


def test_query_texts_never_reach_another_analyst(world: World) -> None:
    client = world.client()
    _alice_activity(world, client)
    h = world.h("bob")
    texts = [
        client.get(p, headers=h).text
        for p in (
            "/v1/me",
            "/v1/datasets",
            "/v1/datasets/people",
            "/v1/budgets",
            "/v1/history",
            "/v1/history?after=0&limit=1000",
        )
    ]
    texts += [
        client.get(p, headers=h).text for p in ("/v1/audit", "/v1/spending", "/v1/analysts", "/v1/audit/verify")
    ]  # 403s
    texts.append(client.post("/v1/datasets/people/query/cost", headers=h, json={"epsilon": 0.1, "sql": COUNT_SQL}).text)
    texts.append(client.post("/v1/datasets/people/query", headers=h, json={"epsilon": 0.1, "sql": COUNT_SQL}).text)
    for text in texts:
        assert MARKER not in text
        assert "alice" not in text
    # the curator does see them
    assert MARKER in client.get("/v1/audit", headers=world.h("curator")).text


# ------------------------------------------------------------------------------------------------
# keys
# ------------------------------------------------------------------------------------------------


def test_keys_are_stored_only_as_hashes(world: World) -> None:
    client = world.client()
    created = client.post("/v1/analysts", headers=world.h("curator"), json={"name": "carol"})
    assert created.status_code == 201
    carol = created.json()["key"]
    extra = client.post("/v1/analysts/carol/keys", headers=world.h("curator")).json()["key"]
    unknown = new_key()
    for key in (carol, extra, world.keys["alice"], world.keys["curator"]):
        assert client.get("/v1/me", headers={"Authorization": f"Bearer {key}"}).status_code == 200
    assert client.get("/v1/me", headers={"Authorization": f"Bearer {unknown}"}).status_code == 401
    assert (
        client.post(
            "/v1/datasets/people/query",
            headers={"Authorization": f"Bearer {carol}"},
            json={"epsilon": 0.1, "sql": COUNT_SQL},
        ).status_code
        == 404
    )
    keys = [*world.keys.values(), carol, extra]
    world.close()  # checkpoints the WAL into the database file
    files = sorted(
        p for p in world.dir.iterdir() if p.name.startswith(world.db.name) and p.is_file()
    )  # (not the dataset copies' directory)
    data = b"".join(p.read_bytes() for p in files)
    assert world.db.stat().st_size > 0
    for key in keys:
        assert key.encode() not in data and key[4:].encode() not in data, "a raw API key is in the database"
        assert key_hash(key).encode() in data, "the key's hash should be what is stored"
    assert unknown[4:].encode() not in data, "a presented unknown key was stored"


def test_keys_are_shown_once(world: World) -> None:
    client = world.client()
    cur = world.h("curator")
    created = client.post("/v1/analysts", headers=cur, json={"name": "carol"}).json()
    assert find_keys(created["key"]) == [created["key"]] and created["key_id"] == key_id(created["key"])
    issued = client.post("/v1/analysts/carol/keys", headers=cur).json()
    assert issued["key"] != created["key"] and issued["key_id"] == key_id(issued["key"])
    client.post("/v1/datasets/people/query", headers=world.h("alice"), json={"epsilon": 0.1, "sql": COUNT_SQL})
    gets = [p for m, p in ROUTES if m == "GET"]
    for who in ("curator", "alice"):
        for path in gets:
            r = client.get(concrete(path), headers=world.h(who))
            assert find_keys(r.text) == [], (who, path, r.text[:300])
    listing = client.get("/v1/analysts", headers=cur).json()["principals"]
    carol = next(p for p in listing if p["name"] == "carol")
    assert sorted(k["id"] for k in carol["keys"]) == sorted([created["key_id"], issued["key_id"]])
    assert all(set(k) == {"id", "created_at", "revoked_at"} for p in listing for k in p["keys"])


def test_revoke_by_key_id(world: World) -> None:
    client = world.client()
    cur = world.h("curator")
    second = client.post("/v1/analysts/bob/keys", headers=cur).json()
    first_id = key_id(world.keys["bob"])
    r = client.post(f"/v1/keys/{first_id}/revoke", headers=cur)
    assert r.status_code == 200 and r.json() == {"revoked": [first_id]}
    assert client.get("/v1/me", headers=world.h("bob")).status_code == 401
    assert client.get("/v1/me", headers={"X-API-Key": second["key"]}).json()["key_id"] == second["key_id"]
    keys = {
        k["id"]: k
        for p in client.get("/v1/analysts", headers=cur).json()["principals"]
        if p["name"] == "bob"
        for k in p["keys"]
    }
    assert keys[first_id]["revoked_at"] is not None and keys[second["key_id"]]["revoked_at"] is None
    # revoking again revokes nothing new; an unknown id is 404; a name is not a key id (400)
    assert client.post(f"/v1/keys/{first_id}/revoke", headers=cur).json() == {"revoked": []}
    missing = client.post("/v1/keys/0123456789abcdef/revoke", headers=cur)
    assert missing.status_code == 404 and error_of(missing)["code"] == "not_found"
    by_name = client.post("/v1/keys/bob/revoke", headers=cur)
    assert by_name.status_code == 400 and error_of(by_name)["parameter"] == "key_id"
    assert client.get("/v1/me", headers={"X-API-Key": second["key"]}).status_code == 200


def test_revoke_by_name_then_issue_a_new_key(world: World) -> None:
    client = world.client()
    cur = world.h("curator")
    second = client.post("/v1/analysts/bob/keys", headers=cur).json()["key"]
    r = client.post("/v1/principals/bob/revoke", headers=cur)
    assert r.status_code == 200 and sorted(r.json()["revoked"]) == sorted([key_id(world.keys["bob"]), key_id(second)])
    for key in (world.keys["bob"], second):
        r = client.post(
            "/v1/datasets/people/query",
            headers={"Authorization": f"Bearer {key}"},
            json={"epsilon": 0.1, "sql": COUNT_SQL},
        )
        assert r.status_code == 401
    assert world.spent("bob") == (0.0, 0.0)
    assert client.get("/v1/me", headers=world.h("alice")).status_code == 200, "other analysts keep their keys"
    fresh = client.post("/v1/analysts/bob/keys", headers=cur)
    assert fresh.status_code == 201
    key = fresh.json()["key"]
    assert key not in (world.keys["bob"], second)
    h = {"Authorization": f"Bearer {key}"}
    assert client.get("/v1/me", headers=h).json() == {"name": "bob", "role": "analyst", "key_id": key_id(key)}
    r = client.post("/v1/datasets/people/query", headers=h, json={"epsilon": 0.1, "sql": COUNT_SQL})
    assert r.status_code == 200 and "rows" in r.json()
    assert world.spent("bob")[0] == pytest.approx(0.1)
    for old in (world.keys["bob"], second):
        assert client.get("/v1/me", headers={"Authorization": f"Bearer {old}"}).status_code == 401


def test_revoked_curator_loses_every_power(world: World) -> None:
    client = world.client()
    _, spare = world.service.create_principal("curator2", "curator")
    assert client.get("/v1/audit", headers={"Authorization": f"Bearer {spare}"}).status_code == 200
    r = client.post("/v1/principals/curator2/revoke", headers=world.h("curator"))
    assert r.json() == {"revoked": [key_id(spare)]}
    before = world.snapshot()
    for method, path in ROUTES:
        r = call(client, method, path, world, {"Authorization": f"Bearer {spare}"})
        assert r.status_code == 401, (method, path, r.text)
    assert world.snapshot() == before
