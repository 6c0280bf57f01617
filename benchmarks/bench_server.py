"""The curator service over HTTP: throughput and latency of paid, audited queries on 1,000,000 rows.

What is measured, for the SQLite ledger and (when a server is reachable and
``dpkit.ledger.postgres`` exists) the PostgreSQL ledger:

1. **HTTP load.** A 1,000,000-row Parquet file (numpy, seeded: ``age`` int 18–90, ``income``
   float, ``region`` one of 5 public categories; ``row_level``) is registered with a
   :class:`Service`; 16 analysts get a budget of ε = 10⁶ each. The service runs as
   ``dpkit serve --ledger URL --port P --workers N`` in a subprocess (127.0.0.1, rate limit
   effectively off: ``--rate 1e9 --burst 10**9``; ``--data-root`` and ``--audit-key`` are passed
   when the command has them, and the in-process :class:`Service` gets the same). The load
   generator is light on purpose — the clients share the server's CPUs: raw HTTP/1.1 over asyncio
   streams, hand-written request bytes, one keep-alive connection per analyst, each sending its
   queries back to back (after a warm-up): ``SELECT COUNT(*)``, ``SELECT AVG(age)`` and
   ``SELECT region, COUNT(*) ... GROUP BY region`` at ε = 0.001, with 1 client and with 16, under
   the first ``--workers`` value; the COUNT / 16-client row again under each other value
   (``--all-rows``: every row). Throughput = answered queries / wall time; latency = client-side
   time of one request; errors = anything but a 200 with a JSON answer. Server CPU per query is
   the CPU time of the server's whole process tree (every uvicorn worker, all threads) from
   /proc; client CPU per query is this process's. Afterwards: every 200 has exactly one spend in
   the ledger and exactly one audit entry naming its ``spend_id``, the ledger has no spend that
   was not answered, the audit chain verifies and no spend is unlogged. Goal (issue 14):
   ≥ 400 COUNT queries/s with 16 clients on SQLite with p99 ≤ 100 ms, ≥ 150 on PostgreSQL.
2. **In-process costs**, on the same database (server stopped): ``Service.query`` without HTTP
   (engine + ledger reads + debit + noise), ``ledger.debit`` alone, ``Service.audit`` (one
   hash-chained audit append) alone, and debit followed by audit (the ledger writes of one
   request), each sequentially and from 16 threads (one budget per thread); and, as the floor
   under every commit, a raw 4 KiB write + fdatasync in the same directory. Goal: p99 of a
   debit ≤ 10 ms on SQLite.

    .venv-bench/bin/python benchmarks/bench_server.py                 # about 2 min on an idle 2-core machine
    .venv-bench/bin/python benchmarks/bench_server.py --backends sqlite --scale 0.25   # quick check
    .venv-bench/bin/python benchmarks/bench_server.py --workers 2 --all-rows --label after
    .venv-bench/bin/python benchmarks/bench_server.py --render OLD.json benchmarks/results/server.json   # side by side

The ledger files live in a temporary directory (``--workdir`` to choose its file system: on
tmpfs an fsync costs nothing). PostgreSQL: the server of ``scripts/postgres.sh`` (started if it
is not running, and stopped again at the end if this script started it); the benchmark works in
a schema of its own, dropped afterwards. Results: ``benchmarks/results/server.json``, a rich
table on stderr, Markdown on stdout; every row carries the run's label (``--label``, default the
commit) and its worker count. Exit status 1 when any request failed or a check did not hold.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as _dt
import importlib.util
import json
import os
import platform
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _report  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "benchmarks" / "results" / "server.json"
SEED = 20261127
DATASET = "people"
REGIONS = ["north", "south", "east", "west", "centre"]
METADATA = {
    "row_level": True,  # every row a different person (the service requires the privacy unit)
    "columns": {
        "age": {"type": "numeric", "lower": 18, "upper": 90},
        "income": {"type": "numeric", "lower": 0, "upper": 500000},
        "region": {"type": "categorical", "categories": REGIONS},
    }
}
EPSILON = 0.001  # per query
BUDGET = 1e6  # per analyst: never the limit here
# kind -> (SQL, queries per client with 16 clients, queries with 1 client) at --scale 1
QUERIES = {
    "COUNT": (f"SELECT COUNT(*) FROM {DATASET}", 30, 200),
    "AVG(age)": (f"SELECT AVG(age) FROM {DATASET}", 15, 100),
    "GROUP BY region, COUNT": (f"SELECT region, COUNT(*) FROM {DATASET} GROUP BY region", 8, 60),
}
WARMUP = 2  # queries per client before the clock starts


# ------------------------------------------------------------------------------------------------
# the server subprocess: ``dpkit serve``
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


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of a process tree — the process, all its threads and every live
    descendant (uvicorn's worker processes) — from /proc (Linux), else None."""
    if _proc_stat(pid) is None:
        return None
    total = 0
    for p in descendants(pid):
        fields = _proc_stat(p)
        if fields is not None:
            total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def cpu_by_process(pid: int) -> dict[int, float]:
    """CPU seconds of each process of the tree (to see how the workers shared the load)."""
    out = {}
    for p in descendants(pid):
        fields = _proc_stat(p)
        if fields is not None:
            out[p] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return out


def _serve_options() -> dict[str, list[str]]:
    """The option names ``dpkit serve`` accepts, by parameter name (read from the command)."""
    import typer

    from dpkit.server.cli import serve

    cli = typer.Typer()
    cli.command()(serve)
    return {p.name: list(p.opts) for p in typer.main.get_command(cli).params if p.name}


class Server:
    """``dpkit serve --ledger URL --port P --workers N`` in a subprocess (rate limits effectively
    off; ``--data-root`` / ``--audit-key`` / ``--address-rate`` passed when the command has them);
    stopped with SIGINT."""

    def __init__(self, url: str, log: Path, workers: int, extra: dict[str, str]) -> None:
        self.url, self.log, self.workers = url, log, workers
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None
        options = _serve_options()
        # Every client connects from 127.0.0.1: per-address limits (before authentication) are
        # lifted like the per-principal ones.
        off = {"rate": "1e9", "burst": str(10**9), "address_rate": "1e9", "address_burst": str(10**9)}
        args = {"ledger": url, "host": "127.0.0.1", "port": str(self.port), "workers": str(workers), **off, **extra}
        missing = [k for k in ("ledger", "port", "rate", "burst") if k not in options]
        if missing or (workers > 1 and "workers" not in options):
            raise RuntimeError(f"dpkit serve has no option for {missing or ['workers']}")
        self.argv = [sys.executable, "-c", "import sys; from dpkit.cli import app; sys.argv[0] = 'dpkit'; app()", "serve"]
        for name, value in args.items():
            if name in options:
                self.argv += [options[name][0], value]
        self.command = "dpkit serve " + " ".join(a for a in self.argv[4:])

    def __enter__(self) -> Server:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO)
        deadline = time.monotonic() + 60
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited with status {self.proc.returncode}:\n{self.tail()}")
            if _status(self.port, "/") == 200:
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


def _status(port: int, path: str) -> int | None:
    """The status of one GET (None when nothing answers)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
            s.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode())
            head = s.recv(64)
        return int(head[9:12])
    except (OSError, ValueError):
        return None


# ------------------------------------------------------------------------------------------------
# the load generator: raw HTTP/1.1 over asyncio streams (httpx costs ~2 ms CPU per request, which
# on a 2-core machine is taken from the server being measured)
# ------------------------------------------------------------------------------------------------


class Connection:
    """One keep-alive HTTP/1.1 connection sending hand-written requests; reads the status line,
    the headers and a Content-Length (or chunked) body. Reconnects after a broken connection."""

    def __init__(self, port: int, key: str) -> None:
        self.port, self.key = port, key
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    def request_bytes(self, path: str, body: bytes) -> bytes:
        return (
            f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {self.key}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode("ascii") + body

    async def send(self, request: bytes) -> tuple[int, bytes]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        assert self.reader is not None
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


# ------------------------------------------------------------------------------------------------
# data, service setup, PostgreSQL
# ------------------------------------------------------------------------------------------------


def make_dataset(path: Path, rows: int) -> None:
    """``rows`` seeded rows written as Parquet (through DuckDB: no pyarrow needed)."""
    import duckdb
    import pandas as pd

    rng = np.random.default_rng(SEED)
    df = pd.DataFrame({
        "age": rng.integers(18, 91, rows, dtype=np.int64),
        "income": np.round(np.minimum(rng.lognormal(10.5, 0.8, rows), 500000.0), 2),
        "region": np.asarray(REGIONS, dtype=object)[rng.integers(0, len(REGIONS), rows)],
    })
    con = duckdb.connect()
    try:
        con.register("frame", df)
        con.execute(f"COPY frame TO '{path.as_posix()}' (FORMAT parquet)")
    finally:
        con.close()


def _parameters(fn: Any) -> set[str]:
    import inspect

    return set(inspect.signature(fn).parameters)


def service_options(workdir: Path) -> tuple[dict[str, Any], dict[str, str]]:
    """What the :class:`Service` constructor and ``dpkit serve`` need here, read from the code
    being measured: (keyword arguments of Service, ``dpkit serve`` options by parameter name).

    The data root is the working directory (where the Parquet file is); an audit key file and the
    dataset copies are kept there when both take them (else both use their defaults); the grant
    maximum is raised to the benchmark's budget."""
    from dpkit.server.service import Service

    params, options = _parameters(Service.__init__), _serve_options()
    kwargs: dict[str, Any] = {}
    cli: dict[str, str] = {}
    if "data_root" in params:
        kwargs["data_root"] = workdir
    if "data_root" in options:
        cli["data_root"] = str(workdir)
    if "max_grant_epsilon" in params:
        kwargs["max_grant_epsilon"] = BUDGET
    if "audit_key" in params and "audit_key" in options:
        key = workdir / "audit.key"
        from dpkit.server import audit

        if not key.exists() and hasattr(audit, "load_key"):
            audit.load_key(key, create=True)
        kwargs["audit_key"] = key
        cli["audit_key"] = str(key)
    if "dataset_dir" in params and "dataset_dir" in options:
        # (for a PostgreSQL ledger the default would be .dpkit/ under the working directory)
        kwargs["dataset_dir"] = workdir / "datasets"
        cli["dataset_dir"] = str(workdir / "datasets")
    return kwargs, cli


def setup_service(url: str, parquet: Path, clients: int, kwargs: dict[str, Any]) -> list[str]:
    """Register the dataset, create ``clients`` analysts with budgets; their API keys."""
    from dpkit.server.service import Service

    with Service(url, **kwargs) as svc:
        svc.register_dataset(DATASET, parquet, METADATA)
        keys = []
        for i in range(clients):
            _, key = svc.create_principal(f"analyst{i:02d}", "analyst")
            svc.grant(f"analyst{i:02d}", DATASET, epsilon=BUDGET)
            keys.append(key)
    return keys


@contextlib.contextmanager
def postgres_schema(start: bool) -> Any:
    """(URL of a fresh schema on the scripts/postgres.sh server, None) or (None, why not)."""
    if importlib.util.find_spec("dpkit.ledger.postgres") is None:
        yield None, "dpkit.ledger.postgres does not exist"
        return
    try:
        import psycopg
    except ImportError:
        yield None, "psycopg is not installed (pip install 'dpkit[postgres]')"
        return
    script = REPO / "scripts" / "postgres.sh"
    started = False
    out = subprocess.run(["bash", str(script), "url"], capture_output=True, text=True, timeout=60)
    base = out.stdout.strip()
    if out.returncode != 0 or not base:
        if not start:
            yield None, "no server (scripts/postgres.sh url found none; --no-start-postgres)"
            return
        print("[bench] starting PostgreSQL with scripts/postgres.sh start", file=sys.stderr)
        out = subprocess.run(["bash", str(script), "start"], capture_output=True, text=True, timeout=600)
        base = out.stdout.strip()
        if out.returncode != 0 or not base:
            yield None, f"scripts/postgres.sh start failed: {out.stderr.strip()[-300:]}"
            return
        started = True
    schema = f"dpkit_bench_{os.getpid()}_{secrets.token_hex(3)}"
    try:
        with psycopg.connect(base, autocommit=True, connect_timeout=10) as admin:
            admin.execute(f"CREATE SCHEMA {schema}")
            version = admin.execute("SHOW server_version").fetchone()[0]  # type: ignore[index]
            settings = {k: admin.execute(f"SHOW {k}").fetchone()[0] for k in ("fsync", "synchronous_commit", "wal_sync_method")}  # type: ignore[index]
    except psycopg.Error as exc:
        yield None, f"cannot use {base}: {exc}"
        return
    try:
        yield base + ("&" if "?" in base else "?") + f"options=-csearch_path%3D{schema}", {"server_version": version, **settings, "started_here": started}
    finally:
        with contextlib.suppress(psycopg.Error), psycopg.connect(base, autocommit=True, connect_timeout=10) as admin:
            admin.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        if started:
            subprocess.run(["bash", str(script), "stop"], capture_output=True, timeout=120)


# ------------------------------------------------------------------------------------------------
# measurements
# ------------------------------------------------------------------------------------------------


def summary(lat_s: list[float]) -> dict[str, float]:
    a = np.asarray(lat_s) * 1e3
    return {
        "p50_ms": float(np.percentile(a, 50)),
        "p90_ms": float(np.percentile(a, 90)),
        "p99_ms": float(np.percentile(a, 99)),
        "max_ms": float(a.max()),
        "mean_ms": float(a.mean()),
    }


async def _load(port: int, keys: list[str], sql: str, per_client: int) -> dict[str, Any]:
    """``per_client`` queries back to back on each analyst's connection (after ``WARMUP``); the
    latencies of the timed ones, the wall time, the spend ids of every 200 and the errors."""
    body = json.dumps({"epsilon": EPSILON, "sql": sql}).encode()
    path = f"/v1/datasets/{DATASET}/query"
    errors: list[str] = []
    spend_ids: list[Any] = []

    async def run(conn: Connection, n: int, lat: list[float] | None) -> None:
        request = conn.request_bytes(path, body)
        for _ in range(n):
            t = time.perf_counter()
            try:
                status, data = await conn.send(request)
            except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as exc:
                errors.append(f"{type(exc).__name__}: {exc}"[:300])
                continue
            dt = time.perf_counter() - t
            answer = None
            if status == 200:
                with contextlib.suppress(ValueError):
                    answer = json.loads(data)
            if not isinstance(answer, dict) or "epsilon" not in answer:
                errors.append(f"HTTP {status}: {data[:300]!r}")
                continue
            spend_ids.append(answer.get("spend_id"))
            if lat is not None:
                lat.append(dt)

    conns = [Connection(port, k) for k in keys]
    try:
        await asyncio.gather(*(run(c, WARMUP, None) for c in conns))
        warm_ok = len(spend_ids)
        lats: list[list[float]] = [[] for _ in conns]
        t0 = time.perf_counter()
        await asyncio.gather(*(run(c, per_client, lat) for c, lat in zip(conns, lats)))
        wall = time.perf_counter() - t0
    finally:
        await asyncio.gather(*(c.close() for c in conns))
    measured = [x for lat in lats for x in lat]
    return {"answered": len(spend_ids), "warmup_answered": warm_ok, "measured": len(measured), "wall_s": wall, "latencies": measured,
            "errors": errors, "spend_ids": spend_ids}


def first_query(server: Server, key: str) -> tuple[float, Any]:
    """Milliseconds of the first query after start (it opens the dataset), and its spend id."""
    async def one() -> tuple[int, bytes]:
        conn = Connection(server.port, key)
        try:
            return await conn.send(conn.request_bytes(f"/v1/datasets/{DATASET}/query", json.dumps({"epsilon": EPSILON, "sql": QUERIES["COUNT"][0]}).encode()))
        finally:
            await conn.close()

    t = time.perf_counter()
    status, data = asyncio.run(one())
    ms = 1e3 * (time.perf_counter() - t)
    if status != 200:
        raise RuntimeError(f"the first query failed: HTTP {status} {data[:300]!r}")
    print(f"[bench] first query after start (opens the data): {ms:.0f} ms", file=sys.stderr)
    return ms, json.loads(data).get("spend_id")


def http_load(server: Server, keys: list[str], scale: float, backend: str, label: str, runs: list[tuple[str, int]]) -> tuple[list[dict[str, Any]], list[Any]]:
    """The rows of ``runs`` ((query kind, clients)) against one server, and every 200's spend id."""
    rows, spend_ids = [], []
    for kind, clients in runs:
        sql, per16, n1 = QUERIES[kind]
        per_client = max(1, round((n1 if clients == 1 else per16) * scale))
        assert server.proc is not None
        cpu0, me0, split0 = cpu_seconds(server.proc.pid), time.process_time(), cpu_by_process(server.proc.pid)
        res = asyncio.run(_load(server.port, keys[:clients], sql, per_client))
        cpu1, me1, split1 = cpu_seconds(server.proc.pid), time.process_time(), cpu_by_process(server.proc.pid)
        # How the load fell on the processes (the kernel spreads connections over the workers'
        # sockets by a hash: 16 keep-alive connections rarely split evenly).
        split = sorted((round(split1[p] - split0.get(p, 0.0), 2) for p in split1 if split1[p] - split0.get(p, 0.0) > 0.02), reverse=True)
        lat = res.pop("latencies")
        spend_ids += res["spend_ids"]
        row = {
            "label": label, "backend": backend, "workers": server.workers, "query": kind, "sql": sql, "clients": clients, "queries_per_client": per_client,
            "queries": res["measured"], "wall_s": res["wall_s"], "qps": res["measured"] / res["wall_s"] if res["wall_s"] else 0.0,
            **(summary(lat) if lat else {}),
            "errors": len(res["errors"]), "first_errors": res["errors"][:3],
            "answered_total": res["answered"],
            "server_cpu_ms_per_query": None if cpu0 is None or cpu1 is None else 1e3 * (cpu1 - cpu0) / max(1, res["answered"]),
            "client_cpu_ms_per_query": 1e3 * (me1 - me0) / max(1, res["answered"]),
            "cpu_s_by_process": split,
        }
        rows.append(row)
        print(f"[bench] {backend:8s} workers={server.workers} {kind:24s} clients={clients:2d} {row['qps']:7.1f} q/s  p50 {row.get('p50_ms', float('nan')):7.1f} ms"
              f"  p99 {row.get('p99_ms', float('nan')):7.1f} ms  server CPU {row['server_cpu_ms_per_query'] or float('nan'):5.2f} ms/q"
              f"  client CPU {row['client_cpu_ms_per_query']:5.2f} ms/q  errors {row['errors']}  CPU s by process {split}", file=sys.stderr)
    return rows, spend_ids


def _timed_threads(fn: Any, threads: int, per_thread: int, warmup: int) -> tuple[list[float], float, list[str]]:
    """Run ``fn(i)`` ``per_thread`` times in each of ``threads`` threads (thread i passes i);
    the latencies, the wall time of the timed part and any errors."""
    lats: list[list[float]] = [[] for _ in range(threads)]
    errors: list[str] = []
    barrier = threading.Barrier(threads + 1)

    def work(i: int) -> None:
        try:
            for _ in range(warmup):
                fn(i)
        except Exception as exc:  # noqa: BLE001 - reported, the run goes on
            errors.append(f"{type(exc).__name__}: {exc}"[:300])
        barrier.wait()
        out = lats[i]
        for _ in range(per_thread):
            t = time.perf_counter()
            try:
                fn(i)
            except Exception as exc:  # noqa: BLE001
                errors.append(f"{type(exc).__name__}: {exc}"[:300])
                continue
            out.append(time.perf_counter() - t)

    ts = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for t in ts:
        t.start()
    barrier.wait()
    t0 = time.perf_counter()
    for t in ts:
        t.join()
    return [x for lat in lats for x in lat], time.perf_counter() - t0, errors


def in_process(url: str, backend: str, keys: list[str], scale: float, debits: int, kwargs: dict[str, Any], label: str) -> list[dict[str, Any]]:
    from dpkit.accounting import LaplaceEvent
    from dpkit.server.service import QueryRequest, Service

    rows: list[dict[str, Any]] = []
    threads = len(keys)
    event = LaplaceEvent(noise_multiplier=1 / EPSILON)
    text = f"SELECT COUNT(*) FROM {DATASET}"

    def record(op: str, n_threads: int, lat: list[float], wall: float, errors: list[str]) -> None:
        row = {"label": label, "backend": backend, "operation": op, "threads": n_threads, "n": len(lat), "wall_s": wall,
               "ops_per_s": len(lat) / wall if wall else 0.0, **(summary(lat) if lat else {}),
               "errors": len(errors), "first_errors": errors[:3]}
        rows.append(row)
        print(f"[bench] {backend:8s} {op:28s} threads={n_threads:2d} n={len(lat):5d} {row['ops_per_s']:8.1f}/s  p50 {row.get('p50_ms', float('nan')):7.2f} ms"
              f"  p99 {row.get('p99_ms', float('nan')):7.2f} ms  errors {len(errors)}", file=sys.stderr)

    with Service(url, **kwargs) as svc:
        who = [svc.authenticate(k) for k in keys]
        # Service.query without HTTP: what the engine, the ledger reads and the debit cost.
        for kind, (sql, _, n1) in QUERIES.items():
            n = max(5, round(n1 * scale / 4))
            req = QueryRequest(epsilon=EPSILON, sql=sql)
            lat, wall, errs = _timed_threads(lambda i: svc.query(who[i], DATASET, req), 1, n, 3)
            record(f"Service.query {kind}", 1, lat, wall, errs)
        # The ledger writes of one request, alone. One budget per thread.
        ledger = svc.ledger
        bench_ds = "debit_bench"
        for i in range(threads):
            ledger.create_budget(bench_ds, f"d{i:02d}", epsilon=BUDGET)

        def debit(i: int) -> None:
            ledger.debit(bench_ds, f"d{i:02d}", event, text)

        # (the amount only where Service.audit still takes one: a debit may record its own entry)
        amount = {"epsilon": EPSILON} if "epsilon" in _parameters(svc.audit) else {}

        def audit(i: int) -> None:
            svc.audit(actor=f"d{i:02d}", action="query", status=200, outcome="ok", dataset=DATASET, detail={"query": text, "key_id": "bench"}, **amount)

        def both(i: int) -> None:
            debit(i)
            audit(i)

        for op, fn in (("ledger.debit", debit), ("Service.audit (append)", audit), ("debit + audit", both)):
            lat, wall, errs = _timed_threads(fn, 1, debits, 50)
            record(op, 1, lat, wall, errs)
            per = max(1, debits // threads)
            lat, wall, errs = _timed_threads(fn, threads, per, 5)
            record(op, threads, lat, wall, errs)
    return rows


def fsync_cost(directory: Path, n: int) -> dict[str, Any]:
    """A 4 KiB write + fdatasync on the ledger's file system: the floor under every commit."""
    path = directory / "fsync.bin"
    sync = getattr(os, "fdatasync", os.fsync)
    block = os.urandom(4096)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        lat = []
        t0 = time.perf_counter()
        for i in range(n + 20):
            t = time.perf_counter()
            os.pwrite(fd, block, (i % 64) * 4096)
            sync(fd)
            if i >= 20:
                lat.append(time.perf_counter() - t)
            else:
                t0 = time.perf_counter()
        wall = time.perf_counter() - t0
    finally:
        os.close(fd)
        path.unlink()
    row = {"backend": "file system", "operation": "4 KiB write + fdatasync", "threads": 1, "n": n, "wall_s": wall,
           "ops_per_s": n / wall, **summary(lat), "errors": 0, "first_errors": []}
    print(f"[bench] raw write+fdatasync: p50 {row['p50_ms']:.2f} ms, p99 {row['p99_ms']:.2f} ms", file=sys.stderr)
    return row


def checks_after_load(url: str, spend_ids: list[Any], keys: list[str], kwargs: dict[str, Any]) -> dict[str, Any]:
    """After the load: every 200 has exactly one spend in the ledger and exactly one audit entry
    naming its spend id (``detail["spend_id"]``), the ledger holds no other spend, the audit chain
    verifies and no spend is unlogged."""
    from collections import Counter

    from dpkit.server.service import Service

    answered = len(spend_ids)
    with Service(url, **kwargs) as svc:
        ledger_ids = Counter(s.id for i in range(len(keys)) for s in svc.ledger.list_spends(DATASET, f"analyst{i:02d}"))
        naming: Counter[Any] = Counter()  # entries whose detail names the spend
        paying: Counter[Any] = Counter()  # of those, the ones recording an amount
        for e in svc.audit_entries(limit=2**62):
            sid = e.detail.get("spend_id") if isinstance(e.detail, dict) else None
            if sid is not None:
                naming[sid] += 1
                if getattr(e, "epsilon", None) is not None:
                    paying[sid] += 1
        # An answer's entry is the one that records its amount; a log whose entries record none
        # counts every entry naming the spend.
        entries = paying if paying else naming
        try:
            report = svc.verify_log()
            chain_ok, n_entries, why = True, report.entries, ""
        except Exception as exc:  # noqa: BLE001 - reported
            chain_ok, n_entries, why = False, None, str(exc)[:300]
        unlogged = svc.unlogged_spends()
    answers = Counter(spend_ids)
    no_id = answers.pop(None, 0)
    answered_twice = sum(1 for n in answers.values() if n > 1)
    without_spend = sum(1 for sid in answers if ledger_ids.get(sid, 0) != 1)
    entry_not_one = sum(1 for sid in answers if entries.get(sid, 0) != 1)
    spends_unanswered = sum(1 for sid in ledger_ids if sid not in answers)
    spends_match = no_id == 0 and answered_twice == 0 and without_spend == 0 and spends_unanswered == 0
    return {
        "answered_200": answered, "spends": sum(ledger_ids.values()), "spends_match": spends_match,
        "answers_without_spend_id": no_id, "spend_ids_answered_twice": answered_twice, "answers_without_exactly_one_spend": without_spend,
        "spends_not_answered": spends_unanswered, "answers_without_exactly_one_entry": entry_not_one, "entries_match": entry_not_one == 0 and no_id == 0,
        "entries_counted": "entries recording an amount" if paying else "every entry naming the spend",
        "answers_named_by_several_entries": sum(1 for sid in answers if naming.get(sid, 0) > 1),
        "audit_chain_ok": chain_ok, "audit_entries": n_entries, "audit_problem": why, "unlogged_spends": len(unlogged),
    }


def checks_ok(c: dict[str, Any]) -> bool:
    return bool(c["spends_match"] and c.get("entries_match", True) and c["audit_chain_ok"] and c["unlogged_spends"] == 0)


# ------------------------------------------------------------------------------------------------
# tables
# ------------------------------------------------------------------------------------------------

HTTP_HEADERS = ["run", "ledger", "workers", "query", "clients", "queries", "queries/s", "p50 ms", "p99 ms", "max ms", "server CPU ms/q", "client CPU ms/q", "errors"]
HTTP_LEFT = ["run", "ledger", "query"]
PROC_HEADERS = ["run", "ledger", "operation", "threads", "n", "ops/s", "p50 ms", "p99 ms", "max ms", "errors"]
PROC_LEFT = ["run", "ledger", "operation"]


def _f(x: Any, digits: int = 1) -> str:
    if x is None:
        return "—"
    return f"{x:,.{digits}f}"


def render(data: dict[str, Any]) -> None:
    """The tables of a results file (also of one written before the ``run`` and ``workers``
    columns existed: those rows are one worker, named by their date)."""
    meta = data["meta"]
    label = _label(meta)
    http_cells = [
        [r.get("label", label), r["backend"], str(r.get("workers", 1)), r["query"], str(r["clients"]), f"{r['queries']:,}", _f(r["qps"]), _f(r.get("p50_ms")),
         _f(r.get("p99_ms")), _f(r.get("max_ms")), _f(r.get("server_cpu_ms_per_query"), 2), _f(r.get("client_cpu_ms_per_query"), 2), str(r["errors"])]
        for r in data["http"]
    ]
    proc_cells = [
        [r.get("label", label), r["backend"], r["operation"], str(r["threads"]), f"{r['n']:,}", _f(r["ops_per_s"]), _f(r.get("p50_ms"), 2), _f(r.get("p99_ms"), 2),
         _f(r.get("max_ms"), 2), str(r["errors"])]
        for r in data["inprocess"]
    ]
    workers = sorted({r.get("workers", 1) for r in data["http"]})
    notes = [
        f"{meta['rows']:,} rows (Parquet); ε = {EPSILON} per query; {meta['clients']} analysts, one keep-alive connection each; "
        f"{meta.get('server', 'uvicorn')}; workers {', '.join(map(str, workers))}; loopback; server and clients share {meta['cpu_count']} CPUs",
        f"client: {meta.get('client', 'httpx.AsyncClient')}",
        "latency = client-side time of one request (with 16 clients it includes queueing in the server)",
        "server CPU ms/q = CPU time of the server's process tree (every worker, all threads) during the run / answered queries; "
        "client CPU ms/q = the load generator's",
        f"load average before / after: {meta.get('loadavg_before')} / {meta.get('loadavg_after')} (the run itself adds about 2; "
        "other work on the machine inflates every number, the contended tails most)",
    ]
    for b, c in data["checks"].items():
        extra = ""
        if "entries_match" in c:
            extra = (f", every answer with exactly one spend: {c['spends_match']}, with exactly one audit entry naming it: {c['entries_match']}"
                     f" ({c['spends_not_answered']} spends not answered)")
        notes.append(f"{b}: {c['answered_200']} answers, {c['spends']} spends{extra}, audit chain ok={c['audit_chain_ok']}, unlogged spends={c['unlogged_spends']}; "
                     f"first query after start (opens the data) {_f(c.get('first_query_ms'), 0)} ms")
    for b, why in meta.get("skipped", {}).items():
        notes.append(f"{b}: skipped ({why})")
    goal = data.get("goal", {})
    if goal:
        notes.append(f"goal: SQLite debit p99 <= 10 ms: {'met' if goal.get('met') else 'NOT met'} one at a time, "
                     f"{'met' if goal.get('met_under_contention') else 'not met'} with {meta['clients']} threads debiting at once ({goal.get('detail')})")
    for g in data.get("throughput_goal", []):
        notes.append(f"goal {g['what']}: {'met' if g['met'] else 'NOT met'} ({g['detail']})")
    title = f"Curator service over HTTP, {meta['date']}, {meta['cpu_count']} CPUs"
    _report.print_table(title, HTTP_HEADERS, HTTP_LEFT, ((c, c[0] + c[1] + c[2], False) for c in http_cells), [], to_stderr=True, width=190)
    title2 = "Ledger and audit writes alone (in-process, same database)"
    _report.print_table(title2, PROC_HEADERS, PROC_LEFT, ((c, c[0] + c[1], c[2] == "ledger.debit") for c in proc_cells), notes, to_stderr=True, width=190)
    print(_report.markdown("### " + title, HTTP_HEADERS, HTTP_LEFT, http_cells, []))
    print()
    print(_report.markdown("### " + title2, PROC_HEADERS, PROC_LEFT, proc_cells, notes))


# ------------------------------------------------------------------------------------------------


def fs_type(path: Path) -> str | None:
    """The file system type of ``path`` from /proc/mounts (Linux), else None."""
    try:
        mounts = [line.split() for line in Path("/proc/mounts").read_text().splitlines()]
    except OSError:
        return None
    p = str(path.resolve())
    best = max((m for m in mounts if len(m) > 2 and (p == m[1] or p.startswith(m[1].rstrip("/") + "/"))), key=lambda m: len(m[1]), default=None)
    return None if best is None else best[2]


def run_label() -> str:
    """The commit being measured, with '+' when the working tree has changes."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "src"], capture_output=True, text=True, cwd=REPO, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (head or "unknown") + ("+" if dirty else "")


def _label(meta: dict[str, Any]) -> str:
    """A run's label; a file from before labels existed is named by its date and client."""
    return str(meta.get("label") or f"{meta['date'][:16]} ({'httpx' if 'httpx' in meta.get('client', 'httpx') else 'raw'} client)")


def merge(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Several results files as one (rows labelled by their run), for side-by-side tables."""
    if len(results) == 1:
        return results[0]
    out = {**results[-1], "http": [], "inprocess": [], "checks": {}, "throughput_goal": []}
    for data in results:
        label = _label(data["meta"])
        out["http"] += [{"label": label, **r} for r in data["http"]]
        out["inprocess"] += [{"label": label, **r} for r in data["inprocess"]]
        out["checks"].update({f"{label} {b}": c for b, c in data["checks"].items()})
        out["throughput_goal"] += [{**g, "what": f"{label}: {g['what']}"} for g in data.get("throughput_goal", [])]
    return out


def throughput_goal(rows: list[dict[str, Any]], clients: int) -> list[dict[str, Any]]:
    """The service goal on the COUNT / ``clients`` rows: >= 400 q/s with p99 <= 100 ms on SQLite,
    and >= 2x the earlier 75 q/s (150 q/s) on PostgreSQL; the best worker count of each ledger."""
    out = []
    for backend, what, ok in (("sqlite", ">= 400 COUNT q/s, p99 <= 100 ms, SQLite", lambda r: r["qps"] >= 400 and r.get("p99_ms", 1e9) <= 100),
                              ("postgres", ">= 150 COUNT q/s (2x 75), PostgreSQL", lambda r: r["qps"] >= 150)):
        cand = [r for r in rows if r["backend"] == backend and r["query"] == "COUNT" and r["clients"] == clients]
        if cand:
            out.append({"what": f"{what}, {clients} clients", "met": any(ok(r) for r in cand),
                        "detail": ", ".join(f"{r['workers']} worker(s): {r['qps']:.0f} q/s, p99 {r.get('p99_ms', float('nan')):.0f} ms" for r in cand)})
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--scale", type=float, default=1.0, help="multiplies the number of queries of every run (default 1)")
    ap.add_argument("--debits", type=int, default=2000, help="debits / audit appends per in-process run (default 2000)")
    ap.add_argument("--backends", default="sqlite,postgres")
    ap.add_argument("--no-start-postgres", action="store_true", help="use a running scripts/postgres.sh server only")
    ap.add_argument("--workdir", type=Path, default=None, help="where the temporary directory goes (default: the system's)")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--render", type=Path, nargs="+", metavar="JSON", help="print the tables of earlier results files (one table, side by side); run nothing")
    ap.add_argument("--workers", default="1,2",
                    help="dpkit serve --workers values, comma-separated (default 1,2): every query runs with the first, "
                         "the COUNT / 16-client row with each of the others (all rows with --all-rows)")
    ap.add_argument("--all-rows", action="store_true", help="run every query and client count with every --workers value")
    ap.add_argument("--label", default=None, help="names this run in the tables (default: the commit, '+' when the tree has changes)")
    ap.add_argument("--no-inprocess", action="store_true", help="skip the in-process measurements")
    args = ap.parse_args()
    if args.render:
        render(merge([json.loads(path.read_text()) for path in args.render]))
        return 0
    workers = [int(w) for w in args.workers.split(",") if w.strip()]
    if not workers or min(workers) < 1:
        raise SystemExit(f"--workers {args.workers!r}: worker counts >= 1, comma-separated")
    label = args.label or run_label()

    started = time.perf_counter()
    load_before = [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    tmp = Path(tempfile.mkdtemp(prefix="dpkit-bench-server-", dir=args.workdir))
    http_rows: list[dict[str, Any]] = []
    proc_rows: list[dict[str, Any]] = []
    checks: dict[str, Any] = {}
    skipped: dict[str, str] = {}
    pg_info: dict[str, Any] | None = None
    try:
        parquet = tmp / f"{DATASET}.parquet"
        t = time.perf_counter()
        make_dataset(parquet, args.rows)
        print(f"[bench] {args.rows:,} rows written in {time.perf_counter() - t:.1f} s ({parquet.stat().st_size / 1e6:.1f} MB)", file=sys.stderr)
        proc_rows.append(fsync_cost(tmp, max(100, args.debits // 4)))
        for backend in backends:
            with contextlib.ExitStack() as stack:
                if backend == "sqlite":
                    url = f"sqlite:///{(tmp / 'ledger.sqlite').as_posix()}"
                elif backend == "postgres":
                    url, info = stack.enter_context(postgres_schema(not args.no_start_postgres))
                    if url is None:
                        skipped[backend] = info
                        print(f"[bench] postgres skipped: {info}", file=sys.stderr)
                        continue
                    pg_info = info
                else:
                    raise SystemExit(f"unknown backend {backend!r} (sqlite, postgres)")
                kwargs, cli = service_options(tmp)
                keys = setup_service(url, parquet, args.clients, kwargs)
                spend_ids: list[Any] = []
                cold_ms = None
                all_runs = [(kind, c) for kind in QUERIES for c in (1, args.clients)]
                for n in workers:
                    runs = all_runs if (n == workers[0] or args.all_rows) else [("COUNT", args.clients)]
                    server = Server(url, tmp / f"server-{backend}-{n}.log", n, cli)
                    print(f"[bench] {server.command}", file=sys.stderr)
                    with server:
                        ms, sid = first_query(server, keys[0])
                        cold_ms = ms if cold_ms is None else cold_ms
                        spend_ids.append(sid)
                        rows, ids = http_load(server, keys, args.scale, backend, label, runs)
                    http_rows += rows
                    spend_ids += ids
                    if server.proc is not None and server.proc.returncode not in (0, 130, -signal.SIGINT):  # 130: stopped by Ctrl-C
                        print(f"[bench] the server exited with {server.proc.returncode}:\n{server.tail()}", file=sys.stderr)
                checks[backend] = checks_after_load(url, spend_ids, keys, kwargs)
                checks[backend]["first_query_ms"] = cold_ms
                print(f"[bench] {backend} checks: {checks[backend]}", file=sys.stderr)
                if not args.no_inprocess:
                    proc_rows += in_process(url, backend, keys, args.scale, args.debits, kwargs, label)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    goal_rows = [r for r in proc_rows if r["backend"] == "sqlite" and r["operation"] == "ledger.debit"]
    goal = {}
    if goal_rows:
        one = next((r for r in goal_rows if r["threads"] == 1), None)
        many = next((r for r in goal_rows if r["threads"] > 1), None)
        goal = {"what": "p99 of ledger.debit on SQLite <= 10 ms (one debit at a time)",
                "met": one is not None and one.get("p99_ms", float("inf")) <= 10.0,
                "met_under_contention": many is not None and many.get("p99_ms", float("inf")) <= 10.0,
                "detail": ", ".join(f"{r['threads']} thread{'s' if r['threads'] > 1 else ''}: p99 {r.get('p99_ms', float('nan')):.2f} ms" for r in goal_rows)}
    import duckdb

    meta = {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "rows": args.rows, "clients": args.clients, "scale": args.scale, "epsilon_per_query": EPSILON, "budget_per_analyst": BUDGET,
        "warmup_per_client": WARMUP, "seed": SEED, "metadata": METADATA,
        "label": label, "workers": workers,
        "server": "dpkit serve --workers N --rate 1e9 --burst 10**9 (uvicorn, 127.0.0.1)",
        "client": "raw HTTP/1.1 over asyncio streams, one keep-alive connection per analyst, same machine",
        "ledger_fs": fs_type(Path(args.workdir or tempfile.gettempdir())), "postgres": pg_info, "skipped": skipped,
        "duckdb_threads": duckdb.connect().execute("SELECT current_setting('threads')").fetchone()[0],  # type: ignore[index]
        "python": platform.python_version(), "platform": platform.platform(), "cpu_count": os.cpu_count(),
        "versions": {d: _report.version(d) for d in ("dpkit", "fastapi", "starlette", "pydantic", "uvicorn", "httpx", "duckdb", "psycopg", "numpy")},
        "loadavg_before": load_before, "loadavg_after": [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None,
        "runtime_s": round(time.perf_counter() - started, 1),
    }
    data = {"benchmark": "server", "meta": meta, "http": http_rows, "inprocess": proc_rows, "checks": checks, "goal": goal,
            "throughput_goal": throughput_goal(http_rows, args.clients)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n")
    print(f"[bench] wrote {args.out.resolve().relative_to(REPO) if args.out.resolve().is_relative_to(REPO) else args.out} in {meta['runtime_s']} s", file=sys.stderr)
    render(data)
    failed = sum(r["errors"] for r in http_rows + proc_rows)
    bad_checks = [b for b, c in checks.items() if not checks_ok(c)]
    if failed or bad_checks:
        print(f"[bench] FAILED: {failed} errors; checks failed for {bad_checks or 'none'}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
