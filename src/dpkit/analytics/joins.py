"""Queries over several tables: which joins are allowed, the joined table they read, and the most
rows one person can have in it — decided from the declared metadata alone, before anything is paid.

A query reads one private table (``FROM visits``) and may join others of its dataset
(:class:`~dpkit.analytics.DatasetMetadata`):

* **a public table**, on declared columns of the same declared type (inner or left). Its rows per
  join-key value are bounded by its ``max_matches``, and the bound is enforced: before the join
  the engine keeps at most that many rows per key (chosen by a keyed hash; the table is public, so
  which rows is no secret). So one private row becomes at most ``max_matches`` joined rows.
* **another private table, on the privacy unit** (inner or left) — the two units are the same
  person's. Each side is truncated first: at most ``join_rows`` rows per unit, chosen by a keyed
  hash of the row itself (as contribution bounding chooses), so a unit's joined rows are at most
  ``join_rows(left) · join_rows(right)``. This is Tumult Analytics' rule for ``join_private``
  with ``TruncationStrategy.DropExcess`` (its documentation: the join's stability is the product
  of the truncation thresholds — each of a person's kept left rows meets at most the kept right
  rows of the same person). Adding a person adds that person's truncated rows to either table, so
  the joined table gains at most the product of rows, all of them that person's; the other units'
  truncations depend on their own rows only (the priority hashes a row's own columns), so they
  keep the same rows. A join of two private tables on any other column is refused: a person's
  row could then meet every other person's rows, and no bound on one person's influence holds.

Contribution bounds then apply to the *joined* rows, per unit, as for one table (``max_groups``
groups, ``max_rows`` rows per group, chosen by a keyed hash). :func:`join_table` also states
``max_unit_rows``, the product above: a bound on a unit's joined rows whatever the contribution
bounds (pricing takes the tighter of the two, :mod:`dpkit.analytics.pricing`). On a row-level
dataset each row is its own unit, nothing is capped after the join, and a row's joined rows are
bounded by the product of the public tables' ``max_matches`` alone: that is the price's
multiplier, and a public table without a declared ``max_matches`` cannot be joined.

Refused before anything is paid: a table that is not in the dataset or appears twice, a join
without an equality (a cross join), columns that are not declared or differ in declared type, two
private tables joined on anything but their units, a public table without ``max_matches``, a
private table without ``join_rows`` in a private join, a query that reads only public tables, and
a public table left-joined to a private one (its unmatched rows would be rows of nobody).

Group keys from a public table: a categorical column of a joined public table whose categories are
not declared takes the table's own distinct values as its public keys (every value, empty groups
included); ``group_by(..., keys_from="wards")`` takes the distinct rows of a public table as the
keys of a group-by over a private table's columns.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from dpkit._validate import short_repr as _short
from dpkit.analytics.dataset_metadata import DatasetMetadata
from dpkit.analytics.declared import ColumnKind, DeclaredTable, listed, undeclared_column
from dpkit.analytics.metadata import Categorical, ColumnSpec, Metadata
from dpkit.analytics.plan import JoinPlan, JoinSource, JoinStep
from dpkit.analytics.spec import Join
from dpkit.errors import Fix, InvalidParameterError

__all__ = ["join_table", "join_name", "PublicKeys"]

#: Reads the distinct rows of a public table over some of its declared columns (public data).
PublicKeys = Callable[[str, tuple[str, ...]], tuple[tuple[Any, ...], ...]]


def join_name(tables: Sequence[str]) -> str:
    """The joined table's name in descriptions: ``visits ⋈ regions``."""
    return " ⋈ ".join(tables)


@dataclass(frozen=True)
class _Source:
    index: int
    name: str
    facts: DeclaredTable  # the table's own declared facts (columns, kinds, unit)

    @property
    def meta(self) -> Metadata:
        return self.facts.metadata

    @property
    def public(self) -> bool:
        return self.meta.public

    def resolve(self, column: str) -> str | None:
        """The declared spelling of ``column`` in this table (exact, else the one
        case-insensitive match), or None."""
        if column in self.facts.columns:
            return column
        matches = [c for c in self.facts.columns if c.casefold() == column.casefold()]
        return matches[0] if len(matches) == 1 else None


def _undeclared(table: str, column: str, declared: Sequence[str]) -> InvalidParameterError:
    """A join column that ``table``'s metadata does not declare."""
    fix = Fix(
        "declare_column",
        f"tables.{table}.columns.{column} in the dataset's metadata",
        {"table": table, "column": column},
    )
    return InvalidParameterError(
        "on",
        f"{table}.{column}",
        f"a column declared in the metadata of {table!r} (declared: {listed(declared) or 'none'})",
        f"only declared columns can be joined on; declare it as {fix.text}",
        fix=fix,
    )


def _left_column(sources: Sequence[_Source], name: str) -> tuple[_Source, str]:
    """The column ``name`` of the tables joined so far: ``table.column``, or a bare name that
    exactly one of them declares."""
    if "." in name:
        table, column = name.split(".", 1)
        for s in sources:
            if s.name.casefold() == table.casefold():
                found = s.resolve(column)
                if found is None:
                    raise _undeclared(s.name, column, list(s.facts.columns))
                return s, found
    hits = [(s, c) for s in sources if (c := s.resolve(name)) is not None]
    if len(hits) == 1:
        return hits[0]
    names = [f"{s.name}.{c}" for s in sources for c in s.facts.columns]
    if not hits:
        if len(sources) == 1:
            raise _undeclared(sources[0].name, name, list(sources[0].facts.columns))
        raise undeclared_column("on", name, names)
    raise InvalidParameterError(
        "on", name, "a column of one joined table: qualify it (" + ", ".join(f"{s.name}.{c}" for s, c in hits) + ")"
    )


def _right_column(source: _Source, name: str) -> str:
    column = name.split(".", 1)[1] if name.casefold().startswith(source.name.casefold() + ".") else name
    found = source.resolve(column)
    if found is None:
        raise _undeclared(source.name, column, list(source.facts.columns))
    return found


def _read_type(s: _Source, column: str) -> str:
    return "unit" if s.facts.columns[column] == "unit" else s.meta.read_type(column)


def _check_pair(left: _Source, lc: str, right: _Source, rc: str) -> bool:
    """Check one equality of a join; True when it is the privacy-unit pair of two private tables."""
    units = (left.facts.unit == lc and not left.public, right.facts.unit == rc and not right.public)
    if not left.public and not right.public:
        if all(units):
            return True
        raise InvalidParameterError(
            "on",
            f"{left.name}.{lc} = {right.name}.{rc}",
            f"the privacy units of two private tables ({left.name}.{left.facts.unit} = {right.name}.{right.facts.unit})",
            "a join of two private tables on any other column lets one person's row meet every other person's rows, "
            "and no bound on one person's influence holds",
        )
    lt, rt = _read_type(left, lc), _read_type(right, rc)
    if "unit" in (lt, rt) or lt != rt:
        raise InvalidParameterError(
            "on",
            f"{left.name}.{lc} = {right.name}.{rc}",
            "two declared columns of the same declared type",
            f"{left.name}.{lc} is read as {lt} and {right.name}.{rc} as {rt}",
        )
    return False


def join_table(
    dataset: DatasetMetadata,
    facts: Mapping[str, DeclaredTable],
    base: str,
    joins: Sequence[Join],
    *,
    public_keys: PublicKeys | None = None,
) -> DeclaredTable:
    """The declared facts of ``base`` joined by ``joins``: its columns (``table.column``, and the
    bare name where only one table has it), privacy unit, public keys, ``max_unit_rows`` and the
    engine's :class:`~dpkit.analytics.plan.JoinPlan`. ``facts`` holds each table's own declared
    facts (the session's). Reads no data but public tables' values (through ``public_keys``)."""
    name = dataset.table(base, "from")
    joins = list(joins)
    if dataset.tables[name].public and joins and joins[0].how == "inner":
        # an inner join is symmetric: read the private table first (FROM regions JOIN visits ...)
        first = joins[0]
        other = dataset.table(first.table, "join.table")
        if not dataset.tables[other].public:
            flipped = tuple((f"{other}.{r.split('.', 1)[-1]}", left.split(".", 1)[-1]) for left, r in first.on)
            joins[0] = Join(name, flipped, "inner")
            name = other
    if dataset.tables[name].public:
        raise InvalidParameterError(
            "from",
            name,
            "a private table of the dataset (" + ", ".join(map(repr, dataset.private_tables)) + ")",
            "a public table's rows belong to nobody: read the private table and join the public one to it"
            + (" (a public table LEFT JOIN a private one is refused)" if joins else ""),
        )
    sources = [_Source(0, name, facts[name])]
    steps: list[tuple[Join, _Source, list[tuple[int, str, str]], bool]] = []
    for j in joins:
        table = dataset.table(j.table, "join.table")
        if any(s.name == table for s in sources):
            raise InvalidParameterError(
                "join.table", j.table, "a table not yet in the query", "each table can be read once in a query"
            )
        right = _Source(len(sources), table, facts[table])
        if not right.public and not dataset.unit_level:
            raise InvalidParameterError(
                "join.table",
                table,
                "a public table: the private tables of a row-level dataset have no privacy unit to join on",
            )
        on: list[tuple[int, str, str]] = []
        unit_pair = False
        for lname, rname in j.on:
            left, lc = _left_column(sources, lname)
            rc = _right_column(right, rname)
            unit_pair = _check_pair(left, lc, right, rc) or unit_pair
            on.append((left.index, lc, rc))
        if not right.public and not unit_pair:  # only equalities with public tables' columns
            raise InvalidParameterError(
                "on", _short(j.on), f"equalities that include the privacy units ({table}.{right.facts.unit} = ...)"
            )
        if right.public and right.meta.max_matches is None:
            fix = Fix(
                "declare_max_matches", f"max_matches in the metadata of the public table {table!r}", {"table": table}
            )
            raise InvalidParameterError(
                "join.table",
                table,
                f"a public table with a declared max_matches ({fix.text})",
                "the most rows sharing one join key multiplies a person's rows, so the price needs it "
                "(1 when the join columns are a key of the table)",
                fix=fix,
            )
        steps.append((j, right, on, unit_pair))
        sources.append(right)
    private = [s for s in sources if not s.public]
    if len(private) >= 2:
        for s in private:
            if s.meta.join_rows is None:
                fix = Fix("declare_join_rows", f"join_rows in the metadata of {s.name!r}", {"table": s.name})
                raise InvalidParameterError(
                    f"tables.{s.name}.join_rows",
                    None,
                    f"the rows per privacy unit a join keeps from {s.name!r} ({fix.text})",
                    "a join of two private tables is priced by the product of the rows each side keeps per unit",
                    fix=fix,
                )
    return _joined(dataset, sources, steps, public_keys)


def _joined(
    dataset: DatasetMetadata,
    sources: list[_Source],
    steps: list[tuple[Join, _Source, list[tuple[int, str, str]], bool]],
    public_keys: PublicKeys | None,
) -> DeclaredTable:
    base = sources[0]
    bt = base.facts
    truncate = sum(not s.public for s in sources) >= 2
    # joined names: table.column always, the bare name where it is one table's (a same-named
    # join pair's bare name is the left column's, as SQL's USING gives it)
    same_named: dict[str, tuple[int, str]] = {}
    for _, _right, on, _ in steps:
        for li, lc, rc in on:
            if lc == rc:
                same_named.setdefault(rc, (li, lc))
    owners: dict[str, list[int]] = {}
    for s in sources:
        for c, kind in s.facts.columns.items():
            if kind != "unit":
                owners.setdefault(c, []).append(s.index)
    columns: dict[str, ColumnSpec] = {}
    kinds: dict[str, ColumnKind] = {}
    mapping: list[list[tuple[str, str]]] = [[] for _ in sources]

    def add(s: _Source, column: str, out: str) -> None:
        mapping[s.index].append((column, out))
        kind = s.facts.columns[column]
        kinds[out] = kind
        if kind != "unit":
            spec = s.meta.columns[column]
            if s.public and isinstance(spec, Categorical) and spec.categories is None and public_keys is not None:
                spec = _public_categories(s, column, spec, public_keys, bt)
            columns[out] = spec

    for s in sources:
        for c, kind in s.facts.columns.items():
            if kind == "unit":
                continue
            add(s, c, f"{s.name}.{c}")
            if len(owners[c]) == 1 or same_named.get(c) == (s.index, c):
                add(s, c, c)
    # the joined table's unit is the base table's (equal to the other private tables' units in
    # an inner join; the non-null one in a left join): its bare name unless another table's
    # column has that name
    unit_name: str | None = None
    if bt.unit is not None:
        u = bt.unit
        if u in kinds and (u, u) in mapping[0]:
            unit_name = u
        elif u not in kinds:
            add(base, u, u)
            unit_name = u
        else:
            unit_name = f"{base.name}.{u}"
            if unit_name not in kinds:
                add(base, u, unit_name)
    plan_sources = []
    for s in sources:
        hashed = tuple(c for c in s.facts.columns)
        keep: int | None = None
        partition: tuple[str, ...] = ()
        if s.public and s.index > 0:
            step_on = steps[s.index - 1][2]
            keep, partition = s.meta.max_matches, tuple(dict.fromkeys(rc for _, _, rc in step_on))
        elif truncate and not s.public:
            assert s.facts.unit is not None  # a private join is on units (join_table)
            keep, partition = s.meta.join_rows, (s.facts.unit,)
        plan_sources.append(JoinSource(s.name, tuple(mapping[s.index]), keep, partition, hashed, s.public))
    plan = JoinPlan(
        plan_sources[0],
        tuple(JoinStep(plan_sources[right.index], j.how, tuple(on), unit_pair) for (j, right, on, unit_pair) in steps),
    )
    max_unit_rows = _max_unit_rows(sources, truncate, dataset.unit_level)
    meta = Metadata(
        columns=columns, privacy_unit=unit_name, row_level=unit_name is None, strip_strings=base.meta.strip_strings
    )
    return replace(
        bt,
        table=join_name([s.name for s in sources]),
        columns=kinds,
        metadata=meta,
        unit=unit_name,
        join=plan,
        max_unit_rows=max_unit_rows,
        tables=tuple(s.name for s in sources),
    )


def _max_unit_rows(sources: Sequence[_Source], truncated: bool, unit_level: bool) -> int | None:
    """The most joined rows of one privacy unit (None: no bound but the contribution bounds):
    the private tables' ``join_rows`` when two or more are joined, times every public table's
    ``max_matches``; on a row-level dataset, the product of the ``max_matches``."""
    if unit_level and not truncated:
        return None
    factors = [s.meta.join_rows if not s.public else s.meta.max_matches for s in sources if s.public or truncated]
    return math.prod(int(f) for f in factors if f is not None)


def _public_categories(
    s: _Source, column: str, spec: Categorical, public_keys: PublicKeys, base: DeclaredTable
) -> Categorical:
    """A public table's categorical column with its own distinct values as the categories (public
    data), when there are some and no more than the query's ``max_keys``."""
    values = [k[0] for k in public_keys(s.name, (column,)) if k[0] is not None]
    if not values or len(values) > base.limits.max_keys:
        return spec
    return Categorical(tuple(values), spec.value_type, spec.nullable)


def keys_from_table(
    table: object, columns: Sequence[str], public_keys: PublicKeys, dataset: DatasetMetadata
) -> tuple[tuple[Any, ...], ...]:
    """The distinct rows of the public ``table`` over the group ``columns`` (a joined name's bare
    column, ``visits.ward`` → ``ward``): the keys of ``group_by(..., keys_from=table)``."""
    name = dataset.table(table, "keys_from")
    meta = dataset.tables[name]
    if not meta.public:
        raise InvalidParameterError(
            "keys_from",
            name,
            "a public table of the dataset (" + ", ".join(map(repr, dataset.public_tables)) + ")",
            "the keys of a private table are its people's values",
        )
    wanted = []
    for c in columns:
        bare = c.split(".", 1)[1] if "." in c and c.split(".", 1)[0] in dataset.tables else c
        if bare not in meta.columns:
            raise undeclared_column("keys_from", f"{name}.{bare}", [f"{name}.{x}" for x in meta.columns])
        wanted.append(bare)
    return tuple(k for k in public_keys(name, tuple(wanted)) if all(x is not None for x in k))
