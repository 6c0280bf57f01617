"""The documents' ``curl`` examples run against a live ``dpkit serve``.

The README's curator-service block is run as a reader would run it: its own ``dpkit generate`` and
``dpkit admin ...`` lines in a fresh directory (the default ledger, ``.dpkit/ledger.sqlite``,
under it), then its ``dpkit serve`` line as a child process on a free port, then its ``curl``
command — taken from README.md itself, so the test breaks when the README's command does — with
only the port changed and alice's key (printed by ``dpkit admin create-analyst alice``) in
``ALICE_KEY``. Every other ``curl`` of README.md and docs/ is sent to the same service, and the
getting-started page's service block (step 9) runs the same way on its own service.

A body posted without ``Content-Type: application/json`` (what ``curl -d`` alone sends) is refused
with 400 and a message naming the header; ``tests/docs_fixtures/curl_without_content_type.md``,
the command as the docs once wrote it, is checked to be reported as failing (issue item 1).

Needs the ``server`` extra and the system ``curl``; skips, saying which, without them. Marked
``slow``: each service takes a few seconds to set up and start, like the other tests of ``dpkit
serve`` in a child process.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from _docs_collector import ROOT, docs_env, logical_lines, parse, service_block, shell_blocks
from _live_server import free_port, until_stopped

pytest.importorskip("fastapi", reason="the server extra (FastAPI) is not installed")
pytest.importorskip("uvicorn", reason="the server extra (uvicorn) is not installed")

pytestmark = [  # slow: by MODULE_MARKERS in conftest.py
    pytest.mark.skipif(shutil.which("curl") is None, reason="the system curl is not installed"),
]

README = ROOT / "README.md"
GETTING_STARTED = ROOT / "docs" / "guide" / "getting-started.md"
FIXTURE = Path(__file__).resolve().parent / "docs_fixtures" / "curl_without_content_type.md"
DOCUMENTED_ADDRESS = "127.0.0.1:8000"
CONTENT_TYPE = re.compile(r"""\s+-H\s+(["'])Content-Type: application/json\1""")


# -- reading the blocks ---------------------------------------------------------------------------


def _without_comment(line: str) -> str:
    """The command without its trailing ``# comment`` (the docs' commands quote no ``#``)."""
    return re.sub(r"\s+#.*$", "", line).strip()


def curl_commands(path: Path) -> list[str]:
    """Every ``curl`` command of the shell blocks of ``path``."""
    return [x for code in shell_blocks(path) for x in logical_lines(code) if x.startswith("curl ")]


# -- running them ---------------------------------------------------------------------------------


@dataclass
class Service:
    base: str
    port: int
    cwd: Path
    env: dict[str, str]
    key: str  # alice's API key
    after: list[str]  # the block's commands after `dpkit serve` (curl, verify-log, ...)


def _serve_command(line: str, port: int) -> str:
    command = re.sub(r"\s*&$", "", _without_comment(line))
    if re.search(r"--port[ =]\d+", command):
        return re.sub(r"--port([ =])\d+", rf"--port\g<1>{port}", command)
    return f"{command} --port {port}"


@contextlib.contextmanager
def running(code: str, cwd: Path) -> Iterator[Service]:
    """Run a service block up to its ``dpkit serve`` line in ``cwd``, start that line on a free
    port, and yield the running service; it is stopped (SIGTERM, then SIGKILL) at the end."""
    lines = logical_lines(code)
    at = next(i for i, x in enumerate(lines) if x.startswith("dpkit serve"))
    env = docs_env()
    setup = "\n".join(lines[:at]) + '\nprintf "\\n__ALICE_KEY=%s\\n" "${ALICE_KEY-}"\n'
    done = subprocess.run(
        ["bash", "-e", "-o", "pipefail", "-c", setup], cwd=cwd, env=env, capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, f"the block's setup failed (exit {done.returncode}):\n{done.stdout}\n{done.stderr}"
    key = done.stdout.rsplit("__ALICE_KEY=", 1)[1].strip()
    if not key:  # printed by `dpkit admin create-analyst alice`, for the reader to export
        found = re.search(r"analyst alice\b[^\n]*\n\s*(dpk_[\w-]+)", done.stdout)
        assert found, f"the block's setup printed no key for alice:\n{done.stdout}"
        key = found.group(1)
    port = free_port()
    proc = subprocess.Popen(
        ["bash", "-c", "exec " + _serve_command(lines[at], port)],
        cwd=cwd,
        env={**env, "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    with until_stopped(proc, f"http://127.0.0.1:{port}", f"`{lines[at]}`") as base:
        yield Service(base, port, cwd, env, key, lines[at + 1 :])


def send(command: str, service: Service) -> tuple[int, str]:
    """Run one documented ``curl`` against ``service`` (its port, alice's key); the HTTP status
    and the body."""
    cmd = _without_comment(command).replace(DOCUMENTED_ADDRESS, f"127.0.0.1:{service.port}")
    assert f"127.0.0.1:{service.port}" in cmd, f"the command does not address {DOCUMENTED_ADDRESS}: {command}"
    cmd += " --silent --show-error --write-out '\\n%{http_code}'"
    done = subprocess.run(
        ["bash", "-c", cmd],
        cwd=service.cwd,
        env={**service.env, "ALICE_KEY": service.key},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, f"curl failed (exit {done.returncode}): {done.stderr}"
    body, _, status = done.stdout.rpartition("\n")
    return int(status), body


def problem(command: str, service: Service) -> str | None:
    """What is wrong with the answer to a documented query, or None: the answer must be 200 with
    JSON rows holding a released value."""
    status, body = send(command, service)
    if status != 200:
        return f"HTTP {status}: {body[:500]}"
    try:
        answer = json.loads(body)
        rows = answer["rows"]
    except (ValueError, KeyError, TypeError):
        return f"HTTP 200 without JSON rows: {body[:500]}"
    values = [v for row in rows for k, v in row.items() if not k.endswith(("_low", "_high"))]
    if not rows or not all(isinstance(v, (int, float)) for v in values):
        return f"HTTP 200 without a released value: {body[:500]}"
    return None


# -- the tests ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def readme_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    with running(service_block(README), tmp_path_factory.mktemp("readme")) as service:
        yield service


@pytest.fixture(scope="module")
def reader(readme_service: Service) -> Service:
    """The README's service seen by another analyst with a larger budget, for the documents'
    other queries (the README grants alice ε = 1, which its own query spends half of)."""
    done = subprocess.run(
        ["bash", "-e", "-c", "dpkit admin create-analyst reader --json && dpkit admin grant reader census --epsilon 10"],
        cwd=readme_service.cwd, env=readme_service.env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return replace(readme_service, key=json.loads(done.stdout.splitlines()[0])["key"])


def test_the_readme_curl_gets_an_answer(readme_service: Service) -> None:
    commands = [x for x in readme_service.after if x.startswith("curl ")]
    assert commands, "the README's service block sends no curl after `dpkit serve`"
    for command in commands:
        assert problem(command, readme_service) is None, command
    # and the block's last step: the audit log verifies, the query's entry included
    for line in readme_service.after:
        if line.startswith("dpkit ") and not line.startswith("dpkit serve"):
            done = subprocess.run(
                ["bash", "-e", "-c", line], cwd=readme_service.cwd, env=readme_service.env,
                capture_output=True, text=True, timeout=120,
            )  # fmt: skip
            assert done.returncode == 0, f"{line}: exit {done.returncode}\n{done.stdout}\n{done.stderr}"


def test_the_readme_python_beside_the_curl_gets_an_answer(reader: Service, monkeypatch: pytest.MonkeyPatch) -> None:
    """The README's Python lines beside its curl (``dpkit.client``), sent to the same service
    with the key in ``DPKIT_API_KEY``: they print a QueryResult."""
    (block,) = [b for b in parse(README, README.name) if b.lang == "python" and "dpkit.client" in b.code]
    assert DOCUMENTED_ADDRESS in block.code and len(logical_lines(block.code)) == 3
    monkeypatch.setenv("DPKIT_API_KEY", reader.key)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(block.code.replace(DOCUMENTED_ADDRESS, f"127.0.0.1:{reader.port}"), {"__name__": "__docs__"})
    assert printed.getvalue().startswith("QueryResult(ε=0.25"), printed.getvalue()


def test_the_readme_curl_without_content_type_is_refused_naming_the_header(reader: Service) -> None:
    command = next(x for x in reader.after if x.startswith("curl "))
    bare, count = CONTENT_TYPE.subn("", command)
    assert count == 1, f"the README's curl does not send -H 'Content-Type: application/json': {command}"
    status, body = send(bare, reader)
    assert 400 <= status < 500, (status, body)
    error = json.loads(body)["error"]
    assert "Content-Type" in error["message"], error


def test_every_curl_of_the_docs_gets_an_answer(reader: Service) -> None:
    """The curl commands of every page (the guide's included) answer, sent to the README's service
    (they all query its census table)."""
    pages = [README, *sorted((ROOT / "docs").rglob("*.md"))]
    commands = [(p.relative_to(ROOT).as_posix(), c) for p in pages for c in curl_commands(p)]
    assert len(commands) >= 3, commands  # README, getting started, the service page
    failures = [f"{page}: {command}\n  {why}" for page, command in commands if (why := problem(command, reader))]
    assert not failures, "\n".join(failures)


def test_the_check_reports_a_curl_without_content_type(reader: Service) -> None:
    """Issue item 1: the curl the docs once showed (``-d`` without ``Content-Type``) is reported,
    and the service's answer says what to fix."""
    (command,) = curl_commands(FIXTURE)
    why = problem(command, reader)
    assert why is not None, "a curl without Content-Type was accepted"
    assert why.startswith("HTTP 400") and "Content-Type" in why, why


def test_the_getting_started_service_block_runs(tmp_path: Path) -> None:
    """Step 9 of the getting-started page, its own setup and service, as a reader runs it."""
    code = service_block(GETTING_STARTED)
    with running(code, tmp_path) as service:
        commands = [x for x in service.after if x.startswith("curl ")]
        assert commands
        for command in commands:
            assert problem(command, service) is None, command
