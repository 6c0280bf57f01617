"""What ``bench_server.py`` drives the curator service with: ``dpkit serve`` in a subprocess, its
process tree's CPU time and memory from /proc, and a light load generator (raw HTTP/1.1 over
asyncio streams: httpx costs ~2 ms of CPU per request, which on a 2-core machine is taken from
the server being measured).

The load is many keep-alive connections, several per analyst: a paid answer now leaves at a fixed
time after its debit (``--answer-seconds``, 0.5 s for a COUNT on a ``medium`` dataset), so one
connection sends at most 1 / budget queries a second and the throughput of the service is reached
only with hundreds of requests in flight. Each connection sends its queries back to back for a
fixed duration; an analyst has at most ``--max-concurrent`` (8 per worker) requests in flight, so
an analyst gets at most 8 connections and the number of analysts sets the number of clients.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent


# ------------------------------------------------------------------------------------------------
# the server's process tree, from /proc (Linux)
# ------------------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _proc_stat(pid: int) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def descendants(pid: int) -> list[int]:
    """``pid`` and every live process below it (Linux /proc), parents first."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            fields = _proc_stat(int(entry.name))
            if fields is not None:
                children.setdefault(int(fields[1]), []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children.get(p, [])
    return out


def cpu_by_process(pid: int) -> dict[int, float]:
    """User + system CPU seconds of each process of the tree: the process, all its threads and
    every live descendant (uvicorn's worker processes)."""
    out = {}
    for p in descendants(pid):
        fields = _proc_stat(p)
        if fields is not None:
            out[p] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return out


def cpu_seconds(pid: int) -> float | None:
    """The CPU seconds of the whole tree (None when /proc has no such process)."""
    if _proc_stat(pid) is None:
        return None
    return sum(cpu_by_process(pid).values())


def rss_bytes(pid: int) -> int:
    """Resident memory of the whole tree (the sum of each process's VmRSS)."""
    total = 0
    for p in descendants(pid):
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
                    break
        except OSError:
            continue
    return total


def threads_of(pid: int) -> int:
    """Threads of the whole tree."""
    total = 0
    for p in descendants(pid):
        fields = _proc_stat(p)
        if fields is not None:
            total += int(fields[17])
    return total


def serve_options() -> dict[str, list[str]]:
    """The option names ``dpkit serve`` accepts, by parameter name (read from the command,
    :mod:`dpkit.server.serve_command`)."""
    import typer

    from dpkit.server.serve_command import serve

    cli = typer.Typer()
    cli.command()(serve)
    return {p.name: list(p.opts) for p in typer.main.get_command(cli).params if p.name}


class Server:
    """``dpkit serve --ledger URL --port P --workers N`` in a subprocess (rate limits effectively
    off; ``extra`` options by parameter name, passed when the command has them); stopped with
    SIGINT. ``env`` is added to the server's environment (e.g. the profiler switch)."""

    def __init__(
        self, url: str, log: Path, workers: int, extra: dict[str, str], env: dict[str, str] | None = None
    ) -> None:
        self.url, self.log, self.workers = url, log, workers
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.env = env or {}
        options = serve_options()
        # Every client connects from 127.0.0.1: per-address limits (before authentication) are
        # lifted like the per-principal ones.
        off = {"rate": "1e9", "burst": str(10**9), "address_rate": "1e9", "address_burst": str(10**9)}
        args = {"ledger": url, "host": "127.0.0.1", "port": str(self.port), "workers": str(workers), **off, **extra}
        missing = [k for k in ("ledger", "port", "rate", "burst") if k not in options]
        if missing or (workers > 1 and "workers" not in options):
            raise RuntimeError(f"dpkit serve has no option for {missing or ['workers']}")
        self.ignored = sorted(k for k in extra if k not in options)
        self.argv = [
            sys.executable,
            "-c",
            "import sys; from dpkit.cli import app; sys.argv[0] = 'dpkit'; app()",
            "serve",
        ]
        for name, value in args.items():
            if name in options:
                self.argv += [options[name][0], value]
        self.command = "dpkit serve " + " ".join(a for a in self.argv[4:])

    def __enter__(self) -> Server:
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **self.env}
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO)
        deadline = time.monotonic() + 60
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited with status {self.proc.returncode}:\n{self.tail()}")
            if status_of(self.port, "/") == 200 and len(descendants(self.proc.pid)) > self.workers - (
                self.workers == 1
            ):
                return self
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the server did not answer within 60 s:\n{self.tail()}")
            time.sleep(0.1)

    def tail(self) -> str:
        try:
            return self.log.read_text(errors="replace")[-3000:]
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            for p in reversed(descendants(self.proc.pid)):
                with contextlib.suppress(OSError):
                    os.kill(p, signal.SIGKILL)
            self.proc.wait()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def status_of(port: int, path: str) -> int | None:
    """The status of one GET (None when nothing answers)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
            s.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode())
            head = s.recv(64)
        return int(head[9:12])
    except (OSError, ValueError):
        return None


# ------------------------------------------------------------------------------------------------
# the load generator
# ------------------------------------------------------------------------------------------------


class Connection:
    """One keep-alive HTTP/1.1 connection sending hand-written requests; reads the status line,
    the headers and a Content-Length (or chunked) body. Reconnects after a broken connection."""

    def __init__(self, port: int, key: str) -> None:
        self.port, self.key = port, key
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    def request_bytes(self, path: str, body: bytes | None, method: str = "POST") -> bytes:
        head = f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {self.key}\r\n"
        if body is None:
            return (head + "\r\n").encode("ascii")
        return (head + f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode("ascii") + body

    async def open(self) -> None:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)

    async def send(self, request: bytes) -> tuple[int, bytes]:
        await self.open()
        assert self.reader is not None and self.writer is not None
        try:
            self.writer.write(request)
            head = await self.reader.readuntil(b"\r\n\r\n")
            status = int(head[9:12])
            length, chunked, close = None, False, False
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                name = name.strip().lower()
                if name == b"content-length":
                    length = int(value)
                elif name == b"transfer-encoding" and b"chunked" in value.lower():
                    chunked = True
                elif name == b"connection" and b"close" in value.lower():
                    close = True
            if chunked:
                parts = []
                while True:
                    size = int((await self.reader.readuntil(b"\r\n")).split(b";")[0], 16)
                    parts.append(await self.reader.readexactly(size + 2))
                    if size == 0:
                        break
                body = b"".join(p[:-2] for p in parts)
            else:
                body = await self.reader.readexactly(length or 0)
        except BaseException:
            await self.close()
            raise
        if close:
            await self.close()
        return status, body

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            with contextlib.suppress(Exception):
                await self.writer.wait_closed()
        self.reader = self.writer = None


def summary(lat_s: list[float]) -> dict[str, float]:
    a = np.asarray(lat_s) * 1e3
    return {
        "p50_ms": float(np.percentile(a, 50)),
        "p90_ms": float(np.percentile(a, 90)),
        "p99_ms": float(np.percentile(a, 99)),
        "min_ms": float(a.min()),
        "max_ms": float(a.max()),
        "mean_ms": float(a.mean()),
    }


async def timed_load(
    port: int, keys: list[str], path: str, body: bytes, clients: int, seconds: float, warmup: int
) -> dict[str, Any]:
    """``clients`` connections (spread round-robin over the analysts of ``keys``), each sending
    ``body`` to ``path`` back to back: ``warmup`` requests each, then for ``seconds``.

    Throughput counts the answers that arrived within the window; a request sent in the window
    and answered after it is still awaited (its spend is checked afterwards) but not counted.
    Returns the latencies of the counted answers, the window, the spend id of every 200 (warm-up
    included) and the errors (anything but a 200 with a JSON answer)."""
    errors: list[str] = []
    spend_ids: list[Any] = []
    lat: list[float] = []
    late: list[float] = []  # answered after the window closed (not counted in the throughput)
    window: dict[str, float] = {}

    async def one(conn: Connection, request: bytes, record: bool) -> None:
        t = time.perf_counter()
        try:
            status, data = await conn.send(request)
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as exc:
            errors.append(f"{type(exc).__name__}: {exc}"[:300])
            await asyncio.sleep(0.05)  # a refused connection is not retried in a busy loop
            return
        done = time.perf_counter()
        answer = None
        if status == 200:
            with contextlib.suppress(ValueError):
                answer = json.loads(data)
        if not isinstance(answer, dict) or "epsilon" not in answer:
            errors.append(f"HTTP {status}: {data[:300]!r}")
            return
        spend_ids.append(answer.get("spend_id"))
        if record:
            (lat if done <= window["end"] else late).append(done - t)

    async def run(conn: Connection) -> None:
        request = conn.request_bytes(path, body)
        for _ in range(warmup):
            await one(conn, request, False)
        await started.wait()
        while time.perf_counter() < window["end"]:
            await one(conn, request, True)

    conns = [Connection(port, keys[i % len(keys)]) for i in range(clients)]
    started = asyncio.Event()
    try:
        # Connect in small batches: a burst of hundreds of SYNs overflows nothing here, but the
        # workers accept on their own sockets and the kernel spreads connections as they come.
        for i in range(0, len(conns), 32):
            await asyncio.gather(*(c.open() for c in conns[i : i + 32]))
        tasks = [asyncio.create_task(run(c)) for c in conns]
        await asyncio.sleep(0)
        # The warm-up: every connection's first answers (the clock of each starts at its debit)
        warm_deadline = time.perf_counter() + 120
        while len(spend_ids) + len(errors) < clients * warmup and time.perf_counter() < warm_deadline:
            await asyncio.sleep(0.02)
        warm_ok = len(spend_ids)
        window["start"] = time.perf_counter()
        window["end"] = window["start"] + seconds
        started.set()
        await asyncio.gather(*tasks)
        finished = time.perf_counter()
    finally:
        await asyncio.gather(*(c.close() for c in conns))
    return {
        "answered": len(spend_ids),
        "warmup_answered": warm_ok,
        "measured": len(lat),
        "wall_s": seconds,
        "drain_s": finished - window["end"],
        "latencies": lat,
        "late_latencies": late,
        "errors": errors,
        "spend_ids": spend_ids,
    }
