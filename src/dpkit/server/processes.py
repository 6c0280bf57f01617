"""One server per port, and workers that do not outlive their supervisor.

``dpkit serve --workers N`` runs N worker processes that each bind the port with
``SO_REUSEPORT``, so the kernel spreads connections across them. Two things follow:

* a worker whose supervisor is killed (``kill -9``, an OOM kill) is not stopped by anyone: it
  would keep serving the port with the old settings for ever. :func:`exit_with_parent` makes a
  worker stop when its supervisor goes: on Linux the kernel sends it ``SIGTERM`` at once
  (``prctl(PR_SET_PDEATHSIG)``), and everywhere a watchdog thread notices that its parent
  changed (``os.getppid()``), sends the same ``SIGTERM`` (uvicorn closes the listening socket
  and finishes the requests in flight) and ends the process after a grace period;
* ``SO_REUSEPORT`` lets a second server bind a port that is still served, and the kernel then
  splits the clients between the two, each under its own limits. :func:`claim_port` refuses to
  start a server on a port that answers connections, or that another ``dpkit serve`` has claimed
  (an exclusive lock keyed by host and port, held for the server's life: it also covers a server
  whose workers are still starting and do not listen yet).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import logging
import os
import signal
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator

__all__ = ["PortInUseError", "claim_port", "exit_with_parent"]

_log = logging.getLogger("uvicorn.error")
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
WATCH_INTERVAL = 0.5  # seconds between two looks at the parent
GRACE = 30.0  # seconds a worker has to finish its requests once its supervisor is gone


class PortInUseError(OSError):
    """Another server (or what is left of one) serves the port, or is starting on it."""

    def __init__(self, host: str, port: int, how: str) -> None:
        super().__init__(
            errno.EADDRINUSE,
            f"port {port} on {host} is already in use ({how}); stop that server first "
            f"(workers of a killed `dpkit serve` stop on their own within {GRACE:g} s) or choose another --port",
        )
        self.host, self.port = host, port

    def __str__(self) -> str:
        return str(self.strerror)


@contextlib.contextmanager
def claim_port(host: str, port: int) -> Iterator[None]:
    """Hold ``host``:``port`` for one server until the block ends, or raise
    :class:`PortInUseError` if it is claimed or answers connections."""
    release = _lock(host, port)
    if release is None:
        raise PortInUseError(host, port, "another dpkit serve holds it")
    try:
        if _answers(host, port):
            raise PortInUseError(host, port, "a server answers there")
        yield
    finally:
        release()


def _answers(host: str, port: int) -> bool:
    """Whether something accepts TCP connections at ``host``:``port`` (a wildcard address is
    probed on the loopback interface, which it includes)."""
    target = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}.get(host, host)
    try:
        with socket.create_connection((target, port), timeout=2.0):
            return True
    except OSError:  # refused (nothing listens), or unreachable: binding will tell
        return False


def _lock(host: str, port: int) -> Callable[[], None] | None:
    """Take an exclusive lock named for ``host``:``port``; its release function, or None if
    another process holds it. The kernel drops it when the process dies, however it dies.
    Linux: an abstract Unix socket (no file to leave behind, scoped like the port to the network
    namespace); elsewhere an ``flock`` on a file in the temporary directory (skipped when that
    file cannot be opened: the connection probe still applies)."""
    if sys.platform.startswith("linux"):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)  # not inherited by the workers
        try:
            sock.bind(f"\0dpkit-serve {host} {port}")
        except OSError as exc:
            sock.close()
            if exc.errno == errno.EADDRINUSE:
                return None
            raise
        return sock.close
    return _file_lock(host, port)  # pragma: no cover - macOS and the BSDs


def _file_lock(host: str, port: int) -> Callable[[], None] | None:  # pragma: no cover - not Linux
    try:
        import fcntl
    except ImportError:  # Windows: the connection probe alone
        return lambda: None
    safe = "".join(c if c.isalnum() or c in ".-" else "_" for c in host)
    path = os.path.join(tempfile.gettempdir(), f"dpkit-serve-{safe}-{port}.lock")
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError:
        return lambda: None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return lambda: os.close(fd)


def exit_with_parent(parent: int, *, grace: float = GRACE, interval: float = WATCH_INTERVAL) -> None:
    """Make this process stop when its parent ``parent`` (the supervisor's pid) is gone.

    Call it first thing in a worker, before the application is imported: a parent already gone
    ends the process at once. Afterwards the parent's death sends ``SIGTERM`` (from the kernel
    on Linux, from the watchdog thread everywhere); the watchdog ends the process ``grace``
    seconds later if it is still there."""
    _parent_death_signal(signal.SIGTERM)  # (the kernel's signal goes to the parent's thread's death:
    # the supervisor starts its workers from its main thread, so that is the process's death)
    if os.getppid() != parent:
        os._exit(1)  # the supervisor died before the signal was asked for
    threading.Thread(target=_watch, args=(parent, grace, interval), name="dpkit-parent-watch", daemon=True).start()


def _watch(parent: int, grace: float, interval: float) -> None:  # pragma: no cover - runs in a worker
    while os.getppid() == parent:
        time.sleep(interval)
    _log.warning("the supervisor (pid %d) is gone: this worker stops", parent)
    os.kill(os.getpid(), signal.SIGTERM)  # (a second SIGTERM after the kernel's changes nothing)
    time.sleep(grace)
    _log.error("this worker did not stop within %g s of its supervisor's end: ending it", grace)
    os._exit(1)


def _parent_death_signal(sig: int) -> bool:
    """Ask the Linux kernel to send ``sig`` to this process when its parent dies."""
    if not sys.platform.startswith("linux"):
        return False  # pragma: no cover
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0)
    except (OSError, AttributeError):  # pragma: no cover - no libc prctl: the watchdog alone
        return False
