"""The PostgreSQL ledger: the SQLite ledger's semantics (exact, atomic check-and-debit, append-only
records, refusal of anything that is not a dpkit ledger) with row locks across threads and
processes, crash consistency from PostgreSQL transactions, and masked passwords.

Tests needing the server are skipped when none runs (see tests/_postgres.py); each gets a schema
of its own, so they run in parallel under pytest-xdist."""

from __future__ import annotations

import multiprocessing
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest

import dpkit.ledger.postgres as postgres_ledger
from _postgres import fresh_schema_url, postgres_url, with_search_path
from dpkit.accounting import (
    ApproxDPEvent,
    LaplaceEvent,
    PureDPEvent,
)
from dpkit.errors import BudgetExceededError, InvalidParameterError, LedgerError
from dpkit.ledger import BudgetRecord, PostgresLedger, SQLiteLedger, open_ledger
from dpkit.ledger._postgres_driver import mask_url

MILLI = LaplaceEvent(noise_multiplier=1000)  # ε = 1/1000 exactly
UNIT = LaplaceEvent(noise_multiplier=1024)  # ε = 1/1024: k of them fill the budget k / 1024, a double exactly
FORK = multiprocessing.get_context("fork") if hasattr(os, "fork") else None
needs_fork = pytest.mark.skipif(FORK is None, reason="needs fork()")


@pytest.fixture
def ledger(pg_url: str):
    with PostgresLedger(pg_url) as led:
        led.create_budget("census", "alice", epsilon=1.0, delta=1e-6)
        yield led


def _sql(url: str, query: str, params: tuple = ()) -> list[tuple]:
    """Run one statement outside the ledger (autocommit) and return its rows, if any."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        cur = conn.execute(query, params)  # type: ignore[arg-type]
        return cur.fetchall() if cur.description else []


def _db_spent(url: str, analyst: str = "alice") -> tuple[Fraction, Fraction, list[Fraction]]:
    """(spent ε, spent δ, costs of its spends) of census/``analyst``, read straight from the tables."""
    ((s_eps, s_dlt),) = _sql(
        url, "SELECT spent_epsilon, spent_delta FROM budgets WHERE dataset = 'census' AND analyst = %s", (analyst,)
    )
    costs = [
        Fraction(c) for (c,) in _sql(url, "SELECT epsilon_cost FROM spends WHERE analyst = %s ORDER BY id", (analyst,))
    ]
    return Fraction(s_eps), Fraction(s_dlt), costs


def _with_password(url: str, password: str) -> str:
    scheme, rest = url.split("://", 1)
    userinfo, at, host = rest.partition("@")
    assert at, "the test URL names a user"
    return f"{scheme}://{userinfo.split(':', 1)[0]}:{password}@{host}"


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_threads(targets: list[Callable[[], Any]]) -> list[BaseException]:
    """Start the targets together, join them, and return what they raised."""
    errors: list[BaseException] = []

    def guarded(target: Callable[[], Any]) -> None:
        try:
            target()
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            errors.append(exc)

    threads = [threading.Thread(target=guarded, args=(t,)) for t in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads), "threads hung"
    return errors


# ------------------------------------------------------------------------------------------------
# without a server
# ------------------------------------------------------------------------------------------------


def test_importing_needs_no_psycopg_until_a_ledger_is_opened() -> None:
    code = (
        "import sys; sys.modules['psycopg'] = None\n"
        "from dpkit.ledger import PostgresLedger, open_ledger\n"
        "from dpkit.errors import LedgerError\n"
        "try:\n"
        "    open_ledger('postgresql://u@127.0.0.1:1/db')\n"
        "except LedgerError as exc:\n"
        "    print(exc)\n"
    )
    env = dict(os.environ)
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2] / "src") + os.pathsep + env.get("PYTHONPATH", "")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "pip install 'dpkit[postgres]'" in out.stdout


def test_mask_url() -> None:
    assert mask_url("postgresql://alice:s3cret@db:5432/ledger") == "postgresql://alice:***@db:5432/ledger"
    assert mask_url("postgres://alice:p%40ss@db/x?sslmode=require") == "postgres://alice:***@db/x?sslmode=require"
    assert (
        mask_url("postgresql://db/x?user=a&password=s3cret&sslmode=require")
        == "postgresql://db/x?user=a&password=***&sslmode=require"
    )
    assert mask_url("postgresql://alice:pa/ss@db/x") == "postgresql://alice:***@db/x"
    assert mask_url("postgresql://db/x?sslpassword=s3cret") == "postgresql://db/x?sslpassword=***"
    assert mask_url("postgresql://alice@db/x") == "postgresql://alice@db/x"
    assert mask_url("postgresql://db:5432/x") == "postgresql://db:5432/x"
    assert mask_url("host=db password='a b' user=x") == "host=db password=*** user=x"


@pytest.mark.parametrize(
    ("args", "kwargs", "name"),
    [
        ((42,), {}, "url"),
        (("",), {}, "url"),
        (("ledger.sqlite",), {}, "url"),
        (("mysql://u:s3cret@h/db",), {}, "url"),
        (("postgresql://h/db\x00",), {}, "url"),
        (("postgresql://h/db",), {"timeout": -1}, "timeout"),
        (("postgresql://h/db",), {"timeout": float("nan")}, "timeout"),
        (("postgresql://h/db",), {"timeout": True}, "timeout"),
    ],
)
def test_bad_constructor_arguments(args: tuple, kwargs: dict, name: str) -> None:
    with pytest.raises(InvalidParameterError) as info:
        PostgresLedger(*args, **kwargs)
    assert info.value.name == name
    assert "s3cret" not in str(info.value)


def test_url_libpq_cannot_parse_is_an_invalid_parameter() -> None:
    pytest.importorskip("psycopg")
    with pytest.raises(InvalidParameterError, match="no_such_option") as info:
        PostgresLedger("postgresql://u:s3cret@127.0.0.1:1/db?no_such_option=1")
    assert info.value.name == "url" and "s3cret" not in str(info.value)


def test_unreachable_server_is_a_quick_ledger_error_with_a_masked_url() -> None:
    pytest.importorskip("psycopg")
    port = _closed_port()
    start = time.monotonic()
    with pytest.raises(LedgerError) as info:
        PostgresLedger(f"postgresql://dpkit:s3cret@127.0.0.1:{port}/dpkit_test", timeout=1)
    assert time.monotonic() - start < 10
    message = str(info.value)
    assert f"could not open the ledger in postgresql://dpkit:***@127.0.0.1:{port}/dpkit_test" in message
    assert "s3cret" not in message and "s3cret" not in str(info.value.__cause__)


# ------------------------------------------------------------------------------------------------
# open_ledger
# ------------------------------------------------------------------------------------------------


def test_open_ledger_sqlite_urls(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    with open_ledger("sqlite:///rel/ledger.sqlite") as ledger:  # three slashes: relative
        assert isinstance(ledger, SQLiteLedger)
        assert ledger.path == (tmp_path / "rel" / "ledger.sqlite").absolute()
    absolute = (tmp_path / "abs" / "ledger.sqlite").absolute()
    with open_ledger(f"sqlite:///{absolute.as_posix()}") as ledger:  # four slashes: absolute
        assert ledger.path == absolute
    with open_ledger(f"SQLite:///{absolute.as_posix()}") as ledger:
        assert ledger.path == absolute
    with open_ledger(tmp_path / "plain.sqlite") as ledger:  # paths as before
        assert ledger.path == tmp_path / "plain.sqlite"


@pytest.mark.parametrize(
    "value",
    [
        "sqlite://",
        "sqlite:///",
        "sqlite://host/ledger.sqlite",
        "sqlite:///ledger.sqlite?mode=ro",
        "mysql://u:s3cret@h/db",
        "http://example.org/x",
    ],
)
def test_open_ledger_refuses_other_urls(value: str, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InvalidParameterError, match="a path, sqlite:///PATH or postgresql://") as info:
        open_ledger(value)
    assert info.value.name == "ledger" and "s3cret" not in str(info.value)
    assert list(tmp_path.iterdir()) == []


def test_open_ledger_postgres_urls(pg_url: str) -> None:
    for url in (
        pg_url,
        pg_url.replace("postgresql://", "postgres://", 1),
        pg_url.replace("postgresql://", "PostgreSQL://", 1),
    ):
        with open_ledger(url, timeout=5) as ledger:
            assert isinstance(ledger, PostgresLedger)
            ledger.create_budget("census", "alice", epsilon=1.0, exist_ok=True)
    assert len(_sql(pg_url, "SELECT * FROM budgets")) == 1


# ------------------------------------------------------------------------------------------------
# budgets and debits
# ------------------------------------------------------------------------------------------------


def test_create_and_get_budget(ledger: PostgresLedger, pg_url: str) -> None:
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
    assert ledger.schema == pg_url.rsplit("%3D", 1)[1]
    # stored exactly, as fractions
    tiny = Fraction(1e-6)
    assert _sql(pg_url, "SELECT epsilon, delta FROM budgets") == [("1/1", f"{tiny.numerator}/{tiny.denominator}")]
    assert _sql(pg_url, "SELECT application, version FROM dpkit_schema") == [("dpkit-ledger", 1)]


def test_existing_budget_is_never_changed(ledger: PostgresLedger, pg_url: str) -> None:
    import psycopg

    with pytest.raises(LedgerError, match="already exists"):
        ledger.create_budget("census", "alice", epsilon=1.0, delta=1e-6)
    assert ledger.create_budget("census", "alice", epsilon=1.0, delta=1e-6, exist_ok=True).epsilon == 1.0
    with pytest.raises(LedgerError, match="never changed"):
        ledger.create_budget("census", "alice", epsilon=5.0, delta=1e-6, exist_ok=True)
    assert ledger.get_budget("census", "alice").epsilon == 1.0
    # not even through SQL
    for statement, message in [
        ("UPDATE budgets SET epsilon = '5/1'", "cannot change"),
        ("UPDATE budgets SET analyst = 'mallory'", "cannot change"),
        ("DELETE FROM budgets", "cannot be deleted"),
        ("TRUNCATE budgets CASCADE", "append-only|cannot be deleted"),
    ]:
        with pytest.raises(psycopg.Error, match=message):
            _sql(pg_url, statement)
    assert ledger.get_budget("census", "alice").epsilon == 1.0


def test_refused_debit_writes_nothing(ledger: PostgresLedger, pg_url: str) -> None:
    ledger.debit("census", "alice", LaplaceEvent(noise_multiplier=2))
    before = _sql(pg_url, "SELECT * FROM spends"), _sql(pg_url, "SELECT * FROM budgets")
    with pytest.raises(BudgetExceededError) as info:
        ledger.debit("census", "alice", PureDPEvent(0.75), "too much")
    message = str(info.value)
    assert "ε=0.75" in message and "ε=0.5" in message and "alice" in message and ledger.schema in message
    with pytest.raises(BudgetExceededError, match="δ"):
        ledger.debit("census", "alice", ApproxDPEvent(0.1, 2e-6))
    assert (_sql(pg_url, "SELECT * FROM spends"), _sql(pg_url, "SELECT * FROM budgets")) == before
    ledger.debit("census", "alice", PureDPEvent(0.5))  # exactly the rest is fine
    assert ledger.get_budget("census", "alice").remaining_epsilon == 0.0


@pytest.mark.parametrize(
    ("args", "kwargs", "name"),
    [
        (("census", "alice", 0.1), {}, "event"),
        (("census", "alice", None), {}, "event"),
        (("", "alice", MILLI), {}, "dataset"),
        (("census", 7, MILLI), {}, "analyst"),
        (("cen\x00sus", "alice", MILLI), {}, "dataset"),
        (("census", "al\ud800ice", MILLI), {}, "analyst"),
        (("census", "alice", MILLI, b"q"), {}, "query_text"),
        (("census", "alice", MILLI, "SELECT \x00"), {}, "query_text"),
        (("census", "alice", MILLI, "SELECT \udfff"), {}, "query_text"),
        (("census", "alice", MILLI), {"epsilon_cost": 0.1}, "delta_cost"),
        (("census", "alice", MILLI), {"epsilon_cost": -0.1, "delta_cost": 0.0}, "epsilon_cost"),
        (("census", "alice", MILLI), {"epsilon_cost": float("nan"), "delta_cost": 0.0}, "epsilon_cost"),
        (("census", "alice", MILLI), {"epsilon_cost": 0.1, "delta_cost": -1e-9}, "delta_cost"),
    ],
)
def test_bad_debits_are_rejected_and_write_nothing(ledger: PostgresLedger, pg_url: str, args, kwargs, name) -> None:
    with pytest.raises(InvalidParameterError) as info:
        ledger.debit(*args, **kwargs)
    assert info.value.name == name
    assert _sql(pg_url, "SELECT COUNT(*) FROM spends") == [(0,)]
    assert ledger.get_budget("census", "alice").spent_epsilon == 0.0


def test_persists_across_reopen_and_lists_budgets_in_code_point_order(pg_url: str) -> None:
    with PostgresLedger(pg_url) as ledger:
        ledger.create_budget("b-data", "zoe", epsilon=2.0)
        ledger.create_budget("a-data", "yann", epsilon=3.0)
        ledger.create_budget("a-data", "Zed", epsilon=3.0)  # "Z" < "y" by code point, not in most locales
        ledger.debit("a-data", "yann", LaplaceEvent(noise_multiplier=2), "q1")
    with pytest.raises(LedgerError, match="closed"):
        ledger.get_budget("a-data", "yann")
    ledger.close()  # twice is fine
    with PostgresLedger(pg_url) as again:
        assert [(b.dataset, b.analyst, b.spent_epsilon) for b in again.list_budgets()] == [
            ("a-data", "Zed", 0.0),
            ("a-data", "yann", 0.5),
            ("b-data", "zoe", 0.0),
        ]
        assert [s.query_text for s in again.list_spends("a-data", "yann")] == ["q1"]
        again.verify()


def test_spends_are_append_only(ledger: PostgresLedger, pg_url: str) -> None:
    import psycopg

    ledger.debit("census", "alice", MILLI)
    for statement in ("DELETE FROM spends", "UPDATE spends SET epsilon_cost = '0/1'", "TRUNCATE spends"):
        with pytest.raises(psycopg.Error, match="append-only"):
            _sql(pg_url, statement)
    assert len(ledger.list_spends("census", "alice")) == 1
    ledger.verify()


def test_verify_detects_totals_that_disagree_with_spends(ledger: PostgresLedger, pg_url: str) -> None:
    ledger.debit("census", "alice", MILLI)
    ledger.verify()
    _sql(pg_url, "UPDATE budgets SET spent_epsilon = '0/1'")  # the totals are not protected: verify catches it
    with pytest.raises(LedgerError, match="differ from the sum of its spends"):
        ledger.verify()


def test_verify_detects_disabled_triggers(ledger: PostgresLedger, pg_url: str) -> None:
    _sql(pg_url, "ALTER TABLE spends DISABLE TRIGGER spends_append_only")
    with pytest.raises(LedgerError, match="spends_append_only are missing or disabled"):
        ledger.verify()


def test_password_is_masked_in_repr_and_errors(pg_url: str) -> None:
    secret_url = _with_password(pg_url, "s3cret")  # the test server trusts, so any password opens it
    with PostgresLedger(secret_url) as ledger:
        assert "s3cret" not in repr(ledger) and ":***@" in repr(ledger)
        assert "s3cret" not in ledger.url
        with pytest.raises(LedgerError) as info:
            ledger.get_budget("census", "nobody")
        assert "s3cret" not in str(info.value) and ":***@" in str(info.value)
    with pytest.raises(LedgerError) as info:
        ledger.list_budgets()
    assert "s3cret" not in str(info.value)


# ------------------------------------------------------------------------------------------------
# schemas that are not valid dpkit ledgers
# ------------------------------------------------------------------------------------------------


def _tables(url: str) -> list[str]:
    return [
        r[0]
        for r in _sql(url, "SELECT tablename FROM pg_tables WHERE schemaname = current_schema() ORDER BY tablename")
    ]


def test_foreign_tables_are_refused_and_left_unchanged(pg_url: str) -> None:
    _sql(pg_url, "CREATE TABLE budgets (x integer)")
    _sql(pg_url, "INSERT INTO budgets VALUES (1)")
    with pytest.raises(LedgerError, match="not a dpkit ledger") as info:
        PostgresLedger(pg_url)
    assert "budgets" in str(info.value)
    assert _tables(pg_url) == ["budgets"] and _sql(pg_url, "SELECT * FROM budgets") == [(1,)]
    with pytest.raises(LedgerError):
        open_ledger(pg_url)  # and it stays refused


def test_foreign_dpkit_schema_table_is_refused(pg_url: str) -> None:
    _sql(pg_url, "CREATE TABLE dpkit_schema (name text)")
    with pytest.raises(LedgerError, match="not a dpkit ledger"):
        PostgresLedger(pg_url)
    assert _tables(pg_url) == ["dpkit_schema"]


@pytest.mark.parametrize(
    ("statement", "message"),
    [
        ("UPDATE dpkit_schema SET version = 99", "version 99 but this dpkit reads version 1; upgrade dpkit"),
        ("UPDATE dpkit_schema SET application = 'someone-else'", "not a dpkit ledger"),
        ("DROP TABLE spends", "not a dpkit ledger"),
    ],
)
def test_changed_ledger_schema_is_refused(pg_url: str, statement: str, message: str) -> None:
    PostgresLedger(pg_url).close()
    _sql(pg_url, statement)
    before = _tables(pg_url), _sql(pg_url, "SELECT application, version FROM dpkit_schema")
    with pytest.raises(LedgerError, match=message):
        PostgresLedger(pg_url)
    assert (_tables(pg_url), _sql(pg_url, "SELECT application, version FROM dpkit_schema")) == before


def test_search_path_without_an_existing_schema_is_refused() -> None:
    url = with_search_path(postgres_url(), "dpkit_no_such_schema")
    with pytest.raises(LedgerError, match="no schema of the connection's search_path"):
        PostgresLedger(url)


# ------------------------------------------------------------------------------------------------
# concurrency and crashes
# ------------------------------------------------------------------------------------------------


def test_threads_sharing_one_ledger_never_overshoot(ledger: PostgresLedger, pg_url: str) -> None:
    """16 threads × 25 debits of ε = 1/1024 against budgets admitting exactly k, three times."""
    for round_, k in enumerate((150, 199, 1)):
        analyst = f"threads-{round_}"
        ledger.create_budget("census", analyst, epsilon=k / 1024)
        outcomes: list[bool] = []
        barrier = threading.Barrier(16)

        def work(barrier: threading.Barrier = barrier, analyst: str = analyst, outcomes: list[bool] = outcomes) -> None:
            barrier.wait(30)
            for _ in range(25):
                try:
                    ledger.debit("census", analyst, UNIT)
                    outcomes.append(True)
                except BudgetExceededError:
                    outcomes.append(False)

        assert _run_threads([work] * 16) == []
        assert outcomes.count(True) == k and len(outcomes) == 400
        spent_eps, _, costs = _db_spent(pg_url, analyst)
        assert len(costs) == k and spent_eps == sum(costs) == Fraction(k, 1024)
        ledger.verify()


def test_threads_debit_different_budgets_in_parallel(ledger: PostgresLedger, monkeypatch) -> None:
    """A thread held inside its debit keeps its budget's row locked on its own connection: other
    threads debit other budgets meanwhile, and a debit of the locked budget queues, then succeeds."""
    ledger.create_budget("census", "bob", epsilon=1.0)
    inside, release = threading.Event(), threading.Event()

    def hold() -> None:
        if threading.current_thread().name == "holder":
            inside.set()
            assert release.wait(30)

    monkeypatch.setattr(postgres_ledger, "_after_insert_hook", hold)
    errors: list[BaseException] = []

    def debit(query: str) -> None:
        try:
            ledger.debit("census", "alice", MILLI, query)
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            errors.append(exc)

    holder = threading.Thread(target=debit, args=("held",), name="holder")
    holder.start()
    try:
        assert inside.wait(30)
        ledger.debit("census", "bob", MILLI, "meanwhile")  # not blocked by alice's open transaction
        assert ledger.get_budget("census", "alice").spent_epsilon == 0.0  # readers see the last commit
        queued = threading.Thread(target=debit, args=("queued",))
        queued.start()
        time.sleep(0.3)
        assert queued.is_alive(), "a debit of a locked budget must wait for the lock"
    finally:
        release.set()
        holder.join(30)
    queued.join(30)
    assert errors == []
    assert [s.query_text for s in ledger.list_spends("census", "alice")] == ["held", "queued"]
    assert [s.query_text for s in ledger.list_spends("census", "bob")] == ["meanwhile"]
    ledger.verify()


def test_threads_opening_a_new_ledger_and_creating_one_budget_at_once(pg_url: str) -> None:
    barrier = threading.Barrier(8)
    records: list[BudgetRecord] = []

    def open_and_create() -> None:
        barrier.wait(30)
        with PostgresLedger(pg_url) as led:
            records.append(led.create_budget("census", "alice", epsilon=1.0, exist_ok=True))

    assert _run_threads([open_and_create] * 8) == []
    assert len(records) == 8 and len(set(records)) == 1
    assert _tables(pg_url) == ["budgets", "dpkit_schema", "spends"]
    with PostgresLedger(pg_url) as led:
        assert len(led.list_budgets()) == 1
        led.verify()


def _race_debits(url: str, analyst: str, n: int, barrier: Any, results: Any) -> None:
    """Child process: ``n`` debits of ε = 1/1024, started with the others; reports (ok, refused)."""
    ok = refused = 0
    with PostgresLedger(url) as led:
        barrier.wait(60)
        for i in range(n):
            try:
                led.debit("census", analyst, UNIT, f"query {os.getpid()}-{i}")
                ok += 1
            except BudgetExceededError:
                refused += 1
    results.put((ok, refused))


@needs_fork
def test_processes_debiting_concurrently_spend_exactly_the_budget(ledger: PostgresLedger, pg_url: str) -> None:
    """4 processes × 60 debits of ε = 1/1024 against budgets admitting exactly k, three times."""
    assert FORK is not None
    for round_, k in enumerate((100, 173, 239)):
        analyst = f"processes-{round_}"
        ledger.create_budget("census", analyst, epsilon=k / 1024)
        barrier, results = FORK.Barrier(4), FORK.Queue()
        procs = [FORK.Process(target=_race_debits, args=(pg_url, analyst, 60, barrier, results)) for _ in range(4)]
        for p in procs:
            p.start()
        try:
            counts = [results.get(timeout=120) for _ in procs]
        finally:
            for p in procs:
                p.join(30)
                if p.is_alive():
                    p.kill()
        assert [p.exitcode for p in procs] == [0] * 4
        assert sum(ok for ok, _ in counts) == k and sum(refused for _, refused in counts) == 240 - k
        spent_eps, spent_dlt, costs = _db_spent(pg_url, analyst)
        assert len(costs) == k and sum(costs) == spent_eps == Fraction(k, 1024) and spent_dlt == 0
        ledger.verify()
        assert ledger.get_budget("census", analyst).remaining_epsilon == 0.0


def _hang_in_debit(url: str, inside: Any) -> None:
    """Child process: stop a debit between the spend's INSERT and the COMMIT, until killed."""

    def hold_mid_transaction() -> None:
        inside.set()
        time.sleep(600)  # the parent SIGKILLs us here

    postgres_ledger._after_insert_hook = hold_mid_transaction
    with PostgresLedger(url) as led:
        led.debit("census", "alice", LaplaceEvent(noise_multiplier=10), "killed mid-transaction")
    raise SystemExit("the hook should have blocked")


@needs_fork
def test_process_killed_inside_the_debit_transaction_leaves_nothing(ledger: PostgresLedger, pg_url: str) -> None:
    assert FORK is not None
    ledger.debit("census", "alice", MILLI, "before")
    for round_ in range(3):
        inside = FORK.Event()
        proc = FORK.Process(target=_hang_in_debit, args=(pg_url, inside))
        proc.start()
        try:
            assert inside.wait(60), "the child never reached the hook"
            # The spend row is inserted and the budget's row locked, nothing committed: readers see
            # the last commit, and a debit gives up cleanly after its (short) timeout.
            assert [s.query_text for s in ledger.list_spends("census", "alice")] == ["before"] + ["after"] * round_
            assert _db_spent(pg_url)[0] == Fraction(round_ + 1, 1000)
            with PostgresLedger(pg_url, timeout=0.2) as impatient:
                start = time.monotonic()
                with pytest.raises(LedgerError, match="another session held the ledger for more than 0.2 s"):
                    impatient.debit("census", "alice", MILLI)
                assert time.monotonic() - start < 5
        finally:
            os.kill(proc.pid, signal.SIGKILL)  # type: ignore[arg-type]
            proc.join(30)
        assert proc.exitcode == -signal.SIGKILL
        ledger.verify()
        assert [s.query_text for s in ledger.list_spends("census", "alice")] == ["before"] + ["after"] * round_
        ledger.debit("census", "alice", MILLI, "after")  # waits for the server to end the dead session
    spent_eps, _, costs = _db_spent(pg_url)
    assert spent_eps == sum(costs) == Fraction(4, 1000)


def _stream_debits(url: str, started: Any) -> None:
    """Child process: debit ε = 10⁻⁶ in a loop until killed."""
    with PostgresLedger(url) as led:
        event = LaplaceEvent(noise_multiplier=10**6)
        led.debit("census", "alice", event, "stream")
        started.set()
        while True:
            led.debit("census", "alice", event, "stream")


@needs_fork
def test_process_killed_at_random_moments_leaves_whole_debits(ledger: PostgresLedger, pg_url: str) -> None:
    assert FORK is not None
    rng = random.Random(7)
    for round_ in range(3):
        started = FORK.Event()
        proc = FORK.Process(target=_stream_debits, args=(pg_url, started))
        proc.start()
        try:
            assert started.wait(60)
            time.sleep(rng.uniform(0.01, 0.2))
        finally:
            os.kill(proc.pid, signal.SIGKILL)  # type: ignore[arg-type]
            proc.join(30)
        ledger.verify()
        spent_eps, _, costs = _db_spent(pg_url)
        assert spent_eps == sum(costs) == Fraction(len(costs), 10**6)
        assert len(costs) >= round_ + 1


# Run in a fresh interpreter: forking the test worker (threads of its own, DuckDB and JVM state
# left by earlier tests) can crash the child for reasons that have nothing to do with the ledger.
_FORKED_CHILD = """
import gc, os, sys
from dpkit.accounting import LaplaceEvent
from dpkit.ledger import PostgresLedger

MILLI = LaplaceEvent(noise_multiplier=1000)
with PostgresLedger(sys.argv[1]) as ledger:
    ledger.debit("census", "alice", MILLI, "parent before")
    # The parent's pooled session (white-box: the ledger keeps idle connections in _idle).
    (parent_conn,) = ledger._idle
    parent_backend = parent_conn.info.backend_pid
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            ledger.debit("census", "alice", MILLI, "child")
            ledger.close()  # closes the child's connections only
            gc.collect()
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, f"child status {status}"
    assert not parent_conn.broken, "the child closed the parent's session"
    assert parent_conn.execute("SELECT pg_backend_pid()").fetchone() == (parent_backend,)
    ledger.debit("census", "alice", MILLI, "parent after")
    texts = [s.query_text for s in ledger.list_spends("census", "alice")]
    assert texts == ["parent before", "child", "parent after"], texts
    ledger.verify()
print("ok")
"""


@needs_fork
def test_a_forked_child_uses_its_own_connections(ledger: PostgresLedger, pg_url: str) -> None:
    done = subprocess.run([sys.executable, "-c", _FORKED_CHILD, pg_url], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


def test_fresh_schemas_are_isolated() -> None:
    with fresh_schema_url() as one, fresh_schema_url() as two, PostgresLedger(one) as a, PostgresLedger(two) as b:
        a.create_budget("census", "alice", epsilon=1.0)
        assert b.list_budgets() == [] and a.schema != b.schema
    assert _sql(
        postgres_url(), "SELECT count(*) FROM pg_namespace WHERE nspname IN (%s, %s)", (a.schema, b.schema)
    ) == [(0,)]
