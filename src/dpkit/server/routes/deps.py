"""The dependencies every route takes: the service, and the principal the edge authenticated.

They do no I/O (the middleware authenticated the key before the body was read): they are async,
so that FastAPI runs them on the event loop instead of sending each through the thread pool
(https://fastapi.tiangolo.com/async/#dependencies).
"""

from __future__ import annotations

from fastapi import Depends, Request

from dpkit.server.principals import Principal
from dpkit.server.problems import Problem
from dpkit.server.refusals import RefusalCounter
from dpkit.server.service import Service

__all__ = ["get_service", "get_refusals", "principal", "curator", "analyst"]


async def get_service(request: Request) -> Service:
    """The application's service (``app.state.service``, set by ``create_app``)."""
    return request.app.state.service


async def get_refusals(request: Request) -> RefusalCounter:
    """The counter of requests refused before authentication (``app.state.refusals``)."""
    return request.app.state.refusals


async def principal(request: Request) -> Principal:
    """The caller, authenticated (and throttled) by the middleware before the body was read."""
    who = request.scope.get("state", {}).get("principal")
    if not isinstance(who, Principal):
        raise Problem(
            401,
            "unauthenticated",
            "a valid API key is required (Authorization: Bearer dpk_...)",
            headers={"WWW-Authenticate": "Bearer"},
        )
    return who


async def curator(who: Principal = Depends(principal)) -> Principal:
    """The caller, who must be the curator (else 403)."""
    if who.role != "curator":
        raise Problem(403, "forbidden", f"this endpoint is for the curator; {who.name!r} is an {who.role}")
    return who


async def analyst(who: Principal = Depends(principal)) -> Principal:
    """The caller, who must be an analyst (else 403)."""
    if who.role != "analyst":
        raise Problem(403, "forbidden", f"this endpoint is for analysts; {who.name!r} is the {who.role}")
    return who
