"""Running the curator service under uvicorn with limits on slow and numerous clients.

uvicorn on its own waits for ever for a request's headers and body, and accepts any number of
connections, so a client holding many connections open with partial headers (or a body that
never arrives) ties up the server. :class:`DeadlineProtocol` is uvicorn's HTTP protocol with
three limits:

* ``header_timeout``: a connection that has not sent a complete request head this many seconds
  after it opened (or after the first byte of a following request on a kept-alive connection)
  is closed;
* ``body_timeout``: a request whose body has not fully arrived this many seconds after its head
  is closed (the application also answers 408 when it is the one waiting; see
  :class:`dpkit.server.app.ServerConfig`);
* ``max_connections``: connections beyond this many (per server process) are closed as soon as
  they open, and uvicorn answers 503 to requests beyond it (``limit_concurrency``).

:func:`serve` runs an application (or, with several workers, an application factory) with them.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import sys
from typing import Any, TypedDict

import uvicorn

from dpkit import _validate as v

__all__ = ["ServingConfig", "DeadlineProtocol", "serve", "check_limits", "PROTOCOL"]

#: The import string of the protocol class (what uvicorn's ``http`` setting accepts).
PROTOCOL = "dpkit.server.serving:DeadlineProtocol"
_log = logging.getLogger("uvicorn.error")
SWITCH_INTERVAL = 0.0005  # seconds; see _short_switches


class ServingLimits(TypedDict):
    """The limits :func:`serve` takes, as keyword arguments passed along together."""

    header_timeout: float
    body_timeout: float
    max_connections: int


def check_limits(header_timeout: float, body_timeout: float, max_connections: int) -> None:
    """Refuse timeouts that are not finite positive numbers and a cap below 1."""
    v.positive(header_timeout, "header_timeout")
    v.positive(body_timeout, "body_timeout")
    v.positive_int(max_connections, "max_connections")


class ServingConfig(uvicorn.Config):
    """uvicorn's configuration plus the limits :class:`DeadlineProtocol` enforces (the protocol
    is selected here; the limits travel with the configuration to every worker process)."""

    def __init__(
        self,
        app: Any,
        *,
        header_timeout: float = 10.0,
        body_timeout: float = 30.0,
        max_connections: int = 1000,
        **kwargs: Any,
    ) -> None:
        check_limits(header_timeout, body_timeout, max_connections)
        kwargs.setdefault("limit_concurrency", max_connections)
        super().__init__(app, http=PROTOCOL, **kwargs)
        self.header_timeout = float(header_timeout)
        self.body_timeout = float(body_timeout)
        self.max_connections = int(max_connections)


def _base() -> type[asyncio.Protocol]:
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

        return HttpToolsProtocol
    except ImportError:  # pragma: no cover - httptools is optional in uvicorn
        from uvicorn.protocols.http.h11_impl import H11Protocol

        return H11Protocol


class DeadlineProtocol(_base()):  # type: ignore[misc]
    """uvicorn's HTTP protocol with a deadline for each request's head and for its body, and a
    cap on open connections. It watches the protocol's request cycle (which both of uvicorn's
    HTTP implementations create when a head is complete and mark when its body is complete), so
    it does not depend on the parser's callbacks."""

    def __init__(self, config: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(config, *args, **kwargs)
        self._header_timeout = float(getattr(config, "header_timeout", 10.0))
        self._body_timeout = float(getattr(config, "body_timeout", 30.0))
        self._max_connections = int(getattr(config, "max_connections", 1000))
        self._deadline: asyncio.TimerHandle | None = None
        self._waiting_for: str | None = None  # "head", "body" or None

    def connection_made(self, transport: asyncio.Transport) -> None:
        super().connection_made(transport)
        if len(self.connections) > self._max_connections:
            self.logger.warning("connection refused: %d connections are open (the limit)", self._max_connections)
            transport.close()
            return
        self._arm("head", self._header_timeout)

    def data_received(self, data: bytes) -> None:
        before = self.cycle
        super().data_received(data)
        cycle = self.cycle
        if self.transport is None or self.transport.is_closing():
            self._disarm()
        elif cycle is not None and cycle is not before:
            # A head was completed by these bytes: now wait for its body, if one is still due.
            # (Even once answered: a body the application never read must still end in time.)
            if cycle.more_body:
                self._arm("body", self._body_timeout)
            else:
                self._disarm()
        elif self._waiting_for == "body" and (cycle is None or not cycle.more_body):
            self._disarm()
        elif self._waiting_for is None and (cycle is None or (cycle.response_complete and not cycle.more_body)):
            # The first bytes of another request on a kept-alive connection.
            self._arm("head", self._header_timeout)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self, what: str, seconds: float) -> None:
        self._disarm()
        self._waiting_for = what
        self._deadline = self.loop.call_later(seconds, self._expired, what)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        self._deadline, self._waiting_for = None, None

    def _expired(self, what: str) -> None:
        self._deadline, self._waiting_for = None, None
        if self.transport is not None and not self.transport.is_closing() and _unread(self.transport):
            # The bytes are here and the server has not read them yet: it is the server that
            # is late (a loaded event loop runs due timers before pending reads), not the client.
            self._arm(what, self._header_timeout if what == "head" else self._body_timeout)
            return
        if self.transport is not None and not self.transport.is_closing():
            self.logger.info("closed a connection whose request %s did not arrive in time", what)
            if self.cycle is not None and not self.cycle.response_complete:
                self.cycle.disconnected = True
                self.cycle.message_event.set()
            self.transport.close()


def _unread(transport: asyncio.BaseTransport) -> bool:
    """Whether bytes the client sent wait in the socket, not yet read by the event loop."""
    sock = transport.get_extra_info("socket")
    if sock is None:
        return False
    try:
        with socket.fromfd(
            sock.fileno(), sock.family, sock.type
        ) as peek:  # (a duplicate: closing it leaves the connection open)
            return bool(peek.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT))
    except OSError:  # nothing waiting (EAGAIN), or the connection is gone
        return False


def serve(
    app: Any,
    *,
    host: str,
    port: int,
    workers: int = 1,
    header_timeout: float = 10.0,
    body_timeout: float = 30.0,
    max_connections: int = 1000,
    log_level: str = "warning",
    factory: bool = False,
) -> None:
    """Run ``app`` (an ASGI application, or with ``workers`` > 1 the import string of an
    application factory and ``factory=True``) until interrupted, with the limits above.

    Several workers each listen on a socket of their own bound to the same port
    (``SO_REUSEPORT``), so the kernel spreads connections across them: with one shared socket,
    whichever worker is awake accepts a burst of keep-alive connections and serves them all
    while the other workers idle. The supervisor (:func:`_supervise`) restarts a worker that
    dies and never kills a busy one."""
    limits: ServingLimits = {
        "header_timeout": header_timeout,
        "body_timeout": body_timeout,
        "max_connections": max_connections,
    }
    _short_switches()
    if workers > 1 and hasattr(socket, "SO_REUSEPORT"):
        _supervise(app, host=host, port=port, workers=workers, log_level=log_level, factory=factory, **limits)
        return
    config = ServingConfig(
        app, host=host, port=port, workers=workers, log_level=log_level, server_header=False, factory=factory, **limits
    )
    if workers > 1:  # pragma: no cover - platforms without SO_REUSEPORT
        from uvicorn.supervisors import Multiprocess

        sock = config.bind_socket()
        try:
            Multiprocess(config, sockets=[sock]).run()
        finally:
            sock.close()
        return
    uvicorn.Server(config).run()


def _short_switches() -> None:
    """A server process hands the GIL between threads every 0.5 ms instead of Python's 5 ms: a
    thread that holds the ledger's write lock and waits for the GIL after an fsync would
    otherwise keep every other writer waiting for up to a whole switch interval."""
    sys.setswitchinterval(SWITCH_INTERVAL)


def _port_socket(host: str, port: int, *, listen: bool) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    if listen:
        sock.listen(2048)
    return sock


def _worker(app: Any, settings: dict[str, Any]) -> None:  # pragma: no cover - runs in a worker process
    _short_switches()
    sock = _port_socket(settings["host"], settings["port"], listen=True)
    config = ServingConfig(app, server_header=False, **settings)
    uvicorn.Server(config).run(sockets=[sock])


def _supervise(app: Any, *, host: str, port: int, workers: int, log_level: str, factory: bool, **limits: Any) -> None:
    """Start ``workers`` processes (spawned: each imports the application afresh), restart any
    that exits while the service runs, and stop them all on SIGINT or SIGTERM."""
    import multiprocessing
    import signal
    import threading

    # Holding the port (bound, not listening: the kernel gives connections only to listening
    # sockets) makes a port already in use fail here, once, with a clear error.
    reserved = _port_socket(host, port, listen=False)
    ctx = multiprocessing.get_context("spawn")
    settings = {"host": host, "port": port, "log_level": log_level, "factory": factory, **limits}
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    procs: list[Any] = []

    def start() -> Any:
        proc = ctx.Process(target=_worker, args=(app, settings), name="dpkit-worker")
        proc.start()
        return proc

    try:
        procs = [start() for _ in range(workers)]
        while not stop.wait(0.5):
            for i, proc in enumerate(procs):
                if not proc.is_alive():
                    _log.warning("worker %s exited with status %s; starting another", proc.pid, proc.exitcode)
                    procs[i] = start()
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.terminate()  # SIGTERM: uvicorn finishes the requests in flight
        for proc in procs:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()
                proc.join()
        reserved.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
