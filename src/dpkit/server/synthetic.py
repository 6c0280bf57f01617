"""Synthetic tables through the service: an analyst spends part of a budget on a whole table.

``POST /v1/datasets/{name}/synthetic`` releases a differentially private synthetic table
(:class:`dpkit.synth.Synthesizer`) of a dataset the analyst was granted, paid from that budget
like a query and in the same way: the request is checked and priced on the declared metadata
alone (bad bins, a domain too large, an ε too small: refused, nothing spent), refused early when
the budget obviously cannot pay, then debited atomically with its audit entry (action ``query``,
the request's text starting ``SYNTHESIZE``), and only then is the dataset read (its DuckDB
copy, or a Spark dataset's Parquet data by the cluster: only the marginals' counts come back). A failure
after the debit keeps the debit and is the one fixed ``query_failed``. Everything the analyst
does with the rows afterwards is post-processing.

An analyst the curator named a publisher may request it with ``publish`` set: the spend is in
the ledger and the audit log like any other, and the table is stored as a release
(:mod:`dpkit.server.releases`) that those granted the dataset may download without spending.
The publisher, the name and the publisher's quota are checked before paying, and the name is
reserved in a transaction of its own before the debit, so no publish pays and then finds its
name taken.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dpkit.analytics.metadata import Metadata
from dpkit.analytics.results import QueryCost
from dpkit.errors import BudgetExceededError, InvalidParameterError, LimitExceededError
from dpkit.server.errors import PaidQueryFailedError
from dpkit.server.grants import budget_dict
from dpkit.server.names import check_release_name
from dpkit.server.principals import Principal
from dpkit.server.queries import Queries, cannot_pay
from dpkit.server.releases import Releases, Reservation
from dpkit.server.synth_size import SynthSize

if TYPE_CHECKING:
    from dpkit.server.pacing import Ticket


__all__ = ["SynthRequest", "answer_synthetic"]

_curator_log = logging.getLogger("dpkit.curator")


@dataclass(frozen=True)
class SynthRequest:
    """What to release: (ε, δ) for the whole table, numeric ``bins`` (edges or a number of bins
    per column), how many ``rows`` (default: the measured number, up to the row limit), the
    ``method`` (``"aim"`` or ``"mst"``) and, for AIM, the ``rounds``; ``integers``: numeric
    columns sampled as whole numbers; ``publish``: a name under
    which the table is stored for every principal to download (:mod:`dpkit.server.releases`)."""

    epsilon: float
    delta: float
    bins: Mapping[str, Sequence[float] | int] | None = None
    rows: int | None = None
    method: str = "aim"
    rounds: int | None = None
    columns: Sequence[str] | None = None
    publish: str | None = None
    integers: Sequence[str] | None = None

    def text(self) -> str:
        """The request as the ledger and the audit log record it."""
        body = {
            "epsilon": self.epsilon,
            "delta": self.delta,
            "bins": None
            if self.bins is None
            else {k: v if isinstance(v, int) else list(v) for k, v in self.bins.items()},
            "rows": self.rows,
            "method": self.method,
            "rounds": self.rounds,
            "columns": None if self.columns is None else list(self.columns),
            "publish": self.publish,
            "integers": None if self.integers is None else list(self.integers),
        }
        return "SYNTHESIZE " + json.dumps(body, sort_keys=True)


def answer_synthetic(
    queries: Queries,
    principal: Principal,
    dataset: str,
    request: SynthRequest,
    releases: Releases | None = None,
    ticket: Ticket | None = None,
) -> tuple[dict[str, Any], str]:
    """See :meth:`dpkit.server.service.Service.synthesize` (``releases``: where a published
    table is stored)."""
    from dpkit.synth import Synthesizer

    limits = queries.limits
    with queries.session(principal, dataset, ticket) as (session, info, view):
        if not isinstance(info.metadata, Metadata):  # several tables (refused after the grant's 404)
            raise InvalidParameterError(
                "dataset",
                info.name,
                "a dataset of one table",
                "a synthetic table models one table's rows; this dataset has several tables and their joins",
            )
        # Everything decided on the request and the metadata, before paying.
        synth = Synthesizer(
            epsilon=request.epsilon, delta=request.delta, metadata=info.metadata, bins=request.bins,
            method=request.method, rounds=request.rounds, columns=request.columns, integers=request.integers,
            rng=queries.rng, progress=False,
        )  # fmt: skip
        if request.rows is not None:
            if not isinstance(request.rows, int) or isinstance(request.rows, bool) or request.rows < 0:
                raise InvalidParameterError("rows", request.rows, "a whole number of rows >= 0, or None")
            if request.rows > limits.max_result_rows:
                raise LimitExceededError("rows", request.rows, limits.max_result_rows, "max_result_rows")
        # The answer's bytes, bounded from the domain and the rounds (dpkit.server.synth_size).
        most_rows = SynthSize.of(synth.domain, rounds=synth.planned_rounds).check(request.rows, limits)
        plan: Reservation | None = None
        if request.publish is not None:  # the publisher, the name, the quota (reserved below)
            check_release_name(request.publish)
            if releases is None:
                raise InvalidParameterError("publish", request.publish, "None: this service stores no releases")
            bound_rows = request.rows if request.rows is not None else most_rows
            plan = releases.plan(principal.name, request.publish, info.name, synth.domain, bound_rows)
        cost = QueryCost(epsilon=synth.epsilon, delta=synth.delta, event=synth.event, text=request.text()[:4096])
        before = view.budget
        if cannot_pay(cost, before):
            raise _exceeded(cost, before, principal.name, info.name)
        if ticket is not None:  # the service's synthesis limits, then the answer's time: before paying
            rounds = synth.planned_rounds
            ticket.limits.check_synthesis(rounds, synth.domain)
            ticket.arm_synthesis(info.size_class, info.engine, rounds)
        spend: list[int] = []

        def pay(event: Any) -> None:
            try:
                record = view.debit(
                    info.name, principal.name, event, cost.text, epsilon_cost=cost.epsilon, delta_cost=cost.delta
                )
            except BudgetExceededError:
                raise _exceeded(
                    cost, queries.ledger.get_budget(info.name, principal.name), principal.name, info.name
                ) from None
            spend.append(record.id)

        engine: Any = session.engine
        # A Spark dataset is counted by its cluster (only the marginals reach this process); a
        # DuckDB dataset in this process's read-only copy.
        data = engine.frame if info.engine == "spark" else (engine._con, info.name)
        reservation: Reservation | None = None
        try:
            if plan is not None:  # its own transaction, before the debit: a loser pays nothing
                assert releases is not None
                reservation = releases.reserve(plan)
            synth.fit(data, _pay=pay)
            assert synth.report is not None
            measured = max(0, int(round(synth.report.rows)))
            n = request.rows if request.rows is not None else min(measured, most_rows)
            frame = synth.sample(n)
            rows = frame.astype(object).where(frame.notna(), None).values.tolist()
            report = synth.report
            answer: dict[str, Any] = {
                "dataset": info.name,
                "columns": list(frame.columns),
                "rows": rows,
                "report": {
                    "text": report.to_text(),
                    "warnings": list(report.warnings),
                    "estimated_rows": report.rows,
                    "selected": [list(p) for p in report.selected],
                    "measurements": [
                        {"columns": list(m.columns), "cells": m.cells, "sigma": m.sigma, "how": m.how}
                        for m in report.measurements
                    ],
                    "method": report.method,
                    "rho": report.rho,
                },
                "truncated": request.rows is None and n < measured,
                "spend_id": spend[0] if spend else None,
                "cost": {"epsilon": cost.epsilon, "delta": cost.delta},
                "budget": budget_dict(view.budget),
                "release": request.publish,
            }
            encoded = json.dumps(answer, allow_nan=False, default=_plain)
            if reservation is not None:
                assert releases is not None
                releases.publish(
                    reservation, spend_id=answer["spend_id"], epsilon=cost.epsilon, delta=cost.delta,
                    columns=answer["columns"], rows=rows, report=answer["report"],
                )  # fmt: skip
        except Exception:
            if reservation is not None:  # unpaid: the name is free again; paid: taken for good
                assert releases is not None
                releases.settle(reservation, paid=bool(spend))
            if not spend:  # refused before the debit (the schema, the budget): the refusal stands
                raise
            _curator_log.exception(
                "synthetic table of %r for %r failed after its debit (spend %s)", info.name, principal.name, spend[0]
            )
            raise PaidQueryFailedError(spend[0], cost) from None
        return answer, encoded


def _plain(value: Any) -> Any:
    """numpy scalars (from the sampled frame) as plain JSON values; non-finite floats as null."""
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value if isinstance(value, (int, float, str, bool)) or value is None else str(value)


def _exceeded(cost: QueryCost, budget: Any, analyst: str, dataset: str) -> BudgetExceededError:
    return BudgetExceededError(
        f"ε={cost.epsilon!r}, δ={cost.delta!r} for a synthetic table",
        f"ε={budget.remaining_epsilon!r}, δ={budget.remaining_delta!r} of the budget of analyst {analyst!r} on dataset {dataset!r}",
    )
