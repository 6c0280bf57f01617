"""``dpkit budget``: show the budgets of a ledger and their spends, or create a budget."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from dpkit.cli._common import (
    DatasetChoice,
    JsonOption,
    LedgerOption,
    _budget_datasets,
    _emit_json,
    _fail_error,
    _ledger_location,
    _ledger_missing,
    _ledger_where,
    _open_existing,
    _say_identity,
)
from dpkit.cli._errors import Arg, CliContext
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
    choice = None if dataset is None else DatasetChoice.of(dataset, "--dataset")
    dataset = None if choice is None else choice.name
    where = _ledger_location(ledger)
    try:
        with _open_existing(ledger) as store:
            where = _ledger_where(store)
            budgets = [
                b for b in store.list_budgets() if (dataset in (None, b.dataset)) and (analyst in (None, b.analyst))
            ]
            spends = store.list_spends(dataset, analyst) if dataset and analyst else []
    except DPError as exc:
        _fail_error(exc, CliContext(ledger=where))
    if json_output:
        from dpkit.accounting.events import event_to_dict  # the accountants (scipy) only when spends are printed

        _emit_json(
            {
                "ledger": where,
                **({} if choice is None else choice.to_dict()),
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
    _say_identity(choice, where)
    console = Console()
    table = Table(title=f"budgets in {where}")
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
    exist_ok: Annotated[
        bool,
        typer.Option(
            "--exist-ok",
            help="If this budget already exists with the same ε and δ, use it instead of failing "
            "(a stored budget is never changed).",
        ),
    ] = False,
    json_output: JsonOption = False,
) -> None:
    """Create a budget for (dataset, analyst); the ledger file is created on first use.

    The dataset is a name, or a data file's content (sha256:…, as dpkit query pays it). The
    command says which, and where the ledger is; creating a dataset's first budget in a ledger
    that has others also lists them (a cleaned copy of their data should pay from their budget:
    dpkit query COPY ... --dataset NAME)."""
    from dpkit.ledger import open_ledger

    choice = DatasetChoice.of(dataset, "DATASET")
    names = CliContext(options={"dataset": Arg("DATASET"), "analyst": Arg("ANALYST")}, ledger=_ledger_location(ledger))
    new_ledger = _ledger_missing(ledger)
    created: list[bool] = []
    try:
        with open_ledger(ledger) as store:
            where = _ledger_where(store)
            before = _budget_datasets(store)
            record = store.create_budget(
                choice.name,
                analyst,
                epsilon=epsilon,
                delta=delta,
                exist_ok=exist_ok,
                on_create=lambda tx, facts: created.append(True),
            )
    except DPError as exc:
        _fail_error(exc, names)
    others = [d for d in before if d != choice.name]
    if json_output:
        _emit_json(
            {
                "ledger": where,
                "created": bool(created),
                "new_ledger": new_ledger,
                **choice.to_dict(),
                "other_datasets": others if choice.name not in before else [],
                "budget": record.to_dict(),
            }
        )
    else:
        verb = "created budget" if created else "budget already exists:"
        shown = choice.name if choice.file is None else f"{choice.name} ({choice.origin})"
        typer.echo(
            f"{verb} ε={record.epsilon:g}, δ={record.delta:g} for dataset {shown}, analyst {analyst}, in {where}"
        )
    if new_ledger:
        typer.echo(
            f"note: this created a new ledger at {where}; give the same --ledger (or DPKIT_LEDGER) to every "
            "command that should pay from it",
            err=True,
        )
    if created and choice.name not in before and others:
        typer.echo(
            f"note: {choice.name} is a new dataset in this ledger, with a budget of its own; the ledger also has "
            f"budgets for {', '.join(others)}. If {choice.file or choice.name} holds the data of one of them (a "
            "cleaned copy, another export), its queries should pay from that budget instead: "
            "dpkit query DATA SQL --dataset NAME ...",
            err=True,
        )
