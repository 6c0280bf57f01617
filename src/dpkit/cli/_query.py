"""``dpkit query``: one private SQL query on a data file, paid for from the ledger."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from pathlib import Path
from shlex import quote
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from dpkit.cli._common import (
    ColumnsOption,
    ConfOption,
    DatasetChoice,
    DelimiterOption,
    EngineOption,
    JsonOption,
    LedgerOption,
    MasterOption,
    NoHeaderOption,
    NullOption,
    _budget_datasets,
    _csv_options,
    _emit_json,
    _engine_settings,
    _fail,
    _fail_error,
    _ledger_location,
    _ledger_missing,
    _ledger_where,
    _say_identity,
    _spark_session,
)
from dpkit.cli._errors import CliContext
from dpkit.errors import DPError, LedgerError

__all__ = ["query"]


def query(
    data: Annotated[
        str,
        typer.Argument(
            help="A CSV or Parquet file, a directory of Parquet files (Hive-partitioned too) or a quoted glob such as 'data/**/*.parquet' (a directory or glob needs --dataset). With --engine spark: a local CSV or Parquet file, a Parquet directory or glob, or a URI of Parquet data Spark reads (hdfs://..., s3a://...).",
            show_default=False,
        ),
    ],
    sql: Annotated[
        str,
        typer.Argument(
            help='SQL of the private subset, e.g. "SELECT sex, COUNT(*), AVG(age) FROM census GROUP BY sex" (the table dpkit generate census census.csv makes).'
        ),
    ],
    epsilon: Annotated[
        float, typer.Option("--epsilon", help="ε for the whole query, split equally across its aggregates.")
    ],
    metadata: Annotated[
        Path,
        typer.Option(
            "--metadata",
            help="The curator's declared schema (JSON): every usable column's type, bounds and categories, and the privacy unit (the format: docs/metadata.md).",
        ),
    ],
    delta: Annotated[float, typer.Option("--delta", help="δ (private key selection, Gaussian noise).")] = 0.0,
    unit: Annotated[
        str | None, typer.Option("--unit", help="The privacy-unit column (default: the metadata's).")
    ] = None,
    row_level: Annotated[
        bool,
        typer.Option("--row-level", help="Every row is a different person (only when the metadata declares no unit)."),
    ] = False,
    ledger: LedgerOption = ".dpkit/ledger.sqlite",
    analyst: Annotated[
        str, typer.Option("--analyst", help="Whose budget pays (created with dpkit budget create DATA ANALYST ...).")
    ] = "analyst",
    dataset_name: Annotated[
        str | None,
        typer.Option(
            "--dataset",
            help="Pay from the budget of this dataset (a name given to dpkit budget create, or a data file: its "
            "content) instead of DATA's own, e.g. for a cleaned copy of the data that budget protects.",
        ),
    ] = None,
    table: Annotated[
        str | None,
        typer.Option(
            "--table",
            help="The table's name in SQL (default: the file's stem; data for a directory or glob). It does not choose the budget.",
        ),
    ] = None,
    no_header: NoHeaderOption = False,
    csv_columns: ColumnsOption = None,
    delimiter: DelimiterOption = ",",
    null: NullOption = None,
    max_groups: Annotated[
        int | None, typer.Option("--max-groups", help="Groups per privacy unit (default: metadata's, else 1).")
    ] = None,
    max_rows: Annotated[
        int | None, typer.Option("--max-rows", help="Rows per privacy unit per group (default: metadata's, else 1).")
    ] = None,
    noise: Annotated[str, typer.Option("--noise", help="laplace or gaussian.")] = "laplace",
    confidence: Annotated[float, typer.Option("--confidence", help="Confidence level of the intervals.")] = 0.95,
    seed: Annotated[
        int | None,
        typer.Option(
            "--seed", help="Refused: seeded noise can be replayed, and this command always pays from a ledger."
        ),
    ] = None,
    engine: EngineOption = "duckdb",
    master: MasterOption = None,
    conf: ConfOption = None,
    json_output: JsonOption = False,
) -> None:
    """Run one private SQL query on a data file, a Parquet directory or a glob, and pay for it from
    the ledger.

    The budget is the one created for this file's content (dpkit budget create DATA ANALYST),
    whatever --table says, or the one --dataset names (a directory or glob has no single content:
    it needs --dataset). The dataset and the ledger paying are printed on stderr (fields of
    "budget" with --json). --engine spark runs the query on Spark (--master, --conf). Example:

    dpkit generate census census.csv --metadata census.json && \
    dpkit budget create census.csv alice --epsilon 3 && \
    dpkit query census.csv "SELECT sex, COUNT(*), AVG(age) FROM census WHERE age > 30 GROUP BY sex" --epsilon 1 --metadata census.json --analyst alice
    """
    from dpkit.analytics import Session
    from dpkit.analytics.result_display import scale_phrase
    from dpkit.ledger import open_ledger

    settings, uri = _engine_settings(engine, master, conf, data)
    path = Path(data)
    many = uri or not path.is_file()  # a Parquet directory, glob or URI
    if many:
        from dpkit.analytics.engines.parquet_source import parquet_files

        if not uri:
            try:
                found = parquet_files(path)
            except DPError as exc:
                _fail_error(exc, CliContext(data=data))
            if found is None:
                _fail(f"no such file: {data!r}")
        if dataset_name is None:
            _fail(
                f"{data!r} is a directory, glob or URI of Parquet files: name its budget's dataset with --dataset NAME "
                "(dpkit budget create NAME ANALYST ...), as its content has no single identity"
            )
    if engine == "spark" and not many and path.suffix.lower() not in (".parquet", ".pq", ".csv", ".tsv", ".txt"):
        _fail(f"--engine spark reads CSV and Parquet data: {data!r} is not a .csv, .parquet file, directory or glob")
    if not metadata.is_file():
        _fail(
            f"no such metadata file: {str(metadata)!r} (write one by hand, or dpkit generate census ... --metadata FILE for the example)"
        )
    if seed is not None:
        _fail(
            f"--seed {seed} is refused: dpkit query always pays from a ledger, and noise from a seeded rng can be "
            "replayed and subtracted, so the ledger would charge for privacy that was not given (seeds are for "
            "dpkit demo, and for tests with an in-memory dp.Budget in Python)"
        )
    name = table or ("data" if many else path.stem)
    choice = DatasetChoice.of(path, "DATA") if dataset_name is None else DatasetChoice.of(dataset_name, "--dataset")
    dataset = choice.name
    where = _ledger_location(ledger)
    ctx = CliContext(data=choice.file, ledger=where)
    if _ledger_missing(ledger):
        _say_identity(choice, where)
        _fail(
            f"no ledger at {where}: create a budget first (dpkit budget create {quote(choice.file or dataset)} "
            f"{quote(analyst)} --epsilon E --ledger {quote(where)})"
        )
    csv_options = _csv_options(path, no_header, csv_columns, delimiter, null)
    if csv_options and many:
        _fail(f"--no-header, --columns, --delimiter and --null are for CSV files, not {data!r}")
    err = Console(stderr=True)
    try:
        with err.status(f"scanning {path.name} …", spinner="dots") if not json_output else contextlib.nullcontext():
            make: Callable[..., Any]
            if engine == "spark":
                reader = (
                    Session.from_parquet if many or path.suffix.lower() in (".parquet", ".pq") else Session.from_csv
                )
                make = functools.partial(reader, engine="spark", spark=_spark_session(master, settings, "dpkit query"))
            elif many:
                make = Session.from_parquet
            else:
                make = Session.from_csv if csv_options else Session
            session = make(
                data if uri else path,
                **csv_options,
                privacy_unit=unit,
                row_level=True if row_level else None,
                ledger=ledger,
                dataset=dataset,
                analyst=analyst,
                metadata=metadata,
                max_groups=max_groups,
                max_rows=max_rows,
                table=name,
            )
            result = session.sql(sql, epsilon=epsilon, delta=delta, noise=noise, confidence=confidence)  # type: ignore[arg-type]
            record = session._ledger.get_budget(dataset, analyst)
            where = _ledger_where(session._ledger)
    except LedgerError as exc:
        datasets: tuple[str, ...] = ()
        with contextlib.suppress(DPError), open_ledger(ledger) as store:
            datasets = _budget_datasets(store)
        _say_identity(choice, where)
        _fail_error(exc, CliContext(data=ctx.data, ledger=where, datasets=datasets))
    except DPError as exc:
        _say_identity(choice, where)
        _fail_error(exc, ctx)
    if json_output:
        out = result.to_dict()
        out["budget"] = {"ledger": where, **record.to_dict(), **choice.to_dict()}
        _emit_json(out)
        return
    console = Console()
    pct = f"{confidence * 100:g}%"
    tbl = Table(
        title=f"{sql}", caption=f"ε={result.epsilon:g}, δ={result.delta:g} · {pct} intervals · keys: {result.keys}"
    )
    for g in result.groups:
        tbl.add_column(g)
    for a in result.aggregates:
        tbl.add_column(a.name, justify="right")
        tbl.add_column(f"{pct} CI", justify="right")
    for _, row in result.table.iterrows():
        cells = [str(row[g]) for g in result.groups]
        for a in result.aggregates:
            lo, hi = row[f"{a.name}_low"], row[f"{a.name}_high"]
            cells += [_fmt(row[a.name]), "—" if lo != lo else f"[{_fmt(lo)}, {_fmt(hi)}]"]
        tbl.add_row(*cells)
    console.print(tbl)
    for a in result.aggregates:
        scale = scale_phrase(a, _fmt)
        scale = f", {scale}" if scale else ""
        console.print(f"  {a.name}: {a.mechanism}, ε={a.epsilon:.4g}{f', δ={a.delta:.3g}' if a.delta else ''}{scale}")
    for note in result.notes:
        console.print(f"  {note}")
    console.print(
        f"budget {dataset}/{analyst}: spent ε={record.spent_epsilon:.6g} of {record.epsilon:g}, "
        f"remaining ε={record.remaining_epsilon:.6g}, δ={record.remaining_delta:.3g}"
    )
    _say_identity(choice, where)  # on stderr, never wrapped


def _fmt(x: float) -> str:
    return f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.4g}"
