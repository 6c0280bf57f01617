"""One connection's settings and its requests: the standard library's HTTP, the API key, and
retries that never pay twice.

A paid request (a query, a synthetic table) carries an ``Idempotency-Key`` header, a fresh
random key for each call. When its answer is lost — the connection dropped, timed out, or a
proxy answered 502, 503 or 504 — the request is sent again, the same body under the same key,
up to ``retries`` more times with growing pauses (``backoff`` seconds, doubled each time, at most
``max_backoff``). The service answers a retry of a request it has already paid with the first
answer, byte for byte (``Idempotent-Replayed: true``), and debits nothing; while the first is
still being computed it answers 409 ``idempotency_key_in_progress``: that is not a lost answer
(it uses none of the ``retries``), and it is asked again with the same growing pauses until the
answer comes or ``timeout`` seconds have passed since the first such reply — a synthetic table
can take minutes. Unpaid requests (reading, previewing a cost) change nothing and are simply retried. Every
other answer is final: a refusal is raised as the :mod:`dpkit.errors` error it is
(:mod:`dpkit.client.errors`).

The key is sent as ``Authorization: Bearer ...`` and appears in no message, ``repr`` or error.
It is refused over plain ``http://`` to anything but this machine (``allow_insecure=True`` to
send it anyway, e.g. inside a private network).
"""

from __future__ import annotations

import http.client
import ipaddress
import json
import math
import secrets
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dpkit.client.errors import ConnectionFailedError, ServiceError, error_from_problem
from dpkit.errors import InvalidParameterError

__all__ = ["Answer", "Connection", "KEY_VARIABLE", "new_idempotency_key"]

#: The environment variable :func:`dpkit.client.connect` reads the API key from.
KEY_VARIABLE = "DPKIT_API_KEY"

#: Statuses that mean the answer was lost on the way (a proxy's, or an overloaded server's)
#: rather than given: the request is sent again.
_RETRY_STATUSES = frozenset({502, 503, 504})

_AGENT = "dpkit-client"

#: Of those, the statuses that say nothing was answered (a proxy's: the service did not answer it
#: in time, or at all); a 503 is the service's own answer (its ledger or dataset is unavailable).
_NO_ANSWER = frozenset({502, 504})

#: Errors of a connection that gave no complete answer.
_LOST = (OSError, http.client.HTTPException)


def new_idempotency_key() -> str:
    """A fresh random ``Idempotency-Key`` (128 bits from the OS CSPRNG): one per paid call."""
    return secrets.token_urlsafe(16)


@dataclass(frozen=True)
class Answer:
    """A successful answer: its status, its JSON body, and whether the service replayed the
    answer it gave to an earlier request under the same idempotency key."""

    status: int
    body: Any
    replayed: bool = False


def _is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _check_url(url: object, allow_insecure: bool) -> str:
    if not isinstance(url, str):
        raise InvalidParameterError("url", url, "the service's base URL, e.g. 'https://curator.example.org'")
    parts = urllib.parse.urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidParameterError("url", url, "an http:// or https:// URL with a host, e.g. 'http://127.0.0.1:8000'")
    if parts.query or parts.fragment or parts.username or parts.password:
        raise InvalidParameterError("url", url, "the service's base URL, without a query, fragment or credentials")
    if parts.scheme == "http" and not allow_insecure and not _is_loopback(parts.hostname):
        raise InvalidParameterError(
            "url",
            url,
            "https:// for a service on another machine",
            "Over plain http:// the API key and every answer cross the network readable by anyone on the way; "
            "pass allow_insecure=True to send them anyway (e.g. inside a private network)",
        )
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, parts.path.rstrip("/"), "", ""))


#: The shortest pause before asking again for an answer still being computed (whatever ``backoff``).
_MIN_PENDING_PAUSE = 0.05


def _check_key(key: object) -> str:
    # The key's value is never shown: an error names its type and length only.
    if not isinstance(key, str) or not key or not key.isascii() or not key.isprintable() or " " in key:
        shown = f"a {type(key).__name__} of length {len(key)}" if isinstance(key, str) else type(key).__name__
        raise InvalidParameterError(
            "key", shown, "an API key (dpk_...) as issued by the curator, in printable ASCII without spaces"
        )
    return key


@dataclass(frozen=True, repr=False)
class Connection:
    """Where the service is, the key to send and how to retry (see the module docstring).

    ``timeout``: seconds to wait for one answer (a paid answer leaves at a fixed time after its
    debit; a synthetic table's can take minutes). ``retries``: how many times a lost answer is
    asked again; ``backoff`` the first pause in seconds, doubled after each try up to
    ``max_backoff``."""

    url: str
    key: str = field(repr=False)
    timeout: float = 300.0
    retries: int = 3
    backoff: float = 0.5
    max_backoff: float = 30.0
    allow_insecure: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "url", _check_url(self.url, self.allow_insecure))
        _check_key(self.key)
        if not isinstance(self.retries, int) or isinstance(self.retries, bool) or self.retries < 0:
            raise InvalidParameterError("retries", self.retries, "a whole number >= 0")
        if not _seconds(self.timeout) or self.timeout == 0:
            raise InvalidParameterError("timeout", self.timeout, "a finite number of seconds > 0")
        for name in ("backoff", "max_backoff"):
            if not _seconds(getattr(self, name)):
                raise InvalidParameterError(name, getattr(self, name), "a finite number of seconds >= 0")

    def __repr__(self) -> str:
        return f"Connection(url={self.url!r}, timeout={self.timeout}, retries={self.retries})"

    def get(self, path: str, query: Mapping[str, str] | None = None) -> Answer:
        """``GET path`` (unpaid: retried freely)."""
        if query:
            path += "?" + urllib.parse.urlencode(query)
        return self.send("GET", path)

    def post(self, path: str, body: Mapping[str, Any], *, idempotency_key: str | None = None) -> Answer:
        """``POST path`` with a JSON body; a paid request passes its ``idempotency_key``."""
        return self.send("POST", path, body, idempotency_key=idempotency_key)

    def send(
        self, method: str, path: str, body: Mapping[str, Any] | None = None, *, idempotency_key: str | None = None
    ) -> Answer:
        """One request, sent until it is answered (at most ``1 + retries`` times): the answer, or
        the error its refusal is; ConnectionFailedError when no try was answered."""
        data = None if body is None else _encode(body)
        headers = {"Authorization": f"Bearer {self.key}", "Accept": "application/json", "User-Agent": _AGENT}
        if data is not None:
            headers["Content-Type"] = "application/json"
        if idempotency_key is not None:
            headers["Idempotency-Key"] = idempotency_key
        last, tries, lost = "", 0, 0
        pause = self.backoff
        pending_since: float | None = None
        while True:
            if tries:
                # An answer still being computed is asked for again no faster than every 50 ms.
                time.sleep(
                    min(max(pause, _MIN_PENDING_PAUSE) if pending_since is not None else pause, self.max_backoff)
                )
                pause *= 2
            tries += 1
            request = urllib.request.Request(self.url + path, data=data, method=method, headers=headers)
            try:
                with urllib.request.urlopen(request, timeout=self.timeout) as response:
                    raw = response.read()
                    replayed = response.headers.get("Idempotent-Replayed", "").lower() == "true"
                    return Answer(response.status, _json(raw, response.status), replayed)
            except urllib.error.HTTPError as refused:
                try:
                    raw = refused.read()
                except _LOST:
                    raw = b""
                finally:
                    refused.close()
                problem = _problem(raw, refused.code)
                last = f"HTTP {refused.code} {problem.get('code', '')}: {problem.get('message', '')}"
                if problem.get("code") == "idempotency_key_in_progress":
                    now = time.monotonic()
                    pending_since = now if pending_since is None else pending_since
                    if now - pending_since < self.timeout:
                        continue
                    break  # still no answer: the key is what gets it later
                if refused.code in _RETRY_STATUSES:
                    if lost < self.retries:
                        lost += 1
                        continue
                    if refused.code in _NO_ANSWER:
                        break
                raise error_from_problem(refused.code, problem) from None
            except _LOST as dropped:
                last = f"{type(dropped).__name__}: {dropped}"
                if isinstance(getattr(dropped, "reason", dropped), ssl.SSLCertVerificationError):
                    break  # the same certificate again would fail the same way
                if lost < self.retries:
                    lost += 1
                    continue
                break
        raise ConnectionFailedError(
            f"no answer from {self.url} to {method} {path} after {tries} tries (last: {last})",
            idempotency_key=idempotency_key,
        )


def _seconds(value: object) -> bool:
    """Whether ``value`` is a finite int or float >= 0."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < math.inf


def _encode(body: Mapping[str, Any]) -> bytes:
    try:
        return json.dumps(body, allow_nan=False).encode("utf-8")
    except ValueError:  # NaN or infinity: JSON has neither, and no parameter accepts them
        name = next((k for k, x in body.items() if isinstance(x, float) and not math.isfinite(x)), "body")
        raise InvalidParameterError(name, body.get(name), "a finite number") from None


def _json(raw: bytes, status: int) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        raise ServiceError(f"the service answered {status} with a body that is not JSON", status=status) from None


def _problem(raw: bytes, status: int) -> dict[str, Any]:
    """The ``error`` object of an error answer; for a body that is not one (a proxy's page), a
    problem made of the status."""
    try:
        found = json.loads(raw)["error"]
        if isinstance(found, dict):
            return found
    except (ValueError, KeyError, TypeError):
        pass
    text = raw[:200].decode("utf-8", "replace").strip()
    return {"code": f"http_{status}", "message": f"HTTP {status}" + (f": {text}" if text else "")}
