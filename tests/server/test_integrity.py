"""The ledger and the audit log vouch for each other.

* The chain is keyed (HMAC-SHA256 with a key kept in a file outside the database): entries
  written without the key — a chain rewritten with plain SHA-256, or with another key — fail
  verification at the first such entry, with or without a recorded head.
* A debit and its audit entry, and a budget and its grant entry, commit in one transaction: a
  failure inside that transaction leaves neither.
* ``verify_log`` cross-checks both ways and says what it found: a spend deleted (with the totals
  lowered to match), a budget raised, a spend with no entry, a budget with no grant, a chained
  spend that is not in the ledger.
* A hostile text (a lone surrogate, NUL) in one entry cannot fail the others written with it.

Each tampering case runs on a copy of an untampered world that verifies (the control: the checks
are not vacuous), on SQLite and on PostgreSQL. Every check is deterministic: false-failure rate 0.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import stat
import threading
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from dpkit.errors import InvalidParameterError, LedgerError, LimitExceededError
from dpkit.server import QueryRequest, Service
from dpkit.server.audit import GENESIS, AuditEntry, canonical, load_key, verify_chain
from server._api import COUNT_SQL, PEOPLE_METADATA, write_people
from server._tamper import Backend, postgres_executor, sqlite_executor

COLUMNS = "seq, at, actor, action, dataset, status, outcome, epsilon, delta, detail, prev_hash, hash"
KEY = bytes(range(32))


def build(service: Service, people: Path) -> dict[str, str]:
    """A curator's world: one dataset, two analysts with grants, five paid queries."""
    service.register_dataset("people", people, PEOPLE_METADATA)
    keys = {}
    for name in ("alice", "bob"):
        _, keys[name] = service.create_principal(name, "analyst")
        service.grant(name, "people", epsilon=1.0, delta=1e-6, actor="curator")
    for name, n in (("alice", 3), ("bob", 2)):
        who = service.authenticate(keys[name])
        for _ in range(n):
            service.query(who, "people", QueryRequest(epsilon=0.01, sql=COUNT_SQL))
    return keys


@pytest.fixture(scope="module")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("integrity")
    people = write_people(d / "people.csv")
    with Service(f"sqlite:///{d / 'ledger.sqlite'}", audit_key=KEY) as svc:
        build(svc, people)
    return d


@pytest.fixture(params=["sqlite", "postgres"])
def world(request: pytest.FixtureRequest, sqlite_template: Path, tmp_path: Path) -> Iterator[Backend]:
    if request.param == "sqlite":
        d = tmp_path / "copy"
        shutil.copytree(sqlite_template, d)
        url = f"sqlite:///{d / 'ledger.sqlite'}"

        execute = sqlite_executor(d / "ledger.sqlite")

        yield Backend(lambda: Service(url, audit_key=KEY), execute)
        return
    pg_url = request.getfixturevalue("pg_url")
    psycopg = pytest.importorskip("psycopg")
    datasets = tmp_path / "datasets"
    with Service(pg_url, audit_key=KEY, dataset_dir=datasets) as svc:
        build(svc, write_people(tmp_path / "people.csv"))

    execute_pg = postgres_executor(psycopg, pg_url)

    yield Backend(lambda: Service(pg_url, audit_key=KEY, dataset_dir=datasets), execute_pg)


def test_untampered_world_verifies(world: Backend) -> None:
    """The control for every case below: 2 grants + 5 paid queries = 7 entries, all paying
    entries matched to spends."""
    report = world.verify()
    assert report.entries == 7
    entries = world.entries()
    assert [e.action for e in entries] == ["grant", "grant"] + ["query"] * 5
    assert sorted(e.detail["spend_id"] for e in entries if e.epsilon is not None) == [
        r[0] for r in world.execute("SELECT id FROM spends ORDER BY id", ())
    ]


def test_deleted_spend_with_lowered_totals_is_found(world: Backend) -> None:
    """Issue item 5: deleting a spend and lowering spent_* keeps the ledger self-consistent —
    only the chain still names the spend."""
    sid, eps, dlt, analyst = world.execute(
        "SELECT id, epsilon_cost, delta_cost, analyst FROM spends ORDER BY id DESC LIMIT 1", ()
    )[0]
    world.execute("DELETE FROM spends WHERE id = ?", (sid,))
    total = world.execute("SELECT epsilon_cost FROM spends WHERE analyst = ?", (analyst,))
    from fractions import Fraction

    spent = sum((Fraction(r[0]) for r in total), Fraction(0))
    world.execute(
        "UPDATE budgets SET spent_epsilon = ? WHERE analyst = ?", (f"{spent.numerator}/{spent.denominator}", analyst)
    )
    message = world.refused()
    assert f"records spend {sid}" in message and "not in the ledger" in message
    assert "chained spends add up to" in message


def test_raised_budget_is_found(world: Backend) -> None:
    world.execute("UPDATE budgets SET epsilon = '1000/1' WHERE analyst = 'alice'", ())
    message = world.refused()
    assert (
        "analyst 'alice'" in message
        and "ε=1000, δ=1e-06 in the ledger but its grant" in message
        and "says ε=1," in message
    )


def test_spend_without_entry_is_found(world: Backend) -> None:
    """What a crash between two separate transactions would have left: a spend no entry names."""
    row = world.execute(
        "SELECT dataset, analyst, event, query_text, epsilon_cost, delta_cost, created_at FROM spends ORDER BY id LIMIT 1",
        (),
    )[0]
    world.execute(
        "INSERT INTO spends (dataset, analyst, event, query_text, epsilon_cost, delta_cost, created_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
        row,
    )
    from fractions import Fraction

    spent = sum(
        (Fraction(r[0]) for r in world.execute("SELECT epsilon_cost FROM spends WHERE analyst = ?", (row[1],))),
        Fraction(0),
    )
    world.execute(
        "UPDATE budgets SET spent_epsilon = ? WHERE analyst = ?", (f"{spent.numerator}/{spent.denominator}", row[1])
    )
    assert "has no audit entry" in world.refused()
    with world.open_service() as svc:
        assert len(svc.unlogged_spends()) == 1


def test_budget_without_grant_is_found(world: Backend) -> None:
    world.execute(
        "INSERT INTO budgets (dataset, analyst, epsilon, delta, spent_epsilon, spent_delta, created_at) VALUES ('people', 'mallory', '5/1', '0/1', '0/1', '0/1', '2026-01-01T00:00:00+00:00')",
        (),
    )
    assert "analyst 'mallory' on dataset 'people' has 0 grant entries" in world.refused()


def _rechain(world: Backend, start: int, digest: Callable[[str, list[Any]], str]) -> None:
    """Rewrite entries ``start``.. with changed content, re-linking every hash with ``digest``."""
    entries = world.entries()
    prev = entries[start - 2].hash if start > 1 else GENESIS
    for e in entries[start - 1 :]:
        changed = AuditEntry(
            e.seq, e.at, e.actor, e.action, e.dataset, e.status, "rewritten", e.epsilon, e.delta, e.detail, prev, ""
        )
        h = digest(prev, changed.body())
        world.execute(
            "UPDATE audit_log SET outcome = ?, prev_hash = ?, hash = ? WHERE seq = ?", ("rewritten", prev, h, e.seq)
        )
        prev = h


@pytest.mark.parametrize("how", ["sha256", "another_key"])
def test_rechained_log_is_found_without_a_head(world: Backend, how: str) -> None:
    """Issue item 5: rewriting the chain from an entry on, re-linking every later hash, passed
    verification when the chain was plain SHA-256. Keyed, it fails at the first rewritten entry
    — no recorded head needed."""
    import hmac

    digests: dict[str, Callable[[str, list[Any]], str]] = {
        "sha256": lambda prev, body: hashlib.sha256((prev + canonical(body)).encode()).hexdigest(),
        "another_key": lambda prev, body: hmac.new(
            b"k" * 32, (prev + canonical(body)).encode(), hashlib.sha256
        ).hexdigest(),
    }
    _rechain(world, 4, digests[how])
    message = world.refused()
    assert "entry 4 does not match its keyed hash" in message


def test_rechaining_with_the_key_is_found_by_the_head(world: Backend) -> None:
    """The power check of the previous test: with the key, the same rewrite verifies on its
    own — the recorded head is what still catches it, and the message says so."""
    import hmac

    head = world.verify().head
    _rechain(world, 4, lambda prev, body: hmac.new(KEY, (prev + canonical(body)).encode(), hashlib.sha256).hexdigest())
    assert world.verify().entries == 7
    message = world.refused(head)
    assert "is not among its 7 entries" in message and "rewritten by someone holding its key" in message


def test_cut_tail_with_its_spends_is_found_by_the_head(world: Backend) -> None:
    """Deleting the last paid queries with their spends and lowering the totals leaves a
    ledger and a chain that agree — an external anchor (the head) is what catches it."""
    head = world.verify().head
    last = world.entries()[-1]
    sid = last.detail["spend_id"]
    world.execute("DELETE FROM audit_log WHERE seq = ?", (last.seq,))
    eps = world.execute("SELECT epsilon_cost FROM spends WHERE id = ?", (sid,))[0][0]
    world.execute("DELETE FROM spends WHERE id = ?", (sid,))
    from fractions import Fraction

    spent = sum(
        (Fraction(r[0]) for r in world.execute("SELECT epsilon_cost FROM spends WHERE analyst = ?", (last.actor,))),
        Fraction(0),
    )
    world.execute(
        "UPDATE budgets SET spent_epsilon = ? WHERE analyst = ?", (f"{spent.numerator}/{spent.denominator}", last.actor)
    )
    assert eps and world.verify().entries == 6
    assert "removed from its end" in world.refused(head)


# -- one transaction ------------------------------------------------------------------------------


@pytest.fixture(params=["sqlite", "postgres"])
def service(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Service]:
    url = f"sqlite:///{tmp_path / 'ledger.sqlite'}" if request.param == "sqlite" else request.getfixturevalue("pg_url")
    with Service(url, audit_key=tmp_path / "audit.key", dataset_dir=tmp_path / "datasets") as svc:
        svc.register_dataset("people", write_people(tmp_path / "people.csv"), PEOPLE_METADATA)
        yield svc


def test_a_failing_audit_write_undoes_the_debit(service: Service, monkeypatch: pytest.MonkeyPatch) -> None:
    """If the entry cannot be written, the debit is not kept either (and no answer is given)."""
    _, key = service.create_principal("alice", "analyst")
    service.grant("alice", "people", epsilon=1.0)
    who = service.authenticate(key)

    def broken(tx: Any, batch: list[dict[str, Any]]) -> Any:
        raise RuntimeError("disk full")

    monkeypatch.setattr(service, "_chain", broken)
    with pytest.raises(RuntimeError):
        service.query(who, "people", QueryRequest(epsilon=0.1, sql=COUNT_SQL))
    monkeypatch.undo()
    assert service.ledger.list_spends("people", "alice") == []
    assert service.ledger.get_budget("people", "alice").spent_epsilon == 0
    assert service.verify_log().entries == 1  # the grant only


def test_a_release_is_stored_and_a_name_taken_after_the_first_check_is_refused_before_the_debit(
    service: Service, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both databases keep a published table; a name taken between the first check and the
    reservation (a race) is refused by the reservation, before the debit: nothing is spent."""
    from dpkit.server.releases import Releases
    from dpkit.server.synthetic import SynthRequest

    _, key = service.create_principal("alice", "analyst")
    service.grant("alice", "people", epsilon=5.0, delta=1e-5)
    service.allow_publish("alice")
    who = service.authenticate(key)
    request = SynthRequest(epsilon=1.0, delta=1e-6, columns=["age", "sex"], bins={"age": 5}, rows=50, publish="p1")
    answer, _ = service.synthesize(who, "people", request)
    info, rows, report = service.release("p1")
    assert (info.dataset, info.analyst, info.rows, info.spend_id) == ("people", "alice", 50, answer["spend_id"])
    assert rows == answer["rows"] and report == answer["report"]
    assert [r.name for r in service.releases()] == ["p1"]
    plan = Releases.plan
    monkeypatch.setattr(
        Releases, "plan", lambda self, *a: replace(plan(self, a[0], "p2", *a[2:]), name="p1", folded="p1")
    )
    with pytest.raises(InvalidParameterError, match="taken"):
        service.synthesize(who, "people", request)
    monkeypatch.undo()
    assert service.ledger.get_budget("people", "alice").spent_epsilon == pytest.approx(1.0)
    assert service.release("p1")[1] == answer["rows"]  # the first release is untouched
    assert service.verify_log().entries == 4  # the grant, the publisher named, one debit, its publication


def test_a_failing_grant_entry_undoes_the_budget(service: Service, monkeypatch: pytest.MonkeyPatch) -> None:
    service.create_principal("alice", "analyst")
    monkeypatch.setattr(service, "_chain", lambda tx, batch: (_ for _ in ()).throw(RuntimeError("disk full")))
    with pytest.raises(RuntimeError):
        service.grant("alice", "people", epsilon=1.0)
    monkeypatch.undo()
    assert service.ledger.list_budgets() == []
    assert service.verify_log().entries == 0


def test_grant_above_the_maximum_is_refused(service: Service) -> None:
    """Issue item 6: a grant of ε = 1e308 was accepted. Refused now, nothing written; the
    maximum is the administrator's (power: just under it is accepted)."""
    service.create_principal("alice", "analyst")
    with pytest.raises(LimitExceededError) as info:
        service.grant("alice", "people", epsilon=1e308)
    assert info.value.setting == "max_grant_epsilon" and "at most 10" in str(info.value)
    assert service.ledger.list_budgets() == [] and service.audit_entries() == []
    assert service.grant("alice", "people", epsilon=10.0).epsilon == 10.0


def test_hostile_text_cannot_fail_the_batch(service: Service) -> None:
    """Issue item 1: a lone surrogate in one entry made the whole group-committed batch fail,
    taking other analysts' entries (and answers) with it. 8 threads append hostile entries while
    a victim's 60 paid queries run: every query is answered, every spend has its entry, the
    hostile entries are logged (made storable), and the chain verifies."""
    _, key = service.create_principal("victim", "analyst")
    service.grant("victim", "people", epsilon=10.0)
    who = service.authenticate(key)
    errors: list[BaseException] = []
    answers: list[dict[str, Any]] = []
    stop = threading.Event()

    def attack() -> None:
        while not stop.is_set():
            try:
                service.audit(
                    actor="\ud800evil",
                    action="query\x00",
                    status=400,
                    outcome="\udfff",
                    dataset="people\ud800",
                    detail={"sql": "SELECT \ud800", "\ud800": ["\x00"]},
                )
            except BaseException as exc:  # pragma: no cover - the failure this test looks for
                errors.append(exc)

    def victim() -> None:
        for _ in range(60):
            try:
                answers.append(service.query(who, "people", QueryRequest(epsilon=0.01, sql=COUNT_SQL)))
                service.audit(actor="victim", action="me", status=200, outcome="ok")
            except BaseException as exc:  # pragma: no cover
                errors.append(exc)

    attackers = [threading.Thread(target=attack) for _ in range(8)]
    v = threading.Thread(target=victim)
    for t in attackers:
        t.start()
    v.start()
    v.join()
    stop.set()
    for t in attackers:
        t.join()
    assert errors == [] and len(answers) == 60
    entries = service.audit_entries(limit=2**62)
    hostile = [e for e in entries if e.actor == "?evil"]
    assert hostile and all(e.action == "query\ufffd" and e.detail["sql"] == "SELECT ?" for e in hostile)
    assert service.unlogged_spends() == []
    assert service.verify_log().entries == len(entries)


# -- the key ------------------------------------------------------------------------------------


def test_key_file_is_created_private_and_required_later(tmp_path: Path) -> None:
    db = tmp_path / "ledger.sqlite"
    with Service(f"sqlite:///{db}") as svc:
        svc.audit(actor="curator", action="start", status=200, outcome="ok")
    key_file = tmp_path / "ledger.sqlite.audit-key"
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert len(load_key(key_file, create=False)) == 32
    key_file.rename(tmp_path / "elsewhere.key")
    with pytest.raises(LedgerError, match="key file .* is missing"):
        Service(f"sqlite:///{db}")
    with Service(f"sqlite:///{db}", audit_key=tmp_path / "elsewhere.key") as svc:
        assert svc.verify_log().entries == 1


def test_a_wrong_key_fails_verification_at_the_first_entry(tmp_path: Path) -> None:
    db = tmp_path / "ledger.sqlite"
    with Service(f"sqlite:///{db}", audit_key=KEY) as svc:
        svc.audit(actor="curator", action="start", status=200, outcome="ok")
    with (
        Service(f"sqlite:///{db}", audit_key=b"x" * 32) as svc,
        pytest.raises(LedgerError, match="entry 1 does not match its keyed hash"),
    ):
        svc.verify_log()


def test_malformed_key_file_is_refused_without_its_contents(tmp_path: Path) -> None:
    bad = tmp_path / "bad.key"
    bad.write_text("root:*:20228:0:99999:7:::\n")
    with pytest.raises(LedgerError) as info:
        Service(f"sqlite:///{tmp_path / 'ledger.sqlite'}", audit_key=bad)
    assert "20228" not in str(info.value) and "does not hold a key" in str(info.value)


def test_entries_hash_as_ascii_json() -> None:
    """Any text has one canonical encoding (no UnicodeEncodeError on lone surrogates)."""
    e = AuditEntry.new(
        1,
        GENESIS,
        KEY,
        at="t",
        actor="\ud800",
        action="a",
        dataset=None,
        status=400,
        outcome="o",
        epsilon=None,
        delta=None,
        detail={"x": "\udfff"},
    )
    assert verify_chain([e], key=KEY).entries == 1
    assert json.loads(canonical(e.body()))[1] == "t"
