"""The keyed hash chain of the audit log: built through the service (grants, HTTP requests and
administrative entries), verified, then tampered with through raw SQL — every change, deletion,
reordering and insertion is found and the first bad entry named; cutting the tail is found
against a recorded head; concurrent appends keep one contiguous chain.

The structural cases below forge entries *with* the chain's key (read from its file), to test
the chain's links on their own; ``test_integrity.py`` covers an attacker without the key and the
cross-check between the chain and the ledger. Every check is deterministic: false-failure rate 0.

The tampering goes around the service, as an attacker with write access to the database file
would. If the service ever protects the table with append-only triggers, the attacker drops them
first, and so do these tests.
"""

from __future__ import annotations

import json
import re
import shutil
import sqlite3
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from dpkit.errors import LedgerError
from dpkit.server import Service
from dpkit.server.audit import GENESIS, AuditEntry, load_key, verify_chain
from server._api import COUNT_SQL, World, make_world

COLUMNS = "seq, at, actor, action, dataset, status, outcome, epsilon, delta, detail, prev_hash, hash"
N = 14  # entries of build_log


def key_of(world: World) -> bytes:
    return load_key(world.db.with_name(world.db.name + ".audit-key"), create=False)


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """A closed world whose log ``build_log`` wrote (copied by ``logged``: building it through
    HTTP for each tampering test would be slow)."""
    w = make_world(tmp_path_factory.mktemp("template"))
    build_log(w)
    w.close()  # checkpoints the WAL: the database is one file
    return w.dir, dict(w.keys)


@pytest.fixture
def logged(template: tuple[Path, dict[str, str]], tmp_path: Path) -> Iterator[World]:
    """A fresh copy of the template world (its key file too), its log of N entries verified."""
    source, keys = template
    target = tmp_path / "world"
    shutil.copytree(source, target)
    db = target / "ledger.sqlite"
    w = World(target, db, Service(f"sqlite:///{db}"), dict(keys), target / "people.csv", target / "secret.csv")
    assert w.service.verify_log().entries == N
    yield w
    w.close()


def build_log(world: World) -> list[AuditEntry]:
    """A log of N entries of every kind: the world's 3 grants, 2 paid answers (each recorded by
    the entry its debit wrote), a preview, refusals, administrative actions."""
    client = world.client()
    a, cur = world.h("alice"), world.h("curator")
    assert (
        client.post("/v1/datasets/people/query", headers=a, json={"epsilon": 0.25, "sql": COUNT_SQL}).status_code == 200
    )
    assert (
        client.post(
            "/v1/datasets/people/query",
            headers=a,
            json={"epsilon": 0.5, "delta": 1e-6, "noise": "gaussian", "sql": "SELECT AVG(age) FROM people"},
        ).status_code
        == 200
    )
    assert (
        client.post("/v1/datasets/people/query/cost", headers=a, json={"epsilon": 0.1, "sql": COUNT_SQL}).status_code
        == 200
    )
    assert client.post("/v1/datasets/people/query", headers=a, json={"epsilon": 0, "sql": COUNT_SQL}).status_code == 400
    assert (
        client.post(
            "/v1/datasets/people/query", headers=world.h("bob"), json={"epsilon": 100, "sql": COUNT_SQL}
        ).status_code
        == 409
    )
    assert client.get("/v1/audit", headers=a).status_code == 403
    assert client.post("/v1/analysts", headers=cur, json={"name": "carol"}).status_code == 201
    assert client.get("/v1/budgets", headers=cur).status_code == 200
    svc = world.service
    svc.audit(
        actor="curator",
        action="note",
        status=0,
        outcome="ok",
        dataset="people",
        detail={"analyst": "carol", "budget_epsilon": 1.0},
    )
    svc.audit(
        actor=None,
        action="verify_log",
        status=0,
        outcome="ok",
        detail={"note": "ünïcödé ✓", "nested": {"x": [1, 2.5, None]}},
    )
    svc.audit(actor="curator", action="revoke", status=0, outcome="ok", detail={"target": "bob", "third": 1 / 3})
    entries = world.entries()
    assert len(entries) == N
    return entries


def tamper(world: World, *statements: tuple[str, tuple[Any, ...]]) -> None:
    """Run ``statements`` on the database file directly (dropping any append-only triggers first)."""
    conn = world.raw()
    try:
        conn.execute("BEGIN IMMEDIATE")
        _drop_triggers(conn)
        for sql, params in statements:
            conn.execute(sql, params)
        conn.execute("COMMIT")
    finally:
        conn.close()


def _drop_triggers(conn: sqlite3.Connection) -> None:
    for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'").fetchall():
        conn.execute(f'DROP TRIGGER "{name}"')


def row(world: World, seq: int) -> tuple[Any, ...]:
    conn = world.raw()
    try:
        return conn.execute(f"SELECT {COLUMNS} FROM audit_log WHERE seq = ?", (seq,)).fetchone()
    finally:
        conn.close()


def refused(world: World, entry: int, **kwargs: Any) -> str:
    with pytest.raises(LedgerError) as info:
        world.service.verify_log(**kwargs)
    message = str(info.value)
    assert re.search(rf"\bentry {entry}\b", message), message
    return message


# ------------------------------------------------------------------------------------------------
# a sound log
# ------------------------------------------------------------------------------------------------


def test_log_built_through_the_service_verifies(world: World) -> None:
    entries = build_log(world)
    report = verify_chain(entries, key=key_of(world))
    assert report.entries == N and report.head == entries[-1].hash
    assert world.service.verify_log() == report
    assert world.service.verify_log(head=entries[4].hash) == report
    assert world.service.verify_log(head=GENESIS) == report
    assert [e.seq for e in entries] == list(range(1, N + 1))
    assert entries[0].prev_hash == GENESIS
    assert all(e.prev_hash == p.hash for p, e in zip(entries, entries[1:], strict=False))
    # the grants, written with the budgets: the exact (ε, δ) granted
    grant = entries[0]
    assert (grant.action, grant.dataset, grant.epsilon, grant.detail["analyst"], grant.detail["budget_epsilon"]) == (
        "grant",
        "people",
        None,
        "alice",
        "10/1",
    )
    # what the debits and the HTTP layer wrote: who, what, the status, the exact debit
    first, second, preview, bad, over, forbidden = entries[3:9]
    assert (first.actor, first.action, first.dataset, first.status, first.epsilon, first.delta) == (
        "alice",
        "query",
        "people",
        200,
        "1/4",
        "0/1",
    )
    assert first.detail["query"] == COUNT_SQL and isinstance(first.detail["spend_id"], int)
    assert second.status == 200 and second.epsilon == "1/2" and second.delta is not None and second.delta != "0/1"
    assert (preview.action, preview.status, preview.epsilon) == ("cost", 200, None)
    assert (bad.status, bad.epsilon) == (400, None) and "epsilon" in bad.outcome
    assert (over.actor, over.status, over.epsilon) == ("bob", 409, None) and over.outcome.startswith("budget_exceeded")
    assert (forbidden.actor, forbidden.status) == ("alice", 403)
    assert world.service.unlogged_spends() == []


def test_verify_endpoint(world: World) -> None:
    entries = build_log(world)
    client = world.client()
    r = client.get("/v1/audit/verify", headers=world.h("curator"))
    assert r.status_code == 200
    body = r.json()
    # (the request's own entry is appended as its answer starts, after the verification)
    assert (
        body["ok"] is True
        and body["entries"] == N
        and body["head"] == entries[-1].hash
        and body["unlogged_spends"] == []
    )
    r = client.get("/v1/audit/verify", params={"head": entries[-1].hash}, headers=world.h("curator"))
    assert r.status_code == 200 and r.json()["ok"] is True
    tamper(world, ("UPDATE audit_log SET outcome = 'ok' WHERE seq = 4", ()))
    r = client.get("/v1/audit/verify", headers=world.h("curator"))
    # a failed verification is an answer (200, ok false) that names the broken entry
    assert r.status_code == 200 and r.json()["ok"] is False and "entry 4" in r.json()["error"]


def test_empty_log_verifies(tmp_path: Path) -> None:
    with Service(f"sqlite:///{tmp_path / 'empty.sqlite'}") as svc:
        report = svc.verify_log()
        assert (report.entries, report.head) == (0, GENESIS)
        assert svc.verify_log(head=GENESIS) == report
        with pytest.raises(LedgerError, match="removed from its end"):
            svc.verify_log(head="f" * 64)


# ------------------------------------------------------------------------------------------------
# tampering
# ------------------------------------------------------------------------------------------------


EDITS: list[tuple[str, str, Callable[[tuple[Any, ...]], Any]]] = [
    ("outcome", "outcome", lambda r: "ok"),
    ("status", "status", lambda r: 200),
    ("epsilon", "epsilon", lambda r: "1/1000000"),
    ("epsilon-removed", "epsilon", lambda r: None),
    ("actor", "actor", lambda r: "bob"),
    ("dataset", "dataset", lambda r: "secret"),
    ("action", "action", lambda r: "cost"),
    ("at", "at", lambda r: "2000-01-01T00:00:00+00:00"),
    (
        "detail",
        "detail",
        lambda r: json.dumps(
            {**json.loads(r[9]), "query": "SELECT COUNT(*) FROM people WHERE age > 1"}, sort_keys=True
        ),
    ),
    (
        "detail-key-order",
        "detail",
        lambda r: json.dumps(json.loads(r[9]), sort_keys=False, indent=1),
    ),  # same content: not a change
]


@pytest.mark.parametrize(("what", "column", "new"), EDITS, ids=[e[0] for e in EDITS])
@pytest.mark.parametrize("seq", [1, 5, 12])
def test_changed_entry_is_named(
    what: str, column: str, new: Callable[[tuple[Any, ...]], Any], seq: int, logged: World
) -> None:
    world = logged
    old = row(world, seq)
    value = new(old)
    tamper(world, (f"UPDATE audit_log SET {column} = ? WHERE seq = ?", (value, seq)))
    if what == "detail-key-order" or old[COLUMNS.split(", ").index(column)] == value:
        # re-serialising the same JSON does not change the entry: it must still verify
        assert world.service.verify_log().entries == N
        return
    message = refused(world, seq)
    assert "changed" in message


def test_changed_hash_is_named_at_the_next_entry(logged: World) -> None:
    world = logged
    tamper(world, ("UPDATE audit_log SET hash = ? WHERE seq = 6", ("a" * 64,)))
    refused(world, 6)
    # … and recomputing that entry's hash over a changed body breaks the link to entry 7
    entries = world.entries()
    e6 = AuditEntry.new(
        6,
        entries[4].hash,
        key_of(world),
        at=entries[5].at,
        actor=entries[5].actor,
        action=entries[5].action,
        dataset=entries[5].dataset,
        status=200,
        outcome="ok",
        epsilon=None,
        delta=None,
        detail=entries[5].detail,
    )
    tamper(
        world,
        ("UPDATE audit_log SET status = ?, outcome = ?, hash = ? WHERE seq = 6", (e6.status, e6.outcome, e6.hash)),
    )
    message = refused(world, 7)
    assert "does not follow entry 6" in message


def test_deleted_middle_entry_is_named(logged: World) -> None:
    world = logged
    tamper(world, ("DELETE FROM audit_log WHERE seq = 5", ()))
    message = refused(world, 5)
    assert "missing or out of order" in message


def test_deleted_first_entry_is_named(logged: World) -> None:
    world = logged
    tamper(world, ("DELETE FROM audit_log WHERE seq = 1", ()))
    refused(world, 1)


def test_renumbered_after_deletion_is_named(logged: World) -> None:
    """Deleting an entry and renumbering the rest to hide the gap still breaks the chain."""
    world = logged
    tamper(world, ("DELETE FROM audit_log WHERE seq = 5", ()), ("UPDATE audit_log SET seq = seq - 1 WHERE seq > 5", ()))
    refused(world, 5)


@pytest.mark.parametrize(("i", "j"), [(2, 3), (1, 12), (4, 9), (7, 8)])
def test_swapped_entries_are_named(i: int, j: int, logged: World) -> None:
    world = logged
    tamper(
        world,
        ("UPDATE audit_log SET seq = -1 WHERE seq = ?", (i,)),
        ("UPDATE audit_log SET seq = ? WHERE seq = ?", (i, j)),
        ("UPDATE audit_log SET seq = ? WHERE seq = -1", (j,)),
    )
    refused(world, i)


def test_swapped_contents_with_kept_links_are_named(logged: World) -> None:
    """Swapping two entries' contents but keeping each row's seq, prev_hash and hash."""
    world = logged
    r3, r4 = row(world, 3), row(world, 4)
    body = "at = ?, actor = ?, action = ?, dataset = ?, status = ?, outcome = ?, epsilon = ?, delta = ?, detail = ?"
    tamper(
        world,
        (f"UPDATE audit_log SET {body} WHERE seq = 3", r4[1:10]),
        (f"UPDATE audit_log SET {body} WHERE seq = 4", r3[1:10]),
    )
    refused(world, 3)


def _forged(world: World, after: AuditEntry, seq: int, prev: str) -> AuditEntry:
    return AuditEntry.new(
        seq,
        prev,
        key_of(world),
        at=after.at,
        actor="alice",
        action="query",
        dataset="people",
        status=200,
        outcome="ok",
        epsilon="1/1000",
        delta="0/1",
        detail={"query": COUNT_SQL, "spend_id": 999},
    )


def _insert(entry: AuditEntry) -> tuple[str, tuple[Any, ...]]:
    return (
        f"INSERT INTO audit_log ({COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            entry.seq,
            entry.at,
            entry.actor,
            entry.action,
            entry.dataset,
            entry.status,
            entry.outcome,
            entry.epsilon,
            entry.delta,
            json.dumps(entry.detail, sort_keys=True),
            entry.prev_hash,
            entry.hash,
        ),
    )


def test_forged_entry_appended_with_a_wrong_prev_is_named(logged: World) -> None:
    world = logged
    entries = world.entries()
    forged = _forged(world, entries[-1], N + 1, entries[-2].hash)  # its own hash is right, its link is not
    assert forged.hash == forged.expected_hash(key_of(world))
    tamper(world, _insert(forged))
    message = refused(world, N + 1)
    assert f"does not follow entry {N}" in message


def test_forged_entry_with_an_invented_prev_is_named(logged: World) -> None:
    world = logged
    entries = world.entries()
    tamper(world, _insert(_forged(world, entries[-1], N + 1, "b" * 64)))
    refused(world, N + 1)


def test_forged_entry_inserted_in_the_middle_is_named(logged: World) -> None:
    """Inserted at 6 with a correct link to entry 5 and a right own hash: entry 7 (the old 6)
    no longer follows it."""
    world = logged
    entries = world.entries()
    forged = _forged(world, entries[5], 6, entries[4].hash)
    conn = world.raw()
    try:  # shift 6..N up by one, from the top (seq is the primary key)
        conn.execute("BEGIN IMMEDIATE")
        _drop_triggers(conn)
        for seq in range(N, 5, -1):
            conn.execute("UPDATE audit_log SET seq = ? WHERE seq = ?", (seq + 1, seq))
        conn.execute(*_insert(forged))
        conn.execute("COMMIT")
    finally:
        conn.close()
    message = refused(world, 7)
    assert "entry 7 does not match its keyed hash" in message or "entry 7 does not follow" in message


def test_rewritten_chain_is_caught_by_the_recorded_head(logged: World) -> None:
    """An attacker who holds the key, rewrites one entry and recomputes every later hash leaves
    a valid-looking chain; the head the curator recorded no longer appears in it. (Without the
    key the rewrite fails on its own: test_integrity.py.)"""
    world = logged
    entries = world.entries()
    head = world.service.verify_log().head
    rebuilt: list[AuditEntry] = []
    prev = GENESIS
    for e in entries:
        outcome = "ok" if e.seq == 5 else e.outcome
        status = 200 if e.seq == 5 else e.status
        new = AuditEntry.new(
            e.seq,
            prev,
            key_of(world),
            at=e.at,
            actor=e.actor,
            action=e.action,
            dataset=e.dataset,
            status=status,
            outcome=outcome,
            epsilon=e.epsilon,
            delta=e.delta,
            detail=e.detail,
        )
        rebuilt.append(new)
        prev = new.hash
    tamper(world, ("DELETE FROM audit_log", ()), *[_insert(e) for e in rebuilt])
    assert world.service.verify_log().entries == N  # undetectable without the head …
    with pytest.raises(LedgerError, match="removed from its end") as info:
        world.service.verify_log(head=head)  # … found with it
    assert head in str(info.value)


@pytest.mark.parametrize("cut", [1, 3])
def test_deleted_tail_is_caught_with_the_head(cut: int, logged: World) -> None:
    world = logged
    head = world.service.verify_log().head
    tamper(world, ("DELETE FROM audit_log WHERE seq > ?", (N - cut,)))
    report = world.service.verify_log()  # a shorter chain is still a valid chain …
    assert report.entries == N - cut
    with pytest.raises(LedgerError, match="removed from its end") as info:
        world.service.verify_log(head=head)  # … but not one that holds the recorded head
    assert head in str(info.value)


def test_deleted_tail_with_paid_entries_is_caught_without_the_head(logged: World) -> None:
    """Cutting entries that recorded debits leaves their spends unlogged: the cross-check with
    the ledger finds that even with no recorded head."""
    world = logged
    tamper(world, ("DELETE FROM audit_log WHERE seq > 4", ()))
    with pytest.raises(LedgerError, match="has no audit entry"):
        world.service.verify_log()


def test_later_appends_keep_an_old_head_valid(logged: World) -> None:
    world = logged
    head = world.service.verify_log().head
    world.service.audit(actor="curator", action="later", status=0, outcome="ok")
    assert world.service.verify_log(head=head).entries == N + 1


def test_tampered_ledger_is_reported_too(logged: World) -> None:
    """verify_log also checks the ledger: a spend erased behind its back is found."""
    world = logged
    tamper(world, ("DELETE FROM spends WHERE id = (SELECT MIN(id) FROM spends)", ()))
    with pytest.raises(LedgerError, match="alice"):
        world.service.verify_log()


# ------------------------------------------------------------------------------------------------
# concurrency
# ------------------------------------------------------------------------------------------------


def _hammer(append: Callable[[int, int], None], threads: int = 8, each: int = 50) -> list[BaseException]:
    errors: list[BaseException] = []
    barrier = threading.Barrier(threads)

    def work(t: int) -> None:
        try:
            barrier.wait()
            for i in range(each):
                append(t, i)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    pool = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for th in pool:
        th.start()
    for th in pool:
        th.join()
    return errors


def _check_concurrent_log(svc: Service, threads: int = 8, each: int = 50) -> None:
    report = svc.verify_log()
    entries = svc.audit_entries(limit=10**6)
    assert report.entries == len(entries) == threads * each
    assert [e.seq for e in entries] == list(range(1, threads * each + 1))
    seen = sorted((e.detail["thread"], e.detail["i"]) for e in entries)
    assert seen == [(t, i) for t in range(threads) for i in range(each)]
    for t in range(threads):  # each thread's entries are in its own order
        mine = [e.detail["i"] for e in entries if e.detail["thread"] == t]
        assert mine == list(range(each))


def test_concurrent_appends_form_one_chain(tmp_path: Path) -> None:
    with Service(f"sqlite:///{tmp_path / 'log.sqlite'}") as svc:
        errors = _hammer(
            lambda t, i: svc.audit(
                actor=f"a{t}", action="query", status=200, outcome="ok", detail={"thread": t, "i": i}
            )
        )
        assert errors == []
        _check_concurrent_log(svc)


def test_concurrent_appends_from_separate_services(tmp_path: Path) -> None:
    """Eight services (as eight server processes would) on one database file."""
    url = f"sqlite:///{tmp_path / 'log.sqlite'}"
    services = [Service(url) for _ in range(8)]
    try:
        errors = _hammer(
            lambda t, i: services[t].audit(
                actor=f"a{t}", action="query", status=200, outcome="ok", detail={"thread": t, "i": i}
            )
        )
        assert errors == []
        _check_concurrent_log(services[0])
    finally:
        for svc in services:
            svc.close()


def test_concurrent_http_requests_are_each_logged_once(world: World) -> None:
    client = world.client()
    bodies = {
        "alice": {"epsilon": 0.01, "sql": COUNT_SQL},
        "bob": {"epsilon": 0.01, "sql": "SELECT AVG(age) FROM people"},
    }

    def append(t: int, i: int) -> None:
        who = ("alice", "bob")[t % 2]
        r = client.post("/v1/datasets/people/query", headers=world.h(who), json=bodies[who])
        assert r.status_code == 200, r.text

    errors = _hammer(append, threads=4, each=10)
    assert errors == []
    report = world.service.verify_log()
    assert report.entries == 3 + 40  # the grants, then one entry per paid answer
    entries = world.entries()
    assert sum(e.actor == "alice" for e in entries) == sum(e.actor == "bob" for e in entries) == 20
    assert world.service.unlogged_spends() == []
    spend_ids = sorted(e.detail["spend_id"] for e in entries if e.epsilon is not None)
    assert spend_ids == world.spend_ids()


def test_sqlite_tamper_helper_sees_the_service_file(world: World) -> None:
    """(Guards the tests above: the raw connection and the service share one file.)"""
    build_log(world)
    conn = sqlite3.connect(world.db)
    try:
        assert conn.execute("SELECT COUNT(*) FROM audit_log").fetchone()[0] == N
    finally:
        conn.close()
