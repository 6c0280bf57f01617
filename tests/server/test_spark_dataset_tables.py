"""A dataset of several tables on Spark in the curator service: each table's Parquet data under the
data root read in place by the service's one SparkSession, pinned at registration, checked before
every query pays and after Spark has read it, and joined — answering what the same tables answer
through a DuckDB copy.

One dataset for the module (registering on Spark takes seconds). Deterministic except the answers'
values, released at ε = 2·10⁵: the noise of a count (sensitivity at most 10, the dataset's
``max_rows``) has scale at most 10⁻⁴, so the chance that any compared count is off by the 0.5
tolerance below is under 1e-100: their false-failure rate.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from dpkit.analytics.check_tables import DatasetCheck
from dpkit.errors import InvalidParameterError, QueryFailedError
from dpkit.server import DatasetUnavailableError, QueryRequest, Service
from dpkit.server.dataset_info import DatasetInfo
from server._api import UNPACED
from server._tables import HOSPITAL_FILES, HOSPITAL_METADATA, JOIN_SPEC, JOIN_SQL, write_hospital

pytest.importorskip("pyspark")

#: Each table's Parquet data, relative to the data root: a directory of two files for every table
#: written as CSV by write_hospital, and the prescriptions' one Parquet file.
SPARK_SOURCES = {t: t if f.endswith(".csv") else f for t, f in HOSPITAL_FILES.items()}
PRIVATE_JOIN = (
    "SELECT COUNT(*) AS n, SUM(p.dose) AS s FROM visits v JOIN prescriptions p ON v.patient_id = p.patient_id"
)


@dataclass
class World:
    root: Path
    service: Service
    key: str
    registered: DatasetInfo  # as registration returned it (with the curator's data check)

    def who(self) -> Any:
        return self.service.authenticate(self.key)

    def spent(self, dataset: str = "hospital") -> float:
        return self.service.ledger.get_budget(dataset, "alice").spent_epsilon


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    """``hospital`` on Spark (its Parquet data) and ``hospital_copy`` on DuckDB (the same rows
    as CSV files), both granted to alice."""
    base = tmp_path_factory.mktemp("spark_tables")
    root = base / "data"
    for name, path in write_hospital(root).items():
        if path.suffix == ".csv":
            frame = pd.read_csv(path)
            (root / name).mkdir()
            for k, part in frame.groupby(np.arange(len(frame)) % 2):
                part.to_parquet(root / name / f"part-{k}.parquet", index=False)
    service = Service(f"sqlite:///{base / 'ledger.sqlite'}", data_root=root, max_grant_epsilon=1e9)
    try:
        info = service.register_dataset(
            "hospital", SPARK_SOURCES, HOSPITAL_METADATA, engine="spark", size_class="small"
        )  # fmt: skip
        service.register_dataset("hospital_copy", HOSPITAL_FILES, HOSPITAL_METADATA, size_class="small")
        _, key = service.create_principal("alice", "analyst")
        for dataset in ("hospital", "hospital_copy"):
            service.grant("alice", dataset, epsilon=1e9)
        yield World(root, service, key, info)
    finally:
        service.close()


def test_each_tables_parquet_data_is_pinned_and_checked_at_registration(world: World) -> None:
    info = world.service.dataset("hospital")
    assert (info.engine, info.several, info.sources, info.table) == ("spark", True, SPARK_SOURCES, None)
    pins = json.loads(info.files)  # type: ignore[arg-type]
    assert set(pins) == set(HOSPITAL_FILES) and len(pins["visits"]) == 2 and len(pins["prescriptions"]) == 1
    assert world.registered == info and world.registered.files == info.files
    check = world.registered.check
    assert isinstance(check, DatasetCheck) and check.ok and check.table("regions").public
    assert (check.table("visits").rows, check.table("prescriptions").rows) == (400, 300)
    meta = json.loads(json.dumps(HOSPITAL_METADATA))
    meta["tables"]["visits"]["columns"]["age"] = {"type": "numeric", "lower": 0, "upper": 100}
    with pytest.raises(InvalidParameterError) as caught:  # each table's schema, read by Spark
        world.service.register_dataset("hospital2", SPARK_SOURCES, meta, engine="spark")
    assert caught.value.name == "metadata.tables.visits.columns.age" and "not named here" in str(caught.value)
    assert [d.name for d in world.service.datasets()] == ["hospital", "hospital_copy"]


def test_a_public_join_answers_what_the_duckdb_copy_answers(world: World) -> None:
    """The JSON form over HTTP groups by the public table's keys; SQL with JOIN and a filter on
    a joined column counts what the copy counts. (Grouped counts themselves may differ: which
    one region a patient's rows are kept in, max_groups = 1, is a hash of each engine's.)"""
    from fastapi.testclient import TestClient

    from dpkit.server import create_app

    with TestClient(create_app(world.service, **UNPACED), raise_server_exceptions=False) as client:
        h = {"Authorization": f"Bearer {world.key}"}
        r = client.post("/v1/datasets/hospital/query", json={"epsilon": 2e5, "query": JOIN_SPEC}, headers=h)
    assert r.status_code == 200, r.text
    grouped = {row["region"]: row["count"] for row in r.json()["rows"]}
    assert grouped.keys() == {"east", "north", "south"} and abs(grouped["east"]) < 0.5  # (no visit has postcode E)
    assert sum(grouped.values()) < 400.5
    north = JOIN_SQL.replace("r.region, COUNT(*)", "COUNT(*) AS n").replace("GROUP BY r.region", "")
    north += "WHERE r.region = 'north'"
    n = {
        d: world.service.query(world.who(), d, QueryRequest(epsilon=2e5, sql=north))["rows"][0]["n"]
        for d in ("hospital", "hospital_copy")
    }
    assert abs(n["hospital"] - n["hospital_copy"]) < 0.5 and n["hospital"] > 50


def test_a_private_join_truncates_each_table_as_the_copy_does(world: World) -> None:
    """Visits joined to prescriptions on the unit: each truncated to its ``join_rows`` per
    patient. Which rows are kept differs between the engines (their hashes differ), how many
    does not: the counts agree, and each sum is of at most 3·2 doses in [0, 10] per patient."""
    out = {
        d: world.service.query(world.who(), d, QueryRequest(epsilon=2e5, sql=PRIVATE_JOIN))["rows"][0]
        for d in ("hospital", "hospital_copy")
    }
    assert abs(out["hospital"]["n"] - out["hospital_copy"]["n"]) < 0.5 and out["hospital"]["n"] > 50
    assert 0 <= out["hospital"]["s"] <= 10 * out["hospital"]["n"] + 1
    spends = world.service.ledger.list_spends("hospital", "alice")
    assert "JOIN prescriptions" in spends[-1].query_text


def test_a_changed_file_of_any_table_is_refused_before_paying_and_fails_a_paid_query(
    world: World, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A file added to a public table: the fixed dataset_unavailable, nothing spent, the table
    named in the curator's log; answered again once it is taken away. A private table's file
    rewritten while Spark reads it (simulated just before the job): the fixed query_failed after
    the debit, whose spend stands."""
    from dpkit.analytics.engines.spark import SparkEngine

    extra = world.root / "regions" / "part-2.parquet"
    pd.read_parquet(world.root / "regions" / "part-0.parquet").to_parquet(extra, index=False)
    spent = world.spent()
    count = QueryRequest(epsilon=2e5, sql=JOIN_SQL)
    try:
        with caplog.at_level(logging.WARNING, logger="dpkit.curator"), pytest.raises(DatasetUnavailableError):
            world.service.query(world.who(), "hospital", count)
        assert "'hospital.regions': its Parquet files changed since registration (1 file(s) added" in caplog.text
        assert world.spent() == spent
    finally:
        extra.unlink()
    assert len(world.service.query(world.who(), "hospital", count)["rows"]) == 3
    spent = world.spent()
    f = world.root / "prescriptions.parquet"
    st = f.stat()
    compute = SparkEngine.compute

    def rewriting(self: Any, plan: Any) -> Any:
        os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
        return compute(self, plan)

    monkeypatch.setattr(SparkEngine, "compute", rewriting)
    try:
        with caplog.at_level(logging.WARNING, logger="dpkit.curator"), pytest.raises(QueryFailedError) as err:
            world.service.query(world.who(), "hospital", QueryRequest(epsilon=1.0, sql=PRIVATE_JOIN))
    finally:
        os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))  # the pinned file again, for the other tests
    assert err.value.spend_id is not None and str(err.value) == QueryFailedError.MESSAGE
    assert world.spent() == pytest.approx(spent + 1.0)
    assert "'hospital.prescriptions': its Parquet files changed since registration" in caplog.text
    assert "while a paid query read them" in caplog.text
