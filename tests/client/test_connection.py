"""``dpkit.client.Connection``'s retries against a scripted server: which answers are asked for
again (under the same Idempotency-Key), and what is raised when no answer comes."""

from __future__ import annotations

import contextlib
import http.server
import json
from collections.abc import Iterator
from typing import Any

import pytest

from client._proxy import serving
from dpkit.client import Connection, ConnectionFailedError, ServiceError
from dpkit.errors import LedgerError

IN_PROGRESS = (409, {"error": {"code": "idempotency_key_in_progress", "message": "still being answered"}})
LEDGER_DOWN = (503, {"error": {"code": "ledger_unavailable", "message": "the ledger could not be used"}})
PROXY_DOWN = (502, "<html>Bad Gateway</html>")
OK = (200, {"ok": True})


@contextlib.contextmanager
def scripted(*answers: tuple[int, Any]) -> Iterator[tuple[str, list[dict[str, str]]]]:
    """A server answering each request with the next of ``answers`` (a dict as JSON, a str as
    HTML); yields its URL and the headers of the requests it got."""
    script = list(answers)
    seen: list[dict[str, str]] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            seen.append({k.lower(): v for k, v in self.headers.items()})
            status, body = script.pop(0)
            data = (json.dumps(body) if isinstance(body, dict) else body).encode()
            self.send_response(status)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass

    with serving(http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)) as url:
        yield url, seen


def _post(url: str, retries: int = 2, timeout: float = 300.0) -> Any:
    connection = Connection(url, "dpk_test", retries=retries, backoff=0.0, timeout=timeout)
    return connection.post("/q", {"epsilon": 1}, idempotency_key="k1")


def test_an_answer_still_being_computed_is_waited_for_under_the_same_key() -> None:
    with scripted(IN_PROGRESS, PROXY_DOWN, OK) as (url, seen):
        assert _post(url).body == {"ok": True}
    assert [h["idempotency-key"] for h in seen] == ["k1"] * 3


def test_an_answer_being_computed_uses_none_of_the_retries() -> None:
    """A synthetic table can take minutes: "in progress" is waited out (for up to ``timeout``
    seconds), not counted as a lost answer — with no retries at all, five of them then the answer."""
    with scripted(*[IN_PROGRESS] * 5, OK) as (url, seen):
        assert _post(url, retries=0).body == {"ok": True}
    assert len(seen) == 6 and {h["idempotency-key"] for h in seen} == {"k1"}


def test_no_answer_after_the_retries_carries_the_key() -> None:
    # Asked again at most every 50 ms for 0.2 s: a handful of tries, far fewer than the script holds.
    in_progress = [IN_PROGRESS] * 100
    with scripted(*in_progress) as (url, seen), pytest.raises(ConnectionFailedError) as lost:
        _post(url, timeout=0.2)
    assert lost.value.idempotency_key == "k1" and "idempotency_key_in_progress" in str(lost.value)
    assert 2 <= len(seen) < 100 and f"after {len(seen)} tries" in str(lost.value)
    with scripted(PROXY_DOWN, PROXY_DOWN) as (url, _), pytest.raises(ConnectionFailedError, match="Bad Gateway"):
        _post(url, retries=1)


def test_the_services_own_answers_are_final_or_mapped() -> None:
    with scripted(LEDGER_DOWN, LEDGER_DOWN) as (url, seen), pytest.raises(LedgerError, match="ledger") as down:
        _post(url, retries=1)  # retried (nothing was released), then the service's own error
    assert len(seen) == 2 and down.value.problem["code"] == "ledger_unavailable"  # type: ignore[attr-defined]
    reused = (422, {"error": {"code": "idempotency_key_reused", "message": "another body under this key"}})
    with scripted(reused) as (url, seen), pytest.raises(ServiceError) as refused:
        _post(url)
    assert (refused.value.status, refused.value.code, len(seen)) == (422, "idempotency_key_reused", 1)
