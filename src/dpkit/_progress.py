"""Progress bars for long fits (private module: its names may change).

The project's rule: long work shows progress. A bar here is drawn with ``rich``, imported only
when a bar is actually shown (``rich`` comes with the ``cli`` and ``torch`` extras, not with
``ml``), and it shows only public facts fixed before the data is read: the iterations done out
of a planned total, and the total (ε, δ) that the plan spends. Never a loss, a gradient norm or
anything else computed on the private data; the total is fixed in advance, so the bar's length
is data-independent, and updating it draws no randomness.

The ``progress`` parameter (validated by :func:`check_progress`, in ``fit``):

* ``None`` (default): a bar only when stderr is an interactive terminal and the planned fit has at
  least the estimator's "long" number of iterations; the bar disappears when the fit ends. Tests,
  pipes, CI logs and notebooks (whose stderr is not a terminal) stay quiet. The decision reads the
  plan and the terminal, never the data.
* ``True``: always a bar (in Jupyter too: live with ipywidgets, else rich's final frame), left
  on screen with the final count and ε.
* ``False``: never.

Used by :mod:`dpkit.ml`; ``dpkit.torch`` and ``dpkit.audit`` still draw their own bars.
"""

from __future__ import annotations

import importlib.util
import math
import sys
import time
from collections.abc import Callable
from typing import Any

from dpkit.errors import InvalidParameterError

__all__ = ["ACCEPTED", "ProgressBar", "check_progress", "epsilon_text", "shows_bar"]

#: What a ``progress`` parameter accepts (the error message's "must be ...").
ACCEPTED = (
    "True (always show a bar), False (never) or None (the default: a bar on an interactive terminal for a long fit)"
)

#: Smallest interval between two redraw requests (seconds): the per-iteration update is a counter
#: increment and a clock read, whatever the number of iterations.
_UPDATE_EVERY = 0.1


def check_progress(value: object) -> bool | None:
    """``value`` if it is True, False or None; otherwise :class:`InvalidParameterError`.
    ``True`` also needs ``rich`` installed (checked here, so that a fit refuses before paying)."""
    if value is not None and not isinstance(value, bool):  # not 1, "yes" or np.True_: say it exactly
        raise InvalidParameterError("progress", value, ACCEPTED)
    if value is True and not _rich_installed():
        raise InvalidParameterError(
            "progress",
            value,
            "False or None while rich is not installed",
            "The progress bar is drawn with rich: pip install rich (or 'dpkit[cli]')",
        )
    return value


def shows_bar(progress: bool | None, iterations: int, long_from: int) -> bool:
    """Whether a fit of ``iterations`` (fixed by its plan) shows a bar: ``progress`` when it is
    True or False; for None, when stderr is an interactive terminal, the fit has at least
    ``long_from`` iterations and rich is installed."""
    if progress is not None:
        return progress
    return iterations >= long_from and _stderr_is_interactive() and _rich_installed()


def _stderr_is_interactive() -> bool:
    isatty = getattr(sys.stderr, "isatty", None)
    try:
        return bool(isatty()) if callable(isatty) else False
    except (OSError, ValueError):  # a closed or detached stream
        return False


def _rich_installed() -> bool:
    return importlib.util.find_spec("rich") is not None


def _console() -> Any:
    """The console bars draw on: stderr (the seam the tests replace with an in-memory one)."""
    from rich.console import Console

    return Console(stderr=True)


def _nothing() -> None:
    return None


def epsilon_text(epsilon: float, delta: float) -> str:
    """``ε=… (δ=…)``, ε rounded *up* to 4 significant digits (a reported ε never understates)."""
    if epsilon > 0 and math.isfinite(epsilon):
        scale = 10.0 ** (math.floor(math.log10(epsilon)) - 3)
        shown = f"{math.ceil(epsilon / scale) * scale:.4g}"
    else:
        shown = f"{epsilon:g}"
    return f"ε={shown}" + (f" (δ={delta:g})" if delta else "")


class ProgressBar:
    """A context manager whose ``__enter__`` returns ``advance()``, called once per iteration.

    Shown or not is decided by the caller (:func:`shows_bar`); a hidden bar costs one call of a
    no-op function per iteration and imports nothing. ``epsilon``/``delta``: the total the fit
    spends (fixed before it starts), shown beside the count.
    """

    def __init__(
        self,
        show: bool,
        *,
        total: int,
        label: str,
        unit: str,
        epsilon: float | None = None,
        delta: float = 0.0,
        transient: bool = False,
    ) -> None:
        self.show = show
        self.total = total
        self.label = label
        self.unit = unit
        self.epsilon = epsilon
        self.delta = delta
        self.transient = transient
        self.done = 0
        self._progress: Any = None
        self._task: Any = None
        self._next = 0.0

    def __enter__(self) -> Callable[[], None]:
        if not self.show:
            return _nothing
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        columns: list[Any] = [TextColumn(self.label), BarColumn(), MofNCompleteColumn(), TextColumn(self.unit)]
        if self.epsilon is not None:  # a fixed string: the plan's total, not a running figure
            columns.append(TextColumn(epsilon_text(self.epsilon, self.delta)))
        columns += [TimeElapsedColumn(), TimeRemainingColumn()]
        self._progress = Progress(*columns, console=_console(), transient=self.transient)
        self._progress.__enter__()
        self._task = self._progress.add_task(self.label, total=self.total)
        return self._advance

    def _advance(self) -> None:
        self.done += 1
        now = time.monotonic()
        if now >= self._next:
            self._next = now + _UPDATE_EVERY
            self._progress.update(self._task, completed=self.done)

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.update(self._task, completed=self.done)
            self._progress.__exit__(None, None, None)
            self._progress = None
