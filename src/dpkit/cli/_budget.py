"""``dpkit budget``: show the budgets of a ledger and their spends, or create a budget."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from dpkit.accounting.events import event_to_dict
from dpkit.cli._common import (
    JsonOption,
    LedgerOption,
    _emit_json,
    _fail,
    _ledger_missing,
    _ledger_where,
    _open_existing,
)
from dpkit.errors import DPError

__all__ = ["budget_app", "budget_create", "budget_show"]

budget_app = typer.Typer(help="Show or create privacy budgets in a ledger.", no_args_is_help=False)


@budget_app.callback(invoke_without_command=True)
def budget_show(
    ctx: typer.Context,
    ledger: LedgerOption = ".dpkit/ledger.sqlite",
    dataset: Annotated[
        str | None,
        typer.Option(
            "--dataset", help="Show the spends of this dataset's budget (a name, or a data file: its content identity)."
        ),
    ] = None,
    analyst: Annotated[str | None, typer.Option("--analyst", help="… for this analyst.")] = None,
    json_output: JsonOption = False,
) -> None:
    """Show every budget (ε, δ, spent, remaining), or one budget's spends with --dataset/--analyst."""
    if ctx.invoked_subcommand is not None:
        return
    if dataset is not None and Path(dataset).is_file():
        from dpkit.ledger.identity import dataset_identity

        dataset = dataset_identity(dataset)
    try:
        with _open_existing(ledger) as store:
            budgets = [
                b for b in store.list_budgets() if (dataset in (None, b.dataset)) and (analyst in (None, b.analyst))
            ]
            spends = store.list_spends(dataset, analyst) if dataset and analyst else []
    except DPError as exc:
        _fail(str(exc))
    if json_output:
        _emit_json(
            {
                "ledger": str(ledger),
                "budgets": [
                    {**b.to_dict(), "neighbours": b.neighbours, "created_at": b.created_at.isoformat()} for b in budgets
                ],
                "spends": [
                    {
                        "id": sp.id,
                        "time": sp.created_at.isoformat(),
                        "query": sp.query_text,
                        "epsilon": sp.epsilon_cost,
                        "delta": sp.delta_cost,
                        "event": event_to_dict(sp.event),
                    }
                    for sp in spends
                ],
            }
        )
        return
    console = Console()
    table = Table(title=f"budgets in {ledger}")
    for col in ("dataset", "analyst", "ε", "δ", "spent ε", "spent δ", "remaining ε", "neighbours"):
        table.add_column(col)
    for b in budgets:
        table.add_row(
            b.dataset,
            b.analyst,
            f"{b.epsilon:g}",
            f"{b.delta:g}",
            f"{b.spent_epsilon:.6g}",
            f"{b.spent_delta:.3g}",
            f"{b.remaining_epsilon:.6g}",
            b.neighbours or "—",
        )
    console.print(table)
    if dataset and analyst:
        spend_table = Table(title=f"spends of {dataset} / {analyst}")
        for col in ("id", "time", "query", "event", "ε", "δ"):
            spend_table.add_column(col)
        for sp in spends:
            spend_table.add_row(
                str(sp.id),
                sp.created_at.isoformat(timespec="seconds"),
                sp.query_text,
                type(sp.event).__name__,
                f"{sp.epsilon_cost:.6g}",
                f"{sp.delta_cost:.3g}",
            )
        console.print(spend_table)


@budget_app.command("create")
def budget_create(
    dataset: Annotated[
        str,
        typer.Argument(
            help="A data file (its budget is kept under the file's content identity, as dpkit query pays it) or a dataset name (the service's, a library session's)."
        ),
    ],
    analyst: Annotated[str, typer.Argument(help="Analyst name.")],
    epsilon: Annotated[float, typer.Option("--epsilon", help="The budget's ε.")],
    delta: Annotated[float, typer.Option("--delta", help="The budget's δ.")] = 0.0,
    ledger: LedgerOption = ".dpkit/ledger.sqlite",
) -> None:
    """Create a budget for (dataset, analyst); the ledger file is created on first use."""
    from dpkit.ledger import open_ledger
    from dpkit.ledger.identity import dataset_identity

    shown = dataset
    if Path(dataset).is_file():
        dataset = dataset_identity(dataset)
        shown = f"{Path(shown).name} ({dataset})"
    new_ledger = _ledger_missing(ledger)
    try:
        with open_ledger(ledger) as store:
            record = store.create_budget(dataset, analyst, epsilon=epsilon, delta=delta)
            where = _ledger_where(store)
    except DPError as exc:
        _fail(str(exc))
    typer.echo(f"created budget ε={record.epsilon:g}, δ={record.delta:g} for {shown}/{analyst} in {where}")
    if new_ledger:
        typer.echo(
            f"note: this created a new ledger at {where}; give the same --ledger (or DPKIT_LEDGER) to every "
            "command that should pay from it",
            err=True,
        )
