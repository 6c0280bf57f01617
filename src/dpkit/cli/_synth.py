"""``dpkit synth``: a differentially private synthetic table from a CSV or Parquet file, in one
command (the curator's: it pays once, from the (ε, δ) given, and writes the rows)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from dpkit.cli._common import (
    ConfOption,
    EngineOption,
    MasterOption,
    _engine_settings,
    _fail,
    _fail_error,
    _spark_session,
)
from dpkit.cli._errors import CliContext, Opt
from dpkit.errors import DPError

__all__ = ["synth"]


def synth(
    data: Annotated[
        str,
        typer.Argument(
            help="A CSV file (header first), a Parquet file, directory or glob; with --engine spark, Parquet or a URI Spark reads."
        ),
    ],
    metadata: Annotated[
        Path,
        typer.Option(
            "--metadata", help="The curator's metadata JSON: columns with categories or bounds, and the privacy unit."
        ),
    ],
    epsilon: Annotated[float, typer.Option("--epsilon", help="The ε of the whole release.")],
    delta: Annotated[float, typer.Option("--delta", help="The δ of the whole release (> 0).")],
    out: Annotated[Path, typer.Option("--out", help="Where to write the synthetic rows (CSV).")],
    rows: Annotated[
        int | None, typer.Option("--rows", min=0, help="How many rows to write (default: the measured row count).")
    ] = None,
    bins: Annotated[
        list[str] | None,
        typer.Option(
            "--bins",
            help="A numeric column's bins: COLUMN=N (equal-width over its bounds) or COLUMN=E0,E1,...,Ek (edges). Repeatable.",
        ),
    ] = None,
    columns: Annotated[
        str | None,
        typer.Option("--columns", help="The columns to synthesise, comma-separated (default: every declared one)."),
    ] = None,
    integers: Annotated[
        str | None,
        typer.Option(
            "--integers",
            help="Numeric columns written as whole numbers (drawn among the integers of their bin), comma-separated.",
        ),
    ] = None,
    report: Annotated[
        Path | None, typer.Option("--report", help="Also write the measurement report (text) here.")
    ] = None,
    method: Annotated[
        str,
        typer.Option("--method", help="aim (default: pairs chosen round by round) or mst (a spanning tree of pairs)."),
    ] = "aim",
    rounds: Annotated[
        int | None,
        typer.Option(
            "--rounds", min=1, help="With --method aim: the selection rounds (default: three times the columns)."
        ),
    ] = None,
    engine: EngineOption = "duckdb",
    master: MasterOption = None,
    conf: ConfOption = None,
) -> None:
    """Release a synthetic table: noisy marginals measured once, a model fitted to them, rows sampled.

    Everything done with the rows afterwards is free (post-processing). Example:

    dpkit generate census census.csv --metadata census.json && \
    dpkit synth census.csv --metadata census.json --epsilon 1 --delta 1e-9 --out synthetic.csv

    --engine spark counts the marginals on Spark (--master, --conf): Parquet data or a URI, and
    only the marginals' counts reach this process.
    """
    from dpkit.synth import Synthesizer

    settings, uri = _engine_settings(engine, master, conf, data)
    if engine == "spark" and not uri and Path(data).is_file() and Path(data).suffix.lower() not in (".parquet", ".pq"):
        _fail(f"--engine spark reads Parquet data: {data!r} is not a .parquet file, directory or glob")
    if not metadata.is_file():
        _fail(f"no such metadata file: {str(metadata)!r}")
    parsed: dict[str, list[float] | int] = {}
    for item in bins or []:
        name, eq, value = item.partition("=")
        try:
            numbers = [float(x) for x in value.split(",")] if eq else []
        except ValueError:
            numbers = []
        if not eq or not name.strip() or not numbers:
            _fail(f"--bins {item!r} is not accepted: it must be COLUMN=N or COLUMN=E0,E1,...,Ek, e.g. --bins age=10")
        parsed[name.strip()] = int(numbers[0]) if len(numbers) == 1 and numbers[0].is_integer() else numbers
    chosen = None if columns is None else [c.strip() for c in columns.split(",") if c.strip()]
    whole = None if integers is None else [c.strip() for c in integers.split(",") if c.strip()]
    err = Console(stderr=True)
    try:
        syn = Synthesizer(
            epsilon=epsilon, delta=delta, metadata=metadata, bins=parsed or None, columns=chosen,
            method=method, rounds=rounds, integers=whole, progress=True,
        )  # fmt: skip
        if engine == "spark":  # started only once the settings are known to be good
            from dpkit.analytics.engines.spark_parquet import read_parquet

            syn.fit(read_parquet(_spark_session(master, settings, "dpkit synth"), data))
        else:
            syn.fit(data)
        table = syn.sample(rows)
    except DPError as exc:
        _fail_error(
            exc,
            CliContext(
                options={
                    "method": Opt("--method"),
                    "rounds": Opt("--rounds"),
                    "bins": Opt("--bins"),
                    "integers": Opt("--integers"),
                }
            ),
        )
    table.to_csv(out, index=False)
    assert syn.report is not None
    text = syn.report.to_text()
    if report is not None:
        report.write_text(text + "\n")
    err.print(text, markup=False, highlight=False, soft_wrap=True)
    err.print(f"wrote {len(table):,} synthetic rows to {out}", markup=False, highlight=False)
