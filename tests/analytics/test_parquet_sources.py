"""Session.from_parquet: a file, a directory (Hive-partitioned too) or a glob; DuckDB's out-of-core
knobs; every bad path or knob refused before anything is read or spent."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import dpkit as dp
from dpkit.analytics import Categorical, Metadata, Numeric
from dpkit.errors import InvalidParameterError

META = Metadata(columns={"age": Numeric(0, 100), "year": Categorical((2020, 2021))}, privacy_unit="pid")


def people(n: int = 3_000, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame({"pid": np.arange(n), "age": rng.integers(18, 90, n).astype(float), "year": rng.choice([2020, 2021], n)})


@pytest.fixture
def hive(tmp_path: Path) -> tuple[Path, pd.DataFrame]:
    """people() as a Hive-partitioned directory: year=2020/part-*.parquet, year=2021/… (the
    partition column is only in the directory names)."""
    df = people()
    root = tmp_path / "people"
    for year, part in df.groupby("year"):
        d = root / f"year={year}"
        d.mkdir(parents=True)
        half = len(part) // 2
        for i, chunk in enumerate((part.iloc[:half], part.iloc[half:])):
            pq.write_table(pa.Table.from_pandas(chunk.drop(columns="year"), preserve_index=False), d / f"part-{i}.parquet")
    return root, df


def exact_count(s: dp.Session) -> int:
    """The number of rows the session reads: a count at a huge ε (discrete Laplace of scale
    1e-6: exact with probability 1 − 1e-400000)."""
    return int(s.count(epsilon=1e6).table["count"][0])


def test_a_file(tmp_path: Path) -> None:
    df = people()
    path = tmp_path / "people.parquet"
    df.to_parquet(path)
    s = dp.Session.from_parquet(path, metadata=META, budget=dp.Budget(epsilon=1e7), rng=np.random.default_rng(1))
    assert s.table == "people" and exact_count(s) == len(df)


def test_a_hive_partitioned_directory(hive: tuple[Path, pd.DataFrame]) -> None:
    root, df = hive
    s = dp.Session.from_parquet(root, metadata=META, budget=dp.Budget(epsilon=1e7), rng=np.random.default_rng(1))
    assert exact_count(s) == len(df)
    by_year = s.group_by("year").count(epsilon=1e6).table
    assert dict(zip(by_year["year"], by_year["count"].astype(int), strict=True)) == df["year"].value_counts().to_dict()


def test_a_glob(hive: tuple[Path, pd.DataFrame]) -> None:
    root, df = hive
    s = dp.Session.from_parquet(root / "year=2020" / "*.parquet", metadata=Metadata(columns={"age": Numeric(0, 100)}, privacy_unit="pid"),
                                budget=dp.Budget(epsilon=1e7), rng=np.random.default_rng(1))  # fmt: skip
    assert exact_count(s) == int((df["year"] == 2020).sum())
    recursive = dp.Session.from_parquet(root / "**" / "*.parquet", metadata=META, budget=dp.Budget(epsilon=1e7), rng=np.random.default_rng(1))
    assert exact_count(recursive) == len(df)


@pytest.mark.parametrize(
    "where, accepted",
    [("nothing/*.parquet", "a glob that matches"), ("empty", "a directory holding"), ("missing.parquet", "an existing CSV or Parquet file")],
)
def test_a_path_that_matches_nothing_is_refused_before_paying(tmp_path: Path, where: str, accepted: str) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "notes.txt").write_text("not parquet")
    budget = dp.Budget(epsilon=1.0)
    with pytest.raises(InvalidParameterError, match=accepted):
        dp.Session.from_parquet(tmp_path / where, metadata=META, budget=budget)
    assert budget.spent == (0.0, 0.0)


def test_memory_limit_and_temp_directory_are_set(tmp_path: Path) -> None:
    path = tmp_path / "p.parquet"
    people(100).to_parquet(path)
    spill = tmp_path / "spill"
    s = dp.Session.from_parquet(path, metadata=META, budget=dp.Budget(epsilon=1.0), memory_limit="256MB", temp_directory=spill)
    con = s.engine._con  # type: ignore[attr-defined]
    limit = con.execute("SELECT current_setting('memory_limit')").fetchone()[0]
    assert limit.replace(" ", "").upper() in ("256.0MB", "244.1MIB", "256MB")
    assert Path(con.execute("SELECT current_setting('temp_directory')").fetchone()[0]) == spill


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"memory_limit": "lots"}, "memory_limit"),
        ({"memory_limit": 4}, "memory_limit"),
        ({"temp_directory": ""}, "temp_directory"),
        ({"temp_directory": 3}, "temp_directory"),
        ({"engine": "polars"}, "engine"),
        ({"engine": "spark", "memory_limit": "1GB"}, "memory_limit"),
        ({"spark": object()}, "spark"),
    ],
)
def test_bad_knobs_are_refused(tmp_path: Path, kwargs: dict[str, object], name: str) -> None:
    path = tmp_path / "p.parquet"
    people(10).to_parquet(path)
    budget = dp.Budget(epsilon=1.0)
    with pytest.raises(InvalidParameterError, match=name):
        dp.Session.from_parquet(path, metadata=META, budget=budget, **kwargs)
    assert budget.spent == (0.0, 0.0)


def test_a_temp_directory_that_is_a_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "p.parquet"
    people(10).to_parquet(path)
    with pytest.raises(InvalidParameterError, match="temp_directory"):
        dp.Session.from_parquet(path, metadata=META, temp_directory=path)
