"""A real uvicorn server on a loopback port, in a background thread, for the HTTP tests."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

uvicorn = pytest.importorskip("uvicorn", reason="the server extra (uvicorn) is not installed")


def listening_socket(backlog: int = 4096) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(backlog)
    return sock


@contextlib.contextmanager
def live_server(app: Any, **limits: Any) -> Iterator[str]:
    """Serve ``app`` until the block ends; yields the base URL. ``limits`` (``header_timeout``,
    ``body_timeout``, ``write_timeout``, ``max_connections``, ``max_connections_per_address``,
    and ``http`` to pick the protocol class) serve it as ``dpkit serve`` does, with
    :class:`dpkit.server.serving.ServingConfig`."""
    sock = listening_socket()
    port = sock.getsockname()[1]
    settings = {"log_level": "error", "lifespan": "off", "backlog": 4096, "timeout_keep_alive": 30}
    if limits:
        from dpkit.server.serving import ServingConfig

        config: Any = ServingConfig(app, **limits, **settings)
    else:
        config = uvicorn.Config(app, **settings)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the test server did not start")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def dpkit_serve(ledger: str, *args: str) -> Iterator[str]:
    """``dpkit serve`` in a child process (the real command line, its own interpreter and GIL);
    yields the base URL once it answers."""
    import os
    import subprocess
    import sys

    port = free_port()
    cmd = [sys.executable, "-m", "dpkit.cli", "serve", "--ledger", ledger, "--port", str(port), *args]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with (
        subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env) as proc,  # (closes the pipe)
        until_stopped(proc, f"http://127.0.0.1:{port}", "dpkit serve") as base,
    ):
        yield base


@contextlib.contextmanager
def until_stopped(proc: Any, base: str, what: str) -> Iterator[str]:
    """Wait until the service that the child process ``proc`` runs answers at ``base`` (a 401 on
    ``/v1/me`` means it is up), yield ``base``, and stop it at the end (SIGTERM, then SIGKILL).
    A child that exits or stays silent for 60 s fails with its stderr's tail."""
    import subprocess
    import urllib.error
    import urllib.request

    deadline = time.monotonic() + 60
    try:
        while True:
            try:
                urllib.request.urlopen(base + "/v1/me", timeout=2)
            except urllib.error.HTTPError as refused:
                refused.close()
                break  # 401: it is up
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    err = proc.stderr.read().decode() if proc.stderr else ""
                    raise RuntimeError(f"{what} did not start: {err[-2000:]}") from None
                time.sleep(0.05)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
