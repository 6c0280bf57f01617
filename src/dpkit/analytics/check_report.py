"""What a data check reports: per-column conformance to the declared metadata, near misses,
units and group spread (:class:`DataCheck` and its parts). Built by
:func:`dpkit.analytics.check.check_data`, for the curator only: it holds exact counts and raw
values, so it is never released to an analyst.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from dpkit.analytics.engines.base import ReadType
from dpkit.errors import InvalidParameterError

#: At most this many distinct non-conforming values are listed per column (most frequent first).
TOP_VALUES = 20
#: difflib similarity from which a value is a near miss of a declared category.
NEAR_MISS_CUTOFF = 0.8

Issue = Literal["unreadable", "outside_categories"]
Reason = Literal["whitespace", "case", "spelling", "missing marker"]
#: Texts (stripped, case-folded) that usually stand for a missing value; reported as such.
MISSING_MARKERS = frozenset({"", "?", "-", "na", "n/a", "nan", "null", "none", "missing", "unknown", "#n/a"})


# ---- the report ------------------------------------------------------------------------------------


def _share(count: int, rows: int) -> float:
    return count / rows if rows else 0.0


def _pct(count: int, rows: int) -> str:
    """A share as text that never rounds a miss up to 100% (or a single hit down to 0%)."""
    if not rows:
        return "—"
    if count == rows:
        return "100%"
    if count == 0:
        return "0%"
    p = 100.0 * count / rows
    return f"{min(max(p, 0.01), 99.99):.2f}%"


def _num(x: float | None) -> str:
    if x is None:
        return "—"
    if x in (float("inf"), float("-inf")):  # a row norm whose squares overflow
        return str(x)
    return f"{x:,.0f}" if x == int(x) else f"{x:.6g}"


@dataclass(frozen=True)
class NonconformingValue:
    """One distinct source value that does not conform, with how many rows hold it.

    ``value`` is the source value as text, exactly as stored (surrounding spaces kept);
    ``nearest`` is the declared category it most likely means (None when there is none) and
    ``reason`` why: ``whitespace``, ``case`` or ``spelling`` — or ``missing marker`` (with no
    nearest) for texts such as ``'?'`` and ``'N/A'`` that usually mean a missing value.
    """

    value: str
    count: int
    issue: Issue
    nearest: Any = None
    reason: Reason | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "value": self.value,
            "count": self.count,
            "issue": self.issue,
            "nearest": self.nearest,
            "reason": self.reason,
        }


@dataclass(frozen=True)
class ColumnCheck:
    """How one declared column (or the privacy unit) conforms.

    ``conforming + null + unreadable + below + above + outside_categories == rows`` for a
    column that was ``checked`` (a column missing from the source, or a nested one, is not read:
    its counts are 0 and :attr:`DataCheck.problems` says why).
    """

    name: str
    #: The declaration in words: ``numeric [17, 90]``, ``numeric`` (no bounds), ``2 string
    #: categories``, ``integer, private keys`` (categorical without a list) or ``unit (text)``.
    declared: str
    #: The declared type the column is read as (None when it was not read).
    read_as: ReadType | None
    #: The source's own kind of the column: numeric, string, boolean, nested, other or ``missing``.
    physical: str
    #: The source's SQL type (``VARCHAR`` for every CSV column), None when it was not read.
    source_type: str | None
    is_unit: bool
    #: Whether the column was read (False when it is missing from the source or nested).
    checked: bool
    rows: int
    conforming: int
    null: int
    unreadable: int
    below: int = 0
    above: int = 0
    outside_categories: int = 0
    #: Smallest and largest readable value of a numeric column (before clipping).
    minimum: float | None = None
    maximum: float | None = None
    #: Distinct non-NULL values as read (categorical columns and the unit).
    distinct: int | None = None
    #: The most frequent non-conforming values (at most TOP_VALUES), most frequent first.
    values: tuple[NonconformingValue, ...] = ()
    #: Whether the declaration has numeric bounds / a public category list.
    bounded: bool = False
    listed: bool = False
    #: False when the metadata declares the column never missing (``"nullable": false``): then
    #: its NULLs contradict the declaration.
    nullable: bool = True

    @property
    def out_of_bounds(self) -> int:
        return self.below + self.above

    @property
    def nonconforming(self) -> int:
        """Values that are present but do not conform (unreadable, out of bounds, outside categories)."""
        return self.unreadable + self.below + self.above + self.outside_categories

    @property
    def conforming_share(self) -> float:
        return _share(self.conforming, self.rows)

    @property
    def ok(self) -> bool:
        """Every present value conforms (and, for the privacy unit or a column declared
        ``nullable: false``, no row is NULL)."""
        return self.checked and self.nonconforming == 0 and not ((self.is_unit or not self.nullable) and self.null)

    def to_dict(self) -> dict[str, Any]:
        counts = {
            "conforming": self.conforming,
            "null": self.null,
            "unreadable": self.unreadable,
            "below": self.below,
            "above": self.above,
            "out_of_bounds": self.out_of_bounds,
            "outside_categories": self.outside_categories,
        }
        return {
            "name": self.name,
            "declared": self.declared,
            "read_as": self.read_as,
            "physical": self.physical,
            "source_type": self.source_type,
            "is_unit": self.is_unit,
            "checked": self.checked,
            "nullable": self.nullable,
            "ok": self.ok,
            "rows": self.rows,
            "counts": counts,
            "shares": {k: _share(n, self.rows) for k, n in counts.items()},
            "minimum": self.minimum,
            "maximum": self.maximum,
            "distinct": self.distinct,
            "values": [x.to_dict() for x in self.values],
        }


@dataclass(frozen=True)
class GroupSpread:
    """In how many groups of one categorical column the units appear (what ``max_groups`` bounds
    in a group-by over that column): the most for one unit, and how many units exceed
    ``max_groups`` (their rows in the excess groups are left out of such a query)."""

    column: str
    max_per_unit: int
    units_over_max_groups: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "column": self.column,
            "max_per_unit": self.max_per_unit,
            "units_over_max_groups": self.units_over_max_groups,
        }


@dataclass(frozen=True)
class NormCheck:
    """How many rows a ``data_norm`` would scale: the rows whose feature vector (the ``features``,
    read as declared, unscaled) has an ℓ2 norm above ``data_norm``. The estimators of
    :mod:`dpkit.ml` scale such a row down to ``data_norm`` without saying so; a large share means
    the features want scaling (``dpkit.ml.BoundsScaler``) or a larger ``data_norm``.

    ``rows``: rows with every feature present (the others are counted in ``rows_missing``);
    ``scaled``: those with a larger norm; the norms' median, 99th percentile and maximum (None
    without rows). ``bounded_norm``: √d when every feature has declared bounds — the
    ``data_norm`` that the features scaled by their bounds satisfy — else None."""

    features: tuple[str, ...]
    data_norm: float
    rows: int
    rows_missing: int
    scaled: int
    norm_median: float | None
    norm_p99: float | None
    norm_max: float | None
    bounded_norm: float | None

    @property
    def share(self) -> float:
        """The share of the rows with every feature that the ``data_norm`` would scale."""
        return _share(self.scaled, self.rows)

    def to_dict(self) -> dict[str, Any]:
        return {
            "features": list(self.features),
            "data_norm": self.data_norm,
            "rows": self.rows,
            "rows_missing": self.rows_missing,
            "scaled": self.scaled,
            "share": self.share,
            "norm_median": self.norm_median,
            "norm_p99": self.norm_p99,
            "norm_max": self.norm_max,
            "bounded_norm": self.bounded_norm,
        }

    def lines(self) -> list[str]:
        """The finding in words."""
        n = self.rows_missing
        missing = f"; {n:,} row{'s' if n != 1 else ''} with a missing feature not counted" if n else ""
        out = [
            f"data_norm={_num(self.data_norm)} over ({', '.join(map(repr, self.features))}): {self.scaled:,} of "
            f"{self.rows:,} rows ({_pct(self.scaled, self.rows)}) have a larger ℓ2 norm and would be scaled down"
            f"{missing}",
            f"    row norms: median {_num(self.norm_median)}, 99% {_num(self.norm_p99)}, max {_num(self.norm_max)}",
        ]
        if self.scaled and self.bounded_norm is not None:
            out.append(
                "    scaled by their declared bounds (dpkit.ml.BoundsScaler), every row has norm at most "
                f"√{len(self.features)} = {_num(self.bounded_norm)}: use that as data_norm"
            )
        return out


@dataclass(frozen=True)
class UnitCheck:
    """Rows per privacy unit, to choose ``max_rows`` and ``max_groups``.

    ``max_rows`` and ``max_groups`` are the metadata's (1 when it declares none, as in a
    session). ``units_over_max_rows`` units have more rows than ``max_rows``; a query without a
    group-by keeps ``max_rows`` of each unit's rows, so ``rows_over_max_rows`` rows are left out
    of it.
    """

    column: str
    units: int
    rows_without_unit: int
    rows_per_unit_median: int
    rows_per_unit_p90: int
    rows_per_unit_p99: int
    rows_per_unit_max: int
    max_rows: int
    units_over_max_rows: int
    rows_over_max_rows: int
    max_groups: int
    groups: tuple[GroupSpread, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "column": self.column,
            "units": self.units,
            "rows_without_unit": self.rows_without_unit,
            "rows_per_unit": {
                "median": self.rows_per_unit_median,
                "p90": self.rows_per_unit_p90,
                "p99": self.rows_per_unit_p99,
                "max": self.rows_per_unit_max,
            },
            "max_rows": self.max_rows,
            "units_over_max_rows": self.units_over_max_rows,
            "rows_over_max_rows": self.rows_over_max_rows,
            "max_groups": self.max_groups,
            "groups": [g.to_dict() for g in self.groups],
        }


@dataclass(frozen=True)
class FileTypeCheck:
    """Files that hold a declared column in a physical type other than the declared one (or not
    at all: ``source_type`` ``"missing"``). Their values are cast one by one to the declared
    type; those that are not values of it read as NULL (counted as ``unreadable``)."""

    column: str
    source_type: str
    files: int
    #: One of those files, relative to the data's directory.
    example: str

    def to_dict(self) -> dict[str, Any]:
        return {"column": self.column, "source_type": self.source_type, "files": self.files, "example": self.example}


@dataclass(frozen=True)
class PartitionCheck:
    """A partition directory (``key=value``) of a declared column whose value does not conform
    (``issue``) or whose name was not UTF-8 text (``repaired``: read with ``'?'`` for each byte
    of a malformed sequence). ``value`` is the text it reads as (None: ``__HIVE_DEFAULT_PARTITION__``)."""

    column: str
    directory: str
    value: str | None
    files: int
    issue: Issue | None = None
    repaired: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "column": self.column,
            "directory": self.directory,
            "value": self.value,
            "files": self.files,
            "issue": self.issue,
            "repaired": self.repaired,
        }


@dataclass(frozen=True)
class ReadingCheck:
    """What the reader repaired or skipped to read the source by the declared schema, row by row
    (docs/guide/reading.md). Curator only, like the rest of the check.

    ``files``: the Parquet files read. ``file_types``: files whose physical type of a declared
    column differs from the declaration. ``partitions``: partition directories that do not
    conform or were not UTF-8. ``invalid_text``: per declared column, the text values that were
    not valid UTF-8 (each read with ``'?'`` for every byte of a malformed sequence).
    ``skipped_records``: CSV lines the reader dropped (None: not counted for this source), with
    ``skipped_detail`` the count per reason, out of ``csv_lines`` non-blank lines."""

    files: int = 0
    file_types: tuple[FileTypeCheck, ...] = ()
    partitions: tuple[PartitionCheck, ...] = ()
    invalid_text: tuple[tuple[str, int], ...] = ()
    skipped_records: int | None = None
    skipped_detail: tuple[tuple[str, int], ...] = ()
    csv_lines: int | None = None

    @property
    def repaired(self) -> bool:
        """Whether the reader cast, repaired or skipped anything."""
        return bool(self.file_types or self.partitions or any(n for _, n in self.invalid_text) or self.skipped_records)

    def to_dict(self) -> dict[str, Any]:
        return {
            "files": self.files,
            "file_types": [f.to_dict() for f in self.file_types],
            "partitions": [p.to_dict() for p in self.partitions],
            "invalid_text": {c: n for c, n in self.invalid_text},
            "skipped_records": self.skipped_records,
            "skipped_detail": {why: n for why, n in self.skipped_detail},
            "csv_lines": self.csv_lines,
        }

    def lines(self) -> list[str]:
        """The report in words, one line per finding."""
        out = []
        for f in self.file_types:
            if f.source_type == "missing":
                held = f"is missing from {f.files:,} of {self.files:,} files (NULL in their rows"
            else:
                held = (
                    f"is {f.source_type} in {f.files:,} of {self.files:,} files (each value cast to the declared type"
                )
            out.append(f"reading: {f.column!r} {held}; e.g. {f.example})")
        for p in self.partitions:
            what = []
            if p.issue is not None:
                what.append("not a value of the declared type" if p.issue == "unreadable" else "outside the categories")
            if p.repaired:
                what.append("not UTF-8 text, read with '?'")
            out.append(
                f"reading: partition directory {p.directory!r} ({p.files:,} files) reads as {p.value!r}: {'; '.join(what)}"
            )
        for column, n in self.invalid_text:
            if n:
                out.append(
                    f"reading: {column!r} has {n:,} text values that are not UTF-8, read with '?' for each bad byte"
                )
        if self.skipped_records:
            why = "; ".join(f"{n:,} {reason}" for reason, n in self.skipped_detail)
            of = f" of {self.csv_lines:,}" if self.csv_lines is not None else ""
            out.append(f"reading: {self.skipped_records:,}{of} lines dropped ({why})")
        return out


_HEADER = ["column", "declared", "source", "conforming", "share", "NULL", "unreadable", "out of bounds", "not listed"]


@dataclass(frozen=True)
class DataCheck:
    """The curator's report of how a table conforms to its metadata (see the module docstring).

    Curator only: it holds exact counts and raw values of the private data, and is not a
    private release.
    """

    name: str
    rows: int
    strip_strings: bool
    row_level: bool
    columns: tuple[ColumnCheck, ...]
    unit: UnitCheck | None
    problems: tuple[str, ...]
    notes: tuple[str, ...] = ()
    #: What the reader repaired or skipped (None: nothing to report for this kind of source).
    reading: ReadingCheck | None = None
    #: The rows a given ``data_norm`` would scale (None: not asked for).
    norms: NormCheck | None = None
    #: A public table of a dataset of several tables (it protects nobody: no privacy unit).
    public: bool = False

    @property
    def ok(self) -> bool:
        """No problem, and every declared column (and the unit) conforms."""
        return not self.problems and all(c.ok for c in self.columns)

    def column(self, name: str) -> ColumnCheck:
        """The check of one column, by name."""
        for c in self.columns:
            if c.name == name:
                return c
        raise InvalidParameterError("column", name, "one of " + ", ".join(repr(c.name) for c in self.columns))

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (``json.dumps`` takes it as it is)."""
        return {
            "name": self.name,
            "curator_only": True,
            "ok": self.ok,
            "rows": self.rows,
            "strip_strings": self.strip_strings,
            "row_level": self.row_level,
            "columns": [c.to_dict() for c in self.columns],
            "unit": None if self.unit is None else self.unit.to_dict(),
            "problems": list(self.problems),
            "notes": list(self.notes),
            "reading": None if self.reading is None else self.reading.to_dict(),
            "norms": None if self.norms is None else self.norms.to_dict(),
        } | ({"public": True} if self.public else {})

    # -- text ----------------------------------------------------------------------------------

    def title(self) -> str:
        who = (
            "public table"
            if self.public
            else "row-level privacy"
            if self.row_level
            else f"privacy unit {self.unit.column!r}"
            if self.unit
            else "no privacy unit declared"
        )
        return (
            f"data check of {self.name}: {self.rows:,} rows, strip_strings={self.strip_strings}, {who} "
            "(curator only, not a private release)"
        )

    def table(self) -> tuple[list[str], list[list[str]]]:
        """The per-column summary as a header and rows of text cells (for terminals)."""
        rows = []
        for c in self.columns:
            if not c.checked:
                rows.append([c.name, c.declared, c.physical, "—", "—", "—", "—", "—", "—"])
                continue
            rows.append(
                [
                    c.name + (" (unit)" if c.is_unit else ""),
                    c.declared,
                    c.source_type or c.physical,
                    f"{c.conforming:,}",
                    _pct(c.conforming, c.rows),
                    f"{c.null:,}",
                    f"{c.unreadable:,}",
                    f"{c.out_of_bounds:,}" if c.bounded else "—",
                    f"{c.outside_categories:,}" if c.listed else "—",
                ]
            )
        return list(_HEADER), rows

    def details(self) -> list[str]:
        """The lines below the table: non-conforming values, ranges, the unit, problems, the verdict."""
        lines: list[str] = []
        for c in self.columns:
            if c.checked and not c.nullable and c.null:
                lines.append(
                    f"{c.name}: declared nullable: false, but {c.null:,} rows are NULL (a synthetic table "
                    "counts each in the column's first category or first bin)"
                )
            if c.checked and c.out_of_bounds:
                lines.append(
                    f"{c.name}: {c.below:,} below and {c.above:,} above the bounds (queries clip them); "
                    f"values range from {_num(c.minimum)} to {_num(c.maximum)}"
                )
            if c.values:
                shown = sum(v.count for v in c.values)
                more = c.unreadable + c.outside_categories - shown
                lines.append(
                    f"{c.name}: non-conforming values (most frequent first)"
                    + (f", and {more:,} more rows" if more else "")
                    + ":"
                )
                for v in c.values:
                    near = (
                        f" → nearest {v.nearest!r} ({v.reason})"
                        if v.nearest is not None
                        else " (a missing-value marker?)"
                        if v.reason
                        else ""
                    )
                    what = "not a value of the declared type" if v.issue == "unreadable" else "outside the categories"
                    lines.append(f"    {v.value!r} × {v.count:,}: {what}{near}")
        u = self.unit
        if u is not None:
            lines.append(
                f"privacy unit {u.column!r}: {u.units:,} units, {u.rows_without_unit:,} rows without a unit"
                f"{' (left out of every query)' if u.rows_without_unit else ''}; rows per unit: "
                f"median {u.rows_per_unit_median}, 90% {u.rows_per_unit_p90}, 99% {u.rows_per_unit_p99}, max {u.rows_per_unit_max}"
            )
            lines.append(
                f"    max_rows={u.max_rows}: {u.units_over_max_rows:,} units have more rows "
                f"({u.rows_over_max_rows:,} rows left out of a query without GROUP BY)"
            )
            for g in u.groups:
                lines.append(
                    f"    max_groups={u.max_groups}: grouping by {g.column!r}, units appear in up to {g.max_per_unit} groups; "
                    f"{g.units_over_max_groups:,} units in more than {u.max_groups}"
                )
        lines += [] if self.reading is None else self.reading.lines()
        lines += [] if self.norms is None else self.norms.lines()
        lines += [f"note: {n}" for n in self.notes]
        lines += [f"problem: {p}" for p in self.problems]
        bad = [c.name for c in self.columns if c.checked and not c.ok]
        if self.ok:
            lines.append("every declared column conforms")
        else:
            lines.append(
                "does not conform: "
                + ", ".join(
                    (
                        [
                            f"{len(bad)} column{'s' if len(bad) != 1 else ''} with non-conforming values ({', '.join(bad)})"
                        ]
                        if bad
                        else []
                    )
                    + (
                        [f"{len(self.problems)} problem{'s' if len(self.problems) != 1 else ''}"]
                        if self.problems
                        else []
                    )
                )
            )
        return lines

    def to_text(self) -> str:
        """The report as a plain-text table for the terminal."""
        header, rows = self.table()
        widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
        left = {0, 1, 2}

        def fmt(r: list[str]) -> str:
            return "  ".join(
                x.ljust(w) if i in left else x.rjust(w) for i, (x, w) in enumerate(zip(r, widths, strict=False))
            ).rstrip()

        out = [self.title(), fmt(header), fmt(["-" * w for w in widths]), *map(fmt, rows)]
        return "\n".join(out + self.details())

    def __str__(self) -> str:
        return self.to_text()
