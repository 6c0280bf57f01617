"""The service's error answers as the errors a local session raises.

The curator service answers every error as ``{"error": {"code": ..., "message": ..., ...}}``
(:mod:`dpkit.server.problems`). :func:`error_from_problem` turns one into the
:mod:`dpkit.errors` class the same mistake raises in a local :class:`dpkit.analytics.Session`
(``budget_exceeded`` → :class:`~dpkit.errors.BudgetExceededError`, ``invalid_request`` →
:class:`~dpkit.errors.InvalidParameterError`, ...), with the service's message unchanged, so code
that handles a local session's errors handles a remote one's. Every error raised from an answer
also carries the answer: ``.problem`` (the ``error`` object, with fields such as ``parameter``,
``spend_id`` or the ``budget`` left) and ``.status`` (the HTTP status).

Codes without a local counterpart (``rate_limited``, ``internal_error``, ``too_large``, the
``Idempotency-Key`` refusals) are :class:`ServiceError`; a service that cannot be reached, after
the retries, is :class:`ConnectionFailedError`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dpkit.errors import (
    AuthError,
    BudgetExceededError,
    DPError,
    InvalidParameterError,
    LedgerError,
    LimitExceededError,
    QueryFailedError,
)
from dpkit.server.errors import DatasetUnavailableError, NotFoundError

__all__ = ["ServiceError", "ConnectionFailedError", "error_from_problem"]


class ServiceError(DPError):
    """An error answer of the curator service that no local session raises (``rate_limited``,
    ``internal_error``, ``too_large``, ...): ``status`` and ``code`` as the service sent them,
    ``problem`` the whole ``error`` object. The message is the service's."""

    def __init__(self, message: str, *, status: int | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.problem: dict[str, Any] = {}


class ConnectionFailedError(ServiceError):
    """The service could not be reached, or gave no complete answer, after every retry (the
    connection dropped or timed out, a proxy answered 502 or 504, or the first request under the
    same key was still being computed). A paid request may have been paid for: its tries carried
    one ``Idempotency-Key``, so sending it again under that key (``idempotency_key``) gets the
    first answer without a second debit."""

    def __init__(self, message: str, *, idempotency_key: str | None = None) -> None:
        super().__init__(message, code="connection_failed")
        self.idempotency_key = idempotency_key


def _attach(exc: DPError, status: int, problem: Mapping[str, Any]) -> DPError:
    """``exc`` with the service's message as its text and the answer on it (``problem``,
    ``status``). The message is the service's own, word for word: a local error's constructor
    would rebuild it from fields the answer does not all carry."""
    exc.args = (str(problem.get("message", "")),)
    vars(exc).update(problem=dict(problem), status=status)
    return exc


def _budget_parts(message: str) -> tuple[str, str]:
    """(requested, remaining) of a ``privacy budget exceeded: requested ..., remaining ...``
    message (the query text inside "requested" may itself hold ", remaining": split at the last)."""
    body = message.removeprefix("privacy budget exceeded: requested ")
    requested, sep, remaining = body.rpartition(", remaining ε=")
    if not sep:
        return body, ""
    return requested, "ε=" + remaining


def error_from_problem(status: int, problem: Mapping[str, Any]) -> DPError:
    """The :mod:`dpkit.errors` error of an error answer: ``status`` its HTTP status, ``problem``
    its ``error`` object (``code``, ``message`` and the code's own fields)."""
    code = str(problem.get("code", ""))
    message = str(problem.get("message", ""))
    parameter = problem.get("parameter")
    name = str(parameter) if parameter is not None else "request"
    exc: DPError
    if code == "budget_exceeded":
        exc = BudgetExceededError(*_budget_parts(message))
    elif code == "limit_exceeded":
        limit = problem.get("limit")
        exc = LimitExceededError(
            name, None, limit if isinstance(limit, (int, float)) else 0, str(problem.get("setting", ""))
        )
    elif code == "invalid_request":
        exc = InvalidParameterError(name, None, "")
    elif code == "not_found":
        exc = NotFoundError(message)
    elif code in ("unauthenticated", "forbidden"):
        exc = AuthError(message)
    elif code == "query_failed":
        spend_id = problem.get("spend_id")
        exc = QueryFailedError(spend_id if isinstance(spend_id, int) else None)
    elif code == "dataset_unavailable":
        exc = DatasetUnavailableError()
    elif code == "ledger_unavailable":
        exc = LedgerError(message)
    else:
        exc = ServiceError(message, status=status, code=code or None)
    return _attach(exc, status, problem)
