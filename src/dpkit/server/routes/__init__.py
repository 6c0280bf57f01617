"""The HTTP routes of the curator service, one :class:`fastapi.APIRouter` per resource.

Each route is a module-level function; the :class:`~dpkit.server.service.Service` and the
authenticated principal come from the request through the dependencies of :mod:`.deps`
(the edge middleware authenticated the key before the route runs). :func:`dpkit.server.app.create_app`
includes :data:`ROUTERS` in this order.
"""

from __future__ import annotations

from dpkit.server.routes import audit, dashboard, datasets, grants, keys, principals, queries, releases

__all__ = ["ROUTERS"]

ROUTERS = (
    principals.router,
    datasets.router,
    grants.router,
    audit.router,
    queries.router,
    releases.router,
    keys.router,
    dashboard.router,
)
