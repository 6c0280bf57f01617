"""The trusted-curator service: an HTTP API in front of the ledger and the analytics engine.

``dpkit serve`` runs it; ``dpkit admin`` manages principals, datasets, grants and the audit log.
:class:`Service` is the same logic without HTTP; :func:`create_app` wraps it in a FastAPI
application (the ``server`` extra: ``pip install 'dpkit[server]'``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dpkit._lazy import lazy_exports

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


# Public name -> the module it is imported from, on first use (PEP 562): ``dpkit admin`` and
# ``dpkit serve`` import their own modules of this package (and their ``--help`` nothing more), and
# FastAPI is an optional dependency that only the HTTP layer (create_app, ServerConfig) needs.
_EXPORTS: dict[str, str] = {
    "AuditEntry": "dpkit.server.audit",
    "ChainReport": "dpkit.server.audit",
    "verify_chain": "dpkit.server.audit",
    "Release": "dpkit.server.releases",
    "DatasetInfo": "dpkit.server.catalog",
    "DatasetUnavailableError": "dpkit.server.errors",
    "NotFoundError": "dpkit.server.errors",
    "Principal": "dpkit.server.principals",
    "JSONQuery": "dpkit.server.queries",
    "QueryRequest": "dpkit.server.queries",
    "Service": "dpkit.server.service",
    "SynthRequest": "dpkit.server.synthetic",
    "create_app": "dpkit.server.app",
    "ServerConfig": "dpkit.server.app",
}


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, __all__)


if TYPE_CHECKING:  # static checkers see the eager imports; the runtime does not run them
    from dpkit.server.app import ServerConfig, create_app
    from dpkit.server.audit import AuditEntry, ChainReport, verify_chain
    from dpkit.server.catalog import DatasetInfo
    from dpkit.server.errors import DatasetUnavailableError, NotFoundError
    from dpkit.server.principals import Principal
    from dpkit.server.queries import JSONQuery, QueryRequest
    from dpkit.server.releases import Release
    from dpkit.server.service import Service
    from dpkit.server.synthetic import SynthRequest
