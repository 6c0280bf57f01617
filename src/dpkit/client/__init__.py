"""A Python client for the curator service (``dpkit serve``): an analyst's remote session.

>>> import dpkit.client
>>> dpkit.client.connect("http://curator.example.org", key="dpk_x")
Traceback (most recent call last):
...
dpkit.errors.InvalidParameterError: url='http://curator.example.org' is not accepted: url must be https:// for a service on another machine. Over plain http:// the API key and every answer cross the network readable by anyone on the way; pass allow_insecure=True to send them anyway (e.g. inside a private network)

:func:`connect` opens a :class:`RemoteSession` with the local API's names and types: ``sql``
returns a :class:`~dpkit.analytics.results.QueryResult`, ``cost`` a
:class:`~dpkit.analytics.results.QueryCost`, and a refusal raises the :mod:`dpkit.errors` error a
local session raises (a spent budget is :class:`~dpkit.errors.BudgetExceededError`). Paid
requests carry an ``Idempotency-Key``, so a retried request is never paid twice. Only the
standard library speaks HTTP; rebuilding results needs pandas (the ``analytics`` extra). See the
guide's "Remote sessions" page.
"""

from __future__ import annotations

from dpkit.client.connection import Connection
from dpkit.client.errors import ConnectionFailedError, ServiceError
from dpkit.client.results import RemoteBudget, SyntheticTable
from dpkit.client.session import RemoteSession, connect

__all__ = [
    "connect",
    "RemoteSession",
    "RemoteBudget",
    "SyntheticTable",
    "Connection",
    "ServiceError",
    "ConnectionFailedError",
]
