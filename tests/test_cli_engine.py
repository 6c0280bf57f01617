"""dpkit query on Parquet directories and globs, and --engine spark [--master URL] [--conf k=v]."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from dpkit.cli import app

runner = CliRunner()
SQL = "SELECT COUNT(*) FROM census"


@pytest.fixture
def parts(tmp_path: Path) -> dict[str, Path]:
    """The generated census as a Hive-partitioned Parquet directory (sex=…/part-0.parquet), its
    metadata file, and a ledger with a budget for the dataset named "census-parquet"."""
    csv, meta = tmp_path / "census.csv", tmp_path / "census.json"
    assert (
        runner.invoke(app, ["generate", "census", str(csv), "--people", "300", "--metadata", str(meta)]).exit_code == 0
    )
    root = tmp_path / "census"
    df = pd.read_csv(csv)
    for sex, part in df.groupby("sex"):
        (root / f"sex={sex}").mkdir(parents=True)
        part.drop(columns="sex").to_parquet(root / f"sex={sex}" / "part-0.parquet")
    ledger = tmp_path / "ledger.sqlite"
    made = runner.invoke(app, ["budget", "create", "census-parquet", "ann", "--epsilon", "2", "--ledger", str(ledger)])
    assert made.exit_code == 0, made.output
    return {"root": root, "meta": meta, "ledger": ledger, "rows": Path(str(len(df)))}


def query(p: dict[str, Path], data: str, *args: str):  # type: ignore[no-untyped-def]
    return runner.invoke(
        app,
        ["query", data, SQL, "--epsilon", "0.5", "--metadata", str(p["meta"]), "--ledger", str(p["ledger"]),
         "--analyst", "ann", "--table", "census", "--json", *args],
    )  # fmt: skip


@pytest.mark.parametrize("where", ["dir", "glob"])
def test_a_parquet_directory_or_glob_with_a_named_dataset(parts: dict[str, Path], where: str) -> None:
    data = str(parts["root"]) if where == "dir" else str(parts["root"] / "**" / "*.parquet")
    r = query(parts, data, "--dataset", "census-parquet")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["budget"]["dataset"] == "census-parquet"
    assert (
        abs(out["rows"][0]["count"] - int(str(parts["rows"]))) < 60
    )  # ε = 0.5, sensitivity 1: P[|noise| ≥ 60] < 1e-12


def test_a_directory_needs_a_named_dataset(parts: dict[str, Path]) -> None:
    r = query(parts, str(parts["root"]))
    assert r.exit_code != 0 and "--dataset" in r.output


def test_a_glob_that_matches_nothing_is_refused(parts: dict[str, Path]) -> None:
    r = query(parts, str(parts["root"] / "nothing*.parquet"), "--dataset", "census-parquet")
    assert r.exit_code != 0 and "glob" in r.output


@pytest.mark.parametrize(
    "args, said",
    [
        (["--engine", "polars"], "--engine"),
        (["--master", "local[2]"], "--engine spark"),
        (["--conf", "spark.x=1"], "--engine spark"),
        (["--engine", "spark", "--conf", "novalue"], "KEY=VALUE"),
        (["--engine", "spark", "--conf", "=1"], "KEY=VALUE"),
        (["--engine", "spark", "--master", "127.0.0.1:7077"], "--master must be local"),
        (["--engine", "spark", "--master", "local[0]"], "--master must be local"),
        (["--delimiter", ";"], "for CSV files"),
    ],
)
def test_bad_engine_options_are_refused_before_paying(parts: dict[str, Path], args: list[str], said: str) -> None:
    r = query(parts, str(parts["root"]), "--dataset", "census-parquet", *args)
    assert r.exit_code != 0 and said in r.output
    shown = runner.invoke(
        app, ["budget", "--ledger", str(parts["ledger"]), "--dataset", "census-parquet", "--analyst", "ann", "--json"]
    )
    assert shown.exit_code == 0 and json.loads(shown.stdout)["budgets"][0]["spent_epsilon"] == 0


def test_a_uri_needs_engine_spark(parts: dict[str, Path]) -> None:
    r = query(parts, "hdfs://namenode/census", "--dataset", "census-parquet")
    assert r.exit_code != 0 and "--engine spark" in r.output


def test_the_help_shows_the_engine_options() -> None:
    r = runner.invoke(app, ["query", "--help"], env={"COLUMNS": "200"})
    assert r.exit_code == 0
    for said in ("--engine", "duckdb|spark", "--master", "URL", "spark://host:7077", "--conf", "KEY=VALUE", "glob"):
        assert said in r.output, said


def test_engine_spark_refuses_a_file_that_is_neither_csv_nor_parquet(parts: dict[str, Path]) -> None:
    r = query(parts, str(parts["meta"]), "--engine", "spark", "--dataset", "census-parquet")
    assert r.exit_code != 0 and "reads CSV and Parquet data" in r.output


def test_engine_spark_reads_a_csv_by_dpkits_rules(parts: dict[str, Path], tmp_path: Path) -> None:
    """The CSV the fixture generated, read on Spark by dpkit's one-line-a-record reader."""
    pytest.importorskip("pyspark")
    r = query(parts, str(tmp_path / "census.csv"), "--engine", "spark", "--dataset", "census-parquet")
    assert r.exit_code == 0, r.output
    assert abs(json.loads(r.stdout)["rows"][0]["count"] - int(str(parts["rows"]))) < 60  # as above: P < 1e-12


def test_engine_spark_with_master_and_conf(parts: dict[str, Path]) -> None:
    pytest.importorskip("pyspark")
    r = query(parts, str(parts["root"]), "--dataset", "census-parquet", "--engine", "spark", "--master", "local[2]",
              "--conf", "spark.sql.shuffle.partitions=4", "--conf", "spark.ui.enabled=false")  # fmt: skip
    assert r.exit_code == 0, r.output
    assert abs(json.loads(r.stdout)["rows"][0]["count"] - int(str(parts["rows"]))) < 60
