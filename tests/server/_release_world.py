"""A world for the release tests, on SQLite or PostgreSQL: the people dataset, a curator, five
analysts (``alice``, ``bob``, ``dave`` and ``erin`` granted the people dataset, ``carol``
nothing) and a way to tamper with the database as someone who can write it (but does not hold
the audit chain's key) would.

Import it as ``from server._release_world import ...``.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dpkit.server import Service
from server._api import PEOPLE_METADATA, World, write_people, write_secret

BODY = {"epsilon": 1.0, "delta": 1e-6, "columns": ["age", "sex"], "bins": {"age": 5}, "rows": 200}
GRANTED = ("alice", "bob", "dave", "erin")


def build(directory: Path, url: str) -> World:
    people = write_people(directory / "people.csv")
    secret = write_secret(directory / "secret.csv")
    service = Service(url, audit_key=directory / "audit.key", dataset_dir=directory / "datasets")
    keys: dict[str, str] = {}
    try:
        service.register_dataset("people", people, PEOPLE_METADATA)
        _, keys["curator"] = service.create_principal("curator", "curator")
        for name in (*GRANTED, "carol"):
            _, keys[name] = service.create_principal(name, "analyst")
        for name in GRANTED:
            service.grant(name, "people", epsilon=10.0, delta=1e-5)
    except BaseException:
        service.close()
        raise
    return World(directory, directory / "ledger.sqlite", service, keys, people, secret)


#: The ledgers a test module's ``world`` fixture runs on: ``@pytest.fixture(params=LEDGERS)``.
LEDGERS = ["sqlite", "postgres"]


def open_world(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[World]:
    """The body of a ``world`` fixture over :data:`LEDGERS` (PostgreSQL: skipped when no test
    server is running)."""
    url = f"sqlite:///{tmp_path / 'ledger.sqlite'}" if request.param == "sqlite" else request.getfixturevalue("pg_url")
    w = build(tmp_path, url)
    try:
        yield w
    finally:
        w.close()


def execute(world: World, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Run ``sql`` on the world's database outside the service (``?`` placeholders)."""
    url = world.service.url
    if url.startswith("sqlite:///"):
        conn = sqlite3.connect(world.db, isolation_level=None)
        try:
            return conn.execute(sql, params).fetchall()
        finally:
            conn.close()
    psycopg = pytest.importorskip("psycopg")
    with psycopg.connect(url, autocommit=True) as conn:
        cur = conn.execute(sql.replace("?", "%s"), params)
        return list(cur.fetchall()) if cur.description is not None else []


def spends(world: World, analyst: str) -> list[int]:
    """The ids of the analyst's spends on the people dataset."""
    return [s.id for s in world.service.ledger.list_spends("people", analyst)]
