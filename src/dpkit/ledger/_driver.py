"""What the SQL stores of dpkit (the ledger, the curator service's tables) share across databases.

A *driver* (:class:`~dpkit.ledger._sqlite_driver.SQLiteDriver`,
:class:`~dpkit.ledger._postgres_driver.PostgresDriver`) owns the connections of one database —
how they are opened, shared between threads, and left alone in a child after ``fork()`` — and
runs transactions of a few kinds:

* ``"read"``: one consistent snapshot (SQLite ``BEGIN`` on a per-thread connection in WAL mode;
  PostgreSQL ``REPEATABLE READ, READ ONLY``). Readers never wait for a writer.
* ``"write"``: holds the database's write lock for what it reads (SQLite ``BEGIN IMMEDIATE``
  behind a cross-process writer queue; PostgreSQL ``READ COMMITTED``, where the caller locks
  the rows it reads with ``SELECT … FOR UPDATE`` or takes an advisory lock).
* ``"autocommit"``: statements one by one, each its own transaction (PostgreSQL only; the
  service's reads that are single statements, saving the BEGIN/COMMIT round trips).

A transaction yields a :class:`Runner`, the one object SQL goes through: it is written once with
``?`` placeholders and rewritten for psycopg. Driver errors become
:class:`~dpkit.errors.LedgerError` worded by a :class:`Wording`, with any password of the
database's URL masked.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from dpkit.errors import InvalidParameterError

__all__ = ["Runner", "Wording", "TransactionKind", "check_timeout"]

TransactionKind = Literal["read", "write", "autocommit"]


class Runner:
    """An open transaction, as handed to code that writes its own rows in it (see
    :class:`dpkit.ledger.base.SQLRunner`): ``run(sql, params)`` returns every row, ``[]`` for a
    statement that returns none. SQL uses ``?`` placeholders whatever the database."""

    def __init__(self, conn: Any, dialect: Literal["sqlite", "postgres"]) -> None:
        #: The driver's connection, for the few steps that need more than rows (``lastrowid``).
        self.conn = conn
        self.dialect = dialect
        # psycopg spells placeholders %s; no SQL of dpkit holds a literal "?" or "%".
        self._rewrite = dialect == "postgres"

    def run(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        if self._rewrite:
            sql = sql.replace("?", "%s")
        cur = self.conn.execute(sql, params)
        return list(cur.fetchall()) if cur.description is not None else []

    def one(self, sql: str, params: tuple[Any, ...] = ()) -> tuple[Any, ...] | None:
        """The first row, or None."""
        rows = self.run(sql, params)
        return rows[0] if rows else None


@dataclass(frozen=True)
class Wording:
    """How a store names itself and its failures in :class:`~dpkit.errors.LedgerError` messages.

    Templates are ``str.format`` strings over ``action`` (what was being done: "debit the
    budget"), ``where`` (the path or masked URL), ``detail`` (the driver's message, passwords
    scrubbed) and ``timeout`` (seconds). A template left None falls back to ``failed``, so a
    store that words every failure alike gives ``failed`` alone."""

    #: The store, as in "cannot open the ledger PATH" or "the ledger PATH is closed".
    noun: str
    failed: str = "could not {action} in {where}: {detail}"
    #: Failing to connect or open; None: as ``failed``.
    connect: str | None = None
    #: Another session or process held a lock for longer than ``timeout``.
    locked: str | None = None
    #: PostgreSQL cancelled a statement that ran past its limit.
    slow: str | None = None
    #: PostgreSQL refused a transaction that conflicted with a concurrent one.
    conflict: str | None = None
    #: The connection broke during COMMIT, so the outcome of a write is unknown.
    unknown_commit: str | None = None

    def say(
        self, template: str | None, *, action: str = "", where: object = "", detail: object = "", timeout: float = 0.0
    ) -> str:
        return (template or self.failed).format(action=action, where=where, detail=detail, timeout=timeout)


def check_timeout(timeout: object) -> float:
    """A lock-wait timeout in seconds: a finite number >= 0 (not a bool)."""
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, (int, float))
        or not (math.isfinite(timeout) and timeout >= 0)
    ):
        raise InvalidParameterError("timeout", timeout, "a finite number of seconds >= 0")
    return float(timeout)
