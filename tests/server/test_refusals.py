"""Unauthenticated traffic: throttled per client address before authentication and counted in
bounded form, never appended to the hash-chained audit log. Deterministic (false-failure rate 0):
the token buckets refill at 1 refusal per second, far slower than the requests are sent, and
each assertion holds for any interleaving of refills."""

from __future__ import annotations

import secrets
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from dpkit.server.keys import new_key
from dpkit.server.refusals import AddressLimiter, RefusalCounter
from server._api import World, error_of, make_world

GRANTS = (("alice", "people", 10.0, 1e-5),)


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    w = make_world(tmp_path, analysts=("alice",), grants=GRANTS)
    yield w
    w.close()


def test_an_unauthenticated_flood_leaves_the_chain_unchanged(world: World) -> None:
    """2,000 unauthenticated GETs (1,000 with no key to random paths, 1,000 with well-formed
    unknown keys): all 401 or 429, not one audit entry, and the counters account for each."""
    client = world.client(address_rate=1.0, address_burst=30)
    chain = len(world.entries())
    statuses: Counter[int] = Counter()
    for _ in range(1000):
        statuses[client.get(f"/v1/me/{secrets.token_hex(8)}").status_code] += 1
    for _ in range(1000):
        statuses[client.get("/v1/me", headers={"Authorization": f"Bearer {new_key()}"}).status_code] += 1
    assert set(statuses) <= {401, 429} and sum(statuses.values()) == 2000, statuses
    assert statuses[401] >= 30 and statuses[429] > 0, statuses  # the burst (plus refills), then throttled
    assert len(world.entries()) == chain, "unauthenticated requests grew the audit chain"
    counts = client.app.state.refusals
    assert counts.total("unauthenticated") == statuses[401]
    assert counts.total("address_rate_limited") == statuses[429]
    # The throttled address is refused before its key is looked up: even a valid key waits.
    throttled = client.get("/v1/me", headers=world.h("alice"))
    assert throttled.status_code == 429 and error_of(throttled)["code"] == "rate_limited"
    assert int(throttled.headers["retry-after"]) >= 1
    assert len(world.entries()) == chain
    # The counts are in the service database, a few rows whatever the traffic.
    counts.flush()
    with world.raw() as db:
        rows = db.execute("SELECT reason, SUM(count), COUNT(*) FROM edge_refusals GROUP BY reason").fetchall()
    stored = {r: (int(n), int(k)) for r, n, k in rows}
    assert stored["unauthenticated"][0] == statuses[401] and stored["address_rate_limited"][0] == statuses[429] + 1
    assert all(k <= 2 for _, k in stored.values()), "one row per reason and hour"
    world.service.verify_log()


def test_the_counts_are_read_by_the_curator(world: World) -> None:
    client = world.client(address_rate=1.0, address_burst=30)
    for _ in range(5):
        assert client.get("/v1/budgets").status_code == 401
    r = client.get("/v1/refusals", headers=world.h("curator"))
    assert r.status_code == 200
    assert sum(c["count"] for c in r.json()["refusals"] if c["reason"] == "unauthenticated") == 5
    assert client.get("/v1/refusals", headers=world.h("alice")).status_code == 403


def test_authenticated_requests_do_not_use_the_address_bucket(world: World) -> None:
    """The address bucket is charged only by refusals: 200 authenticated requests from one
    address with a burst of 5 all succeed, and each is one audit entry."""
    client = world.client(address_rate=1.0, address_burst=5)
    n = len(world.entries())
    assert all(client.get("/v1/me", headers=world.h("alice")).status_code == 200 for _ in range(200))
    assert len(world.entries()) == n + 200


def test_the_address_table_is_bounded() -> None:
    limiter = AddressLimiter(rate=1.0, burst=2, max_addresses=100)
    for i in range(10_000):
        limiter.charge(f"10.0.{i // 256}.{i % 256}")
    assert len(limiter) == 100
    limiter.charge("192.0.2.1")
    limiter.charge("192.0.2.1")
    assert limiter.wait("192.0.2.1") > 0 and limiter.wait("192.0.2.2") == 0


def test_counts_survive_a_failed_flush(world: World) -> None:
    """A flush that cannot write keeps its counts for the next one (power check: the counter that
    dropped them would report 0)."""
    counter = RefusalCounter(world.service._store, flush_every=3600)

    class Broken:
        def transaction(self, **_: object) -> object:
            raise RuntimeError("database unavailable")

    good = counter._store
    for _ in range(3):
        counter.add("unauthenticated")
    counter._store = Broken()  # type: ignore[assignment]
    with pytest.raises(RuntimeError):
        counter.flush()
    counter._store = good
    counter.flush()
    assert counter.total("unauthenticated") == 3
