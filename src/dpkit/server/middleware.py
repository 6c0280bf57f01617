"""The ASGI layers in front of every ``/v1`` route, outermost first:

1. :class:`EdgeMiddleware` — authenticate a well-formed key first (a valid key is never refused
   for its address), and throttle client addresses whose keys keep being refused. Its refusals
   (429 for the address, 401) are counted per hour and reason, not chained: nobody without a key
   can grow the permanent log (:mod:`dpkit.server.refusals`).
2. :class:`AuditMiddleware` — one chained audit entry per authenticated request, written when its
   response starts, before any byte of it is sent (except a principal's own 429: see 3).
3. :class:`ThrottleMiddleware` — the principal's token bucket, before the body is read. Its 429s
   are counted per hour and principal, not chained: a principal cannot grow the permanent log by
   being refused either.
4. :class:`BodyLimitMiddleware` — the body's size, deadline and UTF-8/JSON checks
   (:mod:`dpkit.server.edge`).

They are plain ASGI middleware (https://asgi.readthedocs.io/en/latest/specs/www.html), so a
refusal is answered before the application parses anything.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from typing import Any

from dpkit.errors import AuthError, InvalidParameterError, LedgerError
from dpkit.server import edge
from dpkit.server.keys import key_hash, looks_like_key
from dpkit.server.problems import note_scope
from dpkit.server.refusals import PRINCIPAL_RATE_LIMITED, AddressLimiter, KnownKeys, RefusalCounter, TokenBuckets
from dpkit.server.service import Service

try:
    from fastapi.responses import JSONResponse
    from starlette.concurrency import run_in_threadpool
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise ImportError("the dpkit server needs FastAPI and uvicorn: pip install 'dpkit[server]'") from exc

__all__ = ["EdgeMiddleware", "AuditMiddleware", "ThrottleMiddleware", "BodyLimitMiddleware", "UNCHAINED"]

_curator_log = logging.getLogger("dpkit.curator")

#: ``scope["state"]`` key of a response counted in the refusal table instead of chained.
UNCHAINED = "unchained"


async def _count(refusals: RefusalCounter, reason: str) -> None:
    """Count one refusal, writing the counts when a flush is due (off the event loop)."""
    if refusals.add(reason):
        try:
            await run_in_threadpool(refusals.flush)
        except Exception:  # the counts stay pending; the refusal itself must still be answered
            _curator_log.exception("the refusal counters could not be written")


class AuditMiddleware:
    """Append the request's audit entry when its response starts — before any byte is sent."""

    def __init__(self, app: Any, service: Service) -> None:
        self.app, self.service = app, service

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not scope["path"].startswith("/v1"):
            await self.app(scope, receive, send)
            return
        state = scope.setdefault("state", {})
        state.setdefault("audit", {})
        logged = False

        async def send_logged(message: dict[str, Any]) -> None:
            nonlocal logged
            if message["type"] == "http.response.start" and not logged:
                logged = True
                status = int(message["status"])
                if state.get(UNCHAINED):
                    pass  # counted in the refusal table instead (ThrottleMiddleware)
                elif not (state["audit"].get("recorded_in_transaction") and status < 400):
                    await run_in_threadpool(self._log, scope, status)
            await send(message)

        try:
            await self.app(scope, receive, send_logged)
        except Exception:
            if not logged:
                logged = True
                await run_in_threadpool(self._log, scope, 500)
            raise

    def _log(self, scope: dict[str, Any], status: int) -> None:
        facts = dict(scope["state"].get("audit", {}))
        if facts.get("recorded_in_transaction") and status < 400:
            return  # a paid answer: its entry was committed in the debit's transaction
        facts.pop("recorded_in_transaction", None)
        action = facts.pop("action", f"{scope['method']} {scope['path'][:200]}")
        outcome = facts.pop("outcome", "ok" if status < 400 else "error")
        self.service.audit(
            actor=facts.pop("actor", None),
            action=action,
            status=status,
            outcome=str(outcome)[:1000],
            dataset=facts.pop("dataset", None),
            detail=facts,
        )


def _json_error(
    scope: dict[str, Any], status: int, code: str, message: str, *, headers: dict[str, str] | None = None, **extra: Any
) -> JSONResponse:
    """An error answered by a middleware (before the application), noted for the audit entry."""
    note_scope(scope, outcome=f"{code}: {message}")
    return JSONResponse({"error": {"code": code, "message": message, **extra}}, status_code=status, headers=headers)


class BodyLimitMiddleware:
    """Read the whole body before the app sees it: at most ``limit`` bytes (else 413), within
    ``timeout`` seconds of the request's start (else 408, and the connection is closed), and
    checked by :func:`dpkit.server.edge.check_json_body` (else 400 ``invalid_request``)."""

    def __init__(self, app: Any, limit: int, timeout: float = 30.0) -> None:
        self.app, self.limit, self.timeout = app, limit, timeout

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS"):
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        declared = headers.get(b"content-length")
        too_big = declared is not None and (not declared.isdigit() or int(declared) > self.limit)
        body = bytearray()
        more = not too_big
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout
        while more:
            try:
                message = await asyncio.wait_for(receive(), timeout=max(0.0, deadline - loop.time()))
            except TimeoutError:
                response = _json_error(
                    scope,
                    408,
                    "timeout",
                    f"the request body did not arrive within {self.timeout:g} s",
                    headers={"Connection": "close"},
                )
                await response(scope, receive, send)
                return
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > self.limit:
                too_big = True
                break
        if too_big:
            response = _json_error(scope, 413, "too_large", f"the request body exceeds {self.limit} bytes")
            await response(scope, receive, send)
            return
        try:
            edge.check_json_body(bytes(body))
        except InvalidParameterError as exc:
            await _json_error(scope, 400, "invalid_request", str(exc), parameter=exc.name)(scope, receive, send)
            return
        replayed = False

        async def replay() -> dict[str, Any]:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": bytes(body), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


def _client_address(scope: dict[str, Any]) -> str:
    client = scope.get("client")
    return str(client[0]) if client else "unknown"


def _header_key(scope: dict[str, Any]) -> str | None:
    """The API key presented in ``Authorization: Bearer`` or ``X-API-Key`` (first of each)."""
    auth = xkey = None
    for name, value in scope.get("headers") or ():
        if name == b"authorization" and auth is None:
            auth = value.decode("latin-1")
        elif name == b"x-api-key" and xkey is None:
            xkey = value.decode("latin-1")
    if auth is not None:
        scheme, _, value = auth.partition(" ")
        return value.strip() if scheme.lower() == "bearer" else None
    return xkey


class EdgeMiddleware:
    """The outermost layer of ``/v1``: authenticate, and throttle client addresses whose keys
    keep being refused. A request refused here (429 for the address, 401) does not reach the
    application and is not an entry of the audit chain: it is counted per hour and reason
    (:class:`~dpkit.server.refusals.RefusalCounter`). An authenticated request carries its
    :class:`~dpkit.server.principals.Principal` in ``scope["state"]["principal"]`` and is
    audited as before.

    The order is what keeps a shared address (a NAT, an office) usable: a request with a
    missing or malformed key is refused without the database — 429 while its address's bucket
    is empty, else 401 charging the bucket; a request with a well-formed key is authenticated
    *first*, so a valid key goes ahead whatever others sent from its address (its principal's
    own bucket still applies, further in). An unknown or revoked well-formed key charges the
    bucket like a malformed one. While its address is throttled, a well-formed key is first
    looked up in :class:`~dpkit.server.refusals.KnownKeys` (the valid keys' hashes, reloaded at
    most once per ``key_refresh`` seconds), so a flood of random well-formed keys from a
    throttled address costs no database lookup each; one not among them is 429."""

    def __init__(
        self,
        app: Any,
        service: Service,
        addresses: AddressLimiter,
        refusals: RefusalCounter,
        *,
        known: KnownKeys | None = None,
        key_refresh: float = 1.0,
    ) -> None:
        self.app, self.service, self.addresses, self.refusals = app, service, addresses, refusals
        self.known = KnownKeys.of(service.store, refresh_every=key_refresh) if known is None else known

    async def _throttled(self, scope: dict[str, Any], receive: Any, send: Any, address: str) -> bool:
        """Answer 429 (and True) when ``address``'s bucket of refusals is empty."""
        wait = self.addresses.wait(address)
        if wait <= 0:
            return False
        await self._refuse(
            scope,
            receive,
            send,
            "address_rate_limited",
            429,
            "rate_limited",
            f"too many refused requests from this address; retry in {wait:.2f} s",
            {"Retry-After": str(max(1, math.ceil(wait)))},
        )
        return True

    async def _may_be_valid(self, key: str) -> bool:
        """Whether ``key`` (well-formed) is among the valid keys as of a load that began after
        this call did (see :class:`~dpkit.server.refusals.KnownKeys`); True when they cannot be
        loaded (the database lookup that follows then says what is wrong)."""
        digest = key_hash(key)
        if digest in self.known:
            return True
        arrived = time.monotonic()
        wait = self.known.wait()
        if wait > 0:
            await asyncio.sleep(wait)
        if self.known.settled(arrived):
            return digest in self.known
        try:
            return await run_in_threadpool(self.known.holds, digest, arrived)
        except Exception:
            _curator_log.exception("the valid keys could not be read")
            return True

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not scope["path"].startswith("/v1"):
            await self.app(scope, receive, send)
            return
        address = _client_address(scope)
        key = _header_key(scope)
        well_formed = key is not None and looks_like_key(key)
        throttled = self.addresses.wait(address) > 0
        if throttled and not well_formed and await self._throttled(scope, receive, send, address):
            return  # (before anything is looked up)
        try:
            if not well_formed:
                who = self.service.authenticate(key)  # refuses at once, without the database
            else:
                assert key is not None
                # (A key not among the valid ones whose address's bucket refilled meanwhile is
                # looked up as any other.)
                if (
                    throttled
                    and not await self._may_be_valid(key)
                    and await self._throttled(scope, receive, send, address)
                ):
                    return
                who = await run_in_threadpool(self.service.authenticate, key)
        except AuthError as exc:
            self.addresses.charge(address)
            if throttled and await self._throttled(scope, receive, send, address):
                return
            await self._refuse(
                scope,
                receive,
                send,
                "unauthenticated",
                401,
                "unauthenticated",
                str(exc),
                {"WWW-Authenticate": "Bearer"},
            )
            return
        except LedgerError:
            _curator_log.exception("authentication could not read the service database")
            await self._refuse(
                scope,
                receive,
                send,
                "ledger_unavailable",
                503,
                "ledger_unavailable",
                "the ledger could not be used; nothing was released",
                None,
            )
            return
        state = scope.setdefault("state", {})
        state["principal"] = who
        note_scope(scope, actor=who.name, key_id=who.key_id)
        audit = state["audit"]
        audit.setdefault("action", f"{scope['method']} {edge.printable(scope['path'], 200)}")
        await self.app(scope, receive, send)

    async def _refuse(
        self,
        scope: dict[str, Any],
        receive: Any,
        send: Any,
        reason: str,
        status: int,
        code: str,
        message: str,
        headers: dict[str, str] | None,
    ) -> None:
        await _count(self.refusals, reason)
        await JSONResponse({"error": {"code": code, "message": message}}, status_code=status, headers=headers)(
            scope, receive, send
        )


class ThrottleMiddleware:
    """The per-principal token bucket, before the body is read (so that no principal can send
    bodies faster than its rate either). Its 429 is not chained — one entry per refusal would
    let a principal grow the permanent log at the speed it can send — but counted per hour and
    principal in ``refusals`` (reason ``principal_rate_limited:<name>``, read at
    ``GET /v1/refusals``): a row per principal and hour at most."""

    def __init__(self, app: Any, limiter: TokenBuckets, refusals: RefusalCounter) -> None:
        self.app, self.limiter, self.refusals = app, limiter, refusals

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        who = scope.get("state", {}).get("principal") if scope["type"] == "http" else None
        if who is not None:
            wait = self.limiter.take(who.name)
            if wait > 0:
                scope["state"][UNCHAINED] = True
                await _count(self.refusals, f"{PRINCIPAL_RATE_LIMITED}:{who.name}")
                response = _json_error(
                    scope,
                    429,
                    "rate_limited",
                    f"too many requests from {who.name!r}; retry in {wait:.2f} s",
                    headers={"Retry-After": str(max(1, math.ceil(wait)))},
                )
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)
