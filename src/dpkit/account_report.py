"""What ``dpkit account`` computes: ε of one repeated mechanism under every accountant.

Kept apart from the CLI so that it can be used (and tested) as a library function.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

from dpkit import _validate as v
from dpkit.accounting.accountant import Accountant
from dpkit.accounting.events import DPEvent, GaussianEvent, LaplaceEvent, PoissonSampledEvent, SelfComposedEvent
from dpkit.errors import DPError, InvalidParameterError

__all__ = ["AccountingRow", "account", "epsilon_curve", "plot_epsilon_curve"]

Mechanism = Literal["gaussian", "laplace"]


@dataclass(frozen=True)
class AccountingRow:
    accountant: str
    epsilon: float | None  # None: this accountant cannot price the event
    milliseconds: float
    note: str = ""

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


# The order the report lists accountants in: the two tight ones first.
_REPORT_ORDER = ("rdp", "pld", "zcdp", "basic")


def _accountants() -> dict[str, Callable[[], Accountant]]:
    from dpkit.accounting.registry import resolve_accountant

    return {name: resolve_accountant(name) for name in _REPORT_ORDER}


def check_names(names: list[str] | None) -> list[str] | None:
    """The accountant names asked for, each checked against the registry (None: all)."""
    from dpkit.accounting.registry import resolve_accountant

    for name in names or ():
        resolve_accountant(name, parameter="--accountant")
    return list(names) if names else None


def build_event(mechanism: Mechanism, noise_multiplier: float, sample_rate: float, steps: int) -> DPEvent:
    """``steps`` repetitions of the mechanism, Poisson-subsampled at ``sample_rate`` when < 1."""
    nm = v.positive(noise_multiplier, "noise_multiplier")
    rate = v.probability(sample_rate, "sample_rate", high_open=False)
    count = v.positive_int(steps, "steps")
    inner: DPEvent
    if mechanism == "gaussian":
        inner = GaussianEvent(nm)
    elif mechanism == "laplace":
        inner = LaplaceEvent(nm)
    else:
        raise InvalidParameterError("mechanism", mechanism, "'gaussian' or 'laplace'")
    if rate < 1:
        inner = PoissonSampledEvent(rate, inner)
    return SelfComposedEvent(inner, count)


def account(event: DPEvent, delta: float, names: list[str] | None = None) -> list[AccountingRow]:
    """ε at ``delta`` by each accountant (in milliseconds of wall time each)."""
    delta = v.delta(delta, allow_zero=True)
    rows = []
    for name, factory in _accountants().items():
        if names and name not in names:
            continue
        start = time.perf_counter()
        acc = factory()
        if not acc.supports(event):
            rows.append(AccountingRow(name, None, 0.0, "does not support this event"))
            continue
        try:
            eps = acc.compose(event).get_epsilon(delta)
        except DPError as exc:
            rows.append(AccountingRow(name, None, (time.perf_counter() - start) * 1e3, str(exc)))
            continue
        ms = (time.perf_counter() - start) * 1e3
        rows.append(
            AccountingRow(
                name, eps if math.isfinite(eps) else None, ms, "" if math.isfinite(eps) else "no finite bound at this δ"
            )
        )
    return rows


def epsilon_curve(
    mechanism: Mechanism, noise_multiplier: float, sample_rate: float, steps: int, delta: float, points: int = 20
) -> dict[str, list[tuple[int, float]]]:
    """ε against the number of steps for the RDP and PLD accountants."""
    grid = sorted({max(1, round(steps * (i + 1) / points)) for i in range(points)})
    out: dict[str, list[tuple[int, float]]] = {}
    for name, factory in _accountants().items():
        if name not in ("rdp", "pld"):
            continue
        out[name] = [
            (k, factory().compose(build_event(mechanism, noise_multiplier, sample_rate, k)).get_epsilon(delta))
            for k in grid
        ]
    return out


def plot_epsilon_curve(curves: dict[str, list[tuple[int, float]]], path: Path, title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for name, pts in curves.items():
        ax.plot([k for k, _ in pts], [e for _, e in pts], marker="o", ms=3, label=name.upper())
    ax.set_xlabel("steps")
    ax.set_ylabel("ε")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
