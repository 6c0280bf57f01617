"""Budgets granted to analysts, one per analyst and dataset, and what was spent from them.

A grant is written once and never changed or replaced: every answer already released was paid
from it. The budget and its ``grant`` entry in the audit chain are written in one transaction of
the ledger, so every budget has exactly one chained grant and the log can be checked against the
ledger (:func:`dpkit.server.audit.cross_check`). The budget itself is an (ε, δ) privacy filter
over the ledger's recorded events (Rogers et al., "Privacy Odometers and Filters", NeurIPS 2016).
"""

from __future__ import annotations

import math
from typing import Any

from dpkit.errors import InvalidParameterError, LedgerError, LimitExceededError
from dpkit.ledger.base import BudgetRecord, GrantFacts, LedgerBackend, SQLRunner, fraction_to_text
from dpkit.server.audit_log import Chain, entry_fields
from dpkit.server.catalog import Catalog
from dpkit.server.errors import NotFoundError
from dpkit.server.names import check_principal_name
from dpkit.server.principals import Principal, Principals

__all__ = ["DEFAULT_MAX_GRANT_EPSILON", "Grants", "budget_dict"]

#: The largest ε a curator may grant one analyst on one dataset unless the administrator sets
#: another maximum (``--max-grant-epsilon``): a guard against a typo or a stolen curator key.
DEFAULT_MAX_GRANT_EPSILON = 10.0


def budget_dict(b: BudgetRecord) -> dict[str, Any]:
    """A budget as the API and the command line show it (:meth:`BudgetRecord.to_dict`)."""
    return b.to_dict()


class Grants:
    """The budgets of one ledger, granted by the curator on the datasets of ``catalog`` to the
    analysts of ``principals``; each grant's entry chained with ``chain``."""

    def __init__(
        self, ledger: LedgerBackend, principals: Principals, catalog: Catalog, *, max_epsilon: float, chain: Chain
    ) -> None:
        self._ledger = ledger
        self._principals = principals
        self._catalog = catalog
        self._max_epsilon = max_epsilon
        self._chain = chain

    def find(self, analyst: str, dataset: str) -> BudgetRecord | None:
        """The analyst's budget on the dataset; None when there is none."""
        try:
            return self._ledger.get_budget(dataset, analyst)
        except LedgerError:
            return None

    def grant(
        self, analyst: str, dataset: str, *, epsilon: float, delta: float = 0.0, actor: str | None = None
    ) -> BudgetRecord:
        """See :meth:`dpkit.server.service.Service.grant`."""
        check_principal_name(analyst)
        if (
            isinstance(epsilon, (int, float))
            and not isinstance(epsilon, bool)
            and math.isfinite(epsilon)
            and epsilon > self._max_epsilon
        ):
            raise LimitExceededError("epsilon", epsilon, self._max_epsilon, "max_grant_epsilon")
        self._catalog.get(dataset)
        role = self._principals.role(analyst)
        if role is None:
            raise NotFoundError(f"there is no analyst named {analyst!r}")
        if role != "analyst":
            raise InvalidParameterError("analyst", analyst, "an analyst (curators do not query)")
        if self.find(analyst, dataset) is not None:
            raise InvalidParameterError(
                "analyst",
                analyst,
                f"an analyst without a budget on {dataset!r}",
                "a granted budget is never changed or replaced: every answer already released was paid from it",
            )

        def chain_grant(tx: SQLRunner, facts: GrantFacts) -> None:
            self._chain(
                tx,
                [
                    entry_fields(
                        actor=actor,
                        action="grant",
                        status=201,
                        outcome="granted",
                        dataset=facts.dataset,
                        detail={
                            "analyst": facts.analyst,
                            "budget_epsilon": fraction_to_text(facts.epsilon),
                            "budget_delta": fraction_to_text(facts.delta),
                        },
                    )
                ],
            )

        return self._ledger.create_budget(dataset, analyst, epsilon=epsilon, delta=delta, on_create=chain_grant)

    def budgets(self, principal: Principal | None = None) -> list[BudgetRecord]:
        """Every budget (curator, or the command line), or the analyst's own."""
        records = self._ledger.list_budgets()
        if principal is not None and principal.role == "analyst":
            records = [r for r in records if r.analyst == principal.name]
        return records

    def spending(self) -> list[dict[str, Any]]:
        """Each budget's spends over time (for the curator's chart): cumulative ε after each."""
        out = []
        for b in self._ledger.list_budgets():
            total = 0.0
            points = []
            for s in self._ledger.list_spends(b.dataset, b.analyst):
                total += s.epsilon_cost
                points.append({"at": s.created_at.isoformat(), "epsilon": total})
            out.append({"dataset": b.dataset, "analyst": b.analyst, "budget_epsilon": b.epsilon, "points": points})
        return out
