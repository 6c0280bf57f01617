"""A Spark dataset's pins (dpkit.server.spark_pins), without Spark: what each kind of pin sees.
The checks before and after each query are tested on Spark in test_spark_datasets.py.
Deterministic (false-failure rate 0)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dpkit.analytics.engines.parquet_source import parquet_files
from dpkit.errors import InvalidParameterError
from dpkit.server.spark_pins import check_fingerprint, pin_files, pinned_change


@pytest.fixture
def data(tmp_path: Path) -> Path:
    for k in range(2):
        (tmp_path / f"part={k}").mkdir()
        (tmp_path / f"part={k}" / "rows.parquet").write_bytes(bytes([k]) * 100)  # only listed and hashed here
    return tmp_path


def _rewrite_keeping_size_and_time(f: Path) -> None:
    st = f.stat()
    f.write_bytes(b"\xff" * st.st_size)
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_size_and_time_miss_a_same_size_rewrite_that_the_fingerprint_sees(data: Path) -> None:
    listing = parquet_files(data)
    assert listing is not None
    cheap, hashed = pin_files(listing), pin_files(listing, "sha256")
    assert pinned_change(cheap, listing) is None and pinned_change(hashed, listing) is None
    _rewrite_keeping_size_and_time(data / "part=1" / "rows.parquet")
    assert pinned_change(cheap, listing) is None  # the documented limit of the default pins
    assert pinned_change(hashed, listing) == "0 file(s) added, 0 removed, 1 rewritten (first: part=1/rows.parquet)"


def test_a_new_time_a_new_file_and_a_removed_one_are_seen_by_both(data: Path) -> None:
    listing = parquet_files(data)
    assert listing is not None
    pins = [pin_files(listing), pin_files(listing, "sha256")]
    f = data / "part=0" / "rows.parquet"
    os.utime(f, ns=(f.stat().st_atime_ns, f.stat().st_mtime_ns + 10**9))
    assert all(
        pinned_change(p, listing) == "0 file(s) added, 0 removed, 1 rewritten (first: part=0/rows.parquet)"
        for p in pins
    )
    (data / "part=2").mkdir()
    (data / "part=2" / "rows.parquet").write_bytes(b"x")
    assert all(pinned_change(p, parquet_files(data)).startswith("1 file(s) added") for p in pins)  # type: ignore[union-attr]
    f.unlink()
    assert all(pinned_change(p, listing) == "the files cannot be listed" for p in pins)  # gone since listed
    assert all("1 removed" in pinned_change(p, parquet_files(data)) for p in pins)  # type: ignore[operator]


@pytest.mark.parametrize(("value", "engine"), [("md5", "spark"), (True, "spark"), ("sha256", "duckdb")])
def test_a_fingerprint_is_sha256_for_spark_datasets_only(value: object, engine: str) -> None:
    with pytest.raises(InvalidParameterError) as err:
        check_fingerprint(value, engine)
    assert err.value.name == "fingerprint"
    assert check_fingerprint("sha256", "spark") == "sha256" and check_fingerprint(None, "duckdb") is None
