"""Options and helpers shared by the ``dpkit`` commands: ``--json``, ``--seed`` and ``--ledger``,
JSON output (:func:`_emit_json`), errors (:func:`_fail`) and opening an existing ledger.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console

JsonOption = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON on stdout instead of tables.")]
SeedOption = Annotated[
    int | None,
    typer.Option(
        "--seed",
        min=0,
        help="Seed the noise with numpy.random.default_rng(SEED): reproducible, NOT secure (teaching and tests only). "
        "Without it all noise comes from the OS CSPRNG.",
    ),
]


def _emit_json(obj: Any) -> None:
    typer.echo(json.dumps(obj, indent=2, ensure_ascii=False))


def _fail(message: str, code: int = 1) -> NoReturn:
    Console(stderr=True).print(f"[bold red]error:[/] {message}")
    raise typer.Exit(code)


LedgerOption = Annotated[
    str,
    typer.Option(
        "--ledger",
        envvar="DPKIT_LEDGER",
        help="The ledger: a SQLite file path, sqlite:///PATH or postgresql://USER@HOST/DB.",
    ),
]


def _ledger_missing(ledger: str) -> bool:
    """True for a SQLite ledger whose file does not exist (a server ledger always 'exists')."""
    if ledger.lower().startswith(("postgresql://", "postgres://")):
        return False
    return not Path(ledger.removeprefix("sqlite:///")).exists()


def _ledger_where(store: Any) -> str:
    """Where an open ledger is, as a reader can find it again: a SQLite file's absolute path (the
    default is relative to the working directory, so the same command elsewhere uses another
    ledger), or a server URL without its password."""
    path = getattr(store, "path", None)
    return str(path) if path is not None else str(store.url)


def _open_existing(ledger: str):
    from dpkit.ledger import open_ledger

    if _ledger_missing(ledger):
        _fail(f"no ledger at {ledger!r} (create a budget first: dpkit budget create ...)")
    return open_ledger(ledger)
