"""``/v1/releases``: published synthetic tables, for every authenticated principal.

A release was paid for once, by the analyst who published it (``publish`` in
``POST /v1/datasets/{name}/synthetic``); listing and downloading spend nothing. Each request is
an entry of the audit log, like every authenticated request.
"""

from __future__ import annotations

import csv
import io
import json
from typing import Any

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import Response

from dpkit.errors import InvalidParameterError
from dpkit.server.principals import Principal
from dpkit.server.problems import note
from dpkit.server.routes.deps import get_service, principal
from dpkit.server.service import Service

__all__ = ["router"]

router = APIRouter()


@router.get("/v1/releases")
def list_releases(
    request: Request, who: Principal = Depends(principal), service: Service = Depends(get_service)
) -> dict[str, Any]:
    note(request, action="list_releases")
    return {"releases": [r.public() for r in service.releases()]}


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
    info, rows, report = service.release(name)
    if format == "csv":
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(info.columns)
        writer.writerows(["" if v is None else v for v in row] for row in rows)
        return Response(
            out.getvalue(),
            media_type="text/csv",
            headers={"Content-Disposition": f'attachment; filename="{info.name}.csv"'},
        )
    body = {**info.public(), "rows": rows, "row_count": info.rows, "report": report}
    return Response(json.dumps(body, allow_nan=False), media_type="application/json")
