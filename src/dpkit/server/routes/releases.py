"""``/v1/releases``: published synthetic tables; ``/v1/publishers``: who may publish them.

A release was paid for once, by the publisher (``publish`` in
``POST /v1/datasets/{name}/synthetic``); listing and downloading spend nothing. An analyst sees
and downloads only releases of datasets they were granted (any other is 404, like an ungranted
dataset), without who published them or what they cost; the curator sees all. A download is
streamed part by part (:class:`~dpkit.server.releases.Download`: about two stored parts of 64
KiB in memory per connection) after the principal's download allowance was charged
(:mod:`dpkit.server.allowance`). Each request is an entry of the audit log, like every
authenticated request, but a download refused for the allowance (429) is counted in the refusal
table instead; naming and un-naming a publisher is chained with the change itself.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import StreamingResponse

from dpkit.errors import InvalidParameterError
from dpkit.server.allowance import HourlyAllowance
from dpkit.server.middleware import UNCHAINED
from dpkit.server.names import check_principal_name
from dpkit.server.principals import Principal
from dpkit.server.problems import Problem, note
from dpkit.server.refusals import PRINCIPAL_RATE_LIMITED, RefusalCounter
from dpkit.server.routes.bodies import Body
from dpkit.server.routes.deps import curator, get_service, principal
from dpkit.server.service import Service

__all__ = ["router", "PublisherBody"]

router = APIRouter()
_allowances_lock = threading.Lock()
_curator_log = logging.getLogger("dpkit.curator")


class PublisherBody(Body):
    name: str


def _allowance(request: Request) -> HourlyAllowance:
    """This application's download allowances (``downloads_per_hour`` of its configuration)."""
    state = request.app.state
    with _allowances_lock:
        found = getattr(state, "download_allowance", None)
        if found is None:
            found = state.download_allowance = HourlyAllowance(
                state.config.downloads_per_hour, "downloads_per_hour", "downloads"
            )
    return found


def _count_refusal(request: Request, name: str) -> None:
    """A download over the allowance is a principal's own 429: counted in the refusal table,
    not chained (a flood of them must not grow the audit log; see :mod:`dpkit.server.refusals`)."""
    request.scope.setdefault("state", {})[UNCHAINED] = True
    refusals: RefusalCounter = request.app.state.refusals
    if refusals.add(f"{PRINCIPAL_RATE_LIMITED}:{name}"):
        try:
            refusals.flush()
        except Exception:  # the counts stay pending; the refusal itself must still be answered
            _curator_log.exception("the refusal counters could not be written")


@router.get("/v1/releases")
def list_releases(
    request: Request, who: Principal = Depends(principal), service: Service = Depends(get_service)
) -> dict[str, Any]:
    note(request, action="list_releases")
    full = who.role == "curator"
    return {"releases": [r.public(curator=full) for r in service.releases(who)]}


@router.get("/v1/releases/{name}")
def get_release(
    name: str,
    request: Request,
    format: str = Query("json", description="json (the rows and the measurement report) or csv (the rows)"),
    who: Principal = Depends(principal),
    service: Service = Depends(get_service),
) -> Any:
    note(request, action="get_release", release=name[:100])
    if format not in ("json", "csv"):
        raise InvalidParameterError("format", format[:20], "json or csv")
    download = service.release_download(name, who)
    try:
        _allowance(request).charge(who.name)
    except Problem:
        _count_refusal(request, who.name)
        raise
    if format == "csv":
        return StreamingResponse(
            download.csv(),
            media_type="text/csv",
            headers={"Content-Disposition": f'attachment; filename="{download.info.name}.csv"'},
        )
    return StreamingResponse(download.json(curator=who.role == "curator"), media_type="application/json")


@router.get("/v1/publishers")
def list_publishers(
    request: Request, who: Principal = Depends(curator), service: Service = Depends(get_service)
) -> dict[str, Any]:
    note(request, action="list_publishers")
    return {"publishers": service.publishers()}


@router.post("/v1/publishers", status_code=201)
def allow_publisher(
    body: PublisherBody, request: Request, who: Principal = Depends(curator), service: Service = Depends(get_service)
) -> dict[str, Any]:
    """Name an analyst a publisher (the change and its audit entry commit together)."""
    note(request, action="allow_publish", publisher=body.name[:100])
    changed = service.allow_publish(body.name, actor=who.name)
    note(request, recorded_in_transaction=True)
    return {"name": body.name, "publisher": True, "changed": changed}


@router.post("/v1/publishers/{name}/revoke")
def revoke_publisher(
    name: str, request: Request, who: Principal = Depends(curator), service: Service = Depends(get_service)
) -> dict[str, Any]:
    """Take back an analyst's right to publish (their releases stay)."""
    check_principal_name(name)
    note(request, action="revoke_publish", publisher=name)
    changed = service.allow_publish(name, actor=who.name, revoke=True)
    note(request, recorded_in_transaction=True)
    return {"name": name, "publisher": False, "changed": changed}
