"""One server per port, and workers that do not outlive their supervisor
(:mod:`dpkit.server.processes`), against real ``dpkit serve`` processes.

The waits are bounded (a worker has WAIT seconds to go; its own grace is 30 s, and the kernel's
parent-death signal acts at once), so a loaded machine does not fail these tests; without the
protections the workers serve on for ever and a second server starts, which fails them.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("uvicorn")

from _live_server import free_port, until_stopped  # noqa: E402
from dpkit.server.processes import PortInUseError, claim_port, exit_with_parent  # noqa: E402

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
WAIT = 30.0


def _serve(ledger: str, port: int, *args: str) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "dpkit.cli", "serve", "--ledger", ledger, "--port", str(port), *args]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)


def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def _cmdline(pid: int) -> str:
    try:
        return (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _running(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie (an exited orphan may wait to be reaped)."""
    try:
        stat = (Path("/proc") / str(pid) / "stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def _answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2.0):
            return True
    except OSError:
        return False


def _gone(pids: list[int], port: int) -> bool:
    deadline = time.monotonic() + WAIT
    while any(_running(p) for p in pids) or _answers(port):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


@linux_only
def test_workers_stop_when_the_supervisor_is_killed(tmp_path: Path) -> None:
    """kill -9 of the supervisor of ``--workers 2``: both workers are gone and nothing answers
    on the port any more (before, they served on, with the old settings, for ever)."""
    port = free_port()
    workers: list[int] = []
    try:
        with (
            _serve(
                f"sqlite:///{tmp_path / 'ledger.sqlite'}", port, "--workers", "2", "--data-root", str(tmp_path)
            ) as proc,
            until_stopped(proc, f"http://127.0.0.1:{port}", "dpkit serve"),
        ):
            workers = [p for p in _children(proc.pid) if "spawn_main" in _cmdline(p)]
            assert len(workers) == 2, [_cmdline(p) for p in _children(proc.pid)]
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
            assert _gone(workers, port), "workers of the killed supervisor still run or serve"
    finally:
        for pid in filter(_running, workers):  # (only when the test failed)
            os.kill(pid, signal.SIGKILL)


@linux_only
def test_a_second_server_on_a_served_port_refuses_to_start(tmp_path: Path) -> None:
    """A second ``dpkit serve`` on the port of a running ``--workers 2`` server exits non-zero
    naming the port, and the first server still answers: with two workers (whose
    ``SO_REUSEPORT`` bind used to succeed, the two servers then sharing the clients) and with
    one, as the issue ran it with other limits."""
    port = free_port()
    ledger = f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    with (
        _serve(ledger, port, "--workers", "2", "--data-root", str(tmp_path)) as first,
        until_stopped(first, f"http://127.0.0.1:{port}", "dpkit serve"),
    ):
        for workers in ("2", "1"):
            second = _serve(ledger, port, "--workers", workers, "--max-body", "1024", "--data-root", str(tmp_path))
            try:
                _, err = second.communicate(timeout=120)
            finally:
                if second.poll() is None:  # (it started: stop it and its workers)
                    second.terminate()
                    try:
                        second.wait(timeout=30)
                    except subprocess.TimeoutExpired:
                        second.kill()
                        second.wait()
            assert second.returncode != 0, err.decode()[-2000:]
            assert f"port {port}" in err.decode(), err.decode()[-2000:]
        assert first.poll() is None and _answers(port)


def test_a_port_that_answers_cannot_be_claimed() -> None:
    """What a second server meets when it is not a ``dpkit serve`` (or the workers of a killed
    one) that listens there."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        with pytest.raises(PortInUseError, match=f"port {port} "), claim_port("127.0.0.1", port):
            pass


def test_a_claimed_port_cannot_be_claimed_twice_until_released() -> None:
    """The lock, held while a server's workers start and do not listen yet."""
    port = free_port()
    with (
        claim_port("127.0.0.1", port),
        pytest.raises(PortInUseError, match="another dpkit serve"),
        claim_port("127.0.0.1", port),
    ):
        pass
    with claim_port("127.0.0.1", port):  # released at the end of the block
        pass


@linux_only
def test_the_watchdog_alone_stops_an_orphan(tmp_path: Path) -> None:
    """Where the kernel's parent-death signal is missing (not Linux), the watchdog thread stops
    the worker: a grandchild that calls exit_with_parent without the signal outlives a killed
    parent by at most a watchdog interval (checked here without prctl)."""
    script = tmp_path / "orphan.py"
    script.write_text(
        "import os, sys, time\n"
        "from dpkit.server import processes\n"
        "processes._parent_death_signal = lambda sig: False\n"
        "processes.exit_with_parent(os.getppid(), grace=5.0, interval=0.1)\n"
        "print('ready', flush=True)\n"
        "time.sleep(120)\n"
    )
    with subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess, sys, time\n"
            f"child = subprocess.Popen([sys.executable, {str(script)!r}], stdout=subprocess.PIPE)\n"
            "print(child.pid, child.stdout.readline().decode().strip(), flush=True)\n"
            "time.sleep(120)\n",
        ],
        stdout=subprocess.PIPE,
    ) as middle:
        try:
            assert middle.stdout is not None
            pid, ready = middle.stdout.readline().decode().split()
            assert ready == "ready"
            os.kill(middle.pid, signal.SIGKILL)
            middle.wait()
            assert _gone([int(pid)], free_port()), "the orphan still runs"
        finally:
            if middle.poll() is None:
                middle.kill()
                middle.wait()


def test_a_worker_whose_parent_is_already_gone_exits_at_once() -> None:
    """exit_with_parent with a parent that is not this process's: the process ends before it
    imports or serves anything."""
    code = "import os\nfrom dpkit.server.processes import exit_with_parent\nexit_with_parent(os.getppid() + 1)\nprint('served')\n"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=120)
    assert out.returncode == 1 and b"served" not in out.stdout
    assert exit_with_parent is not None
