"""Child process for the SQLite ledger tests; run as a script, never collected by pytest.

python _ledger_worker.py debit   LEDGER N READY GO   # N debits of ε = 1/1000, prints counts as JSON
python _ledger_worker.py create  LEDGER READY GO     # open (creating) the ledger at the same moment
python _ledger_worker.py hang    LEDGER MARKER       # stop a debit between INSERT and COMMIT
python _ledger_worker.py stream  LEDGER MARKER       # debit ε = 10⁻⁶ in a loop until killed
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path


def _wait_for(path: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {path}")
        time.sleep(0.002)


def debit(ledger_path: str, n: str, ready: str, go: str) -> None:
    from dpkit.accounting import LaplaceEvent
    from dpkit.errors import BudgetExceededError
    from dpkit.ledger import SQLiteLedger

    ledger = SQLiteLedger(ledger_path)
    event = LaplaceEvent(noise_multiplier=1000)  # ε = 1/1000 exactly
    Path(ready).touch()
    _wait_for(go)
    ok = refused = 0
    for i in range(int(n)):
        try:
            ledger.debit("census", "alice", event, f"query {os.getpid()}-{i}")
            ok += 1
        except BudgetExceededError:
            refused += 1
    ledger.close()
    print(json.dumps({"ok": ok, "refused": refused}))


def create(ledger_path: str, ready: str, go: str) -> None:
    from dpkit.ledger import SQLiteLedger

    Path(ready).touch()
    _wait_for(go)
    ledger = SQLiteLedger(ledger_path)
    ledger.create_budget("census", "alice", epsilon=1.0, exist_ok=True)
    ledger.close()
    print(json.dumps({"ok": 1}))


def hang(ledger_path: str, marker: str) -> None:
    import dpkit.ledger.sqlite as sqlite_ledger
    from dpkit.accounting import LaplaceEvent

    def hold_mid_transaction() -> None:
        Path(marker).touch()
        time.sleep(600)  # the parent SIGKILLs us here

    sqlite_ledger._after_insert_hook = hold_mid_transaction
    ledger = sqlite_ledger.SQLiteLedger(ledger_path)
    ledger.debit("census", "alice", LaplaceEvent(noise_multiplier=10), "killed mid-transaction")
    raise SystemExit("the hook should have blocked")


def stream(ledger_path: str, marker: str) -> None:
    from dpkit.accounting import LaplaceEvent
    from dpkit.ledger import SQLiteLedger

    ledger = SQLiteLedger(ledger_path)
    event = LaplaceEvent(noise_multiplier=10**6)
    ledger.debit("census", "alice", event, "stream")
    Path(marker).touch()
    while True:
        ledger.debit("census", "alice", event, "stream")


if __name__ == "__main__":
    {"debit": debit, "create": create, "hang": hang, "stream": stream}[sys.argv[1]](*sys.argv[2:])
