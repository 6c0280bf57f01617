"""Private SQL: a documented subset of SELECT, parsed with sqlglot and run as a private query.

Accepted (anything else is rejected with :class:`~dpkit.errors.InvalidParameterError` before the
engine sees anything; the text is never passed to the engine — it is compiled to a plan whose
identifiers are quoted and whose literals are bound parameters)::

    SELECT <item>, ... FROM <table> [WHERE <condition>] [GROUP BY <column>, ...]

* ``<item>``: a GROUP BY column, or one of ``COUNT(*)``, ``COUNT(DISTINCT <privacy unit>)``,
  ``SUM(c)``, ``AVG(c)`` / ``MEAN(c)``, ``VARIANCE(c)`` / ``VAR_POP(c)`` / ``VAR_SAMP(c)``,
  ``STDDEV(c)`` / ``STDDEV_POP(c)`` / ``STDDEV_SAMP(c)`` (all population moments of the clipped
  values), ``MEDIAN(c)``, ``QUANTILE_CONT(c, q)`` / ``QUANTILE(c, q)`` /
  ``PERCENTILE_CONT(q) WITHIN GROUP (ORDER BY c)``; each optionally ``AS alias``.
* ``<condition>``: comparisons (=, <>, !=, <, <=, >, >=) between a column and a literal,
  ``IN (...)``, ``BETWEEN ... AND ...``, ``IS [NOT] NULL``, combined with AND, OR, NOT and
  parentheses.
* ``<table>``: the session's table name.

Rejected: ``SELECT *`` and any bare column that is not grouped (reading rows), DISTINCT, joins,
subqueries, CTEs, set operations, HAVING, ORDER BY, LIMIT, window functions, expressions inside
aggregates, and every function not listed.

>>> import sqlglot
>>> parse_predicate("age > 30 AND sex IN ('F', 'M')")
And(parts=(Compare(column='age', op='>', value=30), InList(column='sex', values=('F', 'M'), negated=False)))
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import sqlglot
from sqlglot import exp

from dpkit.analytics import aggregates as A
from dpkit.analytics.plan import And, Between, Compare, InList, IsNull, Not, Or, Predicate
from dpkit.errors import InvalidParameterError

if TYPE_CHECKING:
    from dpkit.analytics.session import Query, Session

__all__ = ["parse_predicate", "compile_sql"]

_SUBSET = "SELECT <group columns and aggregates> FROM <table> [WHERE ...] [GROUP BY ...] (see dpkit.analytics.sql)"
_OPS = {exp.EQ: "=", exp.NEQ: "!=", exp.GT: ">", exp.GTE: ">=", exp.LT: "<", exp.LTE: "<="}
_FLIP = {"=": "=", "!=": "!=", ">": "<", ">=": "<=", "<": ">", "<=": ">="}


def _reject(what: str, node: Any, accepted: str = _SUBSET) -> InvalidParameterError:
    text = node.sql() if isinstance(node, exp.Expression) else str(node)
    return InvalidParameterError("sql", text[:200], accepted, what)


def _parse(text: object, what: str) -> exp.Expression:
    if not isinstance(text, str) or not text.strip():
        raise InvalidParameterError(what, text, "non-empty SQL text")
    try:
        trees = sqlglot.parse(text, read="duckdb")
    except sqlglot.errors.SqlglotError as exc:
        raise InvalidParameterError(what, text[:200], "valid SQL of the documented subset", f"it does not parse: {str(exc).splitlines()[0]}") from None
    trees = [t for t in trees if t is not None]
    if len(trees) != 1:
        raise InvalidParameterError(what, text[:200], "exactly one statement")
    return trees[0]


def _column_name(node: exp.Expression) -> str:
    if not isinstance(node, exp.Column) or node.table:
        raise _reject("only plain column names are accepted here", node)
    return node.name


def _literal(node: exp.Expression) -> Any:
    if isinstance(node, exp.Paren):
        return _literal(node.this)
    if isinstance(node, exp.Neg) and isinstance(node.this, exp.Literal) and not node.this.is_string:
        value = _literal(node.this)
        return -value
    if isinstance(node, exp.Boolean):
        return bool(node.this)
    if isinstance(node, exp.Literal):
        if node.is_string:
            return node.this
        text = node.this
        try:
            return int(text)
        except ValueError:
            try:
                return float(text)
            except ValueError:
                raise _reject("not a number", node) from None
    raise _reject("only literals (numbers, strings, TRUE/FALSE) are accepted on this side of a comparison", node)


def _predicate(node: exp.Expression) -> Predicate:
    if isinstance(node, exp.Paren):
        return _predicate(node.this)
    if isinstance(node, exp.And):
        return And((_predicate(node.this), _predicate(node.expression)))
    if isinstance(node, exp.Or):
        return Or((_predicate(node.this), _predicate(node.expression)))
    if isinstance(node, exp.Not):
        inner = node.this
        if isinstance(inner, exp.Is):
            return _is_null(inner, negated=True)
        if isinstance(inner, exp.In):
            return _in(inner, negated=True)
        if isinstance(inner, exp.Between):
            return _between(inner, negated=True)
        return Not(_predicate(inner))
    for cls, op in _OPS.items():
        if type(node) is cls:
            left, right = node.this, node.expression
            if isinstance(left, exp.Column):
                return Compare(_column_name(left), op, _literal(right))  # type: ignore[arg-type]
            if isinstance(right, exp.Column):
                return Compare(_column_name(right), _FLIP[op], _literal(left))  # type: ignore[arg-type]
            raise _reject("a comparison needs a column on one side and a literal on the other", node)
    if isinstance(node, exp.In):
        return _in(node, negated=False)
    if isinstance(node, exp.Between):
        return _between(node, negated=False)
    if isinstance(node, exp.Is):
        return _is_null(node, negated=False)
    raise _reject(f"{type(node).__name__} is not accepted in a condition", node)


def _in(node: exp.In, *, negated: bool) -> Predicate:
    if node.args.get("query") is not None or node.args.get("unnest") is not None or not node.expressions:
        raise _reject("IN takes a list of literals", node)
    return InList(_column_name(node.this), tuple(_literal(x) for x in node.expressions), negated)


def _between(node: exp.Between, *, negated: bool) -> Predicate:
    return Between(_column_name(node.this), _literal(node.args["low"]), _literal(node.args["high"]), negated)


def _is_null(node: exp.Is, *, negated: bool) -> Predicate:
    if not isinstance(node.expression, exp.Null):
        raise _reject("IS takes NULL or NOT NULL only", node)
    return IsNull(_column_name(node.this), negated)


def parse_predicate(text: str) -> Predicate:
    """A row filter from SQL text (the WHERE clause's grammar above)."""
    return _predicate(_parse(text, "where"))


def _resolve(session: Session, name: str) -> str:
    """A column name as the table spells it (exact match first, then case-insensitive)."""
    cols = session.columns
    if name in cols:
        return name
    matches = [c for c in cols if c.lower() == name.lower()]
    if len(matches) == 1:
        return matches[0]
    raise InvalidParameterError("sql", name, f"a column of the table ({', '.join(cols)})", "unknown column")


def _resolve_predicate(session: Session, p: Predicate) -> Predicate:
    if isinstance(p, (And, Or)):
        return type(p)(tuple(_resolve_predicate(session, x) for x in p.parts))
    if isinstance(p, Not):
        return Not(_resolve_predicate(session, p.part))
    return type(p)(_resolve(session, p.column), *[getattr(p, f) for f in p.__dataclass_fields__ if f != "column"])  # type: ignore[arg-type]


def _quantile_level(node: exp.Expression) -> float:
    q = _literal(node)
    if isinstance(q, bool) or not isinstance(q, (int, float)) or not 0 <= q <= 1:
        raise _reject("a quantile level is a number in [0, 1]", node)
    return float(q)


def _aggregate(session: Session, node: exp.Expression, alias: str | None) -> A.Aggregate:
    def col(arg: exp.Expression) -> str:
        if isinstance(arg, exp.Distinct):
            raise _reject("DISTINCT is accepted only as COUNT(DISTINCT <privacy unit>)", node)
        return _resolve(session, _column_name(arg))

    kw = {"name": alias} if alias else {}
    if isinstance(node, exp.Count):
        arg = node.this
        if isinstance(arg, exp.Star) or (isinstance(arg, exp.Literal) and not arg.is_string and arg.this == "1"):
            return A.Count(**kw)
        if isinstance(arg, exp.Distinct) and len(arg.expressions) == 1:
            name = _resolve(session, _column_name(arg.expressions[0]))
            if name != session.privacy_unit:
                raise _reject(f"COUNT(DISTINCT ...) is accepted for the privacy unit only ({session.privacy_unit or 'none: each row is a unit'})", node)
            return A.CountUnits(**kw)
        raise _reject("COUNT takes * or DISTINCT <privacy unit>", node)
    if isinstance(node, exp.Sum):
        return A.Sum(col(node.this), **kw)
    if isinstance(node, exp.Avg):
        return A.Mean(col(node.this), **kw)
    if isinstance(node, (exp.Variance, exp.VariancePop)):
        return A.Variance(col(node.this), **kw)
    if isinstance(node, (exp.Stddev, exp.StddevPop, exp.StddevSamp)):
        return A.Std(col(node.this), **kw)
    if isinstance(node, exp.Median):
        return A.Quantile(col(node.this), 0.5, **kw)
    if isinstance(node, (exp.PercentileCont, exp.Quantile, exp.ApproxQuantile)):
        level = node.args.get("expression") or node.args.get("quantile")
        if level is not None and isinstance(node.this, exp.Column):
            return A.Quantile(col(node.this), _quantile_level(level), **kw)
    if isinstance(node, exp.WithinGroup) and isinstance(node.this, exp.PercentileCont):
        order = node.expression
        if not isinstance(order, exp.Order) or len(order.expressions) != 1:
            raise _reject("PERCENTILE_CONT(q) WITHIN GROUP (ORDER BY <column>)", node)
        return A.Quantile(col(order.expressions[0].this), _quantile_level(node.this.this), **kw)
    if isinstance(node, exp.Anonymous) and node.name.lower() in ("mean",) and len(node.expressions) == 1:
        return A.Mean(col(node.expressions[0]), **kw)
    if isinstance(node, exp.Anonymous) and node.name.lower() in ("var_samp",) and len(node.expressions) == 1:
        return A.Variance(col(node.expressions[0]), **kw)
    raise _reject(f"{node.sql()[:60]} is not an accepted aggregate", node)


_ALLOWED_ARGS = {"expressions", "from", "from_", "where", "group", "kind", "hint"}


def compile_sql(session: Session, text: str) -> tuple[Query, list[A.Aggregate]]:
    """The query and aggregates a SQL text asks for (raises before anything runs)."""
    tree = _parse(text, "sql")
    if not isinstance(tree, exp.Select):
        raise _reject(f"only SELECT is accepted, not {type(tree).__name__}", tree)
    for key, value in tree.args.items():
        if value in (None, [], False):
            continue
        if key not in _ALLOWED_ARGS:
            raise _reject(f"{key.upper().rstrip('_').removesuffix('S') if key in ('joins', 'with_', 'laterals') else key.upper()} is not accepted", tree)
    source = tree.args.get("from") or tree.args.get("from_")
    if source is None:
        raise _reject("FROM <table> is required", tree)
    if source.args.get("expressions"):
        raise _reject("one table only", source)
    table = source.this
    if isinstance(table, exp.Table) and not table.name:
        raise _reject("FROM takes the session's table name only (no table functions such as read_csv)", source)
    if not isinstance(table, exp.Table) or table.args.get("db") or table.args.get("catalog") or table.args.get("joins") or table.alias:
        raise _reject("FROM takes the session's table name only (no subqueries, joins or aliases)", source)
    if table.name != session.table and table.name.lower() != session.table.lower():
        raise InvalidParameterError("sql", table.name, f"the session's table {session.table!r}")
    for node in tree.find_all(exp.Subquery, exp.Window, exp.Union, exp.Join, exp.Lateral):
        raise _reject(f"{type(node).__name__} is not accepted", node)
    groups: list[str] = []
    group = tree.args.get("group")
    if group is not None:
        for g in group.expressions:
            groups.append(_resolve(session, _column_name(g)))
    aggs: list[A.Aggregate] = []
    for item in tree.expressions:
        alias = None
        node = item
        if isinstance(item, exp.Alias):
            alias, node = item.alias, item.this
        if isinstance(node, exp.Star):
            raise _reject("SELECT * would read rows: select aggregates", item, "aggregates such as COUNT(*), AVG(age)")
        if isinstance(node, exp.Column):
            name = _resolve(session, _column_name(node))
            if name not in groups:
                raise _reject(f"the column {name!r} is neither grouped nor aggregated (reading rows is not allowed)", item, "aggregates, and columns that appear in GROUP BY")
            if alias and alias != name:
                raise _reject("group columns keep their names (no alias)", item)
            continue
        aggs.append(_aggregate(session, node, alias))
    if not aggs:
        raise _reject("at least one aggregate is needed", tree)
    query = session.query()
    where = tree.args.get("where")
    if where is not None:
        query = query.where(_resolve_predicate(session, _predicate(where.this)))
    if groups:
        query = query.group_by(*groups)
    return query, aggs
