"""The data-file commands: ``dpkit generate`` (bundled example data and its metadata) and
``dpkit check`` (how a private file conforms to its declared metadata; curator only).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from dpkit.cli._common import (
    ColumnsOption,
    DelimiterOption,
    JsonOption,
    NoHeaderOption,
    NullOption,
    SkipRowsOption,
    _csv_options,
    _emit_json,
    _fail,
    _fail_error,
)
from dpkit.cli._errors import CliContext, Opt
from dpkit.cli._tables import TABLES_HELP, check_tables, refuse_one_table_options
from dpkit.errors import DPError

__all__ = ["check", "generate"]


def generate(
    kind: Annotated[
        str,
        typer.Argument(
            help="census: the census-like example table; hospital: a hospital's tables (visits and prescriptions "
            "private, regions and wards public) for queries over several tables."
        ),
    ],
    out: Annotated[
        Path, typer.Argument(help="Where to write the CSV (census), or the directory of one CSV per table (hospital).")
    ],
    people: Annotated[
        int, typer.Option("--people", help="Number of people (census: 1–3 rows each; hospital: patients).")
    ] = 20_000,
    metadata: Annotated[
        Path | None, typer.Option("--metadata", help="Also write the curator's metadata JSON here.")
    ] = None,
) -> None:
    """Write bundled example data (generated, not real people) and, optionally, its metadata.

    dpkit generate hospital hospital/ --people 2000 --metadata hospital.json writes visits.csv,
    prescriptions.csv, regions.csv and wards.csv; query them with
    dpkit query visits=hospital/visits.csv regions=hospital/regions.csv ... "SELECT ..." --metadata hospital.json."""
    from dpkit import datasets

    if kind not in ("census", "hospital"):
        _fail(f"unknown data set {kind!r}: accepted: census, hospital")
    try:
        tables = {"": datasets.census(people=people)} if kind == "census" else datasets.hospital(patients=people)
    except DPError as exc:
        _fail(str(exc))
    if kind == "census":
        out.parent.mkdir(parents=True, exist_ok=True)
        tables[""].to_csv(out, index=False)
        wrote = f"wrote {len(tables[''])} rows ({people} people) to {out}"
    else:
        if out.exists() and not out.is_dir():
            _fail(f"OUT: {out} is a file; hospital writes a directory of one CSV per table")
        out.mkdir(parents=True, exist_ok=True)
        for name, frame in tables.items():
            frame.to_csv(out / f"{name}.csv", index=False)
        rows = ", ".join(f"{name}.csv ({len(frame)} rows)" for name, frame in tables.items())
        wrote = f"wrote {rows} ({people} patients) to {out}"
    if metadata is not None:
        declared = datasets.CENSUS_METADATA if kind == "census" else datasets.HOSPITAL_METADATA
        metadata.parent.mkdir(parents=True, exist_ok=True)
        metadata.write_text(json.dumps(declared, indent=2) + "\n", encoding="utf-8")
    typer.echo(wrote + (f" and metadata to {metadata}" if metadata else ""))


def check(
    data_args: Annotated[
        list[str],
        typer.Argument(
            metavar="DATA", help="A CSV (header line first), Parquet or DuckDB database file. " + TABLES_HELP
        ),
    ],
    metadata: Annotated[
        Path,
        typer.Option(
            "--metadata", help="The curator's declared schema (JSON): column types, bounds, categories, privacy unit."
        ),
    ],
    table: Annotated[
        str | None,
        typer.Option(
            "--table",
            help="The table to check in a DuckDB database file; otherwise the name shown (default: the file's stem).",
        ),
    ] = None,
    no_header: NoHeaderOption = False,
    csv_columns: ColumnsOption = None,
    delimiter: DelimiterOption = ",",
    null: NullOption = None,
    skip_rows: SkipRowsOption = 0,
    json_output: JsonOption = False,
    data_norm: Annotated[
        float | None,
        typer.Option(
            "--data-norm",
            help="Also count the rows whose --features have an ℓ2 norm above this: the rows a dpkit.ml "
            "estimator given this data_norm would scale down.",
        ),
    ] = None,
    features: Annotated[
        str | None,
        typer.Option("--features", help="The numeric columns of the feature vector for --data-norm, comma-separated."),
    ] = None,
) -> None:
    """Check how well a private file conforms to its declared metadata (curator only).

    Per declared column: conforming values, NULLs, values that are not of the declared type,
    values out of the bounds or outside the categories, with near misses (' Male' → 'Male');
    for the privacy unit, rows per unit. The report holds exact counts and values of the private
    data: it is for the curator, not a private release, and spends no budget.

    Several tables (metadata declaring "tables"): one report per table, e.g.
    dpkit check visits=visits.csv regions=regions.csv --metadata hospital.json

    Exit code: 0 when everything conforms, 1 when something does not, 2 on bad input.
    """
    from dpkit.analytics.check import check_data
    from dpkit.analytics.dataset_metadata import declares_tables  # (numpy: not at --help)

    if declares_tables(metadata):
        refuse_one_table_options(
            {
                "--table": table is not None, "--no-header": no_header, "--columns": csv_columns is not None,
                "--delimiter": delimiter != ",", "--null": bool(null), "--skip-rows": skip_rows != 0,
                "--data-norm": data_norm is not None, "--features": features is not None,
            },
            2,
        )  # fmt: skip
        raise typer.Exit(check_tables(data_args, metadata, json_output))
    if len(data_args) != 1:
        _fail(f'DATA: one file, not {len(data_args)} (several TABLE=PATH only with --metadata declaring "tables")', 2)
    data = Path(data_args[0])
    if not data.is_file():
        _fail(f"no such data file: {str(data)!r}", 2)
    if not metadata.is_file():
        _fail(f"no such metadata file: {str(metadata)!r} (the curator's JSON declaring the columns)", 2)
    csv_options = _csv_options(data, no_header, csv_columns, delimiter, null, skip_rows)
    try:
        source: object = data
        if csv_options:  # read as `dpkit query` reads it with the same options
            from dpkit.analytics.engines.csv_source import CsvFile, CsvOptions

            source = CsvFile(data, CsvOptions(**csv_options))  # CsvOptions checks and freezes them
        names = None if features is None else [f.strip() for f in features.split(",")]
        report = check_data(source, metadata, table=table, features=names, data_norm=data_norm)
    except DPError as exc:
        norm_options = CliContext(options={"data_norm": Opt("--data-norm"), "features": Opt("--features")})
        _fail_error(exc, norm_options, 2)  # worded for the command line (options, not keywords)
    if json_output:
        _emit_json(report.to_dict())
    else:  # plain fixed-width text: a rich table would cut declared types and values to the terminal's width
        typer.echo(report.to_text())
    raise typer.Exit(0 if report.ok else 1)
