"""Slow readers of a large release: what 1,000 connections that ask for a download and read
nothing cost the server's memory, and what happens to them at ``--write-timeout``.

A publisher (an analyst the curator named with ``allow_publish``) publishes a synthetic table of
the benchmark's dataset in process (``--release-rows`` rows of ``age``, ``income`` and
``region``: a few MB as CSV). Then ``dpkit serve`` is started and measured from /proc:

* **before**: the RSS of the server's process tree after one normal download of the CSV (so
  that everything a download needs is loaded);
* **peak**: the largest RSS while N connections (spread over the analysts, each granted the
  dataset) have sent ``GET /v1/releases/NAME?format=csv`` and read nothing: each client socket
  has a receive buffer of 4 KiB, so the server's socket buffers fill at once and the rest of the
  answer waits in the server — or, with streamed downloads, is never read from the database;
* **after**: the RSS once the server let go of every one of them (its end of the connection no
  longer ESTABLISHED in /proc/net/tcp: it reset it, or sent all and closed) and a second passed.

While they hang, one normal download of the whole CSV by another connection is timed (the server
still serves), and the connections' closing time is compared with ``--write-timeout``.
"""

from __future__ import annotations

import json
import socket
import struct
import sys
import time
from pathlib import Path
from typing import Any

from _server_load import Server, rss_bytes

RELEASE = "big_release"
PUBLISHER = "publisher"
_TCP_CLOSE_WAIT, _TCP_CLOSE = 8, 7


def publish(url: str, kwargs: dict[str, Any], dataset: str, rows: int) -> tuple[str, float]:
    """Publish a synthetic table of ``rows`` rows as :data:`RELEASE` (in process); the publisher's
    key and the seconds the publication took."""
    from dpkit.analytics.limits import QueryLimits
    from dpkit.server.service import Service
    from dpkit.server.synthetic import SynthRequest

    limits = QueryLimits(max_result_rows=max(rows, 100_000), max_response_bytes=1 << 30)
    with Service(url, **{**kwargs, "limits": limits}) as svc:
        _, key = svc.create_principal(PUBLISHER, "analyst")
        svc.grant(PUBLISHER, dataset, epsilon=10.0, delta=1e-5)
        svc.allow_publish(PUBLISHER)
        who = svc.authenticate(key)
        request = SynthRequest(
            epsilon=1.0,
            delta=1e-6,
            method="mst",
            bins={"age": 8, "income": 10},
            rows=rows,
            columns=("age", "income", "region"),
            integers=("age",),
            publish=RELEASE,
        )
        t = time.perf_counter()
        svc.synthesize(who, dataset, request, max_release_bytes=1 << 30)
        return key, time.perf_counter() - t


def _download(port: int, key: str) -> tuple[int, float]:
    """One whole CSV download: its bytes (body and head) and seconds."""
    t = time.perf_counter()
    with socket.create_connection(("127.0.0.1", port), timeout=120) as s:
        s.sendall(_request(key))
        total = 0
        while chunk := s.recv(1 << 16):
            total += len(chunk)
    return total, time.perf_counter() - t


def _request(key: str) -> bytes:
    return (
        f"GET /v1/releases/{RELEASE}?format=csv HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {key}\r\n"
        "Connection: close\r\n\r\n"
    ).encode("ascii")


def _state(s: socket.socket) -> int:
    """The connection's TCP state (Linux ``tcp_info.tcpi_state``), without reading from it."""
    try:
        return int(struct.unpack("B", s.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1))[0])
    except OSError:
        return _TCP_CLOSE


def _held_by_server(port: int, socks: list[socket.socket]) -> int:
    """How many of ``socks`` the server still holds open: its end of the connection is
    ESTABLISHED in /proc/net/tcp. (A server that sent a whole small answer and closed has its end
    in FIN_WAIT, owned by the kernel, while the client — which reads nothing — still sees its
    own end open; one that gave up on a reader reset it.) Falls back to the clients' own states."""
    ports = {s.getsockname()[1] for s in socks if _state(s) != _TCP_CLOSE}
    try:
        lines = Path("/proc/net/tcp").read_text().splitlines()[1:]
    except OSError:
        return sum(1 for s in socks if _state(s) not in (_TCP_CLOSE_WAIT, _TCP_CLOSE))
    held = 0
    for line in lines:
        fields = line.split()
        local, remote, state = fields[1], fields[2], fields[3]
        if state == "01" and int(local.rsplit(":", 1)[1], 16) == port and int(remote.rsplit(":", 1)[1], 16) in ports:
            held += 1
    return held


def _open_slow(port: int, keys: list[str], n: int) -> tuple[list[socket.socket], int]:
    """``n`` connections that each send the download request and never read; those refused."""
    socks, refused = [], 0
    for i in range(n):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: a small window
        try:
            s.connect(("127.0.0.1", port))
            s.sendall(_request(keys[i % len(keys)]))
        except OSError:
            refused += 1
            s.close()
            continue
        socks.append(s)
    return socks, refused


def measure(
    url: str,
    tmp: Path,
    workers: int,
    extra: dict[str, str],
    kwargs: dict[str, Any],
    readers: int,
    rows: int,
    backend: str,
    label: str,
    dataset: str = "people",
    analyst_keys: list[str] | None = None,
) -> list[dict[str, Any]]:
    """The slow-reader row (see the module docstring)."""
    print(f"[bench] slow readers: publishing a {rows:,}-row release", file=sys.stderr)
    publisher_key, publish_s = publish(url, kwargs, dataset, rows)
    keys = analyst_keys or [publisher_key]
    write_timeout = float(extra.get("write_timeout", 30.0))
    opts = {
        **extra,
        "max_connections": str(max(2000, 2 * readers)),
        "max_connections_per_address": str(max(2000, 2 * readers)),
    }
    server = Server(url, tmp / f"server-slow-{backend}.log", workers, opts)
    print(f"[bench] {server.command}", file=sys.stderr)
    errors: list[str] = []
    with server:
        assert server.proc is not None
        pid = server.proc.pid
        size, first_s = _download(server.port, publisher_key)
        size, normal_s = _download(server.port, publisher_key)
        time.sleep(1.0)
        before = rss_bytes(pid)
        t0 = time.perf_counter()
        socks, refused = _open_slow(server.port, keys, readers)
        opened_s = time.perf_counter() - t0
        if refused:
            errors.append(f"{refused} connections refused")
        peak, peak_at, closed_at, during_s = before, 0.0, None, None
        samples: list[tuple[float, float, int]] = []
        deadline = time.perf_counter() + write_timeout + 60 + opened_s
        while time.perf_counter() < deadline:
            now = time.perf_counter() - t0
            rss = rss_bytes(pid)
            closed = len(socks) - _held_by_server(server.port, socks)
            samples.append((round(now, 2), round(rss / 1e6, 1), closed))
            if rss > peak:
                peak, peak_at = rss, now
            if during_s is None and now > opened_s + 2:
                try:  # a normal download while they hang
                    got, during_s = _download(server.port, publisher_key)
                    if got != size:
                        errors.append(f"a download during the hang got {got} of {size} bytes")
                except OSError as exc:
                    errors.append(f"a download during the hang failed: {exc}")
                    during_s = float("nan")
            if socks and closed == len(socks):
                closed_at = now
                break
            time.sleep(0.5)
        time.sleep(1.0)
        after = rss_bytes(pid)
        still_open = _held_by_server(server.port, socks)
        if still_open:
            errors.append(f"{still_open} slow connections still open {deadline - t0:.0f} s after they opened")
        for s in socks:
            s.close()
    row = {
        "label": label,
        "backend": backend,
        "workers": workers,
        "readers": readers,
        "held": len(socks),
        "release": RELEASE,
        "release_rows": rows,
        "release_mb": size / 1e6,
        "publish_s": publish_s,
        "first_download_s": first_s,
        "normal_download_s": normal_s,
        "download_during_hang_s": during_s,
        "rss_before_mb": before / 1e6,
        "rss_peak_mb": peak / 1e6,
        "added_peak_mb": (peak - before) / 1e6,
        "peak_at_s": peak_at,
        "rss_after_mb": after / 1e6,
        "opened_in_s": opened_s,
        "closed_after_s": closed_at,
        "write_timeout_s": write_timeout,
        "errors": len(errors),
        "first_errors": errors[:3],
        "samples": samples[:: max(1, len(samples) // 40)],
        "command": server.command.replace(str(tmp), "TMP"),
        "note": (
            f"slow readers: a {rows:,}-row release ({size / 1e6:.1f} MB as CSV) published by an analyst named a publisher; {len(socks):,} "
            f"connections (4 KiB receive buffers) sent GET /v1/releases/{RELEASE}?format=csv and read nothing; RSS of the server's "
            f"process tree (every worker) from /proc; closed after = seconds from opening them until every one was closed by the "
            f"server (--write-timeout {write_timeout:g}); a whole download took {normal_s:.2f} s before and "
            f"{during_s if during_s is not None else float('nan'):.2f} s while they hung"
        ),
    }
    print(
        f"[bench] slow readers: {len(socks)} held, RSS {before / 1e6:.0f} -> peak {peak / 1e6:.0f} MB (+{(peak - before) / 1e6:.0f}) at {peak_at:.1f} s, "
        f"{after / 1e6:.0f} MB after; all closed after {closed_at} s (write timeout {write_timeout:g} s); download {normal_s:.2f} s, "
        f"during the hang {during_s} s; errors {errors[:3]}",
        file=sys.stderr,
    )
    return [row]


if __name__ == "__main__":  # pragma: no cover - run through bench_server.py
    print(json.dumps({"see": "bench_server.py --slow-readers N"}))
