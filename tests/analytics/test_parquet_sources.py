"""Session.from_parquet: a file, a directory (Hive-partitioned too) or a glob, on DuckDB and on Spark,
with the same files and partition columns on both; DuckDB's out-of-core knobs (memory_limit,
temp_directory) on every session that opens a DuckDB connection; every bad path or knob refused
before anything is read or spent."""

from __future__ import annotations

from pathlib import Path

import duckdb
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import dpkit as dp
from dpkit.analytics import Categorical, Metadata, Numeric
from dpkit.analytics.engines.base import default_table
from dpkit.analytics.engines.duckdb import MIN_MEMORY_PER_THREAD, DuckDBEngine
from dpkit.analytics.engines.parquet_source import parquet_files
from dpkit.errors import InvalidParameterError, QueryFailedError

META = Metadata(columns={"age": Numeric(0, 100), "year": Categorical((2020, 2021))}, privacy_unit="pid")
AGE = Metadata(columns={"age": Numeric(0, 100)}, privacy_unit="pid")


def people(n: int = 3_000, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame(
        {"pid": np.arange(n), "age": rng.integers(18, 90, n).astype(float), "year": rng.choice([2020, 2021], n)}
    )


def write_hive(root: Path, df: pd.DataFrame) -> None:
    """``df`` as root/year=Y/part-{0,1}.parquet (the partition column only in the directory names)."""
    for year, part in df.groupby("year"):
        d = root / f"year={year}"
        d.mkdir(parents=True)
        half = len(part) // 2
        for i, chunk in enumerate((part.iloc[:half], part.iloc[half:])):
            pq.write_table(
                pa.Table.from_pandas(chunk.drop(columns="year"), preserve_index=False), d / f"part-{i}.parquet"
            )


@pytest.fixture
def hive(tmp_path: Path) -> tuple[Path, pd.DataFrame]:
    df = people()
    root = tmp_path / "people"
    write_hive(root, df)
    return root, df


def session(path: object, metadata: Metadata = META, **kwargs: object) -> dp.Session:
    return dp.Session.from_parquet(
        path, metadata=metadata, budget=dp.Budget(epsilon=1e7), rng=np.random.default_rng(1), **kwargs
    )  # type: ignore[arg-type]


def exact_count(s: dp.Session) -> int:
    """The number of rows the session reads: a count at a huge ε (discrete Laplace of scale
    1e-6: exact with probability 1 − 1e-400000)."""
    return int(s.count(epsilon=1e6).table["count"][0])


def counts_by_year(s: dp.Session) -> dict[int, int]:
    t = s.group_by("year").count(epsilon=1e6).table
    return dict(zip(t["year"].astype(int), t["count"].astype(int), strict=True))


def setting(s: dp.Session, name: str) -> str:
    return s.engine._con.execute(f"SELECT current_setting('{name}')").fetchone()[0]  # type: ignore[attr-defined]


def rendered(limit: str) -> str:
    """How DuckDB shows ``limit`` once set (``'256MB'`` → ``'244.1 MiB'``)."""
    con = duckdb.connect()
    con.execute(f"SET memory_limit = '{limit}'")
    return con.execute("SELECT current_setting('memory_limit')").fetchone()[0]


#: A memory limit every machine's DuckDB accepts (at least 32 MiB per thread).
THREADS = int(duckdb.connect().execute("SELECT current_setting('threads')").fetchone()[0])
LIMIT = f"{max(256, 2 * MIN_MEMORY_PER_THREAD * THREADS // 2**20)}MiB"


# -- sources ----------------------------------------------------------------------------------------


def test_a_file(tmp_path: Path) -> None:
    df = people()
    path = tmp_path / "people.parquet"
    df.to_parquet(path)
    s = session(path)
    assert s.table == "people" and exact_count(s) == len(df)


def test_the_table_is_named_after_the_directory(hive: tuple[Path, pd.DataFrame]) -> None:
    """As a file is named after its stem, a directory is named after itself and a glob after its
    last directory; ``table=`` names it otherwise, and a glob with no directory is ``data``."""
    root, _ = hive
    for path in (root, f"{root}/", root / "**" / "*.parquet", root / "year=*" / "*.parquet"):
        assert session(path).table == "people", path
    assert session(root, table="events").table == "events"
    spark_dir = root.parent / "events.parquet"  # as Spark writes a table: a directory with a suffix
    root.rename(spark_dir)
    assert session(spark_dir).table == "events"
    assert default_table("*.parquet") == "data" and default_table("s3a://bucket/events/") == "events"


def test_a_hive_partitioned_directory(hive: tuple[Path, pd.DataFrame]) -> None:
    root, df = hive
    s = session(root)
    assert s.table == "people" and exact_count(s) == len(df)  # named after the directory
    assert counts_by_year(s) == df["year"].value_counts().to_dict()


def test_a_glob(hive: tuple[Path, pd.DataFrame]) -> None:
    root, df = hive
    assert exact_count(session(root / "year=2020" / "*.parquet", AGE)) == int((df["year"] == 2020).sum())
    recursive = session(str(root / "**" / "*.parquet"))
    assert counts_by_year(recursive) == df["year"].value_counts().to_dict()


def test_a_partition_named_directly_keeps_its_column(hive: tuple[Path, pd.DataFrame]) -> None:
    """people/year=2020 (a directory or a glob in it) has the year column, as the whole tree does:
    the partition columns are the key=value directories the files sit in."""
    root, df = hive
    n = int((df["year"] == 2020).sum())
    assert counts_by_year(session(root / "year=2020")) == {2020: n, 2021: 0}
    assert counts_by_year(session(root / "year=2020" / "*.parquet")) == {2020: n, 2021: 0}


def test_two_levels_of_partitions_through_a_recursive_glob(tmp_path: Path) -> None:
    df = people(600).assign(month=lambda d: 1 + d["pid"] % 3)
    for (year, month), part in df.groupby(["year", "month"]):
        d = tmp_path / "t" / f"year={year}" / f"month={month}"
        d.mkdir(parents=True)
        part.drop(columns=["year", "month"]).to_parquet(d / "part-0.parquet")
    meta = Metadata(columns={"month": Categorical((1, 2, 3)), "year": Categorical((2020, 2021))}, privacy_unit="pid")
    found = parquet_files(tmp_path / "t" / "**" / "*.parquet")
    assert found is not None and found.hive and found.base == tmp_path / "t" and len(found.files) == 6
    t = session(tmp_path / "t" / "**" / "*.parquet", meta).group_by("year", "month").count(epsilon=1e6).table
    got = {(int(y), int(m)): int(c) for y, m, c in zip(t["year"], t["month"], t["count"], strict=True)}
    assert got == df.groupby(["year", "month"]).size().to_dict()


def test_files_spark_leaves_are_skipped(hive: tuple[Path, pd.DataFrame]) -> None:
    """_SUCCESS, an unfinished job's _temporary/ and dot files hold no data (Spark skips them too);
    other files than .parquet/.pq in a directory are not read either."""
    root, df = hive
    (root / "_SUCCESS").write_text("")
    (root / "notes.txt").write_text("not parquet")
    stale = root / "_temporary" / "0" / "year=2020"
    stale.mkdir(parents=True)
    people(50, seed=9).drop(columns="year").to_parquet(stale / "part-9.parquet")
    people(50, seed=9).drop(columns="year").to_parquet(root / "year=2021" / ".part-9.parquet")
    found = parquet_files(root)
    assert found is not None and len(found.files) == 4
    assert exact_count(session(root)) == len(df)
    assert exact_count(session(root / "**" / "*.parquet")) == len(df)


def test_the_schema_comes_from_the_footers_not_the_rows(tmp_path: Path) -> None:
    """A file whose data pages are destroyed (footer intact) still opens a session with the
    declared kinds: nothing but the metadata is read before a query is paid for."""
    path = tmp_path / "broken.parquet"
    pq.write_table(pa.Table.from_pandas(people(2_000), preserve_index=False), path, compression="none")
    raw = bytearray(path.read_bytes())
    footer = int.from_bytes(raw[-8:-4], "little")
    end = len(raw) - 8 - footer
    raw[8:end] = b"\xff" * (end - 8)  # every data page, after the leading magic
    path.write_bytes(bytes(raw))
    s = session(path)
    assert s.engine.schema() == {"pid": "numeric", "age": "numeric", "year": "numeric"}
    assert sorted(s.columns) == ["age", "pid", "year"]
    with pytest.raises(QueryFailedError):  # the rows really are unreadable: only a query finds out
        s.count(epsilon=1.0)


@pytest.mark.parametrize(
    "where, accepted",
    [
        ("nothing/*.parquet", "a glob that matches"),
        ("empty", "a directory holding"),
        ("missing.parquet", "an existing CSV or Parquet file"),
        ("empty/**/*.parquet", "a glob that matches"),
        ("people.csv", "a Parquet file"),
    ],
)
def test_a_path_that_matches_nothing_is_refused_before_paying(tmp_path: Path, where: str, accepted: str) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "notes.txt").write_text("not parquet")
    (tmp_path / "empty" / "_SUCCESS").write_text("")
    people(10).to_csv(tmp_path / "people.csv", index=False)
    budget = dp.Budget(epsilon=1.0)
    with pytest.raises(InvalidParameterError, match=accepted) as caught:
        dp.Session.from_parquet(tmp_path / where, metadata=META, budget=budget)
    assert caught.value.name == "data" and budget.spent == (0.0, 0.0)


# -- memory_limit and temp_directory ----------------------------------------------------------------


def test_memory_limit_and_temp_directory_are_set(tmp_path: Path) -> None:
    path = tmp_path / "p.parquet"
    people(100).to_parquet(path)
    spill = tmp_path / "spill"
    s = session(path, memory_limit=LIMIT, temp_directory=spill)
    assert setting(s, "memory_limit") == rendered(LIMIT)
    assert Path(setting(s, "temp_directory")) == spill


def test_every_duckdb_session_takes_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Session(df), from_csv and from_parquet; a relative temp_directory is made absolute (DuckDB
    would resolve it only when it spills, from whatever the working directory is then)."""
    df = people(200)
    csv = tmp_path / "people.csv"
    df.to_csv(csv, index=False)
    monkeypatch.chdir(tmp_path)
    made = [
        dp.Session(df, metadata=META, budget=dp.Budget(epsilon=1e7), memory_limit=LIMIT, temp_directory="spill"),
        dp.Session.from_csv(
            csv, metadata=META, budget=dp.Budget(epsilon=1e7), memory_limit=LIMIT, temp_directory="spill"
        ),
    ]
    for s in made:
        assert setting(s, "memory_limit") == rendered(LIMIT)
        assert Path(setting(s, "temp_directory")) == tmp_path / "spill"
        assert exact_count(s) == len(df)


def test_a_query_at_the_least_memory_allowed_is_exact(tmp_path: Path) -> None:
    """At the smallest limit accepted (32 MiB per thread), a median and a count over 200,000 rows
    with a group-by run (spilling where they must) and the count is exact."""
    rng = np.random.default_rng(5)
    n = 200_000
    df = pd.DataFrame(
        {
            "pid": rng.integers(0, n // 3, n),
            "age": rng.integers(18, 90, n).astype(float),
            "year": rng.choice([2020, 2021], n),
        }
    )
    write_hive(tmp_path / "big", df)
    least = f"{MIN_MEMORY_PER_THREAD * THREADS // 2**20}MiB"
    s = session(tmp_path / "big", max_rows=100, max_groups=2, memory_limit=least, temp_directory=tmp_path / "spill")
    t = s.sql("SELECT year, COUNT(*), MEDIAN(age) FROM big GROUP BY year", epsilon=1e6).table
    assert dict(zip(t["year"].astype(int), t["count"].astype(int), strict=True)) == df["year"].value_counts().to_dict()
    assert t["median_age"].between(18, 90).all()


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"memory_limit": "lots"}, "memory_limit"),
        ({"memory_limit": 4}, "memory_limit"),
        ({"memory_limit": "4"}, "memory_limit"),
        ({"memory_limit": "-1GB"}, "memory_limit"),
        ({"memory_limit": "16MB"}, "memory_limit"),  # under 32 MiB per thread
        ({"memory_limit": "1PB"}, "memory_limit"),
        ({"temp_directory": ""}, "temp_directory"),
        ({"temp_directory": 3}, "temp_directory"),
        ({"engine": "polars"}, "engine"),
        ({"engine": "spark", "memory_limit": "1GB"}, "memory_limit"),
        ({"engine": "spark", "temp_directory": "/tmp"}, "temp_directory"),
        ({"spark": object()}, "spark"),
    ],
)
def test_bad_knobs_are_refused(tmp_path: Path, kwargs: dict[str, object], name: str) -> None:
    path = tmp_path / "p.parquet"
    people(10).to_parquet(path)
    budget = dp.Budget(epsilon=1.0)
    with pytest.raises(InvalidParameterError, match=name) as caught:
        dp.Session.from_parquet(path, metadata=META, budget=budget, **kwargs)
    assert caught.value.name == name and budget.spent == (0.0, 0.0)


def test_a_memory_limit_under_the_floor_says_why(tmp_path: Path) -> None:
    df = people(10)
    with pytest.raises(InvalidParameterError, match=f"32MiB for each of DuckDB's {THREADS} threads") as caught:
        dp.Session(df, metadata=META, budget=dp.Budget(epsilon=1.0), memory_limit="1MB")
    assert "fails after it is paid for" in str(caught.value)


def test_a_temp_directory_that_is_a_file_or_under_one_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "p.parquet"
    people(10).to_parquet(path)
    for where in (path, path / "spill"):
        with pytest.raises(InvalidParameterError, match="temp_directory.*is a file"):
            dp.Session.from_parquet(path, metadata=META, budget=dp.Budget(epsilon=1.0), temp_directory=where)


def test_the_knobs_are_refused_where_the_connection_is_not_the_sessions(tmp_path: Path) -> None:
    """An engine or connection of the caller's own (and a relation, which runs on DuckDB's default
    connection) keeps its settings: the caller sets them there."""
    df = people(10)
    con = duckdb.connect()
    con.register("t", df)
    budget = dp.Budget(epsilon=1.0)
    attempts = [
        lambda: dp.Session(df, engine=DuckDBEngine(df), metadata=META, budget=budget, memory_limit=LIMIT),
        lambda: dp.Session.from_duckdb(con, "t", metadata=META, budget=budget, temp_directory=tmp_path),
        lambda: dp.Session(
            duckdb.sql("SELECT 1 AS pid, 30.0 AS age, 2020 AS year"), metadata=META, budget=budget, memory_limit=LIMIT
        ),
    ]
    for attempt in attempts:
        with pytest.raises(InvalidParameterError, match="memory_limit|temp_directory"):
            attempt()
    assert budget.spent == (0.0, 0.0)
    before = tuple(duckdb.sql("SELECT current_setting('memory_limit')").fetchall()[0])
    assert before != (rendered(LIMIT),)  # the default connection was not changed


# -- Spark (marked spark by its fixture, see tests/conftest.py) --------------------------------------


@pytest.fixture(scope="module")
def spark():  # type: ignore[no-untyped-def]
    pytest.importorskip("pyspark")
    from dpkit.analytics.engines.spark import spark_session

    return spark_session()


@pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas:FutureWarning")
def test_spark_reads_the_same_files_and_partitions(spark, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """engine="spark": a Hive directory (with _SUCCESS and a stale _temporary/ that must not be
    read), a recursive glob over two partition levels (Hadoop's own globs have no recursive **,
    and lose the partition columns of globbed files) and a file:// URI give the same counts as
    DuckDB; a path that matches nothing is refused before anything is spent."""
    df = people(400).assign(month=lambda d: 1 + d["pid"] % 2)
    for (year, month), part in df.groupby(["year", "month"]):
        d = tmp_path / "t" / f"year={year}" / f"month={month}"
        d.mkdir(parents=True)
        part.drop(columns=["year", "month"]).to_parquet(d / "part-0.parquet")
    (tmp_path / "t" / "_SUCCESS").write_text("")
    (tmp_path / "t" / "_temporary").mkdir()
    people(7).to_parquet(tmp_path / "t" / "_temporary" / "part-9.parquet")
    meta = Metadata(columns={"month": Categorical((1, 2)), "year": Categorical((2020, 2021))}, privacy_unit="pid")
    expected = df.groupby(["year", "month"]).size().to_dict()
    for where in (tmp_path / "t", tmp_path / "t" / "**" / "*.parquet", (tmp_path / "t").as_uri()):
        s = session(where, meta, engine="spark", spark=spark)
        assert s.engine.name == "spark"
        t = s.group_by("year", "month").count(epsilon=1e6).table
        assert {
            (int(y), int(m)): int(c) for y, m, c in zip(t["year"], t["month"], t["count"], strict=True)
        } == expected, where
    budget = dp.Budget(epsilon=1.0)
    for where in (tmp_path / "nothing*.parquet", (tmp_path / "nothing").as_uri()):
        with pytest.raises(InvalidParameterError, match="glob|Spark can read") as caught:
            dp.Session.from_parquet(where, engine="spark", spark=spark, metadata=meta, budget=budget)
        assert caught.value.name == "data"
    assert budget.spent == (0.0, 0.0)
