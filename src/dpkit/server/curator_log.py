"""The curator's log on the curator's own commands: ``dpkit serve`` and ``dpkit admin``.

As a library, dpkit gives its loggers only a NullHandler (see :mod:`dpkit`): what it logs for the
curator — an engine's error text that can quote a value of the data, a CSV line number — must not
reach the terminal of whoever happens to run a query (an analyst's script, ``dpkit query``). The
service and the admin commands are run by the curator, who wants those records; they call
:func:`log_to_stderr`, which sends ``dpkit.curator`` to the process's stderr (the service's log,
beside uvicorn's own), at the level ``DPKIT_LOG_LEVEL`` names (default ``warning``). A program that
embeds the service chooses its own handler instead.
"""

from __future__ import annotations

import logging
import sys
from typing import TextIO

__all__ = ["CURATOR_LOGGER", "LEVELS", "log_to_stderr"]

#: The logger whose records are for the curator only.
CURATOR_LOGGER = "dpkit.curator"

#: uvicorn's level names (``DPKIT_LOG_LEVEL`` sets both), lower-case, to logging's numbers.
LEVELS: dict[str, int] = {
    "critical": logging.CRITICAL,
    "error": logging.ERROR,
    "warning": logging.WARNING,
    "info": logging.INFO,
    "debug": logging.DEBUG,
    "trace": 5,
}

_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class _Stderr(logging.StreamHandler):
    """A handler that writes to whatever ``sys.stderr`` is when a record comes (not the stream of
    the moment it was made), as Python's last-resort handler does: a command run in-process by a
    test runner swaps stderr, and a handler holding the old stream would write to a closed file."""

    def __init__(self) -> None:
        super().__init__()

    @property
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, _value: object) -> None:  # StreamHandler.__init__ assigns one; it is never used
        pass


def log_to_stderr(level: str = "warning") -> logging.Handler:
    """Send ``dpkit.curator`` records of ``level`` (one of :data:`LEVELS`; another name is
    ``warning``) and above to stderr. Once per process: a later call returns the same handler."""
    logger = logging.getLogger("dpkit.curator")  # CURATOR_LOGGER, spelled out for the scan of names
    for handler in logger.handlers:
        if isinstance(handler, _Stderr):
            return handler
    threshold = LEVELS.get(level.strip().lower(), logging.WARNING)
    handler = _Stderr()
    handler.setLevel(threshold)
    handler.setFormatter(logging.Formatter(_FORMAT))
    logger.addHandler(handler)
    if logger.getEffectiveLevel() > threshold:  # an INFO handler under a WARNING logger sees nothing
        logger.setLevel(threshold)
    return handler
