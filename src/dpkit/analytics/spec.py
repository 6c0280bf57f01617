"""What a private query asks for, as plain values: :class:`QueryOptions` and :class:`QuerySpec`.

Every front end — the :class:`~dpkit.analytics.Session` methods, SQL
(:mod:`dpkit.analytics.sql`) and the curator service's JSON — describes a query with these two
objects, and one pricing step (:func:`dpkit.analytics.pricing.price`) checks them against the
curator's declared schema. Nothing here reads data.

``QueryOptions`` is the one place the spending options, their defaults and their checks are
written. ``QuerySpec`` holds the rest of a query (aggregates, filter, grouping, public keys,
contribution bounds); ``QuerySpec.from_json`` reads the service's JSON form and ``to_json`` writes
the canonical text that the ledger and the audit log record (sorted keys, defaults left out).

>>> spec = QuerySpec.from_json({"aggregates": [{"kind": "mean", "column": "age"}], "group_by": ["sex"]})
>>> spec.aggregates, spec.group_by
((Mean(column='age', name='mean_age'),), ('sex',))
>>> spec.to_json()
'{"aggregates": [{"column": "age", "kind": "mean"}], "group_by": ["sex"]}'
>>> QueryOptions(epsilon=0.5).delta, QueryOptions(epsilon=0.5).noise
(0.0, 'laplace')
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from dpkit import _validate as v
from dpkit._validate import short_repr as _short
from dpkit.analytics import aggregates as A
from dpkit.analytics.key_selection import KEY_SELECTIONS
from dpkit.analytics.plan import Predicate
from dpkit.errors import InvalidParameterError

__all__ = ["QueryOptions", "QuerySpec", "Join", "Noise", "JoinHow", "AGGREGATE_KINDS"]

Noise = Literal["laplace", "gaussian"]
JoinHow = Literal["inner", "left"]

#: The aggregate kinds of the JSON form, and the class each one builds.
AGGREGATE_KINDS: dict[str, type] = {
    "count": A.Count,
    "count_units": A.CountUnits,
    "sum": A.Sum,
    "mean": A.Mean,
    "variance": A.Variance,
    "std": A.Std,
    "quantile": A.QuantileAgg,
}
_JSON_KIND = {cls.kind: name for name, cls in AGGREGATE_KINDS.items()}  # type: ignore[attr-defined]
_AGGREGATE_FIELDS = {"kind", "column", "q", "name"}
_SPEC_FIELDS = (
    "aggregates",
    "where",
    "group_by",
    "bins",
    "keys",
    "max_groups",
    "max_rows",
    "from",
    "join",
    "keys_from",
)
#: The JSON name of each spec field whose attribute is named otherwise.
_ATTRIBUTE = {"from": "table", "join": "joins"}
_JOIN_FIELDS = ("table", "on", "how")
_OPTION_FIELDS = ("epsilon", "delta", "noise", "confidence", "key_selection", "split", "bounding_epsilon")


@dataclass(frozen=True)
class QueryOptions:
    """How much a query spends and how it is noised — checked on construction.

    epsilon, delta:
        The query's whole (ε, δ), split across its aggregates (and private key selection).
    noise:
        ``"laplace"`` (discrete Laplace on the integer sums; pure ε-DP) or ``"gaussian"``
        (discrete Gaussian, analytic calibration of Balle & Wang 2018; needs δ > 0).
    confidence:
        The coverage of every released interval, in (0, 1).
    key_selection:
        How keys are chosen when they are not public (see :mod:`dpkit.analytics.key_selection`).
    split:
        Positive weights, one per aggregate (then one for key selection); ε is shared in
        proportion (equal shares when None). Its length is checked against the query by
        :meth:`weights`.
    bounding_epsilon:
        None (default), or the ε of an estimate of what contribution bounding left out — the
        noisy number of privacy units that lost rows to ``max_rows`` / ``max_groups`` and of kept
        rows with a value outside the declared bounds (:mod:`dpkit.analytics.bounding`). Paid on
        top of ``epsilon``, in the same debit.
    """

    epsilon: float
    delta: float = 0.0
    noise: Noise = "laplace"
    confidence: float = 0.95
    key_selection: str = "truncated_geometric"
    split: tuple[float, ...] | None = None
    bounding_epsilon: float | None = None

    def __post_init__(self) -> None:
        # The order of the checks is the order in which an analyst has always seen refusals.
        given_delta = self.delta
        object.__setattr__(self, "epsilon", v.epsilon(self.epsilon))
        object.__setattr__(self, "delta", v.delta(self.delta))
        if self.noise not in ("laplace", "gaussian"):
            raise InvalidParameterError("noise", self.noise, "'laplace' or 'gaussian'")
        object.__setattr__(self, "confidence", v.probability(self.confidence, "confidence"))
        if self.key_selection not in KEY_SELECTIONS:
            raise InvalidParameterError(
                "key_selection", self.key_selection, "one of " + ", ".join(map(repr, KEY_SELECTIONS))
            )
        object.__setattr__(self, "key_selection", str(self.key_selection))
        split = self.split
        if split is not None and not isinstance(split, (str, bytes)) and hasattr(split, "__iter__"):
            object.__setattr__(self, "split", tuple(split))  # its values are checked by weights()
        if self.bounding_epsilon is not None:
            b = self.bounding_epsilon
            if not v._is_real(b) or not math.isfinite(float(b)) or float(b) <= 0:
                raise InvalidParameterError(
                    "bounding_epsilon", b, "None (no estimate of what bounding left out) or a finite number > 0"
                )
            object.__setattr__(self, "bounding_epsilon", float(b))
        # A later refusal quotes δ as the analyst wrote it (0, not 0.0).
        object.__setattr__(self, "_delta_given", given_delta)

    @property
    def delta_given(self) -> object:
        """δ exactly as it was passed (refusals quote it)."""
        return self.__dict__.get("_delta_given", self.delta)

    def weights(self, n: int, *, selection: bool) -> tuple[float, ...]:
        """The share of ε of each of ``n`` parts (the aggregates, then key selection when
        ``selection``): ``split`` normalised, or equal shares."""
        if self.split is None:
            return (1.0 / n,) * n
        if isinstance(self.split, (str, bytes)) or not hasattr(self.split, "__iter__"):
            raise InvalidParameterError("split", _short(self.split), f"a list of {n} positive weights")
        w = tuple(self.split)
        if len(w) != n or not all(v._is_real(x) and math.isfinite(x) and x > 0 for x in w):
            raise InvalidParameterError(
                "split",
                _short(self.split),
                f"a list of {n} positive finite weights (one per aggregate{', then key selection' if selection else ''})",
            )
        total = math.fsum(w)
        return tuple(x / total for x in w)

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> QueryOptions:
        """The options of a service request body (``epsilon`` required; the others optional).
        Other keys of ``obj`` are ignored (the body also holds the query itself)."""
        if not isinstance(obj, Mapping):
            raise InvalidParameterError(
                "options",
                _short(obj),
                "a JSON object with epsilon and optionally delta, noise, confidence, key_selection, split and bounding_epsilon",
            )
        if "epsilon" not in obj:
            raise InvalidParameterError("epsilon", None, "a finite number > 0")
        kwargs = {k: obj[k] for k in _OPTION_FIELDS if k in obj and obj[k] is not None}
        return cls(**kwargs)

    def to_json(self) -> dict[str, Any]:
        """The options as a JSON object (``split`` and ``bounding_epsilon`` only when given)."""
        out: dict[str, Any] = {
            "epsilon": self.epsilon,
            "delta": self.delta,
            "noise": self.noise,
            "confidence": self.confidence,
            "key_selection": self.key_selection,
        }
        if self.split is not None:
            out["split"] = list(self.split) if isinstance(self.split, tuple) else self.split
        if self.bounding_epsilon is not None:
            out["bounding_epsilon"] = self.bounding_epsilon
        return out


def _on_pairs(on: object) -> tuple[tuple[str, str], ...]:
    """``on`` as (left column, right column) pairs: a name (the same on both sides), a list of
    names and pairs, or a mapping from left to right."""
    accepted = (
        "a column name (the same on both sides), a list of names and [left, right] pairs, "
        "or a mapping from the left column to the joined table's column"
    )
    if isinstance(on, str):
        items: list[object] = [on]
    elif isinstance(on, Mapping):
        items = [(k, x) for k, x in on.items()]
    elif isinstance(on, Iterable) and not isinstance(on, bytes):
        items = list(on)
    else:
        raise InvalidParameterError("on", _short(on), accepted)
    pairs: list[tuple[str, str]] = []
    for item in items:
        if isinstance(item, str):
            item = (item, item.rsplit(".", 1)[-1])
        if not isinstance(item, (tuple, list)) or len(item) != 2 or not all(isinstance(c, str) and c for c in item):
            raise InvalidParameterError("on", _short(on), accepted)
        pairs.append((item[0], item[1]))
    if not pairs:
        raise InvalidParameterError(
            "on", _short(on), accepted, "a join without an equality is a cross join, which multiplies every row"
        )
    return tuple(pairs)


@dataclass(frozen=True)
class Join:
    """One join of a query: the dataset's ``table``, matched on the equalities ``on`` —
    (left, right) pairs, left a column of the tables joined so far (``"visits.postcode"``, or its
    bare name when only one of them has it), right a column of ``table`` — inner or ``"left"``.
    Which joins are allowed, and what they cost, is :mod:`dpkit.analytics.joins`'."""

    table: str
    on: tuple[tuple[str, str], ...]
    how: JoinHow = "inner"

    def __post_init__(self) -> None:
        if not isinstance(self.table, str) or not self.table:
            raise InvalidParameterError("join.table", _short(self.table), "the name of a table of the dataset")
        object.__setattr__(self, "on", _on_pairs(self.on))
        if self.how not in ("inner", "left"):
            raise InvalidParameterError(
                "how", _short(self.how), "'inner' or 'left'", "right, full and cross joins are not supported"
            )

    @classmethod
    def from_json(cls, i: int, obj: object) -> Join:
        if not isinstance(obj, Mapping):
            raise InvalidParameterError(
                f"join[{i}]", _short(obj), 'an object such as {"table": "regions", "on": ["postcode"], "how": "left"}'
            )
        extra = sorted(set(obj) - set(_JOIN_FIELDS))
        if extra:
            raise InvalidParameterError(f"join[{i}]", extra[0], "only the fields " + ", ".join(_JOIN_FIELDS))
        if "on" not in obj:
            raise InvalidParameterError(
                f"join[{i}].on", None, "the join's equalities", "a join without one is a cross join"
            )
        return cls(obj.get("table"), obj["on"], obj.get("how") or "inner")  # type: ignore[arg-type]

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"table": self.table, "on": [list(p) for p in self.on]}
        if self.how != "inner":
            out["how"] = self.how
        return out


@dataclass(frozen=True)
class QuerySpec:
    """One query, before it is checked against a schema.

    aggregates:
        The outputs (:mod:`dpkit.analytics.aggregates` objects).
    where:
        A filter: SQL predicate text of the analytics subset, or a predicate object.
    group_by, keys, bins:
        Group columns; the public key list (values for one column, tuples for several) and the
        bins per numeric group column: its edges, or a number of equal-width bins over its
        declared bounds (see :meth:`dpkit.analytics.Query.group_by`; SQL's ``BIN(c, n)`` and
        ``BIN(c, e0, e1, ...)`` compile to these).
    max_groups, max_rows:
        Contribution bounds per privacy unit for this query (None: the session's).
    table, joins:
        In a dataset of several tables: the table the query reads (``FROM``; None: the
        dataset's only private table) and the :class:`Join` s that extend it.
    keys_from:
        A public table whose rows are the group keys (its columns named as the group columns),
        instead of ``keys``.
    options:
        What it spends (None when the caller supplies the options separately).
    """

    aggregates: tuple[A.Aggregate, ...]
    where: str | Predicate | None = None
    group_by: tuple[str, ...] = ()
    keys: tuple[Any, ...] | None = None
    bins: Mapping[str, tuple[float, ...] | int] | None = None
    max_groups: int | None = None
    max_rows: int | None = None
    table: str | None = None
    joins: tuple[Join, ...] = ()
    keys_from: str | None = None
    options: QueryOptions | None = field(default=None, compare=True)

    def __post_init__(self) -> None:
        joins = self.joins
        if isinstance(joins, (Join, str, bytes)) or not isinstance(joins, Iterable):
            raise InvalidParameterError("joins", _short(joins), "a list of dpkit.analytics.Join")
        joins = tuple(joins)
        if not all(isinstance(j, Join) for j in joins):
            raise InvalidParameterError("joins", _short(joins), "a list of dpkit.analytics.Join")
        object.__setattr__(self, "joins", joins)
        for name in ("table", "keys_from"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise InvalidParameterError(
                    "from" if name == "table" else name, _short(value), "the name of a table of the dataset"
                )

    @classmethod
    def from_json(cls, obj: Mapping[str, Any], *, options: QueryOptions | None = None) -> QuerySpec:
        """A spec from the service's JSON query object::

            {"aggregates": [{"kind": "mean", "column": "age"}, {"kind": "quantile", "column": "age", "q": 0.9}],
             "where": "age > 30", "group_by": ["sex"], "bins": {"age": [0, 50, 100]},
             "keys": [["F"], ["M"]], "max_groups": 1, "max_rows": 1}

        Aggregate kinds: ``count``, ``count_units``, ``sum``, ``mean``, ``variance``, ``std``,
        ``quantile``; fields ``kind``, ``column``, ``q`` (quantile only) and ``name``. In a
        dataset of several tables, ``"from": "visits"`` names the table read, ``"join"`` lists
        joins (``{"table": "regions", "on": ["postcode"], "how": "left"}``; ``on`` also takes
        ``[["visits.postcode", "postcode"]]`` pairs) and ``"keys_from"`` names a public table
        whose rows are the group keys. A field
        given as null counts as absent. ``bins`` maps a group column to its edges, or to a whole
        number of equal-width bins over its declared bounds (``{"age": 10}``), as
        ``group_by(bins=)`` takes them. The column checks come later, against the schema."""
        if not isinstance(obj, Mapping):
            raise InvalidParameterError(
                "query", _short(obj), "a JSON object with aggregates and optionally " + ", ".join(_SPEC_FIELDS[1:])
            )
        extra = sorted(set(obj) - set(_SPEC_FIELDS))
        if extra:
            raise InvalidParameterError("query", extra[0], "only the fields " + ", ".join(_SPEC_FIELDS))
        raw = obj.get("aggregates")
        if not isinstance(raw, Sequence) or isinstance(raw, (str, bytes)) or not raw:
            raise InvalidParameterError(
                "aggregates", _short(raw), 'a non-empty list of aggregates such as [{"kind": "count"}]'
            )
        aggregates = tuple(_aggregate(i, item) for i, item in enumerate(raw))
        group_by = obj.get("group_by") or ()
        if isinstance(group_by, (str, bytes)) or not isinstance(group_by, Iterable):
            raise InvalidParameterError("group_by", _short(group_by), "a list of column names")
        bins = obj.get("bins")
        if bins is not None:
            if not isinstance(bins, Mapping):
                raise InvalidParameterError(
                    "bins",
                    _short(bins),
                    "a dict from column name to a list of increasing edges or a number of bins",
                )
            bins = {k: tuple(_number(x) for x in e) if isinstance(e, (list, tuple)) else e for k, e in bins.items()}
        keys = obj.get("keys")
        if keys is not None:
            if isinstance(keys, (str, bytes)) or not isinstance(keys, Iterable):
                raise InvalidParameterError(
                    "keys", _short(keys), "a list of public keys (values, or tuples for several columns)"
                )
            keys = tuple(tuple(k) if isinstance(k, (list, tuple)) else k for k in keys)
        joins = obj.get("join") or ()
        if isinstance(joins, (str, bytes, Mapping)) or not isinstance(joins, Iterable):
            raise InvalidParameterError(
                "join", _short(joins), 'a list of joins such as [{"table": "regions", "on": ["postcode"]}]'
            )
        return cls(
            aggregates=aggregates,
            where=obj.get("where"),
            group_by=tuple(group_by),
            keys=keys,
            bins=bins,
            max_groups=obj.get("max_groups"),
            max_rows=obj.get("max_rows"),
            table=obj.get("from"),
            joins=tuple(Join.from_json(i, j) for i, j in enumerate(joins)),
            keys_from=obj.get("keys_from"),
            options=options,
        )

    def to_dict(self) -> dict[str, Any]:
        """The JSON form: aggregates as dicts, and only the fields that are set."""
        out: dict[str, Any] = {"aggregates": [_aggregate_dict(a) for a in self.aggregates]}
        for name in _SPEC_FIELDS[1:]:
            value = getattr(self, _ATTRIBUTE.get(name, name))
            if value not in (None, ()):
                out[name] = [j.to_dict() for j in value] if name == "join" else value
        return out

    def to_json(self) -> str:
        """The canonical text of the query (sorted keys, defaults left out): what the ledger and
        the audit log record. (A ``where`` given as a predicate object, not as text, is written
        as its repr.)"""
        return json.dumps(self.to_dict(), sort_keys=True, default=str)


def _number(x: object) -> object:
    """A JSON bin edge as the service reads it: integers become floats (so ``[0, 50]`` and
    ``[0.0, 50.0]`` are one query and one recorded text); anything else is left to the checks."""
    if isinstance(x, int) and not isinstance(x, bool):
        try:
            return float(x)
        except OverflowError:
            return x
    return x


def _aggregate(i: int, item: object) -> A.Aggregate:
    """One aggregate of the JSON form (the messages name its index)."""
    if not isinstance(item, Mapping):
        raise InvalidParameterError(
            f"aggregates[{i}]", _short(item), "an object with the fields kind, column, q and name"
        )
    # A known field given as null is absent (as the service's body model dumps it); an unknown
    # field is refused even when null.
    item = {k: x for k, x in item.items() if x is not None or k not in _AGGREGATE_FIELDS}
    kind = item.get("kind")
    if not isinstance(kind, str) or kind not in AGGREGATE_KINDS:
        raise InvalidParameterError(f"aggregates[{i}].kind", kind, ", ".join(map(repr, AGGREGATE_KINDS)))
    extra = set(item) - _AGGREGATE_FIELDS
    if extra:
        raise InvalidParameterError(f"aggregates[{i}]", sorted(extra)[0], "only the fields kind, column, q and name")
    name = item.get("name")
    if kind in ("count", "count_units"):
        if "column" in item or "q" in item:
            raise InvalidParameterError(f"aggregates[{i}]", kind, f"{kind} without column or q")
        return AGGREGATE_KINDS[kind](name)
    if kind == "quantile":
        return A.QuantileAgg(item.get("column"), item.get("q"), name=name)  # type: ignore[arg-type]
    if "q" in item:
        raise InvalidParameterError(f"aggregates[{i}].q", item["q"], f"no q for {kind}")
    return AGGREGATE_KINDS[kind](item.get("column"), name=name)


def _aggregate_dict(a: A.Aggregate) -> dict[str, Any]:
    out: dict[str, Any] = {"kind": _JSON_KIND[a.kind]}
    if a.column is not None:
        out["column"] = a.column
    if isinstance(a, A.QuantileAgg):
        out["q"] = a.q
    if a.named:
        out["name"] = a.name
    return out
