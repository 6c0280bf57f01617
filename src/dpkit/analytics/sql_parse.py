"""The parsing layer of the analytics SQL subset: the whitelist of sqlglot nodes, the checks
that walk a parsed tree against it, the nesting bound, and WHERE predicates.

:mod:`dpkit.analytics.sql` compiles whole SELECTs on top of this module (and documents the
subset). Parsing reads only the query text: no schema, no data.

>>> parse_predicate("age BETWEEN 18 AND 65")
Between(column='age', low=18, high=65, negated=False)
"""

from __future__ import annotations

import functools
import math
import re
from typing import Any

import sqlglot
from sqlglot import exp

from dpkit.analytics.limits import QueryLimits
from dpkit.analytics.plan import And, Between, Compare, CompareOp, InList, IsNull, Not, Or, Predicate
from dpkit.errors import InvalidParameterError, LimitExceededError

__all__ = ["parse_predicate", "query_depth"]


_SUBSET = (
    "SELECT <group columns and aggregates> FROM <table> [WHERE <condition>] [GROUP BY <column>, ...] (a group "
    "may be a numeric column's BIN(c, n) or BIN(c, e0, e1, ...), in SELECT and in GROUP BY or by its alias) with the "
    "aggregates COUNT(*), COUNT(DISTINCT <privacy unit>), SUM, AVG/MEAN, VARIANCE/VAR_POP/VAR_SAMP, "
    "STDDEV/STDDEV_POP/STDDEV_SAMP, MEDIAN, QUANTILE_CONT(c, q)/QUANTILE(c, q), "
    "PERCENTILE_CONT(q) WITHIN GROUP (ORDER BY c [DESC]) (see dpkit.analytics.sql)"
)
_BIN = (
    "BIN(<numeric column>, n) for n equal-width bins over the column's declared bounds (n a whole number >= 1), "
    "or BIN(<numeric column>, e0, e1, ...) for explicit edges (at least two increasing finite numbers), "
    "as a SELECT item (optionally AS alias) and as a GROUP BY item (the same BIN, or its alias)"
)
_CONDITION = (
    "a condition: <column> =, <>, <, <=, >, >= <literal>, <column> [NOT] IN (<literals>), "
    "<column> [NOT] BETWEEN <literal> AND <literal>, <column> IS [NOT] NULL, combined with AND, OR, NOT and parentheses"
)
_OPS: dict[type[exp.Expression], CompareOp] = {
    exp.EQ: "=",
    exp.NEQ: "!=",
    exp.GT: ">",
    exp.GTE: ">=",
    exp.LT: "<",
    exp.LTE: "<=",
}
_FLIP: dict[CompareOp, CompareOp] = {"=": "=", "!=": "!=", ">": "<", ">=": "<=", "<": ">", "<=": ">="}

# -- the whitelist -------------------------------------------------------------------------------
#
# Every node of an accepted tree has one of these exact types (subclasses are not accepted: they
# mean something else), and only the listed arguments may be non-empty (None, [], False and ""
# are empty). The compiler below interprets the tree, checking each node's *position* (an Order
# only inside WITHIN GROUP, a Star only in COUNT(*), ...) and reading every argument listed here;
# then the whole tree is walked against this list (see _backstop), so nothing the compiler did
# not read can pass, wherever it hides. sqlglot has spelled some keys with and without a trailing "_"
# ("from"/"from_"); both are listed where they are accepted.

_CONDITION_NODES: dict[type[exp.Expression], frozenset[str]] = {
    exp.Column: frozenset({"this"}),
    exp.Identifier: frozenset({"this", "quoted"}),
    exp.Literal: frozenset({"this", "is_string"}),
    exp.Boolean: frozenset({"this"}),
    exp.Null: frozenset(),
    exp.Neg: frozenset({"this"}),
    exp.Paren: frozenset({"this"}),
    exp.And: frozenset({"this", "expression"}),
    exp.Or: frozenset({"this", "expression"}),
    exp.Not: frozenset({"this"}),
    **{cls: frozenset({"this", "expression"}) for cls in _OPS},
    exp.In: frozenset({"this", "expressions"}),
    exp.Between: frozenset({"this", "low", "high"}),
    exp.Is: frozenset({"this", "expression"}),
}
_ON_COLUMN = frozenset({"this"})
_NODES: dict[type[exp.Expression], frozenset[str]] = {
    **_CONDITION_NODES,
    exp.Select: frozenset({"expressions", "from", "from_", "where", "group"}),
    exp.From: frozenset({"this"}),
    exp.Table: frozenset({"this"}),
    exp.Where: frozenset({"this"}),
    exp.Group: frozenset({"expressions"}),
    exp.Alias: frozenset({"this", "alias"}),
    exp.Star: frozenset(),
    exp.Distinct: frozenset({"expressions"}),
    exp.Count: frozenset({"this", "big_int"}),  # big_int: DuckDB's result type (BIGINT), nothing else
    exp.Sum: _ON_COLUMN,
    exp.Avg: _ON_COLUMN,
    exp.Variance: _ON_COLUMN,
    exp.VariancePop: _ON_COLUMN,
    exp.Stddev: _ON_COLUMN,
    exp.StddevPop: _ON_COLUMN,
    exp.StddevSamp: _ON_COLUMN,
    exp.Median: _ON_COLUMN,
    exp.Quantile: frozenset({"this", "quantile"}),
    exp.ApproxQuantile: frozenset({"this", "quantile"}),
    exp.PercentileCont: frozenset({"this", "expression"}),
    exp.WithinGroup: frozenset({"this", "expression"}),
    exp.Order: frozenset({"expressions"}),
    exp.Ordered: frozenset({"this", "desc", "nulls_first"}),
    exp.Anonymous: frozenset({"this", "expressions"}),  # MEAN(c), VAR_SAMP(c) when not parsed to a class
}

# Readable names for the clauses an argument key stands for (the key itself is shown otherwise).
_ARG_WORDS = {
    "with": "WITH (a CTE)",
    "with_": "WITH (a CTE)",
    "distinct": "DISTINCT",
    "into": "INTO",
    "joins": "a JOIN",
    "laterals": "LATERAL",
    "pivots": "PIVOT / UNPIVOT",
    "having": "HAVING",
    "qualify": "QUALIFY",
    "windows": "WINDOW",
    "order": "ORDER BY",
    "limit": "LIMIT",
    "offset": "OFFSET",
    "sample": "TABLESAMPLE / USING SAMPLE",
    "hint": "an optimizer hint",
    "hints": "a table hint",
    "version": "time travel (FOR ... AS OF)",
    "when": "time travel (AT / BEFORE)",
    "system_time": "time travel",
    "changes": "CHANGES",
    "alias": "a table alias (FROM t x, FROM t FINAL)",
    "db": "a qualified name (db.table: FROM takes the session's table name only)",
    "catalog": "a qualified name (catalog.db.table: FROM takes the session's table name only)",
    "table": "a table qualifier (t.column)",
    "only": "ONLY",
    "grouping_sets": "GROUPING SETS",
    "cube": "CUBE",
    "rollup": "ROLLUP",
    "all": "GROUP BY ALL",
    "totals": "WITH TOTALS",
    "except": "EXCLUDE",
    "except_": "EXCLUDE",
    "replace": "REPLACE",
    "rename": "RENAME",
    "ilike": "ILIKE",
    "on": "DISTINCT ON",
    "query": "a subquery",
    "unnest": "UNNEST",
    "symmetric": "BETWEEN SYMMETRIC",
    "with_fill": "WITH FILL",
    "kind": "SELECT AS STRUCT / VALUE",
    "locks": "a locking clause",
    "prewhere": "PREWHERE",
    "connect": "CONNECT BY",
    "match": "MATCH_RECOGNIZE",
    "negate": "IS NOT",
    "partition": "PARTITION",
    "settings": "SETTINGS",
    "format": "FORMAT",
    "options": "OPTION",
}
_CLASS_ARG_WORDS: dict[tuple[type[exp.Expression], str], str] = {
    (
        exp.Order,
        "this",
    ): "ORDER BY inside an aggregate (only PERCENTILE_CONT(q) WITHIN GROUP (ORDER BY c) takes an order)",
}
_CLASS_WORDS: dict[type, str] = {
    exp.Subquery: "a subquery (Subquery)",
    exp.Window: "a window function (Window, OVER)",
    exp.Union: "a set operation (UNION)",
    exp.Intersect: "a set operation (INTERSECT)",
    exp.Except: "a set operation (EXCEPT)",
    exp.Join: "a JOIN",
    exp.Cast: "a cast (Cast)",
    exp.TryCast: "a cast (TryCast)",
    exp.Filter: "FILTER (WHERE ...)",
    exp.Collate: "COLLATE",
    exp.Order: "ORDER BY inside an aggregate (Order)",
    exp.Values: "VALUES",
    exp.Unnest: "UNNEST",
    exp.Lateral: "LATERAL",
    exp.Placeholder: "a placeholder (bound parameters are not supported)",
}
if hasattr(exp, "WidthBucket"):  # sqlglot >= 25 spells it as its own class in recent versions only
    # WIDTH_BUCKET numbers its buckets 1..n, puts values outside [lo, hi) in buckets 0 and n + 1
    # and leaves the last bucket open: not dpkit's bins, whose labels are the intervals.
    _CLASS_WORDS[exp.WidthBucket] = (
        "WIDTH_BUCKET (not supported: use BIN(c, n) for n equal-width bins over the declared bounds, "
        "or BIN(c, e0, e1, ...) for explicit edges)"
    )


def _sql(node: object) -> str:
    """The fragment to show (the analyst's own text, so it may be echoed), at most 200 characters."""
    try:
        if isinstance(node, list):
            text = ", ".join(_sql(x) for x in node)
        elif isinstance(node, exp.Expression):
            text = node.sql()  # the default dialect: DuckDB's generator rewrites some clauses
        else:
            text = str(node)
    except Exception:  # noqa: BLE001 - rendering is best effort, the refusal is what matters
        text = type(node).__name__
    return text[:200]


def _reject(what: str, node: Any, accepted: str = _SUBSET) -> InvalidParameterError:
    return InvalidParameterError("sql", _sql(node), accepted, what)


def _empty(value: object) -> bool:
    return value is None or value is False or (isinstance(value, (list, str)) and not value)


def _check_node(
    node: exp.Expression, nodes: dict[type[exp.Expression], frozenset[str]], accepted: str
) -> list[exp.Expression]:
    """Refuse the node if its type, or the key of any of its non-empty arguments, is not
    whitelisted; its child nodes otherwise."""
    allowed = nodes.get(type(node))
    if allowed is None:
        raise _reject(f"{_what(node)} is not accepted here", node, accepted)
    children: list[exp.Expression] = []
    for key, value in node.args.items():
        if _empty(value):
            continue
        if key not in allowed:
            shown = value if isinstance(value, exp.Expression) or (isinstance(value, list) and value) else node
            what = _CLASS_ARG_WORDS.get((type(node), key)) or _ARG_WORDS.get(key, repr(key))
            raise _reject(f"{what} is not accepted ({type(node).__name__}.{key})", shown, accepted)
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, exp.Expression):
                children.append(item)
            elif not isinstance(item, (str, bool)):
                raise _reject(f"an unexpected {type(item).__name__} in {type(node).__name__}.{key}", node, accepted)
    return children


def _check_tree(tree: exp.Expression, nodes: dict[type[exp.Expression], frozenset[str]], accepted: str) -> None:
    """Walk every node of the tree (pre-order, left to right) through :func:`_check_node`."""
    stack: list[exp.Expression] = [tree]
    while stack:
        stack.extend(reversed(_check_node(stack.pop(), nodes, accepted)))


def _check_comments(text: str, what: str) -> None:
    """Plain comments are ignored (as in SQL); optimizer-hint comments are refused, not ignored."""
    try:
        tokens = sqlglot.tokenize(text, read="duckdb")
    except sqlglot.errors.SqlglotError as exc:
        raise InvalidParameterError(
            what, text[:200], "valid SQL of the documented subset", f"it does not parse: {str(exc).splitlines()[0]}"
        ) from None
    for token in tokens:
        if token.token_type.name == "HINT":
            raise InvalidParameterError(
                what, text[:200], "SQL without optimizer hints", "an optimizer hint (/*+ ... */) would be ignored"
            )
        for comment in token.comments:
            # a block comment opening with + (optimizer hint) or ! (MySQL's executable comment)
            if comment.startswith(("+", "!")) and "/*" + comment in text:
                raise InvalidParameterError(
                    what,
                    f"/*{comment}*/"[:200],
                    "SQL without optimizer hints (plain comments are fine)",
                    "a hint comment (/*+ ... */, /*! ... */) would be ignored",
                )


# What the nesting scan reads: string literals, quoted identifiers and comments are skipped
# whole (to the end of the text when unterminated, so every alternative matches where it starts
# and the scan stays linear); brackets and the boolean keywords are counted.
_NESTING = re.compile(
    r"'(?:[^']|'')*'?"
    r'|"(?:[^"]|"")*"?'
    r"|--[^\n]*"
    r"|/\*(?:.*?\*/|.*)"
    r"|[(\[{]|[)\]}]"
    r"|\b(?:and|or|not)\b",
    re.IGNORECASE | re.DOTALL,
)


def query_depth(text: str) -> int:
    """How deeply ``text`` nests, in one linear pass without parsing: each open parenthesis
    (or bracket) is a level, and each AND, OR and NOT adds one to the level it is in — a bound on
    the depth of the condition tree the parser builds.

    >>> query_depth("a > 1"), query_depth("a > 1 AND (b < 2 OR NOT c = 3)"), query_depth("((((a))))")
    (1, 5, 5)
    """
    levels = [1]
    depth = deepest = 1
    for match in _NESTING.finditer(text):
        token = match.group()
        first = token[0]
        if first in "'\"" or token.startswith(("--", "/*")):
            continue
        if first in "([{":
            levels.append(1)
            depth += 1
        elif first in ")]}":
            if len(levels) > 1:  # an unbalanced ")" is the parser's to refuse
                depth -= levels.pop()
        else:
            levels[-1] += 1
            depth += 1
        deepest = max(deepest, depth)
    return deepest


def _too_deep(what: str, limits: QueryLimits) -> LimitExceededError:
    return LimitExceededError(
        f"{what} nesting depth", "more than the parser can follow", limits.max_query_depth, "max_query_depth"
    )


def _parse(text: object, what: str, limits: QueryLimits) -> exp.Expression:
    if not isinstance(text, str) or not text.strip():
        raise InvalidParameterError(what, text, "non-empty SQL text")
    # Before the tokenizer and the parser, which recurse per level: deep text is refused here,
    # in time linear in its length.
    limits.check(f"{what} nesting depth", query_depth(text), "max_query_depth")
    _check_comments(text, what)
    return _parsed(text, what).copy()  # the compiler may annotate its tree: each caller gets its own


@functools.lru_cache(maxsize=512)
def _parsed(text: str, what: str) -> exp.Expression:
    """The one statement of ``text`` (cached by text: analysts repeat their queries, and parsing
    costs more than the rest of compiling; nothing here depends on a session or on data)."""
    try:
        parsed = sqlglot.parse(text, read="duckdb")
    except sqlglot.errors.SqlglotError as exc:
        raise InvalidParameterError(
            what, text[:200], "valid SQL of the documented subset", f"it does not parse: {str(exc).splitlines()[0]}"
        ) from None
    trees = [t for t in parsed if isinstance(t, exp.Expression)]  # every node is one; None is not
    if len(trees) != 1:
        raise InvalidParameterError(what, text[:200], "exactly one statement")
    return trees[0]


def _what(node: object) -> str:
    """What a node is, in words, for a refusal."""
    if isinstance(node, exp.Column) and node.args.get("table"):
        return "a column with a table qualifier (t.column)"
    if isinstance(node, exp.Column):
        return "a column"
    if isinstance(node, (exp.Literal, exp.Boolean)):
        return "a literal"
    return _CLASS_WORDS.get(type(node), type(node).__name__)


#: The key of a node's ``meta`` under which a qualified column reference (``r.region``) carries
#: its name in the joined table, once :mod:`dpkit.analytics.sql_joins` has resolved the qualifier.
JOINED = "dpkit.joined_column"


def _column_name(node: exp.Expression) -> str:
    if isinstance(node, exp.Column) and node.args.get("table") is not None and JOINED in node.meta:
        return str(node.meta[JOINED])
    if not isinstance(node, exp.Column) or node.args.get("table") or not isinstance(node.this, exp.Identifier):
        raise _reject(f"only plain column names are accepted here, not {_what(node)}{_hyphen_hint(node)}", node)
    return node.name


def _hyphen_hint(node: exp.Expression) -> str:
    """A hint for ``hours-per-week`` written without quotes, which SQL reads as a subtraction of
    three columns (the hint is built from the query text alone)."""
    parts: list[str] = []
    todo: list[exp.Expression] = [node]
    while todo:
        n = todo.pop()
        if isinstance(n, exp.Sub):
            todo += [n.expression, n.this]  # left first, so the names come out in order
        elif isinstance(n, exp.Column) and not n.args.get("table") and isinstance(n.this, exp.Identifier):
            parts.append(n.name)
        else:
            return ""
    if len(parts) < 2:
        return ""
    return f' (a minus sign: a name with hyphens must be double-quoted, as in "{"-".join(parts)}")'


def _literal(node: exp.Expression) -> Any:
    if isinstance(node, exp.Paren):
        return _literal(node.this)
    if isinstance(node, exp.Neg) and isinstance(node.this, exp.Literal) and not node.this.is_string:
        return -_literal(node.this)
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
                value = float(text)
            except ValueError:
                raise _reject("not a number", node) from None
            if not math.isfinite(value):
                raise _reject("a number literal must be finite", node) from None
            return value
    raise _reject(
        f"only literals (numbers, strings, TRUE/FALSE) are accepted on this side of a comparison, not {_what(node)}",
        node,
    )


# -- BIN(c, n) and BIN(c, e0, e1, ...) -----------------------------------------------------------
#
# dpkit's binned group key, with exactly what Query.group_by(bins=) accepts: a number of equal-
# width bins over the column's declared bounds, or explicit edges. (DuckDB's own bin(x) is a
# binary string; the SQL text never reaches an engine, so the name is free here.)


def _is_bin(node: object) -> bool:
    """Whether ``node`` is a call of BIN (any case)."""
    return type(node) is exp.Anonymous and node.name.lower() == "bin"


def _bin_number(call: exp.Expression, node: exp.Expression) -> int | float:
    try:
        value = _literal(node)
    except InvalidParameterError:
        value = None
    if value is None or isinstance(value, (bool, str)):
        raise _reject(f"BIN takes finite number literals after its column, not {_sql(node)}", call, _BIN)
    return value


def _bin_parts(call: exp.Expression) -> tuple[exp.Expression, int | tuple[float, ...]]:
    """The column node of ``BIN(c, ...)`` and its bins as ``group_by(bins=)`` takes them: a
    number of bins (an int), or the edges (floats, as the service's JSON reads them)."""
    args = call.expressions
    if len(args) < 2:
        raise _reject("BIN takes a column, then a number of bins or at least two edges", call, _BIN)
    values = [_bin_number(call, x) for x in args[1:]]
    if len(values) == 1:
        n = values[0]
        if not isinstance(n, int) or n < 1:
            raise _reject(f"the number of bins is a whole number >= 1, not {n!r}", call, _BIN)
        return args[0], n
    edges = []
    for x in values:
        try:
            edges.append(float(x))
        except OverflowError:  # an integer beyond the doubles
            raise _reject(f"a bin edge must be a finite number, not {x!r}", call, _BIN) from None
    if any(b <= a for a, b in zip(edges, edges[1:], strict=False)):
        raise _reject(f"the edges must be increasing, not {', '.join(f'{e:g}' for e in edges)}", call, _BIN)
    return args[0], tuple(edges)


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
                return Compare(_column_name(left), op, _literal(right))
            if isinstance(right, exp.Column):
                return Compare(_column_name(right), _FLIP[op], _literal(left))
            raise _reject(
                f"a comparison needs a column on one side and a literal on the other, not {_what(left)} and {_what(right)}",
                node,
            )
    if isinstance(node, exp.In):
        return _in(node, negated=False)
    if isinstance(node, exp.Between):
        return _between(node, negated=False)
    if isinstance(node, exp.Is):
        return _is_null(node, negated=False)
    raise _reject(f"{type(node).__name__} is not accepted as a condition ({_what(node)})", node, _CONDITION)


def _in(node: exp.In, *, negated: bool) -> Predicate:
    for key in ("query", "unnest", "field"):
        if node.args.get(key) is not None:
            raise _reject(f"IN takes a list of literals, not {_what(node.args[key])}", node)
    if not node.expressions:
        raise _reject("IN takes a list of literals", node)
    return InList(_column_name(node.this), tuple(_literal(x) for x in node.expressions), negated)


def _between(node: exp.Between, *, negated: bool) -> Predicate:
    return Between(_column_name(node.this), _literal(node.args["low"]), _literal(node.args["high"]), negated)


def _is_null(node: exp.Is, *, negated: bool) -> Predicate:
    if not isinstance(node.expression, exp.Null):
        raise _reject("IS takes NULL or NOT NULL only", node)
    return IsNull(_column_name(node.this), negated)


def _backstop(
    tree: exp.Expression, nodes: dict[type[exp.Expression], frozenset[str]], accepted: str, interpret: Any
) -> Any:
    """Interpret the tree (which refuses with messages specific to each position), then walk the
    whole tree against the whitelist (which refuses whatever the interpretation did not read).
    Both run before anything is executed; a shape the interpretation did not expect is refused
    by the walk rather than surfacing as an internal error."""
    try:
        result = interpret()
    except InvalidParameterError:
        raise
    except Exception:
        _check_tree(tree, nodes, accepted)
        raise
    _check_tree(tree, nodes, accepted)
    return result


def _limits(limits: object) -> QueryLimits:
    if limits is None:
        return QueryLimits()
    if not isinstance(limits, QueryLimits):
        raise InvalidParameterError(
            "limits", type(limits).__name__, "a dpkit.analytics.QueryLimits or None (the defaults)"
        )
    return limits


def _qualified_as_names(node: exp.Expression) -> exp.Expression:
    """``t.c`` as the one column named ``"t.c"`` (a joined table's qualified name)."""
    table = node.args.get("table") if isinstance(node, exp.Column) else None
    if isinstance(table, exp.Identifier) and isinstance(node.this, exp.Identifier) and not node.args.get("db"):
        return exp.column(exp.to_identifier(f"{table.name}.{node.name}", quoted=True))
    return node


def parse_predicate(text: str, *, limits: QueryLimits | None = None, qualified: bool = False) -> Predicate:
    """A row filter from SQL text (the WHERE clause's grammar above). ``limits``: whose
    ``max_query_depth`` bounds the text's nesting (default ``QueryLimits()``; a session passes
    its own when given text in :meth:`Query.where`). ``qualified``: ``t.c`` names the joined
    table's column ``"t.c"`` (a query over several tables)."""
    limits = _limits(limits)
    try:
        tree = _parse(text, "where", limits)
        if qualified:
            tree = tree.transform(_qualified_as_names)
        return _backstop(tree, _CONDITION_NODES, _CONDITION, lambda: _predicate(tree))
    except RecursionError:
        raise _too_deep("where", limits) from None
