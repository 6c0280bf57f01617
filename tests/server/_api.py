"""Shared helpers of the curator-service tests (``test_auth``, ``test_bad_requests``,
``test_audit``, ``test_service``): a small world — a CSV dataset or two, a ledger, a curator,
some analysts with grants — served in-process through FastAPI's ``TestClient``.

Import it as ``from server._api import ...`` (``tests`` is on the test path). It is a plain
module, not a conftest: each test file builds the worlds it needs in its own fixtures.
"""

from __future__ import annotations

import hashlib
import re
import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from dpkit.server import Service
from dpkit.server.audit import AuditEntry

KEY_PATTERN = re.compile(r"dpk_[A-Za-z0-9_-]{43}")

#: The curator's declarations for ``people.csv`` (every row is a different person): ``id`` is an
#: integer column analysts may filter on, ``age`` has bounds, ``income`` has none (so a mean of it
#: must be refused), ``sex`` is categorical with a value holding a quote character, ``city`` is a
#: string column without public categories (a group-by selects its keys privately).
PEOPLE_METADATA: dict[str, Any] = {
    "row_level": True,
    "columns": {
        "id": {"type": "categorical", "value_type": "integer"},
        "age": {"type": "numeric", "lower": 0, "upper": 100},
        "income": {"type": "numeric"},
        "sex": {"type": "categorical", "categories": ["F", "M", "O'Brien"]},
        "city": {"type": "categorical", "value_type": "string"},
    },
}
SECRET_METADATA: dict[str, Any] = {
    "row_level": True,
    "columns": {
        "salary": {"type": "numeric", "lower": 0, "upper": 1000},
        "team": {"type": "categorical", "categories": ["x", "y"]},
    },
}

COUNT_SQL = "SELECT COUNT(*) FROM people"

#: ``create_app`` settings of the functional tests: answers leave as soon as they are ready,
#: within times a loaded test machine cannot overrun, and no per-principal caps on paid requests.
#: The fixed answer times and the caps are tested in ``test_pacing.py`` with the real settings.
UNPACED: dict[str, Any] = {
    "_hold_answers": False,
    "answer_seconds": 60.0,
    "synth_seconds": 600.0,
    "cpu_seconds_per_hour": 1e9,
    "max_concurrent": 1_000_000,
}


def write_people(path: Path, n: int = 300, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    frame = pd.DataFrame(
        {
            "id": np.arange(n),
            "age": rng.integers(18, 90, n),
            "income": rng.integers(0, 100_000, n),
            "sex": rng.choice(["F", "M", "O'Brien"], n),
            "city": rng.choice(["Paris", "Lyon", "Nice"], n),
        }
    )
    frame.to_csv(path, index=False)
    return path


def write_secret(path: Path, n: int = 100, seed: int = 1) -> Path:
    rng = np.random.default_rng(seed)
    pd.DataFrame({"salary": rng.integers(0, 1000, n), "team": rng.choice(["x", "y"], n)}).to_csv(path, index=False)
    return path


def file_digest(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


@dataclass
class World:
    """A service with data, principals and grants; ``keys`` maps each principal to its key."""

    dir: Path
    db: Path
    service: Service
    keys: dict[str, str]
    people: Path
    secret: Path
    clients: list[Any] = field(default_factory=list)
    closed: bool = False

    # -- HTTP ---------------------------------------------------------------------------------------

    def app(self, **kwargs: Any) -> Any:
        from dpkit.server import create_app

        kwargs.setdefault("rate", 1e6)
        kwargs.setdefault("burst", 1_000_000)
        kwargs.setdefault("address_rate", 1e6)
        kwargs.setdefault("address_burst", 1_000_000)
        for name, value in UNPACED.items():
            kwargs.setdefault(name, value)
        return create_app(self.service, **kwargs)

    def client(self, **kwargs: Any) -> Any:
        """A TestClient over a fresh app on this world's service (server errors come back as 500
        responses, not exceptions: these tests assert statuses)."""
        from fastapi.testclient import TestClient

        c = TestClient(self.app(**kwargs), raise_server_exceptions=False)
        self.clients.append(c)
        return c

    def h(self, who: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.keys[who]}"}

    # -- state -------------------------------------------------------------------------------------

    def spent(self, analyst: str, dataset: str = "people") -> tuple[float, float]:
        b = self.service.ledger.get_budget(dataset, analyst)
        return b.spent_epsilon, b.spent_delta

    def spend_ids(self) -> list[int]:
        led = self.service.ledger
        return sorted(s.id for b in led.list_budgets() for s in led.list_spends(b.dataset, b.analyst))

    def entries(self) -> list[AuditEntry]:
        return self.service.audit_entries(limit=2**62)

    def last_entry(self) -> AuditEntry:
        return self.entries()[-1]

    def snapshot(self) -> dict[str, Any]:
        """Everything a refused request must leave alone."""
        return {
            "principals": self.service.principals(),
            "datasets": [(d.name, d.source) for d in self.service.datasets()],
            "budgets": [
                (b.dataset, b.analyst, b.epsilon, b.delta, b.spent_epsilon, b.spent_delta)
                for b in self.service.ledger.list_budgets()
            ],
            "spends": self.spend_ids(),
            "people": file_digest(self.people),
            "secret": file_digest(self.secret),
        }

    def raw(self) -> sqlite3.Connection:
        """A separate connection to the service's SQLite file (for tampering)."""
        return sqlite3.connect(self.db, isolation_level=None)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for c in self.clients:
            c.close()
        self.service.close()


def make_world(
    directory: Path,
    *,
    analysts: Iterable[str] = ("alice", "bob"),
    grants: Iterable[tuple[str, str, float, float]] = (
        ("alice", "people", 10.0, 1e-5),
        ("bob", "people", 10.0, 1e-5),
        ("alice", "secret", 5.0, 0.0),
    ),
    max_grant_epsilon: float = 10.0,
) -> World:
    """The world's service draws its noise from the OS CSPRNG (a seeded generator is refused by
    the service), so tests that look at noisy values bound them by a stated tail probability."""
    directory = Path(directory)
    people = write_people(directory / "people.csv")
    secret = write_secret(directory / "secret.csv")
    db = directory / "ledger.sqlite"
    service = Service(f"sqlite:///{db}", max_grant_epsilon=max_grant_epsilon)
    keys: dict[str, str] = {}
    try:
        service.register_dataset("people", people, PEOPLE_METADATA)
        service.register_dataset("secret", secret, SECRET_METADATA)
        _, keys["curator"] = service.create_principal("curator", "curator")
        for name in analysts:
            _, keys[name] = service.create_principal(name, "analyst")
        for analyst, dataset, eps, delta in grants:
            service.grant(analyst, dataset, epsilon=eps, delta=delta)
    except BaseException:
        service.close()
        raise
    return World(directory, db, service, keys, people, secret)


def error_of(response: Any) -> dict[str, Any]:
    """The ``error`` object of a refusal (asserting the documented shape)."""
    body = response.json()
    assert set(body) == {"error"}, body
    err = body["error"]
    assert isinstance(err.get("code"), str) and isinstance(err.get("message"), str) and err["message"], body
    return err


def find_keys(text: str) -> list[str]:
    """Every string shaped like an API key in ``text``."""
    return KEY_PATTERN.findall(text)
