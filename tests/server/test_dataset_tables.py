"""Datasets of several tables in the curator service: registered from one source per table,
described table by table to analysts, queried with joins (SQL and the JSON form), refused before
any debit when a join is not allowed, bounded in size and time like any query — on SQLite and
PostgreSQL.

Every check here is deterministic (false-failure rate 0) but the answers' values, which are
bounded by their noise's stated tail probability where they are looked at.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi", reason="the server extra (FastAPI) is not installed")

from dpkit.analytics.check_tables import DatasetCheck  # noqa: E402
from dpkit.analytics.dataset_metadata import DatasetMetadata  # noqa: E402
from dpkit.errors import InvalidParameterError  # noqa: E402
from dpkit.server import Service  # noqa: E402
from dpkit.server.pacing import AnswerTimes  # noqa: E402
from server._api import UNPACED, error_of  # noqa: E402
from server._release_world import LEDGERS  # noqa: E402
from server._tables import HOSPITAL_FILES, HOSPITAL_METADATA, JOIN_SPEC, JOIN_SQL, write_hospital  # noqa: E402

QUERY = "/v1/datasets/hospital/query"


@dataclass
class Hospital:
    dir: Path
    service: Service
    keys: dict[str, str]
    clients: list[Any]

    def client(self, **kwargs: Any) -> Any:
        from fastapi.testclient import TestClient

        from dpkit.server import create_app

        settings = {"rate": 1e6, "burst": 1_000_000, "address_rate": 1e6, "address_burst": 1_000_000, **UNPACED}
        c = TestClient(create_app(self.service, **{**settings, **kwargs}), raise_server_exceptions=False)
        self.clients.append(c)
        return c

    def h(self, who: str = "alice") -> dict[str, str]:
        return {"Authorization": f"Bearer {self.keys[who]}"}

    def spent(self, analyst: str = "alice") -> tuple[float, list[Any]]:
        led = self.service.ledger
        return led.get_budget("hospital", analyst).spent_epsilon, led.list_spends("hospital", analyst)


def _sources(directory: Path) -> dict[str, str]:
    return {t: str(directory / f) for t, f in HOSPITAL_FILES.items()}


@pytest.fixture(params=LEDGERS)
def hospital(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Hospital]:
    url = f"sqlite:///{tmp_path / 'ledger.sqlite'}" if request.param == "sqlite" else request.getfixturevalue("pg_url")
    write_hospital(tmp_path)
    service = Service(url, audit_key=tmp_path / "audit.key", dataset_dir=tmp_path / "datasets")
    world = Hospital(tmp_path, service, {}, [])
    try:
        service.register_dataset("hospital", _sources(tmp_path), HOSPITAL_METADATA, size_class="small")
        _, world.keys["curator"] = service.create_principal("curator", "curator")
        _, world.keys["alice"] = service.create_principal("alice", "analyst")
        service.grant("alice", "hospital", epsilon=5.0, delta=1e-5)
        yield world
    finally:
        for c in world.clients:
            c.close()
        world.service.close()  # (a test may have reopened it)


# -- registration and description ------------------------------------------------------------------


def test_the_analyst_sees_each_table_and_nothing_of_the_sources(hospital: Hospital) -> None:
    body = hospital.client().get("/v1/datasets/hospital", headers=hospital.h()).json()
    tables = body["tables"]
    assert set(tables) == set(HOSPITAL_METADATA["tables"]) and body["size_class"] == "small"
    assert tables["visits"]["public"] is False and tables["visits"]["privacy_unit"] == "patient_id"
    assert tables["visits"]["join_rows"] == 3 and tables["visits"]["columns"]["cost"]["upper"] == 100
    assert tables["regions"]["public"] is True and tables["regions"]["max_matches"] == 1
    assert "privacy_unit" not in tables["regions"] and (body["max_groups"], body["max_rows"]) == (1, 10)
    assert "source" not in body and str(hospital.dir) not in json.dumps(body)
    # the description is the declaration: it reads back as the curator's metadata
    declared = DatasetMetadata.from_dict({k: body[k] for k in ("tables", "max_groups", "max_rows")})
    assert declared == DatasetMetadata.from_dict(HOSPITAL_METADATA)


def test_the_curator_sees_each_tables_source(hospital: Hospital) -> None:
    (listed,) = hospital.client().get("/v1/datasets", headers=hospital.h("curator")).json()["datasets"]
    assert listed["source"] == _sources(hospital.dir) and listed["engine"] == "duckdb"
    info = hospital.service.dataset("hospital")
    assert info.several and info.sources == _sources(hospital.dir)


def test_registration_checks_each_table_for_the_curator(tmp_path: Path) -> None:
    write_hospital(tmp_path)
    with Service(f"sqlite:///{tmp_path / 'l.sqlite'}") as svc:
        info = svc.register_dataset("hospital", _sources(tmp_path), tmp_path / "hospital.json", size_class="small")
        assert isinstance(info.check, DatasetCheck) and info.check.ok
        assert info.check.table("visits").rows == 400 and info.check.table("regions").public
        assert info.check.table("visits").reading is not None  # the CSV lines the reader dropped (none)


def test_the_size_class_bounds_each_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from dpkit.server import size_class

    write_hospital(tmp_path)
    # a class of 350 rows: the 400 visits exceed it, the 300 prescriptions do not
    monkeypatch.setattr(size_class, "SIZE_CLASSES", {**size_class.SIZE_CLASSES, "small": (350, 0.5)})
    with Service(f"sqlite:///{tmp_path / 'l.sqlite'}") as svc:
        info = svc.register_dataset("hospital", _sources(tmp_path), HOSPITAL_METADATA, size_class="small")
    assert isinstance(info.check, DatasetCheck) and not info.check.ok
    assert any("exceed the size class" in p for p in info.check.table("visits").problems)
    assert not info.check.table("prescriptions").problems


def test_registering_over_http_takes_one_source_per_table(hospital: Hospital) -> None:
    body = {"name": "hospital2", "source": _sources(hospital.dir), "metadata": HOSPITAL_METADATA}
    r = hospital.client().post("/v1/datasets", json=body, headers=hospital.h("curator"))
    assert r.status_code == 201, r.text
    assert r.json()["check"]["ok"] is True and set(r.json()["check"]["tables"]) == set(HOSPITAL_FILES)
    assert r.json()["source"] == _sources(hospital.dir)


@pytest.mark.parametrize(
    ("change", "parameter"),
    [
        (lambda s, m: ({k: v for k, v in s.items() if k != "wards"}, m), "source"),
        (lambda s, m: ({**s, "extra": s["wards"]}, m), "source"),
        (lambda s, m: ({**s, "visits": s["visits"] + ".missing.csv"}, m), "source.visits"),
        (lambda s, m: (s["visits"], m), "source"),
        (lambda s, m: (s, {"privacy_unit": "patient_id", "columns": {}}), "metadata"),
        (
            lambda s, m: (
                s,
                _with(m, "visits", {"columns": {**m["tables"]["visits"]["columns"], "age": {"type": "numeric"}}}),
            ),
            "metadata.tables.visits.columns.age",
        ),  # fmt: skip
        (
            lambda s, m: (_renamed(s, "visits", "visits-2024"), _renamed_meta(m, "visits", "visits-2024")),
            "metadata.tables",
        ),  # fmt: skip
    ],
)
def test_bad_registrations_are_refused_before_anything_is_registered(
    hospital: Hospital, change: Any, parameter: str
) -> None:
    source, meta = change(_sources(hospital.dir), json.loads(json.dumps(HOSPITAL_METADATA)))
    with pytest.raises(InvalidParameterError) as caught:
        hospital.service.register_dataset("hospital2", source, meta)
    assert caught.value.name == parameter, caught.value
    assert [d.name for d in hospital.service.datasets()] == ["hospital"]
    assert not list((hospital.dir / "datasets").glob("hospital2-*"))


def test_spark_takes_parquet_data_for_each_table_refused_before_anything_is_read(hospital: Hospital) -> None:
    """On Spark every table is Parquet data read in place (test_spark_dataset_tables.py): a CSV
    source is named by its table, and a ``table`` mapping is refused, before Spark starts."""
    sources = {**_sources(hospital.dir), "prescriptions": str(hospital.dir / "prescriptions.parquet")}
    for kwargs, parameter in (({}, "source.visits"), ({"table": {"visits": "v"}}, "table")):
        with pytest.raises(InvalidParameterError) as caught:
            hospital.service.register_dataset("hospital2", sources, HOSPITAL_METADATA, engine="spark", **kwargs)
        assert caught.value.name == parameter, caught.value
    assert [d.name for d in hospital.service.datasets()] == ["hospital"]


def test_a_duckdb_source_names_its_table(hospital: Hospital) -> None:
    import duckdb

    db = hospital.dir / "hospital.duckdb"
    with duckdb.connect(str(db)) as con:
        con.execute(f"CREATE TABLE visits_2024 AS SELECT * FROM read_csv('{hospital.dir / 'visits.csv'}')")
    sources = {**_sources(hospital.dir), "visits": str(db)}
    with pytest.raises(InvalidParameterError) as caught:
        hospital.service.register_dataset("hospital2", sources, HOSPITAL_METADATA)
    assert caught.value.name == "table.visits"
    info = hospital.service.register_dataset("hospital2", sources, HOSPITAL_METADATA, table={"visits": "visits_2024"})
    assert info.source_tables["visits"] == "visits_2024" and info.check is not None and info.check.ok


# -- queries ---------------------------------------------------------------------------------------


def test_the_json_form_joins_and_is_recorded_with_its_joins(hospital: Hospital) -> None:
    r = hospital.client().post(QUERY, json={"epsilon": 1.0, "query": JOIN_SPEC}, headers=hospital.h())
    assert r.status_code == 200, r.text
    body = r.json()
    assert sorted(row["region"] for row in body["rows"]) == ["east", "north", "south"]  # the public table's keys
    spent, (spend,) = hospital.spent()
    assert spent == 1.0
    recorded = json.loads(spend.query_text)
    assert recorded["from"] == "visits" and recorded["join"] == [{"table": "regions", "on": ["postcode"]}]
    entry = hospital.service.audit_entries()[-1]
    assert entry.action == "query" and '"join"' in entry.detail["query"]


def test_keys_from_a_public_table_and_a_private_join(hospital: Hospital) -> None:
    c = hospital.client()
    spec = {"from": "visits", "group_by": ["ward"], "keys_from": "wards", "aggregates": [{"kind": "count"}]}
    r = c.post(QUERY, json={"epsilon": 0.5, "query": spec}, headers=hospital.h())
    assert r.status_code == 200, r.text
    assert [row["ward"] for row in r.json()["rows"]] == ["w1", "w2", "w3"]  # every key, empty groups too
    spec = {
        "from": "visits",
        "join": [{"table": "prescriptions", "on": [["patient_id", "patient_id"]]}],
        "aggregates": [{"kind": "sum", "column": "dose"}],
    }
    r = c.post(QUERY, json={"epsilon": 0.5, "query": spec}, headers=hospital.h())
    assert r.status_code == 200, r.text
    assert json.loads(hospital.spent()[1][-1].query_text)["join"][0]["table"] == "prescriptions"


def test_sql_with_a_join_goes_through_the_service(hospital: Hospital) -> None:
    c = hospital.client()
    r = c.post(QUERY, json={"epsilon": 1.0, "sql": JOIN_SQL}, headers=hospital.h())
    assert r.status_code == 200, r.text
    assert sorted(row["region"] for row in r.json()["rows"]) == ["east", "north", "south"]
    assert hospital.spent()[1][-1].query_text == JOIN_SQL
    # a one-table query of a dataset of several tables names its table
    r = c.post(QUERY, json={"epsilon": 0.5, "sql": "SELECT COUNT(*) FROM prescriptions"}, headers=hospital.h())
    assert r.status_code == 200, r.text


def test_sql_and_the_json_form_compile_to_the_same_query(hospital: Hospital) -> None:
    c = hospital.client()
    by_sql = c.post(QUERY + "/cost", json={"epsilon": 1.0, "sql": JOIN_SQL}, headers=hospital.h()).json()
    by_json = c.post(QUERY + "/cost", json={"epsilon": 1.0, "query": JOIN_SPEC}, headers=hospital.h()).json()
    assert by_sql["event"] == by_json["event"] and by_sql["answer_seconds"] == by_json["answer_seconds"]
    local = hospital.service.dataset("hospital")
    assert local.several and hospital.spent() == (0.0, [])


@pytest.mark.parametrize(
    ("query", "parameter"),
    [
        # two private tables on anything but the unit: one person's row could meet everyone's
        ({"from": "visits", "join": [{"table": "prescriptions", "on": [["ward", "drug"]]}]}, "on"),
        # a public table without max_matches: its matches per key are unbounded
        ({"from": "visits", "join": [{"table": "notes", "on": ["postcode"]}]}, "join.table"),
        ({"from": "visits", "join": [{"table": "nowhere", "on": ["postcode"]}]}, "join.table"),
        ({"from": "regions"}, "from"),  # a public table's rows belong to nobody
        ({"from": "visits", "join": [{"table": "regions", "on": []}]}, "on"),  # a cross join
        ({"from": "visits", "join": [{"table": "regions", "on": ["postcode"], "how": "full"}]}, "how"),
        ({"from": "visits", "keys_from": "prescriptions", "group_by": ["ward"]}, "keys_from"),
        ({"from": "visits", "keys_from": "wards"}, "keys_from"),  # keys without a group-by
    ],
)
def test_bad_joins_are_refused_before_any_debit(hospital: Hospital, query: dict[str, Any], parameter: str) -> None:
    c = hospital.client()
    before = hospital.spent()
    entries = len(hospital.service.audit_entries())
    spec = {"aggregates": [{"kind": "count"}], **query}
    for path in (QUERY, QUERY + "/cost"):
        r = c.post(path, json={"epsilon": 1.0, "query": spec}, headers=hospital.h())
        assert r.status_code == 400, r.text
        assert error_of(r)["parameter"] == parameter, r.json()
    assert hospital.spent() == before == (0.0, [])
    # the refusals are logged, none of them as a debit
    assert all(e.action != "query" or e.outcome != "paid" for e in hospital.service.audit_entries()[entries:])


def test_a_one_table_dataset_refuses_joins_before_any_debit(hospital: Hospital, tmp_path: Path) -> None:
    from server._api import PEOPLE_METADATA, write_people

    hospital.service.register_dataset("people", write_people(tmp_path / "people.csv"), PEOPLE_METADATA)
    hospital.service.grant("alice", "people", epsilon=1.0)
    spec = {"from": "people", "join": [{"table": "regions", "on": ["city"]}], "aggregates": [{"kind": "count"}]}
    r = hospital.client().post("/v1/datasets/people/query", json={"epsilon": 1.0, "query": spec}, headers=hospital.h())
    assert r.status_code == 400 and error_of(r)["parameter"] == "join.table", r.text
    assert hospital.service.ledger.list_spends("people", "alice") == []


def test_the_response_size_bound_holds_for_a_join(tmp_path: Path) -> None:
    from dpkit.analytics.limits import QueryLimits
    from dpkit.errors import LimitExceededError
    from dpkit.server import JSONQuery, QueryRequest

    write_hospital(tmp_path)
    with Service(f"sqlite:///{tmp_path / 'l.sqlite'}", limits=QueryLimits(max_result_rows=2)) as svc:
        svc.register_dataset("hospital", _sources(tmp_path), HOSPITAL_METADATA)
        _, key = svc.create_principal("alice", "analyst")
        svc.grant("alice", "hospital", epsilon=5.0)
        who = svc.authenticate(key)
        # three regions are three rows (the public table's keys): refused before paying when an
        # answer may hold two
        spec = JSONQuery(
            aggregates=({"kind": "count"},),
            group_by=("region",),
            table="visits",
            joins=({"table": "regions", "on": ["postcode"]},),
        )
        with pytest.raises(LimitExceededError) as caught:
            svc.query(who, "hospital", QueryRequest(epsilon=1.0, spec=spec))
        assert caught.value.setting == "max_result_rows"
        assert svc.ledger.list_spends("hospital", "alice") == []
        # the SQL form is bounded alike
        with pytest.raises(LimitExceededError):
            svc.query(who, "hospital", QueryRequest(epsilon=1.0, sql=JOIN_SQL))
        assert svc.ledger.get_budget("hospital", "alice").spent_epsilon == 0.0


def test_a_join_is_budgeted_more_time_from_declared_facts(hospital: Hospital) -> None:
    c = hospital.client()
    count = {"from": "visits", "aggregates": [{"kind": "count"}]}
    public = {**count, "join": [{"table": "regions", "on": ["postcode"]}]}
    private = {**count, "join": [{"table": "prescriptions", "on": ["patient_id"]}]}
    seconds = {}
    for name, spec in (("one", count), ("public", public), ("private", private)):
        r = c.post(QUERY + "/cost", json={"epsilon": 1.0, "query": spec}, headers=hospital.h())
        assert r.status_code == 200, r.text
        seconds[name] = r.json()["answer_seconds"]
    # (tables + matches - 1) times a one-table count: 2 + 1 - 1 = 2 (max_matches 1), 2 + 2 - 1 = 3 (join_rows 2)
    assert seconds["public"] == pytest.approx(2 * seconds["one"])
    assert seconds["private"] == pytest.approx(3 * seconds["one"])
    assert hospital.spent() == (0.0, [])


def test_answer_times_grow_with_the_tables_and_matches() -> None:
    times = AnswerTimes(answer_seconds=1.0)
    one = times.query("medium", "duckdb", 0, False, ["count"])
    assert times.query("medium", "duckdb", 0, False, ["count"], tables=3, matches=4) == pytest.approx(6 * one)
    assert times.query("medium", "duckdb", 0, False, ["count"], tables=1, matches=1) == one


def test_a_synthetic_table_of_several_tables_is_refused_unpaid(hospital: Hospital) -> None:
    body = {"epsilon": 1.0, "delta": 1e-6, "columns": ["postcode"]}
    r = hospital.client().post("/v1/datasets/hospital/synthetic", json=body, headers=hospital.h())
    assert r.status_code == 400 and error_of(r)["parameter"] == "dataset", r.text
    assert "several tables" in error_of(r)["message"]
    assert hospital.spent() == (0.0, [])


def test_a_missing_copy_is_recreated_from_every_source(hospital: Hospital) -> None:
    url = hospital.service.url
    hospital.service.close()
    for copy in (hospital.dir / "datasets").glob("hospital-*.duckdb"):
        copy.unlink()
    hospital.service = Service(url, audit_key=hospital.dir / "audit.key", dataset_dir=hospital.dir / "datasets")
    assert isinstance(hospital.service.dataset("hospital").metadata, DatasetMetadata)
    r = hospital.client().post(QUERY, json={"epsilon": 1.0, "query": JOIN_SPEC}, headers=hospital.h())
    assert r.status_code == 200, r.text
    assert len(list((hospital.dir / "datasets").glob("hospital-*.duckdb"))) == 1


def test_a_deleted_source_and_copy_is_unavailable_with_nothing_spent(hospital: Hospital) -> None:
    for copy in (hospital.dir / "datasets").glob("hospital-*.duckdb"):
        copy.unlink()
    hospital.service.close()
    shutil.move(hospital.dir / "regions.csv", hospital.dir / "moved.csv")
    hospital.service = Service(
        hospital.service.url, audit_key=hospital.dir / "audit.key", dataset_dir=hospital.dir / "datasets"
    )
    r = hospital.client().post(QUERY, json={"epsilon": 1.0, "query": JOIN_SPEC}, headers=hospital.h())
    assert r.status_code == 503, r.text
    assert str(hospital.dir) not in r.text and hospital.spent() == (0.0, [])


def test_the_published_schema_declares_the_new_fields(hospital: Hospital) -> None:
    spec = hospital.client().get("/openapi.json").json()
    schemas = spec["components"]["schemas"]
    query = schemas["SpecBody"]["properties"]
    assert {"from", "join", "keys_from"} <= set(query)
    assert set(schemas["JoinBody"]["properties"]) == {"table", "on", "how"}
    source = schemas["DatasetBody"]["properties"]["source"]
    assert {"type": "object", "additionalProperties": {"type": "string"}} in source["anyOf"]


# -- helpers ---------------------------------------------------------------------------------------


def _with(meta: dict[str, Any], table: str, change: dict[str, Any]) -> dict[str, Any]:
    return {**meta, "tables": {**meta["tables"], table: {**meta["tables"][table], **change}}}


def _renamed(sources: dict[str, str], old: str, new: str) -> dict[str, str]:
    return {(new if k == old else k): v for k, v in sources.items()}


def _renamed_meta(meta: dict[str, Any], old: str, new: str) -> dict[str, Any]:
    return {**meta, "tables": {(new if k == old else k): v for k, v in meta["tables"].items()}}
