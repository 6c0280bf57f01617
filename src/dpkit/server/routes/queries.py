"""``/v1/datasets/{name}/query`` and ``/v1/datasets/{name}/query/cost``: analysts' queries.

A query's only answers are the result, a refusal decided before the debit on the request and the
declared metadata (400, 404, 409, ...), or the one fixed ``query_failed`` (500) — never a
traceback, an engine message or a data value. A paid answer's audit entry is the one its debit
wrote, in the same transaction as the spend. A paid request sent with an ``Idempotency-Key`` is
answered once: a retry gets the stored answer (:mod:`dpkit.server.idempotency`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Request
from fastapi.responses import Response
from pydantic import Field
from starlette.concurrency import run_in_threadpool

from dpkit._cancel import Cancelled
from dpkit.accounting.events import event_to_dict
from dpkit.analytics.spec import QueryOptions
from dpkit.errors import AuthError, BudgetExceededError, InvalidParameterError, LedgerError, QueryFailedError
from dpkit.server.errors import DatasetUnavailableError, NotFoundError, PaidQueryFailedError
from dpkit.server.grants import budget_dict
from dpkit.server.idempotency import (
    HEADER,
    REPLAYED_HEADER,
    Claim,
    IdempotencyKeys,
    OnDebit,
    Stored,
    Unanswered,
    fingerprint,
    parse_key,
)
from dpkit.server.names import check_dataset_name
from dpkit.server.pacing import Pacer, Ticket
from dpkit.server.principals import Principal
from dpkit.server.problems import Problem, note, problem_response, query_failed
from dpkit.server.queries import OPTION_NAMES, JSONQuery, QueryRequest
from dpkit.server.routes.bodies import Body
from dpkit.server.routes.deps import analyst, get_service
from dpkit.server.service import Service
from dpkit.server.synthetic import SynthRequest

__all__ = ["router", "AggregateBody", "JoinBody", "SpecBody", "QueryBody", "SynthBody"]

_curator_log = logging.getLogger("dpkit.curator")

router = APIRouter()


class AggregateBody(Body):
    kind: str
    column: str | None = None
    q: float | None = None
    name: str | None = None


# One join of a query on a dataset of several tables: the table, the equalities (a column named
# alike on both sides, [left, right] pairs, or {left: right}) and "inner" or "left".
class JoinBody(Body):
    table: str
    on: str | list[str | list[str]] | dict[str, str]
    how: str | None = None


class SpecBody(Body):
    # On a dataset of several tables: the table read ("from"), its joins and a public key table.
    from_: str | None = Field(default=None, alias="from")
    join: list[JoinBody] | None = Field(default=None, max_length=8)
    keys_from: str | None = None
    aggregates: list[AggregateBody] = Field(min_length=1, max_length=32)
    where: str | None = None
    group_by: list[str] = Field(default_factory=list, max_length=8)
    # Per group column: its edges, or a whole number of equal-width bins over its declared bounds
    # (strict: true and 10.0 are not a number of bins), as Query.group_by(bins=) takes them.
    bins: dict[str, list[float] | int] | None = None
    keys: list[list[str | int | float | bool | None]] | None = None
    max_groups: int | None = None
    max_rows: int | None = None


# A query request: ``sql`` or ``query`` (a JSON spec), and the spending options of QueryOptions
# with its defaults. Only their JSON types are checked here; their values are checked by
# QueryOptions when the query is priced, after the dataset and the query (the order in which
# refusals have always come). (No docstring: it would become part of the published schema.)
class QueryBody(Body):
    epsilon: float
    delta: float = QueryOptions.delta
    sql: str | None = None
    query: SpecBody | None = None
    noise: str = QueryOptions.noise
    confidence: float = QueryOptions.confidence
    key_selection: str = QueryOptions.key_selection
    split: list[float] | None = None  # (QueryOptions.split: equal shares)
    bounding_epsilon: float | None = None  # (QueryOptions.bounding_epsilon: no estimate)

    def request(self) -> QueryRequest:
        spec = None
        if self.query is not None:
            q = self.query
            spec = JSONQuery(
                aggregates=tuple(a.model_dump(exclude_none=True) for a in q.aggregates),
                where=q.where,
                group_by=tuple(q.group_by),
                bins=None if q.bins is None else {k: _bins(v) for k, v in q.bins.items()},
                keys=None if q.keys is None else tuple(tuple(k) for k in q.keys),
                max_groups=q.max_groups,
                max_rows=q.max_rows,
                table=q.from_,
                joins=() if q.join is None else tuple(j.model_dump(exclude_none=True) for j in q.join),
                keys_from=q.keys_from,
            )
        options = {name: getattr(self, name) for name in OPTION_NAMES}
        if options["split"] is not None:
            options["split"] = tuple(options["split"])
        return QueryRequest(sql=self.sql, spec=spec, **options)


# The Idempotency-Key header as the published schema shows it. The route reads it itself, every
# value (parse_key refuses one sent twice, which a declared parameter would quietly reduce to one).
IdempotencyKey = Annotated[
    str | None,
    Header(
        alias=HEADER,
        description=(
            "Optional: 1 to 255 printable ASCII characters naming this paid request. A retry with the same key "
            "and body gets the first answer (Idempotent-Replayed: true) and is not debited again."
        ),
    ),
]


def _bins(value: list[float] | int) -> tuple[float, ...] | int:
    return value if isinstance(value, int) else tuple(value)


@router.post("/v1/datasets/{name}/query")
async def query(
    name: str,
    body: QueryBody,
    request: Request,
    idempotency_key: IdempotencyKey = None,
    who: Principal = Depends(analyst),
    service: Service = Depends(get_service),
) -> Any:
    del idempotency_key  # documented by IdempotencyKey; read below with every value it was sent with
    key = parse_key(request.headers.getlist(HEADER))
    check_dataset_name(name)
    req = body.request()
    note(request, action="query", dataset=name[:100], query=req.text()[:4096])
    return await _paced(
        service,
        request,
        name,
        who,
        lambda ticket: service.query_encoded(who, name, req, ticket=ticket),
        key=key,
        endpoint="query",
        body=body,
    )


@router.post("/v1/datasets/{name}/query/cost")
def query_cost(
    name: str,
    body: QueryBody,
    request: Request,
    who: Principal = Depends(analyst),
    service: Service = Depends(get_service),
) -> Any:
    check_dataset_name(name)
    return _guarded(name, who, lambda: _preview(service, request, name, body, who))


def _preview(service: Service, request: Request, name: str, body: QueryBody, who: Principal) -> Any:
    req = body.request()
    note(request, action="cost", dataset=name[:100], query=req.text()[:4096])
    pacer: Pacer = request.app.state.pacer
    cost, seconds = service.cost_and_time(who, name, req, pacer.times)
    note(request, outcome="ok (preview, nothing spent)")
    return {
        "dataset": name,
        "cost": {"epsilon": cost.epsilon, "delta": cost.delta},
        "event": event_to_dict(cost.event),  # the composed event the debit would record
        "query": cost.text,
        "budget": _own_budget(service, who, name),
        "answer_seconds": seconds,  # the paid answer leaves this long after its debit
    }


Answer = Callable[[Ticket], tuple[dict[str, Any], str]]


async def _paced(
    service: Service,
    request: Request,
    name: str,
    who: Principal,
    answer: Answer,
    *,
    key: str | None,
    endpoint: str,
    body: Body,
) -> Response:
    """A paid request (a query or a synthetic table), computed in the heavy pool and answered at
    its fixed time (:mod:`dpkit.server.pacing`): the answer as encoded by the service; a budget
    that cannot pay is 409 and a failure after the debit the fixed ``query_failed``.

    With an idempotency ``key`` (:mod:`dpkit.server.idempotency`) the key is claimed first; a
    retry is answered from storage at once (a replay reveals nothing new), and a refusal before
    the debit releases the claim."""
    if key is None:
        return await _pay(service, request, name, who, answer, None)
    keys: IdempotencyKeys = request.app.state.idempotency
    note(request, idempotency_key=key)
    print_ = fingerprint(name, endpoint, body.model_dump(mode="json", exclude_unset=True))
    found = await run_in_threadpool(keys.claim, who.name, endpoint, key, print_)
    if isinstance(found, Unanswered):
        # It paid and never stored an answer (its server stopped in between): not a second run.
        _curator_log.warning(
            "a retry of %r's request paid by spend %s found no stored answer: answered query_failed",
            who.name,
            found.spend_id,
        )
        failed = problem_response(request, query_failed(found.spend_id))
        await run_in_threadpool(keys.complete, found.claim, failed.status_code, bytes(failed.body))
        found = Stored(failed.status_code, bytes(failed.body), found.spend_id)
    if isinstance(found, Stored):
        action = request.scope.get("state", {}).get("audit", {}).get("action", "query")
        note(request, action=f"{action}_replayed", outcome=f"replayed ({found.status})", spend_id=found.spend_id)
        return Response(
            found.body, status_code=found.status, media_type="application/json", headers={REPLAYED_HEADER: "true"}
        )
    claim: Claim = found
    try:
        response = await _pay(
            service, request, name, who, answer, lambda ticket: keys.on_debit(claim, lambda: ticket.budget)
        )
    except Exception:
        spend = await run_in_threadpool(keys.spend_of, claim)
        if spend is None:  # refused before the debit: not stored, a retry is a new attempt
            await run_in_threadpool(keys.release, claim)
            raise
        note(request, action="query_failed", spend_id=spend)
        response = problem_response(request, query_failed(spend))
    await run_in_threadpool(keys.complete, claim, response.status_code, bytes(response.body))
    return response


async def _pay(
    service: Service,
    request: Request,
    name: str,
    who: Principal,
    answer: Answer,
    on_debit: Callable[[Ticket], OnDebit] | None,
) -> Response:
    """The paid request itself (see :func:`_paced`); ``on_debit``: what its debit also writes."""
    pacer: Pacer = request.app.state.pacer

    def work(ticket: Ticket) -> tuple[dict[str, Any], str]:
        if on_debit is not None:
            ticket.on_debit = on_debit(ticket)
        return _guarded(name, who, lambda: answer(ticket))

    try:
        result, encoded = await pacer.run(who.name, work)
    except BudgetExceededError as exc:
        budget = await run_in_threadpool(_own_budget, service, who, name)
        raise Problem(409, "budget_exceeded", str(exc), budget=budget) from None
    except PaidQueryFailedError as exc:
        # The debit stands, recorded by its own entry (written with it); this request's entry
        # says the answer failed and names the spend, without recording the amount again.
        note(request, action="query_failed", spend_id=exc.spend_id)
        raise query_failed(exc.spend_id) from None
    # The debit's entry, committed with the spend, is this request's record.
    note(request, recorded_in_transaction=True, spend_id=result.get("spend_id"))
    return Response(encoded, media_type="application/json")


def _guarded(name: str, who: Principal, run: Callable[[], Any]) -> Any:
    """A paid request's only answers: the result, a refusal decided before the debit on the
    request and the declared metadata, or the fixed ``query_failed``. Anything unexpected (and an
    InvalidDataError, which can no longer arise in the query path and may quote the data)
    becomes ``query_failed`` too — never a traceback or the exception's text."""
    try:
        return run()
    except (
        Problem,
        InvalidParameterError,
        NotFoundError,
        AuthError,
        BudgetExceededError,
        LedgerError,
        DatasetUnavailableError,
        QueryFailedError,
        Cancelled,  # its time ran out: the request was already answered (dpkit.server.pacing)
    ):
        raise
    except RecursionError:
        # Only validation recurses on the request (anything after the debit is wrapped by the
        # service): a query nested beyond what the parser can follow is refused, unpaid.
        raise Problem(
            400, "limit_exceeded", "the query is nested too deeply to be parsed; nothing was spent", parameter="sql"
        ) from None
    except Exception as exc:
        _curator_log.error("request on %r by %r failed unexpectedly", name[:100], who.name, exc_info=exc)
        raise query_failed(None) from None


def _own_budget(service: Service, who: Principal, dataset: str) -> dict[str, Any] | None:
    try:
        return budget_dict(service.ledger.get_budget(dataset, who.name))
    except (LedgerError, InvalidParameterError):
        return None


# A synthetic-table request (no docstring: it would become part of the published schema).
class SynthBody(Body):
    epsilon: float
    delta: float
    bins: dict[str, list[float] | int] | None = None
    rows: int | None = None
    method: str = "aim"
    rounds: int | None = None
    columns: list[str] | None = None
    publish: str | None = None
    integers: list[str] | None = None


@router.post("/v1/datasets/{name}/synthetic")
async def synthetic(
    name: str,
    body: SynthBody,
    request: Request,
    idempotency_key: IdempotencyKey = None,
    who: Principal = Depends(analyst),
    service: Service = Depends(get_service),
) -> Any:
    """A differentially private synthetic table of the dataset, paid from the analyst's budget
    (:mod:`dpkit.server.synthetic`); refusals and failures as for a query."""
    del idempotency_key  # documented by IdempotencyKey; read below with every value it was sent with
    key = parse_key(request.headers.getlist(HEADER))
    check_dataset_name(name)
    req = SynthRequest(
        epsilon=body.epsilon,
        delta=body.delta,
        bins=None if body.bins is None else {k: _bins(v) for k, v in body.bins.items()},
        rows=body.rows,
        method=body.method,
        rounds=body.rounds,
        columns=None if body.columns is None else tuple(body.columns),
        publish=body.publish,
        integers=None if body.integers is None else tuple(body.integers),
    )
    note(request, action="synthesize", dataset=name[:100], query=req.text()[:4096])
    quota = request.app.state.config.max_release_bytes  # (a publish: the publisher's bytes of releases)
    return await _paced(
        service,
        request,
        name,
        who,
        lambda ticket: service.synthesize(who, name, req, ticket=ticket, max_release_bytes=quota),
        key=key,
        endpoint="synthetic",
        body=body,
    )
