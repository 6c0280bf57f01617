"""``/v1/analysts/{name}/keys`` and ``/v1/keys/{key}/revoke``: the curator issues and revokes
API keys. A key is shown once, when issued; only its hash is stored."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request

from dpkit.server import edge
from dpkit.server.keys import key_id
from dpkit.server.names import check_principal_name
from dpkit.server.principals import Principal
from dpkit.server.problems import note
from dpkit.server.routes.deps import curator, get_service
from dpkit.server.service import Service

__all__ = ["router"]

router = APIRouter()


@router.post("/v1/analysts/{name}/keys", status_code=201)
def issue_key(
    name: str, request: Request, who: Principal = Depends(curator), service: Service = Depends(get_service)
) -> dict[str, Any]:
    check_principal_name(name)
    note(request, action="issue_key", name=name[:100])
    key = service.issue_key(name)
    return {"name": name, "key_id": key_id(key), "key": key, "note": "the key is shown once; only its hash is stored"}


@router.post("/v1/keys/{key}/revoke")
def revoke_key(
    key: str, request: Request, who: Principal = Depends(curator), service: Service = Depends(get_service)
) -> dict[str, Any]:
    """Revoke one key, named by its id (16 lower-case hex digits; never a principal's name)."""
    edge.check_key_id(key)
    note(request, action="revoke_key", key=key)
    return {"revoked": service.revoke_key(key)}
