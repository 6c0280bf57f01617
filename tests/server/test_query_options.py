"""The spending options of a query are written once, in dpkit.analytics.spec.QueryOptions: the
HTTP body, the service's request and what reaches the session all follow it."""

from __future__ import annotations

import dataclasses

import pytest

pytest.importorskip("fastapi")

from dpkit.analytics.spec import QueryOptions  # noqa: E402
from dpkit.server.queries import OPTION_NAMES, QueryRequest, query_options  # noqa: E402
from dpkit.server.routes.queries import QueryBody  # noqa: E402


def test_the_option_names_are_those_of_query_options() -> None:
    assert tuple(f.name for f in dataclasses.fields(QueryOptions)) == OPTION_NAMES
    assert set(OPTION_NAMES) <= set(QueryBody.model_fields)
    assert set(OPTION_NAMES) <= {f.name for f in dataclasses.fields(QueryRequest)}


def test_the_defaults_are_those_of_query_options() -> None:
    expected = {f.name: f.default for f in dataclasses.fields(QueryOptions) if f.default is not dataclasses.MISSING}
    assert {n: QueryBody.model_fields[n].default for n in expected} == expected
    assert {f.name: f.default for f in dataclasses.fields(QueryRequest) if f.name in expected} == expected
    assert QueryBody.model_fields["epsilon"].is_required()


def test_the_body_reaches_the_session_with_every_option() -> None:
    body = QueryBody.model_validate({"epsilon": 0.5, "sql": "SELECT COUNT(*) FROM people", "split": [1, 2]})
    request = body.request()
    assert request.split == (1, 2) and request.delta == QueryOptions.delta
    assert query_options(request) == {
        "epsilon": 0.5,
        "delta": 0.0,
        "noise": "laplace",
        "confidence": 0.95,
        "key_selection": "truncated_geometric",
        "split": (1, 2),
    }
    assert "split" not in query_options(QueryRequest(epsilon=0.5, sql="SELECT COUNT(*) FROM people"))
    # what the session receives is accepted by QueryOptions as it stands
    assert QueryOptions(**query_options(request)).split == (1, 2)
