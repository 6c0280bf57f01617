"""Raw SQL as an attacker with write access to the service's database (but not to the audit
chain's key) has it: the append-only guards lifted first; and the world the tamper tests
(``test_integrity``, ``test_audit_spends``) change and then verify."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dpkit.errors import LedgerError
from dpkit.server import AuditEntry, Service

Execute = Callable[..., list[tuple[Any, ...]]]


def sqlite_executor(db: Path) -> Execute:
    """Run one statement on the SQLite file ``db`` after dropping its triggers."""

    def execute(sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        conn = sqlite3.connect(db, isolation_level=None)
        try:
            for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'").fetchall():
                conn.execute(f'DROP TRIGGER "{name}"')  # the attacker removes the append-only guards first
            return conn.execute(sql, params).fetchall()
        finally:
            conn.close()

    return execute


def postgres_executor(psycopg: Any, url: str) -> Execute:
    """Run one statement on the PostgreSQL ledger at ``url`` with its guards lifted for it."""

    def execute(sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        with psycopg.connect(url, autocommit=True) as conn:
            # The attacker lifts the append-only guards for the change and puts them back.
            for table in ("spends", "budgets"):
                conn.execute(f"ALTER TABLE {table} DISABLE TRIGGER USER")
            cur = conn.execute(sql.replace("?", "%s"), params)
            rows = list(cur.fetchall()) if cur.description is not None else []
            for table in ("spends", "budgets"):
                conn.execute(f"ALTER TABLE {table} ENABLE TRIGGER USER")
            return rows

    return execute


class Backend:
    """One world to tamper with: its service (reopened after each change) and raw SQL access as
    an attacker with write access to the database (but not to the key) would have."""

    def __init__(self, open_service: Callable[[], Service], execute: Execute) -> None:
        self.open_service, self.execute = open_service, execute

    def verify(self, head: str | None = None) -> Any:
        with self.open_service() as svc:
            return svc.verify_log(head=head)

    def refused(self, head: str | None = None) -> str:
        with pytest.raises(LedgerError) as info:
            self.verify(head)
        return str(info.value)

    def entries(self) -> list[AuditEntry]:
        with self.open_service() as svc:
            return svc.audit_entries(limit=2**62)

    def spends(self) -> dict[int, tuple[str, str]]:
        """The stored event and query text of every spend, by id."""
        return {int(i): (e, q) for i, e, q in self.execute("SELECT id, event, query_text FROM spends", ())}
