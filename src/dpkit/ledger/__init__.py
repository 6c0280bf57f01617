"""Persistent, atomic privacy-budget ledgers.

A ledger keeps one (ε, δ) budget per (dataset, analyst) and an append-only record of every spend
(the event, the query text, the time and the (ε, δ) debited), shared by every process that opens
it. :class:`SQLiteLedger` (one file) is the default backend and :class:`PostgresLedger` (a
PostgreSQL database, needs ``pip install 'dpkit[postgres]'``) the shared one; both implement
:class:`LedgerBackend`, and :func:`open_ledger` picks one from a path or URL.

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
import re

from dpkit.errors import InvalidParameterError
from dpkit.ledger._postgres_driver import mask_url
from dpkit.ledger.base import BudgetRecord, LedgerBackend, SpendRecord
from dpkit.ledger.postgres import PostgresLedger
from dpkit.ledger.sqlite import DEFAULT_LEDGER_PATH, SQLiteLedger

__all__ = [
    "LedgerBackend",
    "BudgetRecord",
    "SpendRecord",
    "SQLiteLedger",
    "PostgresLedger",
    "DEFAULT_LEDGER_PATH",
    "open_ledger",
]

# A scheme of two letters or more, so that a Windows path such as C://ledger stays a path.
_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]+)://")
_ACCEPTED = "a path, sqlite:///PATH or postgresql://..."


def _sqlite_path(url: str, rest: str) -> str:
    """The file of a ``sqlite:///`` URL, as SQLAlchemy reads it: ``sqlite:///ledger.sqlite`` is
    relative to the current directory, ``sqlite:////var/ledger.sqlite`` absolute."""
    if not rest.startswith("/") or len(rest) < 2:
        raise InvalidParameterError(
            "ledger",
            url,
            _ACCEPTED,
            "a SQLite URL has no host and names a file: three slashes before a relative path "
            "(sqlite:///ledger.sqlite), four before an absolute one (sqlite:////var/ledger.sqlite)",
        )
    if "?" in rest or "#" in rest:
        raise InvalidParameterError("ledger", url, _ACCEPTED, "a SQLite ledger URL takes no ?options or #fragment")
    return rest[1:]


def open_ledger(path: str | os.PathLike[str] | None = None, *, timeout: float = 30.0) -> LedgerBackend:
    """Open (creating if absent) the ledger at ``path``:

    * a file path (str or os.PathLike), or ``sqlite:///PATH`` (``sqlite:///rel/path``,
      ``sqlite:////abs/path``): a :class:`SQLiteLedger`; default ``.dpkit/ledger.sqlite`` under
      the current directory;
    * ``postgresql://…`` or ``postgres://…``: a :class:`PostgresLedger` in that database.

    ``timeout`` is how long, in seconds, an operation waits for another process's lock. A URL of
    any other scheme raises :class:`~dpkit.errors.InvalidParameterError` naming ``ledger``; a store
    that is not a valid dpkit ledger raises :class:`~dpkit.errors.LedgerError` (it is never reset
    or overwritten).

    >>> import tempfile, pathlib
    >>> directory = pathlib.Path(tempfile.mkdtemp()).absolute()
    >>> with open_ledger(f"sqlite:///{directory.as_posix()}/ledger.sqlite") as ledger:
    ...     ledger.path == directory / "ledger.sqlite"
    True
    """
    if isinstance(path, str):
        url = _URL.match(path)
        if url is not None:
            scheme = url.group(1).lower()
            if scheme in ("postgresql", "postgres"):
                return PostgresLedger(path, timeout=timeout)
            if scheme == "sqlite":
                return SQLiteLedger(_sqlite_path(path, path[url.end() :]), timeout=timeout)
            raise InvalidParameterError("ledger", mask_url(path), _ACCEPTED)
    return SQLiteLedger(DEFAULT_LEDGER_PATH if path is None else path, timeout=timeout)
