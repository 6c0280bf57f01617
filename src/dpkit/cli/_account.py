"""``dpkit account``: ε of a repeated (optionally subsampled) mechanism by every accountant."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from dpkit.accounting.events import event_to_dict
from dpkit.cli._common import JsonOption, _emit_json, _fail
from dpkit.errors import DPError

__all__ = ["account"]


def account(
    mechanism: Annotated[str, typer.Option("--mechanism", help="gaussian or laplace.")] = "gaussian",
    noise_multiplier: Annotated[
        float, typer.Option("--noise-multiplier", help="σ/Δ₂ (Gaussian) or b/Δ₁ (Laplace).")
    ] = 1.0,
    sample_rate: Annotated[
        float, typer.Option("--sample-rate", help="Poisson sampling rate q in (0, 1]; 1 = no sampling.")
    ] = 1.0,
    steps: Annotated[int, typer.Option("--steps", help="Number of repetitions (e.g. DP-SGD steps).")] = 1,
    delta: Annotated[float, typer.Option("--delta", help="Target δ.")] = 1e-5,
    plot: Annotated[
        Path | None, typer.Option("--plot", help="Save ε against steps (RDP vs PLD) as a PNG here.")
    ] = None,
    accountants: Annotated[
        list[str] | None,
        typer.Option("--accountant", help="Only this accountant: basic, rdp, zcdp or pld (repeatable; default: all)."),
    ] = None,
    json_output: JsonOption = False,
) -> None:
    """ε of a repeated (optionally subsampled) mechanism by every accountant, with timings.

    Example: dpkit account --mechanism gaussian --noise-multiplier 1.1 --sample-rate 0.004 --steps 2350 --delta 1e-5
    """
    from dpkit import account_report as rep

    try:
        event = rep.build_event(mechanism, noise_multiplier, sample_rate, steps)  # type: ignore[arg-type]
        rows = rep.account(event, delta, rep.check_names(accountants))
        curve_path = None
        if plot is not None:
            curves = rep.epsilon_curve(mechanism, noise_multiplier, sample_rate, steps, delta)  # type: ignore[arg-type]
            title = f"{mechanism}, noise multiplier {noise_multiplier}, q = {sample_rate}, δ = {delta}"
            curve_path = str(rep.plot_epsilon_curve(curves, plot, title))
    except DPError as exc:
        _fail(str(exc))
    if json_output:
        _emit_json(
            {"event": event_to_dict(event), "delta": delta, "results": [r.as_dict() for r in rows], "plot": curve_path}
        )
        return
    table = Table(
        title=f"ε at δ = {delta:g} — {mechanism}, noise multiplier {noise_multiplier}, q = {sample_rate}, {steps} steps"
    )
    for col in ("accountant", "ε", "time (ms)", "note"):
        table.add_column(col, justify="right" if col in ("ε", "time (ms)") else "left")
    for r in rows:
        table.add_row(r.accountant, "—" if r.epsilon is None else f"{r.epsilon:.6g}", f"{r.milliseconds:.2f}", r.note)
    console = Console()
    console.print(table)
    sound = [r for r in rows if r.epsilon is not None and r.accountant in ("pld", "rdp")]
    if sound:
        best = min(sound, key=lambda r: r.epsilon)  # type: ignore[arg-type, return-value]
        console.print(f"tightest sound bound: ε = {best.epsilon:.6g} ({best.accountant.upper()})")
    if curve_path:
        console.print(f"plot: {curve_path}")
