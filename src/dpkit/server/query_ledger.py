"""The ledger as one analyst's query sees it: one budget, one debit, chained in the audit log.

The debit is the only write, and it is chained in the audit log in the ledger's own
transaction, so the spend and its entry commit together or not at all (a paid answer is never
unlogged, and a logged payment is never lost; see :meth:`dpkit.server.service.Service.verify_log`).
"""

from __future__ import annotations

import contextlib
from dataclasses import replace
from fractions import Fraction
from typing import Any

from dpkit.accounting.rounding import up
from dpkit.errors import LedgerError
from dpkit.ledger.base import BudgetRecord, DebitFacts, LedgerBackend, OnDebit, SpendRecord, SQLRunner
from dpkit.server.audit import text_digest
from dpkit.server.audit_log import Chain, entry_fields
from dpkit.server.principals import Principal

__all__ = ["QueryLedger"]


class QueryLedger:
    """The budget read once when the query arrives, and the debit chained with ``chain``. After
    the debit it reports the totals the debit wrote, so answering needs no second read.

    Only ``get_budget`` and ``debit`` of this budget are used by a session; the rest forward
    to the ledger (or refuse: a query's view never creates budgets)."""

    def __init__(
        self, ledger: LedgerBackend, chain: Chain, budget: BudgetRecord, principal: Principal, *, ticket: Any = None
    ) -> None:
        # ticket: a paced request's (dpkit.server.pacing.Ticket): the debit goes through it, so
        # that a request whose time ran out never pays, and one that paid is known to have.
        self._ticket = ticket
        self._ledger = ledger
        self._chain = chain
        self.budget = budget
        self._principal = principal

    def _mine(self, dataset: str, analyst: str) -> bool:
        return (dataset, analyst) == (self.budget.dataset, self.budget.analyst)

    def get_budget(self, dataset: str, analyst: str) -> BudgetRecord:
        return self.budget if self._mine(dataset, analyst) else self._ledger.get_budget(dataset, analyst)

    def debit(
        self,
        dataset: str,
        analyst: str,
        event: Any,
        query_text: str = "",
        *,
        epsilon_cost: float | Fraction | None = None,
        delta_cost: float | Fraction | None = None,
        on_debit: OnDebit | None = None,
    ) -> SpendRecord:
        if not self._mine(dataset, analyst) or on_debit is not None:
            raise LedgerError("a query's ledger view debits only its own budget")
        who = self._principal

        def chain_spend(tx: SQLRunner, facts: DebitFacts) -> None:
            on_debit = getattr(self._ticket, "on_debit", None)
            if on_debit is not None:  # (a paid request's idempotency claim takes its spend with it)
                on_debit(tx, facts.spend_id)
            # The digests of the texts exactly as the spend's row holds them: verify_log finds
            # a spend whose event or query text was rewritten after the debit.
            detail = {
                "spend_id": facts.spend_id,
                "query": facts.query_text,
                "key_id": who.key_id,
                "event_sha256": text_digest(facts.event),
                "query_sha256": text_digest(facts.query_text),
            }
            self._chain(
                tx,
                [
                    entry_fields(
                        actor=facts.analyst,
                        action="query",
                        status=200,
                        outcome="paid",
                        dataset=facts.dataset,
                        detail=detail,
                        epsilon=facts.epsilon,
                        delta=facts.delta,
                    )
                ],
            )
            self._after = (facts.spent_epsilon, facts.spent_delta)

        with contextlib.ExitStack() as paying:
            record = paying.enter_context(self._ticket.paying()) if self._ticket is not None else None
            spend = self._ledger.debit(
                dataset,
                analyst,
                event,
                query_text,
                epsilon_cost=epsilon_cost,
                delta_cost=delta_cost,
                on_debit=chain_spend,
            )
            if record is not None:
                record(spend.id)
        spent_eps, spent_dlt = self._after
        self.budget = replace(self.budget, spent_epsilon=up(spent_eps), spent_delta=up(spent_dlt))
        return spend

    def create_budget(self, *args: Any, **kwargs: Any) -> BudgetRecord:
        raise LedgerError("a query's ledger view does not create budgets")

    def list_spends(self, dataset: str, analyst: str) -> list[SpendRecord]:
        return self._ledger.list_spends(dataset, analyst)

    def list_budgets(self) -> list[BudgetRecord]:
        return self._ledger.list_budgets()

    def verify(self) -> None:
        self._ledger.verify()

    def close(self) -> None:
        """Nothing to close: the service owns the ledger."""

    def __enter__(self) -> QueryLedger:
        return self

    def __exit__(self, *exc: object) -> None:
        pass
