"""Analysts' queries: the request, how it becomes a :class:`~dpkit.analytics.session.Query`,
and the one path that prices, debits, runs and answers it.

Every query goes: validate and price against the declared metadata only → refuse early if the
budget obviously cannot pay → debit atomically (the ledger decides under concurrency; the spend
and its audit entry commit together) → aggregate and noise → answer. A refusal never reaches the
engine; a failure after the debit keeps the debit and is one fixed
:class:`~dpkit.server.errors.PaidQueryFailedError` (details to the ``dpkit.curator`` log). This
is the order of dp_accounting's dry run before it composes: a system that computes first leaks
through its errors and its timing (Haeberlen, Pierce and Narayan, "Differential Privacy Under
Fire", USENIX Security 2011).

>>> QueryRequest(epsilon=0.5, spec=JSONQuery(aggregates=({"kind": "count"},), group_by=("sex",))).text()
'{"aggregates": [{"kind": "count"}], "group_by": ["sex"]}'
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from dpkit.analytics import aggregates as A
from dpkit.analytics.limits import QueryLimits
from dpkit.analytics.query import Query
from dpkit.analytics.results import QueryCost
from dpkit.analytics.session import Session
from dpkit.analytics.spec import Join, QueryOptions, QuerySpec
from dpkit.errors import AuthError, BudgetExceededError, InvalidDataError, InvalidParameterError, QueryFailedError
from dpkit.ledger.base import BudgetRecord, LedgerBackend
from dpkit.noise.source import RNG
from dpkit.server.audit_log import Chain
from dpkit.server.catalog import Catalog, DatasetInfo
from dpkit.server.errors import DatasetUnavailableError, NotFoundError, PaidQueryFailedError
from dpkit.server.grants import Grants, budget_dict
from dpkit.server.principals import Principal
from dpkit.server.query_ledger import QueryLedger

if TYPE_CHECKING:
    from dpkit.server.pacing import AnswerTimes, Ticket

__all__ = ["OPTION_NAMES", "JSONQuery", "QueryRequest", "Queries", "compile_request", "query_options"]

#: The spending options of a query, in order: the fields of
#: :class:`~dpkit.analytics.spec.QueryOptions`, where their defaults and checks are written.
OPTION_NAMES: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(QueryOptions))

#: The options passed on only when the request gives them (None: not asked for).
_ONLY_WHEN_GIVEN = frozenset({"split", "bounding_epsilon"})

#: Where details that must not reach an analyst go (failures after a debit).
_curator_log = logging.getLogger("dpkit.curator")

_DETAIL_LIMIT = 4096  # characters of query text kept in the audit log per request

#: Turns a session and a request into the query and its aggregates (see :func:`compile_request`).
Compile = Callable[[Session, "QueryRequest"], "tuple[Query, list[A.Aggregate]]"]


@dataclass(frozen=True)
class JSONQuery:
    """A query without SQL, in the JSON form the HTTP API takes (what
    :meth:`dpkit.analytics.QuerySpec.from_json` reads): ``aggregates`` like ``[{"kind": "mean", "column": "age"}]``,
    optional ``where`` (a predicate of the SQL subset), ``group_by``, ``bins``, ``keys`` and
    contribution bounds. On a dataset of several tables: ``table`` (JSON ``"from"``) names the
    table read, ``joins`` (JSON ``"join"``) its joins as :meth:`dpkit.analytics.spec.Join.from_json`
    reads them (``{"table": "regions", "on": ["postcode"], "how": "left"}``) and ``keys_from``
    a public table whose rows are the group keys."""

    aggregates: tuple[dict[str, Any], ...]
    where: str | None = None
    group_by: tuple[str, ...] = ()
    bins: dict[str, tuple[float, ...] | int] | None = None  # edges, or a number of equal-width bins
    keys: tuple[tuple[Any, ...], ...] | None = None
    max_groups: int | None = None
    max_rows: int | None = None
    table: str | None = None
    joins: tuple[dict[str, Any] | Join, ...] = ()
    keys_from: str | None = None


@dataclass(frozen=True)
class QueryRequest:
    """One query: SQL of the analytics subset *or* a :class:`JSONQuery`, and what to spend.

    The options (``epsilon`` ... ``split``) are those of
    :class:`~dpkit.analytics.spec.QueryOptions`, with its defaults; they are checked by it when
    the query is priced — after the dataset and the query itself, so that a request is refused
    for the same first reason as ever."""

    epsilon: float
    delta: float = QueryOptions.delta
    sql: str | None = None
    spec: JSONQuery | None = None
    noise: str = QueryOptions.noise
    confidence: float = QueryOptions.confidence
    key_selection: str = QueryOptions.key_selection
    split: tuple[float, ...] | None = QueryOptions.split
    bounding_epsilon: float | None = QueryOptions.bounding_epsilon

    def text(self) -> str:
        """The query as the ledger and the audit log record it ("" before validation when the
        request has neither SQL nor a spec)."""
        if isinstance(self.sql, str):
            return self.sql
        if self.spec is None:
            return ""
        return json.dumps(_spec_dict(self.spec), sort_keys=True, default=str)


#: The JSON name of each field of a :class:`JSONQuery`, in the canonical text.
_JSON_NAMES = {
    "where": "where", "group_by": "group_by", "bins": "bins", "keys": "keys", "max_groups": "max_groups",
    "max_rows": "max_rows", "table": "from", "joins": "join", "keys_from": "keys_from",
}  # fmt: skip


def _spec_dict(spec: JSONQuery) -> dict[str, Any]:
    """The canonical text's object: the fields given, under their JSON names (a one-table query
    is recorded as it always was)."""
    out: dict[str, Any] = {"aggregates": list(spec.aggregates)}
    for name, key in _JSON_NAMES.items():
        value = getattr(spec, name)
        if value not in (None, ()):
            out[key] = [j.to_dict() if isinstance(j, Join) else j for j in value] if name == "joins" else value
    return out


def compile_request(session: Session, request: QueryRequest) -> tuple[Query, list[A.Aggregate]]:
    """The query ``request`` names on ``session``, and its aggregates: SQL through the analytics
    SQL subset, a spec through the same builder calls a Python user makes. Validation only:
    nothing is read, nothing is paid."""
    from dpkit.analytics.sql import compile_sql
    from dpkit.analytics.sql_parse import parse_predicate

    if (request.sql is None) == (request.spec is None):
        raise InvalidParameterError("query", None, "exactly one of 'sql' and 'query' (a JSON query spec)")
    if request.sql is not None:
        if not isinstance(request.sql, str) or not request.sql.strip():
            raise InvalidParameterError("sql", request.sql, "a SELECT of the analytics SQL subset")
        return compile_sql(session, request.sql)
    spec = request.spec
    assert spec is not None
    q = session.query(spec.table)
    for i, obj in enumerate(spec.joins):  # read by the analytics spec's reader, as QuerySpec.from_json does
        join = obj if isinstance(obj, Join) else Join.from_json(i, obj)
        q = q.join(join.table, join.on, how=join.how)
    if spec.where is not None:
        q = q.where(parse_predicate(spec.where, limits=session.limits))
    if spec.group_by:
        bins = cast("dict[str, Sequence[float] | int] | None", spec.bins)
        q = q.group_by(*spec.group_by, keys=spec.keys, bins=bins, keys_from=spec.keys_from)
    elif spec.keys is not None or spec.bins is not None or spec.keys_from is not None:
        given = next(x for x in (spec.keys, spec.bins, spec.keys_from) if x is not None)
        name = "keys" if spec.keys is not None else "bins" if spec.bins is not None else "keys_from"
        raise InvalidParameterError(name, given, "keys, bins and keys_from only with group_by")
    if spec.max_groups is not None or spec.max_rows is not None:
        q = q.bound(max_groups=spec.max_groups, max_rows=spec.max_rows)
    if not spec.aggregates:  # refused by the query itself, with the message a Python caller gets
        return q, []
    # The aggregates are read by the analytics spec's JSON reader, the one definition of the
    # JSON form (kinds, fields and their messages), after the structure above as ever.
    return q, list(QuerySpec.from_json({"aggregates": list(spec.aggregates)}).aggregates)


def query_options(request: QueryRequest) -> dict[str, Any]:
    """The keyword arguments of :meth:`Query.cost` and :meth:`Query.aggregate` the request sets
    (every option of :data:`OPTION_NAMES`; ``split`` and ``bounding_epsilon`` only when given)."""
    return {
        name: getattr(request, name)
        for name in OPTION_NAMES
        if not (name in _ONLY_WHEN_GIVEN and getattr(request, name) is None)
    }


class Queries:
    """Runs analysts' queries on the datasets of ``catalog``, paid from the budgets of ``grants``
    in ``ledger`` (each debit chained with ``chain``), noised from ``rng`` (the OS CSPRNG unless
    a :class:`~dpkit.noise.source.SecureSource` is given), within ``limits``; ``compile`` turns
    a request into a query (:func:`compile_request` unless given)."""

    def __init__(
        self,
        ledger: LedgerBackend,
        catalog: Catalog,
        grants: Grants,
        *,
        rng: RNG,
        limits: QueryLimits,
        chain: Chain,
        compile: Compile = compile_request,
    ) -> None:
        self._ledger = ledger
        self._catalog = catalog
        self._grants = grants
        self._rng = rng
        self._limits = limits
        self._chain = chain
        self._compile = compile

    @property
    def limits(self) -> QueryLimits:
        return self._limits

    @property
    def rng(self) -> RNG:
        return self._rng

    @property
    def ledger(self) -> LedgerBackend:
        return self._ledger

    @contextlib.contextmanager
    def session(
        self, principal: Principal, dataset: str, ticket: Ticket | None = None
    ) -> Iterator[tuple[Session, DatasetInfo, QueryLedger]]:
        """A session for the analyst on a dataset they were granted, over a view of the ledger
        for this one query (its budget read once; its debit chained in the audit log in the
        same transaction), on an engine borrowed from the dataset's pool for the block.
        NotFoundError (404) for a dataset that does not exist or was not granted. With a
        ``ticket`` (:mod:`dpkit.server.pacing`) the debit goes through it and the engine is
        interrupted when the request's time runs out."""
        if principal.role != "analyst":
            raise AuthError("only analysts run queries")
        info = self._catalog.get(dataset)
        budget = self._grants.find(principal.name, info.name)
        if budget is None:
            raise NotFoundError(f"there is no dataset named {dataset!r} that you may query")
        view = QueryLedger(self._ledger, self._chain, budget, principal, ticket=ticket)
        loaded = self._catalog.opened(info)
        try:
            engine = loaded.take(info.name)
            opened: dict[str, Any] = dict(
                metadata=info.metadata, neighbours=info.neighbours, ledger=view, dataset=info.name,
                analyst=principal.name, rng=self._rng, limits=self._limits,
            )  # fmt: skip
            if isinstance(engine, dict):  # several tables, on one cursor of the shared copy
                session = Session(engine, **opened)
            else:
                session = Session(None, engine=engine, table=info.name, **opened)
        except (InvalidParameterError, InvalidDataError):
            # The metadata was checked against this table at registration: a mismatch now means
            # the source changed since. The analyst passed nothing here, so nothing is theirs to fix.
            _curator_log.warning("dataset %r no longer matches its metadata", info.name, exc_info=True)
            raise DatasetUnavailableError() from None
        except Exception:
            _curator_log.exception("dataset %r: its copy could not be read", info.name)
            raise DatasetUnavailableError() from None
        if ticket is not None:
            ticket.interrupt_with(_interrupter(next(iter(engine.values())) if isinstance(engine, dict) else engine))
        try:
            yield session, info, view
        finally:
            if ticket is not None:
                ticket.interrupt_with(None)  # (before another request may borrow the engine)
            loaded.give_back(engine)

    def cost(self, principal: Principal, dataset: str, request: QueryRequest) -> QueryCost:
        """See :meth:`dpkit.server.service.Service.cost`."""
        return self.cost_and_time(principal, dataset, request, None)[0]

    def cost_and_time(
        self, principal: Principal, dataset: str, request: QueryRequest, times: AnswerTimes | None
    ) -> tuple[QueryCost, float | None]:
        """See :meth:`dpkit.server.service.Service.cost_and_time` (no time without ``times``)."""
        with self.session(principal, dataset) as (session, info, _):
            q, aggs = self._compile(session, request)
            cost = q.cost(aggs, _text=_clip(request.text()), **query_options(request))
            if times is None:
                return cost, None
            return cost, _answer_seconds(times, q, info, aggs, request)

    def answer(
        self, principal: Principal, dataset: str, request: QueryRequest, ticket: Ticket | None = None
    ) -> tuple[dict[str, Any], str]:
        """See :meth:`dpkit.server.service.Service.query_encoded`."""
        with self.session(principal, dataset, ticket) as (session, info, view):
            return self._answer(principal, session, info, view, request, ticket)

    def _answer(
        self,
        principal: Principal,
        session: Session,
        info: DatasetInfo,
        view: QueryLedger,
        request: QueryRequest,
        ticket: Ticket | None = None,
    ) -> tuple[dict[str, Any], str]:
        before = view.budget
        q, aggs = self._compile(session, request)
        options = query_options(request)
        text = _clip(request.text())
        cost = q.cost(aggs, _text=text, **options)
        # (the atomic debit inside Query.aggregate stays the one that decides)
        if cannot_pay(cost, before):
            raise _exceeded(cost, text, before, principal.name, info.name)
        if ticket is not None:  # priced: the answer's time is fixed now, before paying
            ticket.arm(_answer_seconds(ticket.times, q, info, aggs, request))
        try:
            result = q.aggregate(aggs, _text=text, **options)
        except QueryFailedError as exc:  # paid, then failed: the session logged the details
            raise PaidQueryFailedError(exc.spend_id, cost) from None
        except BudgetExceededError:
            # Refused by the atomic debit (the early check above let it through, or a concurrent
            # query spent first). The ledger's own message names its database: the analyst gets
            # the same refusal as the early one, from the budget as it now stands.
            raise _exceeded(
                cost, text, self._ledger.get_budget(info.name, principal.name), principal.name, info.name
            ) from None
        # Paid and computed: from here on nothing may fail on data either.
        try:
            after = view.budget  # the totals the debit wrote: no second read
            answer = result.to_dict()
            answer.pop("remaining_epsilon", None)
            answer["dataset"] = info.name
            answer["cost"] = {"epsilon": cost.epsilon, "delta": cost.delta}
            answer["budget"] = budget_dict(after)
            encoded = json.dumps(answer, allow_nan=False)  # what the HTTP layer sends
        except Exception:
            _curator_log.exception(
                "query %r on %r by %r failed after its debit (spend %s)",
                text[:200],
                info.name,
                principal.name,
                result.spend_id,
            )
            raise PaidQueryFailedError(result.spend_id, cost) from None
        return answer, encoded


def _paced_kinds(aggs: Sequence[A.Aggregate], request: QueryRequest) -> list[str]:
    """The parts of a query its answer time is budgeted for: its aggregates' kinds, and
    ``"bounding"`` when it pays for the estimate of what bounding left out (one more pass)."""
    return [a.kind for a in aggs] + (["bounding"] if request.bounding_epsilon is not None else [])


def _shape(
    q: Query, info: DatasetInfo, aggs: Sequence[A.Aggregate], request: QueryRequest
) -> tuple[int, bool, list[str]]:
    """The public shape a query's answer time is budgeted from (:meth:`AnswerTimes.query`)."""
    return len(q.groups), private_keys(q, info), _paced_kinds(aggs, request)


def _answer_seconds(
    times: AnswerTimes, q: Query, info: DatasetInfo, aggs: list[A.Aggregate], request: QueryRequest
) -> float:
    """The answer's time budget, from the query's shape and its joins (declared facts only)."""
    tables, matches = _joined(q)
    return times.query(info.size_class, info.engine, *_shape(q, info, aggs, request), tables=tables, matches=matches)


def _joined(q: Query) -> tuple[int, int]:
    """The tables a query reads and the most rows one row of its table becomes once joined —
    the product of each joined table's truncation (``max_matches`` of a public table,
    ``join_rows`` of a private one): declared facts only (:meth:`AnswerTimes.query`)."""
    plan = q.declared.join if q.declared is not None else None
    if plan is None:
        return 1, 1
    return 1 + len(plan.steps), math.prod(max(1, s.source.keep or 1) for s in plan.steps)


def private_keys(q: Query, info: DatasetInfo) -> bool:
    """Whether query ``q`` selects its group keys privately (no keys given, and a group column
    without bins or declared categories — for a query over several tables, the columns of the
    table it reads, joined)."""
    if not q.groups or q.keys is not None:
        return False
    declared = q.declared.metadata if q.declared is not None else info.metadata
    columns = getattr(declared, "columns", {})
    return any(g.edges is None and not getattr(columns.get(g.column), "categories", None) for g in q.groups)


def _interrupter(engine: Any) -> Callable[[], None] | None:
    """What interrupts ``engine``'s running query: a DuckDB cursor's ``interrupt`` (it stops only
    that cursor's query); a Spark job group's cancellation is not wired (the answer still leaves
    at its time; the cluster finishes the job)."""
    con = getattr(engine, "_con", None)
    return getattr(con, "interrupt", None)


def cannot_pay(cost: QueryCost, budget: BudgetRecord) -> bool:
    """Whether the budget obviously cannot pay ``cost``: an early refusal that spares the engine.
    The slack keeps it from refusing what the exact ledger would accept (remaining amounts are
    rounded down); the atomic debit stays the one that decides."""
    return (
        cost.epsilon > budget.remaining_epsilon * (1 + 1e-9) + 1e-300
        or cost.delta > budget.remaining_delta * (1 + 1e-9) + 1e-300
    )


def _clip(text: str) -> str:
    return text if len(text) <= _DETAIL_LIMIT else text[:_DETAIL_LIMIT] + "…"


def _exceeded(cost: QueryCost, text: str, budget: BudgetRecord, analyst: str, dataset: str) -> BudgetExceededError:
    """The analyst's refusal: the request and the budget, in the same words however it was
    refused (no ledger path, nothing about the data)."""
    return BudgetExceededError(
        f"ε={cost.epsilon!r}, δ={cost.delta!r} for {text[:80]!r}",
        f"ε={budget.remaining_epsilon!r}, δ={budget.remaining_delta!r} of the budget of analyst {analyst!r} on dataset {dataset!r}",
    )
