"""Time is a release too: the curator service answers a paid query at a fixed time.

Dwork and Roth's guarantee covers the answer's *value*. An analyst also sees *when* it comes
back, and the work behind an answer depends on the data: here one hostile person who owns 100,000
rows doubles the rows that contribution bounding must go through. This script builds D (100,000
people, one row each) and D+1 (the same, plus that person), then:

1. times the same COUNT through the library directly, 15 times on each: the answer's time tells
   the two apart, although its value is protected;
2. asks the curator service (``dpkit serve``'s application, over HTTP in this process) the same
   query 15 times on each: every paid answer leaves exactly its time budget after its debit — a
   budget computed from public facts only (``answer_seconds``, the dataset's declared size class,
   the query's shape; reported by ``/query/cost``) — so the two cannot be told apart by timing.

The idea is Fuzz's predictable transactions (Haeberlen, Pierce & Narayan, "Differential Privacy
Under Fire", USENIX Security 2011).

Run:  .venv/bin/python examples/answers_at_a_fixed_time.py        (about 30 s)
"""

import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
from fastapi.testclient import TestClient

import dpkit as dp
from dpkit.analytics import Metadata, Numeric
from dpkit.server import Service, create_app

N, RUNS = 100_000, 15
rng = np.random.default_rng(11)
people = pd.DataFrame({"pid": np.arange(N).astype(str), "age": rng.integers(18, 90, N)})
hostile = pd.DataFrame({"pid": ["hostile"] * N, "age": np.full(N, 50)})  # one person, many rows
tables = {"d": people, "d_plus": pd.concat([people, hostile], ignore_index=True)}
declared = {"privacy_unit": "pid", "max_rows": 1, "columns": {"age": {"type": "numeric", "lower": 0, "upper": 100}}}


def spread(times: list[float]) -> str:
    return (
        f"median {statistics.median(times) * 1000:7.1f} ms  (min {min(times) * 1000:.1f}, max {max(times) * 1000:.1f})"
    )


print("1. The library, timed: the same ε = 0.01 COUNT on D and on D+1")
meta = Metadata(columns={"age": Numeric(0, 100)}, privacy_unit="pid", max_rows=1)
for name, frame in tables.items():
    session = dp.Session(frame, metadata=meta, budget=dp.Budget(epsilon=10.0))
    session.sql(f"SELECT COUNT(*) FROM {session.table}", epsilon=0.01)  # warm up
    took = []
    for _ in range(RUNS):
        t0 = time.perf_counter()
        session.sql(f"SELECT COUNT(*) FROM {session.table}", epsilon=0.01)
        took.append(time.perf_counter() - t0)
    print(f"   {name:7s} {spread(took)}")

print("\n2. The curator service: the same query, paid, over HTTP")
with tempfile.TemporaryDirectory() as tmp:
    service = Service(f"sqlite:///{Path(tmp) / 'ledger.sqlite'}")
    _, key = service.create_principal("alice", "analyst")
    for name, frame in tables.items():
        frame.to_csv(Path(tmp) / f"{name}.csv", index=False)
        service.register_dataset(name, Path(tmp) / f"{name}.csv", declared, size_class="small")
        service.grant("alice", name, epsilon=10.0)
    auth = {"Authorization": f"Bearer {key}"}
    with TestClient(create_app(service, answer_seconds=0.6)) as client:
        for name in tables:
            body = {"sql": f"SELECT COUNT(*) FROM {name}", "epsilon": 0.01}
            budget = client.post(f"/v1/datasets/{name}/query/cost", json=body, headers=auth).json()["answer_seconds"]
            client.post(f"/v1/datasets/{name}/query", json=body, headers=auth)  # warm up
            took = []
            for _ in range(RUNS):
                t0 = time.perf_counter()
                r = client.post(f"/v1/datasets/{name}/query", json=body, headers=auth)
                took.append(time.perf_counter() - t0)
                assert r.status_code == 200, r.text
            print(f"   {name:7s} {spread(took)}   (its budget: {budget:.2f} s after the debit)")
    service.close()
print("\nThe service's latencies differ by scheduling noise only; tests/server/test_pacing.py checks it")
print("with 200 answers each and a two-sample test.")
