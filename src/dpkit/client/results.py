"""The service's answers as the objects a local session returns.

A query's answer is :meth:`QueryResult.to_dict() <dpkit.analytics.results.QueryResult.to_dict>`
plus the service's envelope (the dataset, the cost, the budget after the debit;
:mod:`dpkit.server.queries`). :func:`query_result` rebuilds the
:class:`~dpkit.analytics.results.QueryResult` from it — the table, each aggregate with its
mechanism, noise scales and event, the composed event, the privacy unit — so that ``print``,
``.table``, ``.value``, ``.plot()`` and the notebook display work as on a local result. The
remaining ε is the budget's after this answer's debit. Everything here is post-processing of
what was released: nothing is sent, nothing is spent.

pandas (the ``analytics`` extra) is imported when an answer is rebuilt, not before.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd

    from dpkit.analytics.results import QueryCost, QueryResult

__all__ = ["RemoteBudget", "SyntheticTable", "query_result", "query_cost", "synthetic_table"]


@dataclass(frozen=True)
class RemoteBudget:
    """An analyst's budget on one dataset as the service reports it: granted (ε, δ), spent and
    left (ε shown at its decimal value, rounded against the analyst, as in the ledger)."""

    dataset: str
    analyst: str
    epsilon: float
    delta: float
    spent_epsilon: float
    spent_delta: float
    remaining_epsilon: float
    remaining_delta: float

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> RemoteBudget:
        return cls(
            dataset=str(d["dataset"]),
            analyst=str(d["analyst"]),
            **{
                k: float(d[k])
                for k in ("epsilon", "delta", "spent_epsilon", "spent_delta", "remaining_epsilon", "remaining_delta")
            },
        )

    @property
    def remaining(self) -> float:
        """ε left (the name of :attr:`dpkit.analytics.Session.remaining`)."""
        return self.remaining_epsilon

    @property
    def spent(self) -> tuple[float, float]:
        """(ε, δ) spent so far (as :attr:`dpkit.analytics.Session.spent`)."""
        return self.spent_epsilon, self.spent_delta


def query_result(answer: Mapping[str, Any]) -> QueryResult:
    """The :class:`~dpkit.analytics.results.QueryResult` of a query's answer."""
    import pandas as pd

    from dpkit.accounting.events import event_from_dict
    from dpkit.analytics.results import AggregateInfo, QueryResult

    aggregates = tuple(AggregateInfo.from_dict(a) for a in answer["aggregates"])
    groups = tuple(answer["groups"])
    values = [n for a in aggregates for n in (a.name, f"{a.name}_low", f"{a.name}_high")]
    rows = answer["rows"]
    columns = list(rows[0]) if rows else [*groups, *values]
    table = pd.DataFrame.from_records(rows, columns=columns) if rows else pd.DataFrame(columns=columns)
    for name in values:
        # Released numbers (null for an interval a quantile does not have): floats, as locally.
        table[name] = table[name].astype("float64")
    unit = answer["privacy_unit"]
    budget = answer.get("budget")
    extra: dict[str, Any] = {}
    if answer.get("bounding") is not None:  # what the intervals cover (and a paid estimate)
        from dpkit.analytics.bounding import Bounding

        extra["bounding"] = Bounding.from_dict(answer["bounding"], unit["column"])
    return QueryResult(
        table=table,
        aggregates=aggregates,
        groups=groups,
        epsilon=float(answer["epsilon"]),
        delta=float(answer["delta"]),
        event=event_from_dict(answer["event"]),
        confidence=float(answer["confidence"]),
        keys=answer["keys"],
        remaining_epsilon=None if budget is None else float(budget["remaining_epsilon"]),
        notes=tuple(answer["notes"]),
        spend_id=answer.get("spend_id"),
        privacy_unit=unit["column"],
        max_groups=int(unit["max_groups"]),
        max_rows=int(unit["max_rows"]),
        neighbours=unit["neighbours"],
        seeded=bool(answer["seeded"]),
        truncated=bool(answer["truncated"]),
        **extra,
    )


def query_cost(answer: Mapping[str, Any]) -> QueryCost:
    """The :class:`~dpkit.analytics.results.QueryCost` of a cost preview's answer."""
    from dpkit.accounting.events import event_from_dict
    from dpkit.analytics.results import QueryCost

    cost = answer["cost"]
    return QueryCost(
        epsilon=float(cost["epsilon"]),
        delta=float(cost["delta"]),
        event=event_from_dict(answer["event"]),
        text=str(answer["query"]),
    )


@dataclass(frozen=True)
class SyntheticTable:
    """A synthetic table from the service: the rows (``table``), the service's measurement
    ``report`` (``text``, ``measurements``, ``method``, ``rho``, ...), the ``dataset`` it
    describes and, when published, the release's ``name``. A table paid for by this call also
    has its cost (``epsilon``, ``delta``, ``spend_id``) and the ``budget`` left after it; a
    downloaded release has none of them (it was paid for once, by its publisher). ``truncated``:
    fewer rows than measured were sampled (the service's row limit)."""

    table: pd.DataFrame = field(repr=False)
    report: Mapping[str, Any] = field(repr=False)
    dataset: str
    name: str | None = None
    epsilon: float | None = None
    delta: float | None = None
    spend_id: int | None = None
    budget: RemoteBudget | None = field(default=None, repr=False)
    truncated: bool = False

    def __str__(self) -> str:
        what = f"release {self.name!r} of {self.dataset!r}" if self.name else f"synthetic table of {self.dataset!r}"
        cost = "" if self.epsilon is None else f", ε={self.epsilon:.6g}, δ={self.delta:.3g}"
        text = str(self.report.get("text", "")).strip()
        return f"{what}: {len(self.table)} rows x {self.table.shape[1]} columns{cost}" + (f"\n{text}" if text else "")


def synthetic_table(answer: Mapping[str, Any]) -> SyntheticTable:
    """The :class:`SyntheticTable` of a synthetic table's answer or of a release's download."""
    import pandas as pd

    table = pd.DataFrame.from_records(answer["rows"], columns=list(answer["columns"]))
    cost = answer.get("cost")
    budget = answer.get("budget")
    return SyntheticTable(
        table=table,
        report=answer.get("report") or {},
        dataset=str(answer["dataset"]),
        name=answer.get("release", answer.get("name")),
        epsilon=None if cost is None else float(cost["epsilon"]),
        delta=None if cost is None else float(cost["delta"]),
        spend_id=answer.get("spend_id"),
        budget=None if budget is None else RemoteBudget.from_dict(budget),
        truncated=bool(answer.get("truncated", False)),
    )
