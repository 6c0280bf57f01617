"""Persistent, atomic privacy-budget ledgers.

A ledger keeps one (ε, δ) budget per (dataset, analyst) and an append-only record of every spend
(the event, the query text, the time and the (ε, δ) debited), shared by every process that opens
it. :class:`SQLiteLedger` is the default backend; other backends implement
:class:`LedgerBackend`.

>>> import tempfile, pathlib
>>> from dpkit.accounting import LaplaceEvent
>>> ledger = open_ledger(pathlib.Path(tempfile.mkdtemp()) / "ledger.sqlite")
>>> ledger.create_budget("census", "alice", epsilon=1.0).remaining_epsilon
1.0
>>> ledger.debit("census", "alice", LaplaceEvent(noise_multiplier=2), "SELECT COUNT(*)").epsilon_cost
0.5
>>> ledger.close()
"""

from __future__ import annotations

import os

from dpkit.ledger.base import BudgetRecord, LedgerBackend, SpendRecord
from dpkit.ledger.sqlite import DEFAULT_LEDGER_PATH, SQLiteLedger

__all__ = ["LedgerBackend", "BudgetRecord", "SpendRecord", "SQLiteLedger", "DEFAULT_LEDGER_PATH", "open_ledger"]


def open_ledger(path: str | os.PathLike[str] | None = None, *, timeout: float = 30.0) -> SQLiteLedger:
    """Open (creating if absent) the SQLite ledger at ``path``; default ``.dpkit/ledger.sqlite``
    under the current directory. Raises :class:`~dpkit.errors.LedgerError` for a file that is not
    a valid dpkit ledger (it is never reset or overwritten)."""
    return SQLiteLedger(DEFAULT_LEDGER_PATH if path is None else path, timeout=timeout)
