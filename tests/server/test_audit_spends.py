"""The audit chain vouches for what each spend was for, not only for what it cost.

A debit's chained entry carries the SHA-256 of the spend's ``event`` and ``query_text`` exactly
as the ledger stored them (:func:`dpkit.server.audit.text_digest`), and ``verify_log`` compares
them with the spends table: a query text or an event rewritten in the database afterwards is
found and the spend named — before, ``verify_log`` said "the ledger and the log agree". A paying
entry without the digests (a log chained before they were recorded) cannot vouch for the texts,
and ``verify_log`` says so plainly instead of passing.

Every spend path is covered: paid queries and a synthetic table (whose debit goes through the
synthesizer's own payment hook). Each case tampers with a fresh world that verifies first (the
control), on SQLite and on PostgreSQL, as an attacker with write access to the database but not
to the chain's key. Deterministic: false-failure rate 0.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from dpkit.server import QueryRequest, Service
from dpkit.server.audit import AuditEntry, cross_check, text_digest
from dpkit.server.synthetic import SynthRequest
from server._api import COUNT_SQL, PEOPLE_METADATA, write_people
from server._tamper import Backend, postgres_executor, sqlite_executor

KEY = bytes(range(32))
COLUMNS = "seq, at, actor, action, dataset, status, outcome, epsilon, delta, detail, prev_hash, hash"


def build(service: Service, people: Path) -> None:
    """A dataset, one analyst, two paid queries (one with a non-ASCII text) and a synthetic table."""
    service.register_dataset("people", people, PEOPLE_METADATA)
    _, key = service.create_principal("alice", "analyst")
    service.grant("alice", "people", epsilon=5.0, delta=1e-5, actor="curator")
    alice = service.authenticate(key)
    service.query(alice, "people", QueryRequest(epsilon=0.1, sql=COUNT_SQL))
    service.query(
        alice, "people", QueryRequest(epsilon=0.1, sql="SELECT COUNT(*) FROM people WHERE sex = 'F' -- ünï ✓")
    )
    service.synthesize(
        alice, "people", SynthRequest(epsilon=1.0, delta=1e-6, columns=["age", "sex"], bins={"age": 5}, rows=20)
    )


@pytest.fixture(params=["sqlite", "postgres"])
def world(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    people = write_people(tmp_path / "people.csv")
    if request.param == "sqlite":
        db = tmp_path / "ledger.sqlite"
        url = f"sqlite:///{db}"
        with Service(url, audit_key=KEY) as svc:
            build(svc, people)

        execute = sqlite_executor(db)

        yield Backend(lambda: Service(url, audit_key=KEY), execute)
        return
    pg_url = request.getfixturevalue("pg_url")
    psycopg = pytest.importorskip("psycopg")
    datasets = tmp_path / "datasets"
    with Service(pg_url, audit_key=KEY, dataset_dir=datasets) as svc:
        build(svc, people)

    execute_pg = postgres_executor(psycopg, pg_url)

    yield Backend(lambda: Service(pg_url, audit_key=KEY, dataset_dir=datasets), execute_pg)


def paying(world: Backend) -> dict[int, AuditEntry]:
    return {e.detail["spend_id"]: e for e in world.entries() if e.epsilon is not None}


def test_every_debit_chains_the_digests_of_its_stored_texts(world: Backend) -> None:
    """The control: queries and the synthetic table alike chain the SHA-256 of the event and
    query text as the spends table holds them (read back raw, not as the service wrote them)."""
    assert world.verify().entries == 1 + 3  # the grant, then one entry per debit
    entries, stored = paying(world), world.spends()
    assert sorted(entries) == sorted(stored) and len(stored) == 3
    assert any(q.startswith("SYNTHESIZE ") for _, q in stored.values()) and any("✓" in q for _, q in stored.values())
    for sid, (event, query_text) in stored.items():
        detail = entries[sid].detail
        assert (detail["event_sha256"], detail["query_sha256"]) == (text_digest(event), text_digest(query_text)), sid


@pytest.mark.parametrize(
    ("column", "named"),
    [("query_text", "its stored query text differs"), ("event", "its stored event differs")],
)
@pytest.mark.parametrize("which", ["query", "synthetic"])
def test_a_rewritten_spend_text_is_named(world: Backend, column: str, named: str, which: str) -> None:
    """A spend whose query text (what the analyst asked) or event (the mechanism paid for) is
    rewritten in the database — same cost, same analyst, so the amounts still add up — is
    named by ``verify_log``."""
    stored = world.spends()
    sid = next(i for i, (_, q) in sorted(stored.items()) if q.startswith("SYNTHESIZE ") == (which == "synthetic"))
    event, query_text = stored[sid]
    new = json.dumps({**json.loads(event), "epsilon": 0.001}) if column == "event" else "SELECT 1 -- harmless"
    assert new != (event if column == "event" else query_text)
    world.execute(f"UPDATE spends SET {column} = ? WHERE id = ?", (new, sid))
    message = world.refused()
    assert re.search(rf"\bspend {sid}\b", message) and named in message, message
    assert "alice" in message and "rewritten in the ledger after the debit" in message


def test_both_texts_rewritten_are_named_together(world: Backend) -> None:
    sid = min(world.spends())
    world.execute("UPDATE spends SET query_text = ?, event = event || ' ' WHERE id = ?", ("SELECT 2", sid))
    message = world.refused()
    assert f"spend {sid} " in message and "its stored event and query text differ" in message, message


def test_a_log_chained_without_the_digests_is_reported(world: Backend) -> None:
    """A chain whose paying entries carry no digests — as a log chained before they were recorded
    (re-chained here with the key, so the chain itself verifies) — is reported once, with the
    spends it concerns, instead of passing as if the texts had been checked."""
    entries = world.entries()
    prev, rechained = entries[0].prev_hash, []
    for e in entries:
        detail = {k: v for k, v in e.detail.items() if k not in ("event_sha256", "query_sha256")}
        e2 = AuditEntry.new(e.seq, prev, KEY, at=e.at, actor=e.actor, action=e.action, dataset=e.dataset, status=e.status,
                            outcome=e.outcome, epsilon=e.epsilon, delta=e.delta, detail=detail)  # fmt: skip
        rechained.append(e2)
        prev = e2.hash
    for e2 in rechained:
        world.execute(
            "UPDATE audit_log SET detail = ?, prev_hash = ?, hash = ? WHERE seq = ?",
            (json.dumps(e2.detail, sort_keys=True), e2.prev_hash, e2.hash, e2.seq),
        )
    message = world.refused()
    sids = sorted(world.spends())
    assert f"3 spend(s) ({', '.join(map(str, sids))}) have paying audit entries without the SHA-256" in message, message
    assert "cannot be checked" in message


def test_cross_check_lists_the_unhashed_entries_once() -> None:
    """(The message names at most ten spends, then says how many in all.)"""
    entries = [
        AuditEntry(i + 1, "t", "alice", "query", "people", 200, "paid", "1/10", "0/1", {"spend_id": i + 1})
        for i in range(12)
    ]
    spends = [(i + 1, "people", "alice", "1/10", "0/1", "{}", "q") for i in range(12)]
    problems = cross_check(entries, [], spends)
    assert problems == [
        "12 spend(s) (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, …) have paying audit entries without the SHA-256 of the "
        "spend's event and query text (entries chained before spends' texts were recorded, or forged without "
        "them): whether those texts were rewritten in the ledger cannot be checked"
    ]
    hashed = [
        replace(e, detail={**e.detail, "event_sha256": text_digest("{}"), "query_sha256": text_digest("q")})
        for e in entries
    ]
    assert cross_check(hashed, [], spends) == []
