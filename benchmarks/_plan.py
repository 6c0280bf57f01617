"""The engine plan dpkit builds for a query, through dpkit's own planner.

Two benchmarks run a plan without the rest of a release (``bench_side_channels``: the engine
before the debit, as earlier versions did; ``bench_groupby``: the statement dpkit generates, run
raw). The planner is private, so this is the one place the benchmarks reach into it: a rename there
breaks this file alone, and ``make bench-smoke`` says so.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any


def plan_of(query: Any, aggregates: Sequence[Any], *, epsilon: float = 1.0, salt: int = 12345) -> Any:
    """The ``AggregationPlan`` that ``query.aggregate(aggregates, epsilon=epsilon)`` hands its
    engine, with ``salt`` as the bounding key (a release draws its own)."""
    from dpkit.analytics.building import check_aggregates  # noqa: PLC0415
    from dpkit.analytics.pricing import price_built  # noqa: PLC0415
    from dpkit.analytics.spec import QueryOptions  # noqa: PLC0415

    table = query.session._declared
    checked = check_aggregates(table, query.groups, aggregates)
    priced = price_built(query._built(), checked, QueryOptions(epsilon), table)
    return dataclasses.replace(priced.plan, salt=salt)
