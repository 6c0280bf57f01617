"""An analyst's session with a curator service, in Python: ``dpkit.client``.

The analyst never sees the rows. She connects with the key the curator gave her, reads what she
may query (the declared schema, her budget), previews a query's cost, runs it — the answer is
the same ``QueryResult`` a local ``dpkit.Session`` returns: noisy values, intervals, who is
protected, what it cost — and is refused with the same ``BudgetExceededError`` once her budget
cannot pay. Every paid request carries an ``Idempotency-Key``: if its answer is lost on the way,
the client asks again and the service answers without a second debit.

Run: ``python examples/remote_session.py [URL]``. With a URL, the analyst's key is read from
``DPKIT_API_KEY`` and the service's ``census`` dataset is queried (the README's curator-service
block sets one up, and grants ``alice``). Without, a throwaway local service is set up first
(the curator's side of ``examples/curator_service.py``, in a temporary directory). Needs the
``server`` extra (``pip install 'dpkit[server]'``).
"""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from dpkit.client import RemoteSession, connect
from dpkit.errors import BudgetExceededError, InvalidParameterError


def analyse(session: RemoteSession) -> None:
    """What an analyst does with a remote session: nothing here touches a row."""
    print(session)
    census = session.dataset("census")  # the curator's declarations, never the data
    print(f"census: privacy unit {census['privacy_unit']!r}, columns {sorted(census['columns'])}")
    budget = session.budget("census")
    print(f"budget: ε={budget.epsilon:g} granted, ε={budget.remaining:g} left\n")

    sql = "SELECT sex, COUNT(*) AS people, AVG(income) FROM census WHERE age >= 30 GROUP BY sex"
    cost = session.cost("census", sql, epsilon=0.25)  # priced on the metadata; nothing spent
    print(f"would cost ε={cost.epsilon:g}, δ={cost.delta:g}")
    result = session.sql("census", sql, epsilon=0.25)
    print(result)  # the table, its intervals, who is protected, the cost and what is left
    print("\nmean income by sex, to the nearest 100:")
    print(result["mean_income"].round(-2).to_string())

    try:
        session.sql("census", "SELECT COUNT(*) FROM census", epsilon=50.0)
    except BudgetExceededError as refused:  # refused before the data is read: nothing released
        print(f"\nrefused, nothing spent: {refused}")
    try:
        session.sql("census", "SELECT COUNT(*) FROM census WHERE salary > 0", epsilon=0.1)
    except InvalidParameterError as bad:  # a column the curator did not declare
        print(f"refused, nothing spent: {bad}")


def dpkit(*args: str) -> str:
    out = subprocess.run([sys.executable, "-m", "dpkit.cli", *args], check=True, capture_output=True, text=True)
    return out.stdout


@contextlib.contextmanager
def throwaway_service(directory: Path) -> Iterator[tuple[str, str]]:
    """A local ``dpkit serve`` with the census table, and an analyst granted ε = 1 on it: yields
    the service's URL and the analyst's key; the service stops when the block ends."""
    ledger = f"sqlite:///{directory / 'ledger.sqlite'}"
    dpkit("generate", "census", str(directory / "census.csv"), "--people", "5000", "--metadata", str(directory / "census.json"))  # fmt: skip
    key = json.loads(dpkit("admin", "create-analyst", "alice", "--ledger", ledger, "--json"))["key"]
    dpkit("admin", "register-dataset", "census", str(directory / "census.csv"), "--metadata",
          str(directory / "census.json"), "--size-class", "small", "--ledger", ledger)  # fmt: skip
    dpkit("admin", "grant", "alice", "census", "--epsilon", "1", "--ledger", ledger)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    serve = [sys.executable, "-m", "dpkit.cli", "serve", "--ledger", ledger, "--port", str(port)]
    server = subprocess.Popen(serve, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(1200):
            try:
                urllib.request.urlopen(url + "/v1/me", timeout=1)
            except urllib.error.HTTPError:
                break  # 401: it is up
            except OSError:
                time.sleep(0.05)
        yield url, key
    finally:
        server.terminate()
        server.wait(timeout=30)


def main() -> None:
    if len(sys.argv) > 1:
        analyse(connect(sys.argv[1]))  # the key: DPKIT_API_KEY
        return
    with tempfile.TemporaryDirectory() as tmp, throwaway_service(Path(tmp)) as (url, key):
        print(f"a throwaway dpkit serve at {url}\n")
        analyse(connect(url, key))


if __name__ == "__main__":
    main()
