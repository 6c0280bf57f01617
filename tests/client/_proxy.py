"""A loopback HTTP proxy that loses answers on purpose: it forwards each request to the service,
reads the service's whole answer, and then — for the requests its rule picks — closes the
client's connection without sending it, as a dropped connection does after the server has
done the work (and, for a paid request, debited)."""

from __future__ import annotations

import contextlib
import socket
import socketserver
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field


@dataclass
class Seen:
    """One request the proxy forwarded: its method, path and headers (names lower-cased), the
    service's status and headers, and whether the answer was dropped."""

    method: str
    path: str
    headers: dict[str, str]
    status: int = 0
    answer_headers: dict[str, str] = field(default_factory=dict)
    dropped: bool = False


def _read_request(conn: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    while len(body) < length:
        chunk = conn.recv(65536)
        if not chunk:
            break
        body += chunk
    return head + b"\r\n\r\n" + body


def _headers(head: bytes) -> tuple[str, dict[str, str]]:
    first, *lines = head.decode("latin-1").split("\r\n")
    return first, {k.strip().lower(): v.strip() for k, _, v in (x.partition(":") for x in lines)}


@contextlib.contextmanager
def lossy_proxy(upstream: str, drop: Callable[[Seen], bool]) -> Iterator[tuple[str, list[Seen]]]:
    """A proxy to ``upstream`` (``http://127.0.0.1:PORT``) on a free loopback port, until the
    block ends: yields its base URL and the list of requests it forwarded (in order). ``drop``
    decides, for each request once its answer has arrived, whether the answer is lost."""
    host, port = upstream.removeprefix("http://").split(":")
    seen: list[Seen] = []
    lock = threading.Lock()

    class Handler(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            conn: socket.socket = self.request
            raw = _read_request(conn)
            if not raw:
                return
            head = raw.partition(b"\r\n\r\n")[0]
            first, headers = _headers(head)
            method, path = first.split(" ")[:2]
            with socket.create_connection((host, int(port)), timeout=120) as up:
                # One request per connection: the client's (urllib) asks for Connection: close.
                up.sendall(raw)
                answer = b""
                while chunk := up.recv(65536):
                    answer += chunk
            status_line, answer_headers = _headers(answer.partition(b"\r\n\r\n")[0])
            s = Seen(method, path, headers, int(status_line.split(" ")[1]), answer_headers)
            with lock:
                s.dropped = drop(s)
                seen.append(s)
            if not s.dropped:
                conn.sendall(answer)

    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    with serving(server) as url:
        yield url, seen


@contextlib.contextmanager
def serving(server: socketserver.BaseServer) -> Iterator[str]:
    """Run ``server`` (bound to a loopback port) in a thread; yields its URL, and stops it after."""
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"  # type: ignore[index]
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=30)
