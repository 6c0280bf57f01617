"""The curator service without HTTP: principals and keys, datasets, grants, queries (SQL and
JSON specs), pricing, refusals that release and debit nothing, and the audit entries."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from dpkit.analytics.check_report import DataCheck
from dpkit.errors import AuthError, BudgetExceededError, InvalidDataError, InvalidParameterError
from dpkit.noise.source import SecureSource, SeededSource
from dpkit.server import JSONQuery, NotFoundError, Principal, QueryRequest, Service
from dpkit.server.keys import key_id, looks_like_key
from server._api import COUNT_SQL, PEOPLE_METADATA, SECRET_METADATA, World


def who(world: World, name: str) -> Principal:
    return world.service.authenticate(world.keys[name])


# ------------------------------------------------------------------------------------------------
# principals and keys
# ------------------------------------------------------------------------------------------------


def test_create_principal_returns_a_key_once(tmp_path: Path) -> None:
    with Service(f"sqlite:///{tmp_path / 'l.sqlite'}") as svc:
        p, key = svc.create_principal("ana.lyst@example-1", "analyst")
        assert looks_like_key(key) and p == Principal("ana.lyst@example-1", "analyst", key_id(key))
        assert svc.authenticate(key) == p
        listed = svc.principals()
        assert listed[0]["name"] == "ana.lyst@example-1" and [k["id"] for k in listed[0]["keys"]] == [key_id(key)]
        assert key not in json.dumps(listed)


def test_duplicate_principal_is_refused(world: World) -> None:
    before = world.service.principals()
    for role in ("analyst", "curator"):
        with pytest.raises(InvalidParameterError) as info:
            world.service.create_principal("alice", role)  # type: ignore[arg-type]
        assert info.value.name == "name" and "already taken" in str(info.value)
    assert world.service.principals() == before


@pytest.mark.parametrize(
    "name",
    [
        "",
        " ",
        "bad name",
        "-leading",
        ".dot",
        "a" * 65,
        "x;DROP TABLE principals",
        "o'brien",
        "naïve",
        "tab\there",
        None,
        42,
        ["alice"],
    ],
)
def test_bad_principal_names_are_refused(name: Any, world: World) -> None:
    before = world.service.principals()
    with pytest.raises(InvalidParameterError) as info:
        world.service.create_principal(name, "analyst")
    assert info.value.name == "name"
    assert world.service.principals() == before


def test_longest_principal_name_is_accepted(world: World) -> None:
    p, _ = world.service.create_principal("a" * 64, "analyst")
    assert p.name == "a" * 64


@pytest.mark.parametrize("role", ["admin", "Analyst", "", None])
def test_bad_roles_are_refused(role: Any, world: World) -> None:
    with pytest.raises(InvalidParameterError) as info:
        world.service.create_principal("zed", role)
    assert info.value.name == "role"
    assert "zed" not in [p["name"] for p in world.service.principals()]


def test_issue_and_revoke_keys(world: World) -> None:
    svc = world.service
    second = svc.issue_key("bob")
    assert second != world.keys["bob"] and svc.authenticate(second).name == "bob"
    assert svc.revoke_key(key_id(world.keys["bob"])) == [key_id(world.keys["bob"])]
    assert svc.revoke_key(key_id(world.keys["bob"])) == []
    with pytest.raises(AuthError):
        svc.authenticate(world.keys["bob"])
    assert svc.authenticate(second).key_id == key_id(second)
    assert svc.revoke_principal("bob") == [key_id(second)]
    assert svc.revoke_principal("bob") == []
    with pytest.raises(AuthError):
        svc.authenticate(second)
    third = svc.issue_key("bob")
    assert svc.authenticate(third).name == "bob"
    with pytest.raises(NotFoundError):
        svc.issue_key("nobody")
    with pytest.raises(NotFoundError):
        svc.revoke_principal("nobody")
    with pytest.raises(NotFoundError):
        svc.revoke_key("0123456789abcdef")
    for bad in ("", "bob", "0123456789ABCDEF", "0123456789abcde", None):
        with pytest.raises(InvalidParameterError):
            svc.revoke_key(bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidParameterError):
        svc.revoke_principal("")


@pytest.mark.parametrize("key", [None, "", "dpk_", "not a key", 12, b"dpk_" + b"a" * 43, "dpk_" + "a" * 43])
def test_authenticate_refuses_bad_keys(key: Any, world: World) -> None:
    with pytest.raises(AuthError):
        world.service.authenticate(key)


# ------------------------------------------------------------------------------------------------
# datasets
# ------------------------------------------------------------------------------------------------


def _register_refused(world: World, parameter: str, *args: Any, **kwargs: Any) -> InvalidParameterError:
    before = [d.name for d in world.service.datasets()]
    with pytest.raises(InvalidParameterError) as info:
        world.service.register_dataset(*args, **kwargs)
    assert info.value.name == parameter, str(info.value)
    assert [d.name for d in world.service.datasets()] == before
    return info.value


def test_register_dataset(world: World) -> None:
    info = world.service.register_dataset("people2", world.people, PEOPLE_METADATA, neighbours="replace")
    assert info.name == "people2" and Path(info.source) == world.people.absolute() and info.neighbours == "replace"
    public = info.public()
    assert "source" not in public and public["columns"]["age"] == {"type": "numeric", "lower": 0.0, "upper": 100.0}
    assert public["row_level"] is True and "check" not in public
    assert world.service.dataset("people2").metadata == info.metadata
    # the curator's data check comes with the registration (and only there: it is not stored)
    assert isinstance(info.check, DataCheck) and info.check.ok and info.check.rows == 300
    assert {c.name for c in info.check.columns} == set(PEOPLE_METADATA["columns"])
    assert world.service.dataset("people2").check is None


def test_register_reports_nonconforming_data_to_the_curator(world: World) -> None:
    """The check reads the loaded copy as queries do: values outside the declared categories and
    bounds are counted for the curator, and registration still succeeds (queries treat them by
    the declared rules)."""
    meta = {
        "row_level": True,
        "columns": {
            "age": {"type": "numeric", "lower": 0, "upper": 50},
            "sex": {"type": "categorical", "categories": ["F", "M"]},
        },
    }
    info = world.service.register_dataset("p2", world.people, meta)
    frame = pd.read_csv(world.people)
    assert info.check is not None and not info.check.ok
    assert info.check.column("age").above == int((frame.age > 50).sum())
    assert info.check.column("sex").outside_categories == int((frame.sex == "O'Brien").sum())
    assert "O'Brien" in info.check.to_text()


def test_register_refuses_metadata_without_a_privacy_unit(world: World) -> None:
    for meta in (
        {"columns": {"age": {"type": "numeric", "lower": 0, "upper": 100}}},
        {"row_level": False, "columns": {}},
    ):
        err = _register_refused(world, "metadata.privacy_unit", "p2", world.people, meta)
        assert "row_level" in str(err) and "privacy_unit" in str(err)


def test_register_with_a_privacy_unit_column(world: World) -> None:
    meta = {
        "privacy_unit": "city",
        "max_rows": 2,
        "columns": {
            "age": {"type": "numeric", "lower": 0, "upper": 100},
            "sex": {"type": "categorical", "categories": ["F", "M", "O'Brien"]},
        },
    }
    info = world.service.register_dataset("by_city", world.people, meta)
    assert info.public()["privacy_unit"] == "city"
    assert info.check is not None and info.check.unit is not None and info.check.unit.units == 3


def test_a_failing_data_check_does_not_block_registration(
    world: World, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import dpkit.server.catalog as catalog_module

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("the check broke")

    monkeypatch.setattr(catalog_module, "check_data", broken)
    with caplog.at_level(logging.ERROR, logger="dpkit.curator"):
        info = world.service.register_dataset("p2", world.people, PEOPLE_METADATA)
    assert info.check is None and world.service.dataset("p2").name == "p2"
    assert any(
        "the check broke" in (r.exc_text or "") or r.exc_info and "the check broke" in str(r.exc_info[1])
        for r in caplog.records
    )


@pytest.mark.parametrize("rng", [np.random.default_rng(0), 0, SeededSource(np.random.default_rng(1)), "secure"])
def test_a_seeded_rng_is_refused(rng: Any, tmp_path: Path) -> None:
    """Seeded noise can be replayed and subtracted: the ledger would charge for privacy not given."""
    from dpkit.server import create_app

    with pytest.raises(InvalidParameterError) as info:
        Service(f"sqlite:///{tmp_path / 'l.sqlite'}", rng=rng)
    assert info.value.name == "rng" and "replayed" in str(info.value)
    assert not (tmp_path / "l.sqlite").exists(), "nothing is created before the refusal"
    with Service(f"sqlite:///{tmp_path / 'ok.sqlite'}", rng=SecureSource()) as svc:  # the CSPRNG is accepted
        with pytest.raises(InvalidParameterError) as info:
            create_app(svc, rng=rng)
        assert info.value.name == "rng"
    with pytest.raises(InvalidParameterError) as info:
        create_app(f"sqlite:///{tmp_path / 'l2.sqlite'}", rng=rng)
    assert info.value.name == "rng" and not (tmp_path / "l2.sqlite").exists()


def test_register_parquet_and_metadata_file(world: World) -> None:
    parquet = world.dir / "people.parquet"
    pd.read_csv(world.people).to_parquet(parquet)
    meta = world.dir / "meta.json"
    meta.write_text(json.dumps(PEOPLE_METADATA))
    info = world.service.register_dataset("pq", parquet, meta)
    assert info.metadata.columns["age"].upper == 100.0


def test_register_missing_file(world: World) -> None:
    _register_refused(world, "source", "ghost", world.dir / "ghost.csv", PEOPLE_METADATA)
    _register_refused(world, "source", "ghost", world.dir, PEOPLE_METADATA)  # a directory
    _register_refused(world, "source", "ghost", "", PEOPLE_METADATA)


@pytest.mark.parametrize("suffix", [".txt", ".json", ".xlsx", ".db", ""])
def test_register_unsupported_suffix(suffix: str, world: World) -> None:
    path = world.dir / f"people{suffix}"
    path.write_bytes(world.people.read_bytes())
    _register_refused(world, "source", "odd", path, PEOPLE_METADATA)


def test_register_metadata_naming_a_missing_column(world: World) -> None:
    err = _register_refused(
        world,
        "metadata.columns.height",
        "p2",
        world.people,
        {"row_level": True, "columns": {"height": {"type": "numeric", "lower": 0, "upper": 3}}},
    )
    assert "height" in str(err)
    err = _register_refused(world, "privacy_unit", "p2", world.people, {"privacy_unit": "person", "columns": {}})
    assert "person" in str(err)


def test_numeric_metadata_on_a_text_column_is_read_by_the_declared_rule(world: World) -> None:
    """Types are never inferred from the rows: a text column declared numeric is read as numbers,
    every value that is not one becomes NULL, and the curator's check says so."""
    info = world.service.register_dataset(
        "p2", world.people, {"row_level": True, "columns": {"city": {"type": "numeric", "lower": 0, "upper": 1}}}
    )
    assert info.check is not None and not info.check.ok
    city = info.check.column("city")
    assert city.unreadable == 300 and city.conforming == 0


def test_register_bad_metadata(world: World) -> None:
    with pytest.raises(InvalidParameterError):
        world.service.register_dataset(
            "p2", world.people, {"columns": {"age": {"type": "numeric", "lower": 5, "upper": 1}}}
        )
    with pytest.raises(InvalidParameterError):
        world.service.register_dataset("p2", world.people, {"columns": {"age": {"type": "numeric"}}})
    with pytest.raises(InvalidParameterError):
        world.service.register_dataset("p2", world.people, {"privacy_unit": "nope"})
    assert "p2" not in [d.name for d in world.service.datasets()]


def test_register_duplicate_name(world: World) -> None:
    source = world.service.dataset("people").source
    err = _register_refused(world, "dataset", "people", world.secret, SECRET_METADATA)
    assert "already registered" in str(err)
    assert world.service.dataset("people").source == source


@pytest.mark.parametrize("name", ["", "1people", "bad name", "people;DROP", "a" * 64, "naïve", None])
def test_register_bad_dataset_name(name: Any, world: World) -> None:
    _register_refused(world, "dataset", name, world.people, PEOPLE_METADATA)


def test_register_unreadable_file(world: World, caplog: pytest.LogCaptureFixture) -> None:
    """The curator learns which file could not be read as what; the engine's own message (which
    may quote a row) goes to the curator's log only."""
    bad = world.dir / "bad.parquet"
    bad.write_bytes(b"not parquet at all, SECRET-BYTES")
    with caplog.at_level(logging.WARNING, logger="dpkit.curator"), pytest.raises(InvalidDataError) as info:
        world.service.register_dataset("bad", bad, {"row_level": True, "columns": {}})
    message = str(info.value)
    assert "Parquet file bad.parquet could not be read" in message and "dpkit.curator" in message
    assert str(world.dir) not in message and "SECRET" not in message and "magic" not in message.lower()
    assert any(r.name == "dpkit.curator" and "bad" in r.getMessage() for r in caplog.records)
    assert "bad" not in [d.name for d in world.service.datasets()]


def test_register_csv_with_a_bad_header(world: World) -> None:
    for header in ("age,age\n1,2\n", "age,\n1,2\n", ""):
        path = world.dir / "odd.csv"
        path.write_text(header)
        with pytest.raises(InvalidDataError, match="names every column once"):
            world.service.register_dataset("odd", path, {"row_level": True, "columns": {"age": {"type": "numeric"}}})


def test_bad_neighbours_refused(world: World) -> None:
    with pytest.raises(InvalidParameterError):
        world.service.register_dataset("p2", world.people, PEOPLE_METADATA, neighbours="sometimes")  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------------
# grants
# ------------------------------------------------------------------------------------------------


def test_grant_to_a_curator_is_refused(world: World) -> None:
    with pytest.raises(InvalidParameterError) as info:
        world.service.grant("curator", "people", epsilon=1.0)
    assert info.value.name == "analyst"
    assert [b.analyst for b in world.service.budgets()].count("curator") == 0


def test_grant_to_unknown_analyst_or_dataset(world: World) -> None:
    before = world.service.budgets()
    with pytest.raises(NotFoundError, match="nobody"):
        world.service.grant("nobody", "people", epsilon=1.0)
    with pytest.raises(NotFoundError, match="nosuch"):
        world.service.grant("bob", "nosuch", epsilon=1.0)
    assert world.service.budgets() == before


@pytest.mark.parametrize(
    ("epsilon", "delta"), [(0.0, 0.0), (-1.0, 0.0), (float("nan"), 0.0), (float("inf"), 0.0), (1.0, 1.0), (1.0, -0.1)]
)
def test_grant_bad_amounts(epsilon: float, delta: float, world: World) -> None:
    with pytest.raises(InvalidParameterError):
        world.service.grant("bob", "secret", epsilon=epsilon, delta=delta)
    assert ("secret", "bob") not in [(b.dataset, b.analyst) for b in world.service.budgets()]


def test_budgets_are_immutable(world: World) -> None:
    svc = world.service
    svc.query(who(world, "alice"), "people", QueryRequest(epsilon=1.0, sql=COUNT_SQL))
    before = svc.ledger.get_budget("people", "alice")
    for epsilon, delta in ((10.0, 1e-5), (5.0, 1e-5), (1.0, 0.0)):
        with pytest.raises(InvalidParameterError, match="never changed or replaced"):
            svc.grant("alice", "people", epsilon=epsilon, delta=delta)
    assert svc.ledger.get_budget("people", "alice") == before


def test_budgets_seen_by_each(world: World) -> None:
    svc = world.service
    assert sorted((b.dataset, b.analyst) for b in svc.budgets()) == [
        ("people", "alice"),
        ("people", "bob"),
        ("secret", "alice"),
    ]
    assert [(b.dataset, b.analyst) for b in svc.budgets(who(world, "bob"))] == [("people", "bob")]
    assert len(svc.budgets(who(world, "curator"))) == 3


# ------------------------------------------------------------------------------------------------
# queries
# ------------------------------------------------------------------------------------------------


def test_query_via_sql(world: World) -> None:
    svc = world.service
    answer = svc.query(
        who(world, "alice"),
        "people",
        QueryRequest(epsilon=2.0, sql="SELECT sex, COUNT(*) AS n, AVG(age) FROM people GROUP BY sex"),
    )
    assert answer["dataset"] == "people" and answer["groups"] == ["sex"]
    assert sorted(r["sex"] for r in answer["rows"]) == ["F", "M", "O'Brien"]  # the declared categories
    assert answer["cost"] == {"epsilon": 2.0, "delta": 0.0}
    assert answer["budget"]["spent_epsilon"] == 2.0 and answer["budget"]["remaining_epsilon"] == 8.0
    spends = svc.ledger.list_spends("people", "alice")
    assert [s.id for s in spends] == [answer["spend_id"]] and spends[0].query_text.startswith("SELECT sex")
    frame = pd.read_csv(world.people)
    count_info = next(a for a in answer["aggregates"] if a["name"] == "n")
    assert count_info["scale"] == 1.0  # ε = 1 of the 2 for the count, sensitivity 1
    for r in answer["rows"]:
        # discrete Laplace of scale 1: P[|noise| ≥ 30] = 2e^-30/(1 + e^-1) ≈ 1.4e-13 per group
        assert abs(r["n"] - (frame.sex == r["sex"]).sum()) < 30


def test_query_via_spec(world: World) -> None:
    svc = world.service
    spec = JSONQuery(
        aggregates=(
            {"kind": "count"},
            {"kind": "mean", "column": "age", "name": "avg_age"},
            {"kind": "quantile", "column": "age", "q": 0.5},
        ),
        where="sex IN ('F', 'M')",
    )
    answer = svc.query(who(world, "alice"), "people", QueryRequest(epsilon=3.0, spec=spec))
    row = answer["rows"][0]
    assert (
        set(row) >= {"count", "avg_age"} and 0 <= row["avg_age"] <= 100
    )  # released means are clamped to the declared bounds
    assert answer["cost"]["epsilon"] == pytest.approx(3.0)
    assert world.spent("alice")[0] == pytest.approx(3.0)
    text = svc.ledger.list_spends("people", "alice")[0].query_text
    assert json.loads(text)["where"] == "sex IN ('F', 'M')"


def test_query_spec_with_group_by_and_bins(world: World) -> None:
    spec = JSONQuery(aggregates=({"kind": "count"},), group_by=("age",), bins={"age": (0.0, 50.0, 100.0)})
    answer = world.service.query(who(world, "alice"), "people", QueryRequest(epsilon=1.0, spec=spec))
    assert len(answer["rows"]) == 2


def test_sql_and_spec_are_exclusive(world: World) -> None:
    alice = who(world, "alice")
    spec = JSONQuery(aggregates=({"kind": "count"},))
    for request in (QueryRequest(epsilon=1.0, sql=COUNT_SQL, spec=spec), QueryRequest(epsilon=1.0)):
        for call in (world.service.query, world.service.cost):
            with pytest.raises(InvalidParameterError) as info:
                call(alice, "people", request)
            assert info.value.name == "query"
    assert world.spent("alice") == (0.0, 0.0)


def test_curator_cannot_query(world: World) -> None:
    for call in (world.service.query, world.service.cost):
        with pytest.raises(AuthError):
            call(who(world, "curator"), "people", QueryRequest(epsilon=1.0, sql=COUNT_SQL))


def test_ungranted_dataset_is_not_found(world: World) -> None:
    bob = who(world, "bob")
    for name in ("secret", "nosuch"):
        for call in (world.service.query, world.service.cost):
            with pytest.raises(NotFoundError):
                call(bob, name, QueryRequest(epsilon=1.0, sql=f"SELECT COUNT(*) FROM {name}"))
        with pytest.raises(NotFoundError):
            world.service.dataset(name, bob)
    assert world.service.dataset("secret").name == "secret"  # the curator (no principal) sees it
    assert world.service.dataset("secret", who(world, "curator")).name == "secret"


REQUESTS = [
    QueryRequest(epsilon=0.5, sql=COUNT_SQL),
    QueryRequest(epsilon=0.7, sql="SELECT COUNT(*), SUM(age), AVG(age), STDDEV(age) FROM people WHERE city = 'Paris'"),
    QueryRequest(epsilon=0.3, sql="SELECT sex, AVG(age) FROM people GROUP BY sex"),
    QueryRequest(
        epsilon=0.4, delta=1e-6, sql="SELECT city, COUNT(*) FROM people GROUP BY city"
    ),  # private key selection
    QueryRequest(epsilon=0.6, delta=1e-6, noise="gaussian", sql="SELECT AVG(age) FROM people"),
    QueryRequest(epsilon=0.2, sql="SELECT MEDIAN(age) FROM people"),
    QueryRequest(epsilon=0.5, spec=JSONQuery(aggregates=({"kind": "variance", "column": "age"}, {"kind": "count"}))),
    QueryRequest(epsilon=0.5, split=(1.0, 3.0), sql="SELECT COUNT(*), AVG(age) FROM people"),
]


@pytest.mark.parametrize("request_", REQUESTS, ids=[r.text()[:40] for r in REQUESTS])
def test_cost_equals_the_debit_and_spends_nothing(request_: QueryRequest, world: World) -> None:
    svc = world.service
    alice = who(world, "alice")
    before = world.snapshot()
    cost = svc.cost(alice, "people", request_)
    assert world.snapshot() == before, "cost() must spend nothing"
    assert cost.text == request_.text()
    answer = svc.query(alice, "people", request_)
    spends = svc.ledger.list_spends("people", "alice")
    assert len(spends) == 1
    assert (answer["cost"]["epsilon"], answer["cost"]["delta"]) == (cost.epsilon, cost.delta)
    assert (spends[0].epsilon_cost, spends[0].delta_cost) == (cost.epsilon, cost.delta)
    assert world.spent("alice") == (cost.epsilon, cost.delta)
    assert cost.epsilon <= request_.epsilon * (1 + 1e-12) and cost.delta <= max(request_.delta, 0) * (1 + 1e-12)


def test_budget_exceeded_releases_and_debits_nothing(world: World) -> None:
    svc = world.service
    alice = who(world, "alice")
    svc.query(alice, "people", QueryRequest(epsilon=9.5, sql=COUNT_SQL))
    before = world.snapshot()
    for request in (
        QueryRequest(epsilon=0.6, sql=COUNT_SQL),
        QueryRequest(epsilon=100.0, sql="SELECT AVG(age) FROM people"),
        QueryRequest(epsilon=0.1, delta=1e-4, noise="gaussian", sql="SELECT AVG(age) FROM people"),  # δ over
    ):
        with pytest.raises(BudgetExceededError) as info:
            svc.query(alice, "people", request)
        assert "alice" in str(info.value) and "people" in str(info.value)
        assert svc.cost(alice, "people", request).epsilon > 0  # the preview still prices it
    assert world.snapshot() == before
    exact = svc.query(alice, "people", QueryRequest(epsilon=0.5, sql=COUNT_SQL))  # exactly the rest
    assert exact["budget"]["remaining_epsilon"] == 0.0
    with pytest.raises(BudgetExceededError):
        svc.query(alice, "people", QueryRequest(epsilon=1e-9, sql=COUNT_SQL))


def test_refused_queries_debit_nothing(world: World) -> None:
    svc = world.service
    alice = who(world, "alice")
    before = world.snapshot()
    bad = [
        QueryRequest(epsilon=0.0, sql=COUNT_SQL),
        QueryRequest(epsilon=float("nan"), sql=COUNT_SQL),
        QueryRequest(epsilon=1.0, delta=1.0, sql=COUNT_SQL),
        QueryRequest(epsilon=1.0, sql="SELECT AVG(income) FROM people"),
        QueryRequest(epsilon=1.0, sql="SELECT AVG(height) FROM people"),
        QueryRequest(epsilon=1.0, sql="SELECT COUNT(*) FROM people; DROP TABLE people"),
        QueryRequest(epsilon=1.0, spec=JSONQuery(aggregates=({"kind": "bogus"},))),
        QueryRequest(epsilon=1.0, spec=JSONQuery(aggregates=({"kind": "count", "extra": 1},))),
        QueryRequest(epsilon=1.0, spec=JSONQuery(aggregates=({"kind": "quantile", "column": "age", "q": 2.0},))),
    ]
    for request in bad:
        for call in (svc.cost, svc.query):
            with pytest.raises(InvalidParameterError):
                call(alice, "people", request)
    assert world.snapshot() == before


# ------------------------------------------------------------------------------------------------
# audit entries and history
# ------------------------------------------------------------------------------------------------


def test_audit_entries_and_filters(world: World) -> None:
    svc = world.service
    grants = svc.audit_entries()
    assert [e.action for e in grants] == ["grant"] * len(grants) and grants
    n = len(grants)
    alice = who(world, "alice")
    answer = svc.query(alice, "people", QueryRequest(epsilon=0.5, sql=COUNT_SQL))
    (e1,) = svc.audit_entries(after=n)  # written by the debit, in its transaction
    assert svc.unlogged_spends() == []
    assert (e1.actor, e1.action, e1.outcome, e1.epsilon, e1.delta) == ("alice", "query", "paid", "1/2", "0/1")
    assert e1.detail["spend_id"] == answer["spend_id"] and e1.detail["query"] == COUNT_SQL
    e2 = svc.audit(
        actor="bob", action="cost", status=200, outcome="ok (preview)", dataset="people", detail={"query": "x"}
    )
    e3 = svc.audit(
        actor="curator", action="note", status=0, outcome="ok", detail={"bad": float("nan"), "obj": object.__name__}
    )
    e4 = svc.audit(actor=None, action="GET /v1/me", status=401, outcome="unauthenticated")
    assert [e.seq for e in (e1, e2, e3, e4)] == [n + 1, n + 2, n + 3, n + 4]
    assert e2.epsilon is None and e3.epsilon is None
    assert e3.detail["bad"] == "nan"  # non-finite floats are stored as text (the log stays JSON)
    assert svc.audit_entries() == [*grants, e1, e2, e3, e4]
    assert svc.audit_entries(actor="alice") == [e1]
    assert svc.audit_entries(actions=["query", "cost"]) == [e1, e2]
    assert svc.audit_entries(after=n + 2) == [e3, e4]
    assert svc.audit_entries(limit=1) == [grants[0]]
    assert svc.verify_log().entries == n + 4 and svc.verify_log().head == e4.hash


def test_long_query_text_is_clipped_in_the_log(world: World) -> None:
    svc = world.service
    sql = "SELECT COUNT(*) FROM people WHERE city IN (" + ", ".join(f"'c{i}'" for i in range(2000)) + ")"
    svc.query(who(world, "alice"), "people", QueryRequest(epsilon=0.1, sql=sql))
    text = svc.ledger.list_spends("people", "alice")[0].query_text
    assert len(text) <= 4097 and text.endswith("…")


def test_a_table_of_a_duckdb_file_is_a_source(tmp_path: Path) -> None:
    import duckdb

    db = tmp_path / "warehouse.duckdb"
    with duckdb.connect(str(db)) as con:
        con.execute("CREATE SCHEMA hr")
        con.execute("CREATE TABLE hr.staff AS SELECT range % 60 + 20 AS age FROM range(500)")
    meta = {"row_level": True, "columns": {"age": {"type": "numeric", "lower": 0, "upper": 100}}}
    with Service(f"sqlite:///{tmp_path / 'ledger.sqlite'}") as svc:
        info = svc.register_dataset("staff", db, meta, table="hr.staff")
        assert (info.table, svc.dataset("staff").table) == ("hr.staff", "hr.staff")
        _, key = svc.create_principal("ann", "analyst")
        svc.grant("ann", "staff", epsilon=1.0)
        answer = svc.query(svc.authenticate(key), "staff", QueryRequest(epsilon=0.5, sql="SELECT COUNT(*) FROM staff"))
        assert abs(answer["rows"][0]["count"] - 500) < 60  # Laplace scale 2: |noise| > 60 has probability e^-30
        for bad_table, source in ((None, db), ("hr.staff", tmp_path / "x.csv"), ("x; DROP TABLE t", db)):
            (tmp_path / "x.csv").write_text("age\n1\n")
            with pytest.raises(InvalidParameterError, match="table"):
                svc.register_dataset("other", source, meta, table=bad_table)
        with pytest.raises(InvalidDataError, match="could not be read") as err:
            svc.register_dataset("missing", db, meta, table="hr.nope")
        assert "DuckDB table warehouse.duckdb hr.nope" in str(err.value) and str(tmp_path) not in str(err.value)
