"""The HTTP API of the curator service (FastAPI), and its web dashboard.

Every ``/v1`` endpoint needs an API key (``Authorization: Bearer dpk_...`` or ``X-API-Key``):
none, malformed, unknown or revoked → **401**; a key of the wrong role → **403**. Errors are JSON
``{"error": {"code": ..., "message": ..., ...}}`` with these statuses:

====  =====================  ===========================================================
400   invalid_request        malformed JSON, unknown fields, a bad parameter (named), SQL
                             outside the subset, an unknown column
401   unauthenticated        no valid key
403   forbidden              the key's role may not call this endpoint
404   not_found              unknown dataset (or one the analyst was not granted), analyst, key
409   budget_exceeded        the query's cost exceeds the remaining budget (nothing debited,
                             nothing released); the body holds the remaining budget
413   too_large              the request body exceeds the limit
429   rate_limited           too many requests from this principal (``Retry-After`` header)
500   query_failed           a query failed after its debit (the spend stands; the body holds
                             only the fixed message and the ``spend_id``), or anything else
                             failed unexpectedly in a query (``spend_id`` null)
500   internal_error         any other unexpected failure (a fixed message)
503   ledger_unavailable     the ledger could not be read or written (nothing released)
503   dataset_unavailable    the dataset's source can no longer be opened (nothing spent)
====  =====================  ===========================================================

No answer to an analyst ever carries an engine's message, a file path, a traceback or a data
value: refusals before the debit are decided on the request and the declared metadata only, and
every failure after it is the one fixed ``query_failed`` answer (DESIGN core idea 1). The
details go to the curator's log (the ``dpkit.curator`` logger). The curator alone sees the data
check made when a dataset is registered (``POST /v1/datasets`` answers it under ``check``).

Before any response leaves the service, one entry — who, what, the cost, the status and the
outcome — is appended to the hash-chained audit log (so an answer is never sent unlogged; a
debit made just before a crash, with no answer sent, shows in ``dpkit admin verify-log``).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass
from fractions import Fraction
from importlib import resources
from typing import Any, Literal

from dpkit.errors import AuthError, BudgetExceededError, DPError, InvalidDataError, InvalidParameterError, LedgerError, QueryFailedError
from dpkit.noise.source import RNG
from dpkit.server.keys import key_id
from dpkit.server.service import (
    DatasetUnavailableError,
    NotFoundError,
    PaidQueryFailedError,
    Principal,
    QueryRequest,
    QuerySpec,
    Service,
    budget_dict,
    check_service_rng,
)

try:
    from fastapi import Depends, FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import HTMLResponse, JSONResponse, Response
    from pydantic import BaseModel, ConfigDict, Field
    from starlette.concurrency import run_in_threadpool
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise ImportError("the dpkit server needs FastAPI and uvicorn: pip install 'dpkit[server]'") from exc

__all__ = ["ServerConfig", "create_app"]

_curator_log = logging.getLogger("dpkit.curator")


@dataclass(frozen=True)
class ServerConfig:
    """How the service runs.

    ``rate`` and ``burst``: each principal may make ``burst`` requests at once and ``rate`` per
    second on average (a token bucket per server process); ``max_body_bytes``: the largest
    request body accepted.
    """

    ledger: str = "sqlite:///.dpkit/ledger.sqlite"
    rate: float = 20.0
    burst: int = 100
    max_body_bytes: int = 64 * 1024

    def __post_init__(self) -> None:
        if isinstance(self.rate, bool) or not isinstance(self.rate, (int, float)) or not (math.isfinite(self.rate) and self.rate > 0):
            raise InvalidParameterError("rate", self.rate, "a finite number of requests per second > 0")
        if isinstance(self.burst, bool) or not isinstance(self.burst, int) or self.burst < 1:
            raise InvalidParameterError("burst", self.burst, "an integer >= 1")
        if isinstance(self.max_body_bytes, bool) or not isinstance(self.max_body_bytes, int) or self.max_body_bytes < 1024:
            raise InvalidParameterError("max_body_bytes", self.max_body_bytes, "an integer >= 1024")


# ------------------------------------------------------------------------------------------------
# errors
# ------------------------------------------------------------------------------------------------


class _Problem(Exception):
    def __init__(self, status: int, code: str, message: str, *, headers: dict[str, str] | None = None, **extra: Any) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.headers, self.extra = status, code, message, headers, extra


def _problem_response(request: Request, p: _Problem) -> JSONResponse:
    _note(request, outcome=f"{p.code}: {p.message}")
    return JSONResponse({"error": {"code": p.code, "message": p.message, **p.extra}}, status_code=p.status, headers=p.headers)


def _query_failed(spend_id: int | None) -> _Problem:
    """The one answer to a query that failed: the fixed message and the spend id, nothing else."""
    return _Problem(500, "query_failed", QueryFailedError.MESSAGE, spend_id=spend_id)


def _from_dp_error(exc: DPError) -> _Problem:
    if isinstance(exc, QueryFailedError):
        return _query_failed(exc.spend_id)
    if isinstance(exc, DatasetUnavailableError):
        return _Problem(503, "dataset_unavailable", DatasetUnavailableError.MESSAGE)
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
    loc = [str(x) for x in first.get("loc", ()) if x != "body"]
    where = ".".join(loc) or "body"
    if first.get("type") == "json_invalid":
        return f"the body is not valid JSON ({first.get('ctx', {}).get('error', 'parse error')})", None
    if first.get("type") == "extra_forbidden":
        return f"unknown field {where!r}", where
    if first.get("type") == "missing":
        return f"missing field {where!r}", where
    return f"{where}: {first.get('msg', 'invalid')}", where


def _note(request: Request, **fields: Any) -> None:
    """Add facts to this request's audit entry."""
    state = request.scope.setdefault("state", {})
    state.setdefault("audit", {}).update(fields)


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
                await run_in_threadpool(self._log, scope, int(message["status"]))
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
        action = facts.pop("action", f"{scope['method']} {scope['path'][:200]}")
        outcome = facts.pop("outcome", "ok" if status < 400 else "error")
        self.service.audit(
            actor=facts.pop("actor", None),
            action=action,
            status=status,
            outcome=str(outcome)[:1000],
            dataset=facts.pop("dataset", None),
            epsilon=facts.pop("epsilon", None),
            delta=facts.pop("delta", None),
            detail=facts,
        )


class _BodyLimit:
    """Read at most ``limit`` bytes of a body; a larger one gets 413 before the app sees it."""

    def __init__(self, app: Any, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS"):
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        declared = headers.get(b"content-length")
        too_big = declared is not None and (not declared.isdigit() or int(declared) > self.limit)
        body = bytearray()
        more = not too_big
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > self.limit:
                too_big = True
                break
        if too_big:
            scope.setdefault("state", {}).setdefault("audit", {})["outcome"] = f"too_large: body over {self.limit} bytes"
            response = JSONResponse(
                {"error": {"code": "too_large", "message": f"the request body exceeds {self.limit} bytes"}}, status_code=413
            )
            await response(scope, receive, send)
            return
        replayed = False

        async def replay() -> dict[str, Any]:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": bytes(body), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


class _RateLimiter:
    """A token bucket per principal: ``burst`` requests at once, ``rate`` per second after."""

    def __init__(self, rate: float, burst: int) -> None:
        self.rate, self.burst = float(rate), float(burst)
        self._buckets: dict[str, tuple[float, float]] = {}
        self._lock = threading.Lock()

    def take(self, who: str) -> float:
        """0 if the request may go ahead, else the seconds to wait."""
        t = time.monotonic()
        with self._lock:
            tokens, last = self._buckets.get(who, (self.burst, t))
            tokens = min(self.burst, tokens + (t - last) * self.rate)
            if tokens >= 1.0:
                self._buckets[who] = (tokens - 1.0, t)
                return 0.0
            self._buckets[who] = (tokens, t)
            return (1.0 - tokens) / self.rate


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


def _key_from(request: Request) -> str | None:
    auth = request.headers.get("authorization")
    if auth is not None:
        scheme, _, value = auth.partition(" ")
        return value.strip() if scheme.lower() == "bearer" else None
    return request.headers.get("x-api-key")


def create_app(config: ServerConfig | Service | str | None = None, *, rng: RNG = None, rate: float | None = None, burst: int | None = None, max_body_bytes: int | None = None) -> FastAPI:
    """The FastAPI application: the ``/v1`` API and the dashboard at ``/``.

    ``config`` is a :class:`ServerConfig`, a ledger URL, or an open :class:`Service` (which the
    caller keeps and closes). ``rng`` accepts only None or a
    :class:`~dpkit.noise.source.SecureSource`: a seeded generator is refused (see :class:`Service`).
    """
    check_service_rng(rng)
    if isinstance(config, Service):
        service, owned = config, False
        cfg = ServerConfig(ledger=service.url)
    else:
        cfg = config if isinstance(config, ServerConfig) else ServerConfig(ledger=config or ServerConfig.ledger)
        service, owned = Service(cfg.ledger, rng=rng), True
    overrides = {k: x for k, x in (("rate", rate), ("burst", burst), ("max_body_bytes", max_body_bytes)) if x is not None}
    if overrides:
        cfg = ServerConfig(**{**cfg.__dict__, **overrides})
    limiter = _RateLimiter(cfg.rate, cfg.burst)

    # No /docs: Swagger UI loads scripts from a CDN. The OpenAPI schema (no data) stays public.
    app = FastAPI(title="dpkit curator", version="1", docs_url=None, redoc_url=None, openapi_url="/openapi.json")
    app.state.service = service
    app.state.config = cfg
    if owned:
        app.router.add_event_handler("shutdown", service.close)

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

    @app.exception_handler(Exception)
    async def _on_unexpected(request: Request, exc: Exception) -> JSONResponse:
        # (Starlette's outermost layer: the audit entry was already written, with status 500.)
        _curator_log.error("unexpected error in %s %s", request.method, request.url.path[:200], exc_info=exc)
        return JSONResponse({"error": {"code": "internal_error", "message": "internal error (the curator's log has the details)"}}, status_code=500)

    # -- authentication -------------------------------------------------------------------------

    def principal(request: Request) -> Principal:
        try:
            who = service.authenticate(_key_from(request))
        except AuthError as exc:
            raise _Problem(401, "unauthenticated", str(exc), headers={"WWW-Authenticate": "Bearer"}) from None
        _note(request, actor=who.name, key_id=who.key_id)
        wait = limiter.take(who.name)
        if wait > 0:
            raise _Problem(429, "rate_limited", f"too many requests from {who.name!r}; retry in {wait:.2f} s", headers={"Retry-After": str(max(1, math.ceil(wait)))})
        return who

    def curator(who: Principal = Depends(principal)) -> Principal:
        if who.role != "curator":
            raise _Problem(403, "forbidden", f"this endpoint is for the curator; {who.name!r} is an {who.role}")
        return who

    def analyst(who: Principal = Depends(principal)) -> Principal:
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
        _note(request, action="get_dataset", dataset=name[:100])
        return service.dataset(name, who).public()

    @app.get("/v1/budgets")
    def list_budgets(request: Request, who: Principal = Depends(principal)) -> dict[str, Any]:
        _note(request, action="list_budgets")
        return {"budgets": [budget_dict(b) for b in service.budgets(who)]}

    @app.get("/v1/history")
    def history(
        request: Request, analyst_name: str | None = None, after: int = 0, limit: int = 200, newest: bool = False, who: Principal = Depends(principal)
    ) -> dict[str, Any]:
        _note(request, action="history")
        if who.role == "analyst":
            if analyst_name not in (None, who.name):
                raise _Problem(403, "forbidden", "analysts see only their own history")
            analyst_name = who.name
        entries = service.audit_entries(actor=analyst_name, actions=["query", "cost"], after=max(0, after), limit=min(max(1, limit), 1000), newest=newest)
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
            answer = service.query(who, name, req)
        except BudgetExceededError as exc:
            raise _Problem(409, "budget_exceeded", str(exc), budget=_own_budget(service, who, name)) from None
        except PaidQueryFailedError as exc:
            # The debit stands: the audit entry records it (so it is not an unlogged spend).
            _note(request, epsilon=exc.cost.epsilon, delta=exc.cost.delta, spend_id=exc.spend_id)
            raise _query_failed(exc.spend_id) from None
        _note(request, epsilon=answer["cost"]["epsilon"], delta=answer["cost"]["delta"], spend_id=answer.get("spend_id"))
        return answer

    def _guarded(request: Request, name: str, body: QueryBody, who: Principal, *, preview: bool) -> Any:
        """A query's only answers: the result, a refusal decided before the debit on the request
        and the declared metadata, or the fixed ``query_failed``. Anything unexpected (and an
        InvalidDataError, which can no longer arise in the query path and may quote the data)
        becomes ``query_failed`` too — never a traceback or the exception's text."""
        try:
            return _run(request, name, body, who, preview=preview)
        except (_Problem, InvalidParameterError, NotFoundError, AuthError, BudgetExceededError, LedgerError, DatasetUnavailableError, QueryFailedError):
            raise
        except Exception as exc:
            _curator_log.error("query on %r by %r failed unexpectedly", name[:100], who.name, exc_info=exc)
            raise _query_failed(None) from None

    @app.post("/v1/datasets/{name}/query")
    def query(name: str, body: QueryBody, request: Request, who: Principal = Depends(analyst)) -> Any:
        return _guarded(request, name, body, who, preview=False)

    @app.post("/v1/datasets/{name}/query/cost")
    def query_cost(name: str, body: QueryBody, request: Request, who: Principal = Depends(analyst)) -> Any:
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
        _note(request, action="issue_key", name=name[:100])
        key = service.issue_key(name)
        return {"name": name, "key_id": key_id(key), "key": key, "note": "the key is shown once; only its hash is stored"}

    @app.post("/v1/keys/{target}/revoke")
    def revoke(target: str, request: Request, who: Principal = Depends(curator)) -> dict[str, Any]:
        _note(request, action="revoke", target=target[:100])
        return {"revoked": service.revoke(target)}

    @app.post("/v1/grants", status_code=201)
    def grant(body: GrantBody, request: Request, who: Principal = Depends(curator)) -> dict[str, Any]:
        _note(request, action="grant", dataset=body.dataset[:100], analyst=body.analyst[:100], budget_epsilon=body.epsilon, budget_delta=body.delta)
        return budget_dict(service.grant(body.analyst, body.dataset, epsilon=body.epsilon, delta=body.delta))

    @app.get("/v1/spending")
    def spending(request: Request, who: Principal = Depends(curator)) -> dict[str, Any]:
        _note(request, action="spending")
        return {"series": service.spending()}

    @app.get("/v1/audit")
    def audit(request: Request, after: int = 0, limit: int = 200, newest: bool = False, who: Principal = Depends(curator)) -> dict[str, Any]:
        _note(request, action="read_audit")
        entries = service.audit_entries(after=max(0, after), limit=min(max(1, limit), 1000), newest=newest)
        return {"entries": [e.to_dict() for e in entries]}

    @app.get("/v1/audit/verify")
    def audit_verify(request: Request, head: str | None = None, who: Principal = Depends(curator)) -> dict[str, Any]:
        _note(request, action="verify_log")
        try:
            report = service.verify_log(head=head)
        except LedgerError as exc:
            # A failed verification is the answer, not a server error: say which entry broke.
            _note(request, outcome=f"verification failed: {exc}")
            return {"ok": False, "error": str(exc)}
        return {"ok": True, "entries": report.entries, "head": report.head, "unlogged_spends": service.unlogged_spends()}

    # -- the dashboard (static: it holds no data; everything it shows comes from /v1 with a key) --

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    def dashboard() -> HTMLResponse:
        return HTMLResponse(_asset("index.html"), headers=_SECURITY_HEADERS)

    @app.get("/dashboard/{asset}", include_in_schema=False)
    def dashboard_asset(asset: str) -> Response:
        kinds = {".js": "text/javascript", ".css": "text/css", ".svg": "image/svg+xml"}
        kind = next((k for ext, k in kinds.items() if asset.endswith(ext)), None)
        if kind is None or "/" in asset or asset.startswith("."):
            return JSONResponse({"error": {"code": "not_found", "message": "no such asset"}}, status_code=404)
        try:
            return Response(_asset(asset), media_type=kind, headers=_SECURITY_HEADERS)
        except FileNotFoundError:
            return JSONResponse({"error": {"code": "not_found", "message": "no such asset"}}, status_code=404)

    app.add_middleware(_BodyLimit, limit=cfg.max_body_bytes)
    app.add_middleware(_AuditLog, service=service)
    return app


_SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; connect-src 'self'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


def _asset(name: str) -> str:
    return resources.files("dpkit.server").joinpath("dashboard", name).read_text(encoding="utf-8")


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

