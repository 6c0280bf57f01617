"""``dpkit.client`` against a live curator service: a real uvicorn server on a loopback port in
front of a world of ``server/_api.py`` (one per module), reached over HTTP by the client.

The answers are not held to their fixed times here (the functional settings of the service's
own tests, ``UNPACED``); the pacing is the service's and is tested there.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

pytest.importorskip("fastapi", reason="the server extra (FastAPI) is not installed")

from _live_server import live_server  # noqa: E402
from client._proxy import Seen, lossy_proxy  # noqa: E402
from dpkit.analytics.results import QueryCost, QueryResult  # noqa: E402
from dpkit.client import Connection, ConnectionFailedError, RemoteSession, SyntheticTable, connect  # noqa: E402
from dpkit.client.results import query_result  # noqa: E402
from dpkit.errors import AuthError, BudgetExceededError, InvalidParameterError, LimitExceededError  # noqa: E402
from dpkit.server import NotFoundError  # noqa: E402
from server._api import World, make_world  # noqa: E402

SQL = "SELECT sex, COUNT(*), AVG(age) FROM people GROUP BY sex"
COUNT = "SELECT COUNT(*) FROM people"


@dataclass
class Live:
    world: World
    base: str

    def key(self, name: str, epsilon: float = 10.0, delta: float = 1e-5) -> str:
        """The key of a new analyst granted (ε, δ) on ``people``."""
        _, key = self.world.service.create_principal(name, "analyst")
        self.world.service.grant(name, "people", epsilon=epsilon, delta=delta)
        return key

    def analyst(self, name: str, epsilon: float = 10.0, delta: float = 1e-5) -> RemoteSession:
        """A new analyst granted (ε, δ) on ``people``, connected to the service."""
        return connect(self.base, self.key(name, epsilon, delta))

    def spends(self, analyst: str) -> list[Any]:
        return self.world.service.ledger.list_spends("people", analyst)


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    world = make_world(tmp_path_factory.mktemp("client"))
    try:
        with live_server(world.app()) as base:
            yield Live(world, base)
    finally:
        world.close()


def test_the_session_lists_what_the_analyst_may_see(live: Live) -> None:
    s = connect(live.base, live.world.keys["alice"])
    assert (s.analyst, s.role) == ("alice", "analyst") and live.world.keys["alice"] not in repr(s)
    assert sorted(d["name"] for d in s.datasets()) == ["people", "secret"]
    assert s.dataset("people")["columns"]["age"] == {"type": "numeric", "lower": 0, "upper": 100}
    b = s.budget("secret")
    assert (b.epsilon, b.delta, b.analyst) == (5.0, 0.0, "alice") and s.remaining("secret") == 5.0
    with pytest.raises(NotFoundError, match="nope"):
        s.budget("nope")


def test_sql_returns_the_query_result_a_local_session_does(live: Live, monkeypatch: pytest.MonkeyPatch) -> None:
    s = live.analyst("carla")
    cost = s.cost("people", SQL, epsilon=1.0)
    assert isinstance(cost, QueryCost) and cost.epsilon == 1.0 and cost.text == SQL
    assert live.spends("carla") == []  # a preview spends nothing
    r = s.sql("people", SQL, epsilon=1.0)
    assert isinstance(r, QueryResult) and r.event == cost.event
    (spend,) = live.spends("carla")
    assert r.spend_id == spend.id and spend.event == r.event and r.remaining_epsilon == 9.0
    assert r.groups == ("sex",) and list(r.table.columns) == [
        "sex", "count", "count_low", "count_high", "mean_age", "mean_age_low", "mean_age_high",
    ]  # fmt: skip
    count, mean = r.aggregates
    assert mean.kind == "mean" and len(mean.scales) == len(r.table) and mean.is_ratio
    assert str(r).startswith("QueryResult(ε=1") and "remaining ε: 9" in str(r)
    assert "dpkit-query-result" in r._repr_html_() and list(r["count"].index) == r.table["sex"].tolist()
    monkeypatch.setenv("MPLBACKEND", "Agg")
    assert r.plot().get_ylabel() == "count"
    # The rebuilt result says exactly what the service sent: its dict is the answer's.
    again = query_result(json.loads(json.dumps(r.to_dict())) | {"budget": {"remaining_epsilon": 9.0}})
    assert again.to_dict() == r.to_dict() and str(again) == str(r)


def test_refusals_are_the_local_errors_and_spend_nothing(live: Live) -> None:
    s = live.analyst("dan", epsilon=0.5)
    with pytest.raises(BudgetExceededError, match="privacy budget exceeded") as exceeded:
        s.sql("people", COUNT, epsilon=1.0)
    assert exceeded.value.problem["budget"]["remaining_epsilon"] == 0.5  # type: ignore[attr-defined]
    assert exceeded.value.status == 409 and exceeded.value.remaining.startswith("ε=0.5")  # type: ignore[attr-defined]
    with pytest.raises(NotFoundError, match="'secret'"):
        s.sql("secret", "SELECT COUNT(*) FROM secret", epsilon=0.1)  # not granted to dan
    with pytest.raises(InvalidParameterError, match="epsilon") as bad:
        s.sql("people", COUNT, epsilon=-1.0)
    assert bad.value.name == "epsilon"
    with pytest.raises(LimitExceededError) as limit:
        s.sql("people", f"SELECT COUNT(*) FROM people WHERE {'(' * 40}age > 1{')' * 40}", epsilon=0.1)
    assert limit.value.setting == "max_query_depth" and limit.value.status == 400  # type: ignore[attr-defined]
    with pytest.raises(InvalidParameterError, match="epsilon"):
        s.cost("people", COUNT, epsilon=math.nan)  # refused here: JSON has no NaN
    assert live.spends("dan") == []


def test_a_bad_key_is_an_auth_error_and_a_missing_one_names_the_variable(
    live: Live, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(AuthError) as refused:
        connect(live.base, "dpk_" + "x" * 43)
    assert refused.value.status == 401  # type: ignore[attr-defined]
    monkeypatch.delenv("DPKIT_API_KEY", raising=False)
    with pytest.raises(InvalidParameterError, match="DPKIT_API_KEY") as missing:
        connect(live.base)
    assert missing.value.name == "key"
    monkeypatch.setenv("DPKIT_API_KEY", live.world.keys["bob"])
    assert connect(live.base).analyst == "bob"
    with pytest.raises(InvalidParameterError, match="allow_insecure"):
        connect("http://192.0.2.1:8000", "dpk_x")  # the key would cross the network in clear


def test_a_published_synthetic_table_is_downloaded_for_free(live: Live) -> None:
    live.world.service.allow_publish("alice")
    alice = connect(live.base, live.world.keys["alice"])
    before = live.world.spent("alice")
    table = alice.synthesize(
        "people", epsilon=1.0, delta=1e-6, columns=["age", "sex"], bins={"age": 4}, rows=40, method="mst",
        publish="people_synthetic",
    )  # fmt: skip
    assert isinstance(table, SyntheticTable) and table.table.shape == (40, 2) and table.name == "people_synthetic"
    assert table.epsilon == 1.0 and table.budget is not None and table.budget.spent_epsilon == before[0] + 1.0
    assert "people_synthetic" in str(table) and table.report["method"] == "mst"
    bob = connect(live.base, live.world.keys["bob"])
    assert [r["name"] for r in bob.releases()] == ["people_synthetic"]
    spent = live.world.spent("bob")
    got = bob.release("people_synthetic")
    assert got.table.equals(table.table) and got.epsilon is None and live.world.spent("bob") == spent


def first_of_each_key() -> Callable[[Seen], bool]:
    """A proxy rule: lose the answer to the first paid query sent under each Idempotency-Key
    (and to the first sent without one)."""
    keys: set[str | None] = set()

    def drop(s: Seen) -> bool:
        key = s.headers.get("idempotency-key")
        if s.method != "POST" or not s.path.endswith("/query") or key in keys:
            return False
        keys.add(key)
        return True

    return drop


def test_a_lost_answer_is_asked_again_under_the_same_key(live: Live) -> None:
    """The proxy drops the first answer to each paid query; the client sends the same body
    again with the same Idempotency-Key, and the next call has a fresh key."""
    key = live.key("erin")
    with lossy_proxy(live.base, first_of_each_key()) as (url, seen):
        s = connect(url, key, backoff=0.0)
        s.sql("people", COUNT, epsilon=0.5)
        s.sql("people", COUNT, epsilon=0.5)
    paid = [x for x in seen if x.path.endswith("/query")]
    assert [x.dropped for x in paid] == [True, False, True, False]
    keys = [x.headers["idempotency-key"] for x in paid]
    assert keys[0] == keys[1] and keys[2] == keys[3] and keys[0] != keys[2] and len(keys[0]) >= 16


def test_a_retried_paid_query_is_debited_once(live: Live) -> None:
    """The service side of the retry: the repeated request is answered with the first answer
    (``Idempotent-Replayed: true``) and debited once. When every answer is lost the error
    carries the key, and a call under it later gets the first answer, still debited once."""
    key = live.key("frank")
    with lossy_proxy(live.base, first_of_each_key()) as (url, seen):
        r = connect(url, key, backoff=0.0).sql("people", COUNT, epsilon=0.25)
    paid = [x for x in seen if x.path.endswith("/query")]
    assert len(paid) == 2 and paid[1].answer_headers.get("idempotent-replayed") == "true"
    (spend,) = live.spends("frank")
    assert spend.id == r.spend_id
    # The power check: the same lost answer, retried without the key, is paid twice.
    with lossy_proxy(live.base, first_of_each_key()) as (url, seen):
        Connection(url, live.key("gus"), backoff=0.0).post("/v1/datasets/people/query", {"epsilon": 0.25, "sql": COUNT})
    assert len(live.spends("gus")) == 2

    with lossy_proxy(live.base, lambda s: s.path.endswith("/query")) as (url, seen):
        lossy = connect(url, key, retries=1, backoff=0.0)
        with pytest.raises(ConnectionFailedError, match="after 2 tries") as lost:
            lossy.sql("people", COUNT, epsilon=0.25)
    paid = [x for x in seen if x.path.endswith("/query")]
    assert len(paid) == 2 and lost.value.idempotency_key == paid[0].headers["idempotency-key"]
    first = connect(live.base, key).sql("people", COUNT, epsilon=0.25, idempotency_key=lost.value.idempotency_key)
    assert [x.id for x in live.spends("frank")] == [spend.id, first.spend_id]


def test_dpkit_query_server_asks_the_service(live: Live, monkeypatch: pytest.MonkeyPatch) -> None:
    """``dpkit query --server URL DATASET SQL``: the key from DPKIT_API_KEY, the answer shown as
    a local query's, the budget the service's."""
    from typer.testing import CliRunner

    from dpkit.cli import app

    monkeypatch.setenv("DPKIT_API_KEY", live.key("hank"))
    run = CliRunner().invoke(app, ["query", "--server", live.base, "people", SQL, "--epsilon", "0.5"])
    assert run.exit_code == 0, run.output
    assert "mean_age" in run.output and f"budget people/hank at {live.base}: spent ε=0.5 of 10" in run.output
    run = CliRunner().invoke(app, ["query", "--server", live.base, "people", COUNT, "--epsilon", "0.5", "--json"])
    answer = json.loads(run.stdout)
    assert answer["budget"]["spent_epsilon"] == 1.0 and answer["spend_id"] == live.spends("hank")[-1].id
    run = CliRunner().invoke(app, ["query", "--server", live.base, "people", COUNT, "--epsilon", "9.5"])
    assert run.exit_code == 1 and "privacy budget exceeded" in run.output
    run = CliRunner().invoke(app, ["query", "--server", live.base, "people", COUNT, "--epsilon", "1", "--seed", "1"])
    assert run.exit_code == 1 and "--seed: not with --server" in run.output
    monkeypatch.delenv("DPKIT_API_KEY")
    run = CliRunner().invoke(app, ["query", "--server", live.base, "people", COUNT, "--epsilon", "1"])
    assert run.exit_code == 1 and "DPKIT_API_KEY" in run.output
    assert len(live.spends("hank")) == 2
