"""The service's datasets: registered only from under the data root (no ``..``, no symlink out of
it, regular files of the accepted kinds), errors that quote neither file contents nor server
paths, and the shared read-only copies every worker process opens instead of loading its own.

Every check here is deterministic (false-failure rate 0)."""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pandas as pd
import pytest

from dpkit.errors import InvalidDataError, InvalidParameterError
from dpkit.server import DatasetUnavailableError, QueryRequest, Service
from dpkit.server.datasets import copy_name, default_dataset_dir, resolve_source
from server._api import PEOPLE_METADATA, write_people

SHADOW_LINE = "root:*:20228:0:99999:7:::"
AGE_ONLY = {"row_level": True, "columns": {"age": {"type": "numeric", "lower": 0, "upper": 100}}}


@dataclass
class Root:
    """A data root with ``people.csv`` in it, a directory outside it holding a secret file, and a
    service over a ledger that lives outside the root too."""

    root: Path
    outside: Path
    ledger: Path
    service: Service

    @property
    def url(self) -> str:
        return f"sqlite:///{self.ledger}"


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Root]:
    root = tmp_path / "data"
    outside = tmp_path / "elsewhere"
    root.mkdir()
    outside.mkdir()
    write_people(root / "people.csv")
    (outside / "shadow.csv").write_text(f"{SHADOW_LINE}\ndaemon:*:20228:0:99999:7:::\n")
    ledger = tmp_path / "ledger.sqlite"
    service = Service(f"sqlite:///{ledger}", data_root=root)
    try:
        yield Root(root, outside, ledger, service)
    finally:
        service.close()


def refused(env: Root, source: Any, metadata: dict[str, Any] = AGE_ONLY, **kwargs: Any) -> InvalidParameterError:
    """Register ``source`` expecting a refusal naming ``source`` that repeats no server path
    outside the root and no content of the file; nothing is registered or copied."""
    before = env.service.datasets()
    with pytest.raises(InvalidParameterError) as info:
        env.service.register_dataset("leak", source, metadata, **kwargs)
    err = info.value
    assert err.name == "source", err
    text = str(err)
    assert (
        str(env.outside) not in text and str(env.root) not in text and SHADOW_LINE not in text and "root:*" not in text
    ), text
    assert "data root" in text, text  # says what is accepted
    assert env.service.datasets() == before
    assert not list(default_dataset_dir(env.url).glob("leak-*"))  # nothing was copied
    return err


# ------------------------------------------------------------------------------------------------
# the data root
# ------------------------------------------------------------------------------------------------


def test_a_symlink_leaving_the_root_is_refused(env: Root) -> None:
    """A link inside the root to a file outside it (standing in for /etc/shadow) is refused, by
    its name relative to the root and by its absolute path; without a data root the same link
    is followed (the power check: the refusal comes from the root, not from the file)."""
    link = env.root / "shadow.csv"
    link.symlink_to(env.outside / "shadow.csv")
    refused(env, "shadow.csv")
    refused(env, link)
    nested = env.root / "sub"
    nested.mkdir()
    (nested / "up").symlink_to(env.outside, target_is_directory=True)
    refused(env, "sub/up/shadow.csv")  # a directory link out of the root, then a plain name
    with (
        Service(f"sqlite:///{env.ledger.with_name('admin.sqlite')}") as admin,
        pytest.raises(InvalidParameterError) as info,
    ):
        admin.register_dataset("leak", link, AGE_ONLY)
    assert info.value.name == "metadata.columns.age"  # read: only the metadata check stopped it


@pytest.mark.parametrize("source", ["../elsewhere/shadow.csv", "sub/../people.csv", "./../data/people.csv"])
def test_dot_dot_is_refused(env: Root, source: str) -> None:
    """``..`` is refused even where the path would lead back inside the root."""
    (env.root / "sub").mkdir()
    err = refused(env, source)
    assert "'..'" in str(err)


def test_an_absolute_path_outside_the_root_is_refused_without_repeating_it(env: Root) -> None:
    err = refused(env, env.outside / "shadow.csv")
    assert "outside the data root" in str(err)
    refused(env, env.outside / "missing.csv")  # a missing file reads the same: nothing learnt about what exists


@pytest.mark.parametrize("make", ["directory", "wrong suffix", "link to wrong kind", "missing", "fifo"])
def test_only_regular_data_files_are_accepted(env: Root, make: str) -> None:
    if make == "directory":
        (env.root / "dir.csv").mkdir()
        source = "dir.csv"
    elif make == "wrong suffix":
        (env.root / "notes.txt").write_text("age\n1\n")
        source = "notes.txt"
    elif make == "link to wrong kind":
        (env.root / "notes.txt").write_text("age\n1\n")
        (env.root / "notes.csv").symlink_to(env.root / "notes.txt")
        source = "notes.csv"
    elif make == "missing":
        source = "nothing.csv"
    else:
        os.mkfifo(env.root / "pipe.csv")
        source = "pipe.csv"
    refused(env, source)


@pytest.mark.parametrize("bad", ["", None, 3, "x\x00.csv"])
def test_a_source_that_is_not_a_path_is_refused(env: Root, bad: Any) -> None:
    refused(env, bad)


def test_a_symlink_inside_the_root_is_followed_and_stored_as_its_target(env: Root) -> None:
    """Allowed: the real path is checked (and read), so what is read is always under the root."""
    (env.root / "current.csv").symlink_to(env.root / "people.csv")
    info = env.service.register_dataset("people", "current.csv", PEOPLE_METADATA)
    assert info.source == "people.csv"


def test_sources_are_stored_and_listed_relative_to_the_root(env: Root) -> None:
    (env.root / "2024").mkdir()
    write_people(env.root / "2024" / "people.csv", n=50)
    a = env.service.register_dataset("people", env.root / "people.csv", PEOPLE_METADATA)  # absolute, inside
    b = env.service.register_dataset("people_2024", "2024/people.csv", PEOPLE_METADATA)  # relative
    assert (a.source, b.source) == ("people.csv", "2024/people.csv")
    assert [d.source for d in env.service.datasets()] == ["people.csv", "2024/people.csv"]
    assert not any(str(env.root) in repr(d) for d in env.service.datasets())


def test_resolve_source_without_a_root_is_the_administrators_own(tmp_path: Path) -> None:
    write_people(tmp_path / "p.csv")
    assert resolve_source(tmp_path / "p.csv", None).stored == str((tmp_path / "p.csv").absolute())


# ------------------------------------------------------------------------------------------------
# errors quote no content and no server path
# ------------------------------------------------------------------------------------------------


def test_metadata_mismatch_names_declared_columns_only(env: Root) -> None:
    """A file whose header is data (a password file's first line) and metadata declaring other
    columns: the error names the declared columns it misses and counts the file's other columns
    without naming them."""
    (env.root / "headerless.csv").write_text(f"{SHADOW_LINE}\ndaemon:*:20228:0:99999:7:::\n")
    with pytest.raises(InvalidParameterError) as info:
        env.service.register_dataset(
            "leak",
            "headerless.csv",
            {"privacy_unit": "uid", "columns": {"age": {"type": "numeric", "lower": 0, "upper": 1}}},
        )
    text = str(info.value)
    assert (
        info.value.name == "metadata.columns.age" and "'age'" in text and "'uid'" in text and "1 other column" in text
    ), text
    assert "root" not in text and "20228" not in text and str(env.root) not in text, text
    assert env.service.datasets() == []
    # the failed registration leaves no copy behind
    assert not any(p.suffix == ".duckdb" for p in default_dataset_dir(env.url).glob("*"))


def test_an_unreadable_source_names_no_path(env: Root) -> None:
    (env.root / "dup.csv").write_text("a,a\n1,2\n")  # the header does not name every column once
    with pytest.raises(InvalidDataError) as info:
        env.service.register_dataset(
            "dup", "dup.csv", {"row_level": True, "columns": {"a": {"type": "numeric", "lower": 0, "upper": 1}}}
        )
    assert "dup.csv" in str(info.value) and str(env.root) not in str(info.value)


def test_a_deleted_source_and_copy_is_unavailable_with_nothing_spent(env: Root) -> None:
    """The copy answers while the source is gone; with the copy gone too the analyst gets the
    fixed DatasetUnavailableError (no path), nothing is spent, and the curator's listing still
    shows only the relative source."""
    svc = env.service
    info = svc.register_dataset("people", "people.csv", PEOPLE_METADATA)
    _, key = svc.create_principal("alice", "analyst")
    svc.grant("alice", "people", epsilon=5.0)
    who = svc.authenticate(key)
    (env.root / "people.csv").unlink()
    assert (
        svc.query(who, "people", QueryRequest(epsilon=0.5, sql="SELECT COUNT(*) FROM people"))["budget"][
            "spent_epsilon"
        ]
        == 0.5
    )
    svc.close()
    default_dataset_dir(env.url).joinpath(copy_name("people", info.created_at)).unlink()
    with Service(env.url, data_root=env.root) as fresh:
        who = fresh.authenticate(key)
        with pytest.raises(DatasetUnavailableError) as err:
            fresh.query(who, "people", QueryRequest(epsilon=0.5, sql="SELECT COUNT(*) FROM people"))
        assert str(err.value) == DatasetUnavailableError.MESSAGE
        assert fresh.ledger.get_budget("people", "alice").spent_epsilon == 0.5
        assert [d.source for d in fresh.datasets()] == ["people.csv"]


# ------------------------------------------------------------------------------------------------
# shared read-only copies
# ------------------------------------------------------------------------------------------------


def test_the_copy_is_a_duckdb_file_named_by_dataset_and_version(env: Root, tmp_path: Path) -> None:
    info = env.service.register_dataset("people", "people.csv", PEOPLE_METADATA)
    copies = default_dataset_dir(env.url)
    assert copies == env.ledger.with_name("ledger.sqlite.datasets")
    assert sorted(p.name for p in copies.iterdir()) == [copy_name("people", info.created_at)]  # no temporary left
    conn = duckdb.connect(str(copies / copy_name("people", info.created_at)), read_only=True)
    try:
        assert conn.execute("SELECT count(*) FROM people").fetchone()[0] == 300
    finally:
        conn.close()
    assert copy_name("people", info.created_at) != copy_name("people", info.created_at + "0")
    with Service(env.url.replace("ledger", "other"), data_root=env.root, dataset_dir=tmp_path / "copies") as other:
        other.register_dataset("people", "people.csv", PEOPLE_METADATA)
        assert [p.suffix for p in (tmp_path / "copies").iterdir()] == [".duckdb"]


def test_a_missing_copy_is_recreated_from_the_source(env: Root) -> None:
    svc = env.service
    info = svc.register_dataset("people", "people.csv", PEOPLE_METADATA)
    _, key = svc.create_principal("alice", "analyst")
    svc.grant("alice", "people", epsilon=5.0)
    copy = default_dataset_dir(env.url) / copy_name("people", info.created_at)
    copy.unlink()
    answer = svc.query(svc.authenticate(key), "people", QueryRequest(epsilon=0.5, sql="SELECT COUNT(*) FROM people"))
    assert answer["budget"]["spent_epsilon"] == 0.5 and copy.is_file()


def test_a_copy_is_not_recreated_from_a_source_that_now_leaves_the_root(env: Root) -> None:
    """The source is checked again before a copy is re-made: replaced by a link out of the root,
    it is not read (the analyst gets DatasetUnavailableError, nothing spent)."""
    svc = env.service
    info = svc.register_dataset("people", "people.csv", AGE_ONLY)
    _, key = svc.create_principal("alice", "analyst")
    svc.grant("alice", "people", epsilon=5.0)
    (default_dataset_dir(env.url) / copy_name("people", info.created_at)).unlink()
    (env.root / "people.csv").unlink()
    (env.outside / "age.csv").write_text("age\n1\n2\n")
    (env.root / "people.csv").symlink_to(env.outside / "age.csv")
    with pytest.raises(DatasetUnavailableError):
        svc.query(svc.authenticate(key), "people", QueryRequest(epsilon=0.5, sql="SELECT COUNT(*) FROM people"))
    assert svc.ledger.get_budget("people", "alice").spent_epsilon == 0
    assert not (default_dataset_dir(env.url) / copy_name("people", info.created_at)).exists()


def _in_memory_table_bytes(conn: Any) -> int:
    return int(
        conn.execute(
            "SELECT coalesce(sum(memory_usage_bytes), 0) FROM duckdb_memory() WHERE tag = 'IN_MEMORY_TABLE'"
        ).fetchone()[0]
    )


@pytest.mark.parametrize("copy_present", [True, False], ids=["copy present", "copy re-created by both at once"])
def test_two_processes_query_one_shared_copy(env: Root, copy_present: bool) -> None:
    """Two worker processes open the same copy read-only at once and answer from it; neither holds
    the table in its own memory (DuckDB's in-memory-table usage is 0 and its database is the copy
    file). The power check: an in-memory copy of the same data, as the service made before,
    shows up in that same measure. With the copy deleted, both processes find it missing at
    once; one re-creates it under the lock and both answer."""
    n = 200_000
    rng = np.random.default_rng(0)
    pd.DataFrame({"id": np.arange(n), "age": rng.integers(0, 100, n)}).to_csv(env.root / "big.csv", index=False)
    svc = env.service
    info = svc.register_dataset("big", "big.csv", AGE_ONLY)
    _, key = svc.create_principal("alice", "analyst")
    svc.grant("alice", "big", epsilon=5.0)
    copy = default_dataset_dir(env.url) / copy_name("big", info.created_at)
    if not copy_present:
        copy.unlink()
    ctx = multiprocessing.get_context("spawn")
    barrier, out = ctx.Barrier(2), ctx.Queue()
    from server._dataset_worker import query_and_report

    procs = [
        ctx.Process(target=query_and_report, args=(env.url, str(env.root), str(copy.parent), key, "big", barrier, out))
        for _ in range(2)
    ]
    for p in procs:
        p.start()
    try:
        reports = [out.get(timeout=120) for _ in procs]
    finally:
        for p in procs:
            p.join(timeout=60)
    assert all(r["ok"] for r in reports), reports
    for r in reports:
        assert r["databases"] == [(copy.stem, str(copy), True)], r
        assert r["in_memory_table_bytes"] == 0, r
    assert svc.ledger.get_budget("big", "alice").spent_epsilon == pytest.approx(0.2)
    assert sorted(p.name for p in copy.parent.iterdir() if not p.name.endswith(".lock")) == [
        copy.name
    ]  # no temporaries left
    # power check: the measure sees a private in-memory copy of the same table
    private = duckdb.connect()
    try:
        private.execute(f"CREATE TABLE big AS SELECT * FROM read_csv('{env.root / 'big.csv'}', all_varchar = true)")
        assert _in_memory_table_bytes(private) > 1_000_000
    finally:
        private.close()


# ------------------------------------------------------------------------------------------------
# Spark datasets: Parquet read in place, under the same root rules (refused before Spark starts)
# ------------------------------------------------------------------------------------------------


def _parquet_outside(env: Root) -> Path:
    pd.DataFrame({"age": [1, 2]}).to_parquet(env.outside / "shadow.parquet")
    return env.outside / "shadow.parquet"


def test_spark_sources_keep_to_the_data_root(env: Root) -> None:
    """A directory link out of the root, a file link out of it, a glob whose files lie outside,
    ``..``, an absolute path outside and a URI: each refused, naming ``source`` only."""
    shadow = _parquet_outside(env)
    (env.root / "out").symlink_to(env.outside, target_is_directory=True)
    (env.root / "mixed").mkdir()
    pd.DataFrame({"age": [3]}).to_parquet(env.root / "mixed" / "ok.parquet")
    (env.root / "mixed" / "leak.parquet").symlink_to(shadow)
    for source in ("out", "out/shadow.parquet", "mixed", "mixed/*.parquet", "out/*.parquet", shadow, "../elsewhere"):
        refused(env, source, engine="spark")
    assert "URI" in str(refused(env, "hdfs://namenode/data/people", engine="spark"))
    # The power check: inside the root the same layout is accepted up to the metadata (Spark then reads it).
    from dpkit.server.datasets import resolve_parquet_source

    assert resolve_parquet_source("mixed/ok.parquet", env.root).stored == "mixed/ok.parquet"
    assert resolve_parquet_source(env.root / "mixed" / "ok.parquet", env.root).stored == "mixed/ok.parquet"


@pytest.mark.parametrize("source", ["people.csv", "nothing", "empty", "", None])
def test_a_spark_source_must_be_parquet_data(env: Root, source: Any) -> None:
    (env.root / "empty").mkdir()
    refused(env, source, engine="spark")


def test_spark_registration_options_are_checked_before_anything_is_read(env: Root) -> None:
    with pytest.raises(InvalidParameterError) as err:
        env.service.register_dataset("people", "people.csv", AGE_ONLY, engine="polars")
    assert err.value.name == "engine" and "'spark'" in str(err.value)
    with pytest.raises(InvalidParameterError) as err:
        env.service.register_dataset("people", "people", AGE_ONLY, engine="spark", table="t")
    assert err.value.name == "table"
    assert env.service.datasets() == []


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"spark_master": "nowhere"}, "spark_master"),
        ({"spark_master": 7}, "spark_master"),
        ({"spark_conf": "spark.executor.memory=2g"}, "spark_conf"),
        ({"spark_conf": {"spark.executor.memory": 2}}, "spark_conf['spark.executor.memory']"),
    ],
)
def test_bad_spark_settings_are_refused_before_the_ledger_is_opened(
    tmp_path: Path, kwargs: dict[str, Any], name: str
) -> None:
    ledger = tmp_path / "ledger.sqlite"
    with pytest.raises(InvalidParameterError) as err:
        Service(f"sqlite:///{ledger}", **kwargs)
    assert err.value.name == name, err.value
    assert not ledger.exists()
    from dpkit.server import ServerConfig

    with pytest.raises(InvalidParameterError):
        ServerConfig(ledger=f"sqlite:///{ledger}", **kwargs)


@pytest.mark.parametrize("version", [2, 3])
def test_older_service_tables_are_upgraded_in_place(env: Root, version: int) -> None:
    """A database written before datasets named their engine (version 2) or pinned their Parquet
    files (version 3): opened, it gains the columns (every version-2 dataset read through DuckDB;
    no file pinned) and the current version; its datasets still answer."""
    import sqlite3

    env.service.register_dataset("people", "people.csv", PEOPLE_METADATA)
    env.service.close()
    raw = sqlite3.connect(env.ledger, isolation_level=None)
    raw.execute("ALTER TABLE datasets DROP COLUMN files")
    raw.execute("ALTER TABLE datasets DROP COLUMN size_class")  # (added by version 5)
    if version == 2:
        raw.execute("ALTER TABLE datasets DROP COLUMN engine")
    raw.execute("UPDATE dpkit_service SET version = ?", (version,))
    with Service(env.url, data_root=env.root) as svc:
        assert [(d.name, d.engine, d.files) for d in svc.datasets()] == [("people", "duckdb", None)]
        _, key = svc.create_principal("alice", "analyst")
        svc.grant("alice", "people", epsilon=1.0)
        out = svc.query(svc.authenticate(key), "people", QueryRequest(epsilon=0.5, sql="SELECT COUNT(*) FROM people"))
        assert out["budget"]["spent_epsilon"] == 0.5
    assert raw.execute("SELECT version FROM dpkit_service").fetchone() == (6,)
    assert {"engine", "files"} <= {row[1] for row in raw.execute("PRAGMA table_info(datasets)")}
    raw.close()


def test_the_registration_check_counts_the_csv_lines_the_reader_dropped(env: Root) -> None:
    """The copy holds only the rows read; the curator's check still says which lines were dropped
    (an unclosed quote, bytes that are not UTF-8), counted from the source file."""
    with (env.root / "people.csv").open("ab") as f:
        f.write(b'1001,33,"oops\n1002,\xff\xfe,x\n')
    info = env.service.register_dataset("people", "people.csv", PEOPLE_METADATA)
    assert info.check is not None and info.check.reading is not None
    assert info.check.reading.skipped_records == 2 and len(info.check.reading.skipped_detail) == 2
    assert "2 of " in "\n".join(info.check.reading.lines())
