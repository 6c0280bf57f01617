"""The source opened once (dpkit.server.opened_source): the open file is what is checked and
copied, so a name changed between the check and the open is refused, never read. Each race is
staged deterministically here (the name is changed after resolve_source checked it); the live
race is in test_registration_race.py. False-failure rate 0."""

from __future__ import annotations

import os
from pathlib import Path

import duckdb
import pytest

from dpkit.errors import InvalidParameterError
from dpkit.server.datasets import resolve_source
from dpkit.server.opened_source import open_source, snapshot


@pytest.fixture
def root(tmp_path: Path) -> Path:
    (tmp_path / "data").mkdir()
    (tmp_path / "out").mkdir()
    (tmp_path / "data" / "people.csv").write_text("age\n1\n2\n")
    (tmp_path / "out" / "secret.csv").write_text("age\n4242\n")
    return tmp_path / "data"


def test_the_checked_file_is_copied_from_the_open_file(root: Path, tmp_path: Path) -> None:
    located = resolve_source("people.csv", root)
    with open_source(located, root) as opened:
        (root / "people.csv").unlink()  # gone by name: the open file is still read
        with snapshot(opened, tmp_path / "private") as private:
            assert private.read_text() == "age\n1\n2\n" and private.suffix == ".csv"
            assert oct(private.stat().st_mode & 0o777) == "0o600"
    assert list((tmp_path / "private").iterdir()) == []  # removed after the block


@pytest.mark.parametrize("swap", ["file link", "directory link", "fifo"])
def test_a_name_changed_after_the_check_is_refused(root: Path, swap: str) -> None:
    (root / "sub").mkdir()
    (root / "sub" / "people.csv").write_text("age\n1\n")
    located = resolve_source("sub/people.csv", root)
    if swap == "file link":
        (root / "sub" / "people.csv").unlink()
        (root / "sub" / "people.csv").symlink_to(root.parent / "out" / "secret.csv")
    elif swap == "directory link":
        (root / "sub").rename(root / "moved")
        (root / "sub").symlink_to(root.parent / "out", target_is_directory=True)
        (root.parent / "out" / "people.csv").write_text("age\n4242\n")
    else:
        (root / "sub" / "people.csv").unlink()
        os.mkfifo(root / "sub" / "people.csv")  # opened without blocking, then refused
    with pytest.raises(InvalidParameterError) as err, open_source(located, root):
        pass
    assert err.value.name == "source" and str(root.parent) not in str(err.value)


def test_a_duckdb_sources_write_ahead_log_is_copied_with_it(root: Path, tmp_path: Path) -> None:
    """Rows only in the log (not yet checkpointed) are read from the copy, as from the source."""
    conn = duckdb.connect(str(root / "db.duckdb"))
    conn.execute("SET wal_autocheckpoint = '1TB'")
    conn.execute("CREATE TABLE t AS SELECT range AS x FROM range(10)")
    conn.execute("INSERT INTO t VALUES (99)")
    assert (root / "db.duckdb.wal").exists()
    with open_source(resolve_source("db.duckdb", root), root) as opened, snapshot(opened, tmp_path / "p") as private:
        reader = duckdb.connect()
        reader.execute(f"ATTACH '{private}' AS s (READ_ONLY)")
        assert reader.execute("SELECT count(*) FROM s.t").fetchone() == (11,)
        reader.close()
    conn.close()
