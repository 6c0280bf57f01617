"""The ``dpkit`` command line (Typer): the app, and where each command comes from.

Commands stay thin: they parse options, call library code and print either rich tables or, with
``--json``, one JSON document on stdout (progress bars and errors go to stderr).

One module per command or command group: ``demo`` (:mod:`dpkit.cli._demo`), ``account``
(:mod:`dpkit.cli._account`), ``budget`` (:mod:`dpkit.cli._budget`), ``query``
(:mod:`dpkit.cli._query`), ``generate`` and ``check`` (:mod:`dpkit.cli._data`), ``anonymity``
(:mod:`dpkit.cli._anonymity`), ``attack`` (:mod:`dpkit.cli._attacks`); the curator service's
``serve`` and ``admin`` live in :mod:`dpkit.server.serve_command` and :mod:`dpkit.server.cli`.
This module creates :data:`app`, mounts them in the order ``dpkit --help`` lists them, and holds ``version``.

Extending: a new command is a function in its own module, registered here with
``app.command()(function)``; a command group (``budget``, ``account``, ...) is its own
``typer.Typer()`` mounted with ``app.add_typer(group, name=...)``. Reuse the shared options of
:mod:`dpkit.cli._common` (``JsonOption``, ``SeedOption``, ``LedgerOption``) and its ``_emit_json``
/ ``_fail`` so every command behaves alike. A command whose options are the library's parameters
(``--epsilon``, ``--max-groups``, ...) reports a dpkit error with ``_fail_error``, which words it
in the command line's terms (:mod:`dpkit.cli._errors`: options for parameters, the metadata
file's JSON and commands to run for the Python API's remedies); one that pays from or shows a
budget states its dataset and ledger (``_say_identity``).

Start-up: every ``dpkit`` run, ``--help`` included, imports every command's module to build the
app, so a command module imports at its top only Typer, rich, :mod:`dpkit.errors` and the CLI's
own helpers; the engines, the service, pandas, numpy and the accountants are imported inside the
function that needs them. ``tests/test_import.py`` holds this (nothing heavy after ``--help``),
``benchmarks/bench_import.py`` measures it.
"""

from __future__ import annotations

import typer

import dpkit
from dpkit.cli._account import account
from dpkit.cli._anonymity import anonymity_app, anonymity_check
from dpkit.cli._attacks import attack_app, attack_reconstruction
from dpkit.cli._budget import budget_app, budget_create, budget_show
from dpkit.cli._common import JsonOption, LedgerOption, SeedOption, _emit_json, _fail
from dpkit.cli._data import check, generate
from dpkit.cli._demo import demo
from dpkit.cli._query import query
from dpkit.cli._synth import synth
from dpkit.server.cli import admin_app  # kept beside the service's code
from dpkit.server.serve_command import serve

__all__ = [
    "JsonOption",
    "LedgerOption",
    "SeedOption",
    "account",
    "admin_app",
    "anonymity_app",
    "anonymity_check",
    "app",
    "attack_app",
    "attack_reconstruction",
    "budget_app",
    "budget_create",
    "budget_show",
    "check",
    "demo",
    "generate",
    "main",
    "query",
    "serve",
    "synth",
    "version",
    "_emit_json",
    "_fail",
]

app = typer.Typer(
    name="dpkit",
    help="dpkit: differential privacy you can audit — secure noise, calibrated mechanisms, accuracy with every release.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # `dpkit COMMAND ...` leaves the top level's --help unset (None, not False), and Typer checks a
    # flag that is not a bool with a pydantic validator: importing pydantic for it is a third of the
    # CPU of `dpkit query --help`. A False default skips it (benchmarks/bench_import.py); Click
    # hands each command group its own part of the map, so the groups get one too (below).
    context_settings={"default_map": {"help": False}},
)


@app.callback()
def main() -> None:
    """dpkit: differential privacy you can audit.

    Run `dpkit demo` to see the worked examples of the source texts (randomized response,
    the Laplace mechanism on counts and histograms, Laplace vs Gaussian noise).
    """


def version() -> None:
    """Print the installed dpkit version."""
    typer.echo(f"dpkit {dpkit.__version__}")


app.command()(demo)
app.command()(account)
app.add_typer(budget_app, name="budget")
app.command()(query)
app.command("generate")(generate)
app.add_typer(anonymity_app, name="anonymity")
app.add_typer(attack_app, name="attack")
app.command("check")(check)
app.command("synth")(synth)
app.command("serve")(serve)
app.add_typer(admin_app, name="admin")
app.command()(version)
assert app.info.context_settings is not None  # given above
app.info.context_settings["default_map"].update({g.name: {"help": False} for g in app.registered_groups})


if __name__ == "__main__":  # pragma: no cover
    app()
