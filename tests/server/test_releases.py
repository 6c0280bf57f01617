"""Releases as a multi-tenant resource (issue 27, items 3, 4, 12 and 1's data side): names
reserved before the debit, case-insensitively; a quota of stored bytes per publisher; an
allowance of downloads per principal; listings and downloads limited to the datasets granted;
downloads streamed part by part.

Every test here is deterministic in what it asserts (the noise only changes values no assertion
reads), so its false-failure rate is 0. Each fails on the service before this change: there,
four racing publishes gave one 200 and three paid 500s, a squatter took a running publish's
name, ``Race_1`` sat beside ``race_1``, no quota or download allowance existed, every principal
listed every release with its publisher and cost, and a download was built whole in memory.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from _live_server import live_server
from dpkit.errors import InvalidParameterError, LedgerError, LimitExceededError
from dpkit.server import Service
from dpkit.server.release_parts import PART_BYTES, TableShape
from dpkit.server.releases import Releases
from dpkit.server.synthetic import SynthRequest
from dpkit.synth import Synthesizer
from server._api import World, error_of
from server._release_world import BODY, GRANTED, LEDGERS, build, execute, open_world, spends


@pytest.fixture(params=LEDGERS)
def world(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[World]:
    yield from open_world(request, tmp_path)


def _publish(client: Any, world: World, who: str, name: str, **change: Any) -> Any:
    return client.post("/v1/datasets/people/synthetic", json={**BODY, **change, "publish": name}, headers=world.h(who))


def _allow(world: World, *names: str) -> None:
    for name in names:
        world.service.allow_publish(name, actor="curator")


def _names(world: World) -> list[tuple[str, str, str]]:
    return [tuple(r) for r in execute(world, "SELECT name, publisher, state FROM release_names ORDER BY name")]


# -- item 4: names reserved before the debit ------------------------------------------------------


def test_names_are_compared_ignoring_case_and_refused_before_paying(world: World) -> None:
    _allow(world, "alice", "bob")
    client = world.client()
    assert _publish(client, world, "alice", "race_1").status_code == 200
    for who, name in (("bob", "Race_1"), ("alice", "RACE_1"), ("bob", "race_1")):
        r = _publish(client, world, who, name)
        assert r.status_code == 400 and error_of(r)["parameter"] == "publish", r.text
        assert "taken" in error_of(r)["message"] and "nothing was spent" in error_of(r)["message"]
    assert spends(world, "bob") == [] and len(spends(world, "alice")) == 1
    assert [r.name for r in world.service.releases()] == ["race_1"]


def test_four_simultaneous_publishes_of_one_name_pay_once(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    """All four pass the first check, then meet at the reservation (a barrier before it): exactly
    one reserves and pays; the three others are refused with nothing spent."""
    _allow(world, *GRANTED)
    barrier = threading.Barrier(len(GRANTED), timeout=60)
    reserve = Releases.reserve

    def reserve_together(self: Releases, plan: Any) -> Any:
        barrier.wait()
        return reserve(self, plan)

    monkeypatch.setattr(Releases, "reserve", reserve_together)
    with (
        live_server(world.app()) as base,
        ThreadPoolExecutor(len(GRANTED)) as pool,
        httpx.Client(base_url=base, timeout=120) as http,
    ):
        answers = list(pool.map(lambda who: (who, _publish(http, world, who, "race_1")), GRANTED))
    statuses = sorted(r.status_code for _, r in answers)
    assert statuses == [200, 400, 400, 400], [r.text for _, r in answers]
    (winner,) = [who for who, r in answers if r.status_code == 200]
    for who, r in answers:
        if who != winner:
            assert error_of(r)["code"] == "invalid_request" and error_of(r)["parameter"] == "publish"
            assert spends(world, who) == [] and world.spent(who) == (0.0, 0.0)
    assert len(spends(world, winner)) == 1
    assert _names(world) == [("race_1", winner, "published")]
    world.service.verify_log()  # the winner's spend, its entry and its publication agree


def test_a_squatter_cannot_take_the_name_of_a_publish_still_running(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Alice's publish pays and then works slowly (its sampling waits); meanwhile bob publishes
    the same name at a tiny ε: refused before paying. Alice then gets her table, under her name."""
    _allow(world, "alice", "bob")
    started, go_on = threading.Event(), threading.Event()
    sample = Synthesizer.sample

    def slow_sample(self: Synthesizer, *args: Any, **kwargs: Any) -> Any:
        if not started.is_set():
            started.set()
            assert go_on.wait(60)
        return sample(self, *args, **kwargs)

    monkeypatch.setattr(Synthesizer, "sample", slow_sample)
    with (
        live_server(world.app()) as base,
        ThreadPoolExecutor(1) as pool,
        httpx.Client(base_url=base, timeout=120) as http,
    ):
        slow = pool.submit(_publish, http, world, "alice", "census_2026")
        assert started.wait(60)
        squat = _publish(http, world, "bob", "Census_2026", epsilon=0.01)
        go_on.set()
        first = slow.result()
    assert squat.status_code == 400 and error_of(squat)["parameter"] == "publish", squat.text
    assert spends(world, "bob") == []
    assert first.status_code == 200, first.text
    (release,) = world.service.releases()
    assert (release.name, release.analyst, release.spend_id) == ("census_2026", "alice", first.json()["spend_id"])


def test_an_unpaid_refusal_frees_the_name_and_a_paid_failure_keeps_it(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Documented choice: a publish refused before its debit frees its name; one that paid and
    then failed keeps it for good (marked failed, counting no bytes of the quota)."""
    _allow(world, "alice")
    client = world.client()
    r = _publish(client, world, "alice", "t1", epsilon=11.0)  # more than the budget: 409, unpaid
    assert r.status_code == 409 and _names(world) == []

    def broken(self: Synthesizer, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("sampling failed")

    monkeypatch.setattr(Synthesizer, "sample", broken)
    failed = _publish(client, world, "alice", "t1")
    assert failed.status_code == 500 and error_of(failed)["code"] == "query_failed"
    assert error_of(failed)["spend_id"] == spends(world, "alice")[0]
    monkeypatch.undo()
    assert _names(world) == [("t1", "alice", "failed")]
    assert execute(world, "SELECT bytes FROM release_names")[0][0] == 0
    again = _publish(client, world, "alice", "T1")
    assert again.status_code == 400 and "taken" in error_of(again)["message"]
    assert len(spends(world, "alice")) == 1 and world.service.releases() == []
    world.service.verify_log()


# -- item 3: a quota of stored bytes per publisher ---------------------------------------------------


def _bound(world: World, rows: int) -> int:
    syn = Synthesizer(
        epsilon=1.0,
        delta=1e-6,
        metadata=world.service.dataset("people").metadata,
        bins={"age": 5},
        columns=["age", "sex"],
    )
    return TableShape.of_domain(syn.domain).bound(rows)


def _refused_by_quota(r: Any, quota: int) -> bool:
    err = error_of(r)
    return r.status_code == 400 and (err["code"], err["setting"], err["limit"]) == (
        "limit_exceeded",
        "max_release_bytes",
        quota,
    )


def test_the_quota_is_checked_on_an_upper_bound_before_paying(world: World) -> None:
    _allow(world, "alice")
    bound = _bound(world, 200)
    r = _publish(world.client(max_release_bytes=bound - 1), world, "alice", "first")
    assert _refused_by_quota(r, bound - 1), r.text
    assert spends(world, "alice") == [] and _names(world) == []
    assert _publish(world.client(max_release_bytes=bound), world, "alice", "first").status_code == 200
    stored = execute(world, "SELECT bytes FROM release_names WHERE name = 'first'")[0][0]
    assert 0 < stored < bound  # counted with its stored size once stored
    quota = stored + bound - 1  # room for a bound of 200 rows minus one byte
    client = world.client(max_release_bytes=quota)
    r = _publish(client, world, "alice", "second")
    assert _refused_by_quota(r, quota), r.text
    assert len(spends(world, "alice")) == 1 and [n for n, _, _ in _names(world)] == ["first"]
    assert _publish(client, world, "alice", "small", rows=10).status_code == 200  # a smaller table's bound fits
    assert len(spends(world, "alice")) == 2


def test_the_quota_holds_across_processes(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two services on one database (two processes' connections) reserve for one publisher at
    once, with room for one table: exactly one pays; the other is refused before its debit.
    (Both leave the reservation only when both tried, so the winner's table still counts with
    its bound when the other tries.)"""
    _allow(world, "alice")
    other = Service(world.service.url, audit_key=world.dir / "audit.key", dataset_dir=world.dir / "datasets")
    start, done = threading.Barrier(2, timeout=60), threading.Barrier(2, timeout=60)
    reserve = Releases.reserve

    def reserve_together(self: Releases, plan: Any) -> Any:
        start.wait()
        try:
            return reserve(self, plan)
        finally:
            done.wait()

    monkeypatch.setattr(Releases, "reserve", reserve_together)
    quota = _bound(world, 200) * 3 // 2

    def publish(service: Service, name: str) -> str:
        who = service.authenticate(world.keys["alice"])
        request = SynthRequest(**{**BODY, "publish": name})
        try:
            service.synthesize(who, "people", request, max_release_bytes=quota)
        except LimitExceededError as exc:
            return exc.setting
        return "published"

    try:
        with ThreadPoolExecutor(2) as pool:
            outcomes = sorted(pool.map(publish, (world.service, other), ("a", "b")))
    finally:
        other.close()
    assert outcomes == ["max_release_bytes", "published"]
    assert len(spends(world, "alice")) == 1 and len(world.service.releases()) == 1


def test_downloads_per_hour_are_refused_with_429_before_any_byte(world: World) -> None:
    _allow(world, "alice")
    client = world.client(downloads_per_hour=2)
    assert _publish(client, world, "alice", "t").status_code == 200
    for _ in range(2):
        assert client.get("/v1/releases/t?format=csv", headers=world.h("bob")).status_code == 200
    chained = len(world.entries())
    r = client.get("/v1/releases/t", headers=world.h("bob"))
    assert (
        r.status_code == 429
        and error_of(r)["code"] == "rate_limited"
        and error_of(r)["setting"] == "downloads_per_hour"
    )
    assert int(r.headers["Retry-After"]) >= 1 and "rows" not in r.text
    assert len(world.entries()) == chained  # counted, not chained (item 13)
    counts = client.get("/v1/refusals", headers=world.h("curator")).json()["refusals"]
    assert [(c["reason"], c["principal"], c["count"]) for c in counts] == [("principal_rate_limited", "bob", 1)]
    assert client.get("/v1/releases/t", headers=world.h("alice")).status_code == 200  # per principal


# -- item 12: what each principal sees -----------------------------------------------------------------


def test_analysts_see_only_releases_of_granted_datasets_without_publisher_or_cost(world: World) -> None:
    _allow(world, "alice")
    client = world.client()
    assert _publish(client, world, "alice", "people_2026").status_code == 200
    # carol was granted nothing: no listing, and a download is the 404 of a release that does not exist.
    assert client.get("/v1/releases", headers=world.h("carol")).json() == {"releases": []}
    hidden = client.get("/v1/releases/people_2026", headers=world.h("carol"))
    missing = client.get("/v1/releases/people_2027", headers=world.h("carol"))
    assert hidden.status_code == missing.status_code == 404
    assert error_of(hidden)["message"] == error_of(missing)["message"].replace("people_2027", "people_2026")
    private = {"published_by", "epsilon", "delta", "spend_id"}
    (seen,) = client.get("/v1/releases", headers=world.h("bob")).json()["releases"]
    assert seen["name"] == "people_2026" and not private & set(seen)
    body = client.get("/v1/releases/people_2026", headers=world.h("bob")).json()
    assert not private & set(body) and body["row_count"] == 200 and len(body["rows"]) == 200
    (full,) = client.get("/v1/releases", headers=world.h("curator")).json()["releases"]
    assert (full["published_by"], full["epsilon"], full["delta"]) == ("alice", 1.0, 1e-6)
    assert client.get("/v1/releases/people_2026", headers=world.h("curator")).json()["published_by"] == "alice"


# -- item 1: downloads stream part by part ---------------------------------------------------------------


@pytest.fixture
def big(world: World) -> Iterator[tuple[World, dict[str, Any]]]:
    """A release of 20,000 rows: about 500 kB of JSON, several parts."""
    _allow(world, "alice")
    r = _publish(world.client(), world, "alice", "big", rows=20_000)
    assert r.status_code == 200, r.text
    yield world, r.json()


def test_a_release_is_stored_in_bounded_parts(big: tuple[World, dict[str, Any]]) -> None:
    world, _ = big
    parts = execute(world, "SELECT part, length(csv), length(json) FROM release_parts WHERE name = 'big' ORDER BY part")
    assert [p for p, _, _ in parts] == list(range(len(parts))) and len(parts) >= 2
    assert all(0 < c <= PART_BYTES and 0 < j <= PART_BYTES for _, c, j in parts)


def test_a_download_reads_one_part_at_a_time(big: tuple[World, dict[str, Any]]) -> None:
    """The body is a generator that reads each part when it is about to send it: parts deleted
    after the first was sent are never sent (read eagerly, they would have been)."""
    world, paid = big
    download = world.service.release_download("big")
    body = download.json(curator=False)
    assert iter(body) is body  # an iterator, not a body built in memory
    head, first = next(body), next(body)
    assert len(first) <= PART_BYTES
    execute(world, "DELETE FROM release_parts WHERE name = 'big' AND part >= 1")
    rest = b"".join(body)
    assert rest == b"]}"
    rows = json.loads(head + first + rest)["rows"]
    assert 0 < len(rows) < 20_000 and rows == paid["rows"][: len(rows)]


def test_a_download_is_a_chunked_stream_over_http(big: tuple[World, dict[str, Any]]) -> None:
    world, paid = big
    with live_server(world.app()) as base, httpx.Client(base_url=base, timeout=60) as http:
        with http.stream("GET", "/v1/releases/big", headers=world.h("bob")) as r:
            assert r.status_code == 200 and "content-length" not in r.headers
            assert r.headers["transfer-encoding"] == "chunked"
            chunks = list(r.iter_raw())
        csv_text = http.get("/v1/releases/big?format=csv", headers=world.h("bob")).text
    body = json.loads(b"".join(chunks))
    assert body["rows"] == paid["rows"] and body["report"] == paid["report"]
    lines = csv_text.splitlines()
    assert lines[0] == "age,sex" and len(lines) == 20_001


def test_a_bad_name_is_refused_before_any_lookup(world: World) -> None:
    with pytest.raises(InvalidParameterError):
        world.service.release_download("bad-name")


# -- releases of a version-4 database ----------------------------------------------------------------


def test_releases_of_a_version_4_database_keep_their_names_and_are_not_vouched_for(tmp_path: Path) -> None:
    """A version-4 database kept a release's rows in one piece and chained nothing for it. Opened
    now, its names are reserved (case-folded: of ``Old`` and ``old`` the first keeps the
    reservation), its releases download as before (CSV escaped), and verify-log says the chain
    cannot vouch for them."""
    world = build(tmp_path, f"sqlite:///{tmp_path / 'ledger.sqlite'}")
    world.close()
    report = json.dumps({"text": "old"})
    with contextlib.closing(sqlite3.connect(world.db, isolation_level=None)) as raw:
        for table in ("publishers", "release_names", "release_parts"):
            raw.execute(f"DROP TABLE {table}")
        raw.execute("ALTER TABLE datasets DROP COLUMN size_class")
        raw.execute("UPDATE dpkit_service SET version = 4")
        for name, created in (("Old", "2026-01-01"), ("old", "2026-01-02")):
            raw.execute(
                "INSERT INTO releases VALUES (?, 'people', 'alice', NULL, '1.0', '1e-06', ?, ?, 2, ?, ?)",
                (name, created, json.dumps(["age", "sex"]), json.dumps([[30.5, "F"], [None, "O'Brien"]]), report),
            )
    service = Service(world.service.url, audit_key=tmp_path / "audit.key", dataset_dir=tmp_path / "datasets")
    try:
        world = World(world.dir, world.db, service, world.keys, world.people, world.secret)
        assert _names(world) == [("Old", "alice", "published")]
        body = world.client().get("/v1/releases/old", headers=world.h("bob")).json()
        assert body["rows"] == [[30.5, "F"], [None, "O'Brien"]] and body["report"] == {"text": "old"}
        with pytest.raises(LedgerError, match="release 'Old' .* stored before publications were chained"):
            service.verify_log()
        service.allow_publish("alice")
        r = _publish(world.client(), world, "alice", "OLD")
        assert r.status_code == 400 and "taken" in error_of(r)["message"]
    finally:
        service.close()
