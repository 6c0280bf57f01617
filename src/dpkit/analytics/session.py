"""Private analytics over a table: :class:`Session` and its query builder :class:`Query`.

A session holds the table (through an engine), the privacy unit, the neighbour relation, the
budget (an in-memory :class:`dpkit.Budget` or a ledger entry for (dataset, analyst)) and the
curator's declared schema (:class:`~dpkit.analytics.Metadata`). Every query runs the same steps
(DESIGN core idea 1: pay before the data is touched):

1. validate the request against the *declared* schema and metadata only (no row is read),
   including the session's size limits (:class:`~dpkit.analytics.limits.QueryLimits`: public
   keys and result rows are counted as integers, never listed; the answer's size is bounded
   from the metadata);
2. price it: build every mechanism and the composed event (no data);
3. debit the budget atomically — a refusal never touches the data, so neither its content nor
   its timing depends on it;
4. run the engine (filter, contribution bounding, exact integer sums) and add the noise (and,
   without public keys, select the keys privately). Every step here is total: values that break
   a declared rule are NULL or clamped by rules written down in advance, the output's shape
   (columns, rows, public key set) does not depend on the data, and if anything still fails the
   debit stands and the analyst gets one :class:`~dpkit.errors.QueryFailedError` whose message
   names nothing (the details go to the ``dpkit.curator`` log);
5. return a :class:`~dpkit.analytics.results.QueryResult` with values, confidence intervals,
   noise scales, the cost, the privacy unit and the contribution bounds used.

Sensitivities (privacy unit = a column; ``G = max_groups``, ``R = max_rows``; ``F = G`` groups a
unit can touch under ``add_remove``; every sensitivity doubles under ``replace``, which is one
removal and one addition):

=================  ====================  ======================
noisy quantity      ℓ1 (Laplace)          ℓ2 (Gaussian)
=================  ====================  ======================
rows per group      G·R                   √G·R
units per group     G                     √G
clipped sum         G·R·max(|L|, |U|)     √G·R·max(|L|, |U|)
centred sum         G·R·(U − L)/2         √G·R·(U − L)/2
=================  ====================  ======================

(on the quantisation grid of :mod:`dpkit.analytics.plan`, exactly). Without a group-by, G = 1.
With each row its own unit, G = R = 1. Quantiles use the exponential mechanism per group with
ε/(F·R) so that a unit's R rows in each of its F groups cost ε in all.

>>> import pandas as pd, numpy as np
>>> from dpkit.analytics import Session, Metadata, Numeric, Categorical
>>> from dpkit.budget import Budget
>>> df = pd.DataFrame({"age": [30, 40, 50, 60] * 50, "sex": ["F", "M"] * 100})
>>> meta = Metadata(columns={"age": Numeric(0, 100), "sex": Categorical(("F", "M"))}, row_level=True)
>>> s = Session(df, budget=Budget(epsilon=1.0), metadata=meta, rng=np.random.default_rng(0))
>>> r = s.group_by("sex").count(epsilon=0.5)
>>> r.value.round(-1).tolist(), r.epsilon
([100.0, 100.0], 0.5)
>>> s.remaining
0.5
"""

from __future__ import annotations

import functools
import itertools
import json
import logging
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd

from dpkit import _validate as v
from dpkit._validate import Neighbours
from dpkit._validate import short_repr as _short
from dpkit.accounting.composition import basic_cost
from dpkit.accounting.events import ApproxDPEvent, ComposedEvent, DPEvent, ExponentialEvent, SelfComposedEvent, event_to_dict
from dpkit.analytics import aggregates as A
from dpkit.analytics.engines.base import GAUSSIAN_SUM_LIMIT, Engine, ReadType
from dpkit.analytics.key_selection import KEY_SELECTIONS, KeySelector, key_selector
from dpkit.analytics.limits import (
    JSON_BIN_LABEL_BYTES,
    JSON_BOOLEAN_BYTES,
    JSON_NULL_BYTES,
    JSON_NUMBER_BYTES,
    QueryLimits,
    json_text_bound,
    json_text_bounds,
    public_key_count,
)
from dpkit.analytics.metadata import Categorical, Metadata, Numeric
from dpkit.analytics.plan import (
    AggregationPlan,
    And,
    Between,
    Compare,
    GroupKey,
    InList,
    IsNull,
    Not,
    Or,
    Predicate,
    SumSpec,
    ValueSpec,
    quantize_spec,
)
from dpkit.analytics.results import AggregateInfo, QueryCost, QueryResult
from dpkit.budget import Budget
from dpkit.errors import DPError, InvalidParameterError, LedgerError, QueryFailedError
from dpkit.ledger.base import LedgerBackend
from dpkit.mechanisms.gaussian import Gaussian
from dpkit.mechanisms.laplace import Geometric
from dpkit.mechanisms.quantiles import Quantile as QuantileMechanism
from dpkit.noise.integers import uniform_below
from dpkit.noise.source import RNG, RandomSource, is_seeded, resolve_rng

__all__ = ["Session", "Query"]

Noise = Literal["laplace", "gaussian"]
#: A declared column's kind as queries see it (see Metadata.kind); ``unit`` is the privacy-unit
#: column when it is not declared itself (usable as the unit and in COUNT(DISTINCT ...) only).
ColumnKind = Literal["numeric", "string", "boolean", "unit"]

#: Where the details of a query that failed after its debit go: the curator's log, never the analyst.
_curator_log = logging.getLogger("dpkit.curator")


def _check_rng(rng: object, ledger: object) -> None:
    """``rng`` must be randomness; a seeded one never meets a ledger (tests and teaching use an
    in-memory Budget)."""
    if rng is None:
        return
    resolve_rng(rng)  # a clear error for anything that is not randomness
    if is_seeded(rng) and ledger is not None:
        raise InvalidParameterError(
            "rng", _short(rng), "None (the secure default) when spending from a ledger",
            "seeded noise can be replayed and subtracted, so a ledger would charge for privacy that was not given; use budget=dp.Budget(...) for tests and teaching",
        )


# ================================================================================================
# Session
# ================================================================================================


def _make_engine(data: Any, engine: object) -> Engine:
    if engine is not None and not isinstance(engine, str):
        if isinstance(engine, Engine):
            return engine
        raise InvalidParameterError("engine", _short(engine), "'duckdb', 'spark', an Engine instance, or None (chosen from the data)")
    if engine not in (None, "duckdb", "spark"):
        raise InvalidParameterError("engine", engine, "'duckdb', 'spark', an Engine instance, or None (chosen from the data)")
    is_spark = type(data).__module__.startswith("pyspark.")
    if engine == "spark" or (engine is None and is_spark):
        if not is_spark:
            raise InvalidParameterError("engine", engine, "'spark' only with a pyspark DataFrame as data")
        from dpkit.analytics.engines.spark import SparkEngine

        return SparkEngine(data)
    from dpkit.analytics.engines.duckdb import DuckDBEngine

    return DuckDBEngine(data)


class Session:
    """A private view of one table for one analyst.

    Parameters (keyword-only after ``data``)
    ----------------------------------------
    data:
        A pandas DataFrame, a CSV or Parquet path, a DuckDB relation, or a pyspark DataFrame.
    privacy_unit, row_level:
        Who is protected — exactly one of them: ``privacy_unit`` names the column identifying
        the person (``"user_id"``); ``row_level=True`` says every row is a different person.
        Default: the metadata's. A session with neither is refused.
    budget, ledger:
        Exactly one: an in-memory :class:`dpkit.Budget`, or a ledger (a
        :class:`~dpkit.ledger.LedgerBackend` or the path of a SQLite ledger) with ``dataset``
        (default: ``table``) and ``analyst`` naming an existing budget.
    metadata:
        The curator's :class:`~dpkit.analytics.Metadata` (or its dict / JSON path): every column
        an analyst may use, with its type, bounds and public categories. Columns that are not
        declared cannot be used; nothing is ever inferred from the data.
    max_groups, max_rows:
        Contribution bounds per privacy unit (defaults: the metadata's, else 1). Only with a
        ``privacy_unit``.
    neighbours:
        ``"add_remove"`` (a unit's rows added or removed; default) or ``"replace"``.
    engine:
        ``"duckdb"`` (default for everything but Spark DataFrames), ``"spark"``, or an engine.
    table:
        The table's name in SQL (``FROM table``).
    portable:
        Compute row priorities with md5 so that DuckDB and Spark keep exactly the same rows
        (slower; for moving a seeded pipeline between engines).
    rng:
        Randomness for noise, key selection and row sampling. Default: the OS CSPRNG. A seeded
        ``numpy.random.Generator`` is for tests and teaching only: it is refused with a ledger
        (seeded noise can be replayed and subtracted, so the ledger's charge would be a lie), and
        results drawn with it say so.
    limits:
        How large one query may be (:class:`~dpkit.analytics.limits.QueryLimits`; default
        ``QueryLimits()``): public group keys, result rows, the answer's size and the nesting of
        SQL text. Checked on the request and the metadata before paying; a query over a limit
        raises :class:`~dpkit.errors.LimitExceededError` and spends nothing.
    """

    def __init__(
        self,
        data: Any,
        *,
        privacy_unit: str | None = None,
        budget: Budget | None = None,
        ledger: LedgerBackend | str | os.PathLike[str] | None = None,
        dataset: str | None = None,
        analyst: str | None = None,
        metadata: Metadata | dict[str, Any] | str | os.PathLike[str] | None = None,
        max_groups: int | None = None,
        max_rows: int | None = None,
        neighbours: Neighbours = "add_remove",
        engine: Any = None,
        table: str = "data",
        portable: bool = False,
        rng: RNG = None,
        row_level: bool | None = None,
        limits: QueryLimits | None = None,
    ) -> None:
        if limits is not None and not isinstance(limits, QueryLimits):
            raise InvalidParameterError("limits", _short(limits), "a dpkit.analytics.QueryLimits or None (the defaults)")
        self._limits = limits if limits is not None else QueryLimits()
        self._metadata = self._check_metadata(metadata)
        self._neighbours = v.neighbours(neighbours)
        if not isinstance(table, str) or not table:
            raise InvalidParameterError("table", table, "a non-empty table name")
        self._table = table
        if not isinstance(portable, bool):
            raise InvalidParameterError("portable", portable, "True or False")
        self._portable = portable
        self._unit = self._check_unit(privacy_unit, row_level)
        _check_rng(rng, ledger)
        self._rng = rng
        self._budget, self._ledger, self._dataset, self._analyst = self._check_budget(budget, ledger, dataset, analyst, table)
        self._engine = _make_engine(data, engine)
        self._schema = self._bind()
        self._max_groups = self._check_bound("max_groups", max_groups, self._metadata.max_groups)
        self._max_rows = self._check_bound("max_rows", max_rows, self._metadata.max_rows)

    # -- construction helpers -----------------------------------------------------------------

    @classmethod
    def from_csv(cls, path: str | os.PathLike[str], **kwargs: Any) -> Session:
        """A session over a CSV file (read by DuckDB; the table is named after the file's stem
        unless ``table=`` is given)."""
        kwargs.setdefault("table", Path(path).stem)
        return cls(path, **kwargs)

    @classmethod
    def from_parquet(cls, path: str | os.PathLike[str], **kwargs: Any) -> Session:
        """A session over a Parquet file (or a directory of them, through DuckDB)."""
        kwargs.setdefault("table", Path(path).stem)
        return cls(path, **kwargs)

    @classmethod
    def from_duckdb(cls, connection: Any, table: str, **kwargs: Any) -> Session:
        """A session over a table or view of an open DuckDB connection."""
        from dpkit.analytics.engines.duckdb import DuckDBEngine

        kwargs.setdefault("table", table)
        return cls(None, engine=DuckDBEngine(None, connection=connection, table=table), **kwargs)

    @staticmethod
    def _check_metadata(metadata: object) -> Metadata:
        if metadata is None:
            return Metadata()
        if isinstance(metadata, Metadata):
            return metadata
        if isinstance(metadata, dict):
            return Metadata.from_dict(metadata)
        if isinstance(metadata, (str, os.PathLike)):
            return Metadata.from_json(metadata)
        raise InvalidParameterError("metadata", _short(metadata), "a Metadata, a dict, a JSON file path, or None")

    def _check_unit(self, privacy_unit: object, row_level: object) -> str | None:
        """The privacy unit, stated explicitly (a column) or row-level by declaration."""
        meta = self._metadata
        if row_level is not None and not isinstance(row_level, bool):
            raise InvalidParameterError("row_level", row_level, "True, False or None (the metadata's)")
        if privacy_unit is not None:
            if not isinstance(privacy_unit, str) or not privacy_unit:
                raise InvalidParameterError("privacy_unit", _short(privacy_unit), "a column name")
            if row_level:
                raise InvalidParameterError("row_level", row_level, "False or None with a privacy_unit", "a session protects either the unit column's people or rows, not both")
            return privacy_unit
        if row_level:
            if meta.privacy_unit is not None:
                raise InvalidParameterError(
                    "row_level", True, f"False or None: the metadata declares the privacy unit {meta.privacy_unit!r}",
                    "protecting rows would give a person with several rows several times the budget",
                )
            return None
        if meta.privacy_unit is not None:
            return meta.privacy_unit
        if meta.row_level and row_level is None:
            return None
        raise InvalidParameterError(
            "privacy_unit", None, "the column naming the person (privacy_unit='user_id'), or row_level=True when every row is a different person",
            "with several rows per person, protecting rows protects nobody: say who the unit is (here or in the metadata)",
        )

    def _bind(self) -> dict[str, ColumnKind]:
        """Check the declared schema against the source's own schema (no row is read) and read
        every declared column as its declared type from now on."""
        physical = self._engine.schema()
        meta = self._metadata
        names = list(meta.columns) + ([self._unit] if self._unit is not None and self._unit not in meta.columns else [])
        for name in names:
            what = "privacy_unit" if name == self._unit and name not in meta.columns else f"metadata.columns.{name}"
            if name not in physical:
                raise InvalidParameterError(what, name, "a column of the source", "the declared column is not in the table")
            if physical[name] == "nested":
                raise InvalidParameterError(what, name, "a column of a scalar type (number, text or boolean)", "LIST, STRUCT, MAP and array columns cannot be declared")
        types: dict[str, ReadType] = {}
        kinds: dict[str, ColumnKind] = {}
        for name, spec in meta.columns.items():
            types[name] = "double" if isinstance(spec, Numeric) else spec.value_type  # type: ignore[assignment]
            kinds[name] = meta.kind(name)
        if self._unit is not None and self._unit not in meta.columns:
            types[self._unit] = "unit"
            kinds[self._unit] = "unit"
        self._engine.bind(types, strip_strings=meta.strip_strings)
        return kinds

    @staticmethod
    def _check_budget(budget: object, ledger: object, dataset: object, analyst: object, table: str) -> tuple[Any, Any, str | None, str | None]:
        if (budget is None) == (ledger is None):
            raise InvalidParameterError(
                "budget", _short(budget), "exactly one of budget= (a dpkit.Budget) and ledger= (a ledger or its path)",
                "every release is paid for, so a session needs somewhere to pay",
            )
        if budget is not None:
            if not isinstance(budget, Budget):
                raise InvalidParameterError("budget", _short(budget), "a dpkit.Budget (e.g. Budget(epsilon=1.0))")
            return budget, None, None, None
        if isinstance(ledger, (str, os.PathLike)):
            from dpkit.ledger import open_ledger

            ledger = open_ledger(ledger)
        if not isinstance(ledger, LedgerBackend):
            raise InvalidParameterError("ledger", _short(ledger), "a ledger (dpkit.open_ledger(path)) or the path of one")
        dataset = table if dataset is None else dataset
        for name, value in (("dataset", dataset), ("analyst", analyst)):
            if not isinstance(value, str) or not value:
                raise InvalidParameterError(name, value, "a non-empty name of a budget in the ledger")
        ledger.get_budget(dataset, analyst)  # type: ignore[arg-type]  # LedgerError if there is none
        return None, ledger, dataset, analyst  # type: ignore[return-value]

    def _check_bound(self, name: str, value: object, default: int | None) -> int:
        if value is None:
            if self._unit is None:
                return 1
            return default if default is not None else 1
        n = v.positive_int(value, name)
        if self._unit is None and n != 1:
            raise InvalidParameterError(name, value, "1 (or None) when each row is the privacy unit", "set privacy_unit= to bound a person's contributions")
        return n

    # -- state -----------------------------------------------------------------------------------

    @property
    def engine(self) -> Engine:
        return self._engine

    @property
    def privacy_unit(self) -> str | None:
        return self._unit

    @property
    def metadata(self) -> Metadata:
        return self._metadata

    @property
    def neighbours(self) -> Neighbours:
        return self._neighbours

    @property
    def table(self) -> str:
        return self._table

    @property
    def limits(self) -> QueryLimits:
        """How large one query may be (see :class:`~dpkit.analytics.limits.QueryLimits`)."""
        return self._limits

    @property
    def columns(self) -> dict[str, ColumnKind]:
        """The declared columns and their kinds (from the metadata, never from the data)."""
        return dict(self._schema)

    @property
    def remaining(self) -> float:
        """ε left in the session's budget (or ledger entry)."""
        if self._budget is not None:
            return self._budget.remaining
        return self._ledger.get_budget(self._dataset, self._analyst).remaining_epsilon

    @property
    def spent(self) -> tuple[float, float]:
        """(ε, δ) spent so far."""
        if self._budget is not None:
            return self._budget.spent
        rec = self._ledger.get_budget(self._dataset, self._analyst)
        return rec.spent_epsilon, rec.spent_delta

    def _pay(self, event: DPEvent, epsilon: float, delta: float, text: str) -> int | None:
        """Debit the query's event (raises BudgetExceededError and records nothing if refused);
        the ledger's spend id, or None for an in-memory budget."""
        if self._budget is not None:
            self._budget.spend(event)
            return None
        try:
            basic_cost(event)
            costs: dict[str, float] = {}
        except DPError:
            # No basic-composition price (Gaussian noise): the query was calibrated to (ε, δ).
            costs = {"epsilon_cost": epsilon, "delta_cost": delta}
        return self._ledger.debit(self._dataset, self._analyst, event, text, **costs).id

    # -- queries -----------------------------------------------------------------------------------

    def query(self) -> Query:
        """A query over the whole table, to refine with ``where`` / ``group_by``."""
        return Query(self, None, (), None, self._max_groups, self._max_rows)

    def where(self, predicate: str | Predicate) -> Query:
        return self.query().where(predicate)

    def group_by(self, *columns: str, keys: Sequence[Any] | None = None, bins: dict[str, Sequence[float]] | None = None) -> Query:
        return self.query().group_by(*columns, keys=keys, bins=bins)

    def count(self, **kwargs: Any) -> QueryResult:
        return self.query().count(**kwargs)

    def count_units(self, **kwargs: Any) -> QueryResult:
        return self.query().count_units(**kwargs)

    def sum(self, column: str, **kwargs: Any) -> QueryResult:
        return self.query().sum(column, **kwargs)

    def mean(self, column: str, **kwargs: Any) -> QueryResult:
        return self.query().mean(column, **kwargs)

    def variance(self, column: str, **kwargs: Any) -> QueryResult:
        return self.query().variance(column, **kwargs)

    def std(self, column: str, **kwargs: Any) -> QueryResult:
        return self.query().std(column, **kwargs)

    def quantile(self, column: str, q: float, **kwargs: Any) -> QueryResult:
        return self.query().quantile(column, q, **kwargs)

    def median(self, column: str, **kwargs: Any) -> QueryResult:
        return self.query().median(column, **kwargs)

    def histogram(self, column: str, *, bins: Sequence[float] | None = None, **kwargs: Any) -> QueryResult:
        return self.query().histogram(column, bins=bins, **kwargs)

    def aggregate(self, aggregates: Sequence[A.Aggregate], **kwargs: Any) -> QueryResult:
        return self.query().aggregate(aggregates, **kwargs)

    def sql(self, text: str, *, epsilon: float, delta: float = 0.0, **kwargs: Any) -> QueryResult:
        """Run a SQL query of the documented subset (see :mod:`dpkit.analytics.sql`); the budget
        ``epsilon`` (and ``delta``) is split across its aggregates, as stated in the result."""
        from dpkit.analytics.sql import compile_sql

        query, aggs = compile_sql(self, text)
        return query.aggregate(aggs, epsilon=epsilon, delta=delta, _text=text, **kwargs)

    def sql_cost(self, text: str, *, epsilon: float, delta: float = 0.0, **kwargs: Any) -> QueryCost:
        """What :meth:`sql` with the same arguments would debit, without reading the data or
        spending anything (the query is parsed and validated just the same)."""
        from dpkit.analytics.sql import compile_sql

        query, aggs = compile_sql(self, text)
        return query.cost(aggs, epsilon=epsilon, delta=delta, _text=text, **kwargs)

    def __repr__(self) -> str:
        unit = self._unit or "each row"
        return (
            f"Session(table={self._table!r}, engine={self._engine.name!r}, privacy_unit={unit!r}, "
            f"max_groups={self._max_groups}, max_rows={self._max_rows}, neighbours={self._neighbours!r}, "
            f"remaining ε={self.remaining:.6g})"
        )


# ================================================================================================
# Query
# ================================================================================================


def _literal_kind(value: object) -> ColumnKind | None:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        try:
            return "numeric" if math.isfinite(value) else None
        except OverflowError:  # an integer beyond the doubles: no column value can equal it
            return None
    if isinstance(value, str):
        return "string"
    return None


def _public_counts(metadata: Metadata, groups: Sequence[GroupKey]) -> list[int | None]:
    """Per group column: how many public values it has (bins, declared categories), or None
    when its keys are selected privately."""
    out: list[int | None] = []
    for g in groups:
        spec = metadata.columns.get(g.column)
        if g.edges is not None:
            out.append(len(g.edges) - 1)
        elif isinstance(spec, Categorical) and spec.categories is not None:
            out.append(len(spec.categories))
        else:
            out.append(None)
    return out


def _public_key_count(metadata: Metadata, groups: Sequence[GroupKey]) -> int:
    """The number of public keys of a group-by without ``keys=`` (with a privately selected
    column: the product of the other columns' public values, which still filter the table)."""
    return public_key_count(c for c in _public_counts(metadata, groups) if c is not None)


def _predicate_depth(p: Predicate) -> int:
    """How deep a predicate tree is (walked without recursion, so any depth can be measured)."""
    deepest = 0
    stack: list[tuple[Predicate, int]] = [(p, 1)]
    while stack:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        if isinstance(node, (And, Or)):
            stack.extend((x, depth + 1) for x in node.parts)
        elif isinstance(node, Not):
            stack.append((node.part, depth + 1))
    return deepest


@functools.lru_cache(maxsize=256)
def _category_bytes(spec: Categorical) -> int:
    """The longest JSON text of one of a column's declared categories (metadata only)."""
    assert spec.categories is not None
    if spec.value_type == "boolean":
        return JSON_BOOLEAN_BYTES
    if spec.value_type == "integer":
        return JSON_NUMBER_BYTES  # within ±2**53, even when read back as a double
    return int(json_text_bounds(pd.Series(spec.categories, dtype=object)).max())


def _bin_label_bytes(edges: Sequence[float]) -> int:
    """The longest JSON text of a bin label ``"[a, b)"`` (the edges are the request's own and
    number at most max_keys + 1 by now)."""
    widest = max(len(f"{e:g}") for e in edges)
    return min(2 * widest + 6, JSON_BIN_LABEL_BYTES)


def _literal_bytes(values: Sequence[Any]) -> int:
    """The longest JSON text of explicit key values (the analyst's own request)."""
    texts = [x for x in values if isinstance(x, str)]
    out = JSON_NULL_BYTES
    if texts:
        out = max(out, int(json_text_bounds(pd.Series(texts, dtype=object)).max()))
    if any(isinstance(x, bool) for x in values):
        out = max(out, JSON_BOOLEAN_BYTES)
    for x in values:
        if isinstance(x, (int, float)) and not isinstance(x, bool):
            out = max(out, JSON_NUMBER_BYTES if isinstance(x, float) or abs(x) < 10**20 else len(str(x)))
    return out


@dataclass(frozen=True)
class _Noisy:
    """One noisy integer quantity: the noisy values (integer units), its half-width at the
    requested confidence share, its scale and sensitivity (integer units) and its event."""

    values: np.ndarray
    halfwidth: float
    scale: float
    sensitivity: float
    event: DPEvent


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

    # -- building -------------------------------------------------------------------------------

    def where(self, predicate: str | Predicate) -> Query:
        """Keep rows matching ``predicate`` (SQL text such as ``"age > 30 AND sex = 'F'"``, or a
        predicate object). Filters run before contribution bounding."""
        limits = self.session._limits
        if isinstance(predicate, str):
            from dpkit.analytics.sql import parse_predicate

            predicate = parse_predicate(predicate, limits=limits)  # its text's nesting is checked there
        elif isinstance(predicate, (Compare, InList, Between, IsNull, And, Or, Not)):
            limits.check("where nesting depth", _predicate_depth(predicate), "max_query_depth")
        if not isinstance(predicate, (Compare, InList, Between, IsNull, And, Or, Not)):
            raise InvalidParameterError("predicate", _short(predicate), "SQL text such as \"age > 30\" or a dpkit.analytics.plan predicate")
        self._check_predicate(predicate)
        combined = predicate if self.predicate is None else And((self.predicate, predicate))
        return replace(self, predicate=combined)

    def group_by(self, *columns: str, keys: Sequence[Any] | None = None, bins: dict[str, Sequence[float]] | None = None) -> Query:
        """Group by ``columns``. ``keys``: the public key list (values for one column, tuples for
        several); without it, declared category lists (and ``bins``) are the keys, and columns
        with neither get their keys selected privately (which needs δ > 0). ``bins``: edges per
        numeric column; the key is the bin's label ``[a, b)``."""
        if self.groups:
            raise InvalidParameterError("group_by", columns, "a single group_by call per query (pass every column at once)")
        if not columns:
            raise InvalidParameterError("columns", columns, "at least one column name")
        bins = {} if bins is None else bins
        if not isinstance(bins, dict):
            raise InvalidParameterError("bins", _short(bins), "a dict from column name to a list of increasing edges")
        if len(set(columns)) != len(columns):
            raise InvalidParameterError("columns", columns, "distinct column names")
        schema = self.session._schema
        out = []
        for c in columns:
            if not isinstance(c, str) or c not in schema:
                raise InvalidParameterError("columns", _short(c), f"a declared column ({', '.join(schema)})")
            if schema[c] == "unit":
                raise InvalidParameterError("columns", c, "a declared column other than the privacy unit", "grouping by the unit would publish who is in the data; declare the column in the metadata to use it")
            if c in bins:
                out.append(GroupKey(c, self._check_edges(c, bins[c])))
            else:
                out.append(GroupKey(c))
        for c in bins:
            if c not in columns:
                raise InvalidParameterError("bins", c, "edges only for columns being grouped by")
        key_tuples = None
        if keys is not None:
            key_tuples = self._check_keys(out, keys)
        else:  # counted, never listed: refused before the product is built anywhere
            self.session._limits.check("group_by keys", _public_key_count(self.session._metadata, out), "max_keys")
        return replace(self, groups=tuple(out), keys=key_tuples)

    def bound(self, *, max_groups: int | None = None, max_rows: int | None = None) -> Query:
        """Override the session's contribution bounds for this query."""
        s = self.session
        g = self.max_groups if max_groups is None else s._check_bound("max_groups", max_groups, None)
        r = self.max_rows if max_rows is None else s._check_bound("max_rows", max_rows, None)
        return replace(self, max_groups=g, max_rows=r)

    def _check_edges(self, column: str, edges: object) -> tuple[float, ...]:
        if self.session._schema[column] != "numeric":
            raise InvalidParameterError(f"bins[{column!r}]", _short(edges), "edges only for numeric columns")
        if not isinstance(edges, (str, bytes)) and hasattr(edges, "__iter__"):
            if not hasattr(edges, "__len__"):  # read no more of an iterator than the limit allows
                edges = tuple(itertools.islice(edges, self.session._limits.max_keys + 2))  # type: ignore[call-overload]
            self.session._limits.check("group_by keys", max(len(edges) - 1, 0), "max_keys")  # type: ignore[arg-type]
        try:
            e = tuple(float(x) for x in edges)  # type: ignore[union-attr]
        except (TypeError, ValueError):
            raise InvalidParameterError(f"bins[{column!r}]", _short(edges), "a list of at least two increasing finite numbers") from None
        if len(e) < 2 or not all(math.isfinite(x) for x in e) or any(b <= a for a, b in zip(e, e[1:])):
            raise InvalidParameterError(f"bins[{column!r}]", _short(edges), "a list of at least two increasing finite numbers")
        return e

    def _check_keys(self, groups: list[GroupKey], keys: object) -> tuple[tuple[Any, ...], ...]:
        if isinstance(keys, (str, bytes)) or not hasattr(keys, "__iter__"):
            raise InvalidParameterError("keys", _short(keys), "a list of public keys (values, or tuples for several columns)")
        limit = self.session._limits.max_keys
        if not hasattr(keys, "__len__"):
            keys = tuple(itertools.islice(keys, limit + 1))  # type: ignore[call-overload]
        self.session._limits.check("group_by keys", len(keys), "max_keys")  # type: ignore[arg-type]
        out = []
        for k in keys:  # type: ignore[union-attr]
            t = tuple(k) if len(groups) > 1 and isinstance(k, (tuple, list)) else (k,)
            if len(t) != len(groups):
                raise InvalidParameterError("keys", _short(k), f"tuples of {len(groups)} values (one per group column)")
            for g, x in zip(groups, t):
                kind = _literal_kind(x)
                want = "numeric" if g.edges is not None else self.session._schema[g.column]
                if g.edges is not None or kind is None or kind != want:
                    raise InvalidParameterError("keys", _short(k), f"values matching the column {g.column!r} ({want})" + (" (binned columns take their keys from the bins)" if g.edges is not None else ""))
            out.append(t)
        if not out or len(set(out)) != len(out):
            raise InvalidParameterError("keys", _short(keys), "a non-empty list of distinct keys")
        return tuple(out)

    def _check_predicate(self, p: Predicate) -> None:
        schema = self.session._schema
        if isinstance(p, (And, Or)):
            for x in p.parts:
                self._check_predicate(x)
            return
        if isinstance(p, Not):
            self._check_predicate(p.part)
            return
        if p.column not in schema:
            raise InvalidParameterError("where", p.column, f"a declared column ({', '.join(schema)})", "unknown column")
        kind = schema[p.column]
        if kind == "unit":
            raise InvalidParameterError("where", p.column, "a declared column", "the privacy unit can be filtered on only if the metadata declares it as a column")
        if isinstance(p, IsNull):
            return
        lits = (p.value,) if isinstance(p, Compare) else p.values if isinstance(p, InList) else (p.low, p.high)
        for lit in lits:
            lk = _literal_kind(lit)
            if lk is None or lk != kind:
                raise InvalidParameterError("where", _short(lit), f"a {kind} literal to compare with column {p.column!r}")

    # -- aggregates ------------------------------------------------------------------------------

    def count(self, **kwargs: Any) -> QueryResult:
        """The number of rows (per group), each unit contributing at most max_rows per group."""
        return self.aggregate([A.Count()], **kwargs)

    def count_units(self, **kwargs: Any) -> QueryResult:
        """The number of distinct privacy units (per group)."""
        return self.aggregate([A.CountUnits()], **kwargs)

    def sum(self, column: str, **kwargs: Any) -> QueryResult:
        return self.aggregate([A.Sum(column)], **kwargs)

    def mean(self, column: str, **kwargs: Any) -> QueryResult:
        return self.aggregate([A.Mean(column)], **kwargs)

    def variance(self, column: str, **kwargs: Any) -> QueryResult:
        return self.aggregate([A.Variance(column)], **kwargs)

    def std(self, column: str, **kwargs: Any) -> QueryResult:
        return self.aggregate([A.Std(column)], **kwargs)

    def quantile(self, column: str, q: float, **kwargs: Any) -> QueryResult:
        return self.aggregate([A.Quantile(column, q)], **kwargs)

    def median(self, column: str, **kwargs: Any) -> QueryResult:
        return self.aggregate([A.Quantile(column, 0.5)], **kwargs)

    def histogram(self, column: str, *, bins: Sequence[float] | None = None, **kwargs: Any) -> QueryResult:
        """Counts over the declared categories of ``column`` (or over ``bins`` of a numeric one)."""
        if self.groups:
            raise InvalidParameterError("histogram", column, "a query without group_by (the histogram groups by its column)")
        spec = self.session._metadata.columns.get(column)
        if bins is None and not (isinstance(spec, Categorical) and spec.categories is not None):
            raise InvalidParameterError(
                "column", column, "a column with declared categories (Categorical([...]) in the metadata), or bins= for a numeric column",
                "a histogram's keys must be public",
            )
        q = self.group_by(column, bins=None if bins is None else {column: bins})
        return q.aggregate([A.Count()], **kwargs)

    def aggregate(
        self,
        aggregates: Sequence[A.Aggregate],
        *,
        epsilon: float,
        delta: float = 0.0,
        noise: Noise = "laplace",
        confidence: float = 0.95,
        key_selection: str = "truncated_geometric",
        split: Sequence[float] | None = None,
        rng: RNG = None,
        _text: str | None = None,
    ) -> QueryResult:
        """Release several aggregates in one pass; ``epsilon`` (and ``delta``) are split across
        them in proportion to ``split`` (equal shares by default; with private key selection the
        selection takes one more share, last in ``split``). δ goes, in equal shares, to private
        key selection and to Gaussian-noise aggregates; an unused δ is not spent."""
        return _Runner(self, aggregates, epsilon, delta, noise, confidence, key_selection, split, rng, _text).run()

    def cost(
        self,
        aggregates: Sequence[A.Aggregate],
        *,
        epsilon: float,
        delta: float = 0.0,
        noise: Noise = "laplace",
        confidence: float = 0.95,
        key_selection: str = "truncated_geometric",
        split: Sequence[float] | None = None,
        _text: str | None = None,
    ) -> QueryCost:
        """What :meth:`aggregate` with the same arguments would debit — validated the same way,
        computed without reading the data, drawing noise or spending anything."""
        return _Runner(self, aggregates, epsilon, delta, noise, confidence, key_selection, split, None, _text).cost()


# ================================================================================================
# Execution
# ================================================================================================


@dataclass(frozen=True)
class _Priced:
    """A query's mechanisms and composed event, built before any data is read or noise drawn."""

    event: DPEvent
    delta: float
    pending: list[tuple[int, str, Any]]
    deltas: dict[Any, float]
    sel_eps: float
    sel_delta: float
    fan_out: int
    G: int
    R: int
    selector: KeySelector | None


@dataclass(frozen=True)
class _Sizes:
    """The answer's size bound, from the request and the metadata: bytes per row (without the
    ``texts`` key columns, counted per released key), bytes around the rows, and the most rows."""

    row: int
    texts: tuple[int, ...]
    overhead: int
    max_rows: int


class _Runner:
    """Validates, plans, pays for and releases one query (see the module docstring)."""

    def __init__(self, query: Query, aggregates: object, epsilon: object, delta: object, noise: object, confidence: object, key_selection: object, split: object, rng: RNG, text: str | None) -> None:
        self.q = query
        self.s = query.session
        self.specs = self._check_specs(aggregates)
        self.epsilon = v.epsilon(epsilon)
        self.delta = v.delta(delta)
        if noise not in ("laplace", "gaussian"):
            raise InvalidParameterError("noise", noise, "'laplace' or 'gaussian'")
        self.noise: Noise = noise  # type: ignore[assignment]
        self.confidence = v.probability(confidence, "confidence")
        if key_selection not in KEY_SELECTIONS:
            raise InvalidParameterError("key_selection", key_selection, "one of " + ", ".join(map(repr, KEY_SELECTIONS)))
        self.key_selection = str(key_selection)
        _check_rng(rng, self.s._ledger)
        self.rng = rng if rng is not None else self.s._rng
        self.text = text or self._describe()
        self.private = bool(self.q.groups) and self.q.keys is None and None in _public_counts(self.s._metadata, self.q.groups)
        self._check_rows()
        if self.private and self.delta == 0:
            missing = [g.column for g, allowed in zip(self.q.groups, self._allowed()) if allowed is None]
            raise InvalidParameterError(
                "delta", delta, "a number in (0, 1) for a group-by whose keys are not public",
                f"no public keys for {missing}: declare categories in the metadata, pass keys=, or give δ > 0 for private key selection",
            )
        self.split = self._check_split(split)

    # -- validation ----------------------------------------------------------------------------

    def _check_specs(self, aggregates: object) -> tuple[A.Aggregate, ...]:
        if isinstance(aggregates, (str, bytes)) or not hasattr(aggregates, "__iter__"):
            raise InvalidParameterError("aggregates", _short(aggregates), "a list of aggregates such as [Count(), Mean('age')]")
        specs = tuple(aggregates)  # type: ignore[arg-type]
        if not specs:
            raise InvalidParameterError("aggregates", specs, "at least one aggregate")
        # Every output column name — group columns, then <alias>, <alias>_low, <alias>_high per
        # aggregate — must be unique (case-insensitively: tables and JSON are read by name).
        taken = {g.column.lower(): g.column for g in self.q.groups}
        schema = self.s._schema
        for spec in specs:
            if not isinstance(spec, (A.Count, A.CountUnits, A.Sum, A.Mean, A.Variance, A.Std, A.Quantile)):
                raise InvalidParameterError("aggregates", _short(spec), "Count, CountUnits, Sum, Mean, Variance, Std or Quantile from dpkit.analytics")
            for out in (spec.alias, f"{spec.alias}_low", f"{spec.alias}_high"):
                if out.lower() in taken:
                    raise InvalidParameterError(
                        "aggregates", spec.alias, "output names that do not collide",
                        f"the output column {out!r} would collide with {taken[out.lower()]!r} (each aggregate also writes <name>_low and <name>_high)",
                    )
                taken[out.lower()] = out
            if spec.column is None:
                continue
            if spec.column not in schema:
                raise InvalidParameterError("column", spec.column, f"a declared column ({', '.join(schema)})", "unknown column")
            spec_meta = self.s._metadata.columns.get(spec.column)
            if not isinstance(spec_meta, Numeric):
                declared = "the privacy unit" if spec_meta is None else f"Categorical, value_type {spec_meta.value_type!r}"
                raise InvalidParameterError("column", spec.column, f"a Numeric column for {spec.kind} (it is declared as {declared})")
            if not spec_meta.bounded:
                raise InvalidParameterError(
                    "column", spec.column, "a column with declared bounds (Numeric(lower, upper) in the metadata)",
                    "sensitivity comes from declared bounds, never from the data",
                )
        return specs

    def _check_split(self, split: object) -> tuple[float, ...]:
        n = len(self.specs) + (1 if self.private else 0)
        if split is None:
            return (1.0 / n,) * n
        if isinstance(split, (str, bytes)) or not hasattr(split, "__iter__"):
            raise InvalidParameterError("split", _short(split), f"a list of {n} positive weights")
        w = tuple(split)  # type: ignore[arg-type]
        if len(w) != n or not all(v._is_real(x) and math.isfinite(x) and x > 0 for x in w):
            raise InvalidParameterError("split", _short(split), f"a list of {n} positive finite weights (one per aggregate{', then key selection' if self.private else ''})")
        total = math.fsum(w)
        return tuple(x / total for x in w)

    def _allowed(self) -> list[tuple[Any, ...] | None]:
        """Per group column: the public values (declared categories, bins), or None."""
        out: list[tuple[Any, ...] | None] = []
        for g in self.q.groups:
            if g.edges is not None:
                out.append(tuple(range(len(g.edges) - 1)))
                continue
            spec = self.s._metadata.columns.get(g.column)
            out.append(spec.categories if isinstance(spec, Categorical) and spec.categories is not None else None)
        return out

    def _public_keys(self) -> tuple[tuple[Any, ...], ...]:
        """Every public key, listed (only when releasing: their number is within max_keys)."""
        if self.q.keys is not None:
            return self.q.keys
        return tuple(itertools.product(*self._allowed()))  # type: ignore[arg-type]

    # -- limits --------------------------------------------------------------------------------

    def _check_rows(self) -> None:
        """Refuse, from the request and the metadata only, a group-by with more public keys
        than ``max_keys`` or an answer with more rows than ``max_result_rows`` (with public keys,
        the rows are the keys). Nothing is listed: the counts are integer products."""
        limits = self.s._limits
        if not self.q.groups:
            return
        keys = self._row_count()
        limits.check("group_by keys", keys, "max_keys")
        if not self.private:
            limits.check("result rows", keys, "max_result_rows")

    def _sizes(self, priced: _Priced) -> _Sizes:
        """An upper bound on the answer's JSON size from the request and the metadata (see
        :mod:`dpkit.analytics.limits`); refuses, before paying, an answer that cannot fit
        ``max_response_bytes`` — with public keys, all of it; with private keys, one row."""
        limits = self.s._limits
        meta = self.s._metadata
        texts: list[int] = []  # released key columns whose text length is not declared
        row = 4  # braces, and the separator before the next record
        for j, g in enumerate(self.q.groups):
            spec = meta.columns.get(g.column)
            row += json_text_bound(g.column) + 4  # "name": and the separator
            if g.edges is not None:
                row += _bin_label_bytes(g.edges)
            elif self.q.keys is not None:
                row += _literal_bytes([k[j] for k in self.q.keys])
            elif isinstance(spec, Categorical) and spec.categories is not None:
                row += max(_category_bytes(spec), JSON_NULL_BYTES)
            elif isinstance(spec, Categorical) and spec.value_type == "string":
                texts.append(j)  # counted per released key, after the release (see _cut)
            elif isinstance(spec, Categorical) and spec.value_type == "boolean":
                row += JSON_BOOLEAN_BYTES
            else:
                row += JSON_NUMBER_BYTES
        for spec in self.specs:
            for suffix in ("", "_low", "_high"):
                row += json_text_bound(spec.alias + suffix) + 4 + JSON_NUMBER_BYTES
        # Everything around the rows: the aggregates' descriptions, the event, the notes, the
        # privacy unit and the fixed fields, with room for a caller's envelope (a service adds
        # the dataset's name, the cost and the budget).
        overhead = 4096 + len(json.dumps(event_to_dict(priced.event)))
        overhead += sum(512 + 2 * json_text_bound(spec.alias) + json_text_bound(spec.column or "") for spec in self.specs)
        overhead += sum(json_text_bound(g.column) for g in self.q.groups) + 2 * json_text_bound(self.s._unit or "")
        if not self.private:
            rows = self._row_count()
            limits.check("response bytes", overhead + rows * row, "max_response_bytes")
            return _Sizes(row, tuple(texts), overhead, rows)
        smallest = row + JSON_NULL_BYTES * len(texts)  # one row, its text keys at their shortest
        limits.check("response bytes", overhead + smallest, "max_response_bytes")
        fits = (limits.max_response_bytes - overhead) // row
        return _Sizes(row, tuple(texts), overhead, min(limits.max_result_rows, fits))

    def _row_count(self) -> int:
        """The rows of an answer with public keys (one per key; one without a group-by)."""
        if not self.q.groups:
            return 1
        if self.q.keys is not None:
            return len(self.q.keys)
        return _public_key_count(self.s._metadata, self.q.groups)

    def _cut(self, frame: pd.DataFrame, sizes: _Sizes) -> tuple[pd.DataFrame, bool]:
        """Privately selected rows cut to the limits: the first rows in key order (the frame is
        sorted by key) whose encoded size fits. Post-processing: which rows stay depends on the
        released keys only."""
        limits = self.s._limits
        n = min(len(frame), sizes.max_rows)
        if sizes.texts and n:
            per_row = np.full(n, sizes.row, dtype=np.int64)
            for j in sizes.texts:
                per_row += json_text_bounds(frame[f"g{j}"].iloc[:n])
            n = int(np.searchsorted(np.cumsum(per_row), limits.max_response_bytes - sizes.overhead, side="right"))
        if n == len(frame):
            return frame, False
        return frame.iloc[:n].reset_index(drop=True), True

    def _describe(self) -> str:
        parts = [", ".join(f"{s.kind}({s.column or '*'})" for s in self.specs)]
        if self.q.predicate is not None:
            parts.append("where …")
        if self.q.groups:
            parts.append("by " + ", ".join(g.column for g in self.q.groups))
        return f"{self.s._table}: " + " ".join(parts)

    # -- planning ------------------------------------------------------------------------------

    def _bounds(self, column: str) -> Numeric:
        spec = self.s._metadata.columns[column]
        assert isinstance(spec, Numeric)
        return spec

    def _plan(self, salt: int) -> tuple[AggregationPlan, dict[int, dict[str, Any]]]:
        sums: list[SumSpec] = []
        values: list[ValueSpec] = []
        uses: dict[int, dict[str, Any]] = {}
        for i, spec in enumerate(self.specs):
            u: dict[str, Any] = {}
            if spec.column is not None:
                b = self._bounds(spec.column)
                if spec.kind == "sum":
                    u["sum"] = quantize_spec(f"s{len(sums)}", spec.column, b.lower, b.upper, centered=False)
                    sums.append(u["sum"])
                elif spec.kind in ("mean", "var", "std"):
                    u["sum"] = quantize_spec(f"s{len(sums)}", spec.column, b.lower, b.upper, centered=True)
                    sums.append(u["sum"])
                    if spec.kind != "mean":
                        u["sq"] = quantize_spec(f"s{len(sums)}", spec.column, b.lower, b.upper, centered=True, square=True)
                        sums.append(u["sq"])
                else:  # quantile
                    u["values"] = f"x{len(values)}"
                    values.append(ValueSpec(spec.column, b.lower, b.upper))
            uses[i] = u
        allowed = self._allowed()
        if self.q.keys is not None:
            allowed = [tuple(dict.fromkeys(k[j] for k in self.q.keys)) for j in range(len(self.q.groups))]
        plan = AggregationPlan(
            unit=self.s._unit,
            where=self.q.predicate,
            groups=self.q.groups,
            key_filter=tuple(allowed),
            max_groups=self.q.max_groups if self.q.groups else 1,
            max_rows=self.q.max_rows,
            sums=tuple(sums),
            values=tuple(values),
            salt=salt,
            portable=self.s._portable,
        )
        return plan, uses

    # -- running -------------------------------------------------------------------------------

    def price(self, plan: AggregationPlan, uses: dict[int, dict[str, Any]]) -> _Priced:
        """Build every mechanism and the query's composed event — no data, no randomness."""
        G = plan.max_groups if self.s._unit is not None else 1
        R = plan.max_rows if self.s._unit is not None else 1
        twice = 2 if self.s._neighbours == "replace" else 1
        fan_out = G * twice if self.q.groups else 1
        deltas = self._delta_shares()
        pending: list[tuple[int, str, Any]] = []
        events: list[DPEvent] = []
        sel_eps = self.epsilon * self.split[-1] if self.private else 0.0
        sel_delta = deltas.get("selection", 0.0)
        if self.private:
            events.append(ApproxDPEvent(epsilon=sel_eps, delta=sel_delta, neighbours=self.s._neighbours))
        for i, spec in enumerate(self.specs):
            eps_i = self.epsilon * self.split[i]
            dl = deltas.get(i, 0.0)
            kind = spec.kind
            u = uses[i]
            if kind == "quantile":
                eps_group = eps_i / fan_out
                mech = QuantileMechanism(epsilon=eps_group / R, q=spec.q, lower=self._bounds(spec.column).lower, upper=self._bounds(spec.column).upper, neighbours=self.s._neighbours)  # type: ignore[union-attr]
                ev: DPEvent = ExponentialEvent(epsilon=eps_group, neighbours=self.s._neighbours)
                ev = SelfComposedEvent(ev, fan_out) if fan_out > 1 else ev
                events.append(ev)
                pending.append((i, "quantile", (mech, ev)))
                continue
            parts: list[tuple[str, str, int, int]] = []  # (label, frame column, ℓ1 per unit, ℓ2² per unit) in integer units
            if kind == "count":
                parts.append(("count", "rows", G * R, G * R * R))
            elif kind == "count_units":
                parts.append(("units", "units", G, G))
            else:
                s_spec: SumSpec = u["sum"]
                if kind == "sum":
                    parts.append(("sum", s_spec.name, G * R * s_spec.max_summand, G * (R * s_spec.max_summand) ** 2))
                else:
                    parts.append(("n", s_spec.name + "_n", G * R, G * R * R))
                    parts.append(("sum", s_spec.name, G * R * s_spec.max_summand, G * (R * s_spec.max_summand) ** 2))
                    if "sq" in u:
                        qmax = u["sq"].max_summand
                        parts.append(("sq", u["sq"].name, G * R * qmax, G * (R * qmax) ** 2))
            share = len(parts)
            mechs = []
            for label, col, l1, l2sq in parts:
                mech_p = self._mechanism(eps_i / share, dl / share, l1 * twice, math.sqrt(l2sq) * twice)
                events.append(mech_p.event)
                mechs.append((label, col, mech_p, l1 * twice, math.sqrt(l2sq) * twice))
            pending.append((i, "noisy", mechs))
        event: DPEvent = events[0] if len(events) == 1 else ComposedEvent(tuple(events))
        total_delta = sel_delta + sum(d for k, d in deltas.items() if k != "selection")
        selector = None
        if self.private:  # its tables are built (and its parameters refused) before the debit
            selector = key_selector(epsilon=sel_eps, delta=sel_delta, fan_out=fan_out, strategy=self.key_selection, neighbours=self.s._neighbours)
        return _Priced(event, total_delta, pending, deltas, sel_eps, sel_delta, fan_out, G, R, selector)

    def cost(self) -> QueryCost:
        """What the query would debit, computed without touching the data (refused, as
        :meth:`run` would refuse it, when it is over a limit)."""
        plan, uses = self._plan(0)
        p = self.price(plan, uses)
        self._sizes(p)
        return QueryCost(epsilon=self.epsilon, delta=p.delta, event=p.event, text=self.text)

    def run(self) -> QueryResult:
        src = resolve_rng(self.rng)
        # The salt keys the bounding priorities: randomness, not data, so drawing it first is free.
        plan, uses = self._plan(int(uniform_below(2**62, 1, rng=src)[0]))
        priced = self.price(plan, uses)
        sizes = self._sizes(priced)  # refuses an answer over max_response_bytes, before paying
        # ---- pay: a refusal raises here, before the engine has touched a row ----
        spend_id = self.s._pay(priced.event, self.epsilon, priced.delta, self.text)
        # ---- compute and release: total functions; any failure keeps the debit, says nothing ----
        try:
            return self._release_all(plan, uses, priced, sizes, src, spend_id)
        except Exception:
            _curator_log.exception("query %r failed after its debit (spend %s)", self.text, spend_id)
            raise QueryFailedError(spend_id) from None

    def _release_all(self, plan: AggregationPlan, uses: dict[int, dict[str, Any]], p: _Priced, sizes: _Sizes, src: RandomSource, spend_id: int | None) -> QueryResult:
        frame = self._keyed(self.s._engine.aggregate(plan))
        vals = self.s._engine.values(plan) if plan.values else None
        event, total_delta, pending, deltas = p.event, p.delta, p.pending, p.deltas
        sel_eps, sel_delta, G, R = p.sel_eps, p.sel_delta, p.G, p.R
        beta = 1.0 - self.confidence
        keys_mode = "none"
        truncated = False
        released = 0
        if p.selector is not None:
            keep = p.selector.select(frame["units"].to_numpy(), rng=src)
            frame = frame.loc[keep].reset_index(drop=True)
            released = len(frame)
            # Cut before the values are noised (each row's noise is calibrated to the same
            # sensitivity whatever the number of rows); which rows stay depends on the released
            # keys only, so the cut is post-processing of the selection.
            frame, truncated = self._cut(frame, sizes)
            keys_mode = self.key_selection
        elif self.q.groups:
            keys_mode = "public"
        # The answer's columns are gathered first and framed once (a column set on a DataFrame
        # one at a time costs more than the whole release of a small answer).
        out: dict[str, Any] = {g.column: frame[f"g{j}"].reset_index(drop=True) for j, g in enumerate(self.q.groups)}
        for j, g in enumerate(self.q.groups):
            if g.edges is not None:
                labels = [f"[{g.edges[k]:g}, {g.edges[k + 1]:g}{']' if k == len(g.edges) - 2 else ')'}" for k in range(len(g.edges) - 1)]
                out[g.column] = [labels[int(k)] for k in frame[f"g{j}"]]
        infos = []
        for i, what, payload in pending:
            spec = self.specs[i]
            eps_i = self.epsilon * self.split[i]
            if what == "quantile":
                mech_q, ev_q = payload
                est = self._quantiles(mech_q, frame, vals, uses[i]["values"], src)
                out[spec.alias], out[f"{spec.alias}_low"], out[f"{spec.alias}_high"] = est, np.nan, np.nan
                infos.append(AggregateInfo(spec.alias, spec.kind, spec.column, eps_i, 0.0, "exponential", math.nan, math.nan, ev_q))
                continue
            noisy = {}
            beta_each = beta / len(payload)
            for label, col, mech, l1, l2 in payload:
                noisy[label] = self._release(mech, frame[col].to_numpy(), beta_each, src)
            value, low, high, scale, sens = self._finish(spec, uses[i], noisy)
            out[spec.alias], out[f"{spec.alias}_low"], out[f"{spec.alias}_high"] = value, low, high
            mech_name = "gaussian" if self.noise == "gaussian" else "laplace"
            infos.append(AggregateInfo(spec.alias, spec.kind, spec.column, eps_i, deltas.get(i, 0.0), mech_name, scale, sens, ComposedEvent(tuple(m[2].event for m in payload)) if len(payload) > 1 else payload[0][2].event))
        table = pd.DataFrame(out, index=pd.RangeIndex(len(frame)))
        notes = []
        if p.selector is not None:
            notes.append(f"keys selected privately ({self.key_selection}, ε={sel_eps:.6g}, δ={sel_delta:.3g}); {released} of the groups released")
        if truncated:
            limits = self.s._limits
            notes.append(
                f"TRUNCATED: the first {len(table)} of the {released} released groups in key order are shown "
                f"(max_result_rows={limits.max_result_rows}, max_response_bytes={limits.max_response_bytes})"
            )
        groups_bound = G if self.q.groups else 1
        if self.s._unit is not None:
            notes.append(f"privacy unit: {self.s._unit}; each contributes at most {groups_bound} group(s) and {R} row(s) per group")
        else:
            notes.append("privacy unit: a row (declared: every row is a different person)")
        seeded = is_seeded(self.rng)
        if seeded:
            notes.append("SEEDED randomness: reproducible and NOT private (tests and teaching only)")
        try:
            remaining = self.s.remaining
        except LedgerError:
            remaining = None
        return QueryResult(
            table=table,
            aggregates=tuple(infos),
            groups=tuple(g.column for g in self.q.groups),
            epsilon=self.epsilon,
            delta=total_delta,
            event=event,
            confidence=self.confidence,
            keys=keys_mode,
            remaining_epsilon=remaining,
            spend_id=spend_id,
            notes=tuple(notes),
            privacy_unit=self.s._unit,
            max_groups=groups_bound,  # G = R = 1 without a unit column (see price)
            max_rows=R,
            neighbours=self.s._neighbours,
            seeded=seeded,
            truncated=truncated,
        )

    def _delta_shares(self) -> dict[Any, float]:
        users: list[Any] = []
        if self.private:
            users.append("selection")
        if self.noise == "gaussian":
            users += [i for i, s in enumerate(self.specs) if s.kind != "quantile"]
        if users and self.delta == 0:
            raise InvalidParameterError("delta", self.delta, "a number in (0, 1) with noise='gaussian'")
        return {u: self.delta / len(users) for u in users}

    def _mechanism(self, eps: float, delta: float, l1: int, l2: float) -> Any:
        if self.noise == "laplace":
            return Geometric(epsilon=eps, sensitivity=int(l1), neighbours=self.s._neighbours)
        return Gaussian(epsilon=eps, delta=delta, sensitivity=l2, neighbours=self.s._neighbours)

    def _release(self, mech: Any, ints: np.ndarray, beta: float, src: RandomSource) -> _Noisy:
        ints = np.asarray(ints, dtype=np.int64)
        if isinstance(mech, Geometric):
            noisy = mech.release(ints, rng=src) if ints.size else np.zeros(0, dtype=np.int64)
            half = float(mech.error_bound(beta) - 1)
            return _Noisy(np.asarray(noisy, dtype=np.float64), half, mech.scale, float(mech.sensitivity), mech.event)
        # exact doubles only: clamping is 1-Lipschitz, so the sensitivity is unchanged
        ints = np.clip(ints, -GAUSSIAN_SUM_LIMIT, GAUSSIAN_SUM_LIMIT)
        noisy = mech.release(ints.astype(np.float64), rng=src) if ints.size else np.zeros(0)
        half = mech.error_bound(beta, size=max(ints.size, 1))
        return _Noisy(np.asarray(noisy, dtype=np.float64), half, mech.noise_plan(max(ints.size, 1)).sigma, mech.sensitivity, mech.event)

    def _finish(self, spec: A.Aggregate, u: dict[str, Any], noisy: dict[str, _Noisy]) -> tuple[Any, Any, Any, float, float]:
        """Values and interval ends (value units) from the noisy integer parts."""
        if spec.kind in ("count", "count_units"):
            part = noisy["count" if spec.kind == "count" else "units"]
            val = part.values
            return val, val - part.halfwidth, val + part.halfwidth, part.scale, part.sensitivity
        s_spec: SumSpec = u["sum"]
        unit = s_spec.unit
        s = noisy["sum"]
        if spec.kind == "sum":
            val = s.values * unit
            return val, val - s.halfwidth * unit, val + s.halfwidth * unit, s.scale * unit, s.sensitivity * unit
        b = self._bounds(spec.column)  # type: ignore[arg-type]
        lo, hi, m = b.lower, b.upper, s_spec.center
        n = noisy["n"]
        n_hat = np.maximum(n.values, 1.0)
        n_lo, n_hi = n.values - n.halfwidth, n.values + n.halfwidth
        ok = n_lo >= 1.0
        n_lo_c = np.where(ok, n_lo, 1.0)
        n_hi = np.maximum(n_hi, 1.0)  # only read where ok (then n_hi >= n_lo >= 1)
        s_hat, s_lo, s_hi = s.values * unit, (s.values - s.halfwidth) * unit, (s.values + s.halfwidth) * unit
        e1 = s_hat / n_hat
        e1_lo = np.minimum(s_lo / n_lo_c, s_lo / n_hi)
        e1_hi = np.maximum(s_hi / n_lo_c, s_hi / n_hi)
        if spec.kind == "mean":
            val = np.clip(m + e1, lo, hi)
            low = np.where(ok, np.clip(m + e1_lo, lo, hi), lo)
            high = np.where(ok, np.clip(m + e1_hi, lo, hi), hi)
            return val, low, high, s.scale * unit, s.sensitivity * unit
        sq_spec: SumSpec = u["sq"]
        sq = noisy["sq"]
        usq = sq_spec.unit
        # Σ (x − m)² ≈ Σ q·usq: the engine's q is in [0, qmax]
        e2 = sq.values * usq / n_hat
        e2_lo = np.minimum((sq.values - sq.halfwidth) * usq / n_lo_c, (sq.values - sq.halfwidth) * usq / n_hi)
        e2_hi = np.maximum((sq.values + sq.halfwidth) * usq / n_lo_c, (sq.values + sq.halfwidth) * usq / n_hi)
        top = ((hi - lo) / 2) ** 2
        var = np.clip(e2 - e1**2, 0.0, top)
        sq1_lo = np.where((e1_lo <= 0) & (e1_hi >= 0), 0.0, np.minimum(e1_lo**2, e1_hi**2))
        sq1_hi = np.maximum(e1_lo**2, e1_hi**2)
        v_lo = np.where(ok, np.clip(e2_lo - sq1_hi, 0.0, top), 0.0)
        v_hi = np.where(ok, np.clip(e2_hi - sq1_lo, 0.0, top), top)
        if spec.kind == "std":
            return np.sqrt(var), np.sqrt(v_lo), np.sqrt(v_hi), sq.scale * usq, sq.sensitivity * usq
        return var, v_lo, v_hi, sq.scale * usq, sq.sensitivity * usq

    def _quantiles(self, mech: QuantileMechanism, frame: pd.DataFrame, vals: pd.DataFrame | None, col: str, src: RandomSource) -> np.ndarray:
        assert vals is not None
        gcols = [f"g{j}" for j in range(len(self.q.groups))]
        x = vals[[*gcols, col]].dropna(subset=[col])
        if not gcols:
            return np.array([self._quantile_one(mech, x[col].to_numpy(), src)])
        groups = {k if isinstance(k, tuple) else (k,): g[col].to_numpy() for k, g in x.groupby(gcols, dropna=False, sort=False)}
        empty = np.zeros(0)
        out = np.empty(len(frame))
        for r, key in enumerate(frame[gcols].itertuples(index=False, name=None)):  # one draw per released group
            out[r] = self._quantile_one(mech, groups.get(tuple(key), empty), src)
        return out

    @staticmethod
    def _quantile_one(mech: QuantileMechanism, x: np.ndarray, src: RandomSource) -> float:
        data = np.sort(np.clip(np.asarray(x, dtype=np.float64), mech.lower, mech.upper))
        return float(mech._sample(mech._prepare(data), 1, src)[0])

    def _keyed(self, frame: pd.DataFrame) -> pd.DataFrame:
        """With public keys: exactly one row per key, in the declared order (zeros where the data
        has none). Without: the observed groups, sorted."""
        gcols = [f"g{j}" for j in range(len(self.q.groups))]
        if not gcols:
            return frame.reset_index(drop=True)
        if self.private:
            return frame.sort_values(gcols, na_position="last", kind="stable").reset_index(drop=True)
        keys = pd.DataFrame(list(self._public_keys()), columns=gcols)
        for c in gcols:  # align dtypes so the merge matches values, not representations
            if frame[c].dtype.kind in "iuf" and keys[c].dtype.kind in "iuf":
                keys[c] = keys[c].astype(frame[c].dtype) if frame[c].dtype.kind == "f" or keys[c].dtype.kind != "f" else keys[c]
            elif frame[c].dtype != keys[c].dtype:
                frame = frame.astype({c: object})
                keys[c] = keys[c].astype(object)
        merged = keys.merge(frame, on=gcols, how="left", sort=False)
        value_cols = [c for c in merged.columns if c not in gcols]
        merged[value_cols] = merged[value_cols].fillna(0).astype("int64")
        return merged
