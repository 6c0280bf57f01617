"""Idempotent paid requests (``Idempotency-Key``): a retried query or synthetic table is answered
with the first answer, byte for byte, and paid once.

Every test runs on SQLite and on PostgreSQL (skipped without a test server). Nothing asserted
depends on the noise, so the false-failure rate is 0. On the service before this change every
retry was a second request — a second debit and a second paying entry — so the replay, 409, 422,
crash and limit tests fail there, and the bad-header tests fail too (the header was ignored and
the request paid).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("httpx")

from dpkit.accounting.events import LaplaceEvent  # noqa: E402
from dpkit.analytics.engines.duckdb import DuckDBEngine  # noqa: E402
from dpkit.errors import InvalidParameterError, QueryFailedError  # noqa: E402
from dpkit.server import Service  # noqa: E402
from dpkit.server.idempotency import Claim, IdempotencyKeys, Unanswered, fingerprint  # noqa: E402
from dpkit.server.problems import Problem  # noqa: E402
from dpkit.server.queries import compile_request  # noqa: E402
from server._api import World, error_of  # noqa: E402
from server._release_world import LEDGERS, build, execute, open_world, spends  # noqa: E402

QUERY = {"epsilon": 0.5, "sql": "SELECT COUNT(*) FROM people"}
SYNTH = {"epsilon": 1.0, "delta": 1e-6, "columns": ["age", "sex"], "bins": {"age": 5}, "rows": 50, "method": "mst"}
PATHS = {"query": "/v1/datasets/people/query", "synthetic": "/v1/datasets/people/synthetic"}


@pytest.fixture(params=LEDGERS)
def world(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[World]:
    yield from open_world(request, tmp_path)


def _post(client: Any, world: World, who: str, key: str | None, body: dict[str, Any] = QUERY, **kw: Any) -> Any:
    path = kw.pop("path", PATHS["query"])
    headers = {**world.h(who), **({} if key is None else {"Idempotency-Key": key})}
    return client.post(path, json=body, headers=headers)


def _paying(world: World) -> list[Any]:
    """The chain's paying entries (those that record an amount)."""
    return [e for e in world.entries() if e.epsilon is not None]


def _rows(world: World) -> list[tuple[Any, ...]]:
    return [
        tuple(r)
        for r in execute(world, "SELECT principal, endpoint, idem_key, state FROM idempotency_keys ORDER BY 1, 2, 3")
    ]


# -- a retry is the first answer -------------------------------------------------------------------


@pytest.mark.parametrize("endpoint", ["query", "synthetic"])
def test_a_retry_is_the_first_answer_byte_for_byte_and_pays_once(world: World, endpoint: str) -> None:
    client = world.client()
    body, path = (QUERY if endpoint == "query" else SYNTH), PATHS[endpoint]
    first = _post(client, world, "alice", "retry-1", body, path=path)
    assert first.status_code == 200, first.text
    assert "Idempotent-Replayed" not in first.headers
    paid = spends(world, "alice")
    budget = world.spent("alice")
    assert len(paid) == 1 and len(_paying(world)) == 1
    # The same request (fields reordered, 1 as 1.0 where a float is declared), the key quoted.
    same: dict[str, Any] = dict(reversed(list(body.items())))
    if same["epsilon"] == 1.0:
        same["epsilon"] = 1
    for key in ("retry-1", '"retry-1"'):
        again = _post(world.client(), world, "alice", key, same, path=path)
        assert again.status_code == 200
        assert again.content == first.content
        assert again.headers["Idempotent-Replayed"] == "true"
        assert again.headers["content-type"] == first.headers["content-type"]
    assert spends(world, "alice") == paid and world.spent("alice") == budget
    assert len(_paying(world)) == 1
    replay = world.last_entry()
    action = "query_replayed" if endpoint == "query" else "synthesize_replayed"
    assert (replay.action, replay.status, replay.epsilon, replay.delta) == (action, 200, None, None)
    assert replay.detail["spend_id"] == paid[0] and replay.detail["idempotency_key"] == "retry-1"
    if endpoint == "query":  # the analyst's history shows the replays, without an amount
        history = client.get("/v1/history", headers=world.h("alice")).json()["entries"]
        assert [(e["action"], e["epsilon"]) for e in history] == [
            ("query", 0.5),
            ("query_replayed", None),
            ("query_replayed", None),
        ]
    report = world.service.verify_log()
    assert report.entries == len(world.entries())
    world.service.ledger.verify()


def test_without_the_header_every_request_is_its_own(world: World) -> None:
    client = world.client()
    assert _post(client, world, "alice", None).status_code == 200
    assert _post(client, world, "alice", None).status_code == 200
    assert len(spends(world, "alice")) == 2 and _rows(world) == []


def test_the_same_key_for_another_request_is_422_and_spends_nothing(world: World) -> None:
    client = world.client()
    assert _post(client, world, "alice", "k").status_code == 200
    before = world.spent("alice")
    for other, path in (
        ({**QUERY, "epsilon": 0.25}, PATHS["query"]),
        ({**QUERY, "sql": "SELECT COUNT(*) FROM people WHERE age > 30"}, PATHS["query"]),
        (QUERY, "/v1/datasets/secret/query"),  # another dataset, the same endpoint
    ):
        r = _post(client, world, "alice", "k", other, path=path)
        assert r.status_code == 422, r.text
        assert error_of(r)["code"] == "idempotency_key_reused" and error_of(r)["parameter"] == "Idempotency-Key"
    assert world.spent("alice") == before and len(spends(world, "alice")) == 1
    world.service.verify_log()


def test_keys_are_scoped_per_principal_and_per_endpoint(world: World) -> None:
    client = world.client()
    a = _post(client, world, "alice", "shared")
    b = _post(client, world, "bob", "shared", {**QUERY, "epsilon": 0.25})
    s = _post(client, world, "alice", "shared", SYNTH, path=PATHS["synthetic"])
    assert (a.status_code, b.status_code, s.status_code) == (200, 200, 200)
    assert len(spends(world, "alice")) == 2 and len(spends(world, "bob")) == 1
    assert _post(client, world, "bob", "shared", {**QUERY, "epsilon": 0.25}).content == b.content
    assert _post(client, world, "alice", "shared").content == a.content
    assert len(spends(world, "alice")) == 2 and len(spends(world, "bob")) == 1


# -- in flight, refused, failed ---------------------------------------------------------------------


@pytest.mark.parametrize("stage", ["before the debit", "after the debit"])
def test_a_request_in_flight_holds_its_key(world: World, monkeypatch: pytest.MonkeyPatch, stage: str) -> None:
    """A retry while the first request runs is 409 (nothing spent); the first then answers and
    later retries replay it."""
    entered, release = threading.Event(), threading.Event()

    def hold(run: Callable[..., Any]) -> Callable[..., Any]:
        def held(*args: Any, **kwargs: Any) -> Any:
            entered.set()
            assert release.wait(60)
            return run(*args, **kwargs)

        return held

    if stage == "before the debit":
        monkeypatch.setattr(world.service, "_compile", hold(compile_request))
    else:
        monkeypatch.setattr(DuckDBEngine, "compute", hold(DuckDBEngine.compute))
    first: list[Any] = []
    worker = threading.Thread(target=lambda: first.append(_post(world.client(), world, "alice", "slow")))
    worker.start()
    try:
        assert entered.wait(60)
        paid = spends(world, "alice")
        assert len(paid) == (0 if stage == "before the debit" else 1)
        r = _post(world.client(), world, "alice", "slow")
        assert r.status_code == 409 and error_of(r)["code"] == "idempotency_key_in_progress"
        assert r.headers["Retry-After"] == "1" and error_of(r)["parameter"] == "Idempotency-Key"
        assert spends(world, "alice") == paid
    finally:
        release.set()
        worker.join(60)
    monkeypatch.undo()
    assert first[0].status_code == 200
    again = _post(world.client(), world, "alice", "slow")
    assert again.content == first[0].content and again.headers["Idempotent-Replayed"] == "true"
    assert len(spends(world, "alice")) == 1 and len(_paying(world)) == 1


@pytest.mark.parametrize(
    "refused, status",
    [
        ({**QUERY, "epsilon": 11.0}, 409),  # more than the budget
        ({**QUERY, "sql": "SELECT nope FROM people"}, 400),
        ({**QUERY, "sql": "SELECT COUNT(*) FROM people", "noise": "nope"}, 400),
    ],
)
def test_a_refusal_before_the_debit_is_not_stored(world: World, refused: dict[str, Any], status: int) -> None:
    """The claim is released: the key then serves another request (no 422, no replay)."""
    client = world.client()
    r = _post(client, world, "alice", "again", refused)
    assert r.status_code == status and "Idempotent-Replayed" not in r.headers
    assert _rows(world) == [] and spends(world, "alice") == []
    ok = _post(client, world, "alice", "again")
    assert ok.status_code == 200 and "Idempotent-Replayed" not in ok.headers
    assert len(spends(world, "alice")) == 1


def test_an_unknown_dataset_is_not_stored(world: World) -> None:
    client = world.client()
    r = _post(client, world, "carol", "k", path="/v1/datasets/people/query")  # carol was granted nothing
    assert r.status_code == 404 and _rows(world) == []


def test_a_failure_after_the_debit_is_stored_and_replayed(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(self: DuckDBEngine, plan: Any) -> Any:
        raise RuntimeError("the engine failed")

    monkeypatch.setattr(DuckDBEngine, "compute", fail)
    client = world.client()
    failed = _post(client, world, "alice", "boom")
    (spend,) = spends(world, "alice")
    assert failed.status_code == 500
    assert failed.json() == {"error": {"code": "query_failed", "message": QueryFailedError.MESSAGE, "spend_id": spend}}
    monkeypatch.undo()  # the retry would succeed if it ran again: it must not
    again = _post(client, world, "alice", "boom")
    assert (again.status_code, again.content) == (500, failed.content)
    assert again.headers["Idempotent-Replayed"] == "true"
    assert spends(world, "alice") == [spend] and len(_paying(world)) == 1
    world.service.verify_log()


def test_a_paid_request_whose_answer_was_never_stored_answers_query_failed(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server stopped between the debit and storing the answer: once the answer's time is
    past, a retry gets the fixed query_failed naming that spend — never a second run."""
    monkeypatch.setattr(IdempotencyKeys, "complete", lambda self, claim, status, body: None)
    client = world.client()
    first = _post(client, world, "alice", "lost")
    assert first.status_code == 200
    monkeypatch.undo()
    (spend,) = spends(world, "alice")
    assert _rows(world) == [("alice", "query", "lost", "pending")]
    early = _post(client, world, "alice", "lost")  # within the answer's time: still in progress
    assert early.status_code == 409 and error_of(early)["code"] == "idempotency_key_in_progress"
    execute(world, "UPDATE idempotency_keys SET expires_ms = 0")
    late = _post(client, world, "alice", "lost")
    assert late.status_code == 500 and late.headers["Idempotent-Replayed"] == "true"
    assert late.json() == {"error": {"code": "query_failed", "message": QueryFailedError.MESSAGE, "spend_id": spend}}
    assert _post(client, world, "alice", "lost").content == late.content
    assert spends(world, "alice") == [spend] and len(_paying(world)) == 1
    world.service.verify_log()


def test_a_claim_abandoned_before_paying_is_taken_over_and_its_request_cannot_pay(world: World) -> None:
    keys = IdempotencyKeys(world.service.store)
    print_ = fingerprint("people", "query", QUERY)
    abandoned = keys.claim("alice", "query", "k", print_)
    with pytest.raises(Problem):  # in progress
        keys.claim("alice", "query", "k", print_)
    execute(world, "UPDATE idempotency_keys SET expires_ms = 0")
    retry = keys.claim("alice", "query", "k", print_)
    assert isinstance(abandoned, Claim) and isinstance(retry, Claim) and retry.token != abandoned.token
    # The abandoned request now reaches its debit: refused in the debit's own transaction.
    ledger = world.service.ledger

    def debit(claim: Claim) -> Any:
        hook = keys.on_debit(claim, lambda: 1.0)
        return ledger.debit("people", "alice", LaplaceEvent(1.0), "q", on_debit=lambda tx, f: hook(tx, f.spend_id))

    with pytest.raises(Problem) as err:
        debit(abandoned)
    assert err.value.code == "idempotency_key_in_progress"
    assert spends(world, "alice") == [] and world.spent("alice") == (0.0, 0.0)
    # The retry's own debit goes through and is attached to its claim.
    spend = debit(retry)
    assert keys.spend_of(retry) == spend.id and keys.spend_of(abandoned) is None
    # A claim that paid is never taken over: past its time, it is a paid request never answered.
    execute(world, "UPDATE idempotency_keys SET expires_ms = 0")
    assert keys.claim("alice", "query", "k", print_) == Unanswered(retry, spend.id)


def test_an_abandoned_claim_is_a_fresh_attempt_over_http(world: World) -> None:
    keys = IdempotencyKeys(world.service.store)
    keys.claim("alice", "query", "k", fingerprint("people", "query", QUERY))
    client = world.client()
    assert _post(client, world, "alice", "k").status_code == 409
    execute(world, "UPDATE idempotency_keys SET expires_ms = 0")
    r = _post(client, world, "alice", "k")
    assert r.status_code == 200 and "Idempotent-Replayed" not in r.headers
    assert len(spends(world, "alice")) == 1


# -- bounded storage ----------------------------------------------------------------------------------


def test_at_most_n_keys_per_principal_the_oldest_answered_dropped_first(world: World) -> None:
    client = world.client(max_idempotency_keys=2)
    small = {**QUERY, "epsilon": 0.1}
    for key in ("k1", "k2", "k3"):
        assert _post(client, world, "alice", key, small).status_code == 200
    assert _post(client, world, "bob", "k1", small).status_code == 200
    assert _rows(world) == [
        ("alice", "query", "k2", "done"),
        ("alice", "query", "k3", "done"),
        ("bob", "query", "k1", "done"),
    ]
    assert _post(client, world, "alice", "k3", small).headers["Idempotent-Replayed"] == "true"
    dropped = _post(client, world, "alice", "k1", small)  # forgotten: a new request, paid again
    assert dropped.status_code == 200 and "Idempotent-Replayed" not in dropped.headers
    assert len(spends(world, "alice")) == 4


def test_keys_are_kept_for_the_configured_time(world: World) -> None:
    client = world.client(idempotency_seconds=3600.0)
    assert _post(client, world, "alice", "old").status_code == 200
    execute(world, "UPDATE idempotency_keys SET created_ms = created_ms - 3601000")
    r = _post(client, world, "alice", "old")
    assert r.status_code == 200 and "Idempotent-Replayed" not in r.headers
    assert len(spends(world, "alice")) == 2


def test_a_principal_whose_every_key_is_in_progress_is_refused(world: World) -> None:
    keys = IdempotencyKeys(world.service.store, max_keys=1)
    keys.claim("alice", "query", "a", "x")
    with pytest.raises(Problem) as err:
        keys.claim("alice", "query", "b", "x")
    assert (err.value.status, err.value.extra["setting"]) == (429, "max_idempotency_keys")
    keys.claim("bob", "query", "a", "x")  # another principal's room is its own


@pytest.mark.parametrize("setting", [{"max_idempotency_keys": 0}, {"idempotency_seconds": 0.0}])
def test_the_limits_are_checked(setting: dict[str, Any]) -> None:
    from dpkit.server import ServerConfig

    with pytest.raises(InvalidParameterError) as err:
        ServerConfig(**setting)
    assert err.value.name == next(iter(setting))


# -- the header ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    ["", '""', "a b", "x" * 256, '"' + "x" * 256 + '"', '"a b"', '"a\\b"', "caf\u00e9", "a\x7f", "tab\tkey"],
)
def test_a_bad_key_is_400_naming_the_header_and_spends_nothing(world: World, value: str) -> None:
    client = world.client()
    for path, body in ((PATHS["query"], QUERY), (PATHS["synthetic"], SYNTH)):
        headers = {**world.h("alice"), "Idempotency-Key": value.encode("latin-1")}
        r = client.post(path, json=body, headers=headers)
        assert r.status_code == 400, (value, r.text)
        assert error_of(r)["code"] == "invalid_request" and error_of(r)["parameter"] == "Idempotency-Key"
        assert "Idempotency-Key" in error_of(r)["message"]
    assert spends(world, "alice") == [] and _rows(world) == []


def test_the_header_given_twice_is_400(world: World) -> None:
    headers = [*world.h("alice").items(), ("Idempotency-Key", "a"), ("Idempotency-Key", "a")]
    r = world.client().post(PATHS["query"], json=QUERY, headers=headers)
    assert r.status_code == 400 and error_of(r)["parameter"] == "Idempotency-Key"
    assert spends(world, "alice") == []


@pytest.mark.parametrize("value", ["x" * 255, "!~", '"quoted"', "a:b/c=d"])
def test_good_keys_are_accepted(world: World, value: str) -> None:
    assert _post(world.client(), world, "alice", value).status_code == 200


def test_the_published_schema_declares_the_header(world: World) -> None:
    """A client generated from /openapi.json learns the header on both paid endpoints."""
    spec = world.client().get("/openapi.json").json()
    for endpoint in PATHS:
        params = spec["paths"][f"/v1/datasets/{{name}}/{endpoint}"]["post"].get("parameters", [])
        header = [p for p in params if p["in"] == "header" and p["name"] == "Idempotency-Key"]
        assert len(header) == 1 and header[0].get("required", False) is False, params
        assert "not debited again" in header[0]["description"]


# -- the schema ------------------------------------------------------------------------------------


def test_a_version_5_database_is_upgraded_in_place(world: World, tmp_path: Path) -> None:
    url = world.service.url
    world.close()
    world.closed = False  # (reopened below; closed again by the fixture)
    execute(world, "DROP TABLE idempotency_keys")
    execute(world, "UPDATE dpkit_service SET version = 5")
    service = Service(url, audit_key=tmp_path / "audit.key", dataset_dir=tmp_path / "datasets")
    world.service, world.clients = service, []
    assert execute(world, "SELECT version FROM dpkit_service") == [(6,)]
    client = world.client()
    first = _post(client, world, "alice", "after-upgrade")
    assert first.status_code == 200
    assert _post(client, world, "alice", "after-upgrade").content == first.content
    assert len(spends(world, "alice")) == 1
    service.verify_log()


def test_a_fresh_database_has_version_6(tmp_path: Path) -> None:
    world = build(tmp_path, f"sqlite:///{tmp_path / 'ledger.sqlite'}")
    try:
        assert execute(world, "SELECT version FROM dpkit_service") == [(6,)]
    finally:
        world.close()
