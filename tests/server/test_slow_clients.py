"""Slow and numerous clients against a real server on a loopback port: request heads and bodies
that do not arrive in time are cut off, and connections beyond the cap are closed.

The limits here are small (0.5 s) and every wait for the server to act is bounded by a socket
timeout 20 times longer, so a loaded machine does not fail these tests (false-failure rate 0 up
to a 10 s stall); a server without the limits holds the connections for ever and fails them
(the power check: the same client against plain uvicorn times out)."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

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
                except socket.timeout:
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

    for bad in ({"header_timeout": 0}, {"body_timeout": float("inf")}, {"max_connections": 0}):
        with pytest.raises(InvalidParameterError):
            ServingConfig("x:y", **bad)  # type: ignore[arg-type]


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
    with dpkit_serve(ledger, "--workers", workers, "--header-timeout", "0.5", "--body-timeout", "0.5", "--data-root", str(world.dir)) as base:
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
                + world.keys["alice"].encode() + b"\r\nContent-Length: 60000\r\n\r\n{}"
            )
            answer = _closed_by_server(s)
            assert answer == b"" or answer.startswith(b"HTTP/1.1 408"), answer[:200]
        finally:
            s.close()
