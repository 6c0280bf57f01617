"""The ingestion neighbour corpus: a base table D, hostile one-person additions P, every source
dpkit reads written from them, the analyst's queries, and a hook that switches the noise off.

Reading is row-local (DESIGN.md): the value a row contributes is a function of that row's own
bytes and the declared schema only. So D and D + P, read through any source on any engine, must
look the same to an analyst (answered or raised, the error's type and text, the result's shape)
and differ, with the noise off, by at most P's declared contribution in every released quantity.
This module builds the two tables and runs the queries; ``test_ingestion_neighbours`` asserts.

The base table D (:func:`base_rows`): 200 people with ``pid``, ``age`` (Numeric(0, 100); the
ages of a quarter of them end in .5), ``city`` (Categorical of four strings), ``code`` (the
string categories "1" and "2" over a column that is an integer in most sources), ``x`` (a float
in [-5, 5], multiples of 1/8 so every sum is exact), an undeclared ``note``, and ``day`` and
``zip`` (text categories that are the partition directories of the Hive source). Two variants:
``rows`` (row_level=True, one row a person) and ``unit`` (privacy_unit="pid", one or two rows a
person, max_groups = max_rows = 2): nobody in D reaches a bound, so which of someone's rows the
bounding keeps never matters and the neighbours differ by P alone.

The sources (:data:`SOURCES`): ``csv`` (one file, P's rows mid-file), ``parquet`` (one file
sorted by age in row groups of 32, so a range filter skips row groups), ``parquet_dir`` (D in four
files that disagree on physical types — age INT64 / DOUBLE / text / INT32, code INT64 / text /
INT8, pid INT64 / INT32 — and P in a file of its own, typed by pandas from P's rows alone, as a
pipeline writing one file per batch would), ``hive`` (day=/zip= directories, P's file in its own
partition) and ``frame`` (a pandas frame on DuckDB, a Spark frame made from it on Spark). A
column whose Python values mix numbers and text is written as text, as a CSV-to-Parquet step
would write it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import dpkit as dp
from dpkit.analytics import Categorical, Metadata, Numeric
from dpkit.analytics import execute as execute_module

_T = TypeVar("_T")
COLUMNS = ("pid", "age", "city", "code", "x", "note", "day", "zip")
CITIES = ("A", "B", "C", "D")
CODES = ("1", "2")
DAYS = ("2020-1-5", "2020-1-6")
ZIPS = ("00501", "02134")
N_PEOPLE = 200
MAX_ROWS = MAX_GROUPS = 2
P_ID = 1000
TABLE = "t"
AGE = (0.0, 100.0)
X = (-10.0, 10.0)
VARIANTS = ("rows", "unit")
SOURCES = ("csv", "parquet", "parquet_dir", "hive", "frame")

#: The analyst's queries, run in this order on every table, each with its own fixed rng (so a
#: query's salt is the same on D and on D + P whatever ran before it).
QUERIES = (
    f"SELECT COUNT(*) FROM {TABLE}",
    f"SELECT AVG(age), SUM(x) FROM {TABLE}",
    f"SELECT city, code, COUNT(*) FROM {TABLE} GROUP BY city, code",
    f"SELECT day, zip, COUNT(*) FROM {TABLE} GROUP BY day, zip",
    # a filter on text and a range that row-group statistics can skip (the Parquet file is sorted by age)
    f"SELECT city, COUNT(*) FROM {TABLE} WHERE city <> 'D' AND age BETWEEN 30 AND 40 GROUP BY city",
)

#: P's values where an addition does not change them.
PERSON = {"pid": P_ID, "age": 33.0, "city": "A", "code": 1, "x": 0.5, "note": "p", "day": DAYS[0], "zip": ZIPS[0]}
BIG = 10 * 2**20  # the 10 MB field


def metadata(variant: str) -> Metadata:
    """The declared schema: the same for D and D + P, never read from either."""
    columns: dict[str, Numeric | Categorical] = {
        "age": Numeric(*AGE),
        "city": Categorical(CITIES),
        "code": Categorical(CODES),
        "x": Numeric(*X),
        "day": Categorical(DAYS),
        "zip": Categorical(ZIPS),
    }
    if variant == "rows":
        return Metadata(columns=columns, row_level=True)
    return Metadata(columns=columns, privacy_unit="pid", max_groups=MAX_GROUPS, max_rows=MAX_ROWS)


def bound(variant: str) -> int:
    """The declared contribution bound of one person to one released count."""
    return 1 if variant == "rows" else MAX_ROWS


def base_rows(variant: str) -> list[dict[str, Any]]:
    """D's rows (the same people in both variants; ``unit`` gives every odd pid a second row)."""
    rng = np.random.default_rng(20260126)
    pid = np.arange(1, N_PEOPLE + 1)
    age = rng.integers(18, 90, N_PEOPLE) + np.where(pid % 4 == 1, 0.5, 0.0)
    city = rng.integers(0, len(CITIES), N_PEOPLE)
    code = rng.integers(1, 3, N_PEOPLE)
    x = rng.integers(-40, 41, (N_PEOPLE, 2)) / 8
    rows = []
    for i, p in enumerate(pid.tolist()):
        for j in range(1 if variant == "rows" else 1 + p % 2):
            rows.append(
                {
                    "pid": p,
                    "age": float(age[i]),
                    "city": CITIES[city[i]],
                    "code": int(code[i]),
                    "x": float(x[i, j]),
                    "note": f"n{p}",
                    "day": DAYS[p % 2],
                    "zip": ZIPS[p // 2 % 2],
                }
            )
    return rows


@dataclass(frozen=True)
class Addition:
    """One hostile person P.

    ``rows``: P's rows as changes to :data:`PERSON`, in the ``unit`` variant (more rows than
    max_rows); the ``rows`` variant adds the first alone. ``csv``: fields of P's first CSV line
    written as these raw bytes (no quoting). ``absent``: the sources where this value cannot
    exist, and why. ``portable``: the session's hashing. ``variants``: where it is run."""

    name: str
    rows: tuple[Mapping[str, Any], ...]
    csv: Mapping[str, bytes] = field(default_factory=dict)
    absent: Mapping[str, str] = field(default_factory=dict)
    portable: bool = True
    variants: tuple[str, ...] = VARIANTS

    def person(self, variant: str) -> list[dict[str, Any]]:
        changes = self.rows[:1] if variant == "rows" else self.rows
        return [{**PERSON, **c} for c in changes]


def _first(**changes: Any) -> tuple[Mapping[str, Any], ...]:
    return (changes, {}, {})


def _every(**changes: Any) -> tuple[Mapping[str, Any], ...]:
    return (changes,) * 3


_PYTHON_TEXT = "a Python-built frame holds only valid text (no such value reaches a Spark frame)"
_TEXT_UNIT = "a CSV's undeclared unit is text: '0.0' and '-0.0' are two ids by the file's own bytes"
_NEG_ZERO = ({"pid": -0.0, "x": -0.0}, {"pid": 0.0}, {"pid": -0.0}, {"pid": 0.0})

ADDITIONS = (
    Addition("quoted_newline", _first(note="line one\nline two")),
    Addition("stray_quote", _first(note='"oops'), csv={"note": b'"oops'}),
    Addition("invalid_utf8", _first(city=b"\xff\xfeA"), absent={"frame@spark": _PYTHON_TEXT}),
    Addition("age_text", _first(age="N/A")),
    Addition("day_unknown", _every(day="unknown")),
    Addition("zip_text", _every(zip="0213X")),
    Addition("nan_dtype", _first(code=math.nan)),
    Addition("neg_zero", _NEG_ZERO, absent={"csv": _TEXT_UNIT}),
    Addition("neg_zero_native", _NEG_ZERO, absent={"csv": _TEXT_UNIT}, portable=False, variants=("unit",)),
    Addition(
        "lone_surrogate",
        _first(city="\udcff"),
        absent={s: "a lone surrogate exists only in a Python str" for s in ("csv", "parquet", "parquet_dir", "hive")}
        | {"frame@spark": _PYTHON_TEXT},
    ),
    Addition("huge_float", _first(age=1e300, x=1e308)),
    Addition("big_field", _first(city="y" * BIG)),
)
BY_NAME = {a.name: a for a in ADDITIONS}


def absent(addition: Addition, source: str, engine: str) -> str | None:
    """Why ``addition`` has no form in ``source`` on ``engine`` (None: it has one)."""
    return addition.absent.get(f"{source}@{engine}", addition.absent.get(source))


# -- writing the sources ------------------------------------------------------------------------------


def _number_text(v: float | int) -> str:
    if isinstance(v, float) and (v != v.__trunc__() or math.copysign(1.0, v) < 0 or abs(v) >= 1e15):
        return repr(v)
    return str(int(v))


def _missing(v: Any) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def _csv_field(v: Any) -> bytes:
    if _missing(v):
        return b""
    if isinstance(v, bytes):
        return v
    if isinstance(v, (int, float)):
        return _number_text(v).encode()
    text = str(v)
    if any(c in text for c in ',"\n\r'):
        text = '"' + text.replace('"', '""') + '"'
    return text.encode("utf-8")


def _insert(base: Sequence[_T], person: Sequence[_T]) -> list[_T]:
    mid = len(base) // 2
    return [*base[:mid], *person, *base[mid:]]


def write_csv(path: Path, base: list[dict[str, Any]], person: list[dict[str, Any]], raw: Mapping[str, bytes]) -> None:
    """D's rows with P's mid-file; P's first line has the ``raw`` fields as given."""
    lines = [[_csv_field(r[c]) for c in COLUMNS] for r in base]
    mine = [[_csv_field(r[c]) for c in COLUMNS] for r in person]
    if mine:
        mine[0] = [raw.get(c, f) for c, f in zip(COLUMNS, mine[0], strict=True)]
    body = _insert(lines, mine)
    path.write_bytes(b"\n".join([",".join(COLUMNS).encode()] + [b",".join(fields) for fields in body]) + b"\n")


def frame(rows: Sequence[Mapping[str, Any]], columns: Sequence[str] = COLUMNS) -> pd.DataFrame:
    """The rows as pandas types them (what a user's ``pd.DataFrame(records)`` holds); a column that
    pandas' default text dtype cannot hold (a lone surrogate) stays an object column."""
    out = {}
    for c in columns:
        values = [r[c] for r in rows]
        try:
            out[c] = pd.Series(values)
        except UnicodeEncodeError:
            out[c] = pd.Series(values, dtype=object)
    return pd.DataFrame(out)


def _text_array(values: Sequence[Any]) -> pa.Array:
    """Mixed values as a Parquet text column: numbers in their text form, bytes as they are
    (invalid UTF-8 included: the string type is not validated), missing values NULL."""
    return pa.array([_text_bytes(v) for v in values], pa.binary()).view(pa.string())


def _text_bytes(v: Any) -> bytes | None:
    if _missing(v):
        return None
    if isinstance(v, bytes):
        return v
    return (_number_text(v) if isinstance(v, (int, float)) else str(v)).encode()


def arrow(df: pd.DataFrame) -> pa.Table:
    """``df`` as a Parquet writer would store it: pandas' own types, object columns as text."""
    arrays = {
        c: _text_array(df[c].tolist()) if df[c].dtype == object else pa.Array.from_pandas(df[c]) for c in df.columns
    }
    return pa.table(arrays)


def _typed(table: pa.Table, types: Mapping[str, pa.DataType]) -> pa.Table:
    """``table`` with the given columns in other physical types (text: each value's own text)."""
    for c, t in types.items():
        i = table.schema.get_field_index(c)
        col = table.column(c)
        new = _text_array(col.to_pylist()) if t == pa.string() else col.cast(t)
        table = table.set_column(i, c, new)
    return table


#: D's four files in the ``parquet_dir`` source: one physical schema each (file k holds pid % 4 == k;
#: the ages ending in .5 are in file 1, which DuckDB's first-file schema would read as INT64).
DIR_TYPES: tuple[Mapping[str, pa.DataType], ...] = (
    {"age": pa.int64()},
    {"pid": pa.int32(), "code": pa.string()},
    {"age": pa.string(), "code": pa.int8()},
    {"age": pa.int32()},
)


def write_parquet(root: Path, source: str, base: list[dict[str, Any]], person: list[dict[str, Any]]) -> Path:
    """The Parquet form of D + P (P empty: D) under ``root``; returns the path a session reads."""
    if source == "parquet":
        df = frame(_insert(base, person))
        order = np.argsort(pd.to_numeric(df["age"], errors="coerce").to_numpy(), kind="stable")
        path = root / "people.parquet"
        pq.write_table(arrow(df).take(pa.array(order)), path, row_group_size=32)
        return path
    if source == "parquet_dir":
        d = root / "people"
        d.mkdir()
        df = frame(base)
        for k, types in enumerate(DIR_TYPES):
            part = df[df["pid"] % 4 == k].reset_index(drop=True)
            pq.write_table(_typed(arrow(part), types), d / f"part-{k}.parquet")
        if person:
            pq.write_table(arrow(frame(person)), d / "part-p.parquet")
        return d
    d = root / "people"
    keys = ["day", "zip"]
    inner = [c for c in COLUMNS if c not in keys]
    for name, rows in (("part-0", base), ("part-p", person)):
        for key in dict.fromkeys((r["day"], r["zip"]) for r in rows):
            there = [r for r in rows if (r["day"], r["zip"]) == key]
            leaf = d / f"day={key[0]}" / f"zip={key[1]}"
            leaf.mkdir(parents=True, exist_ok=True)
            pq.write_table(arrow(frame(there, inner)), leaf / f"{name}.parquet")
    return d


def spark_frame(spark: Any, df: pd.DataFrame) -> Any:
    """A Spark frame made the usual way from the pandas frame (object columns as text)."""
    return spark.createDataFrame(arrow(df).to_pandas())


def write_source(root: Path, source: str, variant: str, addition: Addition | None) -> Path | pd.DataFrame:
    """D (``addition`` None) or D + P as ``source``, under the empty directory ``root`` (D and each
    D + P in directories of their own, with the same file names)."""
    base = base_rows(variant)
    person = [] if addition is None else addition.person(variant)
    if source == "csv":
        path = root / "people.csv"
        write_csv(path, base, person, {} if addition is None else addition.csv)
        return path
    if source == "frame":
        return frame(_insert(base, person))
    return write_parquet(root, source, base, person)


# -- running the queries with the noise off ----------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    """What one query showed the analyst (``seen``: comparable as a whole) and, when it answered,
    its exact released values (``values``: each aggregate's column) and every noisy part's exact
    integers with its mechanism's sensitivity (``parts``)."""

    query: str
    seen: tuple[Any, ...]
    values: Mapping[str, np.ndarray] = field(default_factory=dict)
    parts: tuple[tuple[float, np.ndarray], ...] = ()

    @property
    def answered(self) -> bool:
        return self.seen[0] == "answered"


@contextlib.contextmanager
def noise_off() -> Iterator[list[tuple[float, np.ndarray]]]:
    """Within: every noisy quantity is released as its exact integer (the mechanism still runs,
    so its interval and event are as usual; only its noisy value is replaced), and each release's
    (sensitivity, exact integers) is appended to the list yielded. A test hook only."""
    real = execute_module._release
    log: list[tuple[float, np.ndarray]] = []

    def exact(mech: Any, ints: np.ndarray, *args: Any, **kwargs: Any) -> Any:
        ints = np.asarray(ints, dtype=np.int64)
        noisy = real(mech, ints, *args, **kwargs)
        log.append((float(mech.sensitivity), ints.copy()))
        return dataclasses.replace(noisy, values=ints.astype(np.float64))

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(execute_module, "_release", exact)
        yield log


def _clean(text: str, roots: Sequence[Path]) -> str:
    for r in roots:
        text = text.replace(str(r), "<root>")
    return re.sub(r"__dpkit_t\d+_\d+", "<view>", text)


def _raised(exc: BaseException, roots: Sequence[Path]) -> tuple[Any, ...]:
    return ("raised", type(exc).__name__, _clean(str(exc), roots))


def _seen(r: Any) -> tuple[Any, ...]:
    keys = tuple(tuple(str(v) for v in r.table[g].tolist()) for g in r.groups)
    infos = tuple((a.name, a.kind, a.column, a.mechanism, a.sensitivity, a.noise_scales) for a in r.aggregates)
    return ("answered", tuple(r.table.columns), r.table.shape, r.groups, keys, r.notes, infos)


def run_queries(make: Callable[[], dp.Session], roots: Sequence[Path] = ()) -> tuple[Outcome, ...]:
    """Every query of :data:`QUERIES` on the session ``make`` builds, with the noise off; a
    failure to build the session is every query's outcome (``roots``: directories whose names
    are blanked in error texts, so D's and D + P's texts compare)."""
    with noise_off() as log:
        try:
            session = make()
        except Exception as exc:
            return tuple(Outcome(q, _raised(exc, roots)) for q in QUERIES)
        out = []
        for q in QUERIES:
            log.clear()
            try:
                r = session.sql(q, epsilon=1.0, rng=np.random.default_rng(7))
            except Exception as exc:
                out.append(Outcome(q, _raised(exc, roots)))
                continue
            values = {a.name: r.table[a.name].to_numpy(dtype=np.float64) for a in r.aggregates}
            out.append(Outcome(q, _seen(r), values, tuple(log)))
    return tuple(out)


def session_maker(
    source: str, engine: str, variant: str, data: Path | pd.DataFrame, portable: bool, spark: Any = None
) -> Callable[[], dp.Session]:
    """How an analyst opens ``data`` (from :func:`write_source`) as ``source`` on ``engine``."""
    kwargs: dict[str, Any] = {
        "metadata": metadata(variant),
        "budget": dp.Budget(epsilon=1e6),
        "rng": np.random.default_rng(11),
        "table": TABLE,
        "portable": portable,
    }
    on_spark = {"engine": "spark", "spark": spark} if engine == "spark" else {}
    if source == "csv":
        return lambda: dp.Session.from_csv(data, **on_spark, **kwargs)
    if source == "frame":
        if engine == "spark":
            return lambda: dp.Session(spark_frame(spark, data), **kwargs)
        return lambda: dp.Session(data, **kwargs)
    return lambda: dp.Session.from_parquet(data, **on_spark, **kwargs)


# -- what D holds ------------------------------------------------------------------------------------------


def truth(variant: str) -> dict[str, dict[str, np.ndarray]]:
    """Each query's exact released values on D, read as declared (nobody in D reaches a bound)."""
    d = frame(base_rows(variant))
    codes = d["code"].astype(str)

    def counts(mask: pd.Series, by: pd.Series, keys: Sequence[str]) -> np.ndarray:
        return np.array([int(((by == k) & mask).sum()) for k in keys], dtype=np.float64)

    every = pd.Series(True, index=d.index)
    pairs = d["city"] + "|" + codes
    cells = d["day"] + "|" + d["zip"]
    chosen = d["age"].between(30, 40) & (d["city"] != "D")
    return {
        QUERIES[0]: {"count": np.array([len(d)], dtype=np.float64)},
        QUERIES[1]: {"mean_age": np.array([d["age"].mean()]), "sum_x": np.array([d["x"].sum()])},
        QUERIES[2]: {"count": counts(every, pairs, [f"{a}|{b}" for a in CITIES for b in CODES])},
        QUERIES[3]: {"count": counts(every, cells, [f"{a}|{b}" for a in DAYS for b in ZIPS])},
        QUERIES[4]: {"count": counts(chosen, d["city"], CITIES)},
    }
