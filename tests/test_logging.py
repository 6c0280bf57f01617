"""dpkit's loggers print nothing unless the program asked for them (the library convention).

``dpkit.curator`` records quote what an engine said when a query failed after its debit, and an
engine's error text can hold a value of the data (``Could not convert string 'SECRET-41' to
INT64``) or a CSV line number. With no handler anywhere in the logger's hierarchy, Python's
last-resort handler prints such a record on stderr: an analyst running a query from a script or
with ``dpkit query`` would read it. ``dpkit`` gives its logger hierarchy a NullHandler, so the
record goes only where someone attached a handler (the service's log, an explicit handler).

The subprocess tests run in a fresh interpreter (the test runner's own logging setup would hide
the last-resort handler). Their power: the same script with the NullHandler removed prints the
secret (``test_without_the_null_handler_the_secret_reaches_stderr``). Deterministic: no noise
assertion.
"""

from __future__ import annotations

import ast
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

import dpkit as dp
from dpkit.analytics import Metadata, Numeric
from dpkit.analytics.engines.duckdb import DuckDBEngine
from dpkit.errors import QueryFailedError
from dpkit.ledger.identity import dataset_identity

SECRET = "SECRET-41"
SRC = Path(dp.__file__).parent

# The engine fails after the debit with a value of the data in its message (as DuckDB did when a
# CSV field did not convert); ``REMOVE_NULL_HANDLER`` is replaced by the power test.
_LIBRARY = """
import logging
import pandas as pd
import dpkit as dp
from dpkit.analytics import Metadata, Numeric
from dpkit.analytics.engines.duckdb import DuckDBEngine

REMOVE_NULL_HANDLER

def boom(self, plan):
    raise RuntimeError("Could not convert string 'SECRET-41' to INT64")

DuckDBEngine.compute = boom
metadata = Metadata(columns={"age": Numeric(lower=0, upper=100)}, row_level=True)
session = dp.Session(pd.DataFrame({"age": [30, 40, 50]}), budget=dp.Budget(epsilon=1.0), metadata=metadata)
try:
    session.count(epsilon=0.25)
except dp.QueryFailedError as exc:
    print("failed after paying:", session.spent[0], exc)
"""

# The same failure through ``dpkit query`` (the command line's own process, its own ledger).
_CLI = """
import sys
from dpkit.analytics.engines.duckdb import DuckDBEngine
from dpkit.cli import app

def boom(self, plan):
    raise RuntimeError("Could not convert string 'SECRET-41' to INT64")

DuckDBEngine.compute = boom
app(sys.argv[1:], prog_name="dpkit")
"""


def _run(script: str, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "script.py"
    path.write_text(textwrap.dedent(script))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}
    return subprocess.run(
        [sys.executable, str(path), *args], capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env
    )


def _library(remove_null_handler: bool) -> str:
    line = 'logging.getLogger("dpkit").handlers.clear()' if remove_null_handler else ""
    return _LIBRARY.replace("REMOVE_NULL_HANDLER", line)


def test_a_failure_after_the_debit_prints_nothing_on_a_scripts_stderr(tmp_path: Path) -> None:
    done = _run(_library(remove_null_handler=False), tmp_path)
    assert done.returncode == 0, done.stderr
    assert "failed after paying: 0.25" in done.stdout
    assert SECRET not in done.stdout + done.stderr
    assert done.stderr == ""


def test_without_the_null_handler_the_secret_reaches_stderr(tmp_path: Path) -> None:
    """The power of the test above: before the NullHandler, the last-resort handler printed the
    curator's record, secret and all, on the script's stderr."""
    done = _run(_library(remove_null_handler=True), tmp_path)
    assert done.returncode == 0, done.stderr
    assert SECRET in done.stderr and "failed after its debit" in done.stderr


def test_dpkit_query_prints_no_curator_detail(tmp_path: Path) -> None:
    """``dpkit query`` fails with its fixed message; the engine's text is on neither stream."""
    data, metadata, ledger = tmp_path / "people.csv", tmp_path / "people.json", tmp_path / "ledger.sqlite"
    pd.DataFrame({"age": [30, 40, 50]}).to_csv(data, index=False)
    metadata.write_text('{"row_level": true, "columns": {"age": {"type": "numeric", "lower": 0, "upper": 100}}}')
    created = _run(
        "from dpkit.cli import app\nimport sys\napp(sys.argv[1:], prog_name='dpkit')\n",
        tmp_path,
        "budget", "create", str(data), "ann", "--epsilon", "1", "--ledger", str(ledger),
    )  # fmt: skip
    assert created.returncode == 0, created.stderr
    done = _run(
        _CLI,
        tmp_path,
        "query", str(data), "SELECT COUNT(*) FROM people", "--epsilon", "0.25",
        "--metadata", str(metadata), "--ledger", str(ledger), "--analyst", "ann",
    )  # fmt: skip
    assert done.returncode == 1
    assert "could not be computed" in " ".join(done.stderr.split())
    assert SECRET not in done.stdout + done.stderr
    assert "Traceback" not in done.stderr and "dpkit.curator" not in done.stderr
    spent = dp.open_ledger(ledger).get_budget(dataset_identity(data), "ann").spent_epsilon
    assert spent == pytest.approx(0.25)  # the spend stands


class _Kept(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_an_explicit_handler_still_receives_the_curators_record(monkeypatch: pytest.MonkeyPatch) -> None:
    """A curator who attaches a handler to ``dpkit.curator`` gets the whole record: the engine's
    text, with its traceback."""

    def boom(self: DuckDBEngine, plan: Any) -> None:
        raise RuntimeError(f"Could not convert string {SECRET!r} to INT64")

    monkeypatch.setattr(DuckDBEngine, "compute", boom)
    kept = _Kept()
    logger = logging.getLogger("dpkit.curator")
    logger.addHandler(kept)
    try:
        session = dp.Session(
            pd.DataFrame({"age": [30, 40, 50]}),
            budget=dp.Budget(epsilon=1.0),
            metadata=Metadata(columns={"age": Numeric(lower=0, upper=100)}, row_level=True),
        )
        with pytest.raises(QueryFailedError):
            session.count(epsilon=0.25)
    finally:
        logger.removeHandler(kept)
    assert [r.levelno for r in kept.records] == [logging.ERROR]
    record = kept.records[0]
    assert "failed after its debit" in record.getMessage()
    assert record.exc_info is not None and SECRET in str(record.exc_info[1])


def _logger_names() -> set[str]:
    """Every literal name passed to ``logging.getLogger`` in dpkit's source."""
    names: set[str] = set()
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "getLogger"
                and node.args
            ):
                arg = node.args[0]
                names.add(str(arg.value) if isinstance(arg, ast.Constant) else ast.unparse(arg))
    return names


def test_every_dpkit_logger_is_under_the_null_handler() -> None:
    """A logger dpkit creates outside the ``dpkit`` hierarchy would have no NullHandler. The one
    exception is uvicorn's own error logger, which only the service uses, under uvicorn's logging
    configuration."""
    names = _logger_names()
    assert "dpkit.curator" in names  # the scan sees the loggers
    assert {n for n in names if n != "dpkit" and not n.startswith("dpkit.")} <= {"uvicorn.error"}
    assert any(isinstance(h, logging.NullHandler) for h in logging.getLogger("dpkit").handlers)
