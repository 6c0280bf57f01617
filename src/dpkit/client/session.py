"""An analyst's session with a curator service: :func:`connect` and :class:`RemoteSession`.

The remote session speaks the local API's language: :meth:`RemoteSession.sql` returns the
:class:`~dpkit.analytics.results.QueryResult` a local :meth:`dpkit.analytics.Session.sql`
returns (``print``, ``.table``, ``.value``, ``.plot()``), :meth:`RemoteSession.cost` the
:class:`~dpkit.analytics.results.QueryCost` of :meth:`~dpkit.analytics.Session.sql_cost`, and a
refusal raises the :mod:`dpkit.errors` error a local session raises for it
(:mod:`dpkit.client.errors`). The differences come from where the data is: every call names the
dataset, the noise always comes from the service's CSPRNG (there is no ``rng``), and the budget
is the one the curator granted, read with :meth:`RemoteSession.budget`.

Each paid call (:meth:`~RemoteSession.sql`, :meth:`~RemoteSession.synthesize`) sends a fresh
``Idempotency-Key``, and a lost answer is asked for again under it: the service answers the
retry with the first answer and debits nothing (:mod:`dpkit.client.connection`).
"""

from __future__ import annotations

import os
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from dpkit.client.connection import KEY_VARIABLE, Connection, new_idempotency_key
from dpkit.client.errors import ServiceError
from dpkit.client.results import RemoteBudget, SyntheticTable, query_cost, query_result, synthetic_table
from dpkit.errors import InvalidParameterError
from dpkit.server.errors import NotFoundError

if TYPE_CHECKING:
    from dpkit.analytics.results import QueryCost, QueryResult

__all__ = ["connect", "RemoteSession"]

_T = TypeVar("_T")


def _path(*parts: str, parameter: str = "dataset") -> str:
    """A path of the API with each name quoted whole (a name cannot reach another endpoint);
    a name that is not a str is refused as ``parameter``."""
    for p in parts:
        if not isinstance(p, str):
            raise InvalidParameterError(parameter, p, "a name (str)")
    return "".join("/" + urllib.parse.quote(p, safe="") for p in parts)


def _read(decode: Callable[[Any], _T], body: Any) -> _T:
    """``decode(body)``; an answer without the fields this client reads (a service of another
    version, or not a dpkit service) is a ServiceError saying so, not a KeyError."""
    try:
        return decode(body)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ServiceError(
            f"the service's answer could not be read ({type(exc).__name__}: {exc}); is it a dpkit service of "
            "the same version as this client?"
        ) from None


def _options(**options: Any) -> dict[str, Any]:
    """The options the caller gave (None: the service's default, the same as a local session's)."""
    return {k: (list(x) if isinstance(x, (tuple, list)) else x) for k, x in options.items() if x is not None}


class RemoteSession:
    """An analyst's view of the datasets a curator service granted them (see :func:`connect`).

    ``analyst`` and ``role`` are who the key belongs to, as the service said when the session
    was opened. Nothing is cached: every method asks the service.
    """

    def __init__(self, connection: Connection, *, analyst: str, role: str) -> None:
        self._connection = connection
        self._analyst = analyst
        self._role = role

    @property
    def url(self) -> str:
        return self._connection.url

    @property
    def analyst(self) -> str:
        return self._analyst

    @property
    def role(self) -> str:
        return self._role

    def __repr__(self) -> str:
        return f"RemoteSession(url={self.url!r}, analyst={self._analyst!r}, role={self._role!r})"

    # -- what the analyst may see ----------------------------------------------------------------

    def datasets(self) -> list[dict[str, Any]]:
        """The datasets this analyst was granted, each as the curator declared it (its name,
        size class, neighbour relation, columns and privacy unit: the metadata, never the rows).
        A dataset of several tables lists them under ``"tables"``, each with ``"public"``, its
        columns and unit, ``join_rows`` / ``max_matches``: with ``max_groups`` and ``max_rows`` it
        reads back as :meth:`dpkit.analytics.DatasetMetadata.from_dict` takes it."""
        found: list[dict[str, Any]] = self._connection.get("/v1/datasets").body["datasets"]
        return found

    def dataset(self, name: str) -> dict[str, Any]:
        """One dataset's declared schema (see :meth:`datasets`); NotFoundError if it was not
        granted."""
        found: dict[str, Any] = self._connection.get(_path("v1", "datasets", name)).body
        return found

    def budgets(self) -> list[RemoteBudget]:
        """This analyst's budgets, one per dataset granted."""
        return [RemoteBudget.from_dict(b) for b in self._connection.get("/v1/budgets").body["budgets"]]

    def budget(self, dataset: str) -> RemoteBudget:
        """The budget on ``dataset``: granted, spent and left. NotFoundError if there is none."""
        for b in self.budgets():
            if b.dataset == dataset:
                return b
        raise NotFoundError(f"there is no dataset named {dataset!r} that you may query")

    def remaining(self, dataset: str) -> float:
        """ε left on ``dataset`` (:attr:`dpkit.analytics.Session.remaining` of a remote budget)."""
        return self.budget(dataset).remaining_epsilon

    # -- queries ---------------------------------------------------------------------------------

    def sql(
        self,
        dataset: str,
        text: str,
        *,
        epsilon: float,
        delta: float | None = None,
        noise: str | None = None,
        confidence: float | None = None,
        key_selection: str | None = None,
        split: Sequence[float] | None = None,
        bounding_epsilon: float | None = None,
        idempotency_key: str | None = None,
    ) -> QueryResult:
        """Run a SQL query of the analytics subset on ``dataset``, paid from this analyst's
        budget on it, as :meth:`dpkit.analytics.Session.sql` does locally (the options are its
        own; None: its default). On a dataset of several tables the SQL names its tables and may
        join them. The result's remaining ε is the budget's after this debit.

        ``idempotency_key``: the key of an earlier call whose answer was lost
        (:attr:`ConnectionFailedError.idempotency_key
        <dpkit.client.errors.ConnectionFailedError.idempotency_key>`), to get that answer
        without paying again; None: a fresh key."""
        body = _options(
            epsilon=epsilon,
            delta=delta,
            sql=text,
            noise=noise,
            confidence=confidence,
            key_selection=key_selection,
            split=split,
            bounding_epsilon=bounding_epsilon,
        )
        key = idempotency_key if idempotency_key is not None else new_idempotency_key()
        answer = self._connection.post(_path("v1", "datasets", dataset, "query"), body, idempotency_key=key)
        return _read(query_result, answer.body)

    def cost(
        self,
        dataset: str,
        text: str,
        *,
        epsilon: float,
        delta: float | None = None,
        noise: str | None = None,
        confidence: float | None = None,
        key_selection: str | None = None,
        split: Sequence[float] | None = None,
        bounding_epsilon: float | None = None,
    ) -> QueryCost:
        """What :meth:`sql` with the same arguments would debit (:meth:`dpkit.analytics.Session.sql_cost`):
        the query is validated and priced on the declared metadata; nothing is read or spent."""
        body = _options(
            epsilon=epsilon,
            delta=delta,
            sql=text,
            noise=noise,
            confidence=confidence,
            key_selection=key_selection,
            split=split,
            bounding_epsilon=bounding_epsilon,
        )
        return _read(query_cost, self._connection.post(_path("v1", "datasets", dataset, "query", "cost"), body).body)

    # -- synthetic tables ------------------------------------------------------------------------

    def synthesize(
        self,
        dataset: str,
        *,
        epsilon: float,
        delta: float,
        bins: Mapping[str, Sequence[float] | int] | None = None,
        rows: int | None = None,
        method: str | None = None,
        rounds: int | None = None,
        columns: Sequence[str] | None = None,
        integers: Sequence[str] | None = None,
        publish: str | None = None,
        idempotency_key: str | None = None,
    ) -> SyntheticTable:
        """A differentially private synthetic table of ``dataset``, paid from this analyst's
        budget (the settings of :class:`dpkit.synth.Synthesizer`; None: its default). With
        ``publish`` (an analyst the curator named a publisher) it is also stored as a release
        of that name, which everyone granted the dataset downloads for free (:meth:`release`).
        ``idempotency_key`` as for :meth:`sql`."""
        body = _options(
            epsilon=epsilon,
            delta=delta,
            bins=None if bins is None else {k: (list(x) if not isinstance(x, int) else x) for k, x in bins.items()},
            rows=rows,
            method=method,
            rounds=rounds,
            columns=columns,
            integers=integers,
            publish=publish,
        )
        key = idempotency_key if idempotency_key is not None else new_idempotency_key()
        answer = self._connection.post(_path("v1", "datasets", dataset, "synthetic"), body, idempotency_key=key)
        return _read(synthetic_table, answer.body)

    def releases(self) -> list[dict[str, Any]]:
        """The published synthetic tables of the datasets this analyst was granted: name,
        dataset, when, columns and rows (not who published them or what they cost)."""
        found: list[dict[str, Any]] = self._connection.get("/v1/releases").body["releases"]
        return found

    def release(self, name: str) -> SyntheticTable:
        """Download the release ``name`` (its rows and measurement report). Spends nothing: it
        was paid for once, by its publisher. NotFoundError for a release of a dataset this
        analyst was not granted."""
        return _read(synthetic_table, self._connection.get(_path("v1", "releases", name, parameter="name")).body)


def connect(
    url: str,
    key: str | None = None,
    *,
    timeout: float = 300.0,
    retries: int = 3,
    backoff: float = 0.5,
    allow_insecure: bool = False,
) -> RemoteSession:
    """Open a session with the curator service at ``url`` (e.g. ``"https://curator.example.org"``)
    with an analyst's API ``key`` (None: the environment variable ``DPKIT_API_KEY``). The key
    is checked at once (``GET /v1/me``): AuthError if the service does not accept it.

    ``timeout``: seconds to wait for one answer; ``retries`` and ``backoff``: how a lost answer
    is asked for again (:class:`~dpkit.client.connection.Connection`). Plain ``http://`` is refused
    for any host but this machine's unless ``allow_insecure=True``: the key would cross the
    network in clear."""
    if key is None:
        key = os.environ.get(KEY_VARIABLE) or None
        if key is None:
            raise InvalidParameterError(
                "key",
                None,
                f"an API key (dpk_...) as issued by the curator, or the environment variable {KEY_VARIABLE} set to one",
            )
    connection = Connection(url, key, timeout=timeout, retries=retries, backoff=backoff, allow_insecure=allow_insecure)
    me = connection.get("/v1/me").body
    return RemoteSession(connection, analyst=str(me["name"]), role=str(me["role"]))
