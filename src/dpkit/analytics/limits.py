"""Limits on the size of one query, set by whoever runs the session (the curator, in the service).

Every limit is checked on the request and the declared metadata only — before anything is paid
and before the data is read — so a refusal says nothing about the data. A request over a limit
raises :class:`~dpkit.errors.LimitExceededError` naming the limit and its setting.

>>> QueryLimits().max_keys
100000
"""

from __future__ import annotations

from dataclasses import dataclass

from dpkit.errors import InvalidParameterError

__all__ = ["QueryLimits"]


@dataclass(frozen=True)
class QueryLimits:
    """How large one query may be.

    ``max_keys``: the product of the public keys of a group-by (declared categories × bins ×
    explicit keys), computed without building it. ``max_result_rows``: rows one answer may hold
    (a group-by over public keys is refused when it would exceed it; rows selected privately are
    cut to it, in key order — post-processing of the release). ``max_response_bytes``: the
    largest answer, estimated from the declared metadata before paying. ``max_query_depth``:
    nesting of parentheses and boolean operators in SQL and predicates.
    """

    max_keys: int = 100_000
    max_result_rows: int = 100_000
    max_response_bytes: int = 16 * 1024 * 1024
    max_query_depth: int = 64

    def __post_init__(self) -> None:
        for name in ("max_keys", "max_result_rows", "max_response_bytes", "max_query_depth"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidParameterError(name, value, "an integer >= 1")
