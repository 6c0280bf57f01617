"""``/v1/me``, ``/v1/analysts`` and ``/v1/principals``: who is calling, and the curator's
management of analysts."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request

from dpkit.server.names import check_principal_name
from dpkit.server.principals import Principal
from dpkit.server.problems import note
from dpkit.server.routes.bodies import Body
from dpkit.server.routes.deps import curator, get_service, principal
from dpkit.server.service import Service

__all__ = ["router", "AnalystBody"]

router = APIRouter()


class AnalystBody(Body):
    name: str


@router.get("/v1/me")
def me(request: Request, who: Principal = Depends(principal)) -> dict[str, Any]:
    note(request, action="me")
    return {"name": who.name, "role": who.role, "key_id": who.key_id}


@router.get("/v1/analysts")
def list_analysts(
    request: Request, who: Principal = Depends(curator), service: Service = Depends(get_service)
) -> dict[str, Any]:
    note(request, action="list_principals")
    return {"principals": service.principals()}


@router.post("/v1/analysts", status_code=201)
def create_analyst(
    body: AnalystBody, request: Request, who: Principal = Depends(curator), service: Service = Depends(get_service)
) -> dict[str, Any]:
    note(request, action="create_analyst", name=body.name[:100])
    p, key = service.create_principal(body.name, "analyst")
    return {
        "name": p.name,
        "role": p.role,
        "key_id": p.key_id,
        "key": key,
        "note": "the key is shown once; only its hash is stored",
    }


@router.post("/v1/principals/{name}/revoke")
def revoke_principal(
    name: str, request: Request, who: Principal = Depends(curator), service: Service = Depends(get_service)
) -> dict[str, Any]:
    """Revoke every key of the principal ``name``."""
    check_principal_name(name)
    note(request, action="revoke_principal", name=name)
    return {"revoked": service.revoke_principal(name)}
