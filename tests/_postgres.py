"""The PostgreSQL server of the test suite, and a fresh schema per test.

    from _postgres import postgres_url, fresh_schema_url

The server is ``$DPKIT_TEST_POSTGRES_URL`` when set, else the cluster of ``scripts/postgres.sh``
(``make test`` starts it). Without either, tests that need it are skipped with a message saying
how to start it. Each test gets a schema of its own (``pg_url``), so tests running in parallel
under pytest-xdist never see each other's tables; the schema is dropped afterwards.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import secrets
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

__all__ = ["postgres_url", "fresh_schema_url", "pg_url", "ENV_VAR"]

ENV_VAR = "DPKIT_TEST_POSTGRES_URL"
ROOT = Path(__file__).resolve().parents[1]
_HOW = f"set {ENV_VAR}=postgresql://... or run scripts/postgres.sh start (make test does)"


@functools.cache
def _find_server() -> tuple[str | None, str]:
    """(URL, "") of the test server, or (None, why not). Looked up once per process."""
    env = os.environ.get(ENV_VAR, "").strip()
    if env:
        return env, ""
    script = ROOT / "scripts" / "postgres.sh"
    if not script.is_file():
        return None, f"{script.relative_to(ROOT)} is missing"
    try:
        out = subprocess.run(["bash", str(script), "url"], cwd=ROOT, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"scripts/postgres.sh url failed ({exc})"
    url = out.stdout.strip()
    if out.returncode != 0 or not url:
        return None, "scripts/postgres.sh url found no running server"
    return url, ""


def postgres_url() -> str:
    """The URL of the test server; skips the calling test when there is none (or no psycopg)."""
    if importlib.util.find_spec("psycopg") is None:
        pytest.skip("PostgreSQL tests need psycopg: pip install 'dpkit[postgres]'")
    url, why = _find_server()
    if url is None:
        pytest.skip(f"PostgreSQL not available: {why}; {_HOW}")
    return url


def with_search_path(url: str, schema: str) -> str:
    """``url`` whose connections use ``schema`` (a plain lower-case identifier) first."""
    return url + ("&" if "?" in url else "?") + f"options=-csearch_path%3D{schema}"


@contextlib.contextmanager
def fresh_schema_url() -> Iterator[str]:
    """A URL of the test server whose connections work in a new, empty schema; the schema (and
    everything in it) is dropped on exit."""
    import psycopg

    base = postgres_url()
    # pid and random: unique across xdist workers and across runs that share the server
    schema = f"dpkit_test_{os.getpid()}_{secrets.token_hex(4)}"
    with psycopg.connect(base, autocommit=True, connect_timeout=10) as admin:
        admin.execute(f"CREATE SCHEMA {schema}")
    try:
        yield with_search_path(base, schema)
    finally:
        # A session killed by a test may still be ending on the server and hold locks for a
        # moment: wait for it, but never hang the suite on cleanup of a throwaway schema.
        with contextlib.suppress(psycopg.Error), psycopg.connect(base, autocommit=True, connect_timeout=10) as admin:
            admin.execute("SET lock_timeout = '20s'")
            admin.execute(f"DROP SCHEMA {schema} CASCADE")


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A URL of the test server with a fresh schema of this test's own (skips without a server)."""
    with fresh_schema_url() as url:
        yield url
