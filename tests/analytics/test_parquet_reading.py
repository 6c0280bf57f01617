"""Parquet and Hive sources are read row by row by the declared schema, alike on DuckDB and Spark
(analytics.engines.parquet_source; DESIGN.md, "Reading is row-local").

Each case is a table D and D plus one hostile person P whose only difference is in how their row
is stored: a partition directory named ``day=unknown`` or ``zip=0213X`` (or with escapes), a file
of their own whose ``age`` is text (``"N/A"``), a double (33.5, 1e300) or a narrower integer, a
city that is not UTF-8. With the noise off (the test hook below), the analyst must see the same
thing on D and D + P — answered or raised, the same columns and groups — and every released
count may move by at most P's contribution (one row). The two engines must read every table to
the same rows. On the readers before this module every case fails: DuckDB typed
``day=2020-1-5`` as a DATE (no declared category matched), cast 33.5 to the first file's INT64,
failed ``AVG(age)`` and ``GROUP BY city`` after payment; Spark read ``zip=00501`` as 501.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import dpkit as dp
from dpkit.analytics import Categorical, Metadata, Numeric
from dpkit.analytics import execute as execute_module

pytestmark = [
    pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas:FutureWarning"),
    pytest.mark.filterwarnings("ignore:The copy keyword is deprecated"),  # pyspark's pandas 3 conversions
]

CITIES = ("A", "B", "C", "D")
DAYS = ("2020-1-5", "2020-1-6")
ZIPS = ("00501", "02134")
N = 120
P_ID = 1000

HIVE_META = Metadata(
    columns={"age": Numeric(0, 100), "city": Categorical(CITIES), "day": Categorical(DAYS), "zip": Categorical(ZIPS)},
    row_level=True,
)
FILES_META = Metadata(columns={"age": Numeric(0, 100), "city": Categorical(CITIES)}, row_level=True)

HIVE_QUERIES = (
    "SELECT COUNT(*) FROM t",
    "SELECT day, zip, COUNT(*) FROM t GROUP BY day, zip",
    "SELECT zip, AVG(age) FROM t GROUP BY zip",
)
FILES_QUERIES = (
    "SELECT COUNT(*) FROM t",
    "SELECT AVG(age), SUM(age) FROM t",
    "SELECT city, COUNT(*) FROM t GROUP BY city",
    "SELECT COUNT(*) FROM t WHERE city = 'A'",
    "SELECT city, COUNT(*) FROM t WHERE age BETWEEN 30 AND 40 GROUP BY city",
)


def people() -> list[dict[str, Any]]:
    rng = np.random.default_rng(20261129)
    return [
        {
            "pid": i,
            "age": int(rng.integers(18, 90)),
            "city": CITIES[int(rng.integers(0, 4))],
            "day": DAYS[i % 2],
            "zip": ZIPS[i // 2 % 2],
        }
        for i in range(N)
    ]


def _text(values: Sequence[Any]) -> pa.Array:
    """Values as a Parquet text column, bytes as they are (the string type is not validated)."""
    return pa.array([v if isinstance(v, bytes) else str(v).encode() for v in values], pa.binary()).view(pa.string())


def table(rows: Sequence[Mapping[str, Any]], types: Mapping[str, Any] | None = None) -> pa.Table:
    """``pid``, ``age`` and ``city`` of ``rows``; ``types`` gives a column's Arrow type (``"text"``:
    every value's text form)."""
    types = types or {}
    cols = {}
    for c, default in (("pid", pa.int64()), ("age", pa.int64()), ("city", pa.string())):
        values = [r[c] for r in rows]
        t = types.get(c, default)
        cols[c] = _text(values) if t == "text" or any(isinstance(v, bytes) for v in values) else pa.array(values, t)
    return pa.table(cols)


def write_hive(root: Path, rows: Sequence[Mapping[str, Any]], person: Mapping[str, Any] | None = None) -> Path:
    """``rows`` as day=/zip= directories of one file each; P (with their directory names as
    written: ``day_dir``, ``zip_dir``) in a file of their own."""
    d = root / "people"
    for key in sorted({(r["day"], r["zip"]) for r in rows}):
        leaf = d / f"day={key[0]}" / f"zip={key[1]}"
        leaf.mkdir(parents=True)
        pq.write_table(table([r for r in rows if (r["day"], r["zip"]) == key]), leaf / "part-0.parquet")
    if person is not None:
        leaf = d / f"day={person['day_dir']}" / f"zip={person['zip_dir']}"
        leaf.mkdir(parents=True, exist_ok=True)
        pq.write_table(table([person]), leaf / "part-p.parquet")
    return d


#: D's files in the directory source: the same columns, three physical types of ``age``.
FILE_TYPES: tuple[Mapping[str, Any], ...] = ({}, {"age": pa.int32()}, {"age": pa.float64(), "pid": pa.int32()})


def write_files(root: Path, rows: Sequence[Mapping[str, Any]], person: Mapping[str, Any] | None = None) -> Path:
    """D in three files that disagree on physical types; P's row in a file of its own, typed by
    its own values (``types``: P's column types)."""
    d = root / "people"
    d.mkdir(parents=True)
    for k, types in enumerate(FILE_TYPES):
        pq.write_table(table(rows[k::3], types), d / f"part-{k}.parquet")
    if person is not None:
        pq.write_table(table([person], person.get("types")), d / "part-p.parquet")
    return d


def write_sorted(root: Path, rows: Sequence[Mapping[str, Any]], person: Mapping[str, Any] | None = None) -> Path:
    """One file sorted by age in row groups of 16, P's row in place: a range filter skips row groups."""
    everything = sorted([*rows, *([person] if person else [])], key=lambda r: r["age"])
    root.mkdir(parents=True, exist_ok=True)
    path = root / "people.parquet"
    pq.write_table(table(everything), path, row_group_size=16)
    return path


#: Hostile persons P: how their row is stored differs, their values are otherwise ordinary.
HIVE_PERSONS = {
    "day_unknown": {"day_dir": "unknown", "zip_dir": "00501"},  # would make DuckDB's day VARCHAR again
    "zip_text": {"day_dir": "2020-1-5", "zip_dir": "0213X"},  # would make Spark's zip a string again
    "zip_escaped": {"day_dir": "2020-1-5", "zip_dir": "a%20b%3D"},
    "zip_not_ascii": {"day_dir": "2020-1-6", "zip_dir": "caf%C3%A9"},
    "zip_not_utf8": {"day_dir": "2020-1-6", "zip_dir": "%FF"},
    "zip_empty": {"day_dir": "2020-1-5", "zip_dir": ""},
    "zip_null": {"day_dir": "2020-1-5", "zip_dir": "__HIVE_DEFAULT_PARTITION__"},
}
FILE_PERSONS = {
    "age_text": {"age": "N/A", "types": {"age": "text"}},
    "age_fraction": {"age": 33.5, "types": {"age": pa.float64()}},
    "age_huge": {"age": 1e300, "types": {"age": pa.float64()}},
    "age_narrow": {"age": 35, "types": {"age": pa.int8(), "pid": pa.int16()}},
    "city_not_utf8": {"city": b"\xff\xfeA"},
    "city_bool": {"city": True, "types": {"city": pa.bool_()}},
}
SORTED_PERSONS = {"city_not_utf8": {"age": 35, "city": b"A\xe2\x82"}}


def person(changes: Mapping[str, Any]) -> dict[str, Any]:
    return {"pid": P_ID, "age": 35, "city": "A", "day": DAYS[0], "zip": ZIPS[0], **changes}


# -- the analyst's view with the noise off ------------------------------------------------------------


@contextlib.contextmanager
def noise_off() -> Iterator[None]:
    """Every noisy quantity released as its exact integer (the mechanism still runs). Test hook."""
    real = execute_module._release

    def exact(mech: Any, ints: np.ndarray, *args: Any, **kwargs: Any) -> Any:
        ints = np.asarray(ints, dtype=np.int64)
        return dataclasses.replace(real(mech, ints, *args, **kwargs), values=ints.astype(np.float64))

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(execute_module, "_release", exact)
        yield


@dataclasses.dataclass(frozen=True)
class Seen:
    """What one query showed: ``seen`` compares as a whole; ``counts`` the exact released counts
    by group (answered queries)."""

    seen: tuple[Any, ...]
    counts: dict[tuple[str, ...], float]
    table: Any = None


def run(path: Path, metadata: Metadata, queries: Sequence[str], **kwargs: Any) -> list[Seen]:
    out = []
    with noise_off():
        try:
            s = dp.Session.from_parquet(path, metadata=metadata, budget=dp.Budget(epsilon=1e6), table="t", **kwargs)
        except Exception as exc:
            return [Seen(("raised", type(exc).__name__, str(exc).replace(str(path), "<path>")), {})] * len(queries)
        for q in queries:
            try:
                r = s.sql(q, epsilon=1.0, rng=np.random.default_rng(7))
            except Exception as exc:
                out.append(Seen(("raised", type(exc).__name__, str(exc)), {}))
                continue
            keys = [tuple(str(r.table[g].iloc[i]) for g in r.groups) for i in range(len(r.table))]
            counts = {k: float(v) for k, v in zip(keys, r.table["count"], strict=True)} if "count" in r.table else {}
            out.append(Seen(("answered", tuple(r.table.columns), r.table.shape, tuple(r.groups)), counts, r.table))
    return out


def assert_neighbours(before: list[Seen], after: list[Seen], queries: Sequence[str]) -> None:
    for q, b, a in zip(queries, before, after, strict=True):
        assert b.seen[0] == "answered", (q, b.seen)
        assert a.seen == b.seen, q
        for key in b.counts.keys() | a.counts.keys():
            assert abs(a.counts.get(key, 0.0) - b.counts.get(key, 0.0)) <= 1, (q, key)


def truth(rows: Sequence[Mapping[str, Any]], *keys: str) -> dict[tuple[str, ...], float]:
    out: dict[tuple[str, ...], float] = {}
    for r in rows:
        k = tuple(str(r[c]) for c in keys)
        out[k] = out.get(k, 0.0) + 1
    return out


# -- DuckDB ------------------------------------------------------------------------------------------


def test_partition_values_are_text_cast_by_the_declaration(tmp_path: Path) -> None:
    """day=2020-1-5 is not a date and zip=00501 not a number: every person lands in their declared
    category (DuckDB typed day as DATE, so no category matched and every count was about 0)."""
    rows = people()
    got = run(write_hive(tmp_path, rows), HIVE_META, HIVE_QUERIES)
    assert got[1].counts == truth(rows, "day", "zip")
    assert got[0].counts == {(): N}


@pytest.mark.parametrize("name", sorted(HIVE_PERSONS))
def test_one_partition_directory_cannot_change_the_others(tmp_path: Path, name: str) -> None:
    rows = people()
    before = run(write_hive(tmp_path / "d", rows), HIVE_META, HIVE_QUERIES)
    after = run(write_hive(tmp_path / "p", rows, person(HIVE_PERSONS[name])), HIVE_META, HIVE_QUERIES)
    assert before[1].counts == truth(rows, "day", "zip")  # D itself read as declared
    assert_neighbours(before, after, HIVE_QUERIES)


def test_partition_directories_read_by_one_rule(tmp_path: Path) -> None:
    """Each directory value reads as partition_value says, whether the engine reads the name
    (plain names) or is given it (escapes beyond ASCII, empty, not UTF-8)."""
    from dpkit.analytics.engines.duckdb import DuckDBEngine
    from dpkit.analytics.engines.parquet_source import partition_value

    raws = [
        "00501",
        "0213X",
        "a%20b",
        "a%3Db",
        "caf%C3%A9",
        "%FF",
        "",
        "__HIVE_DEFAULT_PARTITION__",
        "NULL",
        "%zz",
        "a+b",
    ]
    for i, raw in enumerate(raws):
        (tmp_path / f"zip={raw}").mkdir()
        pq.write_table(pa.table({"pid": [i]}), tmp_path / f"zip={raw}" / "part-0.parquet")
    e = DuckDBEngine(tmp_path)
    e.bind({"pid": "integer", "zip": "string"}, strip_strings=False)
    read = dict(e._con.execute(f"SELECT pid, zip FROM {e._from}").fetchall())
    assert read == {i: partition_value(raw) for i, raw in enumerate(raws)}
    assert read[4] == "café" and read[5] == "?" and read[6] == "" and read[7] is None


def test_files_that_disagree_on_types_are_each_read_by_their_own(tmp_path: Path) -> None:
    """INT64, INT32 and DOUBLE files of one column: every value as its own file holds it."""
    rows = people()
    got = run(write_files(tmp_path, rows), FILES_META, FILES_QUERIES)
    assert got[0].counts == {(): N}
    assert got[1].table["sum_age"][0] == pytest.approx(sum(r["age"] for r in rows))
    assert got[2].counts == truth(rows, "city")


@pytest.mark.parametrize("name", sorted(FILE_PERSONS))
def test_one_file_of_another_type_cannot_change_the_others(tmp_path: Path, name: str) -> None:
    rows = people()
    before = run(write_files(tmp_path / "d", rows), FILES_META, FILES_QUERIES)
    after = run(write_files(tmp_path / "p", rows, person(FILE_PERSONS[name])), FILES_META, FILES_QUERIES)
    assert_neighbours(before, after, FILES_QUERIES)


def test_a_value_is_read_as_its_own_file_types_it(tmp_path: Path) -> None:
    """33.5 in a DOUBLE file is 33.5 (DuckDB cast it to the first file's INT64: 34); 'N/A' and
    True are NULL as numbers; 1e300 is a finite double (clipped by the bounds, not a failure);
    as integers, 33.5 and 1e300 are NULL."""
    from dpkit.analytics.engines.duckdb import DuckDBEngine

    d = tmp_path / "t"
    d.mkdir()
    pq.write_table(pa.table({"pid": [1, 2], "age": pa.array([30, 40], pa.int64())}), d / "a.parquet")
    pq.write_table(pa.table({"pid": [3], "age": ["N/A"]}), d / "b.parquet")
    pq.write_table(pa.table({"pid": [4, 5], "age": [33.5, 1e300]}), d / "c.parquet")
    pq.write_table(pa.table({"pid": [6], "age": [True]}), d / "e.parquet")
    e = DuckDBEngine(d)
    assert e.schema()["age"] == "string"  # kinds differ between files: what every value has is text
    for read, expected in (
        ("double", [30.0, 40.0, None, 33.5, 1e300, 1.0]),
        ("integer", [30, 40, None, None, None, 1]),
    ):
        e.bind({"pid": "integer", "age": read}, strip_strings=True)  # type: ignore[dict-item]
        got = dict(e._con.execute(f"SELECT pid, age FROM {e._from}").fetchall())
        assert [got[i] for i in range(1, 7)] == expected, read


def test_text_that_is_not_utf8_never_fails_a_query(tmp_path: Path) -> None:
    """GROUP BY city, WHERE city = 'A' and a range filter over row groups sorted by age answer on
    D + P (DuckDB failed them after payment, the range query only for P's decade)."""
    rows = people()
    queries = (*FILES_QUERIES, "SELECT city, COUNT(*) FROM t WHERE age BETWEEN 34 AND 36 GROUP BY city")
    for name, p in SORTED_PERSONS.items():
        before = run(write_sorted(tmp_path / f"d{name}", rows), FILES_META, queries)
        after = run(write_sorted(tmp_path / f"p{name}", rows, person(p)), FILES_META, queries)
        assert_neighbours(before, after, queries)


def test_text_is_repaired_by_duckdbs_rule(tmp_path: Path) -> None:
    """Random byte strings (seeded) read as decode_text says: each byte of a malformed sequence
    becomes '?', valid text is unchanged."""
    from dpkit.analytics.engines.duckdb import DuckDBEngine
    from dpkit.analytics.engines.parquet_source import decode_text

    values = random_bytes(np.random.default_rng(3), 3000)
    pq.write_table(pa.table({"i": np.arange(len(values)), "s": _text(values)}), tmp_path / "t.parquet")
    e = DuckDBEngine(tmp_path / "t.parquet")
    e.bind({"i": "integer", "s": "string"}, strip_strings=False)
    got = dict(e._con.execute(f"SELECT i, s FROM {e._from}").fetchall())
    assert [got[i] for i in range(len(values))] == [decode_text(v) for v in values]
    assert sum(decode_text(v) != v.decode("utf-8", "replace") for v in values) > 1000  # mostly invalid


def random_bytes(rng: np.random.Generator, n: int) -> list[bytes]:
    """Byte strings made of UTF-8 fragments: leads, continuations, overlongs, surrogates, text."""
    pieces = [b"a", b"?", b"\x00", b"\x80", b"\xbf", b"\xc0", b"\xc1", b"\xc2", b"\xdf", b"\xe0", b"\xe1", b"\xed"]
    pieces += [b"\xef", b"\xf0", b"\xf1", b"\xf4", b"\xf5", b"\xff", b"\x9f", b"\xa0", b"\x8f", b"\x90"]
    pieces += ["é".encode(), "€".encode(), "😀".encode(), "\ufffd".encode()]
    return [b"".join(pieces[int(j)] for j in rng.integers(0, len(pieces), int(rng.integers(0, 8)))) for _ in range(n)]


def test_one_schema_is_one_read_of_every_file(tmp_path: Path) -> None:
    """The common case costs what it did: one read_parquet of all the files, partitions read by
    DuckDB from the names."""
    from dpkit.analytics.engines.duckdb import DuckDBEngine

    e = DuckDBEngine(write_hive(tmp_path, people()))
    assert len(e.parquet.layout.groups) == 1 and e.parquet.sql.count("read_parquet(") == 1
    assert "hive_types_autocast = false" in e.parquet.sql and "struct_pack" not in e.parquet.sql


def test_a_file_holding_a_column_nested_does_not_make_it_undeclarable(tmp_path: Path) -> None:
    """A column's kind is what its files share; nested only when every file holds it nested."""
    from dpkit.analytics.engines.parquet_source import mixed_kind

    assert mixed_kind(["numeric", "nested"]) == "numeric"
    assert mixed_kind(["numeric", "string", "nested"]) == "string"
    assert mixed_kind(["nested", "nested"]) == "nested"
    rows = people()
    d = write_files(tmp_path, rows)
    pq.write_table(pa.table({"pid": [P_ID], "age": [[1, 2]], "city": ["A"]}), d / "part-p.parquet")
    got = run(d, FILES_META, FILES_QUERIES)
    assert got[0].counts == {(): N + 1} and got[1].table["sum_age"][0] == pytest.approx(sum(r["age"] for r in rows))


def test_the_check_reports_what_the_reader_repaired(tmp_path: Path) -> None:
    rows = people()
    d = write_hive(tmp_path, rows, person({"day_dir": "2020-1-5", "zip_dir": "%FF"}))
    pq.write_table(
        table([person({"age": "N/A", "city": b"B\xff", "pid": P_ID + 1})], {"age": "text"}),
        d / "day=2020-1-5" / "zip=00501" / "part-q.parquet",
    )
    report = dp.analytics.check_data(d, HIVE_META)
    reading = report.reading
    assert reading is not None and reading.files == 6 and reading.repaired
    assert [(f.column, f.source_type, f.files) for f in reading.file_types] == [("age", "VARCHAR", 1)]
    assert dict(reading.invalid_text)["city"] == 1
    (bad,) = reading.partitions
    assert (bad.directory, bad.value, bad.files, bad.issue, bad.repaired) == (
        "zip=%FF",
        "?",
        1,
        "outside_categories",
        True,
    )
    assert "'zip=%FF' (1 files) reads as '?'" in report.to_text()
    assert report.to_dict()["reading"]["invalid_text"]["city"] == 1
    clean = dp.analytics.check_data(write_hive(tmp_path / "clean", rows), HIVE_META).reading
    assert clean is not None and not clean.repaired


def test_the_services_copy_reads_text_that_is_not_utf8(tmp_path: Path) -> None:
    import duckdb

    from dpkit.server.datasets import copy_table

    path = write_sorted(tmp_path, people(), person({"city": b"\xffA"}))
    con = duckdb.connect()
    copy_table(con, "t", path, None)
    assert con.execute("SELECT count(*) FROM t WHERE city = '?A'").fetchall() == [(1,)]


# -- Spark (marked spark by its fixture, see tests/conftest.py) --------------------------------------


@pytest.fixture(scope="module")
def spark():  # type: ignore[no-untyped-def]
    pytest.importorskip("pyspark")
    from dpkit.analytics.engines.spark import spark_session

    return spark_session()


def _bound_rows(engine: Any, types: Mapping[str, Any]) -> list[tuple[Any, ...]]:
    engine.bind(types, strip_strings=True)
    if engine.name == "spark":
        rows = [tuple(r) for r in engine._df.collect()]
    else:
        rows = engine._con.execute(f"SELECT * FROM {engine._from}").fetchall()
    return sorted(rows, key=repr)


def _tables(root: Path) -> Iterator[tuple[str, Path, Metadata, Sequence[str]]]:
    rows = people()
    yield "hive", write_hive(root / "hive", rows), HIVE_META, HIVE_QUERIES
    for name, p in HIVE_PERSONS.items():
        yield f"hive+{name}", write_hive(root / f"hive-{name}", rows, person(p)), HIVE_META, HIVE_QUERIES
    yield "files", write_files(root / "files", rows), FILES_META, FILES_QUERIES
    for name, p in FILE_PERSONS.items():
        yield f"files+{name}", write_files(root / f"files-{name}", rows, person(p)), FILES_META, FILES_QUERIES
    for name, p in SORTED_PERSONS.items():
        yield f"sorted+{name}", write_sorted(root / f"sorted-{name}", rows, person(p)), FILES_META, FILES_QUERIES


def test_duckdb_and_spark_read_every_table_alike(spark, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Every table above, bound by the declaration on both engines: the same rows; and the same
    exact aggregates through a session (one query per table, the noise off)."""
    from dpkit.analytics.engines.duckdb import DuckDBEngine
    from dpkit.analytics.engines.spark import SparkEngine
    from dpkit.analytics.engines.spark_parquet import read_parquet

    for name, path, meta, queries in _tables(tmp_path):
        types = {c: meta.read_type(c) for c in meta.columns} | {"pid": "unit"}
        duck = _bound_rows(DuckDBEngine(path), types)
        assert duck == _bound_rows(SparkEngine(read_parquet(spark, path)), types), name
        q = queries[-1]
        d = run(path, meta, [q])[0]
        s = run(path, meta, [q], engine="spark", spark=spark)[0]
        assert d.seen == s.seen and d.seen[0] == "answered", name
        cols = list(d.table.columns)
        left = d.table.sort_values(cols[: len(d.seen[3])]).reset_index(drop=True)
        right = s.table.sort_values(cols[: len(s.seen[3])]).reset_index(drop=True)
        assert left.astype(str).equals(right.astype(str)), (name, left, right)


def test_spark_repairs_text_as_duckdb_does(spark, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from dpkit.analytics.engines.parquet_source import decode_text
    from dpkit.analytics.engines.spark import SparkEngine
    from dpkit.analytics.engines.spark_parquet import read_parquet

    values = random_bytes(np.random.default_rng(4), 3000)
    pq.write_table(pa.table({"i": np.arange(len(values)), "s": _text(values)}), tmp_path / "t.parquet")
    e = SparkEngine(read_parquet(spark, tmp_path / "t.parquet"))
    e.bind({"i": "integer", "s": "string"}, strip_strings=False)
    got = dict(tuple(r) for r in e._df.collect())
    assert [got[i] for i in range(len(values))] == [decode_text(v) for v in values]


def test_uri_partitions_are_text_on_spark(spark, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A URI is listed by Spark, but its partition directories are still read as text."""
    from dpkit.analytics.engines.spark_parquet import read_parquet

    root = write_hive(tmp_path, people())
    frame = read_parquet(spark, root.as_uri())
    assert {f.name: f.dataType.simpleString() for f in frame.schema.fields}["zip"] == "string"
    assert sorted({r["zip"] for r in frame.select("zip").collect()}) == list(ZIPS)
