"""The checks that turn a query's shape (filter, grouping, keys, bins, bounds, aggregates) into
validated plan parts — against the declared table only (:class:`DeclaredTable`), never the data.

The :class:`~dpkit.analytics.Query` builder runs them one call at a time (``where``,
``group_by``, ``bound``), and :func:`build` runs them all, in the same order, on a
:class:`~dpkit.analytics.spec.QuerySpec`; the messages are the same either way.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from dpkit._validate import short_repr as _short
from dpkit.analytics import aggregates as A
from dpkit.analytics.declared import ColumnKind, DeclaredTable, check_bound, undeclared_column
from dpkit.analytics.limits import public_key_count
from dpkit.analytics.metadata import Categorical, Metadata, Numeric
from dpkit.analytics.plan import And, Between, Compare, GroupKey, InList, IsNull, Not, Or, Predicate
from dpkit.analytics.spec import QuerySpec
from dpkit.analytics.sql_parse import parse_predicate
from dpkit.errors import Fix, InvalidParameterError

__all__ = [
    "Built",
    "build",
    "check_where",
    "check_group_by",
    "check_bounds",
    "check_aggregates",
    "public_counts",
    "public_key_count_of",
]

_PREDICATES = (Compare, InList, Between, IsNull, And, Or, Not)


@dataclass(frozen=True)
class Built:
    """A query's validated shape: the filter, the group keys, the public key list (None: from
    the metadata, or selected privately) and the contribution bounds."""

    predicate: Predicate | None
    groups: tuple[GroupKey, ...]
    keys: tuple[tuple[Any, ...], ...] | None
    max_groups: int
    max_rows: int


def literal_kind(value: object) -> ColumnKind | None:
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


def public_counts(metadata: Metadata, groups: Sequence[GroupKey]) -> list[int | None]:
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


def public_key_count_of(metadata: Metadata, groups: Sequence[GroupKey]) -> int:
    """The number of public keys of a group-by without ``keys=`` (with a privately selected
    column: the product of the other columns' public values, which still filter the table)."""
    return public_key_count(c for c in public_counts(metadata, groups) if c is not None)


def predicate_depth(p: Predicate) -> int:
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


# -- where -----------------------------------------------------------------------------------------


def check_where(t: DeclaredTable, current: Predicate | None, predicate: str | Predicate) -> Predicate:
    """``predicate`` (SQL text or a predicate object) checked against the declared columns and
    AND-ed onto ``current``."""
    limits = t.limits
    if isinstance(predicate, str):
        # (its text's nesting is checked there; t.c names a joined table's column)
        predicate = parse_predicate(predicate, limits=limits, qualified=t.join is not None)
    elif isinstance(predicate, _PREDICATES):
        limits.check("where nesting depth", predicate_depth(predicate), "max_query_depth")
    if not isinstance(predicate, _PREDICATES):
        raise InvalidParameterError(
            "predicate", _short(predicate), 'SQL text such as "age > 30" or a dpkit.analytics.plan predicate'
        )
    _check_predicate(t, predicate)
    return predicate if current is None else And((current, predicate))


def _check_predicate(t: DeclaredTable, p: Predicate) -> None:
    schema = t.columns
    if isinstance(p, (And, Or)):
        for x in p.parts:
            _check_predicate(t, x)
        return
    if isinstance(p, Not):
        _check_predicate(t, p.part)
        return
    if p.column not in schema:
        raise undeclared_column("where", p.column, schema)
    kind = schema[p.column]
    if kind == "unit":
        raise InvalidParameterError(
            "where",
            p.column,
            "a declared column",
            "the privacy unit can be filtered on only if the metadata declares it as a column",
        )
    if isinstance(p, IsNull):
        return
    lits = (p.value,) if isinstance(p, Compare) else p.values if isinstance(p, InList) else (p.low, p.high)
    for lit in lits:
        lk = literal_kind(lit)
        if lk is None or lk != kind:
            raise InvalidParameterError("where", _short(lit), f"a {kind} literal to compare with column {p.column!r}")


# -- group by ----------------------------------------------------------------------------------------


def check_group_by(
    t: DeclaredTable, current: tuple[GroupKey, ...], columns: Sequence[str], keys: Sequence[Any] | None, bins: Any
) -> tuple[tuple[GroupKey, ...], tuple[tuple[Any, ...], ...] | None]:
    """The group keys and the public key list of ``group_by(*columns, keys=, bins=)``."""
    columns = tuple(columns)
    if current:
        raise InvalidParameterError("group_by", columns, "a single group_by call per query (pass every column at once)")
    if not columns:
        raise InvalidParameterError("columns", columns, "at least one column name")
    bins = {} if bins is None else bins
    if not isinstance(bins, dict):
        raise InvalidParameterError("bins", _short(bins), "a dict from column name to a list of increasing edges")
    if len(set(columns)) != len(columns):
        raise InvalidParameterError("columns", columns, "distinct column names")
    schema = t.columns
    out = []
    for c in columns:
        if not isinstance(c, str):
            raise InvalidParameterError("columns", _short(c), f"a declared column's name ({', '.join(schema)})")
        if c not in schema:
            raise undeclared_column("columns", c, schema)
        if schema[c] == "unit":
            raise InvalidParameterError(
                "columns",
                c,
                "a declared column other than the privacy unit",
                "grouping by the unit would publish who is in the data; declare the column in the metadata to use it",
            )
        if c in bins:
            out.append(GroupKey(c, _check_edges(t, c, bins[c])))
        else:
            out.append(GroupKey(c))
    for c in bins:
        if c not in columns:
            raise InvalidParameterError("bins", c, "edges only for columns being grouped by")
    key_tuples = None
    if keys is not None:
        key_tuples = _check_keys(t, out, keys)
    else:  # counted, never listed: refused before the product is built anywhere
        t.limits.check("group_by keys", public_key_count_of(t.metadata, out), "max_keys")
    return tuple(out), key_tuples


def _check_edges(t: DeclaredTable, column: str, edges: Any) -> tuple[float, ...]:
    if t.columns[column] != "numeric":
        raise InvalidParameterError(f"bins[{column!r}]", _short(edges), "edges only for numeric columns")
    if isinstance(edges, int) and not isinstance(edges, bool):
        edges = _equal_width(t, column, edges)
    if not isinstance(edges, (str, bytes)) and hasattr(edges, "__iter__"):
        if not hasattr(edges, "__len__"):  # read no more of an iterator than the limit allows
            edges = tuple(itertools.islice(edges, t.limits.max_keys + 2))
        t.limits.check("group_by keys", max(len(edges) - 1, 0), "max_keys")
    try:
        e = tuple(float(x) for x in edges)
    except (TypeError, ValueError, OverflowError):  # OverflowError: an integer beyond the doubles
        raise InvalidParameterError(
            f"bins[{column!r}]", _short(edges), "a list of at least two increasing finite numbers"
        ) from None
    if len(e) < 2 or not all(math.isfinite(x) for x in e) or any(b <= a for a, b in zip(e, e[1:], strict=False)):
        raise InvalidParameterError(
            f"bins[{column!r}]", _short(edges), "a list of at least two increasing finite numbers"
        )
    return e


def _equal_width(t: DeclaredTable, column: str, count: int) -> tuple[float, ...]:
    """``count`` equal-width bins over the column's declared bounds: edges from the metadata
    alone (public), never from the data."""
    spec = t.metadata.columns.get(column)
    lower, upper = getattr(spec, "lower", None), getattr(spec, "upper", None)
    if lower is None or upper is None:
        raise InvalidParameterError(
            f"bins[{column!r}]",
            count,
            "a list of edges, or a number of bins for a column with declared bounds (Numeric(lower, upper))",
        )
    if count < 1:
        raise InvalidParameterError(f"bins[{column!r}]", count, "a number of bins >= 1, or a list of edges")
    t.limits.check("group_by keys", count, "max_keys")
    width = (float(upper) - float(lower)) / count
    return (*(float(lower) + i * width for i in range(count)), float(upper))


def _check_keys(t: DeclaredTable, groups: list[GroupKey], keys: Any) -> tuple[tuple[Any, ...], ...]:
    if isinstance(keys, (str, bytes)) or not hasattr(keys, "__iter__"):
        raise InvalidParameterError(
            "keys", _short(keys), "a list of public keys (values, or tuples for several columns)"
        )
    limit = t.limits.max_keys
    if not hasattr(keys, "__len__"):
        keys = tuple(itertools.islice(keys, limit + 1))
    t.limits.check("group_by keys", len(keys), "max_keys")
    out = []
    for k in keys:
        tup = tuple(k) if len(groups) > 1 and isinstance(k, (tuple, list)) else (k,)
        if len(tup) != len(groups):
            raise InvalidParameterError("keys", _short(k), f"tuples of {len(groups)} values (one per group column)")
        for g, x in zip(groups, tup, strict=True):
            kind = literal_kind(x)
            want = "numeric" if g.edges is not None else t.columns[g.column]
            if g.edges is not None or kind is None or kind != want:
                raise InvalidParameterError(
                    "keys",
                    _short(k),
                    f"values matching the column {g.column!r} ({want})"
                    + (" (binned columns take their keys from the bins)" if g.edges is not None else ""),
                )
        out.append(tup)
    if not out or len(set(out)) != len(out):
        raise InvalidParameterError("keys", _short(keys), "a non-empty list of distinct keys")
    return tuple(out)


def spec_keys(groups: Sequence[GroupKey], keys: tuple[tuple[Any, ...], ...] | None) -> tuple[Any, ...] | None:
    """Checked keys in the form ``group_by(keys=)`` takes them back (values for one column)."""
    if keys is None or len(groups) != 1:
        return keys
    return tuple(k[0] for k in keys)


# -- bounds and aggregates ------------------------------------------------------------------------


def check_bounds(t: DeclaredTable, current: tuple[int, int], max_groups: object, max_rows: object) -> tuple[int, int]:
    """``bound(max_groups=, max_rows=)``: overrides of the current bounds (None keeps one)."""
    g = current[0] if max_groups is None else check_bound("max_groups", max_groups, None, t.unit)
    r = current[1] if max_rows is None else check_bound("max_rows", max_rows, None, t.unit)
    return g, r


def check_aggregates(t: DeclaredTable, groups: Sequence[GroupKey], aggregates: object) -> tuple[A.Aggregate, ...]:
    """The aggregates, checked: known kinds, unique output names, declared bounded columns."""
    if isinstance(aggregates, (str, bytes)) or not hasattr(aggregates, "__iter__"):
        raise InvalidParameterError(
            "aggregates", _short(aggregates), "a list of aggregates such as [Count(), Mean('age')]"
        )
    specs: tuple[Any, ...] = tuple(aggregates)
    if not specs:
        raise InvalidParameterError("aggregates", specs, "at least one aggregate")
    # Every output column name — group columns, then <name>, <name>_low, <name>_high per
    # aggregate — must be unique (case-insensitively: tables and JSON are read by name).
    taken = {g.column.lower(): g.column for g in groups}
    schema = t.columns
    for spec in specs:
        if not isinstance(spec, A.AGGREGATE_TYPES):
            raise InvalidParameterError(
                "aggregates",
                _short(spec),
                "Count, CountUnits, Sum, Mean, Variance, Std or Quantile from dpkit.analytics",
            )
        name: str = spec.name  # type: ignore[assignment]  # resolved on construction, never None
        for out in (name, f"{name}_low", f"{name}_high"):
            if out.lower() in taken:
                raise InvalidParameterError(
                    "aggregates",
                    name,
                    "output names that do not collide",
                    f"the output column {out!r} would collide with {taken[out.lower()]!r} (each aggregate also writes <name>_low and <name>_high)",
                )
            taken[out.lower()] = out
        if spec.column is None:
            continue
        if spec.column not in schema:
            raise undeclared_column("column", spec.column, schema)
        spec_meta = t.metadata.columns.get(spec.column)
        if not isinstance(spec_meta, Numeric):
            declared = "the privacy unit" if spec_meta is None else f"Categorical, value_type {spec_meta.value_type!r}"
            raise InvalidParameterError(
                "column", spec.column, f"a Numeric column for {spec.kind} (it is declared as {declared})"
            )
        if not spec_meta.bounded:
            fix = Fix("declare_bounds", "Numeric(lower, upper) in the metadata", {"column": spec.column})
            raise InvalidParameterError(
                "column",
                spec.column,
                f"a column with declared bounds ({fix.text})",
                "sensitivity comes from declared bounds, never from the data",
                fix=fix,
            )
    return specs


# -- a whole spec ---------------------------------------------------------------------------------------


def build(spec: QuerySpec, t: DeclaredTable) -> Built:
    """A spec's shape, checked in the order the builder checks it: the filter, the grouping
    (keys and bins only with a group-by), then the bounds."""
    predicate = None
    if spec.where is not None:
        predicate = check_where(t, None, spec.where)
    groups: tuple[GroupKey, ...] = ()
    keys = None
    if spec.group_by:
        groups, keys = check_group_by(t, (), spec.group_by, spec.keys, None if spec.bins is None else dict(spec.bins))
    elif spec.keys is not None or spec.bins is not None:
        raise InvalidParameterError(
            "keys", spec.keys if spec.keys is not None else spec.bins, "keys and bins only with group_by"
        )
    g, r = check_bounds(t, (t.max_groups, t.max_rows), spec.max_groups, spec.max_rows)
    return Built(predicate, groups, keys, g, r)
