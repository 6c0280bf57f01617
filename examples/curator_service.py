"""The trusted curator as a service (Dwork & Roth 2014, ch. 1–2): analysts ask, the curator answers with noise
and stops them when their budget is spent.

A scripted session against a local ``dpkit serve`` (started here on a free loopback port):

1. the curator (``dpkit admin``) registers the census example table — its metadata declares every
   column and the privacy unit (``person_id``), and the curator alone sees the data check of how
   well the rows conform — creates an analyst and grants her ε = 1 on it (and ε = 1, δ = 10⁻⁶ to ``publisher``, whom the curator names a publisher);
2. the analyst, in Python with ``dpkit.client`` (the service's HTTP API underneath), previews a
   query's cost, runs queries — each answer the ``QueryResult`` a local session gives — and
   watches her budget go down;
3. a query her budget cannot pay for is refused (409, ``BudgetExceededError``) — nothing is
   released or debited;
4. a ``publisher`` principal of the curator's, with its own (ε, δ) grant, publishes a synthetic
   table once; the analyst, her budget spent, downloads it for free (post-processing);
5. the curator verifies the audit log (a keyed hash chain) and that it agrees with the ledger:
   every spend has its entry and every budget its grant.

Run: ``python examples/curator_service.py [OUT_DIR]`` (``make demo`` runs it). Needs the
``server`` extra (``pip install 'dpkit[server]'``).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from dpkit.client import Connection, connect
from dpkit.errors import AuthError, BudgetExceededError


def dpkit(*args: str) -> str:
    """Run the dpkit command line; its output."""
    out = subprocess.run([sys.executable, "-m", "dpkit.cli", *args], check=True, capture_output=True, text=True)
    return out.stdout


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    ledger = f"sqlite:///{(out / 'service.sqlite').absolute()}"
    for leftover in out.glob("service.sqlite*"):  # the ledger, its audit key, its dataset copies
        shutil.rmtree(leftover) if leftover.is_dir() else leftover.unlink()

    # 1. The curator's side, from the shell.
    dpkit("generate", "census", str(out / "census.csv"), "--people", "5000", "--metadata", str(out / "census.json"))
    curator_key = json.loads(dpkit("admin", "create-curator", "carol", "--ledger", ledger, "--json"))["key"]
    alice_key = json.loads(dpkit("admin", "create-analyst", "alice", "--ledger", ledger, "--json"))["key"]
    # 5,000 people: the "small" size class (public; it scales every paid answer's fixed time).
    print(
        dpkit(
            "admin",
            "register-dataset",
            "census",
            str(out / "census.csv"),
            "--metadata",
            str(out / "census.json"),
            "--size-class",
            "small",
            "--ledger",
            ledger,
        ).strip()
    )
    print(dpkit("admin", "grant", "alice", "census", "--epsilon", "1", "--ledger", ledger).strip())
    # A principal of the curator's own, whose budget pays for one published synthetic table.
    publisher_key = json.loads(dpkit("admin", "create-analyst", "publisher", "--ledger", ledger, "--json"))["key"]
    print(
        dpkit("admin", "grant", "publisher", "census", "--epsilon", "1", "--delta", "1e-6", "--ledger", ledger).strip()
    )
    print(dpkit("admin", "allow-publish", "publisher", "--ledger", ledger).strip())  # only named publishers publish

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # Every paid answer leaves at a fixed time after its debit: 0.5 s x 0.5 (small) for a simple
    # query; a synthetic table 20 s x 0.5 here (the default, 60 s, suits larger tables).
    server = subprocess.Popen(
        [sys.executable, "-m", "dpkit.cli", "serve", "--ledger", ledger, "--port", str(port), "--synth-seconds", "20"],
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                urllib.request.urlopen(base + "/v1/me", timeout=1)
            except urllib.error.HTTPError:
                break  # 401: the server is up
            except OSError:
                time.sleep(0.05)
        print(f"\ndpkit serve is listening on {base} (dashboard at {base}/)")

        # 2. The analyst's side, in Python: dpkit.client speaks the service's HTTP API.
        try:
            connect(base, "dpk_not-a-real-key-000000000000000000000000000")
        except AuthError as refused:
            print(f"without a valid key: {refused.status} {refused.problem['code']}")
        alice = connect(base, alice_key)
        sql = "SELECT sex, COUNT(*) AS jobs, AVG(income) FROM census GROUP BY sex"
        cost = alice.cost("census", sql, epsilon=0.5)
        print(f"\npreview: {sql!r} would cost ε = {cost.epsilon}; remaining ε = {alice.remaining('census')}")
        for epsilon, text in (
            (0.5, sql),
            (0.25, "SELECT COUNT(*) FROM census WHERE age > 60"),
            (0.25, "SELECT MEDIAN(hours_per_week) FROM census"),
        ):
            result = alice.sql("census", text, epsilon=epsilon)
            print(f"\n{text}\n{result}")  # the QueryResult a local session returns

        # 3. The budget is spent: refused before any noise is drawn.
        try:
            alice.sql("census", "SELECT COUNT(*) FROM census", epsilon=0.1)
            raise AssertionError("the budget is spent: this query must be refused")
        except BudgetExceededError as refusal:
            print(f"\n{refusal.status} {refusal.problem['code']}: {refusal}")

        # 4. A synthetic table, paid once by the publisher and downloaded by anyone for free.
        publisher = connect(base, publisher_key)
        table = publisher.synthesize(
            "census", epsilon=1, delta=1e-6, columns=["age", "sex", "education", "hours_per_week"],
            bins={"age": 6, "hours_per_week": 4}, rows=1000, publish="census_synthetic",
        )  # fmt: skip
        print(f"\npublished {table.name!r}: {len(table.table)} synthetic rows for ε = {table.epsilon}")
        release = alice.release("census_synthetic")
        print(f"alice downloads it with no budget left: {release.table.head(2).to_dict('records')} …")

        # 5. The curator checks the audit log.
        report = Connection(base, curator_key).get("/v1/audit/verify").body  # the curator's own endpoint
        print(f"\naudit log: ok={report['ok']}, {report['entries']} entries, head {report['head'][:16]}…")
    finally:
        server.terminate()
        server.wait(timeout=30)
    print(dpkit("admin", "verify-log", "--ledger", ledger).strip())


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "out/demo"))
