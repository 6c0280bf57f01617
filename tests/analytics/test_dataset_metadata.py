"""DatasetMetadata: the declared schema of a dataset of several tables, and the join fields of a
table's Metadata (``public``, ``max_matches``, ``join_rows``). Every refusal names the parameter
and the value, and happens when the metadata is built — before any data is opened."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

import dpkit as dp
from dpkit.analytics import Categorical, DatasetMetadata, Metadata, Numeric
from dpkit.errors import InvalidParameterError

VISITS = Metadata(columns={"postcode": Categorical(), "cost": Numeric(0, 100)}, privacy_unit="pid", join_rows=3)
PRESCRIPTIONS = Metadata(columns={"drug": Categorical()}, privacy_unit="patient", join_rows=2)
REGIONS = Metadata(columns={"postcode": Categorical(), "region": Categorical()}, public=True, max_matches=1)

JSON = {
    "max_groups": 2,
    "max_rows": 10,
    "tables": {
        "visits": {
            "privacy_unit": "pid",
            "join_rows": 3,
            "columns": {"postcode": {"type": "categorical"}, "cost": {"type": "numeric", "lower": 0, "upper": 100}},
        },
        "regions": {
            "public": True,
            "max_matches": 1,
            "columns": {"postcode": {"type": "categorical"}, "region": {"type": "categorical"}},
        },
    },
}


def test_what_a_dataset_declares() -> None:
    m = DatasetMetadata(tables={"visits": VISITS, "prescriptions": PRESCRIPTIONS, "regions": REGIONS}, max_rows=5)
    assert m.private_tables == ("visits", "prescriptions") and m.public_tables == ("regions",)
    assert m.unit_level and (m.max_groups, m.max_rows) == (None, 5)
    assert m.tables["visits"].join_rows == 3 and m.tables["regions"].max_matches == 1
    assert m.table("Regions") == "regions" and m.table("visits") == "visits"  # one case-insensitive match
    row_level = DatasetMetadata(tables={"people": Metadata(columns={"age": Numeric(0, 99)}, row_level=True)})
    assert not row_level.unit_level and row_level.private_tables == ("people",)
    with pytest.raises(TypeError):
        m.tables["other"] = VISITS  # type: ignore[index]  # read-only


def test_json_round_trip(tmp_path: Path) -> None:
    m = DatasetMetadata.from_dict(JSON)
    assert m.tables["visits"] == Metadata.from_dict(JSON["tables"]["visits"])
    assert m.tables["regions"].public and m.tables["regions"].max_matches == 1
    assert DatasetMetadata.from_dict(m.to_dict()) == m
    assert m.to_dict()["tables"]["regions"]["public"] is True and m.to_dict()["max_rows"] == 10
    path = tmp_path / "dataset.json"
    path.write_text(json.dumps(JSON))
    assert DatasetMetadata.from_json(path) == m
    # a table may also be given as its dict
    assert DatasetMetadata(tables={"visits": JSON["tables"]["visits"]}).tables["visits"] == m.tables["visits"]


def test_metadata_round_trips_its_join_fields() -> None:
    for meta in (VISITS, PRESCRIPTIONS, REGIONS):
        assert Metadata.from_dict(meta.to_dict()) == meta
    assert "public" not in VISITS.to_dict() and "max_matches" not in VISITS.to_dict()


BAD_DATASETS: list[tuple[str, Any, str, Any]] = [
    ("no tables", {}, "tables", "{}"),
    ("a dotted name", {"a.b": VISITS}, "tables", "'a.b'"),
    ("a name with spaces around", {" visits": VISITS}, "tables", "' visits'"),
    ("two names equal but for case", {"visits": VISITS, "Visits": PRESCRIPTIONS}, "tables", "Visits"),
    ("not a metadata", {"visits": 3}, "tables.visits", "3"),
    ("public tables only", {"regions": REGIONS}, "tables", ["regions"]),
    (
        "a private table naming nobody",
        {"visits": Metadata(columns={"cost": Numeric(0, 1)})},
        "tables.visits.privacy_unit",
        None,
    ),
    (
        "units and row-level mixed",
        {"visits": VISITS, "people": Metadata(columns={}, row_level=True)},
        "tables.people.row_level",
        True,
    ),
    (
        "a table's own contribution bound",
        {"visits": Metadata(columns={}, privacy_unit="pid", max_rows=3)},
        "tables.visits.max_rows",
        3,
    ),
]


@pytest.mark.parametrize(("case", "tables", "name", "value"), BAD_DATASETS, ids=[c[0] for c in BAD_DATASETS])
def test_a_bad_dataset_is_refused_naming_the_parameter(case: str, tables: Any, name: str, value: Any) -> None:
    with pytest.raises(InvalidParameterError) as info:
        DatasetMetadata(tables=tables)
    assert (info.value.name, info.value.value) == (name, value), str(info.value)


def test_bad_bounds_and_json_are_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidParameterError, match="max_groups"):
        DatasetMetadata(tables={"visits": VISITS}, max_groups=0)
    with pytest.raises(InvalidParameterError) as info:
        DatasetMetadata(tables={"people": Metadata(columns={}, row_level=True)}, max_rows=3)
    assert (info.value.name, info.value.value) == ("max_rows", 3)
    with pytest.raises(InvalidParameterError) as info:
        DatasetMetadata.from_dict({**JSON, "extra": 1})
    assert info.value.name == "metadata" and info.value.value == ["extra"]
    with pytest.raises(InvalidParameterError) as info:
        DatasetMetadata.from_dict({"tables": ["visits"]})
    assert info.value.name == "tables"
    with pytest.raises(InvalidParameterError) as info:
        DatasetMetadata.from_dict([])  # type: ignore[arg-type]
    assert info.value.name == "metadata"
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(InvalidParameterError) as info:
        DatasetMetadata.from_json(bad)
    assert info.value.name == "metadata" and info.value.value == str(bad)
    with pytest.raises(InvalidParameterError, match="table of the dataset"):
        DatasetMetadata(tables={"visits": VISITS}).table("nowhere")


BAD_TABLES: list[tuple[str, dict[str, Any], str, Any]] = [
    ("a public table with a unit", {"public": True, "privacy_unit": "pid"}, "privacy_unit", "pid"),
    ("a public table with join_rows", {"public": True, "join_rows": 2}, "join_rows", 2),
    ("a public table with max_rows", {"public": True, "max_rows": 2}, "max_rows", 2),
    ("a public row-level table", {"public": True, "row_level": True}, "row_level", True),
    ("a private table with max_matches", {"privacy_unit": "pid", "max_matches": 2}, "max_matches", 2),
    ("max_matches zero", {"public": True, "max_matches": 0}, "max_matches", 0),
    ("join_rows not an integer", {"privacy_unit": "pid", "join_rows": 1.5}, "join_rows", 1.5),
    ("public not a boolean", {"public": "yes"}, "public", "yes"),
]


@pytest.mark.parametrize(("case", "fields", "name", "value"), BAD_TABLES, ids=[c[0] for c in BAD_TABLES])
def test_bad_join_fields_are_refused_naming_the_parameter(
    case: str, fields: dict[str, Any], name: str, value: Any
) -> None:
    with pytest.raises(InvalidParameterError) as info:
        Metadata(columns={"x": Categorical()}, **fields)
    assert (info.value.name, info.value.value) == (name, value), str(info.value)


# -- a session over several tables ------------------------------------------------------------------------


def _data() -> dict[str, pd.DataFrame]:
    return {
        "visits": pd.DataFrame({"pid": [1, 1, 2], "postcode": ["A", "B", "A"], "cost": [1.0, 2.0, 3.0]}),
        "regions": pd.DataFrame({"postcode": ["A", "B"], "region": ["n", "s"]}),
    }


def test_a_session_takes_the_dataset_metadata_as_an_object_a_dict_or_a_file(tmp_path: Path) -> None:
    path = tmp_path / "dataset.json"
    path.write_text(json.dumps(JSON))
    for meta in (DatasetMetadata.from_dict(JSON), JSON, path, str(path)):
        s = dp.Session(_data(), metadata=meta, budget=dp.Budget(epsilon=1))
        q = s.query()  # the only private table
        assert q.table == "visits" and s.query("visits").table == "visits"
        assert q.join("regions", on="postcode")._t.tables == ("visits", "regions")


SESSION_REFUSALS: list[tuple[str, dict[str, Any], str]] = [
    ("a dict of tables with one table's metadata", {"metadata": Metadata(columns={})}, "metadata"),
    ("a unit beside the tables' own", {"privacy_unit": "pid"}, "privacy_unit"),
    ("row_level beside the tables' own", {"row_level": True}, "row_level"),
    ("a table name beside the dict's", {"table": "visits"}, "table"),
    ("an engine object", {"engine": object()}, "engine"),
]


@pytest.mark.parametrize(("case", "kwargs", "name"), SESSION_REFUSALS, ids=[c[0] for c in SESSION_REFUSALS])
def test_a_session_over_several_tables_refuses_single_table_arguments(
    case: str, kwargs: dict[str, Any], name: str
) -> None:
    args: dict[str, Any] = {"metadata": JSON, "budget": dp.Budget(epsilon=1)} | kwargs
    with pytest.raises(InvalidParameterError) as info:
        dp.Session(_data(), **args)
    assert info.value.name == name, str(info.value)


def test_the_tables_given_must_be_the_declared_ones() -> None:
    for data in ({"visits": _data()["visits"]}, {**_data(), "other": _data()["regions"]}):
        with pytest.raises(InvalidParameterError) as info:
            dp.Session(data, metadata=JSON, budget=dp.Budget(epsilon=1))
        assert info.value.name == "data"
    with pytest.raises(InvalidParameterError) as info:  # a declared column the table lacks
        dp.Session({**_data(), "regions": _data()["regions"][["postcode"]]}, metadata=JSON, budget=dp.Budget(epsilon=1))
    assert info.value.name == "metadata.columns.region"
