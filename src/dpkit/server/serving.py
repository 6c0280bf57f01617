"""Running the curator service under uvicorn with limits on slow and numerous clients.

uvicorn on its own waits for ever for a request's headers and body and for a client to read its
answer, and accepts any number of connections, so a client holding many connections open with
partial headers (or a body that never arrives, or an answer it never reads) ties up the server.
:class:`DeadlineProtocol` is uvicorn's HTTP protocol with these limits:

* ``header_timeout``: a connection that has not sent a complete request head this many seconds
  after it opened (or after the first byte of a following request on a kept-alive connection)
  is closed;
* ``body_timeout``: a request whose body has not fully arrived this many seconds after its head
  is closed (the application also answers 408 when it is the one waiting; see
  :class:`dpkit.server.app.ServerConfig`);
* ``write_timeout``: an answer the client does not take is cut off. At most
  :data:`WRITE_BUFFER_HIGH` bytes wait in a connection's buffer before uvicorn's ``send`` stops
  the application (flow control: a streamed answer holds at most that plus one chunk per
  connection); from the moment the buffer is full, or an answer is complete with bytes still
  waiting, the client has ``write_timeout`` seconds to take them (down to
  :data:`WRITE_BUFFER_LOW` bytes, or all of them), else the connection is dropped and its
  request marked disconnected, so a streaming application stops producing. A client must
  therefore read at least ``(WRITE_BUFFER_HIGH - WRITE_BUFFER_LOW) / write_timeout`` bytes a
  second (0.4 kB/s by default) while an answer waits for it (an answer sent in one piece, not
  streamed, must be taken whole within ``write_timeout``);
* ``max_connections``: connections beyond this many (per server process) are closed as soon as
  they open, and uvicorn answers 503 to requests beyond it (``limit_concurrency``);
* ``max_connections_per_address``: a client address with this many open connections (per
  server process) has its further connections closed as soon as they open, so that one address
  cannot take every connection (behind a reverse proxy every client has the proxy's address:
  raise it there, and cap addresses in the proxy).

:func:`serve` runs an application (or, with several workers, an application factory) with them,
on a port no other server holds (:func:`dpkit.server.processes.claim_port`), with workers that
stop when their supervisor dies (:func:`dpkit.server.processes.exit_with_parent`).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import socket
import struct
import sys
import weakref
from collections import Counter
from typing import Any, TypedDict

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol as _H11Protocol

from dpkit import _validate as v
from dpkit.server.processes import PortInUseError, claim_port, exit_with_parent

__all__ = [
    "ServingConfig",
    "DeadlineProtocol",
    "H11DeadlineProtocol",
    "serve",
    "check_limits",
    "PROTOCOL",
    "H11_PROTOCOL",
]

#: The import string of the protocol class (what uvicorn's ``http`` setting accepts).
PROTOCOL = "dpkit.server.serving:DeadlineProtocol"
_log = logging.getLogger("uvicorn.error")
SWITCH_INTERVAL = 0.0005  # seconds; see _short_switches
#: Bytes a connection's transport buffers before it asks uvicorn to stop writing (a quarter of
#: the asyncio default: the bound on what one connection holds is this plus one chunk of a
#: streamed answer, and a thousand slow readers add it a thousand times), and the level at
#: which it lets uvicorn write again.
WRITE_BUFFER_HIGH = 16 * 1024
WRITE_BUFFER_LOW = 4 * 1024
#: The kernel's send buffer of a connection (``SO_SNDBUF``; Linux doubles it for its own
#: bookkeeping). Left to itself Linux grows it up to ``net.ipv4.tcp_wmem`` (4 MiB by default)
#: for a client that does not read; fixed, a connection holds at most about
#: ``2 * SOCKET_SEND_BUFFER + WRITE_BUFFER_HIGH`` + one chunk, and one download's speed is at
#: most about ``2 * SOCKET_SEND_BUFFER`` per round trip (10 MB/s at 50 ms).
SOCKET_SEND_BUFFER = 256 * 1024


class ServingLimits(TypedDict):
    """The limits :func:`serve` takes, as keyword arguments passed along together."""

    header_timeout: float
    body_timeout: float
    max_connections: int
    write_timeout: float
    max_connections_per_address: int


def check_limits(
    header_timeout: float,
    body_timeout: float,
    max_connections: int,
    write_timeout: float = 30.0,
    max_connections_per_address: int = 64,
) -> None:
    """Refuse timeouts that are not finite positive numbers and caps below 1."""
    v.positive(header_timeout, "header_timeout")
    v.positive(body_timeout, "body_timeout")
    v.positive_int(max_connections, "max_connections")
    v.positive(write_timeout, "write_timeout")
    v.positive_int(max_connections_per_address, "max_connections_per_address")


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
        write_timeout: float = 30.0,
        max_connections_per_address: int = 64,
        **kwargs: Any,
    ) -> None:
        check_limits(header_timeout, body_timeout, max_connections, write_timeout, max_connections_per_address)
        kwargs.setdefault("limit_concurrency", max_connections)
        kwargs.setdefault("http", PROTOCOL)  # (tests select H11_PROTOCOL to check uvicorn's other parser)
        super().__init__(app, **kwargs)
        self.header_timeout = float(header_timeout)
        self.body_timeout = float(body_timeout)
        self.max_connections = int(max_connections)
        self.write_timeout = float(write_timeout)
        self.max_connections_per_address = int(max_connections_per_address)


# One count of open connections per client address for each server (its connection set).
_PER_ADDRESS: weakref.WeakKeyDictionary[Any, Counter[str]] = weakref.WeakKeyDictionary()


class _Deadlines:
    """The limits, over either of uvicorn's HTTP protocols (the concrete classes below). It
    watches the protocol's request cycle (which both implementations create when a head is
    complete and mark when its body is complete) and the transport's flow control (which both
    obey: their ``send`` waits while the transport has asked them to pause writing), so it does
    not depend on the parser's callbacks."""

    # (attributes of uvicorn's protocol classes)
    cycle: Any
    transport: asyncio.Transport
    loop: asyncio.AbstractEventLoop
    logger: logging.Logger
    connections: set[Any]
    server_state: Any
    client: tuple[str, int] | None
    flow: Any

    def __init__(self, config: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(config, *args, **kwargs)  # type: ignore[call-arg]
        self._header_timeout = float(getattr(config, "header_timeout", 10.0))
        self._body_timeout = float(getattr(config, "body_timeout", 30.0))
        self._max_connections = int(getattr(config, "max_connections", 1000))
        self._write_timeout = float(getattr(config, "write_timeout", 30.0))
        self._per_address_cap = int(getattr(config, "max_connections_per_address", 64))
        self._deadline: asyncio.TimerHandle | None = None
        self._waiting_for: str | None = None  # "head", "body" or None
        self._write_deadline: asyncio.TimerHandle | None = None
        self._address: str | None = None  # counted in _PER_ADDRESS while set

    def connection_made(self, transport: asyncio.Transport) -> None:
        super().connection_made(transport)  # type: ignore[misc]
        transport.set_write_buffer_limits(high=WRITE_BUFFER_HIGH, low=WRITE_BUFFER_LOW)
        _setsockopt(transport, socket.SO_SNDBUF, SOCKET_SEND_BUFFER)
        if len(self.connections) > self._max_connections:
            self.logger.warning("connection refused: %d connections are open (the limit)", self._max_connections)
            transport.close()
            return
        if self.client is not None:
            counts = _PER_ADDRESS.setdefault(self.server_state, Counter())
            self._address = self.client[0]
            counts[self._address] += 1
            if counts[self._address] > self._per_address_cap:
                self.logger.info(
                    "connection refused: %d connections from one address are open (the limit)",
                    self._per_address_cap,
                )
                transport.close()
                return
        self._arm("head", self._header_timeout)

    def data_received(self, data: bytes) -> None:
        before = self.cycle
        super().data_received(data)  # type: ignore[misc]
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
        self._disarm_write()
        if self._address is not None:
            counts = _PER_ADDRESS.get(self.server_state)
            if counts is not None:
                counts[self._address] -= 1
                if counts[self._address] <= 0:
                    del counts[self._address]
            self._address = None
        super().connection_lost(exc)  # type: ignore[misc]

    # Writing: the transport calls these when its buffer passes WRITE_BUFFER_HIGH and when it
    # falls back to WRITE_BUFFER_LOW; the cycle calls on_response_complete after an answer's end.
    def pause_writing(self) -> None:
        super().pause_writing()  # type: ignore[misc]
        self._arm_write()  # the client has write_timeout to take the buffer down to the low mark

    def resume_writing(self) -> None:
        super().resume_writing()  # type: ignore[misc]
        self._disarm_write()
        if self._answer_done() and self._buffered():
            self._arm_write()  # and as long again for the rest of a finished answer

    def on_response_complete(self) -> None:
        super().on_response_complete()  # type: ignore[misc]
        if self._write_deadline is None and self._buffered():
            # The answer's last bytes wait for the client; closing would wait for them too.
            self._arm_write()

    def _buffered(self) -> bool:
        return self.transport is not None and self.transport.get_write_buffer_size() > 0

    def _answer_done(self) -> bool:
        """Whether nothing more will be written for the request in progress."""
        return self.cycle is None or bool(self.cycle.response_complete or self.cycle.disconnected)

    def _arm_write(self) -> None:
        self._disarm_write()
        self._write_deadline = self.loop.call_later(self._write_timeout, self._write_expired)

    def _disarm_write(self) -> None:
        if self._write_deadline is not None:
            self._write_deadline.cancel()
        self._write_deadline = None

    def _write_expired(self) -> None:
        self._write_deadline = None
        transport = self.transport
        if transport is None or not self._buffered():
            return
        if not self.flow.write_paused and not self._answer_done():
            return  # below the high mark while the answer is still made: a pause re-arms it
        self.logger.info("closed a connection whose client did not read its answer in time")
        self._stop_cycle()
        # Drop what the kernel still holds too (a reset, not a close that would keep sending).
        _setsockopt(transport, socket.SO_LINGER, struct.pack("ii", 1, 0))
        transport.abort()  # (close() would wait for the buffer to be read)

    def _stop_cycle(self) -> None:
        """Mark the request in progress disconnected: uvicorn's ``send`` then drops what the
        application sends, and its ``receive`` answers ``http.disconnect``, which stops a
        streaming response (Starlette listens for it)."""
        if self.cycle is not None and not self.cycle.response_complete:
            self.cycle.disconnected = True
            self.cycle.message_event.set()
        if self.flow is not None:
            self.flow.resume_writing()  # wakes a send() waiting for the buffer to drain

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
            self._stop_cycle()
            self.transport.close()
            if self._write_deadline is None and self._answer_done() and self._buffered():
                self._arm_write()  # (an answer not read holds a closing transport open)


def _httptools() -> type[asyncio.Protocol]:
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

        return HttpToolsProtocol
    except ImportError:  # pragma: no cover - httptools is optional in uvicorn
        from uvicorn.protocols.http.h11_impl import H11Protocol

        return H11Protocol


class DeadlineProtocol(_Deadlines, _httptools()):  # type: ignore[misc]
    """uvicorn's httptools protocol (h11's where httptools is missing) with the limits above."""


class H11DeadlineProtocol(_Deadlines, _H11Protocol):  # type: ignore[misc]
    """uvicorn's h11 protocol with the limits above (select it with ``http=H11_PROTOCOL``)."""


#: The import string of the h11 variant.
H11_PROTOCOL = "dpkit.server.serving:H11DeadlineProtocol"


def _setsockopt(transport: asyncio.BaseTransport, option: int, value: int | bytes) -> None:
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):  # a socket without the option: the defaults stay
            sock.setsockopt(socket.SOL_SOCKET, option, value)


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
    write_timeout: float = 30.0,
    max_connections_per_address: int = 64,
    log_level: str = "warning",
    factory: bool = False,
) -> None:
    """Run ``app`` (an ASGI application, or with ``workers`` > 1 the import string of an
    application factory and ``factory=True``) until interrupted, with the limits above.
    Raises :class:`PortInUseError` (naming the port) when another server holds the port.

    Several workers each listen on a socket of their own bound to the same port
    (``SO_REUSEPORT``), so the kernel spreads connections across them: with one shared socket,
    whichever worker is awake accepts a burst of keep-alive connections and serves them all
    while the other workers idle. The supervisor (:func:`_supervise`) restarts a worker that
    dies and never kills a busy one; its workers stop when it dies."""
    limits: ServingLimits = {
        "header_timeout": header_timeout,
        "body_timeout": body_timeout,
        "max_connections": max_connections,
        "write_timeout": write_timeout,
        "max_connections_per_address": max_connections_per_address,
    }
    check_limits(**limits)
    _short_switches()
    with claim_port(host, port):
        _run(app, host=host, port=port, workers=workers, log_level=log_level, factory=factory, limits=limits)


def _run(app: Any, *, host: str, port: int, workers: int, log_level: str, factory: bool, limits: ServingLimits) -> None:
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


def _worker(app: Any, settings: dict[str, Any], supervisor: int) -> None:  # pragma: no cover - a worker process
    exit_with_parent(supervisor)  # first: before the application is imported
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
    try:
        reserved = _port_socket(host, port, listen=False)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise PortInUseError(host, port, "another program has bound it") from None
        raise
    ctx = multiprocessing.get_context("spawn")
    settings = {"host": host, "port": port, "log_level": log_level, "factory": factory, **limits}
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    procs: list[Any] = []

    def start() -> Any:
        proc = ctx.Process(target=_worker, args=(app, settings, os.getpid()), name="dpkit-worker")
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
