"""``/`` and ``/dashboard/{asset}``: the web dashboard, static files only.

The dashboard holds no data: everything it shows comes from ``/v1`` with the key the user
types. Its files are native ES modules (no build step), served under a Content-Security-Policy
that allows scripts, styles and connections to this origin only — no inline script, no CDN
(https://developer.mozilla.org/en-US/docs/Web/HTTP/CSP).
"""

from __future__ import annotations

import functools
from importlib import resources
from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import HTMLResponse, JSONResponse, Response

__all__ = ["router", "SECURITY_HEADERS"]

router = APIRouter()

SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; connect-src 'self'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}

_ASSET_KINDS = {".js": "text/javascript", ".css": "text/css", ".svg": "image/svg+xml"}


@router.get("/", response_class=HTMLResponse, include_in_schema=False)
def dashboard() -> HTMLResponse:
    return HTMLResponse(_asset("index.html"), headers=SECURITY_HEADERS)


@router.get("/dashboard/{asset}", include_in_schema=False)
def dashboard_asset(asset: str) -> Response:
    # Only the files the package ships, by exact name: nothing from the path reaches the
    # file system.
    kind = asset_names().get(asset)
    if kind is None:
        return JSONResponse({"error": {"code": "not_found", "message": "no such asset"}}, status_code=404)
    return Response(_asset(asset), media_type=kind, headers=SECURITY_HEADERS)


def _asset(name: str) -> str:
    return resources.files("dpkit.server").joinpath("dashboard", name).read_text(encoding="utf-8")


@functools.cache
def asset_names() -> dict[str, str]:
    """The dashboard's files (name → media type): the only names ``/dashboard/`` serves (read
    once: the package's files do not change while it runs)."""
    out = {}
    for item in resources.files("dpkit.server").joinpath("dashboard").iterdir():
        kind = _ASSET_KINDS.get(Path(item.name).suffix)
        if kind is not None and item.is_file():
            out[item.name] = kind
    return out
