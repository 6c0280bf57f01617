"""``/v1/grants``, ``/v1/budgets`` and ``/v1/spending``: budgets granted and spent.

The grant's audit entry is written with the budget, in the ledger's transaction, so the request
adds no second entry for it."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request

from dpkit.server.grants import budget_dict
from dpkit.server.principals import Principal
from dpkit.server.problems import note
from dpkit.server.routes.bodies import Body
from dpkit.server.routes.deps import curator, get_service, principal
from dpkit.server.service import Service

__all__ = ["router", "GrantBody"]

router = APIRouter()


class GrantBody(Body):
    analyst: str
    dataset: str
    epsilon: float
    delta: float = 0.0


@router.get("/v1/budgets")
def list_budgets(
    request: Request, who: Principal = Depends(principal), service: Service = Depends(get_service)
) -> dict[str, Any]:
    note(request, action="list_budgets")
    return {"budgets": [budget_dict(b) for b in service.budgets(who)]}


@router.post("/v1/grants", status_code=201)
def grant(
    body: GrantBody, request: Request, who: Principal = Depends(curator), service: Service = Depends(get_service)
) -> dict[str, Any]:
    note(
        request,
        action="grant",
        dataset=body.dataset[:100],
        analyst=body.analyst[:100],
        budget_epsilon=body.epsilon,
        budget_delta=body.delta,
    )
    granted = service.grant(body.analyst, body.dataset, epsilon=body.epsilon, delta=body.delta, actor=who.name)
    note(request, recorded_in_transaction=True)  # the grant's entry was written with the budget
    return budget_dict(granted)


@router.get("/v1/spending")
def spending(
    request: Request, who: Principal = Depends(curator), service: Service = Depends(get_service)
) -> dict[str, Any]:
    note(request, action="spending")
    return {"series": service.spending()}
