"""The curator's declared schema: every usable column's type, bounds and public categories, the
privacy unit and the reading rules.

Nothing about a table is ever inferred from its rows (docs/architecture.md, "Declared schema"): one
person's row must not change a column's type, its bounds or its key set. The metadata says

* which columns an analyst may use (a column that is not declared cannot be named in a query),
* each column's type: :class:`Numeric` (read as a double; ``lower``/``upper`` bounds are needed
  before it can be summed, averaged or ranked) or :class:`Categorical` (read as a ``string``,
  ``integer`` or ``boolean``; ``categories`` is the public key list, if there is one),
* the privacy unit: ``privacy_unit`` (the column naming the person) or ``row_level=True`` (the
  curator vouches that every row is a different person) — exactly one of them,
* the contribution bounds per unit (``max_groups``, ``max_rows``),
* the reading rule for text: ``strip_strings`` (default True) removes surrounding whitespace, so
  UCI Adult's ``' Male'`` reads as ``'Male'``,
* for a table of a dataset of several tables (:class:`~dpkit.analytics.DatasetMetadata`):
  ``public`` (the table is public: no privacy cost, its values may be shown, and its categorical
  columns' keys are its own values), ``max_matches`` (a public table: the most rows that share
  one value of a join key — enforced, a join keeps at most that many) and ``join_rows`` (a
  private table: the rows per privacy unit a join on the unit keeps from it, chosen by a keyed
  hash — the truncation that prices a private join),
* per column, ``nullable`` (default True): False declares that the column is never missing.
  Synthetic data uses it (:mod:`dpkit.synth`: such a column gets no missing cell, so a synthetic
  table never invents a missing value in it) and ``dpkit check`` counts the NULLs that contradict
  it; queries read the column as before.

Every source is read through these declarations. A value that does not conform to its column's
declared type becomes NULL (never an error, never a type change): text that is not a number in a
numeric column, NaN and ±inf, non-integral values in an integer column. NULLs are skipped by
sums, means and quantiles, and belong to no declared category.

Metadata is written in Python or as JSON (``dpkit query --metadata``, ``dpkit check``,
``dpkit admin register-dataset``)::

    {"privacy_unit": "person_id", "max_groups": 2, "max_rows": 2,
     "columns": {"age": {"type": "numeric", "lower": 17, "upper": 90},
                 "zip": {"type": "categorical", "value_type": "integer"},
                 "sex": {"type": "categorical", "categories": ["Female", "Male"]}}}

and is validated against its own rules when it is built, before any data is read.

>>> meta = Metadata.from_dict({"row_level": True, "columns": {"age": {"type": "numeric", "lower": 0, "upper": 120}}})
>>> meta.columns["age"], meta.kind("age")
(Numeric(lower=0.0, upper=120.0), 'numeric')
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal

from dpkit import _validate as v
from dpkit._validate import short_repr as _short
from dpkit.errors import InvalidParameterError

__all__ = ["Numeric", "Categorical", "Metadata", "ColumnSpec", "ValueType"]

ValueType = Literal["string", "integer", "boolean"]
VALUE_TYPES: tuple[str, ...] = ("string", "integer", "boolean")

#: Bounds must lie within ±2**60 and span at least this much (the quantisation grid of sums
#: needs a representable step; see :func:`dpkit.analytics.plan.quantize_spec`).
MIN_WIDTH = 2.0**-900
MAX_BOUND = 2.0**60
#: Integer categories are exact doubles (they are compared after a cast through DOUBLE).
MAX_INTEGER = 2**53


def read_json(path: str | os.PathLike[str]) -> Any:
    """A metadata file's JSON (refused, naming the file, when it cannot be read or parsed)."""
    p = Path(path)
    try:
        return json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise InvalidParameterError("metadata", str(p), "a readable JSON file", str(exc)) from exc


def _check_nullable(value: object, name: str = "nullable") -> None:
    if not isinstance(value, bool):
        raise InvalidParameterError(
            name, _short(value), "True (the default: the column may be missing) or False (it never is)"
        )


def _with_nullable(text: str, nullable: bool) -> str:
    """A column's repr, ``nullable=False`` shown only when declared (the default stays unsaid)."""
    return text if nullable else text[:-1] + ", nullable=False)"


@dataclass(frozen=True, repr=False)
class Numeric:
    """A numeric column, read as a double (values that are not finite numbers become NULL).

    With ``lower`` and ``upper`` (both or neither) it can be summed, averaged and ranked: values
    are clipped to [lower, upper] first, and sensitivities come from these bounds. Without them
    it can still be filtered on and grouped by ``bins``.

    ``nullable=False`` declares the column never missing (a public fact, like the bounds): a
    synthetic table then has no missing cell for it (:mod:`dpkit.synth`). Queries are unchanged.
    """

    lower: float | None = None
    upper: float | None = None
    nullable: bool = True

    def __repr__(self) -> str:
        return _with_nullable(f"Numeric(lower={self.lower!r}, upper={self.upper!r})", self.nullable)

    def __post_init__(self) -> None:
        _check_nullable(self.nullable)
        if self.lower is None and self.upper is None:
            return
        if self.lower is None or self.upper is None:
            raise InvalidParameterError(
                "bounds",
                (self.lower, self.upper),
                "both lower and upper, or neither (then the column cannot be aggregated)",
            )
        lo, hi = v.bounds(self.lower, self.upper)
        if not (abs(lo) <= MAX_BOUND and abs(hi) <= MAX_BOUND) or not hi - lo >= MIN_WIDTH:
            raise InvalidParameterError(
                "bounds", (self.lower, self.upper), "finite bounds within ±2**60 with upper − lower ≥ 2**-900"
            )
        object.__setattr__(self, "lower", lo)
        object.__setattr__(self, "upper", hi)

    @property
    def bounded(self) -> bool:
        return self.lower is not None


def _category_type(c: object) -> ValueType | None:
    if isinstance(c, bool):
        return "boolean"
    if isinstance(c, int):
        return "integer" if abs(c) <= MAX_INTEGER else None
    if isinstance(c, str):
        return "string"
    return None


@dataclass(frozen=True, repr=False)
class Categorical:
    """A categorical column read as ``value_type`` (``"string"``, ``"integer"`` or
    ``"boolean"``; by default the type of the declared categories, else ``"string"``).

    ``categories`` is the curator's public list of keys: a group-by reports exactly these keys (a
    row whose value is not among them belongs to no group). Without it (None) the keys are
    private and a group-by must select them with δ > 0.

    ``nullable=False`` declares every value one of the categories, never missing: a synthetic
    table then has no cell for "missing or unlisted" in this column (:mod:`dpkit.synth`).
    Queries are unchanged.
    """

    categories: tuple[Any, ...] | None = None
    value_type: ValueType | None = None
    nullable: bool = True

    def __repr__(self) -> str:
        return _with_nullable(
            f"Categorical(categories={self.categories!r}, value_type={self.value_type!r})", self.nullable
        )

    def __post_init__(self) -> None:
        _check_nullable(self.nullable)
        vt = self.value_type
        if vt is not None and vt not in VALUE_TYPES:
            raise InvalidParameterError("value_type", vt, "'string', 'integer' or 'boolean'")
        cats = self.categories
        if cats is None:
            object.__setattr__(self, "value_type", vt or "string")
            return
        if isinstance(cats, (str, bytes)) or not hasattr(cats, "__iter__"):
            raise InvalidParameterError("categories", _short(cats), "a list of public category values, or None")
        cats = tuple(cats)
        if not cats:
            raise InvalidParameterError("categories", cats, "a non-empty list of public category values, or None")
        kinds = {_category_type(c) for c in cats}
        if None in kinds or len(kinds) != 1:
            raise InvalidParameterError(
                "categories",
                _short(cats),
                "values of one type: all strings, all integers (within ±2**53) or all booleans",
                "use Numeric with bins for real-valued keys",
            )
        kind = kinds.pop()
        if vt is not None and vt != kind:
            raise InvalidParameterError("categories", _short(cats), f"values of the declared value_type {vt!r}")
        if len(set(cats)) != len(cats):
            raise InvalidParameterError("categories", _short(cats), "a list without duplicates")
        object.__setattr__(self, "categories", cats)
        object.__setattr__(self, "value_type", kind)


ColumnSpec = Numeric | Categorical
_KEYS = (
    "columns",
    "privacy_unit",
    "row_level",
    "max_groups",
    "max_rows",
    "strip_strings",
    "public",
    "max_matches",
    "join_rows",
)


def _column_from_dict(name: str, spec: object) -> ColumnSpec:
    if not isinstance(spec, Mapping):
        raise InvalidParameterError(
            f"columns.{name}", _short(spec), "an object such as {'type': 'numeric', 'lower': 0, 'upper': 1}"
        )
    kind = spec.get("type")
    nullable = spec.get("nullable", True)
    if kind in ("numeric", "categorical"):
        _check_nullable(nullable, f"columns.{name}.nullable")
    if kind == "numeric":
        extra = set(spec) - {"type", "lower", "upper", "nullable"}
        if extra:
            raise InvalidParameterError(
                f"columns.{name}",
                _short(dict(spec)),
                "a numeric column with keys among type, lower, upper, nullable",
                f"unknown keys {sorted(extra)}",
            )
        return Numeric(spec.get("lower"), spec.get("upper"), nullable)
    if kind == "categorical":
        extra = set(spec) - {"type", "categories", "value_type", "nullable"}
        if extra:
            raise InvalidParameterError(
                f"columns.{name}",
                _short(dict(spec)),
                "a categorical column with keys among type, categories, value_type, nullable",
                f"unknown keys {sorted(extra)}",
            )
        return Categorical(spec.get("categories"), spec.get("value_type"), nullable)
    raise InvalidParameterError(f"columns.{name}.type", kind, "'numeric' or 'categorical'")


@dataclass(frozen=True)
class Metadata:
    """What the curator declares about a table (see the module docstring).

    ``privacy_unit`` and ``row_level`` say who is protected; a session needs exactly one of them
    (from here or from its own arguments). The unit column is read as text and may be used as the
    unit and in ``COUNT(DISTINCT ...)``; it can be filtered or grouped on only if it is also
    declared in ``columns``.
    """

    columns: Mapping[str, ColumnSpec] = field(default_factory=dict)
    privacy_unit: str | None = None
    max_groups: int | None = None
    max_rows: int | None = None
    row_level: bool = False
    strip_strings: bool = True
    public: bool = False
    max_matches: int | None = None
    join_rows: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.columns, Mapping):
            raise InvalidParameterError(
                "columns", _short(self.columns), "a mapping from column name to Numeric(...) or Categorical(...)"
            )
        cols: dict[str, ColumnSpec] = {}
        for name, spec in self.columns.items():
            if not isinstance(name, str) or not name:
                raise InvalidParameterError("columns", _short(name), "non-empty column names (strings)")
            if isinstance(spec, Mapping):
                spec = _column_from_dict(name, spec)
            if not isinstance(spec, (Numeric, Categorical)):
                raise InvalidParameterError(
                    f"columns.{name}", _short(spec), "Numeric(lower, upper) or Categorical(categories)"
                )
            cols[name] = spec
        object.__setattr__(self, "columns", MappingProxyType(cols))
        if self.privacy_unit is not None and (not isinstance(self.privacy_unit, str) or not self.privacy_unit):
            raise InvalidParameterError("privacy_unit", self.privacy_unit, "a column name, or None with row_level=True")
        for name in ("row_level", "strip_strings", "public"):
            if not isinstance(getattr(self, name), bool):
                raise InvalidParameterError(name, getattr(self, name), "True or False")
        if self.row_level and self.privacy_unit is not None:
            raise InvalidParameterError(
                "row_level",
                True,
                "False when a privacy_unit is declared",
                "declare either the unit column or that every row is a different person, not both",
            )
        for name in ("max_groups", "max_rows", "max_matches", "join_rows"):
            value = getattr(self, name)
            if value is not None:
                v.positive_int(value, name)
        if self.public:
            for name in ("privacy_unit", "max_groups", "max_rows", "join_rows"):
                if getattr(self, name) is not None:
                    raise InvalidParameterError(
                        name,
                        getattr(self, name),
                        "None for a public table",
                        "a public table protects nobody: it has no privacy unit, contribution bounds or join_rows",
                    )
            if self.row_level:
                raise InvalidParameterError(
                    "row_level", True, "False for a public table", "a public table protects nobody"
                )
        elif self.max_matches is not None:
            raise InvalidParameterError(
                "max_matches",
                self.max_matches,
                "None for a private table",
                "max_matches bounds a public table's rows per join key; a private table's rows per unit kept by a join are join_rows",
            )

    def kind(self, column: str) -> Literal["numeric", "string", "boolean"]:
        """The kind of literal a declared column compares with: ``numeric`` (Numeric and integer
        categories), ``string`` or ``boolean``."""
        spec = self.columns[column]
        if isinstance(spec, Numeric) or spec.value_type == "integer":
            return "numeric"
        return "string" if spec.value_type == "string" else "boolean"

    def read_type(self, column: str) -> Literal["double", "string", "integer", "boolean"]:
        """How an engine reads a declared column: ``double`` for Numeric, a categorical's value
        type otherwise."""
        spec = self.columns[column]
        return "double" if isinstance(spec, Numeric) else spec.value_type  # type: ignore[return-value]

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Metadata:
        """Metadata from the JSON layout shown in the module docstring."""
        if not isinstance(data, Mapping):
            raise InvalidParameterError("metadata", _short(data), "an object with a 'columns' entry")
        extra = set(data) - set(_KEYS)
        if extra:
            raise InvalidParameterError("metadata", sorted(extra), "keys among " + ", ".join(_KEYS))
        return cls(**{k: data[k] for k in _KEYS if k in data})

    @classmethod
    def from_json(cls, path: str | os.PathLike[str]) -> Metadata:
        """Metadata from a JSON file."""
        return cls.from_dict(read_json(path))

    def to_dict(self) -> dict[str, Any]:
        cols: dict[str, Any] = {}
        for name, spec in self.columns.items():
            if isinstance(spec, Numeric):
                cols[name] = {"type": "numeric"} | ({"lower": spec.lower, "upper": spec.upper} if spec.bounded else {})
            else:
                cols[name] = {"type": "categorical", "value_type": spec.value_type} | (
                    {} if spec.categories is None else {"categories": list(spec.categories)}
                )
            if not spec.nullable:
                cols[name]["nullable"] = False
        out: dict[str, Any] = {"columns": cols}
        for name in ("privacy_unit", "max_groups", "max_rows", "max_matches", "join_rows"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        if self.public:
            out["public"] = True
        if self.row_level:
            out["row_level"] = True
        if not self.strip_strings:
            out["strip_strings"] = False
        return out
