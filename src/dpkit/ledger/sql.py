"""The ledger, written once for every SQL database.

:class:`SQLLedger` holds every operation of :class:`~dpkit.ledger.base.LedgerBackend` —
creating a budget, the atomic check-and-debit with its ``on_debit`` hook, listing, verifying —
over a driver (:mod:`dpkit.ledger._driver`). A backend (:class:`~dpkit.ledger.SQLiteLedger`,
:class:`~dpkit.ledger.PostgresLedger`) opens the database, owns its DDL and supplies the few steps
that differ: how a budget row is claimed and a spend inserted (and what time they carry), how the
budget's row is locked for a debit, and what integrity checks :meth:`SQLLedger.verify` adds.

**Atomic check-and-debit.** A debit is one write transaction: it reads the budget's totals under
the database's lock for that row (SQLite: the whole file's write lock, ``BEGIN IMMEDIATE``;
PostgreSQL: ``SELECT … FOR UPDATE``), compares the new totals with the budget exactly
(fractions; basic composition, Dwork & Roth 2014, Thm 3.16), inserts the spend, updates the
totals and commits. A refused debit writes nothing, and concurrent debits can never overshoot.
"""

from __future__ import annotations

from datetime import datetime
from fractions import Fraction
from typing import Any

from dpkit._validate import short_repr as _short
from dpkit.accounting.events import DPEvent
from dpkit.accounting.rounding import to_decimal_up, up
from dpkit.errors import Fix, InvalidParameterError, LedgerError
from dpkit.ledger._driver import Runner, TransactionKind
from dpkit.ledger.base import (
    BudgetRecord,
    DebitFacts,
    GrantFacts,
    OnCreate,
    OnDebit,
    SpendRecord,
    budget_amounts,
    budget_from_row,
    check_debit,
    check_name,
    debit_cost,
    decode_amount,
    encode_event,
    fraction_to_text,
    spend_from_row,
    total_problems,
)

__all__ = ["SQLLedger", "BUDGET_COLUMNS", "SPEND_COLUMNS"]

BUDGET_COLUMNS = "dataset, analyst, epsilon, delta, spent_epsilon, spent_delta, created_at, neighbours"
SPEND_COLUMNS = "id, dataset, analyst, event, query_text, epsilon_cost, delta_cost, created_at"


def _reuse_fix(dataset: str, analyst: str) -> Fix:
    return Fix("reuse_budget", "pass exist_ok=True to reuse it", {"dataset": dataset, "analyst": analyst})


def iso(value: object) -> str:
    """A stored time as ISO 8601 text (PostgreSQL returns datetimes, SQLite text)."""
    return value.isoformat() if isinstance(value, datetime) else str(value)


class SQLLedger:
    """The operations of a ledger over a driver. Not opened directly: a backend's constructor
    sets ``_driver``, ``_where`` (how messages name the store), the table names ``_budgets``,
    ``_spends`` and ``_meta``, and implements the steps below marked *backend step*."""

    _driver: Any
    _where: object
    _budgets = "budgets"
    _spends = "spends"
    _meta = "dpkit_schema"
    #: The ordering of list_budgets(): by code point, as Python orders strings.
    _ORDER = "dataset, analyst"

    # -- backend steps ------------------------------------------------------------------------------

    def _name(self, name: str, value: object) -> str:
        """A dataset or analyst name the database can store (backend step: more rules)."""
        return check_name(name, value)

    def _check_query_text(self, query_text: str) -> None:
        """Refuse query texts the database cannot store (backend step)."""

    def _claim_budget(
        self, tx: Runner, dataset: str, analyst: str, eps: Fraction, dlt: Fraction
    ) -> tuple[tuple[Any, ...], bool]:
        """Insert the budget unless it exists; its row (BUDGET_COLUMNS) and whether it was
        inserted by this call (backend step)."""
        raise NotImplementedError

    def _lock_budget(self, tx: Runner, dataset: str, analyst: str) -> tuple[Any, ...] | None:
        """Read (ε, δ, spent ε, spent δ, neighbours) of the budget, locking its row until
        COMMIT so no concurrent debit reads the same totals (backend step)."""
        raise NotImplementedError

    def _stamp(self) -> str | None:
        """The time of a spend, taken before the debit's transaction; None: the database's (backend step)."""
        return None

    def _insert_spend(self, tx: Runner, values: tuple[Any, ...], stamp: str | None) -> tuple[int, object]:
        """Insert the spend (dataset, analyst, event, query text, ε, δ); its id and time (backend step)."""
        raise NotImplementedError

    def _after_insert(self) -> None:
        """TEST ONLY hook point between the spend's INSERT and the totals' UPDATE (backend step)."""

    def _read_integrity(self, tx: Runner) -> Any:
        """What verify() checks beyond the totals, read in its snapshot (backend step)."""
        return None

    def _integrity_problems(self, found: Any) -> list[str]:
        """The problems in what _read_integrity() read; may raise LedgerError itself (backend step)."""
        return []

    # -- shared -------------------------------------------------------------------------------------

    def _transaction(self, action: str, *, write: bool) -> Any:
        kind: TransactionKind = "write" if write else "read"
        return self._driver.transaction(action, kind)

    def _budget(self, row: tuple[Any, ...]) -> BudgetRecord:
        return budget_from_row(row, self._where)

    def _missing(self, dataset: str, analyst: str) -> LedgerError:
        fix = Fix(
            "create_budget",
            "create it first with create_budget(dataset, analyst, epsilon=..., delta=...)",
            {"dataset": dataset, "analyst": analyst},
        )
        return LedgerError(
            f"there is no budget for analyst {analyst!r} on dataset {dataset!r} in {self._where}; {fix.text}", fix=fix
        )

    def close(self) -> None:
        """Close the connections; later calls raise LedgerError. Safe to call twice."""
        self._driver.close()

    def __enter__(self) -> SQLLedger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the LedgerBackend interface ----------------------------------------------------------------

    def create_budget(
        self,
        dataset: str,
        analyst: str,
        *,
        epsilon: float,
        delta: float = 0.0,
        exist_ok: bool = False,
        on_create: OnCreate | None = None,
    ) -> BudgetRecord:
        """Create the (ε, δ) budget of ``analyst`` on ``dataset`` and return it.

        If it already exists: with ``exist_ok=True`` and the same (ε, δ), the stored budget is
        returned; otherwise LedgerError (a stored budget is never changed or reset). Processes
        creating the same budget at once agree: one inserts it, the others find it.
        ``on_create`` runs inside the creating transaction (not when the budget existed)."""
        self._name("dataset", dataset)
        self._name("analyst", analyst)
        eps, dlt = budget_amounts(epsilon, delta)
        if not isinstance(exist_ok, bool):
            raise InvalidParameterError("exist_ok", exist_ok, "True or False")
        with self._transaction("create the budget", write=True) as tx:
            row, created = self._claim_budget(tx, dataset, analyst, eps, dlt)
            if created:
                if on_create is not None:
                    on_create(tx, GrantFacts(dataset, analyst, eps, dlt, iso(row[6])))
            else:
                stored_amounts = (
                    decode_amount(row[2], self._where, "epsilon"),
                    decode_amount(row[3], self._where, "delta"),
                )
                same = stored_amounts == (eps, dlt)
                if not (exist_ok and same):
                    stored = self._budget(row)
                    # exist_ok reuses a budget of the same amounts only: it is suggested for those
                    fix = None if exist_ok or not same else _reuse_fix(dataset, analyst)
                    raise LedgerError(
                        f"a budget for analyst {analyst!r} on dataset {dataset!r} already exists in {self._where} "
                        f"(epsilon={stored.epsilon!r}, delta={stored.delta!r})"
                        + (
                            ""
                            if same
                            else f", not epsilon={float(epsilon)!r}, delta={float(delta)!r}; a stored budget is never changed"
                        )
                        + ("" if fix is None else f"; {fix.text}"),
                        fix=fix,
                    )
        return self._budget(row)

    def get_budget(self, dataset: str, analyst: str) -> BudgetRecord:
        """The budget of ``analyst`` on ``dataset``; LedgerError if there is none."""
        self._name("dataset", dataset)
        self._name("analyst", analyst)
        with self._transaction("read the budget", write=False) as tx:
            row = tx.one(
                f"SELECT {BUDGET_COLUMNS} FROM {self._budgets} WHERE dataset = ? AND analyst = ?", (dataset, analyst)
            )
        if row is None:
            raise self._missing(dataset, analyst)
        return self._budget(row)

    def list_budgets(self) -> list[BudgetRecord]:
        """Every budget, ordered by dataset then analyst (by code point, as Python orders strings,
        whatever the database's collation)."""
        with self._transaction("list the budgets", write=False) as tx:
            rows = tx.run(f"SELECT {BUDGET_COLUMNS} FROM {self._budgets} ORDER BY {self._ORDER}")
        return [self._budget(row) for row in rows]

    def list_spends(self, dataset: str, analyst: str) -> list[SpendRecord]:
        """Every spend debited from this budget, oldest first; LedgerError if there is no budget."""
        self._name("dataset", dataset)
        self._name("analyst", analyst)
        with self._transaction("list the spends", write=False) as tx:
            exists = tx.one(f"SELECT 1 FROM {self._budgets} WHERE dataset = ? AND analyst = ?", (dataset, analyst))
            rows = tx.run(
                f"SELECT {SPEND_COLUMNS} FROM {self._spends} WHERE dataset = ? AND analyst = ? ORDER BY id",
                (dataset, analyst),
            )
        if exists is None:
            raise self._missing(dataset, analyst)
        return [spend_from_row(row, self._where) for row in rows]

    def debit(
        self,
        dataset: str,
        analyst: str,
        event: DPEvent,
        query_text: str = "",
        *,
        epsilon_cost: float | Fraction | None = None,
        delta_cost: float | Fraction | None = None,
        on_debit: OnDebit | None = None,
    ) -> SpendRecord:
        """Pay for ``event`` from the budget of ``analyst`` on ``dataset``, or raise and write nothing.

        The cost is the event's basic-composition cost (ε's and δ's add; Gaussian and subsampled
        events raise InvalidParameterError naming ``event``), or ``(epsilon_cost, delta_cost)``
        when both are given. In one transaction the budget's row is locked, the new totals
        compared exactly with the budget, the spend inserted and the totals updated. A debit
        that would exceed the budget raises :class:`~dpkit.errors.BudgetExceededError`. All
        events of one budget must share one neighbour relation (the first debit fixes it).
        ``on_debit`` runs inside that transaction before it commits.
        """
        self._name("dataset", dataset)
        self._name("analyst", analyst)
        if not isinstance(query_text, str):
            raise InvalidParameterError("query_text", _short(query_text), "a string (may be empty)")
        self._check_query_text(query_text)
        eps, dlt, relation = debit_cost(event, epsilon_cost, delta_cost)
        event_json = encode_event(event)
        stamp = self._stamp()
        with self._transaction("debit the budget", write=True) as tx:
            row = self._lock_budget(tx, dataset, analyst)
            if row is None:
                raise self._missing(dataset, analyst)
            what = f"analyst {analyst!r} on dataset {dataset!r}"
            new_eps, new_dlt = check_debit(row, eps, dlt, relation, event, what, self._where)
            values = (dataset, analyst, event_json, query_text, fraction_to_text(eps), fraction_to_text(dlt))
            spend_id, created = self._insert_spend(tx, values, stamp)
            self._after_insert()
            # CAST: the relation may be NULL, and PostgreSQL must know the parameter's type.
            tx.run(
                f"UPDATE {self._budgets} SET spent_epsilon = ?, spent_delta = ?, neighbours = COALESCE(neighbours, CAST(? AS TEXT)) "
                "WHERE dataset = ? AND analyst = ?",
                (fraction_to_text(new_eps), fraction_to_text(new_dlt), relation, dataset, analyst),
            )
            if on_debit is not None:
                on_debit(
                    tx,
                    DebitFacts(
                        spend_id, dataset, analyst, query_text, eps, dlt, new_eps, new_dlt, iso(created), event_json
                    ),
                )
        return SpendRecord(
            id=spend_id,
            dataset=dataset,
            analyst=analyst,
            event=event,
            query_text=query_text,
            epsilon_cost=to_decimal_up(eps),
            delta_cost=up(dlt),
            created_at=created if isinstance(created, datetime) else datetime.fromisoformat(str(created)),
        )

    def verify(self) -> None:
        """Check, in one consistent snapshot, the backend's integrity checks, and that every
        budget's spent totals equal the exact sum of its spends, stay within the budget and that
        no spend lacks a budget. Raises LedgerError describing the first problems found."""
        with self._transaction("verify the ledger", write=False) as tx:
            found = self._read_integrity(tx)
            budgets = tx.run(
                f"SELECT dataset, analyst, epsilon, delta, spent_epsilon, spent_delta FROM {self._budgets}"
            )
            # Equal costs are counted by the database, so Python adds one product per distinct cost.
            spends = tx.run(
                f"SELECT dataset, analyst, epsilon_cost, delta_cost, count(*) FROM {self._spends} "
                "GROUP BY dataset, analyst, epsilon_cost, delta_cost"
            )
        problems = self._integrity_problems(found)
        problems.extend(total_problems(budgets, spends, self._where))
        if problems:
            raise LedgerError(f"{self._where} is inconsistent: " + "; ".join(problems[:3]))
