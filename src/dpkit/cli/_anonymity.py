"""``dpkit anonymity``: k-anonymity (and ℓ-diversity) of a table, and Mondrian generalisation."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from dpkit.cli._common import JsonOption, _emit_json, _fail
from dpkit.errors import DPError

__all__ = ["anonymity_app", "anonymity_check"]

anonymity_app = typer.Typer(
    help="k-anonymity of a table, and Mondrian generalisation (syntactic, not DP).", no_args_is_help=True
)


@anonymity_app.command("check")
def anonymity_check(
    data: Annotated[Path, typer.Argument(help="A CSV file (header line first).")],
    quasi: Annotated[
        str, typer.Option("--quasi", help="Quasi-identifier columns, comma-separated (e.g. age,sex,zip).")
    ],
    k: Annotated[
        int | None, typer.Option("--k", help="Target k: report the rows below it, and with --generalise reach it.")
    ] = None,
    sensitive: Annotated[
        str | None, typer.Option("--sensitive", help="A sensitive column: also report its ℓ-diversity.")
    ] = None,
    generalise_to: Annotated[
        Path | None, typer.Option("--generalise", help="Write a Mondrian generalisation reaching --k here (CSV).")
    ] = None,
    suppress: Annotated[
        float, typer.Option("--suppress", help="With --generalise: fraction of rows that may be suppressed.")
    ] = 0.0,
    json_output: JsonOption = False,
) -> None:
    """Measure k (and ℓ) of a table for a set of quasi-identifiers; optionally generalise it to k."""
    import pandas as pd

    from dpkit.anonymity import anonymity_report, generalise

    if not data.exists():
        _fail(f"no such file: {str(data)!r}")
    qi = [c.strip() for c in quasi.split(",") if c.strip()]
    try:
        frame = pd.read_csv(data, skipinitialspace=True)
        report = anonymity_report(frame, qi, sensitive=sensitive, target_k=k)
        out: dict[str, Any] = {
            "file": str(data),
            "quasi_identifiers": qi,
            "k": report.k,
            "l": report.l,
            "classes": report.n_classes,
            "rows": report.n_rows,
            "target_k": k,
            "rows_below_target": report.rows_below_target,
        }
        if generalise_to is not None:
            if k is None:
                _fail("--generalise needs --k")
            released, g = generalise(frame, qi, k, suppress=suppress)
            released.to_csv(generalise_to, index=False)
            out["generalised"] = {
                "path": str(generalise_to),
                "k_achieved": g.k_achieved,
                "classes": g.n_classes,
                "suppressed": g.n_suppressed,
                "ncp": g.ncp,
                "discernibility": g.discernibility,
            }
    except DPError as exc:
        _fail(str(exc))
    if json_output:
        _emit_json(out)
        return
    console = Console()
    console.print(
        f"{data.name}: k = {report.k} on ({', '.join(qi)}), {report.n_classes} classes, {report.n_rows} rows"
        + (f"; ℓ = {report.l} for {sensitive}" if sensitive else "")
    )
    if k is not None:
        console.print(f"rows in classes smaller than k = {k}: {report.rows_below_target}")
    if "generalised" in out:
        gd = out["generalised"]
        console.print(
            f"Mondrian: k = {gd['k_achieved']}, {gd['classes']} classes, {gd['suppressed']} rows suppressed, "
            f"information loss NCP = {gd['ncp']:.4f}; written to {gd['path']}"
        )
