"""The curator's log on the curator's own commands (dpkit.server.curator_log).

dpkit's loggers have only a NullHandler (tests/test_logging.py), so ``dpkit serve`` and
``dpkit admin`` must attach the handler that puts ``dpkit.curator`` records in the service's log
(its stderr); without it a query that fails for a reason only the curator may read would leave no
trace anywhere. Deterministic: no noise assertion.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest

pytest.importorskip("fastapi")
uvicorn = pytest.importorskip("uvicorn")

from typer.testing import CliRunner  # noqa: E402

from _live_server import free_port  # noqa: E402
from dpkit.cli import app  # noqa: E402
from dpkit.server import Service  # noqa: E402
from dpkit.server.curator_log import log_to_stderr  # noqa: E402

CURATOR = logging.getLogger("dpkit.curator")


@pytest.fixture
def detached() -> Iterator[None]:
    """The test starts without the stderr handler (an admin command run earlier in this process
    may have attached it); whatever it attaches (and the logger's level) is undone after it."""
    handlers, level = list(CURATOR.handlers), CURATOR.level
    CURATOR.handlers[:] = [h for h in handlers if type(h).__name__ != "_Stderr"]
    yield
    CURATOR.handlers[:] = handlers
    CURATOR.setLevel(level)


def test_the_handler_writes_to_stderr_once_at_its_level(detached: None, capsys: pytest.CaptureFixture[str]) -> None:
    first = log_to_stderr("info")
    assert log_to_stderr("error") is first  # once per process
    assert first.level == logging.INFO and CURATOR.getEffectiveLevel() <= logging.INFO
    CURATOR.info("dataset %r: its copy could not be opened", "people")
    CURATOR.debug("below the level")
    err = capsys.readouterr().err
    assert "INFO dpkit.curator: dataset 'people': its copy could not be opened" in err
    assert "below the level" not in err


def test_an_unknown_level_name_is_warning(detached: None) -> None:
    assert log_to_stderr("loud").level == logging.WARNING


def test_the_admin_commands_attach_it(detached: None, tmp_path: Path) -> None:
    """Every ``dpkit admin`` command opens the service through one function, which attaches it."""
    result = CliRunner().invoke(
        app, ["admin", "create-analyst", "ann", "--ledger", f"sqlite:///{tmp_path / 'l.sqlite'}"]
    )
    assert result.exit_code == 0, result.output
    assert any(type(h).__name__ == "_Stderr" for h in CURATOR.handlers)


@pytest.mark.parametrize("workers", [1, 2])
def test_dpkit_serve_writes_the_curators_record_in_its_log(tmp_path: Path, workers: int) -> None:
    """A dataset whose CSV and copy have both disappeared: the analyst gets the fixed 503, and the
    reason is in the service's stderr (in every worker's), not in the answer."""
    csv = tmp_path / "people.csv"
    pd.DataFrame({"age": range(20, 80)}).to_csv(csv, index=False)
    url = f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    key_file, datasets = tmp_path / "audit.key", tmp_path / "datasets"
    service = Service(url, audit_key=key_file, dataset_dir=datasets)
    try:
        service.register_dataset(
            "people", csv, {"row_level": True, "columns": {"age": {"type": "numeric", "lower": 0, "upper": 100}}}
        )
        _, key = service.create_principal("alice", "analyst")
        service.grant("alice", "people", epsilon=1.0)
    finally:
        service.close()
    csv.unlink()
    for copy in datasets.glob("people-*"):
        copy.unlink()
    port = free_port()
    cmd = [sys.executable, "-m", "dpkit.cli", "serve", "--ledger", url, "--port", str(port), "--workers", str(workers),
           "--audit-key", str(key_file), "--dataset-dir", str(datasets), "--data-root", str(tmp_path)]  # fmt: skip
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("DPKIT_LOG_LEVEL", None)
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=tmp_path, env=env)
    base = f"http://127.0.0.1:{port}"
    try:
        statuses = [_query(base, key, proc) for _ in range(2 * workers)]  # each worker sees one, likely
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=60)
    assert set(statuses) == {503}, (statuses, err[-2000:])
    assert "WARNING dpkit.curator: dataset 'people': its copy is missing and cannot be re-made" in err, err[-2000:]


def _query(base: str, key: str, proc: subprocess.Popen[str]) -> int:
    """POST one query once the service is up (a connection refused is retried for 60 s)."""
    import time

    body = b'{"epsilon": 0.1, "sql": "SELECT COUNT(*) FROM people"}'
    deadline = time.monotonic() + 60
    while True:
        request = urllib.request.Request(
            f"{base}/v1/datasets/people/query",
            data=body,
            headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return int(response.status)
        except urllib.error.HTTPError as exc:
            return int(exc.code)
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("dpkit serve did not start") from None
            time.sleep(0.05)
