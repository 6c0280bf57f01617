"""The curator service over HTTP: throughput and latency of paid, audited queries on 1,000,000
rows, answered at a fixed time; and the memory of 1,000 slow readers of a large release.

What is measured, for the SQLite ledger and (when a server is reachable and
``dpkit.ledger.postgres`` exists) the PostgreSQL ledger:

1. **HTTP load.** A 1,000,000-row Parquet file (numpy, seeded: ``age`` int 18–90, ``income``
   float, ``region`` one of 5 public categories; ``row_level``) is registered with a
   :class:`Service` (size class ``medium``); ``--analysts`` analysts (64) get ε = 10⁶ each. The
   service runs as ``dpkit serve --workers N`` in a subprocess (127.0.0.1, request rates off,
   ``--answer-seconds``, ``--heavy-threads`` and ``--max-connections-per-address`` as given;
   ``--max-concurrent`` and ``--cpu-seconds-per-hour`` at their defaults, 8 and 3,600 s). Every
   paid answer leaves at a fixed time after its debit (:mod:`dpkit.server.pacing`): a COUNT's
   budget is ``answer_seconds`` (0.5 s by default), a GROUP BY's twice that, so one connection
   sends at most 2 COUNTs a second and the throughput needs hundreds of requests in flight. The
   load generator (:mod:`_server_load`) is light on purpose — the clients share the server's
   CPUs: raw HTTP/1.1 over asyncio streams, keep-alive connections spread round-robin over the
   analysts (at most 8 per analyst: its ``--max-concurrent``), each sending its query back to
   back for ``--seconds`` after a warm-up query. Queries: ``SELECT COUNT(*)``, ``SELECT
   AVG(age)`` and ``SELECT region, COUNT(*) ... GROUP BY region`` at ε = 0.001, each with 1
   client, then COUNT with each of ``--clients`` and the other two with ``--clients-other``,
   under the first ``--workers`` value; the COUNT row with the largest client count again under
   each other value. Throughput = answers that arrived within the window / its length;
   latency = client-side time of one request; errors = anything but a 200 with a JSON answer.
   Each query's budget is read from the service's own cost preview (``answer_seconds`` of
   ``/query/cost``), and every answer's latency is checked to be at least its budget (the fixed
   time holds under load). Server CPU per query is the CPU time of the server's whole process
   tree (every worker, all threads) from /proc, less its CPU at rest (measured for 3 s before
   the runs), over every answer of the run (warm-up included); client CPU per query is this
   process's. Afterwards: every 200 has exactly one spend in the
   ledger and exactly one audit entry naming its ``spend_id``, the ledger has no spend that was
   not answered, the audit chain verifies and no spend is unlogged. Goals (issue 27): ≥ 400
   COUNT q/s on SQLite with 2 workers, server CPU ≤ 4 ms per COUNT, no answer before its budget.
2. **In-process costs**, on the same database (server stopped): ``Service.query`` without HTTP
   (engine + ledger reads + debit + noise, no fixed time), ``ledger.debit`` alone,
   ``Service.audit`` (one hash-chained audit append) alone, and debit followed by audit, each
   sequentially and from 16 threads (one budget per thread); and, as the floor under every
   commit, a raw 4 KiB write + fdatasync in the same directory. Goal: p99 of a debit ≤ 10 ms on
   SQLite.
3. **Slow readers** (``--slow-readers N``, 1,000 by default; 0 skips it): a publisher's
   synthetic table of ``--release-rows`` rows is published, then N connections request its CSV
   download and read nothing; the server's memory (the RSS of its process tree, /proc) is taken
   before, at its peak while they hang and after they were closed by ``--write-timeout``
   (:mod:`_slow_readers`). Goal (issue 27): they add ≤ 200 MB.

    .venv/bin/python benchmarks/bench_server.py --backends sqlite,postgres --no-start-postgres --workers 2,1   # about 4 min on 2 cores
    .venv/bin/python benchmarks/bench_server.py --backends sqlite --no-inprocess --workers 2 --clients 128,256 --clients-other "" --slow-readers 0
    .venv/bin/python benchmarks/bench_server.py --render OLD.json benchmarks/results/server.json   # side by side

The ledger files live in a temporary directory (``--workdir`` to choose its file system: on
tmpfs an fsync costs nothing). PostgreSQL: the server of ``scripts/postgres.sh`` (started if it
is not running, and stopped again at the end if this script started it); the benchmark works in
a schema of its own, dropped afterwards. Results: ``benchmarks/results/server.json``, a rich
table on stderr, Markdown on stdout; every row carries the run's label (``--label``, default the
commit) and its worker count. Exit status 1 when any request failed, an answer left before its
budget or a check did not hold.
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
import _slow_readers  # noqa: E402
import _smoke  # noqa: E402
from _server_load import (  # noqa: E402
    REPO,
    Connection,
    Server,
    cpu_by_process,
    cpu_seconds,
    rss_bytes,
    serve_options,
    summary,
    threads_of,
    timed_load,
)
from _server_report import fs_type, merge, render, run_label, service_goals  # noqa: E402

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
    },
}
SIZE_CLASS = "medium"  # 1,000,000 rows: at most 10⁶ (the answers' budgets scale with the class)
EPSILON = 0.001  # per query
BUDGET = 1e6  # per analyst: never the limit here
QUERIES = {
    "COUNT": f"SELECT COUNT(*) FROM {DATASET}",
    "AVG(age)": f"SELECT AVG(age) FROM {DATASET}",
    "GROUP BY region, COUNT": f"SELECT region, COUNT(*) FROM {DATASET} GROUP BY region",
}
WARMUP = 1  # queries per connection before the clock starts
REST_S = 3.0  # seconds the server's CPU at rest is measured for, before the runs
PER_ANALYST = 8  # connections per analyst at most: ``--max-concurrent``'s default (per worker)

# ------------------------------------------------------------------------------------------------
# data, service setup, PostgreSQL
# ------------------------------------------------------------------------------------------------


def make_dataset(path: Path, rows: int) -> None:
    """``rows`` seeded rows written as Parquet (through DuckDB: no pyarrow needed)."""
    import duckdb
    import pandas as pd

    rng = np.random.default_rng(SEED)
    df = pd.DataFrame(
        {
            "age": rng.integers(18, 91, rows, dtype=np.int64),
            "income": np.round(np.minimum(rng.lognormal(10.5, 0.8, rows), 500000.0), 2),
            "region": np.asarray(REGIONS, dtype=object)[rng.integers(0, len(REGIONS), rows)],
        }
    )
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

    params, options = _parameters(Service.__init__), serve_options()
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


def setup_service(url: str, parquet: Path, analysts: int, kwargs: dict[str, Any]) -> list[str]:
    """Register the dataset (size class ``medium`` where the service has size classes), create
    ``analysts`` analysts with budgets; their API keys."""
    from dpkit.server.service import Service

    with Service(url, **kwargs) as svc:
        sized: dict[str, Any] = {"size_class": SIZE_CLASS} if "size_class" in _parameters(svc.register_dataset) else {}
        svc.register_dataset(DATASET, parquet, METADATA, **sized)
        keys = []
        for i in range(analysts):
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
            settings = {
                k: admin.execute(f"SHOW {k}").fetchone()[0] for k in ("fsync", "synchronous_commit", "wal_sync_method")
            }  # type: ignore[index]
    except psycopg.Error as exc:
        yield None, f"cannot use {base}: {exc}"
        return
    try:
        yield (
            base + ("&" if "?" in base else "?") + f"options=-csearch_path%3D{schema}",
            {"server_version": version, **settings, "started_here": started},
        )
    finally:
        with contextlib.suppress(psycopg.Error), psycopg.connect(base, autocommit=True, connect_timeout=10) as admin:
            admin.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        if started:
            subprocess.run(["bash", str(script), "stop"], capture_output=True, timeout=120)


# ------------------------------------------------------------------------------------------------
# measurements


def query_body(kind: str) -> bytes:
    return json.dumps({"epsilon": EPSILON, "sql": QUERIES[kind]}).encode()


def one_request(port: int, key: str, path: str, body: bytes) -> tuple[int, bytes]:
    async def one() -> tuple[int, bytes]:
        conn = Connection(port, key)
        try:
            return await conn.send(conn.request_bytes(path, body))
        finally:
            await conn.close()

    return asyncio.run(one())


def budgets(server: Server, key: str) -> dict[str, float | None]:
    """Each query's time budget in seconds, as the service's cost preview states it (None when
    the preview has no ``answer_seconds``: a service without fixed times)."""
    out: dict[str, float | None] = {}
    for kind in QUERIES:
        status, data = one_request(server.port, key, f"/v1/datasets/{DATASET}/query/cost", query_body(kind))
        if status != 200:
            raise RuntimeError(f"the cost preview of {kind} failed: HTTP {status} {data[:300]!r}")
        out[kind] = json.loads(data).get("answer_seconds")
    print(f"[bench] budgets from the cost preview: {out}", file=sys.stderr)
    return out


def first_query(server: Server, key: str) -> tuple[float, Any]:
    """Milliseconds of the first query after start (it opens the dataset), and its spend id."""
    t = time.perf_counter()
    status, data = one_request(server.port, key, f"/v1/datasets/{DATASET}/query", query_body("COUNT"))
    ms = 1e3 * (time.perf_counter() - t)
    if status != 200:
        raise RuntimeError(f"the first query failed: HTTP {status} {data[:300]!r}")
    print(f"[bench] first query after start (opens the data): {ms:.0f} ms", file=sys.stderr)
    return ms, json.loads(data).get("spend_id")


def http_load(
    server: Server,
    keys: list[str],
    seconds: float,
    backend: str,
    label: str,
    runs: list[tuple[str, int]],
    budget: dict[str, float | None],
    rest_s: float = REST_S,
) -> tuple[list[dict[str, Any]], list[Any]]:
    """The rows of ``runs`` ((query kind, clients)) against one server, and every 200's spend id.

    The server's CPU at rest (its timers and watchers, a few ms a second) is measured first and
    taken off each run's CPU per query (``server_cpu_ms_per_query``; the raw figure is kept):
    with one client, at 2 answers a second, it would otherwise count as part of each query."""
    rows, spend_ids = [], []
    path = f"/v1/datasets/{DATASET}/query"
    assert server.proc is not None
    c0, t0 = cpu_seconds(server.proc.pid) or 0.0, time.perf_counter()
    time.sleep(rest_s)
    idle_per_s = ((cpu_seconds(server.proc.pid) or 0.0) - c0) / (time.perf_counter() - t0)
    print(f"[bench] the server at rest: {1e3 * idle_per_s:.1f} ms of CPU a second", file=sys.stderr)
    for kind, clients in runs:
        analysts = keys[: max(1, min(len(keys), -(-clients // PER_ANALYST)))]
        if clients > len(analysts) * PER_ANALYST:
            raise SystemExit(
                f"{clients} clients need {-(-clients // PER_ANALYST)} analysts (8 connections each): pass --analysts"
            )
        run_s = seconds if clients > 1 else min(seconds, 8.0)
        assert server.proc is not None
        cpu0, me0, split0 = cpu_seconds(server.proc.pid), time.process_time(), cpu_by_process(server.proc.pid)
        started = time.perf_counter()
        res = asyncio.run(timed_load(server.port, analysts, path, query_body(kind), clients, run_s, WARMUP))
        cpu1, me1, split1 = cpu_seconds(server.proc.pid), time.process_time(), cpu_by_process(server.proc.pid)
        at_rest = idle_per_s * (time.perf_counter() - started)
        threads, rss = threads_of(server.proc.pid), rss_bytes(server.proc.pid)
        # How the load fell on the processes (the kernel spreads connections over the workers'
        # sockets by a hash of each connection).
        split = sorted(
            (round(split1[p] - split0.get(p, 0.0), 2) for p in split1 if split1[p] - split0.get(p, 0.0) > 0.02),
            reverse=True,
        )
        lat = res.pop("latencies")
        every = lat + res.pop("late_latencies")
        spend_ids += res["spend_ids"]
        b = budget.get(kind)
        early = sum(1 for x in every if b is not None and x < b)
        row = {
            "label": label,
            "backend": backend,
            "workers": server.workers,
            "query": kind,
            "sql": QUERIES[kind],
            "clients": clients,
            "analysts": len(analysts),
            "seconds": run_s,
            "queries": res["measured"],
            "wall_s": res["wall_s"],
            "qps": res["measured"] / res["wall_s"] if res["wall_s"] else 0.0,
            "budget_ms": None if b is None else 1e3 * b,
            **(summary(lat) if lat else {}),
            "below_budget": early,
            "checked_against_budget": len(every) if b is not None else 0,
            "errors": len(res["errors"]),
            "first_errors": res["errors"][:3],
            "answered_total": res["answered"],
            "drain_s": res["drain_s"],
            "server_cpu_ms_per_query": None
            if cpu0 is None or cpu1 is None
            else 1e3 * max(0.0, cpu1 - cpu0 - at_rest) / max(1, res["answered"]),
            "server_cpu_ms_per_query_raw": None
            if cpu0 is None or cpu1 is None
            else 1e3 * (cpu1 - cpu0) / max(1, res["answered"]),
            "server_cpu_at_rest_ms_per_s": 1e3 * idle_per_s,
            "client_cpu_ms_per_query": 1e3 * (me1 - me0) / max(1, res["answered"]),
            "cpu_s_by_process": split,
            "server_threads": threads,
            "server_rss_mb": rss / 1e6,
        }
        rows.append(row)
        print(
            f"[bench] {backend:8s} workers={server.workers} {kind:24s} clients={clients:3d} {row['qps']:7.1f} q/s  p50 {row.get('p50_ms', float('nan')):7.1f} ms"
            f"  p99 {row.get('p99_ms', float('nan')):7.1f} ms  min {row.get('min_ms', float('nan')):7.1f} ms (budget {row['budget_ms']} ms, {early} below)"
            f"  server CPU {row['server_cpu_ms_per_query'] or float('nan'):5.2f} ms/q  client CPU {row['client_cpu_ms_per_query']:5.2f} ms/q"
            f"  errors {row['errors']} {res['errors'][:1]}  CPU s by process {split}",
            file=sys.stderr,
        )
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


def in_process(
    url: str, backend: str, keys: list[str], debits: int, kwargs: dict[str, Any], label: str, queries: int = 50
) -> list[dict[str, Any]]:
    """Service.query without HTTP (``queries`` COUNTs, half as many AVGs, a third as many GROUP BYs)
    and the ledger's writes alone (``debits`` of each), from one thread and from one per key."""
    from dpkit.accounting import LaplaceEvent
    from dpkit.server import QueryRequest, Service

    rows: list[dict[str, Any]] = []
    threads = len(keys)
    event = LaplaceEvent(noise_multiplier=1 / EPSILON)
    text = f"SELECT COUNT(*) FROM {DATASET}"

    def record(op: str, n_threads: int, lat: list[float], wall: float, errors: list[str]) -> None:
        row = {
            "label": label,
            "backend": backend,
            "operation": op,
            "threads": n_threads,
            "n": len(lat),
            "wall_s": wall,
            "ops_per_s": len(lat) / wall if wall else 0.0,
            **(summary(lat) if lat else {}),
            "errors": len(errors),
            "first_errors": errors[:3],
        }
        rows.append(row)
        print(
            f"[bench] {backend:8s} {op:28s} threads={n_threads:2d} n={len(lat):5d} {row['ops_per_s']:8.1f}/s  p50 {row.get('p50_ms', float('nan')):7.2f} ms"
            f"  p99 {row.get('p99_ms', float('nan')):7.2f} ms  errors {len(errors)}",
            file=sys.stderr,
        )

    with Service(url, **kwargs) as svc:
        who = [svc.authenticate(k) for k in keys]
        # Service.query without HTTP: what the engine, the ledger reads and the debit cost.
        for kind, sql in QUERIES.items():
            n = max(1, {"COUNT": queries, "AVG(age)": queries // 2}.get(kind, queries * 3 // 10))
            req = QueryRequest(epsilon=EPSILON, sql=sql)
            lat, wall, errs = _timed_threads(lambda i, req=req: svc.query(who[i], DATASET, req), 1, n, 3)
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
            svc.audit(
                actor=f"d{i:02d}",
                action="query",
                status=200,
                outcome="ok",
                dataset=DATASET,
                detail={"query": text, "key_id": "bench"},
                **amount,
            )

        def both(i: int) -> None:
            debit(i)
            audit(i)

        for op, fn in (("ledger.debit", debit), ("Service.audit (append)", audit), ("debit + audit", both)):
            lat, wall, errs = _timed_threads(fn, 1, debits, min(50, debits))
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
    row = {
        "backend": "file system",
        "operation": "4 KiB write + fdatasync",
        "threads": 1,
        "n": n,
        "wall_s": wall,
        "ops_per_s": n / wall,
        **summary(lat),
        "errors": 0,
        "first_errors": [],
    }
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
        "answered_200": answered,
        "spends": sum(ledger_ids.values()),
        "spends_match": spends_match,
        "answers_without_spend_id": no_id,
        "spend_ids_answered_twice": answered_twice,
        "answers_without_exactly_one_spend": without_spend,
        "spends_not_answered": spends_unanswered,
        "answers_without_exactly_one_entry": entry_not_one,
        "entries_match": entry_not_one == 0 and no_id == 0,
        "entries_counted": "entries recording an amount" if paying else "every entry naming the spend",
        "answers_named_by_several_entries": sum(1 for sid in answers if naming.get(sid, 0) > 1),
        "audit_chain_ok": chain_ok,
        "audit_entries": n_entries,
        "audit_problem": why,
        "unlogged_spends": len(unlogged),
    }


def checks_ok(c: dict[str, Any]) -> bool:
    return bool(
        c["spends_match"] and c.get("entries_match", True) and c["audit_chain_ok"] and c["unlogged_spends"] == 0
    )


def _clients(text: str) -> list[int]:
    out = [int(c) for c in text.split(",") if c.strip()]
    if any(c < 1 for c in out):
        raise SystemExit(f"{text!r}: client counts >= 1, comma-separated")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument(
        "--analysts",
        type=int,
        default=64,
        help="analysts with a budget (default 64; a client count needs clients/8 of them)",
    )
    ap.add_argument(
        "--clients",
        default="64,128,256",
        help="connections sending COUNTs at once, comma-separated (default 64,128,256; each run also with 1)",
    )
    ap.add_argument(
        "--clients-other",
        default="64",
        help="connections sending AVG / GROUP BY at once (default 64; each also with 1; empty: only 1)",
    )
    ap.add_argument(
        "--seconds", type=float, default=15.0, help="length of each run's window (default 15; 8 at most with 1 client)"
    )
    ap.add_argument(
        "--answer-seconds", default="0.5", help="dpkit serve --answer-seconds (default 0.5, the service's default)"
    )
    ap.add_argument(
        "--heavy-threads",
        default="128",
        help="dpkit serve --heavy-threads, per worker (default 128: 256 answers held at once by 2 workers)",
    )
    ap.add_argument(
        "--max-connections-per-address",
        default="2000",
        help="dpkit serve option, per worker: every client is 127.0.0.1 (default 2000)",
    )
    ap.add_argument(
        "--serve-option",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="any other dpkit serve option by its parameter name, e.g. max_concurrent=16 (repeatable)",
    )
    ap.add_argument("--debits", type=int, default=2000, help="debits / audit appends per in-process run (default 2000)")
    ap.add_argument("--backends", default="sqlite,postgres")
    ap.add_argument("--no-start-postgres", action="store_true", help="use a running scripts/postgres.sh server only")
    ap.add_argument(
        "--workdir", type=Path, default=None, help="where the temporary directory goes (default: the system's)"
    )
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument(
        "--render",
        type=Path,
        nargs="+",
        metavar="JSON",
        help="print the tables of earlier results files (one table, side by side); run nothing",
    )
    ap.add_argument(
        "--workers",
        default="2,1",
        help="dpkit serve --workers values, comma-separated (default 2,1): every query runs with the first, "
        "the COUNT row of the most clients with each of the others (all rows with --all-rows)",
    )
    ap.add_argument(
        "--all-rows", action="store_true", help="run every query and client count with every --workers value"
    )
    ap.add_argument(
        "--label",
        default=None,
        help="names this run in the tables (default: the commit, '+' when the tree has changes)",
    )
    ap.add_argument("--no-inprocess", action="store_true", help="skip the in-process measurements")
    ap.add_argument(
        "--slow-readers", type=int, default=1000, help="slow readers of the release (default 1000; 0: skip that part)"
    )
    ap.add_argument(
        "--release-rows",
        type=int,
        default=300_000,
        help="rows of the published release (default 300,000: several MB as CSV)",
    )
    ap.add_argument(
        "--write-timeout",
        type=float,
        default=30.0,
        help="dpkit serve --write-timeout in the slow-reader part (default 30, the service's)",
    )
    _smoke.add_flag(ap)
    args = ap.parse_args()
    rest_s, queries = REST_S, 50
    if args.smoke:  # one worker, one analyst, one client, a second per query; SQLite only
        args.rows, args.analysts, args.clients, args.clients_other, args.seconds = 2_000, 1, "", "", 0.5
        args.answer_seconds, args.workers, args.debits, args.label = "0.05", "1", 10, "smoke"
        args.slow_readers, args.release_rows, args.write_timeout = 2, 200, 1.0
        args.out, rest_s, queries = _smoke.out_path("server.json"), 0.2, 3
        if "postgres" in args.backends.split(","):
            _smoke.skip("postgres", "a server to start (make test's PostgreSQL tests cover the ledger)")
            args.backends = ",".join(b for b in args.backends.split(",") if b != "postgres")
    if args.render:
        render(merge([json.loads(path.read_text()) for path in args.render]))
        return 0
    workers = [int(w) for w in args.workers.split(",") if w.strip()]
    if not workers or min(workers) < 1:
        raise SystemExit(f"--workers {args.workers!r}: worker counts >= 1, comma-separated")
    count_clients, other_clients = _clients(args.clients), _clients(args.clients_other)
    if max(count_clients + other_clients + [1]) > args.analysts * PER_ANALYST:
        raise SystemExit(
            f"--analysts {args.analysts}: at most {args.analysts * PER_ANALYST} clients ({PER_ANALYST} connections per analyst)"
        )
    label = args.label or run_label()
    serve_extra = {
        "answer_seconds": args.answer_seconds,
        "heavy_threads": args.heavy_threads,
        "max_connections_per_address": args.max_connections_per_address,
    }
    for item in args.serve_option:
        name, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--serve-option {item!r}: NAME=VALUE")
        serve_extra[name.strip().replace("-", "_")] = value.strip()

    started = time.perf_counter()
    load_before = [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    tmp = Path(tempfile.mkdtemp(prefix="dpkit-bench-server-", dir=args.workdir))
    http_rows: list[dict[str, Any]] = []
    proc_rows: list[dict[str, Any]] = []
    slow_rows: list[dict[str, Any]] = []
    checks: dict[str, Any] = {}
    skipped: dict[str, str] = {}
    commands: list[str] = []
    budget: dict[str, float | None] = {}
    pg_info: dict[str, Any] | None = None
    try:
        parquet = tmp / f"{DATASET}.parquet"
        t = time.perf_counter()
        make_dataset(parquet, args.rows)
        print(
            f"[bench] {args.rows:,} rows written in {time.perf_counter() - t:.1f} s ({parquet.stat().st_size / 1e6:.1f} MB)",
            file=sys.stderr,
        )
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
                keys = setup_service(url, parquet, args.analysts, kwargs)
                spend_ids: list[Any] = []
                cold_ms = None
                all_runs = [(kind, 1) for kind in QUERIES] + [("COUNT", c) for c in count_clients if c > 1]
                all_runs += [(kind, c) for kind in QUERIES if kind != "COUNT" for c in other_clients if c > 1]
                for n in workers:
                    runs = all_runs if (n == workers[0] or args.all_rows) else [("COUNT", max(count_clients))]
                    server = Server(url, tmp / f"server-{backend}-{n}.log", n, {**cli, **serve_extra})
                    print(
                        f"[bench] {server.command}"
                        + (f" (not options of this dpkit serve: {server.ignored})" if server.ignored else ""),
                        file=sys.stderr,
                    )
                    commands.append(server.command.replace(str(tmp), "TMP"))
                    with server:
                        ms, sid = first_query(server, keys[0])
                        cold_ms = ms if cold_ms is None else cold_ms
                        spend_ids.append(sid)
                        budget = budgets(server, keys[0])
                        rows, ids = http_load(server, keys, args.seconds, backend, label, runs, budget, rest_s)
                    http_rows += rows
                    spend_ids += ids
                    if server.proc is not None and server.proc.returncode not in (
                        0,
                        130,
                        -signal.SIGINT,
                    ):  # 130: stopped by Ctrl-C
                        print(
                            f"[bench] the server exited with {server.proc.returncode}:\n{server.tail()}",
                            file=sys.stderr,
                        )
                checks[backend] = checks_after_load(url, spend_ids, keys, kwargs)
                checks[backend]["first_query_ms"] = cold_ms
                print(f"[bench] {backend} checks: {checks[backend]}", file=sys.stderr)
                if not args.no_inprocess:
                    proc_rows += in_process(url, backend, keys[:16], args.debits, kwargs, label, queries)
                if args.slow_readers > 0 and backend == backends[0]:
                    extra = {**cli, **serve_extra, "write_timeout": str(args.write_timeout)}
                    slow_rows += _slow_readers.measure(
                        url,
                        tmp,
                        workers[0],
                        extra,
                        kwargs,
                        args.slow_readers,
                        args.release_rows,
                        backend,
                        label,
                        dataset=DATASET,
                        analyst_keys=keys,
                    )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    goal_rows = [r for r in proc_rows if r["backend"] == "sqlite" and r["operation"] == "ledger.debit"]
    goal = {}
    if goal_rows:
        one = next((r for r in goal_rows if r["threads"] == 1), None)
        many = next((r for r in goal_rows if r["threads"] > 1), None)
        goal = {
            "what": "p99 of ledger.debit on SQLite <= 10 ms (one debit at a time)",
            "met": one is not None and one.get("p99_ms", float("inf")) <= 10.0,
            "met_under_contention": many is not None and many.get("p99_ms", float("inf")) <= 10.0,
            "threads": None if many is None else many["threads"],
            "detail": ", ".join(
                f"{r['threads']} thread{'s' if r['threads'] > 1 else ''}: p99 {r.get('p99_ms', float('nan')):.2f} ms"
                for r in goal_rows
            ),
        }
    import duckdb

    meta = {
        "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "rows": args.rows,
        "size_class": SIZE_CLASS,
        "analysts": args.analysts,
        "clients": max(count_clients, default=0),
        "clients_count": count_clients,
        "clients_other": other_clients,
        "seconds": args.seconds,
        "epsilon_per_query": EPSILON,
        "budget_per_analyst": BUDGET,
        "warmup_per_client": WARMUP,
        "connections_per_analyst": PER_ANALYST,
        "seed": SEED,
        "metadata": METADATA,
        "budgets_s": budget,
        "label": label,
        "workers": workers,
        "commands": commands,
        "server": f"dpkit serve --workers N --rate 1e9 --burst 10**9 --answer-seconds {args.answer_seconds} --heavy-threads {args.heavy_threads} "
        f"--max-connections-per-address {args.max_connections_per_address}"
        + "".join(f" --{o.split('=')[0].replace('_', '-')} {o.split('=', 1)[1]}" for o in args.serve_option)
        + " (uvicorn, 127.0.0.1)",
        "client": "raw HTTP/1.1 over asyncio streams, keep-alive connections, same machine",
        "ledger_fs": fs_type(Path(args.workdir or tempfile.gettempdir())),
        "postgres": pg_info,
        "skipped": skipped,
        "duckdb_threads": duckdb.connect().execute("SELECT current_setting('threads')").fetchone()[0],  # type: ignore[index]
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "versions": {
            d: _report.version(d)
            for d in ("dpkit", "fastapi", "starlette", "pydantic", "uvicorn", "duckdb", "psycopg", "numpy")
        },
        "loadavg_before": load_before,
        "loadavg_after": [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None,
        "runtime_s": round(time.perf_counter() - started, 1),
    }
    data = {
        "benchmark": "server",
        "meta": meta,
        "http": http_rows,
        "inprocess": proc_rows,
        "slow_readers": slow_rows,
        "checks": checks,
        "goal": goal,
        "throughput_goal": service_goals(http_rows, slow_rows),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n")
    print(
        f"[bench] wrote {args.out.resolve().relative_to(REPO) if args.out.resolve().is_relative_to(REPO) else args.out} in {meta['runtime_s']} s",
        file=sys.stderr,
    )
    render(data)
    failed = sum(r["errors"] for r in http_rows + proc_rows + slow_rows)
    early = sum(r.get("below_budget", 0) for r in http_rows)
    bad_checks = [b for b, c in checks.items() if not checks_ok(c)]
    if failed or early or bad_checks:
        print(
            f"[bench] FAILED: {failed} errors, {early} answers before their budget; checks failed for {bad_checks or 'none'}",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
