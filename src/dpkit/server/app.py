"""The HTTP API of the curator service (FastAPI), and its web dashboard.

Every ``/v1`` endpoint needs an API key (``Authorization: Bearer dpk_...`` or ``X-API-Key``):
none, malformed, unknown or revoked → **401**; a key of the wrong role → **403**. Errors are JSON
``{"error": {"code": ..., "message": ..., ...}}`` with these statuses:

====  =====================  ===========================================================
400   invalid_request        a body that is not UTF-8 JSON, is nested too deeply or holds a
                             lone surrogate or NUL; unknown fields; a bad parameter (named),
                             including an integer out of range or a path name that does not
                             match its pattern; SQL outside the subset, an unknown column
400   limit_exceeded         the query exceeds a limit the curator set (the body names the
                             ``parameter``, the ``limit`` and its ``setting``), or is nested
                             too deeply to parse; nothing spent
401   unauthenticated        no valid key (counted per hour, not an audit entry)
403   forbidden              the key's role may not call this endpoint
404   not_found              unknown dataset (or one the analyst was not granted), analyst,
                             key, endpoint or dashboard file
405   method_not_allowed     the endpoint does not take this method
408   timeout                the request body did not arrive in time (the connection closes)
409   budget_exceeded        the query's cost exceeds the remaining budget (nothing debited,
                             nothing released); the body holds the remaining budget
413   too_large              the request body exceeds the limit
429   rate_limited           too many requests from this principal, or too many refused
                             requests from this client address (``Retry-After`` header; the
                             latter is counted, not an audit entry)
500   query_failed           a query failed after its debit (the spend stands; the body holds
                             only the fixed message and the ``spend_id``), or anything else
                             failed unexpectedly in a query (``spend_id`` null)
500   internal_error         any other unexpected failure (a fixed message)
503   ledger_unavailable     the ledger could not be read or written (nothing released)
503   dataset_unavailable    the dataset's source can no longer be opened (nothing spent)
====  =====================  ===========================================================

No answer ever carries the ledger's URL or file, an engine's message, a traceback or a data
value: refusals before the debit are decided on the request and the declared metadata only, and
every failure after it is the one fixed ``query_failed`` answer (DESIGN core idea 1). The
details go to the curator's log (the ``dpkit.curator`` logger). The curator alone sees the data
check made when a dataset is registered (``POST /v1/datasets`` answers it under ``check``).

Before any response to an authenticated request leaves the service, one entry — who, what, the
cost, the status and the outcome — is appended to the hash-chained audit log (so an answer is
never sent unlogged; a debit made just before a crash, with no answer sent, shows in
``dpkit admin verify-log``). Requests refused before authentication (401, and 429 for an address
that keeps being refused) are counted per hour and reason in the ``edge_refusals`` table
(``GET /v1/refusals``), not chained: nobody without a key can grow the permanent log
(:mod:`dpkit.server.refusals`). The layers, outermost first: the client address's throttle and
authentication, the audit entry, the principal's rate limit, the body's size, deadline and
UTF-8/JSON checks (:mod:`dpkit.server.edge`), then the endpoint. Slow clients are cut off by the
server's protocol (:mod:`dpkit.server.serving`).
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
from dataclasses import dataclass, fields
from fractions import Fraction
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from dpkit import _validate as v
from dpkit.analytics.limits import QueryLimits
from dpkit.errors import (
    AuthError,
    BudgetExceededError,
    DPError,
    InvalidDataError,
    InvalidParameterError,
    LedgerError,
    LimitExceededError,
    QueryFailedError,
)
from dpkit.noise.source import RNG
from dpkit.server import edge
from dpkit.server.keys import key_id, looks_like_key
from dpkit.server.refusals import AddressLimiter, RefusalCounter, TokenBuckets
from dpkit.server.store import masked_url, sqlite_path
from dpkit.server.service import (
    DatasetUnavailableError,
    NotFoundError,
    PaidQueryFailedError,
    Principal,
    QueryRequest,
    QuerySpec,
    Service,
    budget_dict,
    check_dataset_name,
    check_principal_name,
    check_service_rng,
)

try:
    from fastapi import Depends, FastAPI, Query, Request

    from dpkit.server.serving import check_limits
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import HTMLResponse, JSONResponse, Response
    from pydantic import BaseModel, ConfigDict, Field
    from starlette.concurrency import run_in_threadpool
    from starlette.exceptions import HTTPException as StarletteHTTPException
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise ImportError("the dpkit server needs FastAPI and uvicorn: pip install 'dpkit[server]'") from exc

__all__ = ["ServerConfig", "create_app"]

_curator_log = logging.getLogger("dpkit.curator")


_LIMITS = QueryLimits()


@dataclass(frozen=True)
class ServerConfig:
    """How the service runs (every field has a ``dpkit serve`` flag of the same name).

    Per principal (authenticated): ``rate`` and ``burst`` — each principal may make ``burst``
    requests at once and ``rate`` per second on average (a token bucket per server process).

    Per client address, before authentication: ``address_rate`` and ``address_burst`` — an
    address may have ``address_burst`` requests refused (401) at once and ``address_rate`` per
    second after; beyond that every request from it is answered 429 before its key is looked up
    (:mod:`dpkit.server.refusals`; at most ``max_addresses`` addresses are tracked).

    Slow clients (:mod:`dpkit.server.serving`): a request's head must arrive within
    ``header_timeout`` seconds and its body within ``body_timeout`` seconds (else 408 or the
    connection is closed); at most ``max_connections`` connections per server process.
    ``max_body_bytes``: the largest request body accepted.

    The service (used when :func:`create_app` opens it): datasets are registered only from under
    ``data_root`` (None: the current directory when the app is created); grants above
    ``max_grant_epsilon`` are refused; ``audit_key`` is the file holding the audit chain's key;
    ``dataset_dir`` where registered datasets are kept; ``engine_threads`` the DuckDB threads of
    one query (None: one per core); ``max_keys``, ``max_result_rows``,
    ``max_response_bytes`` and ``max_query_depth`` are the
    :class:`~dpkit.analytics.limits.QueryLimits` of every query.
    """

    ledger: str = "sqlite:///.dpkit/ledger.sqlite"
    rate: float = 20.0
    burst: int = 100
    max_body_bytes: int = 64 * 1024
    address_rate: float = 1.0
    address_burst: int = 30
    max_addresses: int = 10_000
    header_timeout: float = 10.0
    body_timeout: float = 30.0
    max_connections: int = 1000
    data_root: str | None = None
    max_grant_epsilon: float = 10.0
    audit_key: str | None = None
    dataset_dir: str | None = None
    engine_threads: int | None = None
    max_keys: int = _LIMITS.max_keys
    max_result_rows: int = _LIMITS.max_result_rows
    max_response_bytes: int = _LIMITS.max_response_bytes
    max_query_depth: int = _LIMITS.max_query_depth

    def __post_init__(self) -> None:
        for name in ("rate", "address_rate", "max_grant_epsilon"):
            v.positive(getattr(self, name), name)
        for name in ("burst", "address_burst", "max_addresses"):
            v.positive_int(getattr(self, name), name)
        v.positive_int(self.max_body_bytes, "max_body_bytes", minimum=1024)
        check_limits(self.header_timeout, self.body_timeout, self.max_connections)
        for name in ("data_root", "audit_key", "dataset_dir"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise InvalidParameterError(name, value, "a path, or None")
        if self.engine_threads is not None:
            v.positive_int(self.engine_threads, "engine_threads")
        self.limits()  # checks max_keys, max_result_rows, max_response_bytes, max_query_depth

    def limits(self) -> QueryLimits:
        """The per-query limits these settings name."""
        return QueryLimits(
            max_keys=self.max_keys, max_result_rows=self.max_result_rows,
            max_response_bytes=self.max_response_bytes, max_query_depth=self.max_query_depth,
        )

    def service(self, *, rng: RNG = None) -> Service:
        """Open the service these settings describe."""
        return Service(
            self.ledger, rng=rng, data_root=self.data_root if self.data_root is not None else os.getcwd(),
            limits=self.limits(), max_grant_epsilon=self.max_grant_epsilon, audit_key=self.audit_key, dataset_dir=self.dataset_dir,
            engine_threads=self.engine_threads,
        )


# ------------------------------------------------------------------------------------------------
# errors
# ------------------------------------------------------------------------------------------------


class _Problem(Exception):
    def __init__(self, status: int, code: str, message: str, *, headers: dict[str, str] | None = None, **extra: Any) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.headers, self.extra = status, code, message, headers, extra


def _problem_response(request: Request, p: _Problem) -> JSONResponse:
    message = _scrub(request.scope, p.message)
    _note(request, outcome=f"{p.code}: {message}")
    return JSONResponse({"error": {"code": p.code, "message": message, **p.extra}}, status_code=p.status, headers=p.headers)


def _scrub(scope: dict[str, Any], message: str) -> str:
    """``message`` without the server's own paths and URLs (the ledger's URL, file and
    directory): no error sent over HTTP names where the service keeps its state."""
    app = scope.get("app")
    for secret, label in getattr(getattr(app, "state", None), "secrets", ()):
        if secret in message:
            message = message.replace(secret, label)
    return message


def _limit_exceeded(exc: LimitExceededError) -> _Problem:
    return _Problem(400, "limit_exceeded", str(exc), parameter=exc.name, limit=exc.limit, setting=exc.setting)


def _query_failed(spend_id: int | None) -> _Problem:
    """The one answer to a query that failed: the fixed message and the spend id, nothing else."""
    return _Problem(500, "query_failed", QueryFailedError.MESSAGE, spend_id=spend_id)


def _from_dp_error(exc: DPError) -> _Problem:
    if isinstance(exc, QueryFailedError):
        return _query_failed(exc.spend_id)
    if isinstance(exc, DatasetUnavailableError):
        return _Problem(503, "dataset_unavailable", DatasetUnavailableError.MESSAGE)
    if isinstance(exc, LimitExceededError):
        return _limit_exceeded(exc)
    if isinstance(exc, InvalidParameterError):
        return _Problem(400, "invalid_request", str(exc), parameter=exc.name)
    if isinstance(exc, InvalidDataError):
        return _Problem(400, "invalid_request", str(exc), parameter=exc.name)
    if isinstance(exc, NotFoundError):
        return _Problem(404, "not_found", str(exc))
    if isinstance(exc, AuthError):
        return _Problem(403, "forbidden", str(exc))
    if isinstance(exc, BudgetExceededError):
        return _Problem(409, "budget_exceeded", str(exc))
    if isinstance(exc, LedgerError):
        return _Problem(503, "ledger_unavailable", "the ledger could not be used; nothing was released")
    return _Problem(400, "invalid_request", str(exc))


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    errors = exc.errors()
    if not errors:
        return "invalid request", None
    first = errors[0]
    loc = [str(x) for x in first.get("loc", ())]
    if loc and loc[0] in ("body", "query", "path", "header"):
        loc = loc[1:]
    where = ".".join(loc) or "body"
    if first.get("type") == "json_invalid":
        return f"the body is not valid JSON ({first.get('ctx', {}).get('error', 'parse error')})", None
    if first.get("type") == "extra_forbidden":
        return f"unknown field {where!r}", where
    if first.get("type") == "missing":
        return f"missing field {where!r}", where
    return f"{where}: {first.get('msg', 'invalid')}", where


def _note(request: Request, **fields: Any) -> None:
    """Add facts to this request's audit entry (text made printable: whatever an analyst sent
    can be stored and encoded)."""
    _note_scope(request.scope, **fields)


def _note_scope(scope: dict[str, Any], **fields: Any) -> None:
    clean = {k: edge.printable(x, 4096) if isinstance(x, str) else x for k, x in fields.items()}
    scope.setdefault("state", {}).setdefault("audit", {}).update(clean)


# ------------------------------------------------------------------------------------------------
# ASGI middleware: audit (outermost) and body size
# ------------------------------------------------------------------------------------------------


class _AuditLog:
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
                if not (state["audit"].get("recorded_in_transaction") and status < 400):
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


def _json_error(scope: dict[str, Any], status: int, code: str, message: str, *, headers: dict[str, str] | None = None, **extra: Any) -> JSONResponse:
    """An error answered by a middleware (before the application), noted for the audit entry."""
    _note_scope(scope, outcome=f"{code}: {message}")
    return JSONResponse({"error": {"code": code, "message": message, **extra}}, status_code=status, headers=headers)


class _BodyLimit:
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
            except asyncio.TimeoutError:
                response = _json_error(
                    scope, 408, "timeout", f"the request body did not arrive within {self.timeout:g} s", headers={"Connection": "close"}
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


class _Edge:
    """The outermost layer of ``/v1``: throttle client addresses whose requests keep being
    refused, then authenticate. A request refused here (429 for the address, 401) does not reach
    the application and is not an entry of the audit chain: it is counted per hour and reason
    (:class:`~dpkit.server.refusals.RefusalCounter`). An authenticated request carries its
    :class:`Principal` in ``scope["state"]["principal"]`` and is audited as before."""

    def __init__(self, app: Any, service: Service, addresses: AddressLimiter, refusals: RefusalCounter) -> None:
        self.app, self.service, self.addresses, self.refusals = app, service, addresses, refusals

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not scope["path"].startswith("/v1"):
            await self.app(scope, receive, send)
            return
        address = _client_address(scope)
        wait = self.addresses.wait(address)
        if wait > 0:
            await self._refuse(scope, receive, send, "address_rate_limited", 429, "rate_limited",
                               f"too many refused requests from this address; retry in {wait:.2f} s",
                               {"Retry-After": str(max(1, math.ceil(wait)))})
            return
        key = _header_key(scope)
        try:
            if key is None or not looks_like_key(key):
                who = self.service.authenticate(key)  # refuses at once, without the database
            else:
                who = await run_in_threadpool(self.service.authenticate, key)
        except AuthError as exc:
            self.addresses.charge(address)
            await self._refuse(scope, receive, send, "unauthenticated", 401, "unauthenticated", str(exc), {"WWW-Authenticate": "Bearer"})
            return
        except LedgerError:
            _curator_log.exception("authentication could not read the service database")
            await self._refuse(scope, receive, send, "ledger_unavailable", 503, "ledger_unavailable", "the ledger could not be used; nothing was released", None)
            return
        state = scope.setdefault("state", {})
        state["principal"] = who
        _note_scope(scope, actor=who.name, key_id=who.key_id)
        audit = state["audit"]
        audit.setdefault("action", f"{scope['method']} {edge.printable(scope['path'], 200)}")
        await self.app(scope, receive, send)

    async def _refuse(self, scope: dict[str, Any], receive: Any, send: Any, reason: str, status: int, code: str, message: str, headers: dict[str, str] | None) -> None:
        if self.refusals.add(reason):
            try:
                await run_in_threadpool(self.refusals.flush)
            except Exception:  # the counts stay pending; the refusal itself must still be answered
                _curator_log.exception("the refusal counters could not be written")
        await JSONResponse({"error": {"code": code, "message": message}}, status_code=status, headers=headers)(scope, receive, send)


class _Throttle:
    """The per-principal token bucket, before the body is read (so that no principal can send
    bodies faster than its rate either). Its 429 is audited."""

    def __init__(self, app: Any, limiter: TokenBuckets) -> None:
        self.app, self.limiter = app, limiter

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        who = scope.get("state", {}).get("principal") if scope["type"] == "http" else None
        if who is not None:
            wait = self.limiter.take(who.name)
            if wait > 0:
                response = _json_error(
                    scope, 429, "rate_limited", f"too many requests from {who.name!r}; retry in {wait:.2f} s",
                    headers={"Retry-After": str(max(1, math.ceil(wait)))},
                )
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


# ------------------------------------------------------------------------------------------------
# request bodies
# ------------------------------------------------------------------------------------------------


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class AggregateBody(_Body):
    kind: str
    column: str | None = None
    q: float | None = None
    name: str | None = None


class SpecBody(_Body):
    aggregates: list[AggregateBody] = Field(min_length=1, max_length=32)
    where: str | None = None
    group_by: list[str] = Field(default_factory=list, max_length=8)
    bins: dict[str, list[float]] | None = None
    keys: list[list[str | int | float | bool | None]] | None = None
    max_groups: int | None = None
    max_rows: int | None = None


class QueryBody(_Body):
    epsilon: float
    delta: float = 0.0
    sql: str | None = None
    query: SpecBody | None = None
    noise: str = "laplace"
    confidence: float = 0.95
    key_selection: str = "truncated_geometric"
    split: list[float] | None = None

    def request(self) -> QueryRequest:
        spec = None
        if self.query is not None:
            q = self.query
            spec = QuerySpec(
                aggregates=tuple(a.model_dump(exclude_none=True) for a in q.aggregates),
                where=q.where,
                group_by=tuple(q.group_by),
                bins=None if q.bins is None else {k: tuple(v) for k, v in q.bins.items()},
                keys=None if q.keys is None else tuple(tuple(k) for k in q.keys),
                max_groups=q.max_groups,
                max_rows=q.max_rows,
            )
        return QueryRequest(
            epsilon=self.epsilon, delta=self.delta, sql=self.sql, spec=spec, noise=self.noise,
            confidence=self.confidence, key_selection=self.key_selection,
            split=None if self.split is None else tuple(self.split),
        )


class DatasetBody(_Body):
    name: str
    source: str
    metadata: dict[str, Any]
    neighbours: Literal["add_remove", "replace"] = "add_remove"
    table: str | None = None


class AnalystBody(_Body):
    name: str


class GrantBody(_Body):
    analyst: str
    dataset: str
    epsilon: float
    delta: float = 0.0


# ------------------------------------------------------------------------------------------------
# the application
# ------------------------------------------------------------------------------------------------


#: ``after`` and ``limit`` of the audit and history listings: refused (400) outside these ranges.
_AFTER = Query(0, ge=0, le=edge.MAX_INT, description="list entries with sequence numbers above this")
_PAGE = Query(200, ge=1, le=1000, description="at most this many entries (1 to 1000)")


def create_app(config: ServerConfig | Service | str | None = None, *, rng: RNG = None, **settings: Any) -> FastAPI:
    """The FastAPI application: the ``/v1`` API and the dashboard at ``/``.

    ``config`` is a :class:`ServerConfig`, a ledger URL, or an open :class:`Service` (which the
    caller keeps and closes; the service settings of the configuration then do not apply).
    ``settings`` override fields of the configuration (``rate=...``, ``address_burst=...``).
    ``rng`` accepts only None or a :class:`~dpkit.noise.source.SecureSource`: a seeded generator
    is refused (see :class:`Service`).
    """
    check_service_rng(rng)
    known = {f.name for f in fields(ServerConfig)} - {"ledger"}
    unknown = sorted(set(settings) - known)
    if unknown:
        raise InvalidParameterError(unknown[0], settings[unknown[0]], "a field of ServerConfig: " + ", ".join(sorted(known)))
    overrides = {k: x for k, x in settings.items() if x is not None}
    if isinstance(config, Service):
        cfg = ServerConfig(ledger=config.url, **overrides)
        service, owned = config, False
    else:
        cfg = config if isinstance(config, ServerConfig) else ServerConfig(ledger=config or ServerConfig.ledger)
        if overrides:
            cfg = ServerConfig(**{**cfg.__dict__, **overrides})
        service, owned = cfg.service(rng=rng), True
    limiter = TokenBuckets(cfg.rate, cfg.burst, names=("rate", "burst", "max_keys"))
    addresses = AddressLimiter(cfg.address_rate, cfg.address_burst, cfg.max_addresses)
    refusals = RefusalCounter(service.store)  # a small table of the service's own database

    # No /docs: Swagger UI loads scripts from a CDN. The OpenAPI schema (no data) stays public.
    app = FastAPI(title="dpkit curator", version="1", docs_url=None, redoc_url=None, openapi_url="/openapi.json")
    app.state.service = service
    app.state.config = cfg
    app.state.refusals = refusals
    app.state.secrets = _server_secrets(service.url)
    app.router.add_event_handler("shutdown", refusals.flush)
    if owned:
        app.router.add_event_handler("shutdown", service.close)
    assets = _asset_names()

    @app.exception_handler(_Problem)
    async def _on_problem(request: Request, exc: _Problem) -> JSONResponse:
        return _problem_response(request, exc)

    @app.exception_handler(DPError)
    async def _on_dp_error(request: Request, exc: DPError) -> JSONResponse:
        return _problem_response(request, _from_dp_error(exc))

    @app.exception_handler(RequestValidationError)
    async def _on_invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        message, parameter = _validation_message(exc)
        return _problem_response(request, _Problem(400, "invalid_request", message, parameter=parameter))

    @app.exception_handler(StarletteHTTPException)
    async def _on_http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        # No route matched (404) or not with this method (405): the same error shape as the rest.
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "invalid_request")
        message = {404: "no such endpoint", 405: "this endpoint does not accept this method"}.get(exc.status_code, str(exc.detail))
        return _problem_response(request, _Problem(exc.status_code, code, message, headers=getattr(exc, "headers", None)))

    @app.exception_handler(RecursionError)
    async def _on_too_deep(request: Request, exc: RecursionError) -> JSONResponse:
        # Whatever recursed without bound was fed by the request: refuse it as too deep.
        _curator_log.warning("a request to %s recursed too deeply", edge.printable(request.url.path, 200))
        return _problem_response(request, _Problem(400, "invalid_request", "the request is nested too deeply to be processed", parameter="body"))

    @app.exception_handler(Exception)
    async def _on_unexpected(request: Request, exc: Exception) -> JSONResponse:
        # (Starlette's outermost layer: the audit entry was already written, with status 500.)
        _curator_log.error("unexpected error in %s %s", request.method, request.url.path[:200], exc_info=exc)
        return JSONResponse({"error": {"code": "internal_error", "message": "internal error (the curator's log has the details)"}}, status_code=500)

    # -- authentication -------------------------------------------------------------------------

    # The dependencies do no I/O (the middleware authenticated the key): async, so that FastAPI
    # runs them on the event loop instead of sending each through the thread pool.
    async def principal(request: Request) -> Principal:
        # Authenticated (and throttled) by the middleware before the body was read.
        who = request.scope.get("state", {}).get("principal")
        if not isinstance(who, Principal):
            raise _Problem(401, "unauthenticated", "a valid API key is required (Authorization: Bearer dpk_...)", headers={"WWW-Authenticate": "Bearer"})
        return who

    async def curator(who: Principal = Depends(principal)) -> Principal:
        if who.role != "curator":
            raise _Problem(403, "forbidden", f"this endpoint is for the curator; {who.name!r} is an {who.role}")
        return who

    async def analyst(who: Principal = Depends(principal)) -> Principal:
        if who.role != "analyst":
            raise _Problem(403, "forbidden", f"this endpoint is for analysts; {who.name!r} is the {who.role}")
        return who

    # -- everyone --------------------------------------------------------------------------------

    @app.get("/v1/me")
    def me(request: Request, who: Principal = Depends(principal)) -> dict[str, Any]:
        _note(request, action="me")
        return {"name": who.name, "role": who.role, "key_id": who.key_id}

    @app.get("/v1/datasets")
    def list_datasets(request: Request, who: Principal = Depends(principal)) -> dict[str, Any]:
        _note(request, action="list_datasets")
        if who.role == "curator":
            return {"datasets": [{**d.public(), "source": d.source, "created_at": d.created_at} for d in service.datasets()]}
        granted = {b.dataset for b in service.budgets(who)}
        return {"datasets": [d.public() for d in service.datasets() if d.name in granted]}

    @app.get("/v1/datasets/{name}")
    def get_dataset(name: str, request: Request, who: Principal = Depends(principal)) -> dict[str, Any]:
        check_dataset_name(name)
        _note(request, action="get_dataset", dataset=name[:100])
        return service.dataset(name, who).public()

    @app.get("/v1/budgets")
    def list_budgets(request: Request, who: Principal = Depends(principal)) -> dict[str, Any]:
        _note(request, action="list_budgets")
        return {"budgets": [budget_dict(b) for b in service.budgets(who)]}

    @app.get("/v1/history")
    def history(
        request: Request, analyst_name: str | None = None, after: int = _AFTER, limit: int = _PAGE, newest: bool = False, who: Principal = Depends(principal)
    ) -> dict[str, Any]:
        _note(request, action="history")
        if analyst_name is not None:
            check_principal_name(analyst_name)
        if who.role == "analyst":
            if analyst_name not in (None, who.name):
                raise _Problem(403, "forbidden", "analysts see only their own history")
            analyst_name = who.name
        entries = service.audit_entries(actor=analyst_name, actions=["query", "query_failed", "cost"], after=after, limit=limit, newest=newest)
        return {"entries": [_history_item(e.to_dict()) for e in entries]}

    # -- analysts ----------------------------------------------------------------------------------

    def _run(request: Request, name: str, body: QueryBody, who: Principal, *, preview: bool) -> Any:
        req = body.request()
        _note(request, action="cost" if preview else "query", dataset=name[:100], query=req.text()[:4096])
        if preview:
            cost = service.cost(who, name, req)
            _note(request, outcome="ok (preview, nothing spent)")
            return {"dataset": name, "cost": {"epsilon": cost.epsilon, "delta": cost.delta}, "query": cost.text, "budget": _own_budget(service, who, name)}
        try:
            answer, encoded = service.query_encoded(who, name, req)
        except BudgetExceededError as exc:
            raise _Problem(409, "budget_exceeded", str(exc), budget=_own_budget(service, who, name)) from None
        except PaidQueryFailedError as exc:
            # The debit stands, recorded by its own entry (written with it); this request's entry
            # says the answer failed and names the spend, without recording the amount again.
            _note(request, action="query_failed", spend_id=exc.spend_id)
            raise _query_failed(exc.spend_id) from None
        # The debit's entry, committed with the spend, is this request's record.
        _note(request, recorded_in_transaction=True, spend_id=answer.get("spend_id"))
        return Response(encoded, media_type="application/json")

    def _guarded(request: Request, name: str, body: QueryBody, who: Principal, *, preview: bool) -> Any:
        """A query's only answers: the result, a refusal decided before the debit on the request
        and the declared metadata, or the fixed ``query_failed``. Anything unexpected (and an
        InvalidDataError, which can no longer arise in the query path and may quote the data)
        becomes ``query_failed`` too — never a traceback or the exception's text."""
        try:
            return _run(request, name, body, who, preview=preview)
        except (_Problem, InvalidParameterError, NotFoundError, AuthError, BudgetExceededError, LedgerError, DatasetUnavailableError, QueryFailedError):
            raise
        except RecursionError:
            # Only validation recurses on the request (anything after the debit is wrapped by the
            # service): a query nested beyond what the parser can follow is refused, unpaid.
            raise _Problem(400, "limit_exceeded", "the query is nested too deeply to be parsed; nothing was spent", parameter="sql") from None
        except Exception as exc:
            _curator_log.error("query on %r by %r failed unexpectedly", name[:100], who.name, exc_info=exc)
            raise _query_failed(None) from None

    @app.post("/v1/datasets/{name}/query")
    def query(name: str, body: QueryBody, request: Request, who: Principal = Depends(analyst)) -> Any:
        check_dataset_name(name)
        # A ready Response (encoded by the service) skips FastAPI's generic serialisation.
        return _guarded(request, name, body, who, preview=False)

    @app.post("/v1/datasets/{name}/query/cost")
    def query_cost(name: str, body: QueryBody, request: Request, who: Principal = Depends(analyst)) -> Any:
        check_dataset_name(name)
        return _guarded(request, name, body, who, preview=True)

    # -- the curator ------------------------------------------------------------------------------

    @app.post("/v1/datasets", status_code=201)
    def register_dataset(body: DatasetBody, request: Request, who: Principal = Depends(curator)) -> dict[str, Any]:
        _note(request, action="register_dataset", dataset=body.name[:100])
        info = service.register_dataset(body.name, body.source, body.metadata, neighbours=body.neighbours, table=body.table)
        # The data check goes to the curator who registered the dataset, in this answer only: it
        # holds exact counts and raw values, so it is not stored, not audited, and no analyst
        # endpoint returns it.
        check = None if info.check is None else info.check.to_dict()
        return {**info.public(), "source": info.source, "created_at": info.created_at, "check": check}

    @app.get("/v1/analysts")
    def list_analysts(request: Request, who: Principal = Depends(curator)) -> dict[str, Any]:
        _note(request, action="list_principals")
        return {"principals": service.principals()}

    @app.post("/v1/analysts", status_code=201)
    def create_analyst(body: AnalystBody, request: Request, who: Principal = Depends(curator)) -> dict[str, Any]:
        _note(request, action="create_analyst", name=body.name[:100])
        p, key = service.create_principal(body.name, "analyst")
        return {"name": p.name, "role": p.role, "key_id": p.key_id, "key": key, "note": "the key is shown once; only its hash is stored"}

    @app.post("/v1/analysts/{name}/keys", status_code=201)
    def issue_key(name: str, request: Request, who: Principal = Depends(curator)) -> dict[str, Any]:
        check_principal_name(name)
        _note(request, action="issue_key", name=name[:100])
        key = service.issue_key(name)
        return {"name": name, "key_id": key_id(key), "key": key, "note": "the key is shown once; only its hash is stored"}

    @app.post("/v1/keys/{key}/revoke")
    def revoke_key(key: str, request: Request, who: Principal = Depends(curator)) -> dict[str, Any]:
        """Revoke one key, named by its id (16 lower-case hex digits; never a principal's name)."""
        edge.check_key_id(key)
        _note(request, action="revoke_key", key=key)
        return {"revoked": service.revoke_key(key)}

    @app.post("/v1/principals/{name}/revoke")
    def revoke_principal(name: str, request: Request, who: Principal = Depends(curator)) -> dict[str, Any]:
        """Revoke every key of the principal ``name``."""
        check_principal_name(name)
        _note(request, action="revoke_principal", name=name)
        return {"revoked": service.revoke_principal(name)}

    @app.post("/v1/grants", status_code=201)
    def grant(body: GrantBody, request: Request, who: Principal = Depends(curator)) -> dict[str, Any]:
        _note(request, action="grant", dataset=body.dataset[:100], analyst=body.analyst[:100], budget_epsilon=body.epsilon, budget_delta=body.delta)
        granted = service.grant(body.analyst, body.dataset, epsilon=body.epsilon, delta=body.delta, actor=who.name)
        _note(request, recorded_in_transaction=True)  # the grant's entry was written with the budget
        return budget_dict(granted)

    @app.get("/v1/spending")
    def spending(request: Request, who: Principal = Depends(curator)) -> dict[str, Any]:
        _note(request, action="spending")
        return {"series": service.spending()}

    @app.get("/v1/audit")
    def audit(request: Request, after: int = _AFTER, limit: int = _PAGE, newest: bool = False, who: Principal = Depends(curator)) -> dict[str, Any]:
        _note(request, action="read_audit")
        entries = service.audit_entries(after=after, limit=limit, newest=newest)
        return {"entries": [e.to_dict() for e in entries]}

    @app.get("/v1/audit/verify")
    def audit_verify(request: Request, head: str | None = Query(None, max_length=128), who: Principal = Depends(curator)) -> dict[str, Any]:
        _note(request, action="verify_log")
        try:
            report = service.verify_log(head=head)
        except LedgerError as exc:
            # A failed verification is the answer, not a server error: say which entry broke.
            _note(request, outcome=f"verification failed: {exc}")
            return {"ok": False, "error": str(exc)}
        # (verify_log fails on any spend without its entry: a verified log has none unlogged)
        return {"ok": True, "entries": report.entries, "head": report.head, "unlogged_spends": []}

    @app.get("/v1/refusals")
    def refused(request: Request, who: Principal = Depends(curator)) -> dict[str, Any]:
        """Requests refused before authentication (401, and 429 for a throttled address), per
        hour and reason: counted, not chained in the audit log."""
        _note(request, action="read_refusals")
        return {"refusals": [c.to_dict() for c in refusals.counts()]}

    # -- the dashboard (static: it holds no data; everything it shows comes from /v1 with a key) --

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    def dashboard() -> HTMLResponse:
        return HTMLResponse(_asset("index.html"), headers=_SECURITY_HEADERS)

    @app.get("/dashboard/{asset}", include_in_schema=False)
    def dashboard_asset(asset: str) -> Response:
        # Only the files the package ships, by exact name: nothing from the path reaches the
        # file system.
        kind = assets.get(asset)
        if kind is None:
            return JSONResponse({"error": {"code": "not_found", "message": "no such asset"}}, status_code=404)
        return Response(_asset(asset), media_type=kind, headers=_SECURITY_HEADERS)

    # Outermost last: _Edge (address throttle, authentication; its refusals are counted, not
    # chained) → _AuditLog (one chained entry per authenticated request) → _Throttle (the
    # principal's rate) → _BodyLimit (size, deadline, UTF-8/JSON checks) → the application.
    app.add_middleware(_BodyLimit, limit=cfg.max_body_bytes, timeout=cfg.body_timeout)
    app.add_middleware(_Throttle, limiter=limiter)
    app.add_middleware(_AuditLog, service=service)
    app.add_middleware(_Edge, service=service, addresses=addresses, refusals=refusals)
    return app


_SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; connect-src 'self'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


def _asset(name: str) -> str:
    return resources.files("dpkit.server").joinpath("dashboard", name).read_text(encoding="utf-8")


_ASSET_KINDS = {".js": "text/javascript", ".css": "text/css", ".svg": "image/svg+xml"}


def _asset_names() -> dict[str, str]:
    """The dashboard's files (name → media type): the only names ``/dashboard/`` serves."""
    out = {}
    for item in resources.files("dpkit.server").joinpath("dashboard").iterdir():
        kind = _ASSET_KINDS.get(Path(item.name).suffix)
        if kind is not None and item.is_file():
            out[item.name] = kind
    return out


def _server_secrets(url: str) -> tuple[tuple[str, str], ...]:
    """Where the service keeps its state, as it could appear in an error's text, longest first,
    with what to say instead."""
    found = {url: "<ledger>", masked_url(url): "<ledger>"}
    if url.startswith("sqlite:///"):
        path = sqlite_path(url)
        found[str(path)] = "<ledger>"
        found[str(path.parent)] = "<server directory>"
    return tuple(sorted(((k, x) for k, x in found.items() if len(k) > 1), key=lambda kv: -len(kv[0])))


def _own_budget(service: Service, who: Principal, dataset: str) -> dict[str, Any] | None:
    try:
        return budget_dict(service.ledger.get_budget(dataset, who.name))
    except (LedgerError, InvalidParameterError):
        return None


def _history_item(entry: dict[str, Any]) -> dict[str, Any]:
    detail = entry.get("detail", {})
    return {
        "seq": entry["seq"],
        "at": entry["at"],
        "action": entry["action"],
        "dataset": entry["dataset"],
        "status": entry["status"],
        "outcome": entry["outcome"],
        "epsilon": _amount(entry["epsilon"]),
        "delta": _amount(entry["delta"]),
        "query": detail.get("query"),
        "analyst": entry["actor"],
    }


def _amount(text: str | None) -> float | None:
    return None if text is None else float(Fraction(text))

