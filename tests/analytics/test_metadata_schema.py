"""The published JSON Schema of the metadata file (docs/metadata.schema.json) and the loader
agree: what the schema accepts in the corpus below the loader accepts (or refuses for a rule the
schema cannot state, listed), and what the schema refuses the loader refuses too, naming the key."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from dpkit.analytics import Metadata
from dpkit.errors import InvalidParameterError

jsonschema = pytest.importorskip("jsonschema")

SCHEMA = json.loads((Path(__file__).resolve().parents[2] / "docs" / "metadata.schema.json").read_text(encoding="utf-8"))
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)

VALID: list[dict[str, Any]] = [
    {"columns": {}},
    {"privacy_unit": "person_id", "columns": {"age": {"type": "numeric", "lower": 18, "upper": 90}}},
    {"row_level": True, "columns": {"x": {"type": "numeric"}}},
    {"row_level": True, "max_groups": 2, "max_rows": 3, "strip_strings": False, "columns": {}},
    {"columns": {"sex": {"type": "categorical", "categories": ["F", "M"]}}},
    {"columns": {"zip": {"type": "categorical", "value_type": "integer"}}},
    {"columns": {"flag": {"type": "categorical", "categories": [True, False]}}},
    {"columns": {"edu": {"type": "categorical"}}},
    {"columns": {"n": {"type": "numeric", "lower": -1.5, "upper": 2.5e6}}},
]

# (document, the key the loader's error names)
INVALID: list[tuple[dict[str, Any], str]] = [
    ({"columns": {}, "unit": "person_id"}, "metadata"),
    ({"columns": {"a": {"type": "text"}}}, "columns.a.type"),
    ({"columns": {"a": {"type": "numeric", "lower": 0}}}, "bounds"),
    ({"columns": {"a": {"type": "numeric", "lower": 0, "upper": 1, "unit": "s"}}}, "columns.a"),
    ({"columns": {"a": {"type": "categorical", "categories": []}}}, "categories"),
    ({"columns": {"a": {"type": "categorical", "categories": ["x", "x"]}}}, "categories"),
    ({"columns": {"a": {"type": "categorical", "value_type": "float"}}}, "value_type"),
    ({"columns": {"a": {"type": "categorical", "categories": [1.5]}}}, "categories"),
    ({"columns": {"a": "numeric"}}, "columns.a"),
    ({"columns": {}, "max_rows": 0}, "max_rows"),
    ({"columns": {}, "row_level": "yes"}, "row_level"),
    ({"columns": {}, "privacy_unit": "id", "row_level": True}, "row_level"),
]


def _loader_error(doc: dict[str, Any]) -> InvalidParameterError | None:
    try:
        Metadata.from_dict(doc)
    except InvalidParameterError as exc:
        return exc
    return None


@pytest.mark.parametrize("doc", VALID, ids=lambda d: json.dumps(d)[:60])
def test_the_schema_and_the_loader_accept_the_same_valid_files(doc: dict[str, Any]) -> None:
    assert list(VALIDATOR.iter_errors(doc)) == []
    assert _loader_error(doc) is None
    assert list(VALIDATOR.iter_errors(Metadata.from_dict(doc).to_dict())) == []  # what to_dict writes validates


@pytest.mark.parametrize(("doc", "key"), INVALID, ids=lambda x: json.dumps(x)[:60] if isinstance(x, dict) else x)
def test_what_the_schema_refuses_the_loader_refuses_naming_the_key(doc: dict[str, Any], key: str) -> None:
    assert list(VALIDATOR.iter_errors(doc)) != []
    exc = _loader_error(doc)
    assert exc is not None and re.search(re.escape(key), exc.name or ""), (exc, key)


def test_rules_only_the_loader_states() -> None:
    # Beyond what JSON Schema can say: bound magnitudes, categories matching value_type. The
    # schema accepts these; the loader refuses them (the schema is never the stricter of the two).
    for doc in (
        {"columns": {"a": {"type": "numeric", "lower": 0, "upper": 2.0**61}}},
        {"columns": {"a": {"type": "categorical", "categories": ["x"], "value_type": "integer"}}},
    ):
        assert list(VALIDATOR.iter_errors(doc)) == []
        assert _loader_error(doc) is not None


def test_the_docs_example_validates() -> None:
    text = (Path(__file__).resolve().parents[2] / "docs" / "metadata.md").read_text(encoding="utf-8")
    block = text.split("```json", 1)[1].split("```", 1)[0]
    doc = json.loads(block)
    assert list(VALIDATOR.iter_errors(doc)) == [] and _loader_error(doc) is None
