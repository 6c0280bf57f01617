"""The trusted-curator service: an HTTP API in front of the ledger and the analytics engine.

``dpkit serve`` runs it; ``dpkit admin`` manages principals, datasets, grants and the audit log.
:class:`Service` is the same logic without HTTP; :func:`create_app` wraps it in a FastAPI
application (the ``server`` extra: ``pip install 'dpkit[server]'``).
"""

from __future__ import annotations

from typing import Any

from dpkit.server.audit import AuditEntry, ChainReport, verify_chain
from dpkit.server.releases import Release
from dpkit.server.service import (
    DatasetInfo,
    DatasetUnavailableError,
    JSONQuery,
    NotFoundError,
    Principal,
    QueryRequest,
    Service,
)
from dpkit.server.service import (
    QuerySpec as QuerySpec,  # the earlier name of JSONQuery, kept importable (not in __all__)
)
from dpkit.server.synthetic import SynthRequest

__all__ = [
    "Service",
    "Principal",
    "DatasetInfo",
    "QueryRequest",
    "JSONQuery",
    "SynthRequest",
    "Release",
    "NotFoundError",
    "DatasetUnavailableError",
    "AuditEntry",
    "ChainReport",
    "verify_chain",
    "create_app",
    "ServerConfig",
]


def __getattr__(name: str) -> Any:
    # FastAPI is an optional dependency: import the HTTP layer only when it is asked for.
    if name in ("create_app", "ServerConfig"):
        from dpkit.server import app

        return getattr(app, name)
    raise AttributeError(f"module 'dpkit.server' has no attribute {name!r}")
