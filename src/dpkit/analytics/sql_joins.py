"""The FROM clause of private SQL over a dataset of several tables: tables, aliases and joins.

:mod:`dpkit.analytics.sql` documents the accepted syntax; this module reads it. Given a parsed
SELECT on a session over several tables it

* resolves ``FROM t [[AS] a] {[INNER] JOIN | LEFT [OUTER] JOIN} t2 [[AS] b] ON ... | USING (...)``
  to the query's table and its :class:`~dpkit.analytics.spec.Join` s, refusing every other shape
  (comma, CROSS, NATURAL, RIGHT, FULL, SEMI/ANTI, ASOF and POSITIONAL joins; an ON that is not
  AND-ed equalities of two columns of two different tables; aliases that shadow a table or
  repeat; a table read twice) with :class:`~dpkit.errors.InvalidParameterError` (parameter ``sql``);
* has :func:`dpkit.analytics.joins.join_table` decide which joins are allowed and declare the
  joined table (its refusals — two private tables joined on anything but their units, a public
  table without ``max_matches``, a type mismatch — pass through unchanged);
* resolves every qualified column reference of the SELECT (``r.region``) to its name in the
  joined table, the name the builder's ``group_by`` / ``where`` / aggregates take: the bare
  column when the joined table's bare name is that very column, else ``table.column`` (so
  ``r.region`` is ``region`` and, beside ``visits.postcode``, ``r.postcode`` is
  ``regions.postcode``).

Nothing here reads data: the decisions use the query text and the declared metadata (and, for a
public table's categories, its public values, as the builder's ``join`` does).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlglot import exp

from dpkit.analytics.declared import DeclaredTable, undeclared_column
from dpkit.analytics.plan import JoinPlan
from dpkit.analytics.spec import Join, JoinHow
from dpkit.analytics.sql_parse import _NODES, JOINED, _check_node, _reject, _sql, _what
from dpkit.errors import InvalidParameterError

__all__ = ["FromClause", "JOIN_NODES", "compile_from"]

_JOIN_SUBSET = (
    "FROM <table> [[AS] alias] followed by any number of [INNER] JOIN or LEFT [OUTER] JOIN <table> [[AS] alias] "
    "ON a.x = b.y [AND a.z = b.w ...] or USING (x, ...), over the tables of the session's dataset "
    "(see dpkit.analytics.sql)"
)
#: (side, kind) of the accepted joins.
_HOWS: dict[tuple[str, str], JoinHow] = {
    ("", ""): "inner",
    ("", "INNER"): "inner",
    ("LEFT", ""): "left",
    ("LEFT", "OUTER"): "left",
}
_ON = "ON <equalities of two columns of two different tables, joined by AND>: ON a.x = b.y [AND a.z = b.w ...]"

#: The whitelist of :mod:`dpkit.analytics.sql_parse` with the FROM clause of several tables:
#: joins, table aliases and qualified column references (each one resolved by
#: :func:`compile_from` before the walk, so none passes unread).
JOIN_NODES: dict[type[exp.Expression], frozenset[str]] = {
    **_NODES,
    exp.Select: _NODES[exp.Select] | {"joins"},
    exp.Table: frozenset({"this", "alias"}),
    exp.TableAlias: frozenset({"this"}),
    exp.Column: frozenset({"this", "table"}),
    exp.Join: frozenset({"this", "on", "using", "side", "kind"}),
}


@dataclass(frozen=True)
class FromClause:
    """What a FROM clause reads: the spec's ``table`` and ``joins`` (the private table first:
    ``FROM regions JOIN visits`` reads visits, as :func:`~dpkit.analytics.joins.join_table`
    swaps it), and the declared facts of the (joined) table the rest of the query is checked
    against."""

    table: str
    joins: tuple[Join, ...]
    facts: DeclaredTable


@dataclass(frozen=True)
class _Ref:
    """One table of the query: its dataset name, and the name the query calls it by (its alias,
    else its name)."""

    table: str
    visible: str


def compile_from(tables: Any, tree: exp.Select) -> FromClause:
    """Resolve the FROM clause of ``tree`` on a session's :class:`~dpkit.analytics.session_tables.
    TableSet`, and annotate the SELECT's qualified columns with their joined names."""
    source = tree.args.get("from") or tree.args.get("from_")
    if source is None:
        raise _reject("FROM <table> is required", tree, _JOIN_SUBSET)
    joins: list[exp.Join] = list(tree.args.get("joins") or [])
    refs = [_table(tables, source.this, source, [])]
    hows: list[JoinHow] = []
    for j in joins:
        hows.append(_how(j))
        _check_node(j, JOIN_NODES, _JOIN_SUBSET)  # hints, MATCH_CONDITION, ...
        refs.append(_table(tables, j.this, j, refs))
    specs = tuple(_join(tables, j, hows[i], refs[: i + 2]) for i, j in enumerate(joins))
    base = refs[0].table
    facts: DeclaredTable = tables.joined(base, specs) if specs else tables.declared(base)
    if facts.join is not None:
        base, specs = _from_plan(facts.join)
    names = _joined_names(facts)
    skip = {id(c) for j in joins for c in j.find_all(exp.Column)}  # ON columns: read above
    for column in list(tree.find_all(exp.Column)):
        if column.args.get("table") is not None and id(column) not in skip and column.find_ancestor(exp.Select) is tree:
            column.meta[JOINED] = _qualified(tables, column, refs, names, facts)
    return FromClause(base, specs, facts)


def _table(tables: Any, node: exp.Expression, clause: exp.Expression, earlier: list[_Ref]) -> _Ref:
    """One table of the FROM clause: a dataset table's name, with an optional plain alias."""
    if not isinstance(node, exp.Table) or not isinstance(node.this, exp.Identifier):
        what = "a table function" if isinstance(node, exp.Table) else _what(node)
        raise _reject(
            f"FROM and JOIN take tables of the dataset, not {what} (no subqueries, LATERAL, UNNEST or table functions)",
            clause,
            _JOIN_SUBSET,
        )
    if node.args.get("joins"):
        raise _reject(
            "nested (parenthesised) joins are not accepted: join the tables one after another", clause, _JOIN_SUBSET
        )
    _check_node(node, JOIN_NODES, _JOIN_SUBSET)  # db.table, TABLESAMPLE, PIVOT, time travel, hints, ONLY, ...
    name = _find(tables.dataset.tables, node.name)
    if name is None:
        raise InvalidParameterError(
            "sql", _sql(node), "a table of the dataset: " + ", ".join(map(repr, tables.dataset.tables))
        )
    alias_node = node.args.get("alias")
    if alias_node is not None and alias_node.args.get("columns"):
        raise _reject(
            "column aliases (t AS a(x, y)) are not accepted: name the columns as declared", clause, _JOIN_SUBSET
        )
    if alias_node is not None:
        _check_node(alias_node, JOIN_NODES, _JOIN_SUBSET)
    alias = node.alias or None
    if alias is not None and any(not ch.isprintable() for ch in alias):
        raise _reject("an alias is a non-empty name without control characters", clause, _JOIN_SUBSET)
    for ref in earlier:
        if ref.table == name:
            raise _reject(
                f"the table {name!r} is read twice: each table can be read once in a query", clause, _JOIN_SUBSET
            )
    if alias is not None:
        shadowed = [t for t in tables.dataset.tables if t.casefold() == alias.casefold() and t != name]
        if shadowed:
            raise _reject(
                f"the alias {alias!r} of {name!r} is the name of another table of the dataset ({shadowed[0]!r}): "
                "choose another alias",
                clause,
                _JOIN_SUBSET,
            )
    visible = alias if alias is not None else name
    for ref in earlier:
        if ref.visible.casefold() == visible.casefold():
            raise _reject(
                f"two tables are called {visible!r} ({ref.table!r} and {name!r}): give them different aliases",
                clause,
                _JOIN_SUBSET,
            )
    return _Ref(name, visible)


def _how(j: exp.Join) -> JoinHow:
    method, side, kind = (str(j.args.get(k) or "").upper() for k in ("method", "side", "kind"))
    if method:
        why = (
            "NATURAL JOIN joins on every column the tables happen to share: name the join columns with USING (...) or ON"
            if method == "NATURAL"
            else f"{method} JOIN is not accepted"
        )
        raise _reject(why, j, _JOIN_SUBSET)
    if kind == "CROSS" or (not j.args.get("on") and not j.args.get("using")):
        what = "CROSS JOIN" if kind == "CROSS" else "a comma join (FROM a, b) or a JOIN without ON / USING"
        raise _reject(
            f"{what} is a cross join: it pairs every row with every row, so one person's rows multiply without bound; "
            "join on equal columns with ON or USING",
            j,
            _JOIN_SUBSET,
        )
    how = _HOWS.get((side, kind))
    if how is not None:
        return how
    shown = " ".join(x for x in (side, kind) if x) + " JOIN"
    why = (
        " (a RIGHT or FULL join keeps the joined table's unmatched rows: write it as a LEFT JOIN from the private table)"
        if side in ("RIGHT", "FULL")
        else ""
    )
    raise _reject(f"{shown} is not accepted: only [INNER] JOIN and LEFT [OUTER] JOIN{why}", j, _JOIN_SUBSET)


def _join(tables: Any, j: exp.Join, how: JoinHow, refs: list[_Ref]) -> Join:
    """The :class:`Join` of ``j``, whose table is ``refs[-1]`` (the earlier ones are to its left)."""
    right = refs[-1]
    if j.args.get("using"):
        return Join(right.table, tuple(_using(tables, j, item, refs) for item in j.args["using"]), how)
    pairs: list[tuple[str, str]] = []
    todo: list[exp.Expression] = [j.args["on"]]
    while todo:
        node = todo.pop()
        if isinstance(node, exp.Paren):
            todo.append(node.this)
        elif isinstance(node, exp.And):
            todo += [node.expression, node.this]  # left first: the pairs keep the text's order
        elif type(node) is exp.EQ:
            pairs.append(_equality(tables, j, node, refs))
        else:
            raise _reject(
                f"ON takes equalities of two columns joined by AND, not {_what(node)} ({_sql(node)[:60]})", j, _ON
            )
    return Join(right.table, tuple(pairs), how)


def _equality(tables: Any, j: exp.Join, node: exp.EQ, refs: list[_Ref]) -> tuple[str, str]:
    """``a.x = b.y`` as (``table.x`` of an earlier table, ``y`` of the joined table)."""
    sides = []
    for side in (node.this, node.expression):
        while isinstance(side, exp.Paren):
            side = side.this
        if not isinstance(side, exp.Column):
            raise _reject(f"{_sql(node)}: ON compares two columns, not {_what(side)}", j, _ON)
        sides.append(_on_column(tables, j, side, refs))
    (li, lc), (ri, rc) = sides
    last = len(refs) - 1
    if li == ri:
        raise _reject(
            f"{_sql(node)}: both columns are of {refs[li].visible!r}; ON compares two tables' columns", j, _ON
        )
    if last not in (li, ri):
        raise _reject(
            f"{_sql(node)}: one side of each equality is a column of the table this JOIN adds ({refs[last].visible!r})",
            j,
            _ON,
        )
    if li == last:
        (li, lc), (ri, rc) = (ri, rc), (li, lc)
    return f"{refs[li].table}.{lc}", rc


def _on_column(tables: Any, j: exp.Join, column: exp.Column, refs: list[_Ref]) -> tuple[int, str]:
    """The table (index in ``refs``) and declared column an ON operand names."""
    if not isinstance(column.this, exp.Identifier) or column.args.get("db") or column.args.get("catalog"):
        raise _reject(f"{_sql(column)}: ON takes columns (a.x or x)", j, _ON)
    if column.args.get("table") is not None:
        i = _visible(column, refs)
        return i, _declared_column(tables, column, refs[i])
    hits = [(i, c) for i, r in enumerate(refs) if (c := _find(tables.facts[r.table].columns, column.name)) is not None]
    if len(hits) == 1:
        return hits[0]
    if not hits:
        raise undeclared_column(
            "sql", column.name, [f"{r.visible}.{c}" for r in refs for c in tables.facts[r.table].columns]
        )
    raise _reject(
        f"the column {column.name!r} is in several tables of the join ("
        + ", ".join(f"{refs[i].visible}.{c}" for i, c in hits)
        + "): qualify it",
        j,
        _ON,
    )


def _using(tables: Any, j: exp.Join, item: exp.Expression, refs: list[_Ref]) -> tuple[str, str]:
    """``USING (x)``: ``x`` of the joined table, equal to ``x`` of the one earlier table that has it."""
    if isinstance(item, exp.Column) and not item.args.get("table"):
        item = item.this
    if not isinstance(item, exp.Identifier):
        raise _reject(f"USING takes column names, not {_what(item)}", j, _JOIN_SUBSET)
    right = refs[-1]
    rc = _find(tables.facts[right.table].columns, item.name)
    if rc is None:
        raise undeclared_column(
            "sql", f"{right.visible}.{item.name}", [f"{right.visible}.{c}" for c in tables.facts[right.table].columns]
        )
    hits = [(r, c) for r in refs[:-1] if (c := _find(tables.facts[r.table].columns, item.name)) is not None]
    if len(hits) != 1:
        where = ", ".join(f"{r.visible}.{c}" for r, c in hits) or "none of the tables before it"
        raise _reject(
            f"USING ({item.name}) needs the column in exactly one table before the JOIN ({where}): "
            "write ON a.x = b.x instead",
            j,
            _JOIN_SUBSET,
        )
    r, lc = hits[0]
    return f"{r.table}.{lc}", rc


def _visible(column: exp.Column, refs: list[_Ref]) -> int:
    """The index of the table a column's qualifier names (the alias of an aliased table, else its
    name; compared case-insensitively, as DuckDB does)."""
    qualifier = column.table
    for i, r in enumerate(refs):
        if r.visible.casefold() == qualifier.casefold():
            return i
    named = [r for r in refs if r.table.casefold() == qualifier.casefold()]
    why = (
        f"the table {named[0].table!r} is called {named[0].visible!r} in this query: write {named[0].visible}.{column.name}"
        if named
        else f"{qualifier!r} is not a table or alias of the query at this point ("
        + ", ".join(r.visible if r.visible == r.table else f"{r.visible} = {r.table}" for r in refs)
        + ")"
    )
    raise InvalidParameterError("sql", _sql(column), "a column qualified by a table (or alias) of the query", why)


def _find(columns: Any, name: str) -> str | None:
    """The declared spelling of ``name`` among ``columns`` (exact, else the one case-insensitive match)."""
    if name in columns:
        return name
    matches = [c for c in columns if c.casefold() == name.casefold()]
    return matches[0] if len(matches) == 1 else None


def _declared_column(tables: Any, column: exp.Column, ref: _Ref) -> str:
    found = _find(tables.facts[ref.table].columns, column.name)
    if found is None:
        raise undeclared_column(
            "sql", f"{ref.visible}.{column.name}", [f"{ref.visible}.{c}" for c in tables.facts[ref.table].columns]
        )
    return found


def _from_plan(plan: JoinPlan) -> tuple[str, tuple[Join, ...]]:
    """The table and joins the joined table was built from, private table first (the core reads
    ``FROM regions JOIN visits`` as ``FROM visits JOIN regions``; the spec says so)."""
    sources = plan.sources
    return sources[0].table, tuple(
        Join(s.source.table, tuple((f"{sources[i].table}.{lc}", rc) for i, lc, rc in s.on), s.how) for s in plan.steps
    )


def _joined_names(facts: DeclaredTable) -> dict[str, dict[str, str]]:
    """Table → its declared column → that column's name in the joined table (the bare name when it
    is this column's, else ``table.column``)."""
    if facts.join is None:
        return {facts.table: {c: c for c in facts.columns}}
    out: dict[str, dict[str, str]] = {}
    for s in facts.join.sources:
        names = out.setdefault(s.table, {})
        for column, joined in s.columns:
            if column not in names or joined == column:
                names[column] = joined
    return out


def _qualified(
    tables: Any, column: exp.Column, refs: list[_Ref], names: dict[str, dict[str, str]], facts: DeclaredTable
) -> str:
    """The joined table's name for a qualified column of the SELECT, WHERE or GROUP BY."""
    if isinstance(column.this, exp.Star):
        raise _reject(f"SELECT {_sql(column)} would read rows: select aggregates", column)
    if not isinstance(column.this, exp.Identifier) or column.args.get("db") or column.args.get("catalog"):
        raise _reject(f"a column is <column> or <table or alias>.<column>, not {_sql(column)}", column)
    ref = refs[_visible(column, refs)]
    table_names = names.get(ref.table, {})
    found = _find(table_names, column.name)
    if found is not None:
        return table_names[found]
    own = _declared_column(tables, column, ref)  # refuses a column the table does not declare
    # declared but not in the joined rows: the privacy unit of a table joined to the one read
    raise InvalidParameterError(
        "sql",
        _sql(column),
        "a column of the joined tables: " + ", ".join(f"{ref.visible}.{c}" for c in table_names),
        f"{own!r} is the privacy unit of {ref.table!r}; the joined rows carry the unit of the table read"
        + (f" ({facts.unit!r})" if facts.unit is not None else ""),
    )
