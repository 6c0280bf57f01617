"""The logical plan of one private aggregation: what an engine computes before any noise.

A plan says which rows to keep (``where``, public keys), how to bound each privacy unit's
contribution (at most ``max_groups`` groups per unit and ``max_rows`` rows per unit per group,
chosen by a keyed pseudo-random priority that depends only on the unit's own rows), and which
exact integer aggregates to return per group. Engines (DuckDB, Spark) run the same plan and must
return the same numbers for the same salt (with ``portable=True`` the priorities themselves are
computed identically on every engine; the DuckDB and Spark engine tests check it).

Every numeric aggregate goes through one clipping and quantisation path (:class:`SumSpec`): a
value x is clipped to the declared [lower, upper], centred, divided by a power-of-two grid and
rounded to an integer v with |v| <= bound. Sums of these integers are exact in every engine, so
the sensitivity of a sum is exactly what the bounds say — no floating-point summation error
can inflate it (Casacuberta, Shoemate, Vadhan & Wagaman 2022, "Widespread underestimation of
sensitivity in differentially private libraries").
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import NDArray

__all__ = [
    "Compare",
    "InList",
    "Between",
    "IsNull",
    "And",
    "Or",
    "Not",
    "Predicate",
    "GroupKey",
    "SumSpec",
    "ValueSpec",
    "AggregationPlan",
    "JoinSource",
    "JoinStep",
    "JoinPlan",
    "join_salt",
    "quantize_spec",
    "quantile_grid",
    "grid_points",
    "GRID_STEPS",
    "QUANTILE_GRID",
]

Literal_ = str | int | float | bool
CompareOp = Literal["=", "!=", "<", "<=", ">", ">="]


# ---- row filters: a small predicate language that every engine compiles with quoted identifiers
# ---- and bound parameters (never by splicing text) ------------------------------------------------


@dataclass(frozen=True)
class Compare:
    column: str
    op: CompareOp
    value: Literal_


@dataclass(frozen=True)
class InList:
    column: str
    values: tuple[Literal_, ...]
    negated: bool = False


@dataclass(frozen=True)
class Between:
    column: str
    low: Literal_
    high: Literal_
    negated: bool = False


@dataclass(frozen=True)
class IsNull:
    column: str
    negated: bool = False


@dataclass(frozen=True)
class And:
    parts: tuple[Predicate, ...]


@dataclass(frozen=True)
class Or:
    parts: tuple[Predicate, ...]


@dataclass(frozen=True)
class Not:
    part: Predicate


Predicate = Compare | InList | Between | IsNull | And | Or | Not


# ---- group keys and aggregates ---------------------------------------------------------------------


@dataclass(frozen=True)
class GroupKey:
    """A group-by key: a column as is, or the index of the bin of a numeric column (bins are
    [edges[i], edges[i+1]), the last one closed; values outside every bin are dropped)."""

    column: str
    edges: tuple[float, ...] | None = None


#: Quantisation steps per half-range: values are rounded to 1/2**24 of the half-range.
GRID_STEPS = 2**24


@dataclass(frozen=True)
class SumSpec:
    """An exact integer sum over the bounded rows, and the count of its non-null values.

    Each value x (NULL and NaN skipped) becomes v = clamp(round((clip(x, lower, upper) − center)
    · 2**-grid_exp), −bound, bound); with ``square`` the summand is round(v² / 2**shift) instead
    (in [0, bound² / 2**shift]). Both are integers, so the engine's sum is exact.
    """

    name: str
    column: str
    lower: float
    upper: float
    center: float
    grid_exp: int
    bound: int
    square: bool = False
    shift: int = 0

    @property
    def grid(self) -> float:
        return math.ldexp(1.0, self.grid_exp)

    @property
    def max_summand(self) -> int:
        """The largest |summand| one row can contribute."""
        return ((self.bound * self.bound + (1 << self.shift >> 1)) >> self.shift) if self.square else self.bound

    @property
    def unit(self) -> float:
        """The value of one integer step of the summand."""
        return self.grid * self.grid * 2.0**self.shift if self.square else self.grid


def quantize_spec(
    name: str, column: str, lower: float, upper: float, *, centered: bool, square: bool = False
) -> SumSpec:
    """The spec for a sum of clipped values (``centered``: of x − (lower+upper)/2), or of their
    squares, on a power-of-two grid with about 2**24 steps per half-range."""
    center = (lower + upper) / 2 if centered else 0.0
    half = max(upper - center, center - lower)
    grid_exp = math.ceil(math.log2(half / GRID_STEPS))
    while math.ldexp(half, -grid_exp) > GRID_STEPS:  # guard the float log2
        grid_exp += 1
    bound = math.ceil(math.ldexp(half, -grid_exp))
    shift = max(0, 2 * bound.bit_length() - 24) if square else 0
    return SumSpec(name, column, lower, upper, center, grid_exp, bound, square, shift)


#: Intervals of a quantile's candidate grid over a declared range (unit steps for integer bounds
#: at most this far apart): 2·4096 + 1 cells per group at most.
QUANTILE_GRID = 4096


def quantile_grid(lower: float, upper: float) -> int:
    """m, the number of intervals of the candidate grid c_j = lower + j·(upper − lower)/m,
    j = 0..m, from the declared bounds alone: the integers of [lower, upper] when the bounds are
    integers at most QUANTILE_GRID apart, else QUANTILE_GRID (halved while two grid points would
    coincide in floating point)."""
    width = upper - lower
    if float(lower).is_integer() and float(upper).is_integer() and 1 <= width <= QUANTILE_GRID:
        return int(width)
    m = QUANTILE_GRID
    while m > 1 and np.unique(grid_points(lower, upper, m)).size < m + 1:
        m //= 2
    return m


def grid_points(lower: float, upper: float, m: int) -> NDArray[np.float64]:
    """The candidates c_j = lower + j·(upper − lower)/m, j = 0..m (the last one is ``upper``)."""
    points = lower + np.arange(m + 1, dtype=np.float64) * ((upper - lower) / m)
    points[-1] = upper
    return points


@dataclass(frozen=True)
class ValueSpec:
    """A quantile's counts: for each kept row with a non-null value x, clipped to [lower, upper],
    its cell on the candidate grid of ``cells`` intervals (:func:`quantile_grid`), counted per
    group inside the engine — no value leaves it. With t = (x − lower)·cells/(upper − lower),
    cell = 2·⌊t⌋ when t is a whole number (x is a candidate), 2·⌊t⌋ + 1 when it lies strictly
    between two, capped at 2·cells. A row lands in exactly one cell, so each row moves one count by
    one whatever its value (how t rounds changes accuracy, never the sensitivity);
    #{x < c_j} is the count of cells below 2j, #{x > c_j} of cells above it."""

    column: str
    lower: float
    upper: float
    cells: int = QUANTILE_GRID

    @property
    def scale(self) -> float:
        """cells / (upper − lower): t = (x − lower)·scale."""
        return self.cells / (self.upper - self.lower)

    @property
    def candidates(self) -> NDArray[np.float64]:
        return grid_points(self.lower, self.upper, self.cells)


# ---- joins: the relation a plan reads when its query spans several tables -------------------------


@dataclass(frozen=True)
class JoinSource:
    """One table a join reads, through its typed relation (the declared columns, read by the
    declared types; engines find it by ``table``).

    ``columns`` maps the table's declared columns to their names in the joined relation (one
    column may appear under two names: ``age`` and ``visits.age``). ``keep`` truncates the table
    before it is joined: at most ``keep`` rows per value of ``partition`` — the privacy unit of a
    private table joined on it (``join_rows``), the join key of a public table (``max_matches``) —
    the rows kept chosen by a keyed hash of the row's own columns, salted by
    :func:`join_salt`, so which rows a unit keeps depends on that unit's rows only."""

    table: str
    columns: tuple[tuple[str, str], ...]
    keep: int | None = None
    partition: tuple[str, ...] = ()
    hashed: tuple[str, ...] = ()  # the columns a row's truncation priority is hashed from
    public: bool = False  # a public table (its partition is a join key, not a privacy unit)


@dataclass(frozen=True)
class JoinStep:
    """``source`` joined to the relation so far (``how``: inner or left) on the equalities
    ``on``: (index of an earlier source — 0 is the plan's base —, its column, this source's
    column), declared column names of the two tables. ``as_text`` compares the two sides as their
    canonical text (two privacy-unit columns whose stored types may differ)."""

    source: JoinSource
    how: Literal["inner", "left"]
    on: tuple[tuple[int, str, str], ...]
    as_text: bool = False


@dataclass(frozen=True)
class JoinPlan:
    """The joined relation a plan reads instead of its table: ``base`` joined by ``steps`` in
    order, exposing every source's ``columns`` under their joined names."""

    base: JoinSource
    steps: tuple[JoinStep, ...]

    @property
    def sources(self) -> tuple[JoinSource, ...]:
        return (self.base, *(s.source for s in self.steps))


#: Each join source's truncation is keyed by a salt of its own, derived from the plan's.
_JOIN_SALT = 0x9E3779B97F4A7C15


def join_salt(salt: int, index: int) -> int:
    """The 62-bit salt of join source ``index``'s truncation priorities."""
    return (salt ^ (_JOIN_SALT * (index + 1))) & ((1 << 62) - 1)


@dataclass(frozen=True)
class AggregationPlan:
    """Everything an engine needs for the pre-noise aggregates of one query.

    Output (one row per group key present after bounding; one row in all when ``groups`` is
    empty): the group key columns ``g0, g1, ...``, ``rows`` (kept rows), ``units`` (distinct units
    among them), and for each :class:`SumSpec` ``<name>`` (exact integer sum) and ``<name>_n``
    (non-null count). With ``values`` (quantiles), also the cell counts: one row per group, value
    spec ``__k`` and occupied cell ``__cell`` with its count ``rows`` — from the same bounded rows,
    in the same pass (:meth:`~dpkit.analytics.engines.base.Engine.compute`).
    """

    unit: str | None
    where: Predicate | None
    groups: tuple[GroupKey, ...]
    key_filter: tuple[tuple[Literal_, ...] | None, ...]  # per group column: allowed values (public keys) or None
    max_groups: int
    max_rows: int
    sums: tuple[SumSpec, ...]
    values: tuple[ValueSpec, ...]  # quantiles: cell counts per group (Engine.compute)
    salt: int  # keys the row and group priorities; drawn from the session's randomness
    portable: bool = False  # md5 priorities, identical on every engine (slower)
    join: JoinPlan | None = None  # the joined relation read instead of the engine's table

    def hash_specs(self) -> tuple[SumSpec, ...]:
        """The integer columns a row's priority is hashed from: the sums' summands and a
        quantisation of each value column (identical in every engine)."""
        extra = tuple(
            quantize_spec(f"h{i}", x.column, x.lower, x.upper, centered=True) for i, x in enumerate(self.values)
        )
        return self.sums + extra
