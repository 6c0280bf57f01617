"""The declared schema of a dataset of several tables: :class:`DatasetMetadata`.

A dataset is one budget over one or more tables. Each table is declared by its own
:class:`~dpkit.analytics.Metadata` (its columns and reading rules), and says who it protects:

* a **private** table names its privacy-unit column (``privacy_unit``; the tables' unit columns
  may have different names but must identify the same people) — or, in a dataset whose every
  private table is ``row_level``, each row is a different person. ``join_rows`` is the number of
  rows per unit a join on the unit keeps from it (the truncation that prices a private join);
* a **public** table (``public=True``) protects nobody: it costs nothing, its values may be shown
  (its categorical columns' keys are its own values) and ``max_matches`` bounds how many of its
  rows share one value of a join key (a join keeps at most that many, so the bound holds).

The contribution bounds of a query (``max_groups``, ``max_rows``) are the dataset's and apply to
the rows of the joined table, per privacy unit. Nothing here is read from the data.

As JSON (``dpkit query --metadata``, ``dpkit admin register-dataset``)::

    {"max_groups": 1, "max_rows": 10,
     "tables": {
       "visits": {"privacy_unit": "patient_id", "join_rows": 10,
                  "columns": {"postcode": {"type": "categorical"}, "cost": {"type": "numeric", "lower": 0, "upper": 5000}}},
       "prescriptions": {"privacy_unit": "patient_id", "join_rows": 5,
                         "columns": {"drug": {"type": "categorical"}}},
       "regions": {"public": true, "max_matches": 1,
                   "columns": {"postcode": {"type": "categorical"}, "region": {"type": "categorical"}}}}}

>>> meta = DatasetMetadata.from_dict({"tables": {
...     "visits": {"privacy_unit": "pid", "columns": {"zip": {"type": "categorical"}}},
...     "zips": {"public": True, "max_matches": 1, "columns": {"zip": {"type": "categorical"}}}}})
>>> meta.private_tables, meta.public_tables, meta.unit_level
(('visits',), ('zips',), True)
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from dpkit import _validate as v
from dpkit._validate import short_repr as _short
from dpkit.analytics.metadata import Metadata, read_json
from dpkit.errors import InvalidParameterError

__all__ = ["DatasetMetadata", "declares_tables", "is_dataset_metadata"]

_KEYS = ("tables", "max_groups", "max_rows")


def is_dataset_metadata(data: object) -> bool:
    """Whether a metadata dict declares several tables (it has a ``tables`` entry)."""
    return isinstance(data, Mapping) and "tables" in data


def declares_tables(metadata: object) -> bool:
    """Whether ``metadata`` — a :class:`DatasetMetadata`, its dict, or the path of its JSON file —
    declares several tables. A file that cannot be read says no: the one-table path refuses it in
    its own words."""
    if isinstance(metadata, DatasetMetadata) or is_dataset_metadata(metadata):
        return True
    if isinstance(metadata, (str, os.PathLike)):
        try:
            return is_dataset_metadata(json.loads(Path(metadata).read_text(encoding="utf-8")))
        except (OSError, ValueError):
            return False
    return False


@dataclass(frozen=True)
class DatasetMetadata:
    """What the curator declares about a dataset of several tables (see the module docstring).

    ``tables`` maps each table's name (as queries write it in ``FROM`` and ``JOIN``) to its
    :class:`~dpkit.analytics.Metadata` (or its dict). ``max_groups`` / ``max_rows`` are the
    default contribution bounds of every query, applied per privacy unit to the joined rows.
    """

    tables: Mapping[str, Metadata] = field(default_factory=dict)
    max_groups: int | None = None
    max_rows: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.tables, Mapping) or not self.tables:
            raise InvalidParameterError(
                "tables", _short(self.tables), "a non-empty mapping from table name to Metadata (or its dict)"
            )
        tables: dict[str, Metadata] = {}
        folded: dict[str, str] = {}
        for name, meta in self.tables.items():
            if not isinstance(name, str) or not name or "." in name or name != name.strip():
                raise InvalidParameterError(
                    "tables", _short(name), "table names: non-empty text without dots or surrounding spaces"
                )
            if name.casefold() in folded:
                raise InvalidParameterError(
                    "tables",
                    name,
                    "table names that differ case-insensitively",
                    f"{folded[name.casefold()]!r} is declared too",
                )
            folded[name.casefold()] = name
            if isinstance(meta, Mapping):
                meta = Metadata.from_dict(meta)
            if not isinstance(meta, Metadata):
                raise InvalidParameterError(f"tables.{name}", _short(meta), "a Metadata (or its dict)")
            for bound in ("max_groups", "max_rows"):
                if getattr(meta, bound) is not None:
                    raise InvalidParameterError(
                        f"tables.{name}.{bound}",
                        getattr(meta, bound),
                        "None: contribution bounds are the dataset's",
                        f"declare {bound} once, beside tables; it bounds a unit's rows of the joined table",
                    )
            tables[name] = meta
        object.__setattr__(self, "tables", MappingProxyType(tables))
        private = [n for n, m in tables.items() if not m.public]
        if not private:
            raise InvalidParameterError(
                "tables",
                sorted(tables),
                "at least one private table (public tables alone need no differential privacy)",
            )
        units = {n: tables[n].privacy_unit for n in private}
        unit_level = [n for n, u in units.items() if u is not None]
        row_level = [n for n in private if tables[n].row_level]
        missing = [n for n in private if n not in unit_level and n not in row_level]
        if missing:
            raise InvalidParameterError(
                f"tables.{missing[0]}.privacy_unit",
                None,
                "the column naming the person, or row_level=True (in every private table), or public=True",
                "say who each private table protects",
            )
        if unit_level and row_level:
            raise InvalidParameterError(
                f"tables.{row_level[0]}.row_level",
                True,
                f"a privacy_unit, as {unit_level[0]!r} declares",
                "the private tables of one dataset protect the same people: all by a unit column, or all row by row",
            )
        for name in ("max_groups", "max_rows"):
            value = getattr(self, name)
            if value is not None:
                v.positive_int(value, name)
                if row_level and value != 1:
                    raise InvalidParameterError(
                        name, value, "1 (or None) when each row is the privacy unit", "declare a privacy_unit per table"
                    )

    # -- what it declares ---------------------------------------------------------------------------

    @property
    def private_tables(self) -> tuple[str, ...]:
        return tuple(n for n, m in self.tables.items() if not m.public)

    @property
    def public_tables(self) -> tuple[str, ...]:
        return tuple(n for n, m in self.tables.items() if m.public)

    @property
    def unit_level(self) -> bool:
        """Whether the private tables name a privacy unit (else each row is its own unit)."""
        return all(self.tables[n].privacy_unit is not None for n in self.private_tables)

    def table(self, name: object, what: str = "table") -> str:
        """The declared spelling of table ``name`` (exact, else the one case-insensitive match)."""
        if isinstance(name, str):
            if name in self.tables:
                return name
            matches = [n for n in self.tables if n.casefold() == name.casefold()]
            if len(matches) == 1:
                return matches[0]
        raise InvalidParameterError(what, _short(name), "a table of the dataset: " + ", ".join(map(repr, self.tables)))

    def sources(self, data: object, what: str = "data") -> dict[str, Any]:
        """``data`` (table name → its source) checked to name exactly the declared tables, in
        their declared order (refusals name the parameter ``what``)."""
        if not isinstance(data, Mapping) or not data:
            raise InvalidParameterError(what, _short(data), "a mapping from each declared table's name to its data")
        given, declared = {str(k) for k in data}, set(self.tables)
        if given != declared:
            missing, extra = sorted(declared - given), sorted(given - declared)
            raise InvalidParameterError(
                what,
                sorted(given),
                "one source for each declared table: " + ", ".join(map(repr, self.tables)),
                "; ".join(
                    x for x in (f"missing {missing}" if missing else "", f"not declared {extra}" if extra else "") if x
                ),
            )
        return {name: data[name] for name in self.tables}

    # -- JSON ---------------------------------------------------------------------------------------

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DatasetMetadata:
        """Metadata of several tables from the JSON layout shown in the module docstring."""
        if not isinstance(data, Mapping):
            raise InvalidParameterError("metadata", _short(data), "an object with a 'tables' entry")
        extra = set(data) - set(_KEYS)
        if extra:
            raise InvalidParameterError("metadata", sorted(extra), "keys among " + ", ".join(_KEYS))
        if not isinstance(data.get("tables"), Mapping):
            raise InvalidParameterError(
                "tables", _short(data.get("tables")), "an object from table name to that table's metadata"
            )
        return cls(**{k: data[k] for k in _KEYS if k in data})

    @classmethod
    def from_json(cls, path: str | os.PathLike[str]) -> DatasetMetadata:
        return cls.from_dict(read_json(path))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"tables": {n: m.to_dict() for n, m in self.tables.items()}}
        for name in ("max_groups", "max_rows"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        return out
