"""Datasets of several tables on the command line: ``TABLE=PATH`` arguments.

When the metadata declares ``tables`` (a :class:`~dpkit.analytics.DatasetMetadata`), the data
arguments of ``dpkit query``, ``dpkit check`` and ``dpkit admin register-dataset`` name one
source per declared table, each as ``TABLE=PATH``::

    dpkit check visits=visits.csv regions=regions.csv --metadata hospital.json

The path is everything after the first ``=`` (a path may hold ``=``, as Hive partitions do).
With metadata of one table the data argument is one path, read as ever: nothing in it is parsed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

__all__ = ["table_pairs", "TABLES_HELP"]

#: The help's sentence on the several-table form, shared by the commands.
TABLES_HELP = 'For a dataset of several tables (metadata with "tables"): one TABLE=PATH per declared table.'


def table_pairs(items: Sequence[str], what: str, form: str = "TABLE=PATH") -> dict[str, str] | str:
    """``TABLE=VALUE`` items as a mapping in the order given, or the reason they are refused
    (worded for the command line, naming ``what``: the argument or option, and ``form``)."""
    pairs: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        name = name.strip()
        if not sep or not name or not value:
            return f"{what} {item!r}: expected {form} (the metadata declares several tables)"
        if name in pairs:
            return f"{what}: table {name!r} is given twice"
        pairs[name] = value
    return pairs


def refuse_one_table_options(given: dict[str, bool], code: int = 1) -> None:
    """Fail naming the options of a one-table read that were given (True) with several tables:
    their tables are named and declared by the metadata, and read by its rules."""
    from dpkit.cli._common import _fail

    named = [name for name, was_given in given.items() if was_given]
    if named:
        _fail(f"{', '.join(named)}: not with several tables (the metadata names and declares each table)", code)


def _sources(items: Sequence[str], code: int = 1) -> dict[str, str]:
    from dpkit.cli._common import _fail

    pairs = table_pairs(items, "DATA")
    if isinstance(pairs, str):
        _fail(pairs, code)
    return pairs


def check_tables(items: Sequence[str], metadata: Path, json_output: bool) -> int:
    """``dpkit check`` of a dataset of several tables: each table's report; the exit code."""
    from dpkit.analytics.check_tables import check_dataset
    from dpkit.cli._common import _emit_json, _fail_error
    from dpkit.errors import DPError

    try:
        report = check_dataset(_sources(items, 2), metadata)
    except DPError as exc:
        _fail_error(exc, None, 2)
    if json_output:
        _emit_json(report.to_dict())
    else:
        import typer

        typer.echo(report.to_text())
    return 0 if report.ok else 1


def query_tables(
    items: Sequence[str],
    sql: str,
    *,
    metadata: Path,
    dataset: str | None,
    ledger: str,
    analyst: str,
    options: dict[str, Any],
    bounds: dict[str, int | None],
    json_output: bool,
    show: Callable[[Any, str, float, str], None],
) -> None:
    """``dpkit query`` on a dataset of several tables: one session over them, paid from the
    budget ``--dataset`` names (several files have no single content to name it); ``show``
    prints the result as ``dpkit query`` does."""
    from shlex import quote

    from dpkit.analytics import Session
    from dpkit.cli._common import (
        DatasetChoice,
        _budget_datasets,
        _emit_json,
        _fail,
        _fail_error,
        _ledger_location,
        _ledger_missing,
        _ledger_where,
        _say_identity,
    )
    from dpkit.cli._errors import CliContext
    from dpkit.errors import DPError, LedgerError
    from dpkit.ledger import open_ledger

    sources = _sources(items)
    if dataset is None:
        _fail(
            "several tables: name their budget's dataset with --dataset NAME (dpkit budget create NAME ANALYST ...), "
            "as several files have no single content to name it"
        )
    choice = DatasetChoice(dataset, "--dataset")
    where = _ledger_location(ledger)
    if _ledger_missing(ledger):
        _say_identity(choice, where)
        _fail(
            f"no ledger at {where}: create a budget first (dpkit budget create {quote(dataset)} {quote(analyst)} "
            f"--epsilon E --ledger {quote(where)})"
        )
    try:
        session = Session(
            sources,
            metadata=metadata,
            ledger=ledger,
            dataset=dataset,
            analyst=analyst,
            **bounds,  # type: ignore[arg-type]
        )
        result = session.sql(sql, **options)
        record = session._ledger.get_budget(dataset, analyst)
        where = _ledger_where(session._ledger)
    except LedgerError as exc:  # (no budget for this dataset and analyst: say which ones there are)
        datasets: tuple[str, ...] = ()
        with contextlib.suppress(DPError), open_ledger(ledger) as store:
            datasets = _budget_datasets(store)
        _say_identity(choice, where)
        _fail_error(exc, CliContext(ledger=where, datasets=datasets))
    except DPError as exc:
        _say_identity(choice, where)
        _fail_error(exc, CliContext(ledger=where))
    if json_output:
        _emit_json({**result.to_dict(), "budget": {"ledger": where, **record.to_dict(), **choice.to_dict()}})
        return
    show(
        result,
        sql,
        options["confidence"],
        f"budget {dataset}/{analyst}: spent ε={record.spent_epsilon:.6g} of {record.epsilon:g}, "
        f"remaining ε={record.remaining_epsilon:.6g}, δ={record.remaining_delta:.3g}",
    )
    _say_identity(choice, where)
