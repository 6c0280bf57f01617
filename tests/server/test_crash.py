"""Crash consistency: the server is SIGKILLed at injected points between debit and response.

For each trial a fresh server process (forked by ``crash_factory.py``) answers one query and
kills itself at a point drawn from a seeded generator: inside the debit transaction (after the
spend row; after the audit entry), after the debit and its entry commit, after the noise is
drawn, or not at all. After every trial the ledger must verify (totals equal the exact sum of
the spends), the keyed chain must verify and agree with the ledger both ways (every spend has
exactly one entry, every paying entry a spend: 0 unlogged spends), the spend must be there
exactly when the server got past COMMIT, and an answer that reached the client must name a
committed spend with its entry. The checks are deterministic (false-failure rate 0); the "none"
point keeps the test honest: it proves answers do arrive and are checked.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from dpkit.server import Service  # noqa: E402

FACTORY = Path(__file__).with_name("crash_factory.py")
POINTS = ("in_debit", "in_entry", "after_debit", "after_noise", "none")
COMMITTED = {"in_debit": False, "in_entry": False, "after_debit": True, "after_noise": True, "none": True}


def _ask(port: int, key: str) -> tuple[int | None, dict | None]:
    """POST one query; (status, body), or (None, None) if the connection died without an answer."""
    body = json.dumps({"epsilon": 0.001, "sql": "SELECT COUNT(*) FROM people"}).encode()
    head = (
        f"POST /v1/datasets/people/query HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {key}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
        s.sendall(head + body)
        chunks = []
        while True:
            try:
                chunk = s.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            chunks.append(chunk)
    raw = b"".join(chunks)
    if not raw:
        return None, None
    status = int(raw.split(b" ", 2)[1])
    return status, json.loads(raw.split(b"\r\n\r\n", 1)[1])


class _Factory:
    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(FACTORY)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1
        )

    def send(self, line: str) -> list[str]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        answer = self.proc.stdout.readline().split()
        assert answer, "the crash factory died"
        return answer

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        self.proc.wait(timeout=30)
        if self.proc.stdout:
            self.proc.stdout.close()


def _trials(tmp_path: Path, url: str, trials: int, seed: int) -> None:
    pd.DataFrame({"age": np.arange(300) % 70 + 18}).to_csv(tmp_path / "people.csv", index=False)
    key_file = tmp_path / "audit.key"
    with Service(url, audit_key=key_file, dataset_dir=tmp_path / "datasets") as service:
        service.register_dataset(
            "people",
            tmp_path / "people.csv",
            {"row_level": True, "columns": {"age": {"type": "numeric", "lower": 0, "upper": 100}}},
        )
        _, key = service.create_principal("mallory", "analyst")
        service.grant("mallory", "people", epsilon=10.0)
    rng = np.random.default_rng(seed)
    factory = _Factory()
    seen: Counter[str] = Counter()
    try:
        for trial in range(trials):
            point = POINTS[int(rng.integers(len(POINTS)))]
            seen[point] += 1
            with Service(url, audit_key=key_file, dataset_dir=tmp_path / "datasets") as service:
                spends_before = len(service.ledger.list_spends("people", "mallory"))
            port = int(factory.send(f"start {point} {url} {key_file}")[1])
            status, body = _ask(port, key)
            exit_code = int(factory.send("reap")[1])
            assert exit_code == -9, f"trial {trial} ({point}): the server ended with {exit_code}, not SIGKILL"
            with Service(url, audit_key=key_file, dataset_dir=tmp_path / "datasets") as service:
                service.verify_log()  # the ledger's totals, the chain, and each against the other
                assert service.unlogged_spends() == [], f"trial {trial} ({point}): a spend without its entry"
                spends = service.ledger.list_spends("people", "mallory")
                ids = {s.id for s in spends}
                assert len(spends) == spends_before + COMMITTED[point], (
                    f"trial {trial} ({point}): {len(spends) - spends_before} new spends"
                )
                if point == "none":
                    assert status == 200 and body is not None, f"trial {trial}: no answer without a crash ({status})"
                else:
                    assert status is None, f"trial {trial} ({point}): a response was sent ({status})"
                if status == 200:
                    assert body["spend_id"] in ids, (
                        f"trial {trial}: an answer was sent for spend {body['spend_id']}, which is not committed"
                    )
                paid = [
                    e.detail.get("spend_id")
                    for e in service.audit_entries(actor="mallory", actions=["query"], limit=10**6)
                    if e.epsilon is not None
                ]
                # exactly one paying entry per committed spend, and none for a spend that is not
                assert sorted(paid) == sorted(ids), (
                    f"trial {trial} ({point}): entries {sorted(paid)} for spends {sorted(ids)}"
                )
    finally:
        factory.close()
    assert set(seen) == set(POINTS), f"not every point was drawn: {dict(seen)}"


@pytest.mark.slow
def test_crash_consistency_sqlite(tmp_path: Path) -> None:
    _trials(tmp_path, f"sqlite:///{tmp_path / 'ledger.sqlite'}", trials=120, seed=8)


@pytest.mark.slow
def test_crash_consistency_postgres(tmp_path: Path, pg_url: str) -> None:
    _trials(tmp_path, pg_url, trials=60, seed=9)
