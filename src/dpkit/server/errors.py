"""The curator service's own errors, beside :mod:`dpkit.errors`.

Each message is fixed or built from names the caller already gave: none carries a file path, an
engine message or a data value (a refusal says nothing about the data; see the service's
"pay before the data is touched" rule in :mod:`dpkit.server.service`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dpkit.errors import DPError, QueryFailedError

if TYPE_CHECKING:
    from dpkit.analytics.results import QueryCost

__all__ = ["NotFoundError", "DatasetUnavailableError", "PaidQueryFailedError"]


class NotFoundError(DPError, LookupError):
    """A dataset, principal or key that does not exist (or that the caller may not see)."""


class DatasetUnavailableError(DPError):
    """A registered dataset could not be opened for an analyst's query (its file was moved,
    changed or became unreadable since registration). Nothing was spent. The message is fixed:
    it names no file, engine message or value; the details go to the ``dpkit.curator`` log."""

    MESSAGE = "the dataset could not be opened; nothing was spent (the curator has been told why)"

    def __init__(self) -> None:
        super().__init__(self.MESSAGE)


class PaidQueryFailedError(QueryFailedError):
    """:class:`~dpkit.errors.QueryFailedError` raised by :meth:`Service.query
    <dpkit.server.service.Service.query>`, with the ``cost`` that was debited (for the audit
    log). Same fixed message."""

    def __init__(self, spend_id: int | None, cost: QueryCost) -> None:
        super().__init__(spend_id)
        self.cost = cost
