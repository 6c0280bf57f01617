"""What a query is checked and priced against: the curator's declared facts about one table.

A :class:`DeclaredTable` holds only what was *declared* — the table's name, the column kinds from
the metadata, the privacy unit, the neighbour relation, the contribution bounds and the size
limits — never anything read from the rows. Pricing a query
(:func:`dpkit.analytics.pricing.price`) reads nothing else, so a refusal cannot depend on the
data: its content and its timing say nothing (Haeberlen, Pierce & Narayan 2011, "Differential
privacy under fire", on why a refusal that reads the data leaks it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from dpkit import _validate as v
from dpkit._validate import Neighbours
from dpkit.analytics.limits import QueryLimits
from dpkit.analytics.metadata import Metadata
from dpkit.analytics.plan import JoinPlan
from dpkit.errors import Fix, InvalidParameterError

__all__ = ["DeclaredTable", "ColumnKind", "check_bound", "listed", "undeclared_column"]

#: How many declared names an unknown-column message lists before it says how many more there are.
_LISTED = 20

#: A declared column's kind as queries see it (see Metadata.kind); ``unit`` is the privacy-unit
#: column when it is not declared itself (usable as the unit and in COUNT(DISTINCT ...) only).
ColumnKind = Literal["numeric", "string", "boolean", "unit"]


@dataclass(frozen=True)
class DeclaredTable:
    """The declared facts a query is validated and priced against (no data).

    ``columns`` maps every usable column to its kind; ``unit`` is the privacy-unit column (None
    when each row is a different person); ``max_groups`` / ``max_rows`` are the default
    contribution bounds; ``portable`` asks the engine for engine-independent row priorities.

    A query over several tables is checked against the declared facts of the joined table
    (:func:`dpkit.analytics.joins.join_table`): ``join`` is the relation engines read, and
    ``max_unit_rows`` the most rows one privacy unit can have in it whatever the contribution
    bounds (the product of the truncations and matches of its joins; None: no bound beyond them).
    ``public_keys`` lists a public table's distinct rows over some of its columns (public data,
    read when a query asks for its keys).
    """

    table: str
    columns: Mapping[str, ColumnKind]
    metadata: Metadata
    unit: str | None
    neighbours: Neighbours
    max_groups: int
    max_rows: int
    limits: QueryLimits
    portable: bool = False
    join: JoinPlan | None = None
    max_unit_rows: int | None = None
    public_keys: Callable[[str, tuple[str, ...]], tuple[tuple[Any, ...], ...]] | None = None
    tables: tuple[str, ...] = ()

    @property
    def privacy_unit(self) -> str | None:
        """The privacy-unit column (the name SQL compilation reads)."""
        return self.unit


def check_bound(name: str, value: object, default: int | None, unit: str | None) -> int:
    """A contribution bound (``max_groups`` / ``max_rows``): a positive integer, or ``default``
    (else 1) when None; always 1 when each row is the privacy unit."""
    if value is None:
        if unit is None:
            return 1
        return default if default is not None else 1
    n = v.positive_int(value, name)
    if unit is None and n != 1:
        raise InvalidParameterError(
            name,
            value,
            "1 (or None) when each row is the privacy unit",
            "set privacy_unit= to bound a person's contributions",
        )
    return n


def listed(declared: Iterable[str]) -> str:
    """Declared names as a refusal lists them: the first 20, then how many more."""
    names = list(declared)
    shown = ", ".join(repr(c) for c in names[:_LISTED])
    if len(names) > _LISTED:
        shown += f" and {len(names) - _LISTED} more"
    return shown


def undeclared_column(name: str, column: object, declared: Iterable[str]) -> InvalidParameterError:
    """The refusal of a column that the metadata does not declare (parameter ``name``).

    It says that the column is not *declared* — a column missing from the metadata is the usual
    cause, most of all for a table opened without ``metadata=`` — and lists the declared names.
    Only those: they are the curator's public declaration (an analyst of the service sees them in
    the dataset's schema), while the source's other columns are names only the data holds, so
    the message, like every refusal, depends on the declaration alone."""
    shown = listed(declared)
    text = v.short_repr(column, 80)
    fix = Fix("declare_column", f"Metadata(columns={{{text}: ...}})", {"column": column})
    return InvalidParameterError(
        name,
        column if not isinstance(column, str) else column[:200],
        f"a column declared in the metadata (declared: {shown or 'none'})",
        f"unknown column: {text} is not declared in the metadata; only declared columns can be queried "
        f"(their declared types and bounds set the noise); declare it with {fix.text}",
        fix=fix,
    )
