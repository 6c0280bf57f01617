"""Private SQL: a documented subset of SELECT, parsed with sqlglot and run as a private query.

The text is never passed to the engine: it is parsed (DuckDB dialect), checked against a
whitelist and compiled to a plan whose identifiers are quoted and whose literals are bound
parameters. The whitelist covers the *whole* parse tree — every node's type and every one of its
arguments — so a clause is either listed below, and honoured, or refused with
:class:`~dpkit.errors.InvalidParameterError` (parameter ``sql``, the offending fragment, what is
accepted) before anything runs and before any budget is spent.

Accepted — exactly this::

    SELECT <item>, ... FROM <table> [WHERE <condition>] [GROUP BY <group>, ...]

(DuckDB's ``FROM <table> SELECT ...`` order is the same statement; one trailing ``;`` is fine.)

On a session over several tables (a dataset, :class:`~dpkit.analytics.DatasetMetadata`), FROM
also takes aliases and joins::

    FROM <table> [[AS] alias] { [INNER] JOIN | LEFT [OUTER] JOIN } <table> [[AS] alias]
        { ON a.x = b.y [AND a.z = b.w ...] | USING (x, ...) } ...

(any number of joins; :mod:`dpkit.analytics.sql_joins` reads them). Each equality of ON compares
a column of the table the JOIN adds with a column of a table before it (``a.x`` or a bare name
that one of those tables has); ``USING (x)`` is ``ON <the one earlier table with x>.x = b.x``.
It is exactly ``session.query(table).join(t2, on=[("table.x", "y"), ...], how=...)``: the same
:class:`~dpkit.analytics.spec.QuerySpec` (``table``, ``joins``; each left column is
``table.column`` of an earlier table, aliases resolved to the dataset's names) and the same
release. Which joins are allowed, and what they cost, is :func:`dpkit.analytics.joins.join_table`'s
to decide — a public table on columns of one declared type, another private table on the privacy
unit — and its refusals come through unchanged. ``FROM <public> JOIN <private>`` (an inner join)
reads the private table, as the builder does: the spec says ``FROM <private> JOIN <public>``.

A column may then be qualified, ``a.col`` / ``table.col``, everywhere a column is accepted (group
columns, BIN, aggregates, COUNT(DISTINCT <unit>), WHERE); an aliased table is named by its alias
only, as in SQL. A column resolves to its name in the joined table, which is the name the
builder takes and the result's column: the bare name where it is that very column (only one
table has it, or it is the left column of a same-named join pair), else ``table.column``. So
``SELECT r.region ...`` gives the column ``region``, and in ``visits v JOIN regions r ON
v.postcode = r.postcode``, ``v.postcode`` is ``postcode`` and ``r.postcode`` is
``regions.postcode``. A bare name two tables share (other than such a pair) must be qualified.
The privacy unit of the joined rows is the table read's; another private table's unit column is
for ON / USING only.

* ``<group>``: a column, or the bins of a numeric column — ``BIN(c, n)``: n equal-width bins
  over its *declared* bounds (n a whole number >= 1; the edges come from the metadata, never
  from the data), or ``BIN(c, e0, e1, ...)``: explicit edges (at least two increasing finite
  numbers) — written in GROUP BY as the same ``BIN(...)`` or as the alias it has in the SELECT
  list. It is exactly ``group_by(c, bins={c: n})`` / ``bins={c: [e0, e1, ...]}``: the same
  :class:`~dpkit.analytics.spec.QuerySpec`, the same keys, the labels ``[a, b)`` (the last bin
  closed) and the same release; values outside every bin are dropped. The result's column is
  the column's own name, as with ``group_by(bins=)``: an alias only lets GROUP BY refer to the
  BIN (so it may not be a column's name). One column has one set of bins (two different BINs
  of it, or it grouped both as it is and by BIN, are refused); BIN anywhere else (a condition,
  an aggregate) is refused. ``WIDTH_BUCKET`` is refused: its buckets 0 and n + 1 (values
  outside [lo, hi)) and its open last bucket are not these bins.
* ``<item>``: a GROUP BY column (under its own name: no other alias), its ``BIN(...)``
  (optionally ``[AS] alias``), or an aggregate,
  optionally ``[AS] alias``: ``COUNT(*)`` / ``COUNT(1)``, ``COUNT(DISTINCT <privacy unit>)``,
  ``SUM(c)``, ``AVG(c)`` / ``MEAN(c)``, ``VARIANCE(c)`` / ``VAR_POP(c)`` / ``VAR_SAMP(c)``, ``STDDEV(c)`` /
  ``STDDEV_POP(c)`` / ``STDDEV_SAMP(c)`` (all population moments of the clipped values),
  ``MEDIAN(c)``, ``QUANTILE_CONT(c, q)`` / ``PERCENTILE_CONT(c, q)`` / ``QUANTILE(c, q)`` /
  ``APPROX_QUANTILE(c, q)``, and ``PERCENTILE_CONT(q) WITHIN GROUP (ORDER BY c [ASC | DESC]
  [NULLS FIRST | NULLS LAST])``. ``c`` is a plain column name and ``q`` a number literal in
  [0, 1]. ``DESC`` is honoured: the q-th quantile of the descending order is the (1 − q)-th of the
  ascending one (so the default name of ``... (ORDER BY age DESC)`` at 0.9 is ``q10_age``).
  ``NULLS FIRST/LAST`` change nothing, as in SQL: NULLs are skipped by quantiles.
* ``<condition>``: comparisons (=, ==, <>, !=, <, <=, >, >=) between a column and a literal
  (either side), ``c [NOT] IN (<literal>, ...)`` (or DuckDB's ``[...]`` list),
  ``c [NOT] BETWEEN <literal> AND <literal>``, ``c IS [NOT] NULL``, combined with AND, OR, NOT and parentheses. A literal is a number
  (optionally signed; finite), a 'string' or TRUE/FALSE, optionally in parentheses.
* ``<table>``: the session's table name (over several tables: a table of the dataset);
  ``<column>``: a declared column's name, bare or
  "double-quoted" (quoted names may hold any characters; both kinds resolve exactly first, then
  case-insensitively when that is unambiguous, as DuckDB does; a group column keeps the declared
  spelling in the result).
* Comments (``-- ...``, ``/* ... */``) are ignored, as in SQL; hint comments are not (below).
* Nesting is bounded by the session's ``limits.max_query_depth`` (default 32): parentheses and
  brackets count one level each, and so does each AND, OR and NOT chained at one level. It is
  measured by one linear pass over the text before it is parsed; deeper text is refused with
  :class:`~dpkit.errors.LimitExceededError`, as is anything the parser cannot follow within
  Python's recursion limit.

The result carries every GROUP BY column (selected or not), then, for each aggregate with name
``X`` (its alias, or the default: ``count``, ``count_units``, ``sum_c``, ``mean_c``, ``var_c``,
``std_c``, ``median_c``, ``qNN_c``), the columns ``X``, ``X_low`` and ``X_high``. These output
names must all differ, compared case-insensitively (pandas, JSON consumers and SQL engines
disagree on case, so ``n`` and ``N`` are one name): a collision is refused, e.g.
``SUM(age) AS a_low, COUNT(*) AS a`` or a group column ``count_low`` beside ``COUNT(*)``.

Rejected — everything else, in particular: ``SELECT *`` (with or without EXCLUDE / REPLACE /
RENAME) and any bare column that is not grouped (reading rows); ``SELECT DISTINCT`` and
``DISTINCT ON``; ``SELECT ... INTO``; a group column under another alias, or selected twice;
``DISTINCT`` inside any aggregate but ``COUNT(DISTINCT <privacy unit>)``; expressions, casts (``age::INT``), functions, COLLATE,
placeholders, arrays, subqueries and ``FILTER (WHERE ...)``, inside aggregates or conditions;
``ORDER BY`` inside aggregates other than PERCENTILE_CONT's WITHIN GROUP, and ``WITH FILL``;
window functions (``OVER``), ``WINDOW``, ``QUALIFY``; ``HAVING``, ``ORDER BY``, ``LIMIT``,
``OFFSET``; ``GROUP BY ALL``, ``GROUPING SETS``, ``ROLLUP``, ``CUBE``, positions or expressions
(other than ``BIN``) in GROUP BY, ``WIDTH_BUCKET``; CTEs (``WITH``), set operations, ``VALUES``, ``LATERAL``, ``UNNEST``, table
functions (``read_csv(...)``); on the table: qualified names (``db.t``), ``TABLESAMPLE`` / ``USING
SAMPLE``, ``PIVOT`` / ``UNPIVOT``, time travel (``AT (VERSION => 1)``, ``FOR ... AS OF``), table
hints, ``ONLY``; optimizer-hint comments (``/*+ ... */``, ``/*! ... */``); every statement but
SELECT, and more than one statement. On a session over one table: joins, several tables, table
aliases (DuckDB reads ``FROM t FINAL`` as the alias ``FINAL``) and column references with a
table qualifier (``adult.age``). Over several tables: comma joins (``FROM a, b``), ``CROSS``,
``NATURAL``, ``RIGHT``, ``FULL``, ``SEMI`` / ``ANTI``, ``ASOF`` and ``POSITIONAL`` joins, a JOIN
without ON / USING, nested (parenthesised) joins, joins of subqueries or in a subquery; an ON
that is not AND-ed equalities of two columns of two different tables (``<``, ``OR``, literals,
functions, ``IS NOT DISTINCT FROM``, two columns of one table, no column of the joined table);
an ambiguous ``USING`` column; column aliases (``t AS a(x, y)``); an alias that is the name of
another table of the dataset, two tables under one name, a table read twice; a qualifier that is
not a table or alias of the query (or an aliased table's own name); ``t.*``.

>>> from dpkit.analytics.sql_parse import parse_predicate
>>> parse_predicate("age > 30 AND sex IN ('F', 'M')")
And(parts=(Compare(column='age', op='>', value=30), InList(column='sex', values=('F', 'M'), negated=False)))
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal
from typing import Any, Protocol

from sqlglot import exp

from dpkit.analytics import aggregates as A
from dpkit.analytics.declared import undeclared_column
from dpkit.analytics.limits import QueryLimits
from dpkit.analytics.plan import And, Not, Or, Predicate
from dpkit.analytics.spec import QuerySpec
from dpkit.analytics.sql_joins import JOIN_NODES, FromClause, compile_from
from dpkit.analytics.sql_parse import (
    _BIN,
    _NODES,
    _SUBSET,
    _backstop,
    _bin_parts,
    _check_node,
    _column_name,
    _is_bin,
    _literal,
    _parse,
    _predicate,
    _reject,
    _sql,
    _too_deep,
    _what,
)
from dpkit.errors import InvalidParameterError

__all__ = ["compile_sql", "compile_spec"]

#: The bins of one column as ``group_by(bins=)`` takes them: a number of equal-width bins over
#: the declared bounds, or the edges.
Bins = int | tuple[float, ...]


class Session(Protocol):
    """What SQL compiles against: a table's name, its declared columns (name → kind), its
    privacy unit and its size limits — a :class:`~dpkit.analytics.Session` or a
    :class:`~dpkit.analytics.declared.DeclaredTable`. (Only the declared facts: no data.) A
    session over several tables also has ``_tables``, which FROM and JOIN are resolved on."""

    @property
    def table(self) -> str: ...

    @property
    def columns(self) -> Mapping[str, str]: ...

    @property
    def privacy_unit(self) -> str | None: ...

    @property
    def limits(self) -> QueryLimits: ...


def _resolve(session: Session, name: str) -> str:
    """A column name as the table spells it (exact match first, then case-insensitive)."""
    cols = session.columns
    if name in cols:
        return name
    matches = [c for c in cols if c.lower() == name.lower()]
    if len(matches) == 1:
        return matches[0]
    raise undeclared_column("sql", name, cols)


def _resolve_predicate(session: Session, p: Predicate) -> Predicate:
    if isinstance(p, (And, Or)):
        return type(p)(tuple(_resolve_predicate(session, x) for x in p.parts))
    if isinstance(p, Not):
        return Not(_resolve_predicate(session, p.part))
    return type(p)(_resolve(session, p.column), *[getattr(p, f) for f in p.__dataclass_fields__ if f != "column"])


def _quantile_level(node: exp.Expression | None, *, descending: bool = False) -> float:
    q = _literal(node) if node is not None else None
    if isinstance(q, bool) or not isinstance(q, (int, float)) or not 0 <= q <= 1:
        raise _reject("a quantile level is a number in [0, 1]", node)
    if descending:
        # The q-th quantile of the descending order is the (1 - q)-th of the ascending order
        # (exact decimal arithmetic on the literal, so 0.9 becomes 0.1, not 0.09999999999999998).
        return float(Decimal(1) - Decimal(repr(float(q))))
    return float(q)


def _within_group(session: Session, node: exp.WithinGroup, col: Any, kw: dict[str, str]) -> A.Aggregate:
    usage = "PERCENTILE_CONT(q) WITHIN GROUP (ORDER BY <column> [ASC | DESC] [NULLS FIRST | NULLS LAST])"
    func, order = node.this, node.expression
    if type(func) is not exp.PercentileCont or func.args.get("expression") is not None:
        raise _reject(f"WITHIN GROUP is accepted only as {usage}", node)
    if (
        not isinstance(order, exp.Order)
        or len(order.expressions) != 1
        or not isinstance(order.expressions[0], exp.Ordered)
    ):
        raise _reject(f"{usage}: one ordering column", node)
    ordered = order.expressions[0]
    # nulls_first is honoured by ignoring it: quantiles skip NULLs wherever they sort, as in SQL.
    return A.QuantileAgg(col(ordered.this), _quantile_level(func.this, descending=bool(ordered.args.get("desc"))), **kw)


def _aggregate(session: Session, node: exp.Expression, alias: str | None) -> A.Aggregate:
    def col(arg: exp.Expression) -> str:
        if isinstance(arg, exp.Distinct):
            raise _reject("DISTINCT is accepted only as COUNT(DISTINCT <privacy unit>)", node)
        return _resolve(session, _column_name(arg))

    kw = {"name": alias} if alias else {}
    kind = type(node)
    if kind is exp.Count:
        arg = node.this
        if isinstance(arg, exp.Star) or (isinstance(arg, exp.Literal) and not arg.is_string and arg.this == "1"):
            return A.Count(**kw)
        if isinstance(arg, exp.Distinct) and len(arg.expressions) == 1:
            name = _resolve(session, _column_name(arg.expressions[0]))
            if name != session.privacy_unit:
                raise _reject(
                    f"COUNT(DISTINCT ...) is accepted for the privacy unit only ({session.privacy_unit or 'none: each row is a unit'})",
                    node,
                )
            return A.CountUnits(**kw)
        raise _reject("COUNT takes * (or 1) or DISTINCT <privacy unit>", node)
    if kind is exp.Sum:
        return A.Sum(col(node.this), **kw)
    if kind is exp.Avg:
        return A.Mean(col(node.this), **kw)
    if kind in (exp.Variance, exp.VariancePop):
        return A.Variance(col(node.this), **kw)
    if kind in (exp.Stddev, exp.StddevPop, exp.StddevSamp):
        return A.Std(col(node.this), **kw)
    if kind is exp.Median:
        return A.QuantileAgg(col(node.this), 0.5, **kw)
    if kind is exp.PercentileCont:
        return A.QuantileAgg(col(node.this), _quantile_level(node.args.get("expression")), **kw)
    if kind in (exp.Quantile, exp.ApproxQuantile):
        return A.QuantileAgg(col(node.this), _quantile_level(node.args.get("quantile")), **kw)
    if kind is exp.WithinGroup:
        return _within_group(session, node, col, kw)  # type: ignore[arg-type]
    if kind is exp.Anonymous and len(node.expressions) == 1:
        fname = node.name.lower()
        if fname == "mean":
            return A.Mean(col(node.expressions[0]), **kw)
        if fname == "var_samp":
            return A.Variance(col(node.expressions[0]), **kw)
    raise _reject(f"{_sql(node)[:60]} is not an accepted aggregate ({_what(node)})", node)


def _check_alias(item: exp.Alias) -> str:
    alias = item.alias
    if not alias or any(not ch.isprintable() for ch in alias):
        raise _reject("an alias is a non-empty name without control characters", item)
    return alias


def _declared(session: Session, column: str) -> object:
    """The metadata's declaration of ``column``, when the session has metadata (a
    :class:`~dpkit.analytics.Session` and a :class:`~dpkit.analytics.declared.DeclaredTable` do)."""
    columns = getattr(getattr(session, "metadata", None), "columns", None)
    return columns.get(column) if isinstance(columns, Mapping) else None


def _bin(session: Session, call: exp.Expression) -> tuple[str, Bins]:
    """The column and the bins of ``BIN(c, n)`` / ``BIN(c, e0, e1, ...)``, checked against the
    declared schema (a numeric column; declared bounds for a number of bins). The edges and the
    key limit are checked again by the query builder, which is what the session runs."""
    column, bins = _bin_parts(call)
    name = _resolve(session, _column_name(column))
    kind = session.columns[name]
    if kind != "numeric":
        declared = "the privacy unit" if kind == "unit" else f"a {kind} column"
        raise _reject(f"BIN takes a numeric column; {name!r} is {declared}", call, _BIN)
    if isinstance(bins, int):
        spec = _declared(session, name)
        if spec is not None and (getattr(spec, "lower", None) is None or getattr(spec, "upper", None) is None):
            raise _reject(
                f"a number of bins needs the declared bounds of {name!r} (Numeric(lower, upper) in the metadata), "
                f"and it has none: give explicit edges, BIN({name}, e0, e1, ...) — bounds come from the metadata, "
                "never from the data",
                call,
                _BIN,
            )
    return name, bins


def _check_bin_places(tree: exp.Select, group: exp.Group | None) -> None:
    """BIN only as a SELECT item (aliased or not) or a GROUP BY item."""
    allowed = {id(item.this if isinstance(item, exp.Alias) else item) for item in tree.expressions}
    if group is not None:
        allowed |= {id(g) for g in group.expressions}
    for node in tree.find_all(exp.Anonymous):
        if _is_bin(node) and id(node) not in allowed:
            raise _reject(
                "BIN(...) is accepted only as a SELECT item or a GROUP BY item, not inside a condition, "
                "an aggregate or another expression",
                node,
                _BIN,
            )


def _bin_aliases(session: Session, tree: exp.Select) -> dict[str, tuple[str, Bins]]:
    """The SELECT list's aliased BINs, by alias (case-folded): what GROUP BY may name."""
    out: dict[str, tuple[str, Bins]] = {}
    for item in tree.expressions:
        if not (isinstance(item, exp.Alias) and _is_bin(item.this)):
            continue
        alias = _check_alias(item)
        key = alias.casefold()
        if any(c.casefold() == key for c in session.columns):
            raise _reject(
                f"the alias {alias!r} of a BIN is a column's name (GROUP BY {alias} would mean the column): "
                "choose another alias",
                item,
                _BIN,
            )
        if key in out:
            raise _reject(f"two BINs are aliased {alias!r}", item, _BIN)
        out[key] = _bin(session, item.this)
    return out


def _check_output_names(outputs: list[tuple[str, str, exp.Expression]]) -> None:
    """Refuse two output columns whose names are equal ignoring case (see the module docstring)."""
    seen: dict[str, str] = {}
    for name, origin, node in outputs:
        key = name.casefold()
        if key in seen:
            raise _reject(
                f"two output columns would be named {name!r} ({seen[key]}; {origin}) — names are compared case-insensitively, "
                "and each aggregate X also produces X_low and X_high: rename one with AS",
                node,
                "distinct output column names: the group columns, and for each aggregate X the columns X, X_low and X_high",
            )
        seen[key] = origin


def _one_table(session: Session, tree: exp.Select) -> FromClause | None:
    """The FROM clause of a session over one table: its name, nothing else."""
    source = tree.args.get("from") or tree.args.get("from_")
    if source is None:
        raise _reject("FROM <table> is required", tree)
    table = source.this
    if not isinstance(table, exp.Table):
        raise _reject("FROM takes the session's table name only (no subqueries, joins or aliases)", source)
    if not isinstance(table.this, exp.Identifier):
        raise _reject("FROM takes the session's table name only (no table functions such as read_csv)", source)
    _check_node(table, _NODES, _SUBSET)  # alias, db.table, TABLESAMPLE, PIVOT, time travel, hints, ONLY, ...
    if table.name != session.table and table.name.lower() != session.table.lower():
        raise InvalidParameterError("sql", table.name[:200], f"the session's table {session.table!r}")
    return None


def _compile_select(
    session: Session, tree: exp.Select
) -> tuple[
    FromClause | None,
    Predicate | None,
    list[str],
    dict[str, Bins],
    list[A.Aggregate],
    list[tuple[str, str, exp.Expression]],
]:
    tables = getattr(session, "_tables", None)
    # The clauses first (DISTINCT, WITH, HAVING, LIMIT, joins, TABLESAMPLE, ...): the clearest refusals.
    _check_node(tree, _NODES if tables is None else JOIN_NODES, _SUBSET)
    source = _one_table(session, tree) if tables is None else compile_from(tables, tree)
    if source is not None:  # the rest is checked against the joined table's declared facts
        session = source.facts
    group = tree.args.get("group")
    if group is not None:
        _check_node(group, _NODES, _SUBSET)  # GROUP BY ALL, GROUPING SETS, ROLLUP, CUBE

    _check_bin_places(tree, group)
    aliases = _bin_aliases(session, tree)
    groups: list[str] = []
    bins: dict[str, Bins] = {}
    shown: dict[str, str] = {}  # a binned column's BIN, as GROUP BY wrote it
    outputs: list[tuple[str, str, exp.Expression]] = []
    if group is not None:
        for g in group.expressions:
            if _is_bin(g):
                name, b = _bin(session, g)
            elif (
                isinstance(g, exp.Column)
                and not g.args.get("table")
                and isinstance(g.this, exp.Identifier)
                and g.name.casefold() in aliases
            ):
                name, b = aliases[g.name.casefold()]
            else:
                name = _resolve(session, _column_name(g))
                if name in bins:
                    raise _reject(
                        f"the column {name!r} is grouped both by {shown[name]} and as it is: group by one of them",
                        g,
                        _BIN,
                    )
                groups.append(name)
                outputs.append((name, f"the group column {name!r}", g))
                continue
            if name in bins:
                why = "two different BINs of one column" if bins[name] != b else "the same BIN twice"
                raise _reject(f"GROUP BY has {why} ({shown[name]}; {_sql(g)}): one column has one set of bins", g, _BIN)
            if name in groups:
                raise _reject(
                    f"the column {name!r} is grouped both as it is and by {_sql(g)}: group by one of them", g, _BIN
                )
            bins[name], shown[name] = b, _sql(g)
            groups.append(name)
            outputs.append((name, f"the binned group column {name!r} ({shown[name]})", g))
    aggs: list[A.Aggregate] = []
    selected: set[str] = set()
    for item in tree.expressions:
        alias = None
        node = item
        if isinstance(item, exp.Alias):
            alias, node = _check_alias(item), item.this
        if isinstance(node, exp.Star):
            raise _reject("SELECT * would read rows: select aggregates", item, "aggregates such as COUNT(*), AVG(age)")
        if _is_bin(node):
            name, b = _bin(session, node)
            if name not in bins:
                place = f"the column {name!r} is grouped as it is" if name in groups else "it is not in GROUP BY"
                raise _reject(f"{_sql(node)} is not grouped ({place}): GROUP BY the same BIN or its alias", item, _BIN)
            if bins[name] != b:
                raise _reject(
                    f"two different BINs of one column ({shown[name]} in GROUP BY; {_sql(node)}): one column has one set of bins",
                    item,
                    _BIN,
                )
            if name in selected:
                raise _reject(f"the bins of {name!r} are selected twice (the result has one column per name)", item)
            selected.add(name)
            continue
        if isinstance(node, exp.Column):
            name = _resolve(session, _column_name(node))
            if name in bins:
                raise _reject(
                    f"the column {name!r} is grouped by {shown[name]}, not as it is: select that BIN "
                    "(or nothing: every group column is in the result)",
                    item,
                    _BIN,
                )
            if name not in groups:
                raise _reject(
                    f"the column {name!r} is neither grouped nor aggregated (reading rows is not allowed)",
                    item,
                    "aggregates, and columns that appear in GROUP BY",
                )
            if alias and alias != name:
                raise _reject("group columns keep their names (no alias)", item)
            if name in selected:
                raise _reject(f"the group column {name!r} is selected twice (the result has one column per name)", item)
            selected.add(name)
            continue
        agg = _aggregate(session, node, alias)
        aggs.append(agg)
        origin = f"from {_sql(item)[:60]}"
        outputs += [(agg.name + suffix, f"{agg.name + suffix!r} {origin}", item) for suffix in ("", "_low", "_high")]  # type: ignore[operator]
    if not aggs:
        raise _reject("at least one aggregate is needed", tree)
    where = tree.args.get("where")
    predicate = _resolve_predicate(session, _predicate(where.this)) if where is not None else None
    return source, predicate, groups, bins, aggs, outputs


def compile_spec(session: Session, text: str) -> QuerySpec:
    """The :class:`~dpkit.analytics.spec.QuerySpec` a SQL text asks for (without options), its
    column names spelled as the table declares them (as the joined table names them, with its
    ``table`` and ``joins``, on a session over several tables). Raises before anything runs;
    text nested deeper than ``session.limits.max_query_depth`` raises LimitExceededError."""
    try:
        return _compile(session, text)
    except RecursionError:
        raise _too_deep("sql", session.limits) from None


def compile_sql(session: Any, text: str) -> tuple[Any, list[A.Aggregate]]:
    """The :class:`~dpkit.analytics.Query` on ``session`` and the aggregates a SQL text asks for
    (see :func:`compile_spec`; the filter and grouping are checked by the query builder)."""
    try:
        spec = _compile(session, text)
        query = session.query() if spec.table is None else session.query(spec.table)
        for j in spec.joins:
            query = query.join(j.table, j.on, how=j.how)
        if spec.where is not None:
            query = query.where(spec.where)
        if spec.bins:  # the builder checks them again, and turns a number of bins into edges
            query = query.group_by(*spec.group_by, bins=dict(spec.bins))
        elif spec.group_by:
            query = query.group_by(*spec.group_by)
    except RecursionError:
        raise _too_deep("sql", session.limits) from None
    return query, list(spec.aggregates)


def _compile(session: Session, text: str) -> QuerySpec:
    tree = _parse(text, "sql", session.limits)
    if not isinstance(tree, exp.Select):
        raise _reject(f"only SELECT is accepted, not {type(tree).__name__}", tree)
    nodes = _NODES if getattr(session, "_tables", None) is None else JOIN_NODES
    source, predicate, groups, bins, aggs, outputs = _backstop(
        tree, nodes, _SUBSET, lambda: _compile_select(session, tree)
    )
    _check_output_names(outputs)
    return QuerySpec(
        aggregates=tuple(aggs),
        where=predicate,
        group_by=tuple(groups),
        bins=bins or None,
        table=source.table if source is not None else None,
        joins=source.joins if source is not None else (),
    )
