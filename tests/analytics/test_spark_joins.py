"""Joined queries on Spark give exactly DuckDB's pre-noise aggregates (``portable=True``).

One dataset, opened twice — pandas frames on DuckDB, the same frames as pyspark DataFrames on Spark:
two private tables with several rows per person, so each private join's truncation (``join_rows``)
decides which rows are joined, a public table with two rows for one postcode (truncated to its
``max_matches``), and a key table. The privacy unit is an integer in ``visits`` and text in
``prescriptions``. The values hashed by the truncations include doubles that Java and DuckDB write
differently (``1e-05``, ``12345678.9``, integral doubles past 2**53). Each query runs on both
sessions with the noise off (the released values are the exact integers) and the same seeded
salt; every check is exact and deterministic (false-failure rate 0).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("pyspark")

from pyspark.sql import functions as F  # noqa: E402

import dpkit as dp  # noqa: E402
from analytics._ingestion_corpus import noise_off  # noqa: E402
from dpkit.analytics import Categorical, Count, Metadata, Numeric, Sum  # noqa: E402
from dpkit.analytics.dataset_metadata import DatasetMetadata  # noqa: E402
from dpkit.analytics.engines import spark_text  # noqa: E402
from dpkit.analytics.engines.spark import spark_session  # noqa: E402
from dpkit.errors import InvalidParameterError  # noqa: E402

pytestmark = [
    pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas:FutureWarning"),
    pytest.mark.filterwarnings("ignore:The copy keyword is deprecated"),  # pyspark's pandas 3 conversions
]

JOIN_ROWS = {"visits": 3, "prescriptions": 2}
#: Doubles whose text differs between Java (Spark's cast) and DuckDB: the truncation hashes them.
AWKWARD = np.array([1e-05, 12345678.9, 2.0**53 + 2.0**11, 1.5e17, 3.0e-7, 0.1, 7.25, 123456789012.5])


def _tables() -> dict[str, pd.DataFrame]:
    rng = np.random.default_rng(20261129)
    units = 24
    vn = rng.integers(1, 8, units)  # up to 7 visits a person: join_rows=3 keeps 3
    vpid = np.repeat(np.arange(units), vn)
    visits = pd.DataFrame(
        {
            "pid": vpid.astype("int64"),
            "postcode": rng.choice(np.array(["A", "B", "C", "D", "Z"]), vpid.size),
            "cost": rng.choice(AWKWARD, vpid.size) * rng.integers(1, 4, vpid.size),
            "ward": rng.choice(np.array(["w1", "w2", "w9"]), vpid.size),
        }
    )
    pn = rng.integers(0, 6, units + 4)  # 24..27: prescriptions of nobody who visited
    ppid = np.repeat(np.arange(units + 4), pn)
    prescriptions = pd.DataFrame(
        {
            "pid": ppid.astype(str),  # the unit as text here, an integer in visits
            "drug": rng.choice(np.array(["x", "y"]), ppid.size),
            "dose": rng.choice(AWKWARD, ppid.size) + rng.integers(0, 3, ppid.size),
        }
    )
    regions = pd.DataFrame(
        {"postcode": ["A", "A", "B", "C", "D", "F"], "region": ["north", "west", "north", "south", "south", None]}
    )
    wards = pd.DataFrame({"ward": ["w1", "w2", "w3"]})
    return {"visits": visits, "prescriptions": prescriptions, "regions": regions, "wards": wards}


META = DatasetMetadata(
    tables={
        "visits": Metadata(
            columns={"postcode": Categorical(), "cost": Numeric(0.0, 16.0), "ward": Categorical()},
            privacy_unit="pid",
            join_rows=JOIN_ROWS["visits"],
        ),
        "prescriptions": Metadata(
            columns={"drug": Categorical(("x", "y")), "dose": Numeric(0.0, 8.0)},
            privacy_unit="pid",
            join_rows=JOIN_ROWS["prescriptions"],
        ),
        "regions": Metadata(columns={"postcode": Categorical(), "region": Categorical()}, public=True, max_matches=1),
        "wards": Metadata(columns={"ward": Categorical()}, public=True, max_matches=1),
    },
    max_groups=8,
    max_rows=100,
)


@pytest.fixture(scope="module")
def spark():
    return spark_session()  # the process-wide cached session, left running for later modules


@pytest.fixture(scope="module")
def data(spark):
    frames = _tables()
    sparked = {name: spark.createDataFrame(df).cache() for name, df in frames.items()}
    return frames, sparked


def _session(data: dict[str, object], *, portable: bool = True) -> dp.Session:
    return dp.Session(data, metadata=META, budget=dp.Budget(epsilon=1e9), portable=portable)


def _release(s: dp.Session, query, aggregates, seed: int) -> tuple[pd.DataFrame, list[np.ndarray]]:
    """The released table and the exact integers behind it (noise off), the salt drawn from ``seed``."""
    with noise_off() as log:
        r = query(s).aggregate(aggregates, epsilon=1, rng=np.random.default_rng(seed))
    return r.table, [ints for _, ints in log]


QUERIES = {
    "public": (lambda s: s.query("visits").join("regions", on="postcode").group_by("region"), [Count(), Sum("cost")]),
    "left_public": (
        lambda s: s.query("visits").join("regions", on="postcode", how="left").group_by("region"),
        [Count(), Sum("cost")],
    ),
    "private": (
        lambda s: s.query("visits").join("prescriptions", on="pid").group_by("drug"),
        [Count(), Sum("dose"), Sum("cost")],
    ),
    "keys_from": (lambda s: s.query("visits").group_by("ward", keys_from="wards"), [Count(), Sum("cost")]),
    "chain": (
        lambda s: s.query("visits").join("prescriptions", on="pid").join("regions", on="postcode").group_by("region"),
        [Count(), Sum("dose")],
    ),
}


@pytest.mark.parametrize("name", list(QUERIES))
def test_a_joined_query_releases_what_duckdb_releases(data, name):
    frames, sparked = data
    query, aggregates = QUERIES[name]
    want_table, want = _release(_session(frames), query, aggregates, seed=7)
    got_table, got = _release(_session(sparked), query, aggregates, seed=7)
    assert len(got) == len(want) > 0
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)
    pd.testing.assert_frame_equal(got_table, want_table)
    assert want[0].sum() > 0


@pytest.mark.parametrize("name", ["private", "chain"])
def test_a_joined_query_under_ansi_mode_releases_what_duckdb_releases(data, spark, name):
    """Spark 4's default (``cast`` raises): no value can make the join fail."""
    frames, sparked = data
    query, aggregates = QUERIES[name]
    want = _release(_session(frames), query, aggregates, seed=9)[1]
    before = spark.conf.get("spark.sql.ansi.enabled")
    spark.conf.set("spark.sql.ansi.enabled", "true")
    try:
        got = _release(_session(sparked), query, aggregates, seed=9)[1]
    finally:
        spark.conf.set("spark.sql.ansi.enabled", before)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)


def test_the_truncation_decides_and_is_hashed_as_duckdb_hashes(data, monkeypatch):
    """Power: another salt keeps other rows (so the parity above is not vacuous), and hashing
    the doubles as Java writes them keeps other rows than DuckDB does."""
    frames, sparked = data
    query, aggregates = QUERIES["private"]
    duck = _release(_session(frames), query, aggregates, seed=7)[1]
    other_salt = _release(_session(frames), query, aggregates, seed=8)[1]
    assert any((a != b).any() for a, b in zip(other_salt, duck, strict=True))

    def java_text(frame, columns):
        return frame.select("*", *[F.col(c).cast("string").alias(name) for c, name in columns.items()])

    monkeypatch.setattr(spark_text, "with_double_texts", java_text)
    broken = _release(_session(sparked), query, aggregates, seed=7)[1]
    assert any((a != b).any() for a, b in zip(broken, duck, strict=True))


def test_spark_own_hashing_keeps_join_rows_per_person(data):
    """Without ``portable`` (xxhash64) which rows are kept differs, how many does not: a person's
    joined rows are min(visits, 3) · min(prescriptions, 2)."""
    frames, sparked = data
    (counts,) = _release(
        _session(sparked, portable=False),
        lambda s: s.query("visits").join("prescriptions", on="pid"),
        [Count()],
        seed=3,
    )[1]
    v = frames["visits"].groupby("pid").size().clip(upper=JOIN_ROWS["visits"])
    p = frames["prescriptions"].assign(pid=lambda d: d["pid"].astype("int64")).groupby("pid").size()
    p = p.clip(upper=JOIN_ROWS["prescriptions"])
    assert counts.tolist() == [int((v * p.reindex(v.index, fill_value=0)).sum())]


def test_public_rows_and_doubles_read_as_duckdb_reads_them(data, spark):
    """A public table's distinct rows are DuckDB's, sorted alike (NULLs last), and a double's text
    is DuckDB's for magnitudes from 1e-30 to 1e30."""
    frames, sparked = data
    duck, sp = _session(frames)._tables, _session(sparked)._tables
    for cols in [("postcode", "region"), ("region",)]:
        assert sp.engines["regions"].distinct_rows(cols) == duck.engines["regions"].distinct_rows(cols)
    rng = np.random.default_rng(5)
    x = np.concatenate(
        [
            rng.standard_normal(400) * 10.0 ** rng.integers(-30, 30, 400),
            rng.integers(2**53, 2**63 - 1, 200, dtype=np.int64).astype(float),
            [0.0, 1e-4, 1e-3, 1e7, 1e16, 2.0**53, 9999999.0, 1.5, -2.5e-5],
        ]
    )
    frame = spark_text.with_double_texts(spark.createDataFrame(pd.DataFrame({"x": x})), {"x": "text"})
    got = frame.select("text").collect()
    import duckdb

    (want,) = duckdb.execute("SELECT CAST(CAST($x AS DOUBLE[]) AS VARCHAR[])", {"x": x.tolist()}).fetchone()
    assert [r[0] for r in got] == want


def test_tables_of_two_spark_sessions_are_refused(data, spark):
    frames, sparked = data
    other = spark.newSession().createDataFrame(frames["regions"])
    with pytest.raises(InvalidParameterError, match="one SparkSession"):
        _session({**sparked, "regions": other})
