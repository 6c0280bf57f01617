"""The query builder: :class:`Query`, an immutable filter + grouping + bounds over a session.

``where``, ``group_by`` and ``bound`` check each step against the session's declared table as
it is called (:mod:`dpkit.analytics.building`); the aggregate methods then price the query
(:mod:`dpkit.analytics.pricing`, no data read) and execute it (:mod:`dpkit.analytics.execute`:
debit first, then the engine and the noise). :meth:`Query.spec` gives the same query as a
:class:`~dpkit.analytics.spec.QuerySpec`, the form SQL and the service's JSON compile to.

Every aggregate method takes the spending options as keyword-only arguments — ``epsilon``
(required), ``delta``, ``noise``, ``confidence``, ``key_selection``, ``split``,
``bounding_epsilon`` (an optional, paid estimate of what contribution bounding left out:
:mod:`dpkit.analytics.bounding`) — with the defaults and checks of
:class:`~dpkit.analytics.spec.QueryOptions`, and ``rng`` for the noise.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from dpkit._validate import short_repr as _short
from dpkit.analytics import aggregates as A
from dpkit.analytics.bounding import check_bounding_engine
from dpkit.analytics.building import Built, check_aggregates, check_bounds, check_group_by, check_where, spec_keys
from dpkit.analytics.declared import DeclaredTable
from dpkit.analytics.engines.base import Engine
from dpkit.analytics.execute import Payer, execute
from dpkit.analytics.metadata import Categorical, Metadata
from dpkit.analytics.plan import GroupKey, Predicate
from dpkit.analytics.pricing import price_built
from dpkit.analytics.results import QueryCost, QueryResult
from dpkit.analytics.spec import Join, JoinHow, Noise, QueryOptions, QuerySpec
from dpkit.errors import Fix, InvalidParameterError
from dpkit.noise.source import RNG

__all__ = ["Query"]


class Session(Protocol):
    """What a query runs on (a :class:`~dpkit.analytics.Session`; described here rather than
    imported, so that this module does not import the session module that imports it)."""

    _declared: DeclaredTable
    _payer: Payer
    _rng: RNG
    _tables: Any  # the session's TableSet over several tables, else None

    @property
    def engine(self) -> Engine: ...

    @property
    def metadata(self) -> Metadata: ...

    def _check_query_rng(self, rng: object) -> None: ...


# The option defaults, read from QueryOptions (the one place they are written).
_DELTA: float = QueryOptions.delta
_NOISE: Noise = QueryOptions.noise
_CONFIDENCE: float = QueryOptions.confidence
_KEY_SELECTION: str = QueryOptions.key_selection
#: The options each single-aggregate method passes on to :meth:`Query.aggregate`.
_PASSED_ON = ("epsilon", "delta", "noise", "confidence", "key_selection", "split", "bounding_epsilon", "rng")


@dataclass(frozen=True)
class Query:
    """A query under construction: a filter, group keys and contribution bounds. Immutable:
    ``where`` and ``group_by`` return new queries; the aggregate methods run it."""

    session: Session
    predicate: Predicate | None
    groups: tuple[GroupKey, ...]
    keys: tuple[tuple[Any, ...], ...] | None
    max_groups: int
    max_rows: int
    #: In a dataset of several tables: the table read, its joins and the facts of the joined
    #: table (None: the session's one table), and the public table the keys come from.
    table: str | None = None
    joins: tuple[Join, ...] = ()
    declared: DeclaredTable | None = None
    keys_from: str | None = None

    @property
    def _t(self) -> DeclaredTable:
        """The declared facts this query is checked and priced against."""
        return self.declared if self.declared is not None else self.session._declared

    @property
    def _engine(self) -> Engine:
        tables = self.session._tables
        if tables is None:
            return self.session.engine
        return tables.engines[self.table if self.table is not None else tables.default]

    # -- building -------------------------------------------------------------------------------

    def join(self, table: str, on: Any, *, how: JoinHow = "inner") -> Query:
        """Join another table of the dataset (:mod:`dpkit.analytics.joins`): a public table on
        declared columns of the same type (``max_matches`` bounds its rows per key), or a private
        table on the privacy unit (each side truncated to its ``join_rows`` per unit). ``on``: a
        column name (the same on both sides), a list of names and ``(left, right)`` pairs, or a
        mapping from left to right; ``how``: ``"inner"`` or ``"left"``. The joined table's
        columns are ``table.column``, and the bare name where only one table has it. Call it
        before ``where`` and ``group_by``."""
        tables = self.session._tables
        if tables is None:
            raise InvalidParameterError(
                "join.table",
                _short(table),
                "no join: this session has one table",
                "open a session over several tables (a dict of tables with DatasetMetadata)",
            )
        if self.predicate is not None or self.groups or self.keys_from is not None:
            raise InvalidParameterError(
                "join", _short(table), "join before where and group_by", "their columns are the joined table's"
            )
        j = Join(table, on, how)
        base = self.table if self.table is not None else tables.default
        declared = tables.joined(base, (*self.joins, j))
        return replace(self, joins=(*self.joins, j), declared=declared)

    def where(self, predicate: str | Predicate) -> Query:
        """Keep rows matching ``predicate`` (SQL text such as ``"age > 30 AND sex = 'F'"``, or a
        predicate object). Filters run before contribution bounding."""
        return replace(self, predicate=check_where(self._t, self.predicate, predicate))

    def group_by(
        self,
        *columns: str,
        keys: Sequence[Any] | None = None,
        bins: dict[str, Sequence[float] | int] | None = None,
        keys_from: str | None = None,
    ) -> Query:
        """Group by ``columns``. ``keys``: the public key list (values for one column, tuples for
        several); without it, declared category lists (and ``bins``) are the keys, and columns
        with neither get their keys selected privately (which needs δ > 0). ``bins``: edges per
        numeric column, or a number of equal-width bins over its declared bounds; the key is the
        bin's label ``[a, b)``. ``keys_from``: a public table of the dataset whose distinct rows
        (its columns named as the group columns) are the keys — every one reported, empty groups
        included — instead of ``keys``."""
        t = self._t
        if keys_from is not None:
            if keys is not None or bins:
                raise InvalidParameterError("keys_from", _short(keys_from), "None with keys= or bins=")
            tables = self.session._tables
            if tables is None:
                raise InvalidParameterError(
                    "keys_from", _short(keys_from), "None: a dataset of one table has no public key tables"
                )
            keys = tables.keys(keys_from, columns)
            keys = list(keys) if len(columns) > 1 else [k[0] for k in keys]
        groups, key_tuples = check_group_by(t, self.groups, columns, keys, bins)
        return replace(self, groups=groups, keys=key_tuples, keys_from=keys_from)

    def bound(self, *, max_groups: int | None = None, max_rows: int | None = None) -> Query:
        """Override the session's contribution bounds for this query."""
        g, r = check_bounds(self._t, (self.max_groups, self.max_rows), max_groups, max_rows)
        return replace(self, max_groups=g, max_rows=r)

    def spec(self, aggregates: Sequence[A.Aggregate], options: QueryOptions | None = None) -> QuerySpec:
        """This query, with ``aggregates`` and ``options``, as a :class:`QuerySpec`."""
        return QuerySpec(
            aggregates=tuple(aggregates),
            where=self.predicate,
            group_by=tuple(g.column for g in self.groups),
            keys=None if self.keys_from is not None else spec_keys(self.groups, self.keys),
            bins={g.column: g.edges for g in self.groups if g.edges is not None} or None,
            max_groups=self.max_groups,
            max_rows=self.max_rows,
            table=self.table,
            joins=self.joins,
            keys_from=self.keys_from,
            options=options,
        )

    def _built(self) -> Built:
        return Built(self.predicate, self.groups, self.keys, self.max_groups, self.max_rows)

    # -- aggregates ------------------------------------------------------------------------------

    def count(
        self,
        *,
        epsilon: float,
        delta: float = _DELTA,
        noise: Noise = _NOISE,
        confidence: float = _CONFIDENCE,
        key_selection: str = _KEY_SELECTION,
        split: Sequence[float] | None = None,
        bounding_epsilon: float | None = None,
        rng: RNG = None,
    ) -> QueryResult:
        """The number of rows (per group), each unit contributing at most max_rows per group."""
        return self._one(A.Count(), locals())

    def count_units(
        self,
        *,
        epsilon: float,
        delta: float = _DELTA,
        noise: Noise = _NOISE,
        confidence: float = _CONFIDENCE,
        key_selection: str = _KEY_SELECTION,
        split: Sequence[float] | None = None,
        bounding_epsilon: float | None = None,
        rng: RNG = None,
    ) -> QueryResult:
        """The number of distinct privacy units (per group)."""
        return self._one(A.CountUnits(), locals())

    def sum(
        self,
        column: str,
        *,
        epsilon: float,
        delta: float = _DELTA,
        noise: Noise = _NOISE,
        confidence: float = _CONFIDENCE,
        key_selection: str = _KEY_SELECTION,
        split: Sequence[float] | None = None,
        bounding_epsilon: float | None = None,
        rng: RNG = None,
    ) -> QueryResult:
        """The sum of ``column``'s values, clipped to its declared bounds."""
        return self._one(A.Sum(column), locals())

    def mean(
        self,
        column: str,
        *,
        epsilon: float,
        delta: float = _DELTA,
        noise: Noise = _NOISE,
        confidence: float = _CONFIDENCE,
        key_selection: str = _KEY_SELECTION,
        split: Sequence[float] | None = None,
        bounding_epsilon: float | None = None,
        rng: RNG = None,
    ) -> QueryResult:
        """The mean of ``column``'s clipped values."""
        return self._one(A.Mean(column), locals())

    def variance(
        self,
        column: str,
        *,
        epsilon: float,
        delta: float = _DELTA,
        noise: Noise = _NOISE,
        confidence: float = _CONFIDENCE,
        key_selection: str = _KEY_SELECTION,
        split: Sequence[float] | None = None,
        bounding_epsilon: float | None = None,
        rng: RNG = None,
    ) -> QueryResult:
        """The (population) variance of ``column``'s clipped values."""
        return self._one(A.Variance(column), locals())

    def std(
        self,
        column: str,
        *,
        epsilon: float,
        delta: float = _DELTA,
        noise: Noise = _NOISE,
        confidence: float = _CONFIDENCE,
        key_selection: str = _KEY_SELECTION,
        split: Sequence[float] | None = None,
        bounding_epsilon: float | None = None,
        rng: RNG = None,
    ) -> QueryResult:
        """The standard deviation of ``column``'s clipped values."""
        return self._one(A.Std(column), locals())

    def quantile(
        self,
        column: str,
        q: float,
        *,
        epsilon: float,
        delta: float = _DELTA,
        noise: Noise = _NOISE,
        confidence: float = _CONFIDENCE,
        key_selection: str = _KEY_SELECTION,
        split: Sequence[float] | None = None,
        bounding_epsilon: float | None = None,
        rng: RNG = None,
    ) -> QueryResult:
        """The ``q``-quantile of ``column``'s clipped values (exponential mechanism per group)."""
        return self._one(A.QuantileAgg(column, q), locals())

    def median(
        self,
        column: str,
        *,
        epsilon: float,
        delta: float = _DELTA,
        noise: Noise = _NOISE,
        confidence: float = _CONFIDENCE,
        key_selection: str = _KEY_SELECTION,
        split: Sequence[float] | None = None,
        bounding_epsilon: float | None = None,
        rng: RNG = None,
    ) -> QueryResult:
        """The median of ``column``'s clipped values."""
        return self._one(A.QuantileAgg(column, 0.5), locals())

    def histogram(
        self,
        column: str,
        *,
        bins: Sequence[float] | int | None = None,
        epsilon: float,
        delta: float = _DELTA,
        noise: Noise = _NOISE,
        confidence: float = _CONFIDENCE,
        key_selection: str = _KEY_SELECTION,
        split: Sequence[float] | None = None,
        bounding_epsilon: float | None = None,
        rng: RNG = None,
    ) -> QueryResult:
        """Counts over the declared categories of ``column``, or over ``bins`` of a numeric one:
        a list of edges, or a number of equal-width bins over its declared bounds."""
        if self.groups:
            raise InvalidParameterError(
                "histogram", column, "a query without group_by (the histogram groups by its column)"
            )
        spec = self.session.metadata.columns.get(column)
        if bins is None and not (isinstance(spec, Categorical) and spec.categories is not None):
            fix = Fix("declare_categories", "Categorical([...]) in the metadata", {"column": column})
            raise InvalidParameterError(
                "column",
                column,
                f"a column with declared categories ({fix.text}), or bins= for a numeric column",
                "a histogram's keys must be public",
                fix=fix,
            )
        q = self.group_by(column, bins=None if bins is None else {column: bins})
        return q._one(A.Count(), locals())

    def _one(self, aggregate: A.Aggregate, args: Mapping[str, Any]) -> QueryResult:
        """:meth:`aggregate` of one aggregate, with the options of the single-aggregate method that
        calls it (its ``locals()``): their signatures stay explicit, their bodies one line."""
        return self.aggregate([aggregate], **{name: args[name] for name in _PASSED_ON})

    def aggregate(
        self,
        aggregates: Sequence[A.Aggregate],
        *,
        epsilon: float,
        delta: float = _DELTA,
        noise: Noise = _NOISE,
        confidence: float = _CONFIDENCE,
        key_selection: str = _KEY_SELECTION,
        split: Sequence[float] | None = None,
        bounding_epsilon: float | None = None,
        rng: RNG = None,
        _text: str | None = None,
    ) -> QueryResult:
        """Release several aggregates in one pass; ``epsilon`` (and ``delta``) are split across
        them in proportion to ``split`` (equal shares by default; with private key selection the
        selection takes one more share, last in ``split``). δ goes, in equal shares, to private
        key selection and to Gaussian-noise aggregates; an unused δ is not spent. With
        ``bounding_epsilon`` the result also estimates what contribution bounding left out,
        for that much more ε in the same debit (:mod:`dpkit.analytics.bounding`)."""
        s = self.session
        t = self._t
        specs = check_aggregates(t, self.groups, aggregates)
        options = QueryOptions(epsilon, delta, noise, confidence, key_selection, split, bounding_epsilon)  # type: ignore[arg-type]
        s._check_query_rng(rng)
        priced = price_built(self._built(), specs, options, t, text=_text)
        return execute(priced, self._engine, s._payer, rng if rng is not None else s._rng)

    def cost(
        self,
        aggregates: Sequence[A.Aggregate],
        *,
        epsilon: float,
        delta: float = _DELTA,
        noise: Noise = _NOISE,
        confidence: float = _CONFIDENCE,
        key_selection: str = _KEY_SELECTION,
        split: Sequence[float] | None = None,
        bounding_epsilon: float | None = None,
        _text: str | None = None,
    ) -> QueryCost:
        """What :meth:`aggregate` with the same arguments would debit — validated the same way,
        computed without reading the data, drawing noise or spending anything."""
        t = self._t
        specs = check_aggregates(t, self.groups, aggregates)
        options = QueryOptions(epsilon, delta, noise, confidence, key_selection, split, bounding_epsilon)  # type: ignore[arg-type]
        priced = price_built(self._built(), specs, options, t, text=_text)
        check_bounding_engine(priced.bounding, self._engine)  # refused here as when paying
        return priced.cost()
