"""The HTTP edge of the curator service: every analyst input is checked and normalised before it
reaches the service, the ledger or the audit log; refusals are 4xx with the documented codes,
never a 500; nobody's input can fail another request; no error names where the server keeps
its state. All checks here are deterministic (false-failure rate 0) unless a docstring says
otherwise."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dpkit.errors import LimitExceededError
from dpkit.server import Service
from dpkit.server.edge import check_json_body, json_depth, printable
from server._api import COUNT_SQL, UNPACED, World, error_of, make_world

GRANTS = (("alice", "people", 10.0, 1e-5), ("bob", "people", 10.0, 1e-5), ("alice", "secret", 5.0, 0.0))


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    w = make_world(tmp_path, grants=GRANTS)
    yield w
    w.close()


def _raw(client: Any, world: World, body: bytes, who: str = "alice", endpoint: str = "query") -> Any:
    return client.post(
        f"/v1/datasets/people/{endpoint}", content=body, headers={**world.h(who), "Content-Type": "application/json"}
    )


def _refused_and_logged(
    world: World, r: Any, n_before: int, *, who: str = "alice", code: str = "invalid_request"
) -> dict[str, Any]:
    assert r.status_code == 400, (r.status_code, r.text)
    err = error_of(r)
    assert err["code"] == code, err
    entries = world.entries()
    assert len(entries) == n_before + 1, "the refusal is one audit entry"
    assert (entries[-1].actor, entries[-1].status) == (who, 400)
    assert entries[-1].outcome.startswith(code)
    world.service.verify_log()
    return err


# ------------------------------------------------------------------------------------------------
# bodies: UTF-8, no lone surrogate, no NUL, bounded depth
# ------------------------------------------------------------------------------------------------

POISON_BODIES = {
    "surrogate-in-sql": b'{"epsilon": 0.1, "sql": "SELECT COUNT(*) FROM people WHERE city = \'\\ud800\'"}',
    "surrogate-in-key": b'{"epsilon": 0.1, "sql": "SELECT COUNT(*) FROM people", "\\udfff": 1}',
    "surrogate-in-spec": b'{"epsilon": 0.1, "query": {"aggregates": [{"kind": "count", "name": "\\udbff"}]}}',
    "nul-in-sql": b'{"epsilon": 0.1, "sql": "SELECT COUNT(*) FROM people\\u0000"}',
    "utf8-encoded-surrogate": b'{"epsilon": 0.1, "sql": "SELECT COUNT(*) FROM people WHERE city = \'\xed\xa0\x80\'"}',
    "latin1-bytes": b'{"epsilon": 0.1, "sql": "SELECT COUNT(*) FROM people WHERE city = \'\xe9\'"}',
    "deep-arrays": b"[" * 65_000,
    "deep-objects": b'{"a":' * 10_000 + b"1" + b"}" * 10_000,
    "deep-in-keys": b'{"epsilon": 0.1, "query": {"aggregates": [{"kind": "count"}], "keys": '
    + b"[" * 5000
    + b"]" * 5000
    + b"}}",
}


@pytest.mark.parametrize("endpoint", ["query", "query/cost"])
@pytest.mark.parametrize("case", sorted(POISON_BODIES))
def test_a_bad_body_is_400_logged_and_spends_nothing(case: str, endpoint: str, world: World) -> None:
    client = world.client(max_body_bytes=128 * 1024)
    before, n = world.snapshot(), len(world.entries())
    err = _refused_and_logged(world, _raw(client, world, POISON_BODIES[case], endpoint=endpoint), n)
    assert err["parameter"] == "body"
    assert world.snapshot() == before
    # the entry can be read back and encoded (it holds no lone surrogate or NUL)
    json.dumps(world.entries()[-1].to_dict(), ensure_ascii=False).encode("utf-8")


def test_a_valid_surrogate_pair_is_accepted(world: World) -> None:
    """A character outside the BMP written as an escaped pair is valid Unicode, not a lone surrogate."""
    client = world.client()
    body = b'{"epsilon": 0.1, "sql": "SELECT COUNT(*) FROM people WHERE city = \'\\ud83d\\ude00\'"}'
    r = _raw(client, world, body, endpoint="query/cost")
    assert r.status_code == 200, r.text


def test_edge_helpers() -> None:
    assert json_depth('{"a": "[[[[", "b": [[1]]}') == 3
    assert json_depth('"\\"[["') == 0
    assert json_depth("[" * 100_000) == 100_000
    check_json_body(b"")
    check_json_body(b'{"a": ["\\ud83d\\ude00"]}')
    assert printable("a\x00b\ud800c\nd") == "a\\x00b\\ud800c\nd"
    assert printable("x" * 10, 4) == "xxxx…"


def test_the_poisoned_bodies_cannot_fail_a_concurrent_victim(world: World) -> None:
    """An attacker's lone surrogates (50 requests) interleaved with a victim's 40 paid queries:
    every victim query is answered 200 with exactly one spend, every attacker request is 400,
    and every request of both is in a chain that verifies."""
    client = world.client()
    n0, spends0 = len(world.entries()), len(world.spend_ids())
    statuses: dict[str, list[int]] = {"victim": [], "attacker": []}
    lock = threading.Lock()

    def victim() -> None:
        for _ in range(40):
            r = client.post(
                "/v1/datasets/people/query", headers=world.h("alice"), json={"epsilon": 0.01, "sql": COUNT_SQL}
            )
            with lock:
                statuses["victim"].append(r.status_code)

    def attacker() -> None:
        for _ in range(50):
            r = _raw(client, world, POISON_BODIES["surrogate-in-sql"], who="bob")
            with lock:
                statuses["attacker"].append(r.status_code)

    threads = [threading.Thread(target=victim), threading.Thread(target=attacker)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert statuses["victim"] == [200] * 40
    assert statuses["attacker"] == [400] * 50
    assert len(world.spend_ids()) == spends0 + 40
    entries = world.entries()[n0:]
    assert sum(e.actor == "bob" and e.status == 400 for e in entries) == 50, "every attacker request is logged"
    assert world.service.unlogged_spends() == []
    world.service.verify_log()


# ------------------------------------------------------------------------------------------------
# query and path parameters
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/v1/history", "/v1/audit"])
@pytest.mark.parametrize(
    "query",
    [
        "after=99999999999999999999999",
        "after=-1",
        "after=9223372036854775808",
        "limit=0",
        "limit=1001",
        "limit=99999999999999999999999",
        "after=1e3",
    ],
)
def test_integers_out_of_range_are_400(path: str, query: str, world: World) -> None:
    client = world.client()
    n = len(world.entries())
    r = client.get(f"{path}?{query}", headers=world.h("curator"))
    err = _refused_and_logged(world, r, n, who="curator")
    assert err["parameter"] == query.split("=")[0]


@pytest.mark.parametrize("path", ["/v1/history", "/v1/audit"])
def test_integers_in_range_are_accepted(path: str, world: World) -> None:
    client = world.client()
    for query in ("after=9223372036854775807", "after=0&limit=1", "limit=1000"):
        r = client.get(f"{path}?{query}", headers=world.h("curator"))
        assert r.status_code == 200, (query, r.text)


@pytest.mark.parametrize(
    ("method", "path", "parameter"),
    [
        ("GET", "/v1/datasets/%00", "dataset"),
        ("GET", "/v1/datasets/people%00x", "dataset"),
        ("POST", "/v1/datasets/%ED%A0%80/query", "dataset"),
        ("POST", "/v1/datasets/..%2E/query/cost", "dataset"),
        ("POST", "/v1/analysts/%00/keys", "name"),
        ("POST", "/v1/principals/a%00b/revoke", "name"),
        ("POST", "/v1/keys/%00%00/revoke", "key_id"),
        ("GET", "/v1/history?analyst_name=%00", "name"),
    ],
)
def test_path_parameters_are_checked_before_use(method: str, path: str, parameter: str, world: World) -> None:
    who = (
        "curator"
        if "/analysts/" in path or "/principals/" in path or "/keys/" in path or path.startswith("/v1/history")
        else "alice"
    )
    client = world.client()
    n = len(world.entries())
    body = {"epsilon": 0.1, "sql": COUNT_SQL} if method == "POST" and "/query" in path else None
    r = client.request(method, path, headers=world.h(who), json=body)
    err = _refused_and_logged(world, r, n, who=who)
    assert err["parameter"] == parameter
    assert "\x00" not in json.dumps(world.entries()[-1].to_dict())


def test_an_unknown_route_with_a_nul_is_logged_printably(world: World) -> None:
    client = world.client()
    n = len(world.entries())
    r = client.get("/v1/no%00such", headers=world.h("alice"))
    assert r.status_code == 404
    entry = world.entries()[n]
    assert entry.action == "GET /v1/no\\x00such"
    world.service.verify_log()


# ------------------------------------------------------------------------------------------------
# no 500s: dashboard assets, limits, recursion
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "asset",
    [
        "dashboard.js%00.css",
        "dashboard.js%00",
        "..%2Findex.html",
        "%2E%2E",
        "index.html",
        "nope.js",
        "dashboard.css%20",
    ],
)
def test_only_shipped_assets_are_served(asset: str, world: World) -> None:
    client = world.client()
    r = client.get(f"/dashboard/{asset}")
    assert r.status_code == 404, (asset, r.status_code)
    assert error_of(r)["code"] == "not_found"


def test_the_shipped_assets_are_served(world: World) -> None:
    client = world.client()
    for name, kind in (("dashboard.js", "text/javascript"), ("dashboard.css", "text/css")):
        r = client.get(f"/dashboard/{name}")
        assert r.status_code == 200 and r.headers["content-type"].startswith(kind)


@pytest.mark.parametrize(
    "raised",
    [LimitExceededError("keys", 10**9, 100_000, "max_keys"), RecursionError("maximum recursion depth exceeded")],
    ids=["limit", "recursion"],
)
def test_a_refusal_in_validation_is_400_limit_exceeded_and_unpaid(
    world: World, monkeypatch: pytest.MonkeyPatch, raised: Exception
) -> None:
    """A limit exceeded is 400 ``limit_exceeded`` naming the limit and its setting; the power
    check of the fallback: whatever part of validation recurses too deeply, the answer is the
    same kind of 400 and nothing is spent (not a 500 or query_failed)."""

    def refuse(self: Service, *args: Any, **kwargs: Any) -> Any:
        raise raised

    monkeypatch.setattr(Service, "cost", refuse)
    monkeypatch.setattr(Service, "cost_and_time", refuse)  # (what the paced cost route calls)
    monkeypatch.setattr(Service, "query_encoded", refuse)
    client = world.client()
    for endpoint in ("query", "query/cost"):
        before, n = world.snapshot(), len(world.entries())
        r = client.post(
            f"/v1/datasets/people/{endpoint}", headers=world.h("alice"), json={"epsilon": 0.1, "sql": COUNT_SQL}
        )
        err = _refused_and_logged(world, r, n, code="limit_exceeded")
        if isinstance(raised, LimitExceededError):
            assert err["parameter"] == "keys" and err["limit"] == 100_000 and err["setting"] == "max_keys"
            assert "100,000" in err["message"] and "max_keys" in err["message"]
        assert world.snapshot() == before


@pytest.mark.parametrize(
    "where",
    ["(" * 5000 + "age > 1" + ")" * 5000, "NOT " * 5000 + "age > 1", " AND ".join(["age > 1"] * 2000)],
    ids=["parentheses", "nots", "ands"],
)
def test_deeply_nested_sql_is_a_4xx(where: str, world: World) -> None:
    client = world.client(max_body_bytes=256 * 1024)
    before = world.snapshot()
    for endpoint in ("query", "query/cost"):
        r = client.post(
            f"/v1/datasets/people/{endpoint}",
            headers=world.h("alice"),
            json={"epsilon": 0.1, "sql": f"SELECT COUNT(*) FROM people WHERE {where}"},
        )
        assert r.status_code == 400, (r.status_code, r.text[:300])
        assert error_of(r)["code"] in ("limit_exceeded", "invalid_request")
    assert world.snapshot() == before


# ------------------------------------------------------------------------------------------------
# what an analyst sees of the server: no path, no URL
# ------------------------------------------------------------------------------------------------


def _server_strings(service: Service, directory: Path) -> list[str]:
    out = [service.url, str(directory)]
    m = re.match(r"postgres(?:ql)?://[^/]*", service.url)
    if m:
        out.append(m.group())
    return out


def _exhaust(client: Any, world: World, service: Service, directory: Path) -> None:
    h = world.h("bob")
    texts = []
    for _ in range(3):
        r = client.post("/v1/datasets/people/query", headers=h, json={"epsilon": 4.0, "sql": COUNT_SQL})
        texts.append(r.text)
    refused = client.post("/v1/datasets/people/query", headers=h, json={"epsilon": 4.0, "sql": COUNT_SQL})
    assert refused.status_code == 409 and error_of(refused)["code"] == "budget_exceeded"
    texts.append(refused.text)
    for path in ("/v1/budgets", "/v1/history", "/v1/datasets", "/v1/datasets/people", "/v1/datasets/nosuch"):
        texts.append(client.get(path, headers=h).text)
    for text in texts:
        for secret in _server_strings(service, directory):
            assert secret not in text, (secret, text[:300])
        assert "sqlite" not in text.lower() and "postgres" not in text.lower(), text[:300]
        assert "ledger.sqlite" not in text and "/tmp" not in text


def test_an_exhausted_budget_names_no_path_sqlite(world: World) -> None:
    _exhaust(world.client(), world, world.service, world.dir)


def test_an_exhausted_budget_names_no_url_postgres(tmp_path: Path, pg_url: str) -> None:
    from server._api import PEOPLE_METADATA, write_people

    service = Service(pg_url, audit_key=tmp_path / "audit.key", dataset_dir=tmp_path / "datasets")
    try:
        people = write_people(tmp_path / "people.csv")
        service.register_dataset("people", people, PEOPLE_METADATA)
        keys = {
            "curator": service.create_principal("curator", "curator")[1],
            "bob": service.create_principal("bob", "analyst")[1],
        }
        service.grant("bob", "people", epsilon=10.0)
        w = World(tmp_path, tmp_path / "unused", service, keys, people, people)
        from fastapi.testclient import TestClient

        from dpkit.server import create_app

        with TestClient(create_app(service, rate=1e6, burst=10**6, **UNPACED), raise_server_exceptions=False) as client:
            _exhaust(client, w, service, tmp_path)
    finally:
        service.close()
