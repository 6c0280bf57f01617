"""The SQLite ledger: exact, atomic check-and-debit across threads and processes, crash
consistency, and refusal to touch anything that is not a valid dpkit ledger."""

from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from fractions import Fraction
from pathlib import Path

import pytest

import dpkit.ledger.sqlite as sqlite_ledger
from dpkit.accounting import (
    ApproxDPEvent,
    LaplaceEvent,
    PureDPEvent,
    SelfComposedEvent,
)
from dpkit.errors import BudgetExceededError, InvalidParameterError, LedgerError
from dpkit.ledger import DEFAULT_LEDGER_PATH, BudgetRecord, SQLiteLedger, open_ledger

WORKER = Path(__file__).with_name("_ledger_worker.py")
MILLI = LaplaceEvent(noise_multiplier=1000)  # ε = 1/1000 exactly


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "ledgers" / "ledger.sqlite"


@pytest.fixture
def ledger(path: Path):
    with SQLiteLedger(path) as led:
        led.create_budget("census", "alice", epsilon=1.0, delta=1e-6)
        yield led


def _db_rows(path: Path, sql: str) -> list[tuple]:
    con = sqlite3.connect(path)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


def _db_spent(path: Path) -> tuple[Fraction, Fraction, list[Fraction]]:
    """(spent ε, spent δ, costs of all spends) of census/alice, read straight from the file."""
    ((s_eps, s_dlt),) = _db_rows(
        path, "SELECT spent_epsilon, spent_delta FROM budgets WHERE dataset='census' AND analyst='alice'"
    )
    costs = [Fraction(c) for (c,) in _db_rows(path, "SELECT epsilon_cost FROM spends ORDER BY id")]
    return Fraction(s_eps), Fraction(s_dlt), costs


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    src = str(Path(__file__).resolve().parents[2] / "src")
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _spawn(*args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(WORKER), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_child_env(),
    )


def _wait_for(path: Path, proc: subprocess.Popen, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None:
            raise AssertionError(f"worker exited early: {proc.communicate()}")
        assert time.monotonic() < deadline, f"timed out waiting for {path}"
        time.sleep(0.005)


# ------------------------------------------------------------------------------------------------
# budgets and debits
# ------------------------------------------------------------------------------------------------


def test_create_and_get_budget(ledger: SQLiteLedger, path: Path) -> None:
    record = ledger.get_budget("census", "alice")
    assert isinstance(record, BudgetRecord)
    assert (record.dataset, record.analyst, record.epsilon, record.delta) == ("census", "alice", 1.0, 1e-6)
    assert (record.spent_epsilon, record.spent_delta, record.remaining_epsilon, record.neighbours) == (
        0.0,
        0.0,
        1.0,
        None,
    )
    assert record.created_at.tzinfo is not None
    assert ledger.path == path.absolute()
    # stored exactly, as fractions
    assert _db_rows(path, "SELECT epsilon, delta FROM budgets") == [
        ("1/1", f"{Fraction(1e-6).numerator}/{Fraction(1e-6).denominator}")
    ]


def test_existing_budget_is_never_changed(ledger: SQLiteLedger) -> None:
    with pytest.raises(LedgerError, match="already exists"):
        ledger.create_budget("census", "alice", epsilon=1.0, delta=1e-6)
    assert ledger.create_budget("census", "alice", epsilon=1.0, delta=1e-6, exist_ok=True).epsilon == 1.0
    with pytest.raises(LedgerError, match="never changed"):
        ledger.create_budget("census", "alice", epsilon=5.0, delta=1e-6, exist_ok=True)
    assert ledger.get_budget("census", "alice").epsilon == 1.0
    # not even through SQL
    con = sqlite3.connect(ledger.path)
    with pytest.raises(sqlite3.DatabaseError, match="cannot change"):
        con.execute("UPDATE budgets SET epsilon = '5/1'")
    with pytest.raises(sqlite3.DatabaseError, match="cannot be deleted"):
        con.execute("DELETE FROM budgets")
    con.close()


def test_refused_debit_writes_nothing(ledger: SQLiteLedger, path: Path) -> None:
    ledger.debit("census", "alice", LaplaceEvent(noise_multiplier=2))
    before = _db_rows(path, "SELECT * FROM spends"), _db_rows(path, "SELECT * FROM budgets")
    with pytest.raises(BudgetExceededError) as info:
        ledger.debit("census", "alice", PureDPEvent(0.75), "too much")
    message = str(info.value)
    assert "ε=0.75" in message and "ε=0.5" in message and "alice" in message
    with pytest.raises(BudgetExceededError, match="δ"):
        ledger.debit("census", "alice", ApproxDPEvent(0.1, 2e-6))
    assert (_db_rows(path, "SELECT * FROM spends"), _db_rows(path, "SELECT * FROM budgets")) == before
    ledger.debit("census", "alice", PureDPEvent(0.5))  # exactly the rest is fine
    assert ledger.get_budget("census", "alice").remaining_epsilon == 0.0


@pytest.mark.parametrize(
    ("args", "kwargs", "name"),
    [
        (("census", "alice", 0.1), {}, "event"),
        (("census", "alice", "LaplaceEvent"), {}, "event"),
        (("census", "alice", None), {}, "event"),
        (("", "alice", MILLI), {}, "dataset"),
        (("census", 7, MILLI), {}, "analyst"),
        (("census", "alice", MILLI, b"q"), {}, "query_text"),
        (("census", "alice", MILLI), {"epsilon_cost": 0.1}, "delta_cost"),
        (("census", "alice", MILLI), {"epsilon_cost": -0.1, "delta_cost": 0.0}, "epsilon_cost"),
        (("census", "alice", MILLI), {"epsilon_cost": float("nan"), "delta_cost": 0.0}, "epsilon_cost"),
        (("census", "alice", MILLI), {"epsilon_cost": float("-inf"), "delta_cost": 0.0}, "epsilon_cost"),
        (("census", "alice", MILLI), {"epsilon_cost": 0.1, "delta_cost": -1e-9}, "delta_cost"),
    ],
)
def test_bad_debits_are_rejected_and_write_nothing(ledger: SQLiteLedger, path: Path, args, kwargs, name) -> None:
    with pytest.raises(InvalidParameterError) as info:
        ledger.debit(*args, **kwargs)
    assert info.value.name == name
    assert _db_rows(path, "SELECT COUNT(*) FROM spends") == [(0,)]
    assert ledger.get_budget("census", "alice").spent_epsilon == 0.0


def test_tampered_events_cannot_be_negative_spends(ledger: SQLiteLedger) -> None:
    event = PureDPEvent(0.5)
    object.__setattr__(event, "epsilon", -0.5)  # forced past the frozen dataclass
    with pytest.raises(InvalidParameterError):
        ledger.debit("census", "alice", event)
    repeated = SelfComposedEvent(MILLI, 2)
    object.__setattr__(repeated, "count", -3)
    with pytest.raises(InvalidParameterError):
        ledger.debit("census", "alice", repeated)
    assert ledger.get_budget("census", "alice").spent_epsilon == 0.0


def test_persists_across_reopen_and_lists_budgets(path: Path) -> None:
    with SQLiteLedger(path) as ledger:
        ledger.create_budget("b-data", "zoe", epsilon=2.0)
        ledger.create_budget("a-data", "yann", epsilon=3.0)
        ledger.debit("a-data", "yann", LaplaceEvent(noise_multiplier=2), "q1")
    with pytest.raises(LedgerError, match="closed"):
        ledger.get_budget("a-data", "yann")
    with SQLiteLedger(path) as again:
        assert [(b.dataset, b.analyst, b.spent_epsilon) for b in again.list_budgets()] == [
            ("a-data", "yann", 0.5),
            ("b-data", "zoe", 0.0),
        ]
        assert [s.query_text for s in again.list_spends("a-data", "yann")] == ["q1"]
        again.verify()


def test_open_ledger_default_path_is_under_the_current_directory(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    ledger = open_ledger()
    try:
        assert ledger.path == (tmp_path / DEFAULT_LEDGER_PATH).absolute()
        assert (tmp_path / ".dpkit" / "ledger.sqlite").is_file()
    finally:
        ledger.close()
    nested = tmp_path / "a" / "b" / "c" / "l.sqlite"
    open_ledger(nested).close()
    assert nested.is_file()
    assert not [p for p in nested.parent.iterdir() if p.name != "l.sqlite"]  # no temporary files left


def test_creation_without_hard_links_falls_back_to_an_exclusive_copy(tmp_path: Path, monkeypatch) -> None:
    def no_links(*args, **kwargs):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_links)
    target = tmp_path / "fat" / "ledger.sqlite"
    with SQLiteLedger(target) as ledger:
        ledger.create_budget("d", "a", epsilon=1.0)
        ledger.debit("d", "a", MILLI)
        ledger.verify()
    assert sorted(p.name for p in target.parent.iterdir()) == [
        "ledger.sqlite",
        "ledger.sqlite.write-lock",
    ]  # the file and its writer queue


def test_spends_are_append_only(ledger: SQLiteLedger) -> None:
    ledger.debit("census", "alice", MILLI)
    con = sqlite3.connect(ledger.path)
    with pytest.raises(sqlite3.DatabaseError, match="append-only"):
        con.execute("DELETE FROM spends")
    with pytest.raises(sqlite3.DatabaseError, match="append-only"):
        con.execute("UPDATE spends SET epsilon_cost = '0/1'")
    con.close()


def test_verify_detects_totals_that_disagree_with_spends(ledger: SQLiteLedger) -> None:
    ledger.debit("census", "alice", MILLI)
    ledger.verify()
    con = sqlite3.connect(ledger.path)
    con.execute("UPDATE budgets SET spent_epsilon = '0/1'")
    con.commit()
    con.close()
    with pytest.raises(LedgerError, match="differ from the sum of its spends"):
        ledger.verify()


# ------------------------------------------------------------------------------------------------
# files that are not valid dpkit ledgers
# ------------------------------------------------------------------------------------------------


def _real_ledger_bytes(tmp_path: Path) -> bytes:
    source = tmp_path / "source" / "ledger.sqlite"
    with SQLiteLedger(source) as ledger:
        ledger.create_budget("census", "alice", epsilon=1.0)
        for i in range(50):
            ledger.debit("census", "alice", MILLI, f"query {i} " + "x" * 200)
    return source.read_bytes()


def _corruptions(tmp_path: Path) -> dict[str, bytes]:
    real = _real_ledger_bytes(tmp_path)
    assert len(real) >= 8 * 4096
    zeroed = bytearray(real)
    zeroed[3 * 4096 : 4 * 4096] = bytes(4096)  # a whole b-tree page wiped
    foreign = tmp_path / "foreign.sqlite"
    con = sqlite3.connect(foreign)
    con.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)")
    con.execute("INSERT INTO users (name) VALUES ('ada')")
    con.commit()
    con.close()
    impostor = tmp_path / "impostor.sqlite"  # our application_id, but not our tables
    con = sqlite3.connect(impostor)
    con.execute(f"PRAGMA application_id = {sqlite_ledger.APPLICATION_ID}")
    con.execute("CREATE TABLE budgets (x)")
    con.commit()
    con.close()
    rng = random.Random(1)
    return {
        "random bytes": bytes(rng.getrandbits(8) for _ in range(20000)),
        "text": b"dataset,analyst,epsilon\ncensus,alice,1.0\n",
        "empty": b"",
        "header only": real[:100],
        "truncated 1000": real[:1000],
        "truncated half": real[: len(real) // 2],
        "truncated last page": real[:-4096],
        "truncated one byte": real[:-1],
        "zeroed page": bytes(zeroed),
        "foreign sqlite": foreign.read_bytes(),
        "impostor sqlite": impostor.read_bytes(),
    }


def test_corrupt_truncated_or_foreign_files_are_refused_and_left_unchanged(tmp_path: Path) -> None:
    for name, content in _corruptions(tmp_path).items():
        target = tmp_path / "victims" / name.replace(" ", "_") / "ledger.sqlite"
        target.parent.mkdir(parents=True)
        target.write_bytes(content)
        with pytest.raises(LedgerError) as info:
            SQLiteLedger(target)
        assert str(target) in str(info.value), name
        assert target.read_bytes() == content, f"{name}: the file was changed"
        assert sorted(p.name for p in target.parent.iterdir()) == ["ledger.sqlite"], name
        with pytest.raises(LedgerError):
            open_ledger(target)  # and it stays refused
        assert target.read_bytes() == content, f"{name}: the file was changed"


def test_newer_schema_version_is_refused(path: Path) -> None:
    SQLiteLedger(path).close()
    con = sqlite3.connect(path)
    con.execute("UPDATE dpkit_schema SET version = 99")
    con.commit()
    con.close()
    content = path.read_bytes()
    with pytest.raises(LedgerError, match="version 99"):
        SQLiteLedger(path)
    assert path.read_bytes() == content


def test_directory_at_the_path_is_refused(tmp_path: Path) -> None:
    (tmp_path / "ledger.sqlite").mkdir()
    with pytest.raises(LedgerError, match="directory"):
        SQLiteLedger(tmp_path / "ledger.sqlite")


def test_unreadable_file_is_a_ledger_error(path: Path, monkeypatch) -> None:
    SQLiteLedger(path).close()

    def denied(*args, **kwargs):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(sqlite_ledger, "open", denied, raising=False)
    with pytest.raises(LedgerError, match="Permission denied") as info:
        SQLiteLedger(path)
    assert str(path) in str(info.value)


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root reads any file")
def test_file_without_read_permission_is_a_ledger_error(path: Path) -> None:  # pragma: no cover - not as root
    SQLiteLedger(path).close()
    path.chmod(0)
    try:
        with pytest.raises(LedgerError, match="Permission denied"):
            SQLiteLedger(path)
    finally:
        path.chmod(0o600)


def test_bad_constructor_arguments(tmp_path: Path) -> None:
    with pytest.raises(InvalidParameterError):
        SQLiteLedger(42)  # type: ignore[arg-type]
    with pytest.raises(InvalidParameterError):
        SQLiteLedger("")
    with pytest.raises(InvalidParameterError):
        SQLiteLedger(tmp_path / "l.sqlite", timeout=-1)


# ------------------------------------------------------------------------------------------------
# concurrency and crashes
# ------------------------------------------------------------------------------------------------


def test_threads_sharing_one_ledger_never_overshoot(tmp_path: Path) -> None:
    with SQLiteLedger(tmp_path / "l.sqlite") as ledger:
        ledger.create_budget("d", "a", epsilon=0.25)
        results: list[bool] = []

        def work() -> None:
            for _ in range(100):
                try:
                    ledger.debit("d", "a", MILLI)
                    results.append(True)
                except BudgetExceededError:
                    results.append(False)

        threads = [threading.Thread(target=work) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert results.count(True) == 250 and len(results) == 400
        assert ledger.get_budget("d", "a").spent_epsilon == 0.25
        ledger.verify()


def test_processes_debiting_concurrently_spend_exactly_the_budget(path: Path, tmp_path: Path) -> None:
    """8 processes × 500 debits of ε = 1/1000 against ε = 1: exactly 1000 accepted, the sum of the
    accepted costs is exactly 1, read back from the file."""
    with SQLiteLedger(path) as ledger:
        ledger.create_budget("census", "alice", epsilon=1.0)
    go = tmp_path / "go"
    ready = [tmp_path / f"ready-{i}" for i in range(8)]
    procs = [_spawn("debit", str(path), "500", str(r), str(go)) for r in ready]
    try:
        for r, proc in zip(ready, procs, strict=True):
            _wait_for(r, proc)
        go.touch()  # all at once
        outputs = [proc.communicate(timeout=120) for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    for proc, (_, err) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, err
    counts = [json.loads(out) for out, _ in outputs]
    assert sum(c["ok"] for c in counts) == 1000
    assert sum(c["refused"] for c in counts) == 3000
    spent_eps, spent_dlt, costs = _db_spent(path)
    assert len(costs) == 1000 and sum(costs) == 1 and spent_eps == 1 and spent_dlt == 0
    assert _db_rows(path, "PRAGMA integrity_check") == [("ok",)]
    with SQLiteLedger(path) as ledger:
        ledger.verify()
        assert ledger.get_budget("census", "alice").remaining_epsilon == 0.0


def test_processes_creating_the_same_ledger_at_once(path: Path, tmp_path: Path) -> None:
    go = tmp_path / "go"
    ready = [tmp_path / f"ready-{i}" for i in range(4)]
    procs = [_spawn("create", str(path), str(r), str(go)) for r in ready]
    try:
        for r, proc in zip(ready, procs, strict=True):
            _wait_for(r, proc)
        go.touch()
        outputs = [proc.communicate(timeout=60) for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    assert [proc.returncode for proc in procs] == [0] * 4, [err for _, err in outputs]
    with SQLiteLedger(path) as ledger:
        assert len(ledger.list_budgets()) == 1
        ledger.verify()
    assert sorted(p.name for p in path.parent.iterdir() if "creating" in p.name) == []


def _kill(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=30)


def test_process_killed_inside_the_debit_transaction_leaves_nothing(path: Path, tmp_path: Path) -> None:
    with SQLiteLedger(path) as ledger:
        ledger.create_budget("census", "alice", epsilon=1.0)
        ledger.debit("census", "alice", MILLI, "before")
    marker = tmp_path / "inside-transaction"
    proc = _spawn("hang", str(path), str(marker))
    try:
        _wait_for(marker, proc)  # the spend row is inserted, the totals are not yet updated
        # While the child holds the write lock, others wait (and a short timeout gives up cleanly).
        with (
            SQLiteLedger(path, timeout=0.2) as impatient,
            pytest.raises(LedgerError, match="another process held the ledger"),
        ):
            impatient.debit("census", "alice", MILLI)
    finally:
        _kill(proc)
    assert proc.returncode == -signal.SIGKILL
    with SQLiteLedger(path) as ledger:
        ledger.verify()
        assert [s.query_text for s in ledger.list_spends("census", "alice")] == ["before"]
        assert ledger.get_budget("census", "alice").spent_epsilon == 0.001
        ledger.debit("census", "alice", MILLI, "after")  # the ledger still works
        assert [s.query_text for s in ledger.list_spends("census", "alice")] == ["before", "after"]
    spent_eps, _, costs = _db_spent(path)
    assert spent_eps == sum(costs) == Fraction(2, 1000)


def test_process_killed_at_random_moments_leaves_whole_debits(path: Path, tmp_path: Path) -> None:
    with SQLiteLedger(path) as ledger:
        ledger.create_budget("census", "alice", epsilon=1.0)
    rng = random.Random(7)
    for round_ in range(3):
        marker = tmp_path / f"streaming-{round_}"
        proc = _spawn("stream", str(path), str(marker))
        try:
            _wait_for(marker, proc)
            time.sleep(rng.uniform(0.01, 0.2))
        finally:
            _kill(proc)
        with SQLiteLedger(path) as ledger:
            ledger.verify()
        spent_eps, _, costs = _db_spent(path)
        assert spent_eps == sum(costs) == Fraction(len(costs), 10**6)
        assert len(costs) >= round_ + 1


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
def test_a_forked_child_uses_its_own_connection(ledger: SQLiteLedger) -> None:
    ledger.debit("census", "alice", MILLI, "parent before")
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        code = 1
        try:
            ledger.debit("census", "alice", MILLI, "child")
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    ledger.debit("census", "alice", MILLI, "parent after")
    assert [s.query_text for s in ledger.list_spends("census", "alice")] == ["parent before", "child", "parent after"]
    ledger.verify()
