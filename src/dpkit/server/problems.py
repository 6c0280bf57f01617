"""Errors over HTTP: one JSON shape, ``{"error": {"code": ..., "message": ..., ...}}``, and the
facts each request adds to its audit entry.

Every answer that is not a result goes through :func:`problem_response`: its message is
scrubbed of the server's own paths and URLs, and its outcome is noted for the request's audit
entry. The status of each error is listed in :mod:`dpkit.server.app`; the error shape follows
the spirit of RFC 9457 ("Problem Details for HTTP APIs") with the fields nested under
``error``.
"""

from __future__ import annotations

import logging
from collections.abc import MutableMapping
from typing import Any

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
from dpkit.server import edge
from dpkit.server.errors import DatasetUnavailableError, NotFoundError

try:
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse
    from starlette.exceptions import HTTPException as StarletteHTTPException
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise ImportError("the dpkit server needs FastAPI and uvicorn: pip install 'dpkit[server]'") from exc

__all__ = ["Problem", "problem_response", "query_failed", "note", "note_scope", "install_handlers"]

_curator_log = logging.getLogger("dpkit.curator")


class Problem(Exception):
    """An error answer: the status, the ``code``, the message and any ``extra`` fields."""

    def __init__(
        self, status: int, code: str, message: str, *, headers: dict[str, str] | None = None, **extra: Any
    ) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.headers, self.extra = status, code, message, headers, extra


def problem_response(request: Request, p: Problem) -> JSONResponse:
    message = _scrub(request.scope, p.message)
    note(request, outcome=f"{p.code}: {message}")
    return JSONResponse(
        {"error": {"code": p.code, "message": message, **p.extra}}, status_code=p.status, headers=p.headers
    )


def _scrub(scope: MutableMapping[str, Any], message: str) -> str:
    """``message`` without the server's own paths and URLs (the ledger's URL, file and
    directory): no error sent over HTTP names where the service keeps its state."""
    app = scope.get("app")
    for secret, label in getattr(getattr(app, "state", None), "secrets", ()):
        if secret in message:
            message = message.replace(secret, label)
    return message


def _limit_exceeded(exc: LimitExceededError) -> Problem:
    return Problem(400, "limit_exceeded", str(exc), parameter=exc.name, limit=exc.limit, setting=exc.setting)


def query_failed(spend_id: int | None) -> Problem:
    """The one answer to a query that failed: the fixed message and the spend id, nothing else."""
    return Problem(500, "query_failed", QueryFailedError.MESSAGE, spend_id=spend_id)


def _from_dp_error(exc: DPError) -> Problem:
    if isinstance(exc, QueryFailedError):
        return query_failed(exc.spend_id)
    if isinstance(exc, DatasetUnavailableError):
        return Problem(503, "dataset_unavailable", DatasetUnavailableError.MESSAGE)
    if isinstance(exc, LimitExceededError):
        return _limit_exceeded(exc)
    if isinstance(exc, InvalidParameterError):
        return Problem(400, "invalid_request", str(exc), parameter=exc.name)
    if isinstance(exc, InvalidDataError):
        return Problem(400, "invalid_request", str(exc), parameter=exc.name)
    if isinstance(exc, NotFoundError):
        return Problem(404, "not_found", str(exc))
    if isinstance(exc, AuthError):
        return Problem(403, "forbidden", str(exc))
    if isinstance(exc, BudgetExceededError):
        return Problem(409, "budget_exceeded", str(exc))
    if isinstance(exc, LedgerError):
        return Problem(503, "ledger_unavailable", "the ledger could not be used; nothing was released")
    return Problem(400, "invalid_request", str(exc))


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


def note(request: Request, **fields: Any) -> None:
    """Add facts to this request's audit entry (text made printable: whatever an analyst sent
    can be stored and encoded)."""
    note_scope(request.scope, **fields)


def note_scope(scope: MutableMapping[str, Any], **fields: Any) -> None:
    clean = {k: edge.printable(x, 4096) if isinstance(x, str) else x for k, x in fields.items()}
    scope.setdefault("state", {}).setdefault("audit", {}).update(clean)


# -- exception handlers ----------------------------------------------------------------------------


async def _on_problem(request: Request, exc: Problem) -> JSONResponse:
    return problem_response(request, exc)


async def _on_dp_error(request: Request, exc: DPError) -> JSONResponse:
    return problem_response(request, _from_dp_error(exc))


async def _on_invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
    message, parameter = _validation_message(exc)
    content_type = request.headers.get("content-type", "")
    if parameter in (None, "body") and "json" not in content_type.lower():
        # Without the header the body is not read as JSON at all (curl -d sends a form); say so
        # rather than "Input should be a valid dictionary".
        shown = edge.printable(content_type, 80) if content_type else "none"
        message = f"the body must be a JSON object sent with Content-Type: application/json (this request's: {shown})"
        parameter = "Content-Type"
    return problem_response(request, Problem(400, "invalid_request", message, parameter=parameter))


async def _on_http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    # No route matched (404) or not with this method (405): the same error shape as the rest.
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "invalid_request")
    message = {404: "no such endpoint", 405: "this endpoint does not accept this method"}.get(
        exc.status_code, str(exc.detail)
    )
    return problem_response(request, Problem(exc.status_code, code, message, headers=getattr(exc, "headers", None)))


async def _on_too_deep(request: Request, exc: RecursionError) -> JSONResponse:
    # Whatever recursed without bound was fed by the request: refuse it as too deep.
    _curator_log.warning("a request to %s recursed too deeply", edge.printable(request.url.path, 200))
    return problem_response(
        request, Problem(400, "invalid_request", "the request is nested too deeply to be processed", parameter="body")
    )


async def _on_unexpected(request: Request, exc: Exception) -> JSONResponse:
    # (Starlette's outermost layer: the audit entry was already written, with status 500.)
    _curator_log.error("unexpected error in %s %s", request.method, request.url.path[:200], exc_info=exc)
    return JSONResponse(
        {"error": {"code": "internal_error", "message": "internal error (the curator's log has the details)"}},
        status_code=500,
    )


def install_handlers(app: FastAPI) -> None:
    """Answer every error raised by a route or by FastAPI itself in the one JSON shape."""
    app.add_exception_handler(Problem, _on_problem)  # type: ignore[arg-type]
    app.add_exception_handler(DPError, _on_dp_error)  # type: ignore[arg-type]
    app.add_exception_handler(RequestValidationError, _on_invalid)  # type: ignore[arg-type]
    app.add_exception_handler(StarletteHTTPException, _on_http)  # type: ignore[arg-type]
    app.add_exception_handler(RecursionError, _on_too_deep)  # type: ignore[arg-type]
    app.add_exception_handler(Exception, _on_unexpected)
