"""``/v1/datasets``: the curator registers datasets; everyone lists those they may see.

An analyst sees only the datasets they were granted, and only the declared schema — never the
source or the rows. The curator who registers a dataset gets its data check in that one answer.
"""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Depends, Request

from dpkit.server.names import check_dataset_name
from dpkit.server.principals import Principal
from dpkit.server.problems import note
from dpkit.server.routes.bodies import Body
from dpkit.server.routes.deps import curator, get_service, principal
from dpkit.server.service import Service

__all__ = ["router", "DatasetBody"]

router = APIRouter()


# ``source``: a file, or for several tables (metadata with "tables") an object from each table to
# its file; ``table``: the table of a .duckdb file (for several tables, an object by table).
class DatasetBody(Body):
    name: str
    source: str | dict[str, str]
    metadata: dict[str, Any]
    neighbours: Literal["add_remove", "replace"] = "add_remove"
    table: str | dict[str, str] | None = None
    engine: Literal["duckdb", "spark"] = "duckdb"
    size_class: Literal["small", "medium", "large", "huge"] = "medium"
    fingerprint: Literal["sha256"] | None = None  # a Spark dataset's files' content, pinned too


@router.get("/v1/datasets")
def list_datasets(
    request: Request, who: Principal = Depends(principal), service: Service = Depends(get_service)
) -> dict[str, Any]:
    note(request, action="list_datasets")
    if who.role == "curator":
        return {"datasets": [d.curator() for d in service.datasets()]}
    granted = {b.dataset for b in service.budgets(who)}
    return {"datasets": [d.public() for d in service.datasets() if d.name in granted]}


@router.get("/v1/datasets/{name}")
def get_dataset(
    name: str, request: Request, who: Principal = Depends(principal), service: Service = Depends(get_service)
) -> dict[str, Any]:
    check_dataset_name(name)
    note(request, action="get_dataset", dataset=name[:100])
    return service.dataset(name, who).public()


@router.post("/v1/datasets", status_code=201)
def register_dataset(
    body: DatasetBody, request: Request, who: Principal = Depends(curator), service: Service = Depends(get_service)
) -> dict[str, Any]:
    note(request, action="register_dataset", dataset=body.name[:100])
    info = service.register_dataset(
        body.name,
        body.source,
        body.metadata,
        neighbours=body.neighbours,
        table=body.table,
        engine=body.engine,
        size_class=body.size_class,
        fingerprint=body.fingerprint,
    )
    # The data check goes to the curator who registered the dataset, in this answer only: it
    # holds exact counts and raw values, so it is not stored, not audited, and no analyst
    # endpoint returns it.
    check = None if info.check is None else info.check.to_dict()
    return {**info.curator(), "check": check}
