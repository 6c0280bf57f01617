"""Concurrent queries against one budget: exactly as many succeed as the budget admits.

1,000 requests hit ``dpkit serve --workers 2`` at once (one event loop, 1,000 connections; two
server processes race on the same ledger and audit chain); the analyst's budget
admits exactly k of them (k drawn per repetition from a seeded generator; ε per query is 1/8 so
the sums are exact). Repeated 8 times on SQLite and on PostgreSQL (8,000 racing requests each;
``RACE_REPEATS`` runs more). The check is deterministic —
any overshoot or lost debit fails it — so its false-failure rate is 0; its power is shown by the
same race against a ledger that checks and pays in separate transactions, which it catches.
"""

from __future__ import annotations

import asyncio
import json
import time
from fractions import Fraction
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("fastapi")

from _live_server import dpkit_serve, live_server  # noqa: E402
from dpkit.errors import BudgetExceededError  # noqa: E402
from dpkit.ledger.sqlite import SQLiteLedger  # noqa: E402
from dpkit.server import Service, create_app  # noqa: E402
from dpkit.server import service as service_module  # noqa: E402
from dpkit.server.store import sqlite_path  # noqa: E402
from server._api import UNPACED  # noqa: E402

REQUESTS = 1000
REPEATS = int(__import__("os").environ.get("RACE_REPEATS", 8))
COST = 0.125


async def _post(host: str, port: int, path: str, body: bytes, key: str) -> int:
    """One request on its own connection (raw HTTP/1.1: a thousand of them at once is cheap)."""
    reader, writer = await asyncio.open_connection(host, port)
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {key}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    writer.write(head.encode() + body)
    await writer.drain()
    status_line = await reader.readline()
    await reader.read()  # drain until the server closes
    writer.close()
    return int(status_line.split()[1])


async def _fire(base: str, key: str, n: int) -> list[int]:
    host, port = base.removeprefix("http://").split(":")
    body = json.dumps({"epsilon": COST, "sql": "SELECT COUNT(*) FROM people"}).encode()
    return list(
        await asyncio.gather(*(_post(host, int(port), "/v1/datasets/people/query", body, key) for _ in range(n)))
    )


def _race(service: Service, base: str, rng: np.random.Generator, rep: int, requests: int = REQUESTS) -> None:
    k = int(rng.integers(1, 40))
    name = f"racer{rep}"
    _, key = service.create_principal(name, "analyst")
    service.grant(name, "people", epsilon=k * COST)
    statuses = asyncio.run(_fire(base, key, requests))
    seen = {code: statuses.count(code) for code in sorted(set(statuses))}
    assert statuses.count(200) == k, (
        f"repetition {rep}: {statuses.count(200)} answered, budget admits {k} (statuses {seen})"
    )
    assert statuses.count(409) == requests - k, sorted(set(statuses))
    spends = service.ledger.list_spends("people", name)
    assert len(spends) == k
    assert sum(Fraction(s.epsilon_cost) for s in spends) == k * Fraction(COST)
    assert service.ledger.get_budget("people", name).remaining_epsilon == 0.0


# A race on the ledger, not on the service's per-principal and per-address caps (tested elsewhere):
# 1,000 connections at once from one address and one principal; the paid answers are held for
# 2 s (a time 1,000 requests on two cores cannot overrun).
UNPACED_FLAGS = (
    "--max-concurrent", "1000000", "--max-connections-per-address", "100000", "--cpu-seconds-per-hour", "1e9",
    "--answer-seconds", "2",
)  # fmt: skip


def _setup(tmp_path: Path, url: str) -> Service:
    rng = np.random.default_rng(1)
    pd.DataFrame({"age": rng.integers(18, 90, 200)}).to_csv(tmp_path / "people.csv", index=False)
    service = Service(url, audit_key=tmp_path / "audit.key", dataset_dir=tmp_path / "datasets")
    service.register_dataset(
        "people",
        tmp_path / "people.csv",
        {"row_level": True, "columns": {"age": {"type": "numeric", "lower": 0, "upper": 100}}},
    )
    return service


def _run(service: Service, tmp_path: Path) -> None:
    rng = np.random.default_rng(2026)
    where = (
        "--audit-key",
        str(tmp_path / "audit.key"),
        "--dataset-dir",
        str(tmp_path / "datasets"),
        "--data-root",
        str(tmp_path),
    )
    with dpkit_serve(
        service.url, "--rate", "1e9", "--burst", "1000000000", "--workers", "2", *UNPACED_FLAGS, *where
    ) as base:
        for rep in range(REPEATS):
            _race(service, base, rng, rep)
    service.verify_log()
    assert service.unlogged_spends() == []


@pytest.mark.slow
def test_race_sqlite(tmp_path: Path) -> None:
    service = _setup(tmp_path, f"sqlite:///{tmp_path / 'ledger.sqlite'}")
    try:
        _run(service, tmp_path)
    finally:
        service.close()


@pytest.mark.slow
def test_race_postgres(tmp_path: Path, pg_url: str) -> None:
    service = _setup(tmp_path, pg_url)
    try:
        _run(service, tmp_path)
    finally:
        service.close()


class _CheckThenPay(SQLiteLedger):
    """A deliberately broken ledger: it checks the remaining budget in one transaction and pays
    in another (into a shadow budget, so the real one is never refused) — the classic race."""

    def debit(self, dataset, analyst, event, query_text="", **costs):  # type: ignore[no-untyped-def]
        if self.get_budget(dataset, analyst).remaining_epsilon < COST:
            raise BudgetExceededError(f"ε={COST}", "nothing")
        time.sleep(0.005)  # the window between check and pay
        self.create_budget(dataset, "shadow-" + analyst, epsilon=1e9, exist_ok=True)
        return super().debit(dataset, "shadow-" + analyst, event, query_text, **costs)


def test_the_race_test_catches_a_check_then_pay_ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Power: the same race, against a ledger whose check and debit are separate transactions,
    answers more queries than the budget admits — and the assertion above catches it."""
    monkeypatch.setattr(
        service_module, "_open_ledger", lambda url, timeout: _CheckThenPay(sqlite_path(url), timeout=timeout)
    )
    service = _setup(tmp_path, f"sqlite:///{tmp_path / 'ledger.sqlite'}")
    try:
        with (
            live_server(create_app(service, rate=1e9, burst=10**9, **UNPACED)) as base,
            pytest.raises(AssertionError, match="answered, budget admits"),
        ):
            _race(service, base, np.random.default_rng(3), 0, requests=200)
    finally:
        service.close()
