"""A worker process of the shared-copy tests (``test_datasets``): it opens its own service over
the same ledger and dataset directory, waits for its sibling, answers one query and reports what
its DuckDB holds. A plain module so that a spawned interpreter can import it."""

from __future__ import annotations

from typing import Any

from dpkit.server import QueryRequest, Service


def query_and_report(
    url: str, data_root: str, dataset_dir: str, key: str, dataset: str, barrier: Any, out: Any
) -> None:
    try:
        with Service(url, data_root=data_root, dataset_dir=dataset_dir) as svc:
            who = svc.authenticate(key)
            barrier.wait(timeout=60)  # both processes open the copy (or re-create it) at once
            answer = svc.query(who, dataset, QueryRequest(epsilon=0.1, sql=f"SELECT COUNT(*) FROM {dataset}"))
            conn = svc._data[dataset].connection
            databases = [
                (name, path, bool(readonly))
                for name, path, readonly in conn.execute(
                    "SELECT database_name, path, readonly FROM duckdb_databases() WHERE path IS NOT NULL"
                ).fetchall()
            ]
            in_memory = conn.execute(
                "SELECT coalesce(sum(memory_usage_bytes), 0) FROM duckdb_memory() WHERE tag = 'IN_MEMORY_TABLE'"
            ).fetchone()[0]
            out.put(
                {"ok": True, "rows": answer["rows"], "databases": databases, "in_memory_table_bytes": int(in_memory)}
            )
    except BaseException as exc:  # reported to the test, which fails with it
        out.put({"ok": False, "error": f"{type(exc).__name__}: {exc}"})
