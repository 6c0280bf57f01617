"""``/v1/audit``, ``/v1/history`` and ``/v1/refusals``: reading the keyed audit chain.

The curator reads and verifies the whole chain; an analyst reads only the history of their own
queries. Requests refused before authentication are counts per hour and reason, not entries.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

from fastapi import APIRouter, Depends, Query, Request

from dpkit.errors import LedgerError
from dpkit.server import edge
from dpkit.server.names import check_principal_name
from dpkit.server.principals import Principal
from dpkit.server.problems import Problem, note
from dpkit.server.refusals import RefusalCounter
from dpkit.server.routes.deps import curator, get_refusals, get_service, principal
from dpkit.server.service import Service

__all__ = ["router"]

router = APIRouter()

#: ``after`` and ``limit`` of the audit and history listings: refused (400) outside these ranges.
_AFTER = Query(0, ge=0, le=edge.MAX_INT, description="list entries with sequence numbers above this")
_PAGE = Query(200, ge=1, le=1000, description="at most this many entries (1 to 1000)")


@router.get("/v1/history")
def history(
    request: Request,
    analyst_name: str | None = None,
    after: int = _AFTER,
    limit: int = _PAGE,
    newest: bool = False,
    who: Principal = Depends(principal),
    service: Service = Depends(get_service),
) -> dict[str, Any]:
    note(request, action="history")
    if analyst_name is not None:
        check_principal_name(analyst_name)
    if who.role == "analyst":
        if analyst_name not in (None, who.name):
            raise Problem(403, "forbidden", "analysts see only their own history")
        analyst_name = who.name
    entries = service.audit_entries(
        actor=analyst_name,
        actions=["query", "query_failed", "query_replayed", "cost"],
        after=after,
        limit=limit,
        newest=newest,
    )
    return {"entries": [_history_item(e.to_dict()) for e in entries]}


@router.get("/v1/audit")
def audit(
    request: Request,
    after: int = _AFTER,
    limit: int = _PAGE,
    newest: bool = False,
    who: Principal = Depends(curator),
    service: Service = Depends(get_service),
) -> dict[str, Any]:
    note(request, action="read_audit")
    entries = service.audit_entries(after=after, limit=limit, newest=newest)
    return {"entries": [e.to_dict() for e in entries]}


@router.get("/v1/audit/verify")
def audit_verify(
    request: Request,
    head: str | None = Query(None, max_length=128),
    who: Principal = Depends(curator),
    service: Service = Depends(get_service),
) -> dict[str, Any]:
    note(request, action="verify_log")
    try:
        report = service.verify_log(head=head)
    except LedgerError as exc:
        # A failed verification is the answer, not a server error: say which entry broke.
        note(request, outcome=f"verification failed: {exc}")
        return {"ok": False, "error": str(exc)}
    # (verify_log fails on any spend without its entry: a verified log has none unlogged)
    return {"ok": True, "entries": report.entries, "head": report.head, "unlogged_spends": []}


@router.get("/v1/refusals")
def refused(
    request: Request, who: Principal = Depends(curator), refusals: RefusalCounter = Depends(get_refusals)
) -> dict[str, Any]:
    """Requests refused before authentication (401, and 429 for a throttled address), per
    hour and reason: counted, not chained in the audit log."""
    note(request, action="read_refusals")
    return {"refusals": [c.to_dict() for c in refusals.counts()]}


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
