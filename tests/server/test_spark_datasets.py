"""Spark-backed datasets in the service: Parquet data under the data root, read in place by the
service's SparkSession at every query, answering what the same rows answer through a DuckDB copy.

Deterministic except where noted: the parity and median tests release at ε = 2·10⁵ (count noise of
scale 10⁻⁵, sum noise of scale 10⁻³ per group), where the chance that any released value is off by
the tolerance (0.05 and 0.1) is below 1e-20: their false-failure rate."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from dpkit.errors import InvalidDataError, InvalidParameterError
from dpkit.server import DatasetUnavailableError, QueryRequest, Service
from dpkit.server.cli import admin_app
from server._api import PEOPLE_METADATA, UNPACED, write_people

pytest.importorskip("pyspark")

SQL = "SELECT sex, COUNT(*) AS n, SUM(age) AS s FROM people GROUP BY sex"


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A data root holding people.csv and the same rows as a Hive-partitioned Parquet directory
    (``people/part=K/rows.parquet``) with a ``_SUCCESS`` marker Spark and DuckDB both skip."""
    root = tmp_path / "data"
    root.mkdir()
    write_people(root / "people.csv")
    frame = pd.read_csv(root / "people.csv")
    for k, part in frame.groupby(np.arange(len(frame)) % 3):
        (root / "people" / f"part={k}").mkdir(parents=True)
        part.to_parquet(root / "people" / f"part={k}" / "rows.parquet", index=False)
    (root / "people" / "_SUCCESS").write_text("")
    return root


@pytest.fixture
def service(tmp_path: Path, root: Path) -> Iterator[Service]:
    with Service(f"sqlite:///{tmp_path / 'ledger.sqlite'}", data_root=root, max_grant_epsilon=1e9) as svc:
        yield svc


def _analyst(svc: Service, dataset: str, epsilon: float = 5.0, name: str = "alice", delta: float = 0.0) -> Any:
    if name not in {p["name"] for p in svc.principals()}:
        _, key = svc.create_principal(name, "analyst")
        svc._test_key = key  # type: ignore[attr-defined]
    svc.grant(name, dataset, epsilon=epsilon, delta=delta)
    return svc.authenticate(svc._test_key)  # type: ignore[attr-defined]


def test_a_partitioned_directory_answers_what_its_duckdb_copy_answers(service: Service) -> None:
    spark = service.register_dataset("people", "people", PEOPLE_METADATA, engine="spark")
    duck = service.register_dataset("people_copy", "people.csv", PEOPLE_METADATA)
    assert (spark.engine, spark.source, spark.table) == ("spark", "people", None)
    assert duck.engine == "duckdb"
    assert spark.check is not None and spark.check.rows == duck.check.rows == 300  # type: ignore[union-attr]
    who = _analyst(service, "people", 1e8)
    _analyst(service, "people_copy", 1e8)
    answers = []
    for dataset in ("people", "people_copy"):
        sql = SQL.replace("FROM people", f"FROM {dataset}")
        out = service.query(who, dataset, QueryRequest(epsilon=2e5, sql=sql))
        answers.append({r["sex"]: (r["n"], r["s"]) for r in out["rows"]})
    assert answers[0].keys() == answers[1].keys() == {"F", "M", "O'Brien"}
    for sex, (n, s) in answers[0].items():
        assert n == pytest.approx(answers[1][sex][0], abs=0.05) and s == pytest.approx(answers[1][sex][1], abs=0.1)
    assert service.ledger.get_budget("people", "alice").spent_epsilon == pytest.approx(2e5)
    assert [(d.name, d.engine) for d in service.datasets()] == [("people", "spark"), ("people_copy", "duckdb")]


def test_a_median_on_a_spark_dataset_is_computed_in_the_engine(service: Service) -> None:
    service.register_dataset("people", "people/part=*/*.parquet", PEOPLE_METADATA, engine="spark")
    who = _analyst(service, "people", 1e8)
    out = service.query(who, "people", QueryRequest(epsilon=2e5, sql="SELECT MEDIAN(age) AS m FROM people"))
    ages = pd.read_csv(service._live_catalog()._data_root / "people.csv")["age"]  # type: ignore[operator]
    assert abs(out["rows"][0]["m"] - ages.median()) <= 1.0  # the integer grid of [0, 100]


def test_a_synthetic_table_of_a_spark_dataset_is_counted_by_spark_and_paid_once(
    service: Service, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dpkit.server.synthetic import SynthRequest
    from dpkit.synth.measure import TableCounts
    from dpkit.synth.spark_counts import SparkTableCounts

    used: list[str] = []
    spark_prepare, duck_prepare = SparkTableCounts.prepare, TableCounts.prepare
    monkeypatch.setattr(
        SparkTableCounts, "prepare", lambda self, salt: (used.append("spark"), spark_prepare(self, salt))[1]
    )
    monkeypatch.setattr(TableCounts, "prepare", lambda self, salt: (used.append("duckdb"), duck_prepare(self, salt))[1])
    service.register_dataset("people", "people", PEOPLE_METADATA, engine="spark")
    who = _analyst(service, "people", 5.0, delta=1e-5)
    request = SynthRequest(epsilon=1.0, delta=1e-6, columns=["age", "sex"], bins={"age": 5}, rows=200)
    answer, _ = service.synthesize(who, "people", request)
    assert used == ["spark"]
    assert answer["columns"] == ["age", "sex"] and len(answer["rows"]) == 200
    assert all(row[1] in ("F", "M", "O'Brien", None) for row in answer["rows"])
    budget = service.ledger.get_budget("people", "alice")
    assert (budget.spent_epsilon, budget.spent_delta) == (1.0, 1e-6)


def test_a_single_parquet_file_and_a_glob_are_sources(service: Service, root: Path) -> None:
    one = service.register_dataset("one", "people/part=0/rows.parquet", PEOPLE_METADATA, engine="spark")
    glob = service.register_dataset("many", "people/**/*.parquet", PEOPLE_METADATA, engine="spark")
    assert one.check is not None and one.check.rows == 100
    assert glob.check is not None and glob.check.rows == 300
    assert [d.source for d in service.datasets()] == ["people/**/*.parquet", "people/part=0/rows.parquet"]


def test_a_declared_column_the_files_lack_is_named_and_nothing_is_registered(service: Service) -> None:
    meta = {
        **PEOPLE_METADATA,
        "columns": {**PEOPLE_METADATA["columns"], "zip": {"type": "categorical", "value_type": "integer"}},
    }
    with pytest.raises(InvalidParameterError) as err:
        service.register_dataset("people", "people", meta, engine="spark")
    assert err.value.name == "metadata.columns.zip" and "not named here" in str(err.value)
    assert service.datasets() == []


def test_files_gone_after_registration_make_the_dataset_unavailable_with_nothing_spent(
    service: Service, root: Path, tmp_path: Path
) -> None:
    service.register_dataset("people", "people", PEOPLE_METADATA, engine="spark")
    who = _analyst(service, "people")
    for f in (root / "people").rglob("*.parquet"):
        f.unlink()
    with pytest.raises(DatasetUnavailableError) as err:
        service.query(who, "people", QueryRequest(epsilon=0.5, sql="SELECT COUNT(*) FROM people"))
    assert str(err.value) == DatasetUnavailableError.MESSAGE
    assert service.ledger.get_budget("people", "alice").spent_epsilon == 0.0


def test_files_are_pinned_at_registration(
    service: Service, root: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Every query reads exactly the files registered: one added later makes the dataset
    unavailable — in the process already reading it too, and in a new one — with nothing spent,
    until it is taken away again; a file rewritten in place (a new modification time) does the
    same. (Before, a process checked the pins at its first query only: the added file was then
    silently not counted.)"""
    import logging
    import os

    info = service.register_dataset("people", "people", PEOPLE_METADATA, engine="spark")
    assert info.files is not None and len(json.loads(info.files)) == 3
    who = _analyst(service, "people", 1e8)
    count = "SELECT COUNT(*) AS n FROM people"
    before = service.query(who, "people", QueryRequest(epsilon=2e5, sql=count))["rows"][0]["n"]
    extra = root / "people" / "part=3" / "rows.parquet"
    extra.parent.mkdir()
    pd.read_parquet(root / "people" / "part=0" / "rows.parquet").to_parquet(extra, index=False)
    spent = service.ledger.get_budget("people", "alice").spent_epsilon
    with caplog.at_level(logging.WARNING, logger="dpkit.curator"), pytest.raises(DatasetUnavailableError):
        service.query(who, "people", QueryRequest(epsilon=2e5, sql=count))  # the process already reading it
    assert (
        "changed since registration (1 file(s) added, 0 removed, 0 rewritten (first: part=3/rows.parquet))"
        in caplog.text
    )
    assert service.ledger.get_budget("people", "alice").spent_epsilon == spent

    def fresh_query() -> Any:
        with Service(service.url, data_root=root, max_grant_epsilon=1e9) as other:
            return other.query(other.authenticate(service._test_key), "people", QueryRequest(epsilon=2e5, sql=count))  # type: ignore[attr-defined]

    with pytest.raises(DatasetUnavailableError):
        fresh_query()
    assert service.ledger.get_budget("people", "alice").spent_epsilon == spent
    extra.unlink()
    assert fresh_query()["rows"][0]["n"] == pytest.approx(before, abs=0.05)
    assert service.query(who, "people", QueryRequest(epsilon=2e5, sql=count))["rows"][0]["n"] == pytest.approx(
        before, abs=0.05
    )
    one = root / "people" / "part=1" / "rows.parquet"
    os.utime(one, ns=(one.stat().st_atime_ns, one.stat().st_mtime_ns + 1_000_000_000))  # rewritten: a new mtime
    spent = service.ledger.get_budget("people", "alice").spent_epsilon
    for query in (lambda: service.query(who, "people", QueryRequest(epsilon=2e5, sql=count)), fresh_query):
        with pytest.raises(DatasetUnavailableError):
            query()
    assert service.ledger.get_budget("people", "alice").spent_epsilon == spent


# -- the pins, checked at every query (before paying) and after Spark has read the files ------------

MEAN = "SELECT AVG(x) AS m FROM xs"
XS_META = {"row_level": True, "columns": {"x": {"type": "numeric", "lower": 0, "upper": 100}}}


def _write_xs(path: Path, values: np.ndarray) -> None:
    """Plain Parquet (no compression, no dictionary, no statistics): the same number of rows
    gives the same bytes count whatever the values, so a file can be rewritten to the same size."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(
        pa.table({"x": values.astype(np.float64)}),
        path,
        compression="none",
        use_dictionary=False,
        write_statistics=False,
    )


@pytest.fixture
def xs(root: Path) -> Path:
    """``xs/part-K.parquet``, three files of 1,000 values uniform on [0, 100)."""
    rng = np.random.default_rng(7)
    (root / "xs").mkdir()
    for k in range(3):
        _write_xs(root / "xs" / f"part-{k}.parquet", rng.uniform(0, 100, 1000))
    return root / "xs"


def test_a_file_rewritten_to_the_same_size_and_time_is_caught_by_its_fingerprint(
    service: Service, xs: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A file rewritten with other values, the same size and its modification time put back:
    the default pins (size and time) cannot see it — the mean moves, as the curator was warned
    — while the dataset registered with ``fingerprint="sha256"`` becomes unavailable, nothing
    spent, and answers again once the file is put back. The mean of 3,000 values released at
    ε = 10⁶ has noise of scale about 10⁻⁴: the ±1 bounds below fail with probability < 1e-100."""
    import logging
    import os

    cheap = service.register_dataset("xs", "xs", XS_META, engine="spark")
    hashed = service.register_dataset("xs_hashed", "xs", XS_META, engine="spark", fingerprint="sha256")
    assert len(json.loads(hashed.files)[0]) == 4 and len(json.loads(cheap.files)[0]) == 3  # type: ignore[arg-type]
    who = _analyst(service, "xs", 1e8)
    _analyst(service, "xs_hashed", 1e8)
    mean = {
        d: service.query(who, d, QueryRequest(epsilon=1e6, sql=MEAN.replace("xs", d)))["rows"][0]["m"]
        for d in ("xs", "xs_hashed")
    }
    assert abs(mean["xs"] - 50) < 5 and abs(mean["xs"] - mean["xs_hashed"]) < 1
    f = xs / "part-0.parquet"
    original, st = f.read_bytes(), f.stat()
    _write_xs(f, np.full(1000, 99.0))
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert f.stat().st_size == st.st_size and f.read_bytes() != original
    moved = service.query(who, "xs", QueryRequest(epsilon=1e6, sql=MEAN))["rows"][0]["m"]
    assert moved > mean["xs"] + 10  # the default pins do not see it (documented)
    spent = service.ledger.get_budget("xs_hashed", "alice").spent_epsilon
    with caplog.at_level(logging.WARNING, logger="dpkit.curator"), pytest.raises(DatasetUnavailableError):
        service.query(who, "xs_hashed", QueryRequest(epsilon=1e6, sql=MEAN.replace("xs", "xs_hashed")))
    assert "0 file(s) added, 0 removed, 1 rewritten (first: part-0.parquet)" in caplog.text
    assert service.ledger.get_budget("xs_hashed", "alice").spent_epsilon == spent
    f.write_bytes(original)
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    back = service.query(who, "xs_hashed", QueryRequest(epsilon=1e6, sql=MEAN.replace("xs", "xs_hashed")))
    assert abs(back["rows"][0]["m"] - mean["xs_hashed"]) < 1


def test_a_file_removed_or_resized_is_refused_before_paying_over_http(service: Service, xs: Path) -> None:
    """Over HTTP: a file of a dataset already queried removed, or grown, is the fixed 503
    ``dataset_unavailable`` with nothing spent (before, the removed file was a 500
    ``query_failed`` with ε charged, the grown one a 200 that did not count the new rows)."""
    from fastapi.testclient import TestClient

    from dpkit.server import create_app

    service.register_dataset("xs", "xs", XS_META, engine="spark")
    _analyst(service, "xs", 1e8)
    body = {"epsilon": 1.0, "sql": MEAN}
    h = {"Authorization": f"Bearer {service._test_key}"}  # type: ignore[attr-defined]
    with TestClient(create_app(service, _hold_answers=False), raise_server_exceptions=False) as client:
        assert client.post("/v1/datasets/xs/query", json=body, headers=h).status_code == 200
        spent = service.ledger.get_budget("xs", "alice").spent_epsilon
        gone = xs / "part-2.parquet"
        kept = gone.read_bytes()
        gone.unlink()
        r = client.post("/v1/datasets/xs/query", json=body, headers=h)
        assert (r.status_code, r.json()["error"]["code"]) == (503, "dataset_unavailable"), r.text
        gone.write_bytes(kept)  # back, but with a new modification time: still not the pinned file
        r = client.post("/v1/datasets/xs/query", json=body, headers=h)
        assert (r.status_code, r.json()["error"]["code"]) == (503, "dataset_unavailable"), r.text
        assert service.ledger.get_budget("xs", "alice").spent_epsilon == spent


@pytest.mark.parametrize("how", ["removed", "rewritten"])
@pytest.mark.filterwarnings("ignore:toPandas attempted Arrow optimization:UserWarning")  # (the removed file)
def test_a_file_changing_while_spark_reads_it_fails_the_paid_query_and_is_logged(
    service: Service, xs: Path, how: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """After the debit, while the job runs (simulated: the change is made just before Spark's
    job): the fixed QueryFailedError naming the spend, which stands, and the curator's log says
    what changed, as for a changed pin."""
    import logging
    import os

    from dpkit.analytics.engines.spark import SparkEngine
    from dpkit.errors import QueryFailedError

    service.register_dataset("xs", "xs", XS_META, engine="spark")
    who = _analyst(service, "xs", 1e8)
    service.query(who, "xs", QueryRequest(epsilon=1.0, sql=MEAN))
    f = xs / "part-1.parquet"
    compute = SparkEngine.compute

    def changing(self: Any, plan: Any) -> Any:
        if how == "removed":
            f.unlink()
        else:
            os.utime(f, ns=(f.stat().st_atime_ns, f.stat().st_mtime_ns + 1_000_000_000))
        return compute(self, plan)

    monkeypatch.setattr(SparkEngine, "compute", changing)
    with caplog.at_level(logging.WARNING, logger="dpkit.curator"), pytest.raises(QueryFailedError) as err:
        service.query(who, "xs", QueryRequest(epsilon=1.0, sql=MEAN))
    assert err.value.spend_id is not None and str(err.value) == QueryFailedError.MESSAGE
    assert service.ledger.get_budget("xs", "alice").spent_epsilon == 2.0
    removed, rewritten = (1, 0) if how == "removed" else (0, 1)
    assert (
        f"changed since registration (0 file(s) added, {removed} removed, {rewritten} rewritten "
        "(first: part-1.parquet)) while a paid query read them"
    ) in caplog.text


def test_a_fingerprint_is_for_pinned_spark_files_only(service: Service, xs: Path) -> None:
    for kwargs in (
        {"fingerprint": "md5", "engine": "spark"},
        {"fingerprint": "sha256"},
        {"fingerprint": True, "engine": "spark"},
    ):
        with pytest.raises(InvalidParameterError) as err:
            service.register_dataset("xs", "xs" if kwargs.get("engine") else "people.csv", XS_META, **kwargs)  # type: ignore[arg-type]
        assert err.value.name == "fingerprint"
    assert service.datasets() == []


def test_unreadable_parquet_is_refused_for_the_curator_without_paths(service: Service, root: Path) -> None:
    (root / "broken").mkdir()
    (root / "broken" / "x.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(InvalidDataError) as err:
        service.register_dataset("broken", "broken", PEOPLE_METADATA, engine="spark")
    assert "Parquet data broken" in str(err.value) and str(root) not in str(err.value)
    assert service.datasets() == []


def test_http_registration_names_the_engine(service: Service) -> None:
    from fastapi.testclient import TestClient

    from dpkit.server import create_app

    _, key = service.create_principal("carol", "curator")
    with TestClient(create_app(service, **UNPACED), raise_server_exceptions=False) as client:
        h = {"Authorization": f"Bearer {key}"}
        body = {"name": "people", "source": "people", "metadata": PEOPLE_METADATA, "engine": "spark"}
        r = client.post("/v1/datasets", json=body, headers=h)
        assert r.status_code == 201, r.text
        assert r.json()["engine"] == "spark" and r.json()["check"]["rows"] == 300
        assert client.get("/v1/datasets", headers=h).json()["datasets"][0]["engine"] == "spark"
        bad = client.post("/v1/datasets", json={**body, "name": "other", "engine": "polars"}, headers=h)
        assert bad.status_code == 400 and "engine" in bad.text


def test_admin_registers_a_spark_dataset(tmp_path: Path, root: Path) -> None:
    meta = tmp_path / "meta.json"
    meta.write_text(json.dumps(PEOPLE_METADATA))
    ledger = f"sqlite:///{tmp_path / 'admin.sqlite'}"
    args = [
        "register-dataset",
        "people",
        str(root / "people"),
        "--metadata",
        str(meta),
        "--engine",
        "spark",
        "--ledger",
        ledger,
    ]
    out = CliRunner().invoke(admin_app, args)
    assert out.exit_code == 0, out.output
    assert "registered dataset 'people'" in out.output and "curator only" in out.output
    listed = CliRunner().invoke(admin_app, ["list", "--json", "--ledger", ledger])
    assert json.loads(listed.output)["datasets"][0]["engine"] == "spark"
