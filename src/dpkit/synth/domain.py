"""The synthetic table's domain: every column's cells, from the curator's metadata alone.

A categorical column has one cell per declared category and one more for everything else (NULL,
or a value the metadata does not list). A numeric column is cut by bin edges — given per column,
or a number of equal-width bins over its declared [lower, upper] — with values below the first
edge in the first bin, values above the last in the last (they are clipped, as every dpkit
aggregate clips to declared bounds), and one more cell for NULL and non-numbers. Nothing here
reads a row: the domain, and so the shape of every measurement, is public.

A column the metadata declares never missing (``nullable=False``) has no missing cell: a
synthetic table cannot invent a missing value in it. Should the data hold a NULL there anyway
(the declaration was wrong; ``dpkit check`` counts them), that row is counted in the column's
first cell — its first category (an unlisted value too), or the first bin, where values below the
lower bound go — a fixed rule applied to each row alone, so one person's NULL changes one count
by one, as any other value would.

>>> from dpkit.analytics import Categorical, Metadata, Numeric
>>> meta = Metadata(columns={"age": Numeric(0, 100), "sex": Categorical(("F", "M"))}, row_level=True)
>>> d = Domain.from_metadata(meta, bins={"age": 4})
>>> [(c.name, c.size) for c in d.columns]
[('age', 5), ('sex', 3)]
>>> d.columns[0].edges
(0.0, 25.0, 50.0, 75.0, 100.0)
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dpkit._validate import short_repr
from dpkit.analytics.engines.base import quote_identifier, sql_string
from dpkit.analytics.engines.bins import Search
from dpkit.analytics.metadata import Categorical, Metadata, Numeric
from dpkit.errors import InvalidParameterError

__all__ = ["Column", "Domain", "DEFAULT_BINS", "MAX_CELLS"]

#: Equal-width bins of a numeric column given no edges.
DEFAULT_BINS = 10
#: The most cells one column may have (its categories or bins, plus the missing cell).
MAX_CELLS = 10_000


@dataclass(frozen=True)
class Column:
    """One column of the domain: ``categories`` (categorical) or ``edges`` (numeric, increasing);
    ``size`` counts the cells, the last of which holds missing values unless the column is
    declared never missing (``nullable=False``: no missing cell)."""

    name: str
    categories: tuple[Any, ...] | None = None
    edges: tuple[float, ...] | None = None
    nullable: bool = True

    @property
    def size(self) -> int:
        values = len(self.categories) if self.categories is not None else len(self.edges or ()) - 1
        return values + (1 if self.nullable else 0)

    @property
    def missing(self) -> int | None:
        """The code of the missing cell (None: the column has none)."""
        return self.size - 1 if self.nullable else None

    @property
    def null_cell(self) -> int:
        """The cell a NULL is counted in (and, categorical, a value the metadata does not list):
        the missing cell, or the first cell of a column declared never missing."""
        return self.size - 1 if self.nullable else 0

    def labels(self) -> list[str]:
        """A readable name per cell (for reports)."""
        if self.categories is not None:
            names = [str(c) for c in self.categories]
        else:
            e = self.edges or ()
            names = [f"[{e[i]:g}, {e[i + 1]:g}{']' if i == len(e) - 2 else ')'}" for i in range(len(e) - 1)]
        return [*names, "(missing)"] if self.nullable else names

    def search(self, column: str) -> Search:
        """A numeric column's bin search (:mod:`dpkit.analytics.engines.bins`): replaces the value
        in ``column`` by its bin — the number of inner edges ``<= x``, so values below the first
        edge are in the first bin and values above the last in the last (clipped; the last bin
        is closed on the right); NULL stays NULL. ⌈log2 bins⌉ comparisons against the exact
        edges, not one per bin."""
        return Search.of_edges(column, self.edges or ())

    def code_sql(self, searched: str | None = None) -> str:
        """A total SQL expression giving the cell of the bound column (never NULL, never fails).
        Categorical: the category compared for equality. Numeric: the bin its :meth:`search`
        left in column ``searched``. NULL in :attr:`null_cell`."""
        if self.categories is not None:
            x = quote_identifier(self.name)
            whens = " ".join(f"WHEN {x} = {_literal(c)} THEN {i}" for i, c in enumerate(self.categories))
            return f"(CASE {whens} ELSE {self.null_cell} END)"
        if searched is None:
            raise ValueError("a numeric column's cell is read from its search: pass the searched column")
        return f"coalesce({searched}, {self.null_cell})"


def _literal(value: Any) -> str:
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, int):
        return str(value)
    return sql_string(str(value))


@dataclass(frozen=True)
class Domain:
    """The columns of a synthetic table, in the metadata's order."""

    columns: tuple[Column, ...]

    @property
    def names(self) -> list[str]:
        return [c.name for c in self.columns]

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(c.size for c in self.columns)

    def index(self, name: str) -> int:
        return self.names.index(name)

    @classmethod
    def from_metadata(
        cls,
        metadata: Metadata,
        *,
        bins: Mapping[str, Sequence[float] | int] | None = None,
        columns: Sequence[str] | None = None,
    ) -> Domain:
        """The domain of ``columns`` (default: every declared column). Refused with
        InvalidParameterError: a categorical column without declared categories (its keys are
        private: a synthetic table cannot list them), a numeric column without bounds and without
        edges, bins for an undeclared or categorical column, bad edges (not finite, not
        increasing, or a width that is not finite), a column named twice, a column of more than
        :data:`MAX_CELLS` cells, and fewer than two columns."""
        bins = dict(bins or {})
        if not isinstance(bins, dict):
            raise InvalidParameterError(
                "bins", short_repr(bins), "a mapping of numeric column to bin edges or a number of bins"
            )
        names = list(metadata.columns) if columns is None else list(columns)
        for i, name in enumerate(names):
            if name not in metadata.columns:
                raise InvalidParameterError(
                    "columns", name, f"a declared column: {', '.join(map(repr, metadata.columns))}"
                )
            if name in names[:i]:  # (a column twice would be measured against itself)
                raise InvalidParameterError(
                    "columns", short_repr(names), "distinct columns", f"{name!r} is named twice"
                )
        for name in bins:
            spec = metadata.columns.get(name)
            if not isinstance(spec, Numeric) or name not in names:
                raise InvalidParameterError(
                    f"bins.{name}", short_repr(bins[name]), "bins only for the synthesised numeric columns"
                )
        out = []
        for name in names:
            spec = metadata.columns[name]
            if isinstance(spec, Categorical):
                if spec.categories is None:
                    raise InvalidParameterError(
                        f"metadata.columns.{name}.categories",
                        None,
                        "the column's public categories: a synthetic table lists every value it can hold",
                        "a column whose keys are private cannot be synthesised; drop it with columns=[...]",
                    )
                column = Column(name, categories=tuple(spec.categories), nullable=spec.nullable)
            else:
                column = Column(name, edges=_edges(name, spec, bins.get(name)), nullable=spec.nullable)
            if column.size > MAX_CELLS:
                raise InvalidParameterError(
                    f"metadata.columns.{name}", f"{column.size - 1} categories or bins", f"at most {MAX_CELLS - 1}"
                )
            out.append(column)
        if len(out) < 2:
            raise InvalidParameterError("columns", names, "at least two columns to synthesise")
        return cls(tuple(out))


def _edges(name: str, spec: Numeric, given: Sequence[float] | int | None) -> tuple[float, ...]:
    if given is None or (isinstance(given, int) and not isinstance(given, bool)):
        k = DEFAULT_BINS if given is None else given
        if k < 1 or k > MAX_CELLS - 1:
            raise InvalidParameterError(f"bins.{name}", k, f"a number of bins in [1, {MAX_CELLS - 1}], or the edges")
        if not spec.bounded:
            raise InvalidParameterError(
                f"bins.{name}", given, "the bin edges of a numeric column declared without lower and upper bounds"
            )
        lo, hi = float(spec.lower), float(spec.upper)  # type: ignore[arg-type]
        return tuple(lo + (hi - lo) * i / k for i in range(k)) + (hi,)
    try:
        edges = tuple(float(x) for x in given)  # type: ignore[union-attr]
    except (TypeError, ValueError):
        raise InvalidParameterError(
            f"bins.{name}", short_repr(given), "increasing finite numbers, or a number of bins"
        ) from None
    if (
        len(edges) < 2
        or not all(math.isfinite(x) for x in edges)
        or any(b <= a for a, b in zip(edges, edges[1:], strict=False))
    ):
        raise InvalidParameterError(f"bins.{name}", short_repr(given), "at least two increasing finite edges")
    if not all(math.isfinite(b - a) for a, b in zip(edges, edges[1:], strict=False)):
        # A value is drawn as a + u·(b − a): an infinite width would draw infinities.
        raise InvalidParameterError(
            f"bins.{name}", short_repr(given), "increasing finite edges whose widths are finite numbers too",
            "a bin wider than the largest double (about 1.8e308) cannot be sampled",
        )  # fmt: skip
    return edges
