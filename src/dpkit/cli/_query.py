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
    SkipRowsOption,
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
from dpkit.cli._tables import TABLES_HELP, query_tables, refuse_one_table_options
from dpkit.errors import DPError, LedgerError

__all__ = ["query"]


def query(
    arguments: Annotated[
        list[str],
        typer.Argument(
            metavar="DATA... SQL",
            help="DATA: a CSV or Parquet file, a directory of Parquet files (Hive-partitioned too) or a quoted glob such as 'data/**/*.parquet' (a directory or glob needs --dataset). With --engine spark: a local CSV or Parquet file, a Parquet directory or glob, or a URI of Parquet data Spark reads (hdfs://..., s3a://...). "
            + TABLES_HELP
            + ' SQL (last): a query of the private subset, e.g. "SELECT sex, COUNT(*), AVG(age) FROM census GROUP BY sex" (the table dpkit generate census census.csv makes).',
            show_default=False,
        ),
    ],
    epsilon: Annotated[
        float, typer.Option("--epsilon", help="ε for the whole query, split equally across its aggregates.")
    ],
    metadata: Annotated[
        Path | None,
        typer.Option(
            "--metadata",
            help="The curator's declared schema (JSON): every usable column's type, bounds and categories, and the privacy unit (the format: docs/metadata.md). Required, except with --server (the service holds it).",
            show_default=False,
        ),
    ] = None,
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
            help="The table's name in SQL (default: the file's stem, the directory's name, or a glob's last directory). It does not choose the budget.",
        ),
    ] = None,
    no_header: NoHeaderOption = False,
    csv_columns: ColumnsOption = None,
    delimiter: DelimiterOption = ",",
    null: NullOption = None,
    skip_rows: SkipRowsOption = 0,
    max_groups: Annotated[
        int | None, typer.Option("--max-groups", help="Groups per privacy unit (default: metadata's, else 1).")
    ] = None,
    max_rows: Annotated[
        int | None, typer.Option("--max-rows", help="Rows per privacy unit per group (default: metadata's, else 1).")
    ] = None,
    noise: Annotated[str, typer.Option("--noise", help="laplace or gaussian.")] = "laplace",
    confidence: Annotated[float, typer.Option("--confidence", help="Confidence level of the intervals.")] = 0.95,
    bounding_epsilon: Annotated[
        float | None,
        typer.Option(
            "--bounding-epsilon",
            help="Also pay this ε (on top of --epsilon) for a noisy estimate of what contribution bounding left out: the people who lost rows to the caps, the kept values beyond the declared bounds.",
            show_default=False,
        ),
    ] = None,
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
    server: Annotated[
        str | None,
        typer.Option(
            "--server",
            help="Ask the curator service at this URL (dpkit serve) instead: DATA is the name of a dataset it granted you, your API key is read from the environment variable DPKIT_API_KEY, and the service's budget pays.",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Run one private SQL query on a data file, a Parquet directory or a glob, or a service's dataset.

    Locally the query is paid for from the ledger; with --server URL it runs on a dataset of a
    curator service, paid from your budget there.

    The budget is the one created for this file's content (dpkit budget create DATA ANALYST),
    whatever --table says, or the one --dataset names (a directory or glob has no single content:
    it needs --dataset). The dataset and the ledger paying are printed on stderr (fields of
    "budget" with --json). --engine spark runs the query on Spark (--master, --conf). Example:

    dpkit generate census census.csv --metadata census.json && \
    dpkit budget create census.csv alice --epsilon 3 && \
    dpkit query census.csv "SELECT sex, COUNT(*), AVG(age) FROM census WHERE age > 30 GROUP BY sex" --epsilon 1 --metadata census.json --analyst alice

    Against a service: DPKIT_API_KEY=dpk_... dpkit query --server http://127.0.0.1:8000 census "SELECT COUNT(*) FROM census" --epsilon 0.5

    Several tables (metadata declaring "tables"): dpkit query visits=visits.csv regions=regions.csv "SELECT ..." --metadata hospital.json --dataset hospital --epsilon 1
    """
    if len(arguments) < 2:
        _fail(f"missing argument {'SQL' if arguments else 'DATA'}: dpkit query DATA... SQL (see dpkit query --help)", 2)
    data_args, sql = arguments[:-1], arguments[-1]
    from dpkit.analytics.dataset_metadata import declares_tables  # (numpy: not at --help)

    if server is None and metadata is not None and declares_tables(metadata):
        refuse_one_table_options({
            "--unit": unit is not None, "--row-level": row_level, "--table": table is not None,
            "--no-header": no_header, "--columns": csv_columns is not None, "--delimiter": delimiter != ",",
            "--null": bool(null), "--skip-rows": skip_rows != 0, "--seed": seed is not None,
            "--engine": engine != "duckdb", "--master": master is not None, "--conf": bool(conf),
        })  # fmt: skip
        options = {"epsilon": epsilon, "delta": delta, "noise": noise, "confidence": confidence}
        query_tables(
            data_args, sql, metadata=metadata, dataset=dataset_name, ledger=ledger, analyst=analyst,
            options={**options, "bounding_epsilon": bounding_epsilon},
            bounds={"max_groups": max_groups, "max_rows": max_rows}, json_output=json_output, show=_print_result,
        )  # fmt: skip
        return
    if len(data_args) != 1:
        _fail(
            f"DATA: one file, directory, glob or dataset name, not {len(data_args)} (several TABLE=PATH only with "
            '--metadata declaring "tables")'
        )
    data = data_args[0]
    if server is not None:
        local = {
            "--metadata": metadata, "--unit": unit, "--row-level": row_level or None, "--dataset": dataset_name,
            "--table": table, "--no-header": no_header or None, "--columns": csv_columns,
            "--delimiter": None if delimiter == "," else delimiter, "--null": null, "--skip-rows": skip_rows or None,
            "--max-groups": max_groups,
            "--max-rows": max_rows, "--seed": seed, "--engine": None if engine == "duckdb" else engine,
            "--master": master, "--conf": conf, "--analyst": None if analyst == "analyst" else analyst,
        }  # fmt: skip
        given = [name for name, value in local.items() if value is not None]
        if given:
            _fail(f"{', '.join(given)}: not with --server (the service holds the data, its metadata and your budget)")
        _query_server(server, data, sql, epsilon, delta, noise, confidence, bounding_epsilon, json_output)
        return
    if metadata is None:
        _fail("--metadata FILE is required: the curator's declared schema of DATA (or --server URL to ask a service)")
    from dpkit.analytics import Session
    from dpkit.analytics.engines.base import default_table
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
    name = table or (default_table(data) if many else path.stem)
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
    csv_options = _csv_options(path, no_header, csv_columns, delimiter, null, skip_rows)
    if csv_options and many:
        _fail(f"--no-header, --columns, --delimiter, --null and --skip-rows are for CSV files, not {data!r}")
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
            result = session.sql(
                sql,
                epsilon=epsilon,
                delta=delta,
                noise=noise,  # type: ignore[arg-type]
                confidence=confidence,
                bounding_epsilon=bounding_epsilon,
            )
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
    _print_result(
        result,
        sql,
        confidence,
        f"budget {dataset}/{analyst}: spent ε={record.spent_epsilon:.6g} of {record.epsilon:g}, "
        f"remaining ε={record.remaining_epsilon:.6g}, δ={record.remaining_delta:.3g}",
    )
    _say_identity(choice, where)  # on stderr, never wrapped


def _query_server(
    url: str,
    dataset: str,
    sql: str,
    epsilon: float,
    delta: float,
    noise: str,
    confidence: float,
    bounding_epsilon: float | None,
    json_output: bool,
) -> None:
    """``dpkit query --server``: the query through :mod:`dpkit.client`, shown as a local one."""
    import dataclasses
    import os

    from dpkit.client import connect
    from dpkit.client.connection import KEY_VARIABLE

    if not os.environ.get(KEY_VARIABLE):
        _fail(f"--server needs your API key in the environment variable {KEY_VARIABLE} (export {KEY_VARIABLE}=dpk_...)")
    ctx = CliContext(data=dataset)
    try:
        session = connect(url)
        result = session.sql(
            dataset,
            sql,
            epsilon=epsilon,
            delta=delta,
            noise=noise,
            confidence=confidence,
            bounding_epsilon=bounding_epsilon,
        )
        budget = session.budget(dataset)
    except DPError as exc:
        _fail_error(exc, ctx)
    if json_output:
        _emit_json({**result.to_dict(), "budget": {"server": session.url, **dataclasses.asdict(budget)}})
        return
    _print_result(
        result,
        sql,
        confidence,
        f"budget {dataset}/{session.analyst} at {session.url}: spent ε={budget.spent_epsilon:.6g} of "
        f"{budget.epsilon:g}, remaining ε={budget.remaining_epsilon:.6g}, δ={budget.remaining_delta:.3g}",
    )


def _print_result(result: Any, sql: str, confidence: float, budget: str) -> None:
    """The released table with its intervals, what each aggregate is, the notes and ``budget``
    (a line saying what is left), on stdout."""
    from dpkit.analytics.result_display import bounding_lines, rank_phrase, scale_phrase

    console = Console()
    pct = f"{confidence * 100:g}%"
    tbl = Table(
        title=f"{sql}", caption=f"ε={result.epsilon:g}, δ={result.delta:g} · {pct} intervals · keys: {result.keys}"
    )
    for g in result.groups:
        tbl.add_column(g, no_wrap=True)
    for a in result.aggregates:
        tbl.add_column(a.name, justify="right", no_wrap=True)
        tbl.add_column(f"{pct} CI", justify="right", no_wrap=True)
    for _, row in result.table.iterrows():
        cells = [str(row[g]) for g in result.groups]
        for a in result.aggregates:
            lo, hi = row[f"{a.name}_low"], row[f"{a.name}_high"]
            if lo == lo:
                ci = f"[{_fmt(lo)}, {_fmt(hi)}]"
            else:  # a quantile: no value interval, its rank error bound (rows) instead
                ci = "—" if a.rank_error != a.rank_error else f"rank ±{_fmt(a.rank_error)}"
            cells += [_fmt(row[a.name]), ci]
        tbl.add_row(*cells)
    # A table wider than the terminal (or than 80 columns, rich's width when stdout is not one) is
    # printed at its own width: a name or an interval is never cut to "median_…" or broken over
    # two lines; only the terminal may wrap the long lines.
    width = console.measure(tbl, options=console.options.update_width(10_000)).maximum
    (console if width <= console.width else Console(width=width)).print(tbl)
    for line in bounding_lines(result):  # what the intervals cover, right under them
        console.print(f"  {line}", markup=False, highlight=False)
    for a in result.aggregates:
        scale = scale_phrase(a, _fmt) or rank_phrase(a, _fmt)
        scale = f", {scale}" if scale else ""
        console.print(f"  {a.name}: {a.mechanism}, ε={a.epsilon:.4g}{f', δ={a.delta:.3g}' if a.delta else ''}{scale}")
    for note in result.notes:
        console.print(f"  {note}")
    console.print(budget)


def _fmt(x: float) -> str:
    return f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.4g}"
