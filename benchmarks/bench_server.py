"""The curator service over HTTP: throughput and latency of paid, audited queries on 1,000,000 rows.

What is measured, for the SQLite ledger and (when a server is reachable and
``dpkit.ledger.postgres`` exists) the PostgreSQL ledger:

1. **HTTP load.** A 1,000,000-row Parquet file (numpy, seeded: ``age`` int 18–90, ``income``
   float, ``region`` one of 5 public categories) is registered with a :class:`Service`; 16
   analysts get a budget of ε = 10⁶ each. The FastAPI app (``create_app``) runs in a uvicorn
   subprocess (one worker, 127.0.0.1, rate limit effectively off: rate=1e9, burst=10⁹). Clients
   are ``httpx.AsyncClient`` keep-alive connections in this process, one per analyst, each
   sending its queries back to back (after a warm-up): ``SELECT COUNT(*)``, ``SELECT AVG(age)``
   and ``SELECT region, COUNT(*) ... GROUP BY region`` at ε = 0.001, with 1 client and with 16.
   Throughput = answered queries / wall time; latency = client-side time of one request;
   errors = anything but a 200 with a JSON answer. Server CPU per query comes from
   ``/proc/PID/stat``. Afterwards every 200 must have exactly one spend in the ledger, the audit
   chain must verify and no spend may be unlogged.
2. **In-process costs**, on the same database (server stopped): ``Service.query`` without HTTP
   (engine + ledger reads + debit + noise), ``ledger.debit`` alone, ``Service.audit`` (one
   hash-chained audit append) alone, and debit followed by audit (the ledger writes of one
   request), each sequentially and from 16 threads (one budget per thread); and, as the floor
   under every commit, a raw 4 KiB write + fdatasync in the same directory. Goal: p99 of a
   debit ≤ 10 ms on SQLite.

    .venv-bench/bin/python benchmarks/bench_server.py                 # about 80 s on an idle 2-core machine
    .venv-bench/bin/python benchmarks/bench_server.py --backends sqlite --scale 0.25   # quick check
    .venv-bench/bin/python benchmarks/bench_server.py --render benchmarks/results/server.json

The ledger files live in a temporary directory (``--workdir`` to choose its file system: on
tmpfs an fsync costs nothing). PostgreSQL: the server of ``scripts/postgres.sh`` (started if it
is not running, and stopped again at the end if this script started it); the benchmark works in
a schema of its own, dropped afterwards. Results: ``benchmarks/results/server.json``, a rich
table on stderr, Markdown on stdout. Exit status 1 when any request failed or a check did not
hold.
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
# the server subprocess
# ------------------------------------------------------------------------------------------------


def serve(url: str, port: int) -> None:
    """Run the app on 127.0.0.1:port (the subprocess side; never returns until stopped)."""
    import uvicorn

    from dpkit.server.app import create_app

    app = create_app(url, rate=1e9, burst=10**9)
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", workers=1)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of a process and all its threads (Linux), else None."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


class Server:
    """``create_app(url)`` under uvicorn in a subprocess; stopped with SIGINT on exit."""

    def __init__(self, url: str, log: Path) -> None:
        self.url, self.log = url, log
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Server:
        import httpx

        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, str(Path(__file__).resolve()), "--serve", self.url, "--port", str(self.port)],
                stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO,
            )
        deadline = time.monotonic() + 60
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited with status {self.proc.returncode}:\n{self.tail()}")
            try:
                if httpx.get(self.base + "/", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
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
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def __exit__(self, *exc: object) -> None:
        self.stop()


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


def setup_service(url: str, parquet: Path, clients: int) -> list[str]:
    """Register the dataset, create ``clients`` analysts with budgets; their API keys."""
    from dpkit.server.service import Service

    with Service(url) as svc:
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


async def _load(base: str, keys: list[str], sql: str, per_client: int) -> dict[str, Any]:
    import httpx

    body = {"epsilon": EPSILON, "sql": sql}
    path = f"/v1/datasets/{DATASET}/query"
    errors: list[str] = []
    ok = [0]

    async def one(client: httpx.AsyncClient, lat: list[float] | None) -> None:
        t = time.perf_counter()
        try:
            r = await client.post(path, json=body)
            good = r.status_code == 200 and "epsilon" in r.json()
        except (httpx.HTTPError, ValueError) as exc:
            errors.append(f"{type(exc).__name__}: {exc}"[:300])
            return
        dt = time.perf_counter() - t
        if not good:
            errors.append(f"HTTP {r.status_code}: {r.text[:300]}")
            return
        ok[0] += 1
        if lat is not None:
            lat.append(dt)

    async def run(client: httpx.AsyncClient, n: int, lat: list[float] | None) -> None:
        for _ in range(n):
            await one(client, lat)

    clients = [
        httpx.AsyncClient(base_url=base, headers={"Authorization": f"Bearer {k}"}, timeout=120,
                          limits=httpx.Limits(max_connections=1, max_keepalive_connections=1))
        for k in keys
    ]
    try:
        await asyncio.gather(*(run(c, WARMUP, None) for c in clients))
        warm_ok = ok[0]
        lats: list[list[float]] = [[] for _ in clients]
        t0 = time.perf_counter()
        await asyncio.gather(*(run(c, per_client, lat) for c, lat in zip(clients, lats)))
        wall = time.perf_counter() - t0
    finally:
        await asyncio.gather(*(c.aclose() for c in clients))
    measured = [x for lat in lats for x in lat]
    return {"answered": ok[0], "warmup_answered": warm_ok, "measured": len(measured), "wall_s": wall, "latencies": measured, "errors": errors}


def first_query(server: Server, key: str) -> float:
    """Milliseconds of the first query after start: it loads the Parquet file into DuckDB."""
    import httpx

    body = {"epsilon": EPSILON, "sql": QUERIES["COUNT"][0]}
    t = time.perf_counter()
    r = httpx.post(f"{server.base}/v1/datasets/{DATASET}/query", json=body, headers={"Authorization": f"Bearer {key}"}, timeout=120)
    ms = 1e3 * (time.perf_counter() - t)
    if r.status_code != 200:
        raise RuntimeError(f"the first query failed: HTTP {r.status_code} {r.text[:300]}")
    print(f"[bench] first query after start (loads the data): {ms:.0f} ms", file=sys.stderr)
    return ms


def http_load(server: Server, keys: list[str], scale: float, backend: str) -> list[dict[str, Any]]:
    rows = []
    for kind, (sql, per16, n1) in QUERIES.items():
        for clients in (1, len(keys)):
            per_client = max(1, round((n1 if clients == 1 else per16) * scale))
            assert server.proc is not None
            cpu0, me0 = cpu_seconds(server.proc.pid), time.process_time()
            res = asyncio.run(_load(server.base, keys[:clients], sql, per_client))
            cpu1, me1 = cpu_seconds(server.proc.pid), time.process_time()
            lat = res.pop("latencies")
            row = {
                "backend": backend, "query": kind, "sql": sql, "clients": clients, "queries_per_client": per_client,
                "queries": res["measured"], "wall_s": res["wall_s"], "qps": res["measured"] / res["wall_s"] if res["wall_s"] else 0.0,
                **(summary(lat) if lat else {}),
                "errors": len(res["errors"]), "first_errors": res["errors"][:3],
                "answered_total": res["answered"],
                "server_cpu_ms_per_query": None if cpu0 is None or cpu1 is None else 1e3 * (cpu1 - cpu0) / max(1, res["answered"]),
                "client_cpu_ms_per_query": 1e3 * (me1 - me0) / max(1, res["answered"]),
            }
            rows.append(row)
            print(f"[bench] {backend:8s} {kind:24s} clients={clients:2d} {row['qps']:7.1f} q/s  p50 {row.get('p50_ms', float('nan')):7.1f} ms"
                  f"  p99 {row.get('p99_ms', float('nan')):7.1f} ms  errors {row['errors']}", file=sys.stderr)
    return rows


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


def in_process(url: str, backend: str, keys: list[str], scale: float, debits: int) -> list[dict[str, Any]]:
    from dpkit.accounting import LaplaceEvent
    from dpkit.server.service import QueryRequest, Service

    rows: list[dict[str, Any]] = []
    threads = len(keys)
    event = LaplaceEvent(noise_multiplier=1 / EPSILON)
    text = f"SELECT COUNT(*) FROM {DATASET}"

    def record(op: str, n_threads: int, lat: list[float], wall: float, errors: list[str]) -> None:
        row = {"backend": backend, "operation": op, "threads": n_threads, "n": len(lat), "wall_s": wall,
               "ops_per_s": len(lat) / wall if wall else 0.0, **(summary(lat) if lat else {}),
               "errors": len(errors), "first_errors": errors[:3]}
        rows.append(row)
        print(f"[bench] {backend:8s} {op:28s} threads={n_threads:2d} n={len(lat):5d} {row['ops_per_s']:8.1f}/s  p50 {row.get('p50_ms', float('nan')):7.2f} ms"
              f"  p99 {row.get('p99_ms', float('nan')):7.2f} ms  errors {len(errors)}", file=sys.stderr)

    with Service(url) as svc:
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

        def audit(i: int) -> None:
            svc.audit(actor=f"d{i:02d}", action="query", status=200, outcome="ok", dataset=DATASET, epsilon=EPSILON,
                      detail={"query": text, "key_id": "bench", "spend_id": 0})

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


def checks_after_load(url: str, answered: int, keys: list[str]) -> dict[str, Any]:
    """Every 200 has exactly one spend; the audit chain verifies; no spend is unlogged."""
    from dpkit.server.service import Service

    with Service(url) as svc:
        spends = sum(len(svc.ledger.list_spends(DATASET, f"analyst{i:02d}")) for i in range(len(keys)))
        try:
            report = svc.verify_log()
            chain_ok, entries, why = True, report.entries, ""
        except Exception as exc:  # noqa: BLE001 - reported
            chain_ok, entries, why = False, None, str(exc)[:300]
        unlogged = svc.unlogged_spends()
    return {"answered_200": answered, "spends": spends, "spends_match": spends == answered, "audit_chain_ok": chain_ok,
            "audit_entries": entries, "audit_problem": why, "unlogged_spends": len(unlogged)}


# ------------------------------------------------------------------------------------------------
# tables
# ------------------------------------------------------------------------------------------------

HTTP_HEADERS = ["ledger", "query", "clients", "queries", "queries/s", "p50 ms", "p99 ms", "max ms", "server CPU ms/q", "client CPU ms/q", "errors"]
HTTP_LEFT = ["ledger", "query"]
PROC_HEADERS = ["ledger", "operation", "threads", "n", "ops/s", "p50 ms", "p99 ms", "max ms", "errors"]
PROC_LEFT = ["ledger", "operation"]


def _f(x: Any, digits: int = 1) -> str:
    if x is None:
        return "—"
    return f"{x:,.{digits}f}"


def render(data: dict[str, Any]) -> None:
    meta = data["meta"]
    http_cells = [
        [r["backend"], r["query"], str(r["clients"]), f"{r['queries']:,}", _f(r["qps"]), _f(r.get("p50_ms")), _f(r.get("p99_ms")),
         _f(r.get("max_ms")), _f(r.get("server_cpu_ms_per_query")), _f(r.get("client_cpu_ms_per_query")), str(r["errors"])]
        for r in data["http"]
    ]
    proc_cells = [
        [r["backend"], r["operation"], str(r["threads"]), f"{r['n']:,}", _f(r["ops_per_s"]), _f(r.get("p50_ms"), 2), _f(r.get("p99_ms"), 2),
         _f(r.get("max_ms"), 2), str(r["errors"])]
        for r in data["inprocess"]
    ]
    notes = [
        f"{meta['rows']:,} rows (Parquet); ε = {EPSILON} per query; {meta['clients']} analysts, one keep-alive connection each; "
        f"uvicorn {meta['versions'].get('uvicorn')}, 1 worker, loopback; server and clients share {meta['cpu_count']} CPUs",
        "latency = client-side time of one request (with 16 clients it includes queueing in the server)",
        "server (client) CPU ms/q = CPU time of the server process, all threads (of the client process) during the run / answered queries",
        f"load average before / after: {meta.get('loadavg_before')} / {meta.get('loadavg_after')} (the run itself adds about 2; "
        "other work on the machine inflates every number, the contended tails most)",
    ]
    for b, c in data["checks"].items():
        notes.append(f"{b}: {c['answered_200']} answers, {c['spends']} spends, audit chain ok={c['audit_chain_ok']}, unlogged spends={c['unlogged_spends']}; "
                     f"first query after start (loads the Parquet file into DuckDB) {_f(c.get('first_query_ms'), 0)} ms")
    for b, why in meta.get("skipped", {}).items():
        notes.append(f"{b}: skipped ({why})")
    goal = data.get("goal", {})
    if goal:
        notes.append(f"goal: SQLite debit p99 <= 10 ms: {'met' if goal.get('met') else 'NOT met'} one at a time, "
                     f"{'met' if goal.get('met_under_contention') else 'not met'} with {meta['clients']} threads debiting at once ({goal.get('detail')})")
    title = f"Curator service over HTTP, {meta['date']}, {meta['cpu_count']} CPUs"
    _report.print_table(title, HTTP_HEADERS, HTTP_LEFT, ((c, c[0] + c[1], False) for c in http_cells), [], to_stderr=True, width=170)
    title2 = "Ledger and audit writes alone (in-process, same database)"
    _report.print_table(title2, PROC_HEADERS, PROC_LEFT, ((c, c[0], c[1] == "ledger.debit") for c in proc_cells), notes, to_stderr=True, width=170)
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
    ap.add_argument("--render", type=Path, metavar="JSON", help="print the tables of an earlier results file; run nothing")
    ap.add_argument("--serve", metavar="URL", help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        serve(args.serve, args.port)
        return 0
    if args.render:
        render(json.loads(args.render.read_text()))
        return 0

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
                keys = setup_service(url, parquet, args.clients)
                with Server(url, tmp / f"server-{backend}.log") as server:
                    cold_ms = first_query(server, keys[0])
                    rows = http_load(server, keys, args.scale, backend)
                http_rows += rows
                if server.proc is not None and server.proc.returncode not in (0, -signal.SIGINT):
                    print(f"[bench] the server exited with {server.proc.returncode}:\n{server.tail()}", file=sys.stderr)
                checks[backend] = checks_after_load(url, 1 + sum(r["answered_total"] for r in rows), keys)
                checks[backend]["first_query_ms"] = cold_ms
                print(f"[bench] {backend} checks: {checks[backend]}", file=sys.stderr)
                proc_rows += in_process(url, backend, keys, args.scale, args.debits)
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
        "server": "uvicorn, 1 worker, 127.0.0.1, create_app(url, rate=1e9, burst=10**9)",
        "client": "httpx.AsyncClient per analyst (one keep-alive connection), asyncio, same machine",
        "ledger_fs": fs_type(Path(args.workdir or tempfile.gettempdir())), "postgres": pg_info, "skipped": skipped,
        "duckdb_threads": duckdb.connect().execute("SELECT current_setting('threads')").fetchone()[0],  # type: ignore[index]
        "python": platform.python_version(), "platform": platform.platform(), "cpu_count": os.cpu_count(),
        "versions": {d: _report.version(d) for d in ("dpkit", "fastapi", "starlette", "pydantic", "uvicorn", "httpx", "duckdb", "psycopg", "numpy")},
        "loadavg_before": load_before, "loadavg_after": [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None,
        "runtime_s": round(time.perf_counter() - started, 1),
    }
    data = {"benchmark": "server", "meta": meta, "http": http_rows, "inprocess": proc_rows, "checks": checks, "goal": goal}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n")
    print(f"[bench] wrote {args.out.resolve().relative_to(REPO) if args.out.resolve().is_relative_to(REPO) else args.out} in {meta['runtime_s']} s", file=sys.stderr)
    render(data)
    failed = sum(r["errors"] for r in http_rows + proc_rows)
    bad_checks = [b for b, c in checks.items() if not (c["spends_match"] and c["audit_chain_ok"] and c["unlogged_spends"] == 0)]
    if failed or bad_checks:
        print(f"[bench] FAILED: {failed} errors; checks failed for {bad_checks or 'none'}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
