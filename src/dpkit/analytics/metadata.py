"""Column metadata declared by the data curator: types, bounds and public category lists.

Sensitivity comes from these declarations, never from the data (DESIGN core idea 3; the rule
"bounds computed from private data are an error"). A numeric aggregate over a column without
declared bounds is refused; a group-by over a column with a public category list uses exactly
those keys (missing ones are reported with noise, unknown ones are dropped before contribution
bounding); a group-by over any other column selects its keys privately.

Metadata is written in Python or as JSON (the ``--metadata`` file of ``dpkit query``)::

    {"privacy_unit": "user_id", "max_groups": 5, "max_rows": 2,
     "columns": {"age": {"type": "numeric", "lower": 17, "upper": 90},
                 "sex": {"type": "categorical", "categories": ["Female", "Male"]}}}

>>> meta = Metadata.from_dict({"columns": {"age": {"type": "numeric", "lower": 0, "upper": 120}}})
>>> meta.columns["age"]
Numeric(lower=0.0, upper=120.0)
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from dpkit import _validate as v
from dpkit._validate import short_repr as _short
from dpkit.errors import InvalidParameterError

__all__ = ["Numeric", "Categorical", "Metadata", "ColumnSpec"]


@dataclass(frozen=True)
class Numeric:
    """A numeric column with curator-declared bounds: values are clipped to [lower, upper]
    before any sum, mean, variance or quantile."""

    lower: float
    upper: float

    def __post_init__(self) -> None:
        lo, hi = v.bounds(self.lower, self.upper)
        if not (abs(lo) <= 2.0**60 and abs(hi) <= 2.0**60):
            raise InvalidParameterError("bounds", (self.lower, self.upper), "finite bounds within ±2**60")
        object.__setattr__(self, "lower", lo)
        object.__setattr__(self, "upper", hi)


@dataclass(frozen=True)
class Categorical:
    """A categorical column; ``categories`` is the curator's public list of keys (or None when
    the keys are not public and a group-by must select them privately)."""

    categories: tuple[Any, ...] | None = None

    def __post_init__(self) -> None:
        cats = self.categories
        if cats is None:
            return
        if isinstance(cats, (str, bytes)) or not hasattr(cats, "__iter__"):
            raise InvalidParameterError("categories", _short(cats), "a list of public category values, or None")
        cats = tuple(cats)
        if not cats:
            raise InvalidParameterError("categories", cats, "a non-empty list of public category values, or None")
        for c in cats:
            if not (isinstance(c, (str, int)) and not isinstance(c, bool)) and not (isinstance(c, float) and math.isfinite(c)):
                raise InvalidParameterError("categories", _short(cats), "strings or numbers (no None, NaN or nested values)")
        if len(set(cats)) != len(cats):
            raise InvalidParameterError("categories", _short(cats), "a list without duplicates")
        object.__setattr__(self, "categories", cats)


ColumnSpec = Numeric | Categorical


def _column_from_dict(name: str, spec: object) -> ColumnSpec:
    if not isinstance(spec, Mapping):
        raise InvalidParameterError(f"columns.{name}", _short(spec), "an object such as {'type': 'numeric', 'lower': 0, 'upper': 1}")
    kind = spec.get("type")
    extra = set(spec) - {"type", "lower", "upper", "categories"}
    if extra:
        raise InvalidParameterError(f"columns.{name}", _short(dict(spec)), "keys among type, lower, upper, categories", f"unknown keys {sorted(extra)}")
    if kind == "numeric":
        if "lower" not in spec or "upper" not in spec:
            raise InvalidParameterError(f"columns.{name}", _short(dict(spec)), "a numeric column with both 'lower' and 'upper'")
        return Numeric(spec["lower"], spec["upper"])
    if kind == "categorical":
        return Categorical(spec.get("categories"))
    raise InvalidParameterError(f"columns.{name}.type", kind, "'numeric' or 'categorical'")


@dataclass(frozen=True)
class Metadata:
    """What the curator declares about a table: per-column specs and, optionally, the privacy
    unit and the contribution bounds (used when the session does not set them itself)."""

    columns: Mapping[str, ColumnSpec] = field(default_factory=dict)
    privacy_unit: str | None = None
    max_groups: int | None = None
    max_rows: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.columns, Mapping):
            raise InvalidParameterError("columns", _short(self.columns), "a mapping from column name to Numeric(...) or Categorical(...)")
        cols: dict[str, ColumnSpec] = {}
        for name, spec in self.columns.items():
            if not isinstance(name, str) or not name:
                raise InvalidParameterError("columns", _short(name), "non-empty column names (strings)")
            if isinstance(spec, Mapping):
                spec = _column_from_dict(name, spec)
            if not isinstance(spec, (Numeric, Categorical)):
                raise InvalidParameterError(f"columns.{name}", _short(spec), "Numeric(lower, upper) or Categorical(categories)")
            cols[name] = spec
        object.__setattr__(self, "columns", MappingProxyType(cols))
        if self.privacy_unit is not None and (not isinstance(self.privacy_unit, str) or not self.privacy_unit):
            raise InvalidParameterError("privacy_unit", self.privacy_unit, "a column name or None (each row is a unit)")
        for name in ("max_groups", "max_rows"):
            value = getattr(self, name)
            if value is not None:
                v.positive_int(value, name)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Metadata:
        """Metadata from the JSON layout shown in the module docstring."""
        if not isinstance(data, Mapping):
            raise InvalidParameterError("metadata", _short(data), "an object with a 'columns' entry")
        extra = set(data) - {"columns", "privacy_unit", "max_groups", "max_rows"}
        if extra:
            raise InvalidParameterError("metadata", sorted(extra), "keys among columns, privacy_unit, max_groups, max_rows")
        return cls(
            columns=data.get("columns", {}),
            privacy_unit=data.get("privacy_unit"),
            max_groups=data.get("max_groups"),
            max_rows=data.get("max_rows"),
        )

    @classmethod
    def from_json(cls, path: str | os.PathLike[str]) -> Metadata:
        """Metadata from a JSON file."""
        p = Path(path)
        try:
            data = json.loads(p.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise InvalidParameterError("metadata", str(p), "a readable JSON file", str(exc)) from exc
        return cls.from_dict(data)

    def to_dict(self) -> dict[str, Any]:
        cols: dict[str, Any] = {}
        for name, spec in self.columns.items():
            if isinstance(spec, Numeric):
                cols[name] = {"type": "numeric", "lower": spec.lower, "upper": spec.upper}
            else:
                cols[name] = {"type": "categorical"} | ({} if spec.categories is None else {"categories": list(spec.categories)})
        out: dict[str, Any] = {"columns": cols}
        for name in ("privacy_unit", "max_groups", "max_rows"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        return out
