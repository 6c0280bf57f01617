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
409   idempotency_key_in_progress
                             a paid request with this ``Idempotency-Key`` is still in
                             progress (``Retry-After``; nothing spent)
413   too_large              the request body exceeds the limit
422   idempotency_key_reused
                             the ``Idempotency-Key`` was used for a different request to this
                             endpoint (nothing spent)
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
every failure after it is the one fixed ``query_failed`` answer (see :mod:`dpkit.server.queries`). The
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
UTF-8/JSON checks (:mod:`dpkit.server.edge`), then the endpoint (:mod:`dpkit.server.middleware`).
Slow clients are cut off by the server's protocol (:mod:`dpkit.server.serving`).

The routes live in :mod:`dpkit.server.routes`, one router per resource; their errors are
answered by :mod:`dpkit.server.problems`. This module holds the settings and assembles the app.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields
from typing import Any

from dpkit import _validate as v
from dpkit.analytics.limits import QueryLimits
from dpkit.errors import InvalidParameterError
from dpkit.noise.source import RNG
from dpkit.server.refusals import AddressLimiter, RefusalCounter, TokenBuckets
from dpkit.server.service import Service, check_service_rng
from dpkit.server.store import masked_url, sqlite_path

try:
    from fastapi import APIRouter, FastAPI
    from fastapi.routing import APIRoute

    from dpkit.server.idempotency import IdempotencyKeys
    from dpkit.server.middleware import AuditMiddleware, BodyLimitMiddleware, EdgeMiddleware, ThrottleMiddleware
    from dpkit.server.pacing import AnswerTimes, Pacer, SynthLimits
    from dpkit.server.problems import install_handlers
    from dpkit.server.routes import ROUTERS
    from dpkit.server.routes.datasets import DatasetBody as DatasetBody
    from dpkit.server.routes.grants import GrantBody as GrantBody
    from dpkit.server.routes.principals import AnalystBody as AnalystBody
    from dpkit.server.routes.queries import AggregateBody as AggregateBody
    from dpkit.server.routes.queries import QueryBody as QueryBody
    from dpkit.server.routes.queries import SpecBody as SpecBody
    from dpkit.server.serving import ServingLimits, check_limits
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise ImportError("the dpkit server needs FastAPI and uvicorn: pip install 'dpkit[server]'") from exc

__all__ = ["ServerConfig", "create_app"]


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
    one query (None: one per core); ``spark_master`` and ``spark_conf`` the SparkSession that
    reads Spark datasets (one per server process; None: a local one); ``max_keys``, ``max_result_rows``,
    ``max_response_bytes`` and ``max_query_depth`` are the
    :class:`~dpkit.analytics.limits.QueryLimits` of every query.

    Idempotency keys of paid requests (:mod:`dpkit.server.idempotency`): each principal's are
    kept ``idempotency_seconds`` (24 h) after their claim, at most ``max_idempotency_keys`` of
    them (the oldest answered dropped first).
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
    spark_master: str | None = None
    spark_conf: dict[str, str] | None = None
    max_keys: int = _LIMITS.max_keys
    max_result_rows: int = _LIMITS.max_result_rows
    max_response_bytes: int = _LIMITS.max_response_bytes
    max_query_depth: int = _LIMITS.max_query_depth
    # Fixed-time answers and the heavy pool (dpkit.server.pacing).
    answer_seconds: float = 0.5
    synth_seconds: float = 60.0
    heavy_threads: int = 64
    # Per principal, refused before payment.
    max_concurrent: int = 8
    cpu_seconds_per_hour: float = 3600.0
    max_release_bytes: int = 64 * 1024 * 1024
    downloads_per_hour: int = 600
    # Synthesis limits.
    max_synth_rounds: int = 100
    max_synth_cells: int = 1_000_000
    # Connections (dpkit.server.serving).
    write_timeout: float = 30.0
    max_connections_per_address: int = 64
    # Idempotency keys of paid requests (dpkit.server.idempotency): kept this long, this many
    # per principal.
    idempotency_seconds: float = 86_400.0
    max_idempotency_keys: int = 1000

    def __post_init__(self) -> None:
        for name in (
            "rate",
            "address_rate",
            "max_grant_epsilon",
            "answer_seconds",
            "synth_seconds",
            "cpu_seconds_per_hour",
            "write_timeout",
            "idempotency_seconds",
        ):
            v.positive(getattr(self, name), name)
        for name in (
            "burst",
            "address_burst",
            "max_addresses",
            "heavy_threads",
            "max_concurrent",
            "max_release_bytes",
            "downloads_per_hour",
            "max_synth_rounds",
            "max_synth_cells",
            "max_idempotency_keys",
        ):
            v.positive_int(getattr(self, name), name)
        v.positive_int(self.max_body_bytes, "max_body_bytes", minimum=1024)
        check_limits(**self.serving_limits())
        for name in ("data_root", "audit_key", "dataset_dir"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise InvalidParameterError(name, value, "a path, or None")
        if self.engine_threads is not None:
            v.positive_int(self.engine_threads, "engine_threads")
        from dpkit.analytics.engines.spark import check_spark_settings

        check_spark_settings(self.spark_master, self.spark_conf)
        self.limits()  # checks max_keys, max_result_rows, max_response_bytes, max_query_depth

    def limits(self) -> QueryLimits:
        """The per-query limits these settings name."""
        return QueryLimits(
            max_keys=self.max_keys,
            max_result_rows=self.max_result_rows,
            max_response_bytes=self.max_response_bytes,
            max_query_depth=self.max_query_depth,
        )

    def pacer(self, *, hold: bool = True) -> Pacer:
        """The heavy pool, the per-principal limits and the answers' clock these settings name."""
        return Pacer(
            AnswerTimes(self.answer_seconds, self.synth_seconds),
            threads=self.heavy_threads,
            max_concurrent=self.max_concurrent,
            cpu_seconds_per_hour=self.cpu_seconds_per_hour,
            synth_limits=SynthLimits(self.max_synth_rounds, self.max_synth_cells),
            hold=hold,
        )

    def serving_limits(self) -> ServingLimits:
        """The connection limits of these settings, as :func:`dpkit.server.serving.serve` takes them."""
        return {
            "header_timeout": self.header_timeout,
            "body_timeout": self.body_timeout,
            "max_connections": self.max_connections,
            "write_timeout": self.write_timeout,
            "max_connections_per_address": self.max_connections_per_address,
        }

    def service(self, *, rng: RNG = None) -> Service:
        """Open the service these settings describe."""
        return Service(
            self.ledger,
            rng=rng,
            data_root=self.data_root if self.data_root is not None else os.getcwd(),
            limits=self.limits(),
            max_grant_epsilon=self.max_grant_epsilon,
            audit_key=self.audit_key,
            dataset_dir=self.dataset_dir,
            engine_threads=self.engine_threads,
            spark_master=self.spark_master,
            spark_conf=self.spark_conf,
        )


def create_app(
    config: ServerConfig | Service | str | None = None, *, rng: RNG = None, _hold_answers: bool = True, **settings: Any
) -> FastAPI:
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
        raise InvalidParameterError(
            unknown[0], settings[unknown[0]], "a field of ServerConfig: " + ", ".join(sorted(known))
        )
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
    app.state.service = service  # what the routes' dependencies hand them (dpkit.server.routes.deps)
    app.state.config = cfg
    app.state.refusals = refusals
    app.state.secrets = _server_secrets(service.url)
    app.state.pacer = cfg.pacer(hold=_hold_answers)
    app.state.idempotency = IdempotencyKeys(
        service.store, max_keys=cfg.max_idempotency_keys, seconds=cfg.idempotency_seconds
    )
    app.router.add_event_handler("shutdown", refusals.flush)
    app.router.add_event_handler("shutdown", app.state.pacer.close)
    if owned:
        app.router.add_event_handler("shutdown", service.close)
    install_handlers(app)
    for router in ROUTERS:
        _include(app, router)

    # Outermost last: the edge (authentication of a well-formed key first, then the throttle of
    # addresses whose requests keep being refused; its refusals are counted, not chained) → the
    # audit entry (one chained entry per authenticated request) → the principal's rate (its 429s
    # counted, not chained) → the body (size, deadline, UTF-8/JSON checks) → the application.
    app.add_middleware(BodyLimitMiddleware, limit=cfg.max_body_bytes, timeout=cfg.body_timeout)
    app.add_middleware(ThrottleMiddleware, limiter=limiter, refusals=refusals)
    app.add_middleware(AuditMiddleware, service=service)
    app.add_middleware(EdgeMiddleware, service=service, addresses=addresses, refusals=refusals)
    return app


def _include(app: FastAPI, router: APIRouter) -> None:
    """Add ``router``'s routes to the application's own table, each built again by the
    application (its settings: strict content types, dependency overrides), as a route declared
    on the application would be. ``app.routes`` then lists every route, whatever the FastAPI
    version (newer ones keep an included router as one nested entry)."""
    for route in router.routes:
        assert isinstance(route, APIRoute), f"{route!r}: only API routes are declared in dpkit.server.routes"
        app.router.add_api_route(
            route.path,
            route.endpoint,
            methods=sorted(route.methods or ()),
            status_code=route.status_code,
            name=route.name,
            include_in_schema=route.include_in_schema,
            response_class=route.response_class,
        )


def _server_secrets(url: str) -> tuple[tuple[str, str], ...]:
    """Where the service keeps its state, as it could appear in an error's text, longest first,
    with what to say instead."""
    found = {url: "<ledger>", masked_url(url): "<ledger>"}
    if url.startswith("sqlite:///"):
        path = sqlite_path(url)
        found[str(path)] = "<ledger>"
        found[str(path.parent)] = "<server directory>"
    return tuple(sorted(((k, x) for k, x in found.items() if len(k) > 1), key=lambda kv: -len(kv[0])))
