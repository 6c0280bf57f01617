"""Raw SQL as an attacker with write access to the service's database (but not to the audit
chain's key) has it: the append-only guards lifted first. Shared by the tamper tests
(``test_integrity``, ``test_audit_spends``)."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

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
