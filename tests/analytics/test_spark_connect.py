"""dpkit on Spark Connect: a DataFrame from ``SparkSession.builder.remote(...)`` runs the same plans.

The Spark engine uses the DataFrame API only, so a Spark Connect client's DataFrame (a different
class, talking gRPC to a server) is accepted as it is. The module starts a Spark Connect server
(the connect jar that ships with pyspark, local[2], bound to 127.0.0.1 on a free port; about 6 s)
and checks: the pre-noise aggregates and the quantile cell counts equal DuckDB's on the same rows,
and a private median through the public Session API. Skipped when pyspark's connect extra
(grpcio) or Java is missing, or the server does not come up in 90 s.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("pyspark")
pytest.importorskip("grpc")

import dpkit as dp  # noqa: E402
from dpkit.analytics import Categorical, Metadata, Numeric  # noqa: E402
from dpkit.analytics.engines.duckdb import DuckDBEngine  # noqa: E402
from dpkit.analytics.engines.spark import SparkEngine, _ensure_java  # noqa: E402
from dpkit.analytics.plan import AggregationPlan, GroupKey, ValueSpec, quantize_spec  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def remote(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    import pyspark
    from pyspark.sql import SparkSession

    try:
        _ensure_java()
    except Exception as exc:  # noqa: BLE001 - no Java: nothing to test here
        pytest.skip(f"no Java for Spark: {exc}")
    home = Path(pyspark.__file__).parent
    jars = sorted((home / "jars").glob("spark-connect_*.jar"))
    if not jars:
        pytest.skip("this pyspark ships no Spark Connect server jar")
    port = _free_port()
    log = tmp_path_factory.mktemp("connect") / "server.log"
    # builder.remote() turns the whole process to Connect mode (SPARK_CONNECT_MODE_ENABLED in
    # os.environ): put the environment back afterwards, or later classic sessions fail
    saved = {k: os.environ.get(k) for k in ("SPARK_CONNECT_MODE_ENABLED", "SPARK_REMOTE", "SPARK_API_MODE")}
    with log.open("w") as err:
        proc = subprocess.Popen(
            [str(home / "bin" / "spark-submit"), "--class", "org.apache.spark.sql.connect.service.SparkConnectServer",
             "--master", "local[2]", "--conf", f"spark.connect.grpc.binding.port={port}",
             "--conf", "spark.connect.grpc.binding.address=127.0.0.1", "--conf", "spark.ui.enabled=false",
             "--conf", "spark.sql.shuffle.partitions=4", "--conf", "spark.sql.session.timeZone=UTC", str(jars[0])],
            stdout=subprocess.DEVNULL, stderr=err, start_new_session=True,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.skip(f"the Spark Connect server did not start (log: {log.read_text()[-500:]!r})")
                time.sleep(0.5)
        # Spark refuses a remote session beside a classic one (SESSION_ALREADY_EXIST): stop the
        # classic session another module of this test process may have left running; the next
        # spark_session() starts a new one.
        from pyspark import SparkContext

        if SparkSession._instantiatedSession is not None:
            SparkSession._instantiatedSession.stop()
        if SparkContext._active_spark_context is not None:
            SparkContext._active_spark_context.stop()
        spark = SparkSession.builder.remote(f"sc://127.0.0.1:{port}").getOrCreate()
        yield spark
        spark.stop()
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        with_group = getattr(os, "killpg", None)
        if with_group is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)


def _table(n: int = 6_000) -> pd.DataFrame:
    rng = np.random.default_rng(11)
    return pd.DataFrame(
        {"pid": rng.integers(0, 1_500, n), "g": rng.integers(0, 3, n), "age": rng.integers(18, 90, n).astype(float)}
    )


def test_a_connect_dataframe_is_a_spark_source(remote: Any) -> None:
    from pyspark.sql.connect.dataframe import DataFrame as ConnectFrame

    df = remote.createDataFrame(_table(10))
    assert isinstance(df, ConnectFrame)
    assert SparkEngine(df).schema() == {"pid": "numeric", "g": "numeric", "age": "numeric"}


def test_aggregates_and_cells_equal_duckdb(remote: Any) -> None:
    pdf = _table()
    plan = AggregationPlan(
        unit="pid", where=None, groups=(GroupKey("g"),), key_filter=(None,), max_groups=2, max_rows=3,
        sums=(quantize_spec("s0", "age", 0.0, 100.0, centered=True),), values=(ValueSpec("age", 0.0, 100.0, 100),),
        salt=42, portable=True,
    )  # fmt: skip
    got, got_cells = SparkEngine(remote.createDataFrame(pdf)).compute(plan)
    want, want_cells = DuckDBEngine(pdf).compute(plan)
    key = ["g0"]
    pd.testing.assert_frame_equal(
        got.sort_values(key).reset_index(drop=True)[want.columns], want.sort_values(key).reset_index(drop=True),
        check_dtype=False,
    )  # fmt: skip
    assert got_cells is not None and want_cells is not None
    cols = ["g0", "__k", "__cell"]
    pd.testing.assert_frame_equal(
        got_cells.sort_values(cols).reset_index(drop=True)[want_cells.columns],
        want_cells.sort_values(cols).reset_index(drop=True),
        check_dtype=False,
    )


def test_a_private_median_over_connect(remote: Any) -> None:
    pdf = _table()
    meta = Metadata(columns={"age": Numeric(0, 100), "g": Categorical((0, 1, 2))}, privacy_unit="pid")
    s = dp.Session(remote.createDataFrame(pdf), engine="spark", metadata=meta, budget=dp.Budget(epsilon=5.0),
                   rng=np.random.default_rng(3))  # fmt: skip
    r = s.sql("SELECT g, MEDIAN(age) AS m FROM data GROUP BY g", epsilon=3.0)
    assert len(r.table) == 3 and s.remaining == pytest.approx(2.0)
    # ε = 1 per group on ~2,000 rows of integer ages: within 3 years of the true median with
    # probability above 1 − 1e-9 per group (fixed seed)
    truth = pdf.groupby("g")["age"].median()
    for g, m in zip(r.table["g"], r.table["m"], strict=True):
        assert abs(float(m) - float(truth[g])) <= 3 and float(m) == round(float(m))


def test_a_synthetic_table_over_connect(remote: Any) -> None:
    from dpkit.synth import Synthesizer

    pdf = _table()
    meta = Metadata(columns={"age": Numeric(0, 100), "g": Categorical((0, 1, 2))}, privacy_unit="pid")
    syn = Synthesizer(epsilon=2.0, delta=1e-9, metadata=meta, bins={"age": 5}, rng=np.random.default_rng(4))
    syn.fit(remote.createDataFrame(pdf))
    assert syn.report is not None and abs(syn.report.rows - pdf["pid"].nunique()) < 100  # 1,500 people, σ ≈ 4
    rows = syn.sample(500)
    assert list(rows.columns) == ["age", "g"] and len(rows) == 500


def test_a_join_over_connect_releases_what_duckdb_releases(remote: Any) -> None:
    """A dataset of Connect DataFrames (which answer every attribute with a column, so they must
    not pass for engines) joins on a unit stored as an integer and as text, exactly as DuckDB."""
    from analytics._ingestion_corpus import noise_off
    from analytics.test_spark_joins import QUERIES, _session, _tables

    frames = _tables()
    query, aggregates = QUERIES["chain"]
    released = []
    for data in (frames, {name: remote.createDataFrame(df) for name, df in frames.items()}):
        with noise_off() as log:
            query(_session(data)).aggregate(aggregates, epsilon=1, rng=np.random.default_rng(7))
        released.append([ints for _, ints in log])
    for got, want in zip(released[1], released[0], strict=True):
        np.testing.assert_array_equal(got, want)
