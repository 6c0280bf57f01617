"""Slow and numerous clients against a real server on a loopback port: request heads and bodies
that do not arrive in time are cut off, answers the client does not read are cut off (and what
the server produced for them stays bounded), and connections beyond the cap, or beyond the cap of
one client address, are closed.

The limits here are small (0.5 s) and every wait for the server to act is bounded by a socket
timeout 20 times longer, so a loaded machine does not fail these tests (false-failure rate 0 up
to a 10 s stall); a server without the limits holds the connections for ever and fails them
(the power check: the same client against plain uvicorn times out)."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from _live_server import live_server
from server._api import World, make_world

LIMITS = {"header_timeout": 0.5, "body_timeout": 0.5, "max_connections": 100}
WAIT = 10.0  # how long a test waits for the server to close a connection


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    w = make_world(tmp_path, analysts=("alice",), grants=(("alice", "people", 1.0, 0.0),))
    yield w
    w.close()


def _connect(base: str) -> socket.socket:
    host, port = base.removeprefix("http://").split(":")
    s = socket.create_connection((host, int(port)), timeout=WAIT)
    return s


def _closed_by_server(s: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (raises on a WAIT timeout)."""
    data = b""
    while True:
        chunk = s.recv(65536)
        if not chunk:
            return data
        data += chunk


def test_partial_headers_are_cut_off(world: World) -> None:
    with live_server(world.app(), **LIMITS) as base:
        conns = [_connect(base) for _ in range(50)]
        try:
            for s in conns:
                s.sendall(b"GET /v1/me HTTP/1.1\r\nHost: x\r\nX-Slow: ")
            for s in conns:
                assert _closed_by_server(s) == b""
        finally:
            for s in conns:
                s.close()
        # and the server still answers
        s = _connect(base)
        s.sendall(b"GET /v1/me HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert _closed_by_server(s).startswith(b"HTTP/1.1 401")
        s.close()


def test_a_silent_connection_is_cut_off(world: World) -> None:
    with live_server(world.app(), **LIMITS) as base:
        s = _connect(base)
        try:
            assert _closed_by_server(s) == b""
        finally:
            s.close()


def test_a_body_that_does_not_arrive_is_cut_off(world: World) -> None:
    key = world.keys["alice"]
    with live_server(world.app(), **LIMITS) as base:
        conns = [_connect(base) for _ in range(10)]
        try:
            for s in conns:
                s.sendall(
                    b"POST /v1/datasets/people/query HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                    b"Authorization: Bearer " + key.encode() + b"\r\nContent-Length: 60000\r\n\r\n" + b'{"epsilon"'
                )
            for s in conns:
                answer = _closed_by_server(s)
                assert answer == b"" or answer.startswith(b"HTTP/1.1 408"), answer[:200]
        finally:
            for s in conns:
                s.close()
    assert world.spend_ids() == []


def test_a_trickled_body_on_a_get_is_cut_off(world: World) -> None:
    """A GET with a declared body the application never reads: the protocol's own deadline."""
    with live_server(world.app(), **LIMITS) as base:
        s = _connect(base)
        try:
            s.sendall(b"GET /openapi.json HTTP/1.1\r\nHost: x\r\nContent-Length: 60000\r\n\r\n0123456789")
            deadline = time.monotonic() + WAIT
            data = b""
            while time.monotonic() < deadline:
                try:
                    s.sendall(b"x")
                except OSError:
                    break
                s.settimeout(0.2)
                try:
                    chunk = s.recv(65536)
                except TimeoutError:
                    continue
                if not chunk:
                    break
                data += chunk
            else:
                pytest.fail("the connection was still open")
        finally:
            s.close()


def test_connections_beyond_the_cap_are_closed(world: World) -> None:
    with live_server(world.app(), header_timeout=30, body_timeout=30, max_connections=5) as base:
        conns = [_connect(base) for _ in range(5)]
        try:
            time.sleep(0.2)  # (not a timing assertion: lets the server register the five)
            extra = _connect(base)
            assert _closed_by_server(extra) == b""
            extra.close()
        finally:
            for s in conns:
                s.close()


def test_the_limits_are_refused_when_invalid() -> None:
    from dpkit.errors import InvalidParameterError
    from dpkit.server.serving import ServingConfig

    for bad in (
        {"header_timeout": 0},
        {"body_timeout": float("inf")},
        {"max_connections": 0},
        {"write_timeout": 0},
        {"write_timeout": float("nan")},
        {"max_connections_per_address": 0},
    ):
        with pytest.raises(InvalidParameterError):
            ServingConfig("x:y", **bad)


def test_power_check_plain_uvicorn_holds_partial_headers(world: World) -> None:
    """Without the limits the same partial head is held open (the tests above can fail)."""
    with live_server(world.app()) as base:
        s = _connect(base)
        s.settimeout(2.0)
        try:
            s.sendall(b"GET /v1/me HTTP/1.1\r\nHost: x\r\nX-Slow: ")
            with pytest.raises(socket.timeout):
                _closed_by_server(s)
        finally:
            s.close()


@pytest.mark.parametrize("workers", ["1", "2"])
def test_dpkit_serve_applies_the_limits(workers: str, world: World) -> None:
    """The real command line (one worker, and the app-factory path of several) cuts off a
    partial head and a missing body."""
    from _live_server import dpkit_serve

    ledger = world.service.url
    with dpkit_serve(
        ledger, "--workers", workers, "--header-timeout", "0.5", "--body-timeout", "0.5", "--data-root", str(world.dir)
    ) as base:
        s = _connect(base)
        try:
            s.sendall(b"GET /v1/me HTTP/1.1\r\nHost: x\r\n")
            assert _closed_by_server(s) == b""
        finally:
            s.close()
        s = _connect(base)
        try:
            s.sendall(
                b"POST /v1/datasets/people/query HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nAuthorization: Bearer "
                + world.keys["alice"].encode()
                + b"\r\nContent-Length: 60000\r\n\r\n{}"
            )
            answer = _closed_by_server(s)
            assert answer == b"" or answer.startswith(b"HTTP/1.1 408"), answer[:200]
        finally:
            s.close()


# -- answers the client does not read -------------------------------------------------------------

CHUNK = 16 * 1024
STREAM_CHUNKS = 4096  # a 64 MiB answer, far more than any buffer on the way
RCVBUF = 64 * 1024  # the test client's receive buffer (Linux doubles it)
PROTOCOLS = ["dpkit.server.serving:DeadlineProtocol", "dpkit.server.serving:H11DeadlineProtocol"]


def _bounded_production() -> int:
    """The kernel's send buffer (twice what the server asks for), the transport's buffer, two
    chunks (one crossing the high mark, one made and waiting to be sent) and the client's
    receive buffer (twice RCVBUF): 752 KiB, within the 1 MiB per connection the design allows
    (a producer nothing stops fills the kernel's buffer to 4 MiB on Linux's defaults)."""
    from dpkit.server.serving import SOCKET_SEND_BUFFER, WRITE_BUFFER_HIGH

    assert 2 * SOCKET_SEND_BUFFER + WRITE_BUFFER_HIGH + 2 * CHUNK + 2 * RCVBUF <= 1 << 20
    return 1 << 20


class _Stream:
    """An app streaming a 64 MiB answer, as a release download does (Starlette's
    StreamingResponse): it counts the bytes it produced and notes when it stopped."""

    def __init__(self) -> None:
        import threading

        self.produced = 0
        self.stopped = threading.Event()
        self.finished = False

    async def _chunks(self) -> Any:
        import asyncio

        try:
            for _ in range(STREAM_CHUNKS):
                self.produced += CHUNK
                yield b"x" * CHUNK
                await asyncio.sleep(0)  # (a real producer awaits its data source here)
            self.finished = True
        finally:
            self.stopped.set()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        from starlette.responses import StreamingResponse

        if scope["type"] == "http":
            await StreamingResponse(self._chunks(), media_type="application/octet-stream")(scope, receive, send)


def _reader(base: str, source: str = "127.0.0.1") -> socket.socket:
    """A connection with a small receive buffer (set before connecting, so the window fits it)."""
    host, port = base.removeprefix("http://").split(":")
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RCVBUF)
    s.settimeout(WAIT)
    s.bind((source, 0))
    s.connect((host, int(port)))
    return s


def _reset_by_server(s: socket.socket) -> bool:
    """Whether the server resets the connection within WAIT seconds, watched without reading
    (the socket's pending error; a dropped connection is reset, not closed)."""
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        if s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
            return True
        time.sleep(0.05)
    return False


def _drain(s: socket.socket) -> int:
    """Read until the server ends the connection (a close or a reset); the bytes read."""
    total = 0
    try:
        while chunk := s.recv(1 << 20):
            total += len(chunk)
    except ConnectionResetError:
        pass
    return total


@pytest.mark.parametrize("http", PROTOCOLS, ids=["httptools", "h11"])
def test_an_answer_the_client_does_not_read_is_cut_off(http: str) -> None:
    """The client asks for a large streamed answer and reads nothing: the server drops the
    connection once write_timeout has passed without progress, the application stops
    producing, and it produced no more than the buffers on the way hold. Without a write
    deadline the producer waits for the client for ever (and the kernel's buffer grows to
    megabytes), so the wait below ends in failure."""
    app = _Stream()
    with live_server(app, write_timeout=0.5, http=http) as base:
        s = _reader(base)
        try:
            s.sendall(b"GET /download HTTP/1.1\r\nHost: x\r\n\r\n")
            assert app.stopped.wait(WAIT), "the server still waits for the client to read"
            assert not app.finished
            assert app.produced <= _bounded_production(), app.produced
            produced = app.produced
            assert _drain(s) < produced  # the connection is gone, with what it still held
            assert app.produced == produced
        finally:
            s.close()


@pytest.mark.parametrize("http", PROTOCOLS, ids=["httptools", "h11"])
def test_an_answer_sent_whole_and_not_read_is_cut_off(http: str) -> None:
    """An 8 MiB answer sent in one piece (a response built in memory) to a client that reads
    nothing: the connection is dropped, which frees the buffered answer."""
    body = b"y" * (8 << 20)

    async def whole(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            headers = [(b"content-length", str(len(body)).encode())]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await send({"type": "http.response.body", "body": body})

    with live_server(whole, write_timeout=0.5, http=http) as base:
        s = _reader(base)
        try:
            s.sendall(b"GET /whole HTTP/1.1\r\nHost: x\r\n\r\n")
            assert _reset_by_server(s), "the server still waits for the client to read"
            assert _drain(s) < len(body)
        finally:
            s.close()


def test_a_reader_that_keeps_reading_gets_the_whole_answer() -> None:
    """The write deadline cuts off clients that stop reading, not ones that read slowly: a
    client taking 16 KiB at a time with pauses gets all 64 MiB (write_timeout 5 s: it fails
    only if this process stalls that long between two reads)."""
    app = _Stream()
    with live_server(app, write_timeout=5.0) as base:
        s = _reader(base)
        try:
            s.sendall(b"GET /download HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            total, reads = 0, 0
            while chunk := s.recv(CHUNK):
                total += len(chunk)
                reads += 1
                if reads % 256 == 0:
                    time.sleep(0.05)
            assert app.finished
            assert total > CHUNK * STREAM_CHUNKS  # the whole body, with the head and chunk sizes
        finally:
            s.close()


# -- connections per client address ----------------------------------------------------------------


async def _ok(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "http":
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})


def _ask(s: socket.socket) -> bytes:
    """One request on a kept-alive connection; the answer's first bytes, or b"" if closed."""
    try:
        s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        return s.recv(65536)
    except (ConnectionResetError, BrokenPipeError):
        return b""


def test_one_address_cannot_take_every_connection() -> None:
    """127.0.0.1 opens all but one of the connections the server takes: only its cap (4) are
    served, the rest are closed at once, and another address (127.0.0.2) is still served. On a
    server without a per-address cap 127.0.0.1 holds all eight, and 127.0.0.2's request meets
    the total cap (503). (The total is 9 rather than 8 so that the four refused connections,
    before the server has seen them go, never push the served ones' requests to the cap.)"""
    limits = {"header_timeout": 30, "body_timeout": 30, "max_connections": 9, "max_connections_per_address": 4}
    with live_server(_ok, **limits) as base:
        held = [_reader(base) for _ in range(8)]
        try:
            answers = [_ask(s) for s in held]
            assert sum(a.startswith(b"HTTP/1.1 200") for a in answers) == 4, answers
            assert answers.count(b"") == 4, answers
            other = _reader(base, source="127.0.0.2")
            assert _ask(other).startswith(b"HTTP/1.1 200")
            other.close()
            # A connection 127.0.0.1 closes makes room for another of its own (retried until
            # the server has seen the close; a server that never frees the place fails here).
            served = [s for s, a in zip(held, answers, strict=True) if a]
            served[0].close()
            deadline = time.monotonic() + WAIT
            while True:
                again = _reader(base)
                held.append(again)
                if _ask(again).startswith(b"HTTP/1.1 200"):
                    break
                assert time.monotonic() < deadline, "127.0.0.1 got no place back"
                time.sleep(0.1)
        finally:
            for s in held:
                s.close()
