"""Forks curator servers that kill themselves (SIGKILL) at a chosen point of a query.

Run as a child of the crash test; one command per line on stdin:

* ``start POINT URL KEYFILE`` — bind a loopback socket, fork a server over the ledger ``URL``
  (its audit key in ``KEYFILE``) that dies at ``POINT``; answers ``port N``;
* ``reap`` — SIGKILL the server if it is still alive, wait for it; answers ``exit STATUS``.

Forking from this process (which imports everything once and runs no threads) makes a trial
cost milliseconds instead of an interpreter start. Points, in the order a query passes them:

``in_debit``       inside the ledger's debit transaction, after the spend row, before COMMIT
``in_entry``       inside the same transaction, the audit entry written, before COMMIT
``after_debit``    the debit and its entry committed, no noise drawn yet
``after_noise``    noise drawn, the answer not yet serialised
``none``           no crash: the test kills the server after reading the answer
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys

import uvicorn

import dpkit.ledger.sqlite as sqlite_ledger
from dpkit.analytics.results import QueryResult
from dpkit.analytics.session import Session
from dpkit.server import Service, create_app

POINTS = ("in_debit", "in_entry", "after_debit", "after_noise", "none")


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _arm(point: str, url: str) -> None:
    if point == "in_debit":
        if url.startswith("sqlite"):
            sqlite_ledger._after_insert_hook = _die
        else:
            import dpkit.ledger.postgres as postgres_ledger

            postgres_ledger._after_insert_hook = _die
    elif point == "after_debit":
        pay = Session._pay

        def pay_then_die(self: Session, *args: object, **kwargs: object) -> int | None:
            pay(self, *args, **kwargs)  # type: ignore[arg-type]
            _die()
            return None

        Session._pay = pay_then_die  # type: ignore[method-assign]
    elif point == "after_noise":

        def die_before_serialising(self: QueryResult) -> dict[str, object]:
            _die()
            return {}

        QueryResult.to_dict = die_before_serialising  # type: ignore[method-assign]
    elif point == "in_entry":
        chain = Service._chain

        def chain_then_die(self: Service, tx, batch):  # type: ignore[no-untyped-def]
            entries = chain(self, tx, batch)
            if any(fields.get("outcome") == "paid" for fields in batch):
                _die()
            return entries

        Service._chain = chain_then_die  # type: ignore[method-assign]


def _serve(point: str, url: str, key_file: str, sock: socket.socket) -> None:
    _arm(point, url)
    app = create_app(
        Service(url, audit_key=key_file, dataset_dir=os.path.join(os.path.dirname(key_file), "datasets")),
        rate=1e9,
        burst=10**9,
        _hold_answers=False,
        answer_seconds=60.0,
        max_concurrent=10**6,
        cpu_seconds_per_hour=1e9,
    )
    uvicorn.Server(uvicorn.Config(app, log_level="critical", lifespan="off")).run(sockets=[sock])


def main() -> None:
    child = 0
    for line in sys.stdin:
        cmd = line.split()
        if cmd[0] == "start":
            point, url, key_file = cmd[1], cmd[2], cmd[3]
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            sock.listen(16)
            child = os.fork()
            if child == 0:
                try:
                    _serve(point, url, key_file, sock)
                finally:
                    os._exit(3)
            print("port", sock.getsockname()[1], flush=True)
            sock.close()
        elif cmd[0] == "reap":
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGKILL)
            _, status = os.waitpid(child, 0)
            print("exit", os.waitstatus_to_exitcode(status), flush=True)


if __name__ == "__main__":
    main()
