"""``dpkit account``: ε of a repeated (optionally subsampled) mechanism by every accountant."""

from __future__ import annotations

import math
from fractions import Fraction
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from dpkit.cli._common import JsonOption, _emit_json, _fail
from dpkit.errors import DPError

__all__ = ["account"]


def account(
    mechanism: Annotated[str, typer.Option("--mechanism", help="gaussian or laplace.")] = "gaussian",
    noise_multiplier: Annotated[
        float, typer.Option("--noise-multiplier", help="σ/Δ₂ (Gaussian) or b/Δ₁ (Laplace).")
    ] = 1.0,
    sample_rate: Annotated[
        str | None,
        typer.Option(
            "--sample-rate", help="Poisson sampling rate q in (0, 1], as a number or a fraction (256/60000); default 1."
        ),
    ] = None,
    steps: Annotated[
        int | None, typer.Option("--steps", help="Number of repetitions (e.g. DP-SGD steps); default 1.")
    ] = None,
    epochs: Annotated[
        float | None,
        typer.Option("--epochs", help="DP-SGD epochs (with --batch-size and --dataset-size, instead of q and steps)."),
    ] = None,
    batch_size: Annotated[int | None, typer.Option("--batch-size", help="Expected batch size (Poisson).")] = None,
    dataset_size: Annotated[int | None, typer.Option("--dataset-size", help="Number of training examples.")] = None,
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

    Or in training terms: dpkit account --noise-multiplier 1.1 --epochs 10 --batch-size 256 --dataset-size 60000
    (q = batch size / dataset size, steps = epochs · ⌈dataset size / batch size⌉, as make_private takes them).
    """
    from dpkit import account_report as rep
    from dpkit.accounting.events import event_to_dict

    rate, count = _rate_and_steps(sample_rate, steps, epochs, batch_size, dataset_size)
    try:
        event = rep.build_event(mechanism, noise_multiplier, rate, count)  # type: ignore[arg-type]
        rows = rep.account(event, delta, rep.check_names(accountants))
        curve_path = None
        if plot is not None:
            curves = rep.epsilon_curve(mechanism, noise_multiplier, rate, count, delta)  # type: ignore[arg-type]
            title = f"{mechanism}, noise multiplier {noise_multiplier}, q = {rate:.6g}, δ = {delta}"
            curve_path = str(rep.plot_epsilon_curve(curves, plot, title))
    except DPError as exc:
        _fail(str(exc))
    if json_output:
        _emit_json(
            {"event": event_to_dict(event), "delta": delta, "results": [r.as_dict() for r in rows], "plot": curve_path}
        )
        return
    table = Table(
        title=f"ε at δ = {delta:g} — {mechanism}, noise multiplier {noise_multiplier}, q = {rate:.6g}, {count} steps"
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


def _rate_and_steps(
    sample_rate: str | None, steps: int | None, epochs: float | None, batch_size: int | None, dataset_size: int | None
) -> tuple[float, int]:
    """q and the step count from either form of the options; a mix of the two forms is refused."""
    training = {"--epochs": epochs, "--batch-size": batch_size, "--dataset-size": dataset_size}
    if any(v is not None for v in training.values()):
        missing = [name for name, v in training.items() if v is None]
        if missing:
            _fail(f"{', '.join(missing)} missing: give --epochs, --batch-size and --dataset-size together")
        if sample_rate is not None or steps is not None:
            _fail("give either --sample-rate and --steps, or --epochs, --batch-size and --dataset-size, not both")
        assert epochs is not None and batch_size is not None and dataset_size is not None
        if not (dataset_size >= 1 and 1 <= batch_size <= dataset_size):
            _fail(f"--batch-size={batch_size} and --dataset-size={dataset_size}: need 1 <= batch size <= dataset size")
        if not (math.isfinite(epochs) and epochs > 0):
            _fail(f"--epochs={epochs}: need a number > 0")
        # As make_private counts them: ⌈dataset size / batch size⌉ steps per epoch (the loader's length)
        return batch_size / dataset_size, max(1, math.ceil(epochs * math.ceil(dataset_size / batch_size)))
    rate = 1.0
    if sample_rate is not None:
        try:
            rate = float(Fraction(sample_rate.strip()))
        except (ValueError, ZeroDivisionError):
            _fail(f"--sample-rate={sample_rate!r}: need a number or a fraction such as 0.004 or 256/60000")
    return rate, 1 if steps is None else steps
