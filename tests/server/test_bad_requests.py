"""Bad requests to the query endpoints: each gets the documented 4xx with a message naming the
problem, and nothing happens — no debit, no spend in the ledger, no rows released, no statement
built from the request reaching the engine, the data untouched.

SQL outside the analytics subset is refused by the parser before the engine sees anything; text
inside the subset reaches the engine only as the planner's statement, whose identifiers are
quoted and whose literals are bound parameters (shown with a spy on the DuckDB cursor).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pandas as pd
import pytest

from server._api import COUNT_SQL, World, error_of, make_world

ENDPOINTS = ["query", "query/cost"]
LIMIT = 4096  # max_body_bytes of the app under test


# ------------------------------------------------------------------------------------------------
# fixtures: one world for the module (refusals change nothing — each test checks it), and a spy
# on everything the service runs on its DuckDB cursors
# ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[World, Any]]:
    world = make_world(
        tmp_path_factory.mktemp("bad"),
        grants=(("alice", "people", 1000.0, 1e-3), ("bob", "people", 1000.0, 1e-3), ("alice", "secret", 5.0, 0.0)),
        max_grant_epsilon=1000.0,
    )
    client = world.client(max_body_bytes=LIMIT)
    yield world, client
    world.close()


class _Recorder:
    """A DuckDB cursor that records each statement (and its parameters) before running it."""

    def __init__(self, cursor: Any, calls: list[tuple[str, list[Any]]]) -> None:
        self._cursor, self._calls = cursor, calls

    def execute(self, sql: str, params: Any = None) -> Any:
        self._calls.append((sql, list(params or [])))
        return self._cursor.execute(sql, params) if params is not None else self._cursor.execute(sql)

    def sql(self, sql: str, *args: Any, **kwargs: Any) -> Any:
        self._calls.append((sql, []))
        return self._cursor.sql(sql, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cursor, name)


@pytest.fixture
def engine(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, list[Any]]]:
    """Every statement the service's engines run from here on (each query gets a fresh engine
    over a recording cursor, instead of a pooled one whose statements ran earlier)."""
    from dpkit.analytics.engines.duckdb import DuckDBEngine
    from dpkit.server.catalog import _Loaded

    calls: list[tuple[str, list[Any]]] = []

    def recording(self: _Loaded, table: str) -> Any:
        return DuckDBEngine(None, connection=_Recorder(self.connection.cursor(), calls), table=table)

    monkeypatch.setattr(_Loaded, "take", recording)
    return calls


def _schema_read(sql: str) -> bool:
    """The statements a refused query may cause, none of which reads a row: reading the table's
    schema (``LIMIT 0``), and the session's typed view over the declared columns (a view is a
    definition; nothing is scanned until a query selects from it)."""
    if sql.startswith("SELECT * FROM ") and sql.endswith(" LIMIT 0") and "WHERE" not in sql:
        return True
    return sql.startswith("CREATE OR REPLACE TEMP VIEW ") and " AS SELECT " in sql and "WHERE" not in sql


# ------------------------------------------------------------------------------------------------
# the cases
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    id: str
    body: Any  # a JSON-able object, or bytes sent as they are
    needles: tuple[str, ...]  # each must appear in the message (case-insensitive)
    status: int = 400
    code: str = "invalid_request"
    parameter: str | None = None  # the "parameter" the error names, when it names one
    dataset: str = "people"

    def __str__(self) -> str:
        return self.id


def q(sql: str, epsilon: Any = 0.5, **extra: Any) -> dict[str, Any]:
    return {"epsilon": epsilon, "sql": sql, **extra}


def spec(query: Any, epsilon: Any = 0.5, **extra: Any) -> dict[str, Any]:
    return {"epsilon": epsilon, "query": query, **extra}


def raw_epsilon(text: str) -> bytes:
    return b'{"epsilon": ' + text.encode() + b', "sql": "SELECT COUNT(*) FROM people"}'


SHAPE = [
    Case("malformed-json", b'{"epsilon": 0.5, "sql": ', ("not valid JSON",)),
    Case("trailing-garbage", b'{"epsilon": 0.5, "sql": "SELECT COUNT(*) FROM people"} x', ("not valid JSON",)),
    Case("json-array", b"[1, 2, 3]", ("object",), parameter="body"),
    Case("json-string", json.dumps(COUNT_SQL).encode(), ("object",), parameter="body"),
    Case("json-null", b"null", ("object",), parameter="body"),
    Case("empty-body", b"", ("missing", "body"), parameter="body"),
    Case("unknown-field", q(COUNT_SQL, limit=10), ("unknown field", "limit"), parameter="limit"),
    Case("unknown-field-analyst", q(COUNT_SQL, analyst="bob"), ("unknown field", "analyst"), parameter="analyst"),
    Case("epsilon-string", q(COUNT_SQL, epsilon="0.5"), ("epsilon",), parameter="epsilon"),
    Case("epsilon-bool", q(COUNT_SQL, epsilon=True), ("epsilon",), parameter="epsilon"),
    Case("epsilon-null", q(COUNT_SQL, epsilon=None), ("epsilon",), parameter="epsilon"),
    Case("epsilon-missing", {"sql": COUNT_SQL}, ("missing field", "epsilon"), parameter="epsilon"),
    Case("sql-number", q(123), ("sql",), parameter="sql"),
    Case("sql-blank", q("   "), ("sql",), parameter="sql"),
    Case("query-not-object", spec("SELECT COUNT(*) FROM people"), ("query",), parameter="query"),
    Case(
        "sql-and-query",
        {"epsilon": 0.5, "sql": COUNT_SQL, "query": {"aggregates": [{"kind": "count"}]}},
        ("exactly one of 'sql' and 'query'",),
        parameter="query",
    ),
]

AMOUNTS = [
    Case("epsilon-0", q(COUNT_SQL, epsilon=0), ("epsilon", "> 0"), parameter="epsilon"),
    Case("epsilon-negative", q(COUNT_SQL, epsilon=-1), ("epsilon", "> 0"), parameter="epsilon"),
    Case("epsilon-tiny-negative", q(COUNT_SQL, epsilon=-5e-324), ("epsilon", "> 0"), parameter="epsilon"),
    Case("epsilon-NaN", raw_epsilon("NaN"), ("epsilon", "finite"), parameter="epsilon"),
    Case("epsilon-Infinity", raw_epsilon("Infinity"), ("epsilon", "finite"), parameter="epsilon"),
    Case("epsilon-minus-Infinity", raw_epsilon("-Infinity"), ("epsilon", "finite"), parameter="epsilon"),
    Case("epsilon-1e400", raw_epsilon("1e400"), ("epsilon", "finite"), parameter="epsilon"),
    Case("delta-1", q(COUNT_SQL, delta=1), ("delta", "[0, 1)"), parameter="delta"),
    Case("delta-1.5", q(COUNT_SQL, delta=1.5), ("delta",), parameter="delta"),
    Case("delta-negative", q(COUNT_SQL, delta=-0.1), ("delta", "[0, 1)"), parameter="delta"),
    Case(
        "delta-NaN",
        b'{"epsilon": 0.5, "delta": NaN, "sql": "SELECT COUNT(*) FROM people"}',
        ("delta",),
        parameter="delta",
    ),
    Case("confidence-1.5", q(COUNT_SQL, confidence=1.5), ("confidence",), parameter="confidence"),
    Case("noise-unknown", q(COUNT_SQL, noise="cauchy"), ("noise", "laplace"), parameter="noise"),
    Case("split-wrong-length", q(COUNT_SQL, split=[1, 2]), ("split",), parameter="split"),
    Case("key-selection-unknown", q(COUNT_SQL, key_selection="x"), ("key_selection",), parameter="key_selection"),
]

SCHEMA = [
    Case("unknown-dataset", q(COUNT_SQL), ("nosuch",), status=404, code="not_found", dataset="nosuch"),
    Case(
        "dataset-name-injection",
        q(COUNT_SQL),
        ("people;DROP", "a name of letters"),
        parameter="dataset",
        dataset="people;DROP",
    ),
    Case(
        "dataset-name-tautology",
        q(COUNT_SQL),
        ("people OR 1=1", "a name of letters"),
        parameter="dataset",
        dataset="people OR 1=1",
    ),
    Case(
        "other-table-in-from",
        q("SELECT SUM(salary) FROM secret"),
        ("secret", "the session's table 'people'"),
        parameter="sql",
    ),
    Case(
        "unknown-column-aggregate", q("SELECT AVG(height) FROM people"), ("height", "unknown column"), parameter="sql"
    ),
    Case(
        "unknown-column-where",
        q("SELECT COUNT(*) FROM people WHERE height > 3"),
        ("height", "unknown column"),
        parameter="sql",
    ),
    Case(
        "unknown-column-group-by",
        q("SELECT height, COUNT(*) FROM people GROUP BY height"),
        ("height", "unknown column"),
        parameter="sql",
    ),
    Case("avg-without-bounds", q("SELECT AVG(income) FROM people"), ("income", "declared bounds"), parameter="column"),
    Case("sum-without-bounds", q("SELECT SUM(income) FROM people"), ("income", "declared bounds"), parameter="column"),
    Case("avg-of-string", q("SELECT AVG(sex) FROM people"), ("sex", "numeric"), parameter="column"),
    Case(
        "where-literal-of-wrong-type",
        q("SELECT COUNT(*) FROM people WHERE age = 'old'"),
        ("numeric literal", "age"),
        parameter="where",
    ),
    Case(
        "private-keys-without-delta",
        q("SELECT city, COUNT(*) FROM people GROUP BY city"),
        ("delta", "city", "public"),
        parameter="delta",
    ),
    Case("count-distinct-not-unit", q("SELECT COUNT(DISTINCT age) FROM people"), ("privacy unit",), parameter="sql"),
]

INJECTION = [
    Case(
        "semicolon-drop",
        q("SELECT COUNT(*) FROM people; DROP TABLE people"),
        ("exactly one statement",),
        parameter="sql",
    ),
    Case(
        "semicolon-comment",
        q("SELECT COUNT(*) FROM people; -- DROP TABLE people"),
        ("exactly one statement",),
        parameter="sql",
    ),
    Case(
        "comment-newline-drop",
        q("SELECT COUNT(*) FROM people --\n; DROP TABLE people"),
        ("exactly one statement",),
        parameter="sql",
    ),
    Case(
        "block-comment-drop",
        q("SELECT COUNT(*) FROM people /* x */; DROP TABLE people /* y */"),
        ("exactly one statement",),
        parameter="sql",
    ),
    Case(
        "union-select", q("SELECT COUNT(*) FROM people UNION SELECT COUNT(*) FROM people"), ("Union",), parameter="sql"
    ),
    Case(
        "union-all-rows", q("SELECT COUNT(*) FROM people UNION ALL SELECT age FROM people"), ("Union",), parameter="sql"
    ),
    Case(
        "union-in-comments",
        q("SELECT COUNT(*) FROM people/**/UNION/**/SELECT COUNT(*) FROM people"),
        ("Union",),
        parameter="sql",
    ),
    Case(
        "subquery-in-where",
        q("SELECT COUNT(*) FROM people WHERE age IN (SELECT age FROM people)"),
        ("Subquery",),
        parameter="sql",
    ),
    Case(
        "scalar-subquery",
        q("SELECT COUNT(*), (SELECT COUNT(*) FROM people) FROM people"),
        ("Subquery",),
        parameter="sql",
    ),
    Case(
        "subquery-in-condition",
        q("SELECT SUM(age) FROM people WHERE sex = 'F' AND (SELECT 1) = 1"),
        ("Subquery",),
        parameter="sql",
    ),
    Case("subquery-in-from", q("SELECT COUNT(*) FROM (SELECT * FROM people)"), ("no subqueries",), parameter="sql"),
    Case("cte", q("WITH x AS (SELECT * FROM people) SELECT COUNT(*) FROM x"), ("WITH",), parameter="sql"),
    Case(
        "tautology-strings",
        q("SELECT COUNT(*) FROM people WHERE sex = '' OR '1'='1'"),
        ("column on one side",),
        parameter="sql",
    ),
    Case(
        "tautology-numbers",
        q("SELECT COUNT(*) FROM people WHERE sex = 'F' OR 1=1"),
        ("column on one side",),
        parameter="sql",
    ),
    Case("tautology-true", q("SELECT COUNT(*) FROM people WHERE age > 1 OR TRUE"), ("Boolean",), parameter="sql"),
    Case(
        "quoted-identifier-drop",
        q('SELECT AVG("age"; DROP TABLE people) FROM people'),
        ("does not parse",),
        parameter="sql",
    ),
    Case(
        "quoted-identifier-is-a-name",
        q('SELECT COUNT(*) FROM people WHERE "age""; DROP TABLE people; --" > 3'),
        ("unknown column", "DROP TABLE people"),
        parameter="sql",
    ),
    Case(
        "quoted-table-is-a-name",
        q('SELECT COUNT(*) FROM "people; DROP TABLE people"'),
        ("the session's table 'people'",),
        parameter="sql",
    ),
    Case(
        "read-csv-in-from",
        q("SELECT COUNT(*) FROM read_csv('/etc/passwd')"),
        ("no table functions such as read_csv",),
        parameter="sql",
    ),
    Case("file-in-from", q("SELECT COUNT(*) FROM 'people.csv'"), ("the session's table 'people'",), parameter="sql"),
    Case(
        "read-csv-in-select",
        q("SELECT read_csv('/etc/passwd') FROM people"),
        ("READ_CSV", "not an accepted aggregate"),
        parameter="sql",
    ),
    Case(
        "read-csv-in-where",
        q("SELECT COUNT(*) FROM people WHERE age > read_csv('/etc/passwd')"),
        ("only literals",),
        parameter="sql",
    ),
    Case("function-in-aggregate", q("SELECT SUM(abs(age)) FROM people"), ("plain column",), parameter="sql"),
    Case("expression-in-aggregate", q("SELECT SUM(age + 1) FROM people"), ("plain column",), parameter="sql"),
    Case("copy", q("COPY people TO 'stolen.csv'"), ("only SELECT", "Copy"), parameter="sql"),
    Case("attach", q("ATTACH 'other.db' AS other"), ("only SELECT", "Attach"), parameter="sql"),
    Case("pragma", q("PRAGMA table_info('people')"), ("only SELECT", "Pragma"), parameter="sql"),
    Case("drop-table", q("DROP TABLE people"), ("only SELECT", "Drop"), parameter="sql"),
    Case("insert", q("INSERT INTO people VALUES (1, 2, 3, 'F', 'Paris')"), ("only SELECT", "Insert"), parameter="sql"),
    Case("set", q("SET threads = 1"), ("only SELECT", "Set"), parameter="sql"),
    Case("load-extension", q("LOAD httpfs"), ("only SELECT",), parameter="sql"),
    Case("call", q("CALL pragma_version()"), ("only SELECT",), parameter="sql"),
    Case("export-database", q("EXPORT DATABASE 'dump'"), ("does not parse",), parameter="sql"),
    Case("select-star", q("SELECT * FROM people"), ("SELECT * would read rows",), parameter="sql"),
    Case("bare-column", q("SELECT age FROM people"), ("neither grouped nor aggregated",), parameter="sql"),
    Case("distinct", q("SELECT DISTINCT COUNT(*) FROM people"), ("DISTINCT",), parameter="sql"),
    Case("limit", q("SELECT COUNT(*) FROM people LIMIT 1"), ("LIMIT",), parameter="sql"),
    Case("order-by", q("SELECT COUNT(*) FROM people ORDER BY 1"), ("ORDER",), parameter="sql"),
    Case(
        "having", q("SELECT sex, COUNT(*) FROM people GROUP BY sex HAVING COUNT(*) > 1"), ("HAVING",), parameter="sql"
    ),
    Case("join", q("SELECT COUNT(*) FROM people JOIN people p USING (age)"), ("JOIN",), parameter="sql"),
    Case("comma-join", q("SELECT COUNT(*) FROM people, people p2"), ("JOIN",), parameter="sql"),
    Case("schema-qualified", q("SELECT COUNT(*) FROM main.people"), ("table name only",), parameter="sql"),
    Case("window", q("SELECT SUM(age) OVER () FROM people"), ("Window",), parameter="sql"),
    Case("placeholder", q("SELECT COUNT(*) FROM people WHERE age > ?"), ("only literals",), parameter="sql"),
    Case("dollar-placeholder", q("SELECT COUNT(*) FROM people WHERE age > $1"), ("only literals",), parameter="sql"),
]

SPEC = [
    Case(
        "spec-unknown-kind",
        spec({"aggregates": [{"kind": "bogus"}]}),
        ("aggregates[0].kind", "bogus"),
        parameter="aggregates[0].kind",
    ),
    Case(
        "spec-extra-field",
        spec({"aggregates": [{"kind": "count", "extra": 1}]}),
        ("unknown field", "extra"),
        parameter="query.aggregates.0.extra",
    ),
    Case(
        "spec-extra-top-field",
        spec({"aggregates": [{"kind": "count"}], "sql": "DROP TABLE people"}),
        ("unknown field", "sql"),
        parameter="query.sql",
    ),
    Case(
        "spec-q-above-1",
        spec({"aggregates": [{"kind": "quantile", "column": "age", "q": 1.5}]}),
        ("q", "[0, 1]"),
        parameter="q",
    ),
    Case(
        "spec-q-negative",
        spec({"aggregates": [{"kind": "quantile", "column": "age", "q": -0.1}]}),
        ("q", "[0, 1]"),
        parameter="q",
    ),
    Case(
        "spec-q-NaN",
        b'{"epsilon": 0.5, "query": {"aggregates": [{"kind": "quantile", "column": "age", "q": NaN}]}}',
        ("q", "[0, 1]"),
        parameter="q",
    ),
    Case("spec-q-missing", spec({"aggregates": [{"kind": "quantile", "column": "age"}]}), ("q",), parameter="q"),
    Case(
        "spec-q-string",
        spec({"aggregates": [{"kind": "quantile", "column": "age", "q": "0.5"}]}),
        ("q",),
        parameter="query.aggregates.0.q",
    ),
    Case(
        "spec-count-with-column",
        spec({"aggregates": [{"kind": "count", "column": "age"}]}),
        ("count without column",),
        parameter="aggregates[0]",
    ),
    Case(
        "spec-mean-with-q",
        spec({"aggregates": [{"kind": "mean", "column": "age", "q": 0.5}]}),
        ("no q for mean",),
        parameter="aggregates[0].q",
    ),
    Case("spec-no-aggregates", spec({"aggregates": []}), ("aggregates", "at least 1"), parameter="query.aggregates"),
    Case(
        "spec-too-many-aggregates",
        spec({"aggregates": [{"kind": "count"}] * 33}),
        ("aggregates", "at most 32"),
        parameter="query.aggregates",
    ),
    Case(
        "spec-unknown-column",
        spec({"aggregates": [{"kind": "mean", "column": "height"}]}),
        ("height", "unknown column"),
        parameter="column",
    ),
    Case(
        "spec-mean-without-bounds",
        spec({"aggregates": [{"kind": "mean", "column": "income"}]}),
        ("income", "declared bounds"),
        parameter="column",
    ),
    Case(
        "spec-keys-without-group-by",
        spec({"aggregates": [{"kind": "count"}], "keys": [["F"]]}),
        ("group_by",),
        parameter="keys",
    ),
    Case("spec-group-by-unknown", spec({"aggregates": [{"kind": "count"}], "group_by": ["nope"]}), ("nope",)),
    Case(
        "spec-bins-on-string",
        spec({"aggregates": [{"kind": "count"}], "group_by": ["sex"], "bins": {"sex": [1, 2]}}),
        ("bins", "numeric"),
        parameter="bins['sex']",
    ),
    Case(
        "spec-where-two-statements",
        spec({"aggregates": [{"kind": "count"}], "where": "age > 1; DROP TABLE people"}),
        ("exactly one statement",),
        parameter="where",
    ),
    Case(
        "spec-where-subquery",
        spec({"aggregates": [{"kind": "count"}], "where": "age IN (SELECT age FROM people)"}),
        ("list of literals",),
    ),
    Case(
        "spec-where-tautology",
        spec({"aggregates": [{"kind": "count"}], "where": "sex = 'F' OR '1'='1'"}),
        ("column on one side",),
    ),
    Case(
        "spec-where-unknown-column",
        spec({"aggregates": [{"kind": "count"}], "where": "height > 3"}),
        ("height", "unknown column"),
        parameter="where",
    ),
]

ALL = SHAPE + AMOUNTS + SCHEMA + INJECTION + SPEC


def send(client: Any, world: World, endpoint: str, body: Any, *, dataset: str = "people", who: str = "alice") -> Any:
    url = f"/v1/datasets/{dataset}/{endpoint}"
    headers = world.h(who)
    if isinstance(body, bytes):
        return client.post(url, content=body, headers={**headers, "Content-Type": "application/json"})
    return client.post(url, json=body, headers=headers)


def assert_refused(
    world: World,
    r: Any,
    before: dict[str, Any],
    n_entries: int,
    *,
    status: int,
    code: str,
    needles: tuple[str, ...] = (),
    parameter: str | None = None,
) -> dict[str, Any]:
    """The documented refusal, and nothing else happened: no debit, no spend, no rows, one entry."""
    assert r.status_code == status, (r.status_code, r.text)
    err = error_of(r)
    assert err["code"] == code, err
    for needle in needles:
        assert needle.lower() in err["message"].lower(), (needle, err["message"])
    if parameter is not None:
        assert err.get("parameter") == parameter, err
    assert "rows" not in r.json()
    assert world.snapshot() == before, "a refused request debited, spent or changed something"
    entries = world.entries()
    assert len(entries) == n_entries + 1, "a refused request must be logged exactly once"
    assert entries[-1].status == status and entries[-1].epsilon is None and entries[-1].delta is None
    assert entries[-1].outcome.startswith(code), entries[-1].outcome
    return err


# ------------------------------------------------------------------------------------------------
# the refusals
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("endpoint", ENDPOINTS)
@pytest.mark.parametrize("case", ALL, ids=str)
def test_bad_request_is_refused_and_changes_nothing(
    case: Case, endpoint: str, env: tuple[World, Any], engine: list[tuple[str, list[Any]]]
) -> None:
    world, client = env
    before, n = world.snapshot(), len(world.entries())
    r = send(client, world, endpoint, case.body, dataset=case.dataset)
    assert_refused(
        world, r, before, n, status=case.status, code=case.code, needles=case.needles, parameter=case.parameter
    )
    ran = [sql for sql, _ in engine if not _schema_read(sql)]
    assert ran == [], f"a refused request reached the engine: {ran}"


def test_case_ids_are_unique() -> None:
    ids = [c.id for c in ALL]
    assert len(ids) == len(set(ids))


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_neither_sql_nor_query_is_400(
    endpoint: str, env: tuple[World, Any], engine: list[tuple[str, list[Any]]]
) -> None:
    world, client = env
    before, n = world.snapshot(), len(world.entries())
    r = send(client, world, endpoint, {"epsilon": 0.5})
    assert_refused(
        world,
        r,
        before,
        n,
        status=400,
        code="invalid_request",
        needles=("exactly one of 'sql' and 'query'",),
        parameter="query",
    )


def test_neither_sql_nor_query_releases_nothing(env: tuple[World, Any]) -> None:
    """Whatever its status, the request with neither releases and debits nothing, and is logged."""
    world, client = env
    before, n = world.snapshot(), len(world.entries())
    r = send(client, world, "query", {"epsilon": 0.5})
    assert 400 <= r.status_code < 600 and '"rows"' not in r.text
    assert world.snapshot() == before
    assert len(world.entries()) == n + 1 and world.entries()[-1].status == r.status_code


def test_table_function_refusal_names_it(env: tuple[World, Any]) -> None:
    world, client = env
    r = send(client, world, "query", q("SELECT COUNT(*) FROM read_csv('/etc/passwd')"))
    assert r.status_code == 400
    assert "read_csv" in error_of(r)["message"].lower()


def test_budget_exceeded_is_409_and_changes_nothing(
    env: tuple[World, Any], engine: list[tuple[str, list[Any]]]
) -> None:
    world, client = env
    before, n = world.snapshot(), len(world.entries())
    remaining = world.service.ledger.get_budget("people", "alice").remaining_epsilon
    r = send(client, world, "query", q(COUNT_SQL, epsilon=remaining * 2))
    err = assert_refused(
        world, r, before, n, status=409, code="budget_exceeded", needles=("budget exceeded", "remaining")
    )
    assert err["budget"]["remaining_epsilon"] == remaining and err["budget"]["analyst"] == "alice"
    assert [sql for sql, _ in engine if not _schema_read(sql)] == []
    # the preview of the same query prices it and spends nothing
    preview = send(client, world, "query/cost", q(COUNT_SQL, epsilon=remaining * 2))
    assert (
        preview.status_code == 200
        and preview.json()["cost"]["epsilon"] == remaining * 2
        and "rows" not in preview.json()
    )
    assert world.snapshot() == before


# ------------------------------------------------------------------------------------------------
# body size
# ------------------------------------------------------------------------------------------------


def _padded(size: int) -> bytes:
    """A valid query body of exactly ``size`` bytes (padding inside an IN list)."""
    head = b'{"epsilon": 0.01, "sql": "SELECT COUNT(*) FROM people WHERE city NOT IN (\'x'
    tail = b"')\"}"
    body = head + b"x" * (size - len(head) - len(tail)) + tail
    json.loads(body)
    return body


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_oversized_body_with_content_length(
    endpoint: str, env: tuple[World, Any], engine: list[tuple[str, list[Any]]]
) -> None:
    world, client = env
    at_limit = send(client, world, "query/cost", _padded(LIMIT))
    assert at_limit.status_code == 200, at_limit.text  # the limit itself is accepted
    engine.clear()
    before, n = world.snapshot(), len(world.entries())
    r = send(client, world, endpoint, _padded(LIMIT + 1))
    assert r.request.headers["content-length"] == str(LIMIT + 1)
    assert_refused(world, r, before, n, status=413, code="too_large", needles=(f"exceeds {LIMIT} bytes",))
    assert engine == []
    before, n = world.snapshot(), len(world.entries())
    r = send(client, world, endpoint, _padded(20 * LIMIT))
    assert_refused(world, r, before, n, status=413, code="too_large")


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_oversized_body_streamed_without_length(
    endpoint: str, env: tuple[World, Any], engine: list[tuple[str, list[Any]]]
) -> None:
    world, client = env
    body = _padded(3 * LIMIT)

    def chunks() -> Iterator[bytes]:
        for i in range(0, len(body), 1000):
            yield body[i : i + 1000]

    before, n = world.snapshot(), len(world.entries())
    r = client.post(
        f"/v1/datasets/people/{endpoint}",
        content=chunks(),
        headers={**world.h("alice"), "Content-Type": "application/json"},
    )
    assert "content-length" not in r.request.headers and r.request.headers.get("transfer-encoding") == "chunked"
    assert_refused(world, r, before, n, status=413, code="too_large", needles=("exceeds",))
    assert engine == []


def test_small_streamed_body_is_accepted(env: tuple[World, Any]) -> None:
    """(The streamed 413 above is about the size: a small body streamed the same way is read.)"""
    world, client = env
    body = json.dumps(q(COUNT_SQL)).encode()
    r = client.post(
        "/v1/datasets/people/query/cost",
        content=iter([body[:10], body[10:]]),
        headers={**world.h("alice"), "Content-Type": "application/json"},
    )
    assert "content-length" not in r.request.headers
    assert r.status_code == 200, r.text


def test_bogus_content_length_is_413(env: tuple[World, Any]) -> None:
    world, client = env
    before, n = world.snapshot(), len(world.entries())
    r = client.post(
        "/v1/datasets/people/query",
        content=b"{}",
        headers={**world.h("alice"), "Content-Type": "application/json", "Content-Length": "abc"},
    )
    assert_refused(world, r, before, n, status=413, code="too_large")


# ------------------------------------------------------------------------------------------------
# literals are values, text never becomes SQL
# ------------------------------------------------------------------------------------------------


def _true_count(world: World, **where: Any) -> int:
    frame = pd.read_csv(world.people)
    mask = pd.Series(True, index=frame.index)
    for column, value in where.items():
        mask &= frame[column] == value
    return int(mask.sum())


def _statements(engine: list[tuple[str, list[Any]]]) -> list[tuple[str, list[Any]]]:
    return [(sql, params) for sql, params in engine if not _schema_read(sql)]


def test_quote_in_where_literal_is_a_bound_value(env: tuple[World, Any], engine: list[tuple[str, list[Any]]]) -> None:
    world, client = env
    r = send(client, world, "query", q("SELECT COUNT(*) FROM people WHERE sex = 'O''Brien'", epsilon=2.0))
    assert r.status_code == 200, r.text
    count = r.json()["rows"][0]["count"]
    truth = _true_count(world, sex="O'Brien")
    # ε = 2 on a count: discrete Laplace of scale 0.5, P[|noise| ≥ 20] = 2e^-40/(1 + e^-2) ≈ 7.5e-18
    assert truth > 50 and abs(count - truth) < 20
    statements = _statements(engine)
    assert len(statements) == 1
    sql, params = statements[0]
    assert "O'Brien" in params, "the literal is bound as a parameter"
    assert "Brien" not in sql, "the literal must not be spliced into the statement"
    assert '"sex"' in sql, "identifiers are quoted"


@pytest.mark.parametrize(
    "where",
    [
        "sex = 'x'' OR ''1''=''1'",  # a tautology hidden in a string
        "sex = 'F''; DROP TABLE people; --'",
        "sex = '\"sex\" IS NOT NULL'",
        "sex = 'F'' UNION SELECT age FROM people --'",
    ],
)
def test_sql_inside_a_string_literal_is_just_a_value(
    where: str, env: tuple[World, Any], engine: list[tuple[str, list[Any]]]
) -> None:
    world, client = env
    r = send(client, world, "query", q(f"SELECT COUNT(*) FROM people WHERE {where}", epsilon=2.0))
    assert r.status_code == 200, r.text
    # (scale 0.5: a false failure has probability ≈ 7.5e-18, as above)
    assert abs(r.json()["rows"][0]["count"]) < 20, "no row has this value: a count near 0, not near 300"
    ((sql, params),) = _statements(engine)
    value = where.split("= ", 1)[1][1:-1].replace("''", "'")
    assert value in params
    assert "DROP" not in sql and "UNION" not in sql and "'1'" not in sql


def test_json_spec_where_literal_is_a_bound_value(env: tuple[World, Any], engine: list[tuple[str, list[Any]]]) -> None:
    world, client = env
    body = spec(
        {"aggregates": [{"kind": "count"}], "where": "sex = 'O''Brien' OR sex = 'x'' OR ''1''=''1'"}, epsilon=2.0
    )
    r = send(client, world, "query", body)
    assert r.status_code == 200, r.text
    assert (
        abs(r.json()["rows"][0]["count"] - _true_count(world, sex="O'Brien")) < 20
    )  # scale 0.5: false failure ≈ 7.5e-18
    ((sql, params),) = _statements(engine)
    assert "O'Brien" in params and "x' OR '1'='1" in params
    assert "Brien" not in sql and "'1'" not in sql


def test_comments_are_inert(env: tuple[World, Any], engine: list[tuple[str, list[Any]]]) -> None:
    """A comment cannot cut a clause into a second statement: it is dropped by the parser, and
    what runs is the planner's statement, not the text."""
    world, client = env
    r = send(
        client, world, "query", q("SELECT COUNT(*) FROM people WHERE sex = 'F' -- ; DROP TABLE people", epsilon=2.0)
    )
    assert r.status_code == 200, r.text
    ((sql, params),) = _statements(engine)
    assert "--" not in sql and "DROP" not in sql and "F" in params
    assert abs(r.json()["rows"][0]["count"] - _true_count(world, sex="F")) < 20  # scale 0.5: false failure ≈ 7.5e-18


def test_every_attempt_leaves_the_data_intact(tmp_path: Any) -> None:
    """All the injection attempts in a row, then an ordinary query still answers from the intact
    table, and no file was written or attached."""
    world = make_world(tmp_path)
    try:
        client = world.client()
        before = world.snapshot()
        for case in INJECTION:
            body = case.body
            if isinstance(body, dict) and isinstance(body.get("sql"), str):
                body = {
                    **body,
                    "sql": body["sql"]
                    .replace("'stolen.csv'", f"'{tmp_path / 'stolen.csv'}'")
                    .replace("'other.db'", f"'{tmp_path / 'other.db'}'")
                    .replace("'dump'", f"'{tmp_path / 'dump'}'"),
                }
            r = send(client, world, "query", body, dataset=case.dataset)
            assert 400 <= r.status_code < 500 and "rows" not in r.json(), (case.id, r.text)
        assert world.snapshot() == before
        assert (
            not (tmp_path / "stolen.csv").exists()
            and not (tmp_path / "other.db").exists()
            and not (tmp_path / "dump").exists()
        )
        r = send(client, world, "query", q(COUNT_SQL, epsilon=2.0))
        assert r.status_code == 200
        assert abs(r.json()["rows"][0]["count"] - 300) < 20  # ε = 2, scale 0.5: false failure ≈ 7.5e-18
        assert world.spent("alice")[0] == pytest.approx(2.0)
        r = send(client, world, "query", q("SELECT AVG(age) FROM people", epsilon=5.0))
        assert r.status_code == 200 and math.isfinite(r.json()["rows"][0]["mean_age"])
    finally:
        world.close()


# ------------------------------------------------------------------------------------------------
# rate limits
# ------------------------------------------------------------------------------------------------


def test_rate_limit_is_per_analyst(env: tuple[World, Any]) -> None:
    world, _ = env
    client = world.client(rate=1, burst=3, max_body_bytes=LIMIT)
    alice = world.h("alice")
    for _ in range(3):
        assert client.get("/v1/me", headers=alice).status_code == 200
    before, n = world.snapshot(), len(world.entries())
    r = client.post("/v1/datasets/people/query", headers=alice, json=q(COUNT_SQL))
    assert r.status_code == 429, r.text
    err = error_of(r)
    assert (
        err["code"] == "rate_limited"
        and "too many requests from 'alice'" in err["message"]
        and "retry" in err["message"]
    )
    retry = r.headers.get("retry-after")
    assert retry is not None and retry.isdigit() and 1 <= int(retry) <= 2
    # Nothing happened, and the 429 is counted per principal, not chained (test_refusals.py).
    assert world.snapshot() == before and len(world.entries()) == n
    assert client.app.state.refusals.total("principal_rate_limited:alice") == 1
    # others are unaffected: their own buckets (of 3 requests each)
    for who in ("bob", "curator"):
        for _ in range(2):
            assert client.get("/v1/me", headers=world.h(who)).status_code == 200, who
    assert client.post("/v1/datasets/people/query", headers=world.h("bob"), json=q(COUNT_SQL)).status_code == 200
    assert client.get("/v1/audit", headers=world.h("curator")).status_code == 200
    # requests without a valid key do not use alice's bucket, and are still refused as 401
    assert client.get("/v1/me").status_code == 401
    # alice is served again after Retry-After
    time.sleep(int(retry) + 0.05)
    assert client.get("/v1/me", headers=alice).status_code == 200


def test_rate_limit_applies_to_every_endpoint(env: tuple[World, Any]) -> None:
    world, _ = env
    client = world.client(rate=1, burst=3)
    bob = world.h("bob")
    statuses = [
        client.post("/v1/datasets/people/query/cost", headers=bob, json=q(COUNT_SQL)).status_code for _ in range(3)
    ]
    assert statuses == [200, 200, 200]
    for method, path in (
        ("GET", "/v1/budgets"),
        ("GET", "/v1/history"),
        ("GET", "/v1/datasets"),
        ("POST", "/v1/datasets/people/query"),
    ):
        kwargs = {"json": q(COUNT_SQL)} if method == "POST" else {}
        r = client.request(method, path, headers=bob, **kwargs)
        assert r.status_code == 429 and "retry-after" in r.headers, (path, r.text)


@pytest.mark.parametrize("content_type", [None, "application/x-www-form-urlencoded", "text/plain"])
def test_a_body_without_the_json_content_type_says_which_header_to_send(
    env: tuple[World, Any], content_type: str | None
) -> None:
    """What `curl -d '{...}'` sends (a form): the answer names the missing header, refused like
    any other bad body (nothing debited, one audit entry)."""
    world, client = env
    before, n = world.snapshot(), len(world.entries())
    headers = {**world.h("alice"), **({"Content-Type": content_type} if content_type else {})}
    body = b'{"epsilon": 0.5, "sql": "SELECT COUNT(*) FROM people"}'
    r = client.post("/v1/datasets/people/query", content=body, headers=headers)
    assert_refused(
        world,
        r,
        before,
        n,
        status=400,
        code="invalid_request",
        needles=("Content-Type: application/json",),
        parameter="Content-Type",
    )
    ok = client.post(
        "/v1/datasets/people/query/cost", content=body, headers={**world.h("alice"), "Content-Type": "application/json"}
    )
    assert ok.status_code == 200, ok.text  # the same bytes with the header are a query
