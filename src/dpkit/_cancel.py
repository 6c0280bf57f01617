"""Cooperative cancellation of long computations (a synthetic table's fit, for one).

The curator service answers a paid request at a fixed time and cancels the work still running
then (:mod:`dpkit.server.pacing`). An engine query can be interrupted from outside; a loop in
Python cannot, so the long loops call :func:`checkpoint`, which raises when the work they belong
to was cancelled. Outside a :func:`cancellable` block it does nothing: library users never see
it. The check is held in a context variable, so each thread (each request's work) has its own.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextvars import ContextVar

__all__ = ["Cancelled", "cancellable", "checkpoint"]

_CHECK: ContextVar[Callable[[], None] | None] = ContextVar("dpkit_cancel_check", default=None)


class Cancelled(Exception):  # noqa: N818 - it names what happened, like asyncio.CancelledError
    """The work was cancelled from outside (its time ran out)."""


def checkpoint() -> None:
    """Raise :class:`Cancelled` if the enclosing :func:`cancellable` block was cancelled."""
    check = _CHECK.get()
    if check is not None:
        check()


@contextlib.contextmanager
def cancellable(check: Callable[[], None]) -> Iterator[None]:
    """Run the block with ``check`` (which raises :class:`Cancelled` once cancelled) called at
    every :func:`checkpoint` inside it."""
    token = _CHECK.set(check)
    try:
        yield
    finally:
        _CHECK.reset(token)
