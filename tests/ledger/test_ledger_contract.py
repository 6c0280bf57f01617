"""The contract every ledger backend keeps, run over each: SQLite (always) and PostgreSQL (skipped
when no server runs; see tests/_postgres.py). Tests that need a backend's own tables, files or
failure modes stay in test_sqlite_ledger.py and test_postgres_ledger.py."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from dpkit.accounting import (
    ApproxDPEvent,
    ComposedEvent,
    GaussianEvent,
    LaplaceEvent,
    PoissonSampledEvent,
    PureDPEvent,
    RandomizedResponseEvent,
    SelfComposedEvent,
)
from dpkit.errors import BudgetExceededError, InvalidParameterError, LedgerError
from dpkit.ledger import LedgerBackend, PostgresLedger, SpendRecord, SQLiteLedger
from dpkit.server.store import AUDIT_LOCK, open_store

MILLI = LaplaceEvent(noise_multiplier=1000)  # ε = 1/1000 exactly


@pytest.fixture(params=["sqlite", "postgres"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh ledger's URL: a SQLite file, or a PostgreSQL schema of the test's own."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'ledgers' / 'ledger.sqlite'}"
    return request.getfixturevalue("pg_url")


def _open(url: str) -> SQLiteLedger | PostgresLedger:
    if url.startswith("sqlite:///"):
        return SQLiteLedger(url[len("sqlite:///") :])
    return PostgresLedger(url)


@pytest.fixture
def ledger(url: str) -> Iterator[SQLiteLedger | PostgresLedger]:
    with _open(url) as led:
        led.create_budget("census", "alice", epsilon=1.0, delta=1e-6)
        yield led


# ------------------------------------------------------------------------------------------------
# budgets and debits
# ------------------------------------------------------------------------------------------------


def test_implements_the_backend_protocol(ledger: LedgerBackend) -> None:
    assert isinstance(ledger, LedgerBackend)


def test_missing_budget(ledger: LedgerBackend) -> None:
    for call in (
        lambda: ledger.get_budget("census", "bob"),
        lambda: ledger.list_spends("census", "bob"),
        lambda: ledger.debit("census", "bob", MILLI),
    ):
        with pytest.raises(LedgerError, match="no budget for analyst 'bob'"):
            call()


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"epsilon": 0.0}, "epsilon"),
        ({"epsilon": -1.0}, "epsilon"),
        ({"epsilon": float("nan")}, "epsilon"),
        ({"epsilon": float("inf")}, "epsilon"),
        ({"epsilon": True}, "epsilon"),
        ({"epsilon": 1.0, "delta": 1.0}, "delta"),
        ({"epsilon": 1.0, "delta": -1e-9}, "delta"),
        ({"epsilon": 1.0, "exist_ok": 1}, "exist_ok"),
    ],
)
def test_create_budget_rejects_bad_amounts(ledger: LedgerBackend, kwargs: dict, name: str) -> None:
    with pytest.raises(InvalidParameterError) as info:
        ledger.create_budget("census", "bob", **kwargs)
    assert info.value.name == name
    assert [b.analyst for b in ledger.list_budgets()] == ["alice"]


def test_debit_records_event_query_cost_and_time(ledger: LedgerBackend) -> None:
    event = ComposedEvent((LaplaceEvent(noise_multiplier=4), ApproxDPEvent(0.25, 1e-7)))
    spend = ledger.debit("census", "alice", event, "SELECT COUNT(*) FROM people")
    assert isinstance(spend, SpendRecord)
    assert (spend.epsilon_cost, spend.delta_cost, spend.query_text) == (0.5, 1e-7, "SELECT COUNT(*) FROM people")
    (stored,) = ledger.list_spends("census", "alice")
    assert stored == spend and stored.event == event
    assert stored.created_at >= ledger.get_budget("census", "alice").created_at
    record = ledger.get_budget("census", "alice")
    assert (record.spent_epsilon, record.spent_delta, record.remaining_epsilon) == (0.5, 1e-7, 0.5)
    assert record.neighbours == "add_remove"
    ledger.verify()


def test_costs_follow_basic_composition(ledger: LedgerBackend) -> None:
    ledger.debit("census", "alice", SelfComposedEvent(LaplaceEvent(noise_multiplier=10), 3))
    ledger.debit("census", "alice", PureDPEvent(0.125))
    ledger.debit("census", "alice", ApproxDPEvent(0.125, 2.5e-7))
    assert [s.epsilon_cost for s in ledger.list_spends("census", "alice")] == [
        0.3,
        0.125,
        0.125,
    ]  # 3/10 shown as written
    record = ledger.get_budget("census", "alice")
    assert record.spent_epsilon == 0.55  # exactly 11/20, shown at its decimal value
    assert record.spent_delta == 2.5e-7


def test_sums_are_exact(ledger: LedgerBackend) -> None:
    ledger.create_budget("d", "exact", epsilon=1.0)
    ledger.create_budget("d", "decimal", epsilon=1.0)
    for _ in range(10):
        ledger.debit("d", "exact", LaplaceEvent(noise_multiplier=10))  # 1/10 exactly: 10 fit
    # ε = 0.1 is read at its decimal value 1/10 (not the double's 0.1000000000000000055...):
    # ten fit exactly and the eleventh, however small, is refused.
    for _ in range(10):
        ledger.debit("d", "decimal", PureDPEvent(0.1))
    with pytest.raises(BudgetExceededError):
        ledger.debit("d", "decimal", PureDPEvent(1e-300))
    for who in ("exact", "decimal"):
        record = ledger.get_budget("d", who)
        assert (record.spent_epsilon, record.remaining_epsilon) == (1.0, 0.0)
    # A decimal above its double is charged in full and shown as written: 3 × 0.3 = 9/10 exactly.
    ledger.create_budget("d", "above", epsilon=0.9)
    spend = ledger.debit("d", "above", PureDPEvent(0.3))
    for _ in range(2):
        ledger.debit("d", "above", PureDPEvent(0.3))
    with pytest.raises(BudgetExceededError):
        ledger.debit("d", "above", PureDPEvent(1e-300))
    record = ledger.get_budget("d", "above")
    assert (spend.epsilon_cost, record.epsilon, record.spent_epsilon) == (0.3, 0.9, 0.9)
    ledger.verify()


def test_pure_budget_refuses_any_delta(ledger: LedgerBackend) -> None:
    ledger.create_budget("d", "a", epsilon=10.0)
    with pytest.raises(BudgetExceededError):
        ledger.debit("d", "a", ApproxDPEvent(0.1, 1e-12))
    assert ledger.list_spends("d", "a") == []


@pytest.mark.parametrize(
    "event",
    [
        GaussianEvent(2.0),
        PoissonSampledEvent(0.1, LaplaceEvent(noise_multiplier=1)),
        ComposedEvent((MILLI, GaussianEvent(1.0))),
    ],
)
def test_gaussian_and_sampled_events_need_an_explicit_cost(ledger: LedgerBackend, event) -> None:
    with pytest.raises(InvalidParameterError, match="RDPAccountant") as info:
        ledger.debit("census", "alice", event)
    assert info.value.name == "event"
    assert ledger.list_spends("census", "alice") == []
    # priced elsewhere (e.g. by an RDP accountant), the caller passes the (ε, δ) to debit
    spend = ledger.debit("census", "alice", event, epsilon_cost=0.5, delta_cost=1e-7)
    assert (spend.epsilon_cost, spend.delta_cost, spend.event) == (0.5, 1e-7, event)
    assert ledger.list_spends("census", "alice") == [spend]


def test_one_neighbour_relation_per_budget(ledger: LedgerBackend) -> None:
    ledger.debit("census", "alice", MILLI)  # add_remove: fixed by the first debit
    with pytest.raises(InvalidParameterError, match="neighbour"):
        ledger.debit("census", "alice", RandomizedResponseEvent(p_truth=0.75))  # replace
    with pytest.raises(InvalidParameterError, match="neighbour"):
        ledger.debit("census", "alice", ComposedEvent((MILLI, PureDPEvent(0.1, neighbours="replace"))))
    assert len(ledger.list_spends("census", "alice")) == 1
    assert ledger.get_budget("census", "alice").neighbours == "add_remove"


# ------------------------------------------------------------------------------------------------
# the hooks that run inside the ledger's transactions
# ------------------------------------------------------------------------------------------------


def test_on_debit_and_on_create_write_in_the_same_transaction(ledger: LedgerBackend) -> None:
    seen: list[tuple[str, object]] = []
    ledger.create_budget("d", "a", epsilon=1.0, on_create=lambda tx, facts: seen.append((tx.dialect, facts.epsilon)))
    spend = ledger.debit(
        "d", "a", MILLI, "q", on_debit=lambda tx, facts: seen.append(("debit", (facts.spend_id, tx.run("SELECT 1"))))
    )
    assert seen[0][1] == 1 and seen[0][0] in ("sqlite", "postgres")
    assert seen[1] == ("debit", (spend.id, [(1,)]))

    def refuse(tx, facts) -> None:
        raise RuntimeError("the caller's own write failed")

    with pytest.raises(RuntimeError):
        ledger.debit("d", "a", MILLI, "never kept", on_debit=refuse)
    assert [s.query_text for s in ledger.list_spends("d", "a")] == ["q"]
    assert ledger.get_budget("d", "a").spent_epsilon == 0.001
    ledger.verify()


# ------------------------------------------------------------------------------------------------
# races: every driver serialises the debits of one budget
# ------------------------------------------------------------------------------------------------


def test_threads_sharing_one_ledger_spend_exactly_the_budget(url: str) -> None:
    with _open(url) as ledger:
        ledger.create_budget("d", "a", epsilon=0.05)
        errors: list[BaseException] = []

        def spend() -> None:
            for _ in range(10):
                try:
                    ledger.debit("d", "a", MILLI)
                except BudgetExceededError:
                    pass
                except BaseException as exc:  # noqa: BLE001 - reported to the test
                    errors.append(exc)

        threads = [threading.Thread(target=spend) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not errors and not any(t.is_alive() for t in threads)
        assert len(ledger.list_spends("d", "a")) == 50
        assert ledger.get_budget("d", "a").remaining_epsilon == 0.0
        ledger.verify()


# ------------------------------------------------------------------------------------------------
# the service's tables, on the same drivers
# ------------------------------------------------------------------------------------------------


def test_service_store_reads_writes_and_closes(url: str) -> None:
    with _open(url) as ledger:
        store = open_store(url, timeout=5.0, lock=getattr(ledger, "write_lock", None))
        try:
            with store.transaction(write=True) as tx:
                tx.run("INSERT INTO principals (name, role, created_at) VALUES (?, ?, ?)", ("ann", "curator", "t"))
            with pytest.raises(RuntimeError), store.transaction(write=True) as tx:
                tx.run("INSERT INTO principals (name, role, created_at) VALUES (?, ?, ?)", ("bob", "analyst", "t"))
                raise RuntimeError("rolled back")
            with store.transaction(audit=True) as tx:
                if tx.dialect == "postgres":
                    tx.run("SELECT pg_advisory_xact_lock(?)", (AUDIT_LOCK,))  # re-entrant within the transaction
                assert tx.run("SELECT name FROM principals ORDER BY name") == [("ann",)]
            with pytest.raises(LedgerError, match="service database"), store.transaction() as tx:
                tx.run("SELECT * FROM no_such_table")
            # Opening again finds the tables and their version.
            open_store(url, timeout=5.0, lock=getattr(ledger, "write_lock", None)).close()
        finally:
            store.close()
        with pytest.raises(LedgerError), store.transaction() as tx:
            tx.run("SELECT 1")
