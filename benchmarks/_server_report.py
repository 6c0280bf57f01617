"""The tables of ``bench_server.py`` (a run's, or several results files side by side) and the
pieces of a run's metadata that are not measurements: its label, the ledger's file system and
the goals of the service issue checked against the rows."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import _report
from _server_load import REPO

HTTP_HEADERS = [
    "run",
    "ledger",
    "workers",
    "query",
    "clients",
    "queries",
    "queries/s",
    "budget ms",
    "min ms",
    "p50 ms",
    "p99 ms",
    "max ms",
    "server CPU ms/q",
    "client CPU ms/q",
    "errors",
]
HTTP_LEFT = ["run", "ledger", "query"]
PROC_HEADERS = ["run", "ledger", "operation", "threads", "n", "ops/s", "p50 ms", "p99 ms", "max ms", "errors"]
PROC_LEFT = ["run", "ledger", "operation"]
SLOW_HEADERS = [
    "run",
    "ledger",
    "workers",
    "readers",
    "release MB",
    "held",
    "RSS before MB",
    "peak MB",
    "added at peak MB",
    "after MB",
    "closed after s",
    "write timeout s",
    "a download alone s",
    "during the hang s",
    "errors",
]
SLOW_LEFT = ["run", "ledger"]


def _f(x: Any, digits: int = 1) -> str:
    if x is None:
        return "—"
    return f"{x:,.{digits}f}"


def render(data: dict[str, Any]) -> None:
    """The tables of a results file (also of one written before the ``run``, ``workers`` and
    budget columns existed: those rows are one worker, named by their date)."""
    meta = data["meta"]
    label = _label(meta)
    http_cells = [
        [
            r.get("label", label),
            r["backend"],
            str(r.get("workers", 1)),
            r["query"],
            str(r["clients"]),
            f"{r['queries']:,}",
            _f(r["qps"]),
            _f(r.get("budget_ms"), 0),
            _f(r.get("min_ms")),
            _f(r.get("p50_ms")),
            _f(r.get("p99_ms")),
            _f(r.get("max_ms")),
            _f(r.get("server_cpu_ms_per_query"), 2),
            _f(r.get("client_cpu_ms_per_query"), 2),
            str(r["errors"]),
        ]
        for r in data["http"]
    ]
    proc_cells = [
        [
            r.get("label", label),
            r["backend"],
            r["operation"],
            str(r["threads"]),
            f"{r['n']:,}",
            _f(r["ops_per_s"]),
            _f(r.get("p50_ms"), 2),
            _f(r.get("p99_ms"), 2),
            _f(r.get("max_ms"), 2),
            str(r["errors"]),
        ]
        for r in data["inprocess"]
    ]
    slow_cells = [
        [
            r.get("label", label),
            r["backend"],
            str(r["workers"]),
            f"{r['readers']:,}",
            _f(r["release_mb"]),
            f"{r['held']:,}",
            _f(r["rss_before_mb"], 0),
            _f(r["rss_peak_mb"], 0),
            _f(r["added_peak_mb"], 0),
            _f(r["rss_after_mb"], 0),
            _f(r.get("closed_after_s"), 1),
            _f(r["write_timeout_s"], 0),
            _f(r.get("normal_download_s"), 2),
            _f(r.get("download_during_hang_s"), 2),
            str(r["errors"]),
        ]
        for r in data.get("slow_readers", [])
    ]
    workers = sorted({r.get("workers", 1) for r in data["http"]})
    notes = [
        f"{meta['rows']:,} rows (Parquet, size class {meta.get('size_class', 'medium')}); ε = {meta.get('epsilon_per_query', 0.001)} per query; {meta.get('analysts', meta['clients'])} analysts, "
        f"keep-alive connections round-robin over them (at most {meta.get('connections_per_analyst', 8)} each); {meta.get('server', 'uvicorn')}; workers {', '.join(map(str, workers))}; "
        f"loopback; server and clients share {meta['cpu_count']} CPUs",
        f"client: {meta.get('client', 'httpx.AsyncClient')}",
        "budget = the query's answer time from the service's cost preview (the answer leaves that long after its debit); min ms >= budget ms "
        "on every row is the fixed time holding; latency = client-side time of one request (over the budget: queueing before the debit, and the trip)",
        "server CPU ms/q = CPU time of the server's process tree (every worker, all threads) during the run, less its CPU at rest "
        f"({_f(next((r.get('server_cpu_at_rest_ms_per_s') for r in data['http'] if r.get('server_cpu_at_rest_ms_per_s') is not None), None))} ms a second), "
        "/ answered queries (warm-up included); client CPU ms/q = the load generator's",
        f"load average before / after: {meta.get('loadavg_before')} / {meta.get('loadavg_after')} (other work on the machine inflates every number)",
    ]
    for b, c in data["checks"].items():
        extra = ""
        if "entries_match" in c:
            extra = (
                f", every answer with exactly one spend: {c['spends_match']}, with exactly one audit entry naming it: {c['entries_match']}"
                f" ({c['spends_not_answered']} spends not answered)"
            )
        notes.append(
            f"{b}: {c['answered_200']} answers, {c['spends']} spends{extra}, audit chain ok={c['audit_chain_ok']}, unlogged spends={c['unlogged_spends']}; "
            f"first query after start (opens the data) {_f(c.get('first_query_ms'), 0)} ms"
        )
    for b, why in meta.get("skipped", {}).items():
        notes.append(f"{b}: skipped ({why})")
    goal = data.get("goal", {})
    if goal:
        notes.append(
            f"goal: SQLite debit p99 <= 10 ms: {'met' if goal.get('met') else 'NOT met'} one at a time, "
            f"{'met' if goal.get('met_under_contention') else 'not met'} with {goal.get('threads', 16)} threads debiting at once ({goal.get('detail')})"
        )
    for g in data.get("throughput_goal", []):
        notes.append(f"goal {g['what']}: {'met' if g['met'] else 'NOT met'} ({g['detail']})")
    title = f"Curator service over HTTP, {meta['date']}, {meta['cpu_count']} CPUs"
    title2 = "Ledger and audit writes alone (in-process, same database)"
    title3 = "Slow readers of a release: the server's memory"
    notes += [r["note"] for r in data.get("slow_readers", []) if r.get("note")]
    tables = [
        (title, HTTP_HEADERS, HTTP_LEFT, http_cells, lambda c: (c[0] + c[1] + c[2], False)),
        (title2, PROC_HEADERS, PROC_LEFT, proc_cells, lambda c: (c[0] + c[1], c[2] == "ledger.debit")),
    ]
    if slow_cells:
        tables.append((title3, SLOW_HEADERS, SLOW_LEFT, slow_cells, lambda c: (c[0] + c[1], False)))
    for i, (t, headers, left, cells, group) in enumerate(tables):
        last = i == len(tables) - 1
        _report.print_table(
            t, headers, left, ((c, *group(c)) for c in cells), notes if last else [], to_stderr=True, width=200
        )
        print(_report.markdown("### " + t, headers, left, cells, notes if last else []))
        if not last:
            print()


def fs_type(path: Path) -> str | None:
    """The file system type of ``path`` from /proc/mounts (Linux), else None."""
    try:
        mounts = [line.split() for line in Path("/proc/mounts").read_text().splitlines()]
    except OSError:
        return None
    p = str(path.resolve())
    best = max(
        (m for m in mounts if len(m) > 2 and (p == m[1] or p.startswith(m[1].rstrip("/") + "/"))),
        key=lambda m: len(m[1]),
        default=None,
    )
    return None if best is None else best[2]


def run_label() -> str:
    """The commit being measured, with '+' when the working tree has changes."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO, timeout=10
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no", "src"],
            capture_output=True,
            text=True,
            cwd=REPO,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (head or "unknown") + ("+" if dirty else "")


def _label(meta: dict[str, Any]) -> str:
    """A run's label; a file from before labels existed is named by its date and client."""
    return str(
        meta.get("label")
        or f"{meta['date'][:16]} ({'httpx' if 'httpx' in meta.get('client', 'httpx') else 'raw'} client)"
    )


def merge(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Several results files as one (rows labelled by their run), for side-by-side tables."""
    if len(results) == 1:
        return results[0]
    out = {**results[-1], "http": [], "inprocess": [], "slow_readers": [], "checks": {}, "throughput_goal": []}
    for data in results:
        label = _label(data["meta"])
        out["http"] += [{"label": label, **r} for r in data["http"]]
        out["inprocess"] += [{"label": label, **r} for r in data["inprocess"]]
        out["slow_readers"] += [{"label": label, **r} for r in data.get("slow_readers", [])]
        out["checks"].update({f"{label} {b}": c for b, c in data["checks"].items()})
        out["throughput_goal"] += [{**g, "what": f"{label}: {g['what']}"} for g in data.get("throughput_goal", [])]
    return out


def service_goals(rows: list[dict[str, Any]], slow: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Issue 27's goals: on SQLite with 2 workers, >= 400 COUNT q/s and <= 4 ms of server CPU per
    COUNT (the row of the most clients); no answer before its budget (every row); slow readers
    adding <= 200 MB; PostgreSQL's row reported beside."""
    out = []
    for backend in ("sqlite", "postgres"):
        cand = [r for r in rows if r["backend"] == backend and r["query"] == "COUNT" and r.get("workers") == 2]
        if not cand:
            continue
        top = max(cand, key=lambda r: (r["clients"], r["qps"]))
        detail = f"{top['clients']} clients: {top['qps']:.0f} q/s, server CPU {top.get('server_cpu_ms_per_query') or float('nan'):.2f} ms/q, p99 {top.get('p99_ms', float('nan')):.0f} ms"
        if backend == "sqlite":
            out.append({"what": ">= 400 COUNT q/s, SQLite, 2 workers", "met": top["qps"] >= 400, "detail": detail})
            cpu = top.get("server_cpu_ms_per_query")
            out.append(
                {
                    "what": "server CPU <= 4 ms per COUNT, SQLite, 2 workers",
                    "met": cpu is not None and cpu <= 4.0,
                    "detail": detail,
                }
            )
        else:
            out.append({"what": "COUNT on PostgreSQL, 2 workers (no goal)", "met": True, "detail": detail})
    checked = sum(r.get("checked_against_budget", 0) for r in rows)
    early = sum(r.get("below_budget", 0) for r in rows)
    if checked:
        out.append(
            {
                "what": "every answer at or after its budget",
                "met": early == 0,
                "detail": f"{checked:,} answers checked, {early} early",
            }
        )
    for r in slow:
        out.append(
            {
                "what": f"{r['readers']:,} slow readers add <= 200 MB ({r['backend']})",
                "met": r["added_peak_mb"] <= 200,
                "detail": f"+{r['added_peak_mb']:.0f} MB at peak, {r['rss_after_mb'] - r['rss_before_mb']:+.0f} MB after",
            }
        )
    return out
