"""The interface every ledger backend implements, and the records it returns.

A ledger is the persistent, multi-process counterpart of :class:`dpkit.Budget`: one (ε, δ) budget
per (dataset, analyst), and an append-only list of the spends debited against it. Each spend
stores the *event* (as JSON, :func:`dpkit.accounting.event_to_json`), the query text, the time and
the (ε, δ) debited for it, so that a tighter accountant can later re-evaluate what was spent
(docs/architecture.md, "Core ideas", 2).

Debits compose by basic composition: a debit is accepted only if the exact sums of the ε's and of
the δ's debited so far, plus this one, stay within the budget (Dwork & Roth 2014, Thm 3.16).
Amounts are stored and compared as exact fractions (text ``"numerator/denominator"``), never as
rounded floats, and check-and-debit is one transaction, so concurrent processes can never
overshoot. The cost of one debit is, by default, the event's basic-composition cost; a caller that
priced the event with a tighter accountant may pass that (ε, δ) instead.

A backend (SQLite now, PostgreSQL later) implements :class:`LedgerBackend`; the helpers below
(:func:`debit_cost`, :func:`fraction_to_text`, …) keep the rules identical across backends.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from fractions import Fraction
from typing import Any, Literal, Protocol, runtime_checkable

from dpkit._validate import NEIGHBOUR_RELATIONS, decimal_fraction, exact_amount
from dpkit._validate import short_repr as _short
from dpkit.accounting.composition import basic_cost
from dpkit.accounting.events import ComposedEvent, DPEvent, event_from_json, event_to_json
from dpkit.accounting.rounding import down, sub_down, to_decimal_down, to_decimal_up, up
from dpkit.errors import BudgetExceededError, DPError, InvalidParameterError, LedgerError

__all__ = [
    "BudgetRecord",
    "SpendRecord",
    "LedgerBackend",
    "SQLRunner",
    "DebitFacts",
    "GrantFacts",
    "debit_cost",
    "budget_amounts",
    "fraction_to_text",
    "fraction_from_text",
    "encode_event",
    "check_name",
    "decode_amount",
    "budget_from_row",
    "spend_from_row",
    "check_debit",
    "total_problems",
]


@dataclass(frozen=True)
class BudgetRecord:
    """One budget as stored: the budget (ε, δ), what has been spent, and when it was created.

    Amounts are doubles rounded against ourselves: the budget rounded down, the spent amounts
    rounded up. ε is shown as the decimal it is stored as (a budget of 0.9 is 0.9, a spend of 7/10
    is 0.7: every ε is read at its decimal value, see ``dpkit._validate.decimal_fraction``); δ at
    its binary value. ``neighbours`` is the neighbour relation
    fixed by the first debit (None before), which every later debit must share.
    """

    dataset: str
    analyst: str
    epsilon: float
    delta: float
    spent_epsilon: float
    spent_delta: float
    created_at: datetime
    neighbours: str | None = None

    @property
    def remaining_epsilon(self) -> float:
        """ε left, rounded down, never below 0 (computed at the amounts' decimal values, which
        are at most the budget and at least the amount spent)."""
        left = decimal_fraction(self.epsilon) - decimal_fraction(self.spent_epsilon)
        return max(0.0, to_decimal_down(left))

    @property
    def remaining_delta(self) -> float:
        """δ left, rounded down, never below 0."""
        return max(0.0, sub_down(self.delta, self.spent_delta))

    def to_dict(self) -> dict[str, Any]:
        """The budget as the API and the command line show it: amounts spent and left."""
        return {
            "dataset": self.dataset,
            "analyst": self.analyst,
            "epsilon": self.epsilon,
            "delta": self.delta,
            "spent_epsilon": self.spent_epsilon,
            "spent_delta": self.spent_delta,
            "remaining_epsilon": self.remaining_epsilon,
            "remaining_delta": self.remaining_delta,
        }


@dataclass(frozen=True)
class SpendRecord:
    """One accepted debit: the event, the query text, the (ε, δ) debited (rounded up) and when."""

    id: int
    dataset: str
    analyst: str
    event: DPEvent
    query_text: str
    epsilon_cost: float
    delta_cost: float
    created_at: datetime


class SQLRunner(Protocol):
    """The open transaction of a debit or a budget's creation, handed to ``on_debit`` /
    ``on_create`` so that a caller can write its own rows (the curator service's audit entry) in
    the same transaction: they commit together or not at all. SQL uses ``?`` placeholders."""

    dialect: Literal["sqlite", "postgres"]

    def run(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]: ...


@dataclass(frozen=True)
class DebitFacts:
    """What a debit is writing, exactly: the spend's id, its cost and the budget's new totals
    (fractions, as stored), its time (ISO 8601), and its ``event`` as the very text stored in
    the spend's row (so that a hook can vouch for what was written, not for a re-encoding)."""

    spend_id: int
    dataset: str
    analyst: str
    query_text: str
    epsilon: Fraction
    delta: Fraction
    spent_epsilon: Fraction
    spent_delta: Fraction
    created_at: str
    event: str = ""


@dataclass(frozen=True)
class GrantFacts:
    """What the creation of a budget is writing: the budget's exact (ε, δ) and its time."""

    dataset: str
    analyst: str
    epsilon: Fraction
    delta: Fraction
    created_at: str


#: Called inside the debit's transaction, after the spend and the totals are written and before
#: COMMIT; if it raises, nothing of the debit is kept.
OnDebit = Callable[[SQLRunner, DebitFacts], None]
#: Called inside the transaction that creates a budget, before COMMIT.
OnCreate = Callable[[SQLRunner, GrantFacts], None]


@runtime_checkable
class LedgerBackend(Protocol):
    """A persistent store of budgets and spends with an atomic check-and-debit.

    Errors: :class:`~dpkit.errors.InvalidParameterError` for bad arguments (nothing written),
    :class:`~dpkit.errors.BudgetExceededError` for a refused debit (nothing written),
    :class:`~dpkit.errors.LedgerError` when the store cannot be read or written, a budget is
    missing or already exists.
    """

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
        """Create the budget of ``analyst`` on ``dataset``. If it exists: with ``exist_ok`` and
        the same (ε, δ), return it; otherwise raise LedgerError (a budget is never changed).
        ``on_create`` runs inside the creating transaction (not when the budget existed)."""
        ...

    def get_budget(self, dataset: str, analyst: str) -> BudgetRecord:
        """The budget of ``analyst`` on ``dataset``; LedgerError if there is none."""
        ...

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
        """Check and debit in one transaction: record the spend if the new totals stay within the
        budget, else raise BudgetExceededError and write nothing. The cost is the event's
        basic-composition cost unless both ``epsilon_cost`` and ``delta_cost`` are given.
        ``on_debit`` runs inside that transaction before it commits (see :data:`OnDebit`)."""
        ...

    def list_spends(self, dataset: str, analyst: str) -> list[SpendRecord]:
        """Every spend of this budget, oldest first."""
        ...

    def list_budgets(self) -> list[BudgetRecord]:
        """Every budget, ordered by (dataset, analyst)."""
        ...

    def verify(self) -> None:
        """Check the store's integrity and that every budget's spent totals equal the exact sum
        of its spends; raise LedgerError otherwise."""
        ...

    def close(self) -> None:
        """Release the store's connections."""
        ...

    def __enter__(self) -> LedgerBackend:
        """``with open_ledger(...) as ledger:`` closes it at the end of the block."""
        ...

    def __exit__(self, *exc: object) -> None: ...


# ------------------------------------------------------------------------------------------------
# rules shared by every backend
# ------------------------------------------------------------------------------------------------


def check_name(name: str, value: object) -> str:
    """A dataset or analyst name: a non-empty string without NUL characters."""
    if not isinstance(value, str) or not value or "\x00" in value:
        raise InvalidParameterError(name, value, "a non-empty string without NUL characters")
    return value


def fraction_to_text(value: Fraction) -> str:
    """The exact storage form of an amount: ``"numerator/denominator"``."""
    return f"{value.numerator}/{value.denominator}"


def fraction_from_text(text: object) -> Fraction:
    """Inverse of :func:`fraction_to_text`; raises ValueError for anything else."""
    if not isinstance(text, str) or "/" not in text:
        raise ValueError(f"not an exact amount: {text!r}")
    return Fraction(text)


def budget_amounts(epsilon: object, delta: object) -> tuple[Fraction, Fraction]:
    """A budget's (ε, δ) as exact fractions: ε finite > 0, read at its decimal value (1.0 is 1,
    0.3 is 3/10: ten spends of 0.1 fit a budget of 1), δ in [0, 1) at its binary value."""
    return exact_amount("epsilon", epsilon, positive=True, decimal=True), exact_amount(
        "delta", delta, upper=Fraction(1)
    )


def debit_cost(
    event: object, epsilon_cost: object = None, delta_cost: object = None
) -> tuple[Fraction, Fraction, str | None]:
    """The exact (ε, δ) to debit for ``event`` and the event's neighbour relation.

    With no costs given, the event's basic-composition cost (Gaussian and subsampled events raise
    :class:`InvalidParameterError` naming ``event``: price them with RDPAccountant or
    PLDAccountant and pass the result). With both given, those costs (finite, >= 0, δ <= 1) — the
    caller vouches that the event is (epsilon_cost, delta_cost)-DP. A double cost is read at its
    exact binary value (an accountant's ε, rounded up, stays an upper bound); pass a
    :class:`~fractions.Fraction` for an exact decimal amount.
    """
    if not isinstance(event, DPEvent):
        raise InvalidParameterError(
            "event", _short(event), "a dpkit.accounting.DPEvent (e.g. LaplaceEvent(noise_multiplier=...))"
        )
    if (epsilon_cost is None) != (delta_cost is None):
        raise InvalidParameterError(
            "epsilon_cost" if epsilon_cost is None else "delta_cost",
            None,
            "given together with the other cost",
            "pass both epsilon_cost and delta_cost, or neither to price the event by basic composition",
        )
    if epsilon_cost is None:
        return basic_cost(event)
    eps = exact_amount("epsilon_cost", epsilon_cost)
    dlt = exact_amount("delta_cost", delta_cost)
    if dlt > 1:
        raise InvalidParameterError("delta_cost", delta_cost, "a number in [0, 1]")
    relations: set[str] = set()
    _relations(event, relations)
    if len(relations) > 1:
        raise InvalidParameterError(
            "event",
            _short(event),
            "events that all share one neighbour relation",
            f"the event mixes {sorted(relations)}",
        )
    return eps, dlt, next(iter(relations), None)


def _relations(event: object, out: set[str]) -> None:
    """Collect the neighbour relations of the leaves of an event tree (any event type)."""
    if isinstance(event, ComposedEvent):
        for e in event.events:
            _relations(e, out)
        return
    inner = getattr(event, "event", None)
    if isinstance(inner, DPEvent):
        _relations(inner, out)
        return
    rel = getattr(event, "neighbours", None)
    if rel is not None:
        if rel not in NEIGHBOUR_RELATIONS:
            raise InvalidParameterError("neighbours", rel, "'add_remove' or 'replace'")
        out.add(rel)


def encode_event(event: DPEvent) -> str:
    """The event as JSON, checked to decode back to an equal event (so what is stored can be
    re-evaluated later exactly as it was debited)."""
    try:
        text = event_to_json(event)
        same = event_from_json(text) == event
    except (TypeError, ValueError) as exc:
        raise InvalidParameterError(
            "event",
            _short(event),
            "an event whose fields are plain numbers and strings",
            f"it cannot be stored as JSON ({exc})",
        ) from exc
    if not same:
        raise InvalidParameterError(
            "event",
            _short(event),
            "an event whose fields are plain numbers and strings",
            "it does not survive a JSON round trip",
        )
    return text


# ------------------------------------------------------------------------------------------------
# decoding stored rows (identical for every backend; ``where`` names the store in messages)
# ------------------------------------------------------------------------------------------------


def decode_amount(text: object, where: object, what: str) -> Fraction:
    """A stored exact amount; LedgerError naming the store and the record if it is corrupt."""
    try:
        return fraction_from_text(text)
    except (ValueError, ZeroDivisionError) as exc:
        raise LedgerError(f"{where} holds a corrupt amount for {what}: {text!r}") from exc


def _time(value: object) -> datetime:
    return value if isinstance(value, datetime) else datetime.fromisoformat(str(value))


def budget_from_row(row: tuple[Any, ...], where: object) -> BudgetRecord:
    """A BudgetRecord from (dataset, analyst, ε, δ, spent ε, spent δ, created_at, neighbours):
    the budget rounded down, the spent amounts up."""
    dataset, analyst, eps, dlt, s_eps, s_dlt, created, neighbours = row
    what = f"analyst {analyst!r} on dataset {dataset!r}"
    return BudgetRecord(
        dataset=dataset,
        analyst=analyst,
        epsilon=to_decimal_down(decode_amount(eps, where, what)),
        delta=down(decode_amount(dlt, where, what)),
        spent_epsilon=to_decimal_up(decode_amount(s_eps, where, what)),
        spent_delta=up(decode_amount(s_dlt, where, what)),
        created_at=_time(created),
        neighbours=neighbours,
    )


def spend_from_row(row: tuple[Any, ...], where: object) -> SpendRecord:
    """A SpendRecord from (id, dataset, analyst, event JSON, query text, ε, δ, created_at)."""
    spend_id, dataset, analyst, event_json, query_text, eps, dlt, created = row
    try:
        event = event_from_json(event_json)
    except (DPError, TypeError, ValueError) as exc:
        raise LedgerError(f"{where} holds a corrupt event in spend {spend_id}: {_short(event_json)}") from exc
    what = f"spend {spend_id}"
    return SpendRecord(
        id=spend_id,
        dataset=dataset,
        analyst=analyst,
        event=event,
        query_text=query_text,
        epsilon_cost=to_decimal_up(decode_amount(eps, where, what)),
        delta_cost=up(decode_amount(dlt, where, what)),
        created_at=_time(created),
    )


# ------------------------------------------------------------------------------------------------
# the decisions of a debit and of verify(), on rows read inside the backend's transaction
# ------------------------------------------------------------------------------------------------


def check_debit(
    row: tuple,
    eps: Fraction,
    dlt: Fraction,
    relation: str | None,
    event: DPEvent,
    what: str,
    where: object,
) -> tuple[Fraction, Fraction]:
    """The new spent totals when the budget row (ε, δ, spent ε, spent δ, neighbours) can pay
    (eps, dlt) for ``event``; else InvalidParameterError (another neighbour relation) or
    BudgetExceededError. Exact comparison: the budget is never overshot by rounding."""
    budget_eps, budget_dlt, spent_eps, spent_dlt = (decode_amount(x, where, what) for x in row[:4])
    fixed = row[4]
    if relation is not None and fixed is not None and relation != fixed:
        raise InvalidParameterError(
            "event",
            _short(event),
            f"events whose neighbours is {fixed!r}",
            f"this budget's earlier debits were for {fixed!r} neighbours; a guarantee for one "
            "neighbour relation is not a guarantee for the other, so they cannot be added up",
        )
    new_eps, new_dlt = spent_eps + eps, spent_dlt + dlt
    if new_eps > budget_eps or new_dlt > budget_dlt:
        raise BudgetExceededError(
            f"ε={to_decimal_up(eps)!r}, δ={up(dlt)!r} for {_short(event)}",
            f"ε={to_decimal_down(budget_eps - spent_eps)!r}, δ={down(budget_dlt - spent_dlt)!r} of the budget "
            f"ε={to_decimal_down(budget_eps)!r}, δ={down(budget_dlt)!r} of {what} in {where}",
        )
    return new_eps, new_dlt


def total_problems(budgets: list[tuple[Any, ...]], spends: list[tuple[Any, ...]], where: object) -> list[str]:
    """What is inconsistent between budget rows (dataset, analyst, ε, δ, spent ε, spent δ) and
    spend rows grouped by cost (dataset, analyst, ε, δ, count): totals that differ from the exact
    sum of the spends, budgets overspent, spends without a budget."""
    sums: dict[tuple[str, str], list[Fraction]] = {}
    for dataset, analyst, eps, dlt, count in spends:
        total = sums.setdefault((dataset, analyst), [Fraction(0), Fraction(0)])
        total[0] += decode_amount(eps, where, "a spend") * count
        total[1] += decode_amount(dlt, where, "a spend") * count
    problems = []
    for dataset, analyst, eps, dlt, s_eps, s_dlt in budgets:
        what = f"analyst {analyst!r} on dataset {dataset!r}"
        spent = [decode_amount(s_eps, where, what), decode_amount(s_dlt, where, what)]
        if sums.pop((dataset, analyst), [Fraction(0), Fraction(0)]) != spent:
            problems.append(f"the totals of {what} differ from the sum of its spends")
        if spent[0] > decode_amount(eps, where, what) or spent[1] > decode_amount(dlt, where, what):
            problems.append(f"{what} has spent more than its budget")
    problems.extend(f"spends of analyst {a!r} on dataset {d!r} have no budget" for d, a in sums)
    return problems
