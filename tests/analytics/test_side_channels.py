"""The error channel: nothing an analyst can observe may depend on the data unless it was paid for.

Each test runs the same request on two *neighbouring* tables — D, and D plus one adversarial
person (or with that person's row changed) — and asserts that what the analyst sees is the same:
the exception's type and message, or the answer's shape (columns, and the key set where the keys
are public). A difference is allowed only after the debit, in the noisy values themselves (and in
the released key set of a private key selection, which is paid for).

The tests are deterministic (no statistics): a correct implementation never fails them. Their power
is shown by ``test_the_comparison_has_power``: the same comparison run against the pre-fix
behaviour (types sniffed from the rows, engine run before the debit) tells the neighbours apart.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pandas as pd
import pytest

import dpkit as dp
from dpkit.analytics import Categorical, Metadata, Numeric, QueryResult
from dpkit.analytics.engines.duckdb import DuckDBEngine
from dpkit.errors import InvalidParameterError, QueryFailedError

SEED = 20261126


# ---- what the analyst observes -----------------------------------------------------------------------


def observe(run: Callable[[], Any]) -> tuple[Any, ...]:
    """The analyst's view of one request: the error (type, message) or the answer's shape."""
    try:
        r = run()
    except Exception as exc:  # every exception is an observation, whatever its type
        return ("raised", type(exc).__name__, str(exc))
    if not isinstance(r, QueryResult):  # the power test's old pipeline returns plain rows
        return ("answered", type(r).__name__)
    keys = None
    if r.keys in ("public", "none"):  # a public key set is part of the shape; a private one is paid for
        keys = tuple(map(tuple, r.table[list(r.groups)].astype(str).to_numpy())) if r.groups else ()
    return ("answered", tuple(r.table.columns), keys, r.keys, r.epsilon, r.delta)


def same_on_neighbours(make: Callable[[bool], dp.Session], request: Callable[[dp.Session], Any]) -> tuple[Any, Any]:
    """Observations of ``request`` on D (False) and on its neighbour D' (True)."""
    return observe(lambda: request(make(False))), observe(lambda: request(make(True)))


# ---- neighbouring tables -----------------------------------------------------------------------------


def base_people(n: int = 2000) -> pd.DataFrame:
    rng = np.random.default_rng(SEED)
    return pd.DataFrame(
        {
            "pid": np.arange(n).astype(str),
            "age": rng.integers(18, 90, n).astype(str),
            "zip": rng.choice(["10005", "10006", "20001"], n),
            "sex": rng.choice(["Female", "Male"], n),
            "city": rng.choice(["north", "south"], n),
            "income": rng.gamma(2.0, 20_000.0, n).round(2).astype(str),
        }
    )


#: One adversarial person: values chosen to break whatever was sniffed, parsed or sorted.
ODD_PEOPLE = [
    {"pid": "7", "age": "N/A", "zip": "SECRET-ZIP-9", "sex": " Male", "city": "Zürich-\u202e", "income": "1e308"},
    {"pid": "8", "age": "1e400", "zip": "", "sex": "male", "city": "[9, 9]", "income": "-inf"},
    {"pid": "9", "age": "nan", "zip": "10005.5", "sex": "X" * 500, "city": "north", "income": "NaN"},
]

META = Metadata(
    columns={
        "age": Numeric(0, 120),
        "zip": Categorical(value_type="integer"),
        "sex": Categorical(("Female", "Male")),
        "city": Categorical(),
        "income": Numeric(0, 250_000),
    },
    privacy_unit="pid",
    max_groups=2,
    max_rows=2,
)


def write_pair(tmp_path: Path, odd: dict[str, str], at: int = 1500) -> tuple[Path, Path]:
    """D and D' as CSV files: D' has ``odd`` inserted at row ``at`` (late, past any sniffing sample)."""
    d = base_people()
    d2 = pd.concat([d.iloc[:at], pd.DataFrame([odd]), d.iloc[at:]], ignore_index=True)
    a, b = tmp_path / "d.csv", tmp_path / "d_prime.csv"
    d.to_csv(a, index=False)
    d2.to_csv(b, index=False)
    return a, b


def csv_sessions(tmp_path: Path, odd: dict[str, str], *, epsilon: float = 1e6) -> Callable[[bool], dp.Session]:
    a, b = write_pair(tmp_path, odd)
    return lambda prime: dp.Session.from_csv(
        b if prime else a,
        table="people",
        budget=dp.Budget(epsilon=epsilon, delta=1e-3),
        metadata=META,
        rng=np.random.default_rng(SEED),
    )


# The corpus: query shapes an attacker would try (filters on odd values, groups over private and
# public keys, every aggregate, Gaussian noise, tiny and huge ε, δ at the edges).
CORPUS: list[tuple[str, dict[str, Any]]] = [
    ("SELECT COUNT(*) FROM people WHERE zip = 5", {"epsilon": 0.1}),
    ("SELECT COUNT(*) FROM people WHERE zip = 10005", {"epsilon": 0.1}),
    ("SELECT COUNT(*) FROM people WHERE zip IN (10005, 10006) AND age > 30", {"epsilon": 0.1}),
    ("SELECT sex, COUNT(*), AVG(age), SUM(income) FROM people GROUP BY sex", {"epsilon": 1.0}),
    ("SELECT sex, VARIANCE(income), STDDEV(age) FROM people WHERE city = 'north' GROUP BY sex", {"epsilon": 1.0}),
    ("SELECT city, COUNT(*) FROM people GROUP BY city", {"epsilon": 1.0, "delta": 1e-6}),
    ("SELECT zip, COUNT(*) FROM people GROUP BY zip", {"epsilon": 1.0, "delta": 1e-6}),
    ("SELECT city, zip, COUNT(*) FROM people GROUP BY city, zip", {"epsilon": 1.0, "delta": 1e-6}),
    ("SELECT MEDIAN(income), QUANTILE_CONT(age, 0.9) FROM people", {"epsilon": 1.0}),
    ("SELECT sex, MEDIAN(age) FROM people WHERE income > 1000 GROUP BY sex", {"epsilon": 1.0}),
    ("SELECT COUNT(DISTINCT pid) FROM people WHERE age IS NULL", {"epsilon": 1.0}),
    ("SELECT COUNT(*) FROM people WHERE city = 'Zürich-\u202e' OR sex = ' Male'", {"epsilon": 0.5}),
    ("SELECT SUM(income) FROM people WHERE age BETWEEN 0 AND 1e300", {"epsilon": 0.5}),
    (
        "SELECT sex, SUM(income), AVG(income) FROM people GROUP BY sex",
        {"epsilon": 1.0, "delta": 1e-6, "noise": "gaussian"},
    ),
    ("SELECT SUM(income) FROM people", {"epsilon": 1e-9}),
    ("SELECT SUM(income) FROM people", {"epsilon": 5000.0}),
    ("SELECT city, COUNT(*) FROM people GROUP BY city", {"epsilon": 2000.0, "delta": 1e-6}),
    ("SELECT city, COUNT(*) FROM people GROUP BY city", {"epsilon": 1.0, "delta": 1e-20}),
    ("SELECT city, COUNT(*) FROM people GROUP BY city", {"epsilon": 1.0, "delta": 1e-6, "key_selection": "gaussian"}),
    ("SELECT city, COUNT(*) FROM people GROUP BY city", {"epsilon": 1.0, "delta": 1e-6, "key_selection": "laplace"}),
    ("SELECT tags, COUNT(*) FROM people GROUP BY tags", {"epsilon": 0.1, "delta": 1e-7}),
    ("SELECT COUNT(*) FROM people WHERE pid = 7", {"epsilon": 0.1}),
    ("SELECT AVG(zip) FROM people", {"epsilon": 0.1}),
    ("SELECT COUNT(*) FROM people WHERE zip = 'SECRET-ZIP-9'", {"epsilon": 0.1}),
]


@pytest.mark.parametrize("odd", ODD_PEOPLE, ids=["secret-zip", "overflow", "nan-long"])
@pytest.mark.parametrize("sql, kwargs", CORPUS, ids=[f"q{i}" for i in range(len(CORPUS))])
def test_corpus_is_blind_to_one_person(tmp_path: Path, odd: dict[str, str], sql: str, kwargs: dict[str, Any]) -> None:
    make = csv_sessions(tmp_path, odd)
    seen_d, seen_d_prime = same_on_neighbours(make, lambda s, sql=sql, kwargs=kwargs: s.sql(sql, **kwargs))
    assert seen_d == seen_d_prime
    assert "SECRET" not in str(seen_d) and "Zürich" not in str(seen_d) or "SECRET" in sql or "Zürich" in sql


# The same attack through the Python query builder: bins, explicit keys, histograms, bounds.
API_CORPUS: list[Callable[[dp.Session], Any]] = [
    lambda s: s.group_by("age", bins={"age": [0, 30, 60, 120]}).count(epsilon=0.5),
    lambda s: s.group_by("sex", keys=["Female", "Male", " Male"]).mean("income", epsilon=0.5),
    lambda s: s.group_by("zip", keys=[10005, 10006, 99999]).count_units(epsilon=0.5),
    lambda s: s.histogram("income", bins=[0, 1e4, 1e5, 1e300], epsilon=0.5),
    lambda s: s.quantile("income", 0.99, epsilon=0.5),
    lambda s: s.query().bound(max_groups=1, max_rows=5).where("zip IS NULL").count(epsilon=0.5),
    lambda s: s.where("age > 1e308 OR age < -1e308").sum("income", epsilon=0.5),
    lambda s: s.group_by("city", "sex").variance("age", epsilon=1.0, delta=1e-6),
    lambda s: s.where("city IN ('north', 'Zürich-\u202e')").std("income", epsilon=1.0, noise="gaussian", delta=1e-6),
]


@pytest.mark.parametrize("odd", ODD_PEOPLE, ids=["secret-zip", "overflow", "nan-long"])
@pytest.mark.parametrize("request_", API_CORPUS, ids=[f"api{i}" for i in range(len(API_CORPUS))])
def test_query_builder_is_blind_to_one_person(
    tmp_path: Path, odd: dict[str, str], request_: Callable[[dp.Session], Any]
) -> None:
    seen_d, seen_d_prime = same_on_neighbours(csv_sessions(tmp_path, odd), request_)
    assert seen_d == seen_d_prime
    assert "SECRET" not in str(seen_d)


@pytest.mark.parametrize("sql, kwargs", CORPUS, ids=[f"q{i}" for i in range(len(CORPUS))])
def test_refusals_never_reach_the_engine(
    tmp_path: Path, sql: str, kwargs: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the budget spent, every query is refused (or rejected as invalid) without a single
    engine call — so the refusal's content and timing cannot depend on the data."""
    calls: list[str] = []
    for name in ("compute",):
        real = getattr(DuckDBEngine, name)
        monkeypatch.setattr(
            DuckDBEngine, name, lambda self, plan, _real=real, _n=name: (calls.append(_n), _real(self, plan))[1]
        )
    make = csv_sessions(tmp_path, ODD_PEOPLE[0], epsilon=1e-3)
    for prime in (False, True):
        s = make(prime)
        s.count(epsilon=1e-3)  # spends everything
        calls.clear()
        seen = observe(lambda s=s: s.sql(sql, **kwargs))
        assert seen[0] == "raised" and seen[1] in ("BudgetExceededError", "InvalidParameterError"), seen
        assert calls == []


# ---- the cases, one by one -----------------------------------------------------------------


def test_poisoned_csv_row_is_null_not_an_error(tmp_path: Path) -> None:
    """A CSV whose 30,001st row has text in a column that looks integer: the query answers (the
    value reads as NULL under the declared type), the same way as on the clean file."""
    n = 40_000
    clean = pd.DataFrame({"pid": np.arange(n), "zip": np.arange(n) % 50, "age": 44})
    poisoned = clean.astype({"zip": object}).copy()
    poisoned.loc[30_000, "zip"] = "SECRET-ZIP-9"
    meta = Metadata(columns={"zip": Categorical(value_type="integer"), "age": Numeric(0, 100)}, privacy_unit="pid")
    paths = []
    for name, frame in (("clean", clean), ("messy", poisoned)):
        p = tmp_path / f"{name}.csv"
        frame.to_csv(p, index=False)
        paths.append(p)

    def make(prime: bool) -> dp.Session:
        return dp.Session.from_csv(
            paths[prime], table="messy", budget=dp.Budget(epsilon=1.0), metadata=meta, rng=np.random.default_rng(1)
        )

    a, b = same_on_neighbours(make, lambda s: s.sql("SELECT COUNT(*) FROM messy WHERE zip = 5", epsilon=0.1))
    assert a == b and a[0] == "answered"
    # the engine really reads the poisoned row as NULL (checked directly, not through noise)
    engine = DuckDBEngine(paths[1])
    engine.bind({"zip": "integer"}, strip_strings=True)
    assert engine._con.execute(f"SELECT count(*) FROM {engine._from} WHERE zip IS NULL").fetchone() == (1,)


def _list_table(with_person: bool) -> duckdb.DuckDBPyConnection:
    con = duckdb.connect()
    con.execute("CREATE TABLE t (pid INTEGER, tags INTEGER[], age INTEGER)")
    con.execute("INSERT INTO t SELECT range, [1, 1], 30 FROM range(200)")
    if with_person:
        con.execute("INSERT INTO t VALUES (7000, [9, 9], 30)")
    return con


def test_list_columns_cannot_be_declared_or_used() -> None:
    """A LIST column: declared, it is refused at construction (nothing spent); undeclared, it is
    an unknown column — and the answers are the same whether or not one person's list differs."""
    meta_with_tags = {
        "columns": {"tags": {"type": "categorical"}, "age": {"type": "numeric", "lower": 0, "upper": 100}},
        "privacy_unit": "pid",
    }
    for prime in (False, True):
        with pytest.raises(InvalidParameterError, match="LIST"):
            dp.Session.from_duckdb(_list_table(prime), "t", budget=dp.Budget(epsilon=1.0), metadata=meta_with_tags)

    def make(prime: bool) -> dp.Session:
        b = dp.Budget(epsilon=0.1, delta=1e-6)
        s = dp.Session.from_duckdb(
            _list_table(prime),
            "t",
            budget=b,
            metadata={"columns": {"age": {"type": "numeric", "lower": 0, "upper": 100}}, "privacy_unit": "pid"},
        )
        s.count(epsilon=0.1)  # the budget is now spent
        return s

    query = "SELECT tags, COUNT(*) FROM t WHERE pid = 7000 OR pid = 0 GROUP BY tags"
    a, b = same_on_neighbours(make, lambda s: s.sql(query, epsilon=0.1, delta=1e-7))
    assert a == b and a[0] == "raised" and a[1] == "InvalidParameterError"


def test_refusal_does_not_depend_on_how_many_rows_match(monkeypatch: pytest.MonkeyPatch) -> None:
    """The issue's timing case (1 row vs 150,000 rows for pid 7), checked by instrumenting the
    engine rather than by timing: with the budget spent, the engine is never called."""
    calls: list[int] = []
    monkeypatch.setattr(DuckDBEngine, "compute", lambda self, plan: calls.append(1))
    seen = []
    for rows in (1, 150_000):
        df = pd.DataFrame({"pid": np.r_[np.full(rows, 7), np.arange(100, 1100)], "age": 40})
        budget = dp.Budget(epsilon=0.1)
        budget.spend(dp.Laplace(epsilon=0.1).event)  # spent elsewhere, before this session
        s = dp.Session(df, budget=budget, metadata=Metadata(columns={"age": Numeric(0, 100)}, privacy_unit="pid"))
        seen.append(observe(lambda s=s: s.sum("age", epsilon=0.1)))
    assert seen[0] == seen[1] and seen[0][1] == "BudgetExceededError" and calls == []


def test_a_failure_after_the_debit_is_generic_and_paid(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """If the engine still fails (here forced, with a data value in its message), the analyst
    gets QueryFailedError with a fixed message, the spend stands, and only the curator's log has
    the details."""

    def boom(self: DuckDBEngine, plan: Any) -> None:
        raise RuntimeError("Original Line: 30000,SECRET-ZIP-9,44")

    monkeypatch.setattr(DuckDBEngine, "compute", boom)
    s = dp.Session(base_people(), budget=dp.Budget(epsilon=1.0), metadata=META)
    with caplog.at_level("ERROR", logger="dpkit.curator"), pytest.raises(QueryFailedError) as info:
        s.count(epsilon=0.25)
    assert str(info.value) == QueryFailedError.MESSAGE and "SECRET" not in repr(info.value)
    assert info.value.__cause__ is None and info.value.__suppress_context__
    assert s.spent == (0.25, 0.0)
    assert "SECRET-ZIP-9" in caplog.text


def test_parameter_errors_come_before_the_debit() -> None:
    """δ below what key selection accepts, or an ε that overflows its tables, is refused (or
    answered) before anything is spent — never charged and then failed."""
    s = dp.Session(base_people(), budget=dp.Budget(epsilon=5000.0, delta=1e-3), metadata=META)
    with pytest.raises(InvalidParameterError, match="delta"):
        s.group_by("city").count(epsilon=1.0, delta=1e-20)
    assert s.spent == (0.0, 0.0)
    r = s.group_by("city").count(epsilon=2000.0, delta=1e-6)
    assert set(r.table["city"]) <= {"north", "south"} and s.spent[0] == pytest.approx(2000.0)


def test_the_schema_never_comes_from_the_rows(tmp_path: Path) -> None:
    """Two CSVs that differ in one person's row (``100,N/A``): the declared kinds, the filter
    that compares with a number, and the answers' shapes are the same."""
    a, b = tmp_path / "a.csv", tmp_path / "b.csv"
    a.write_text("pid,zip\n" + "".join(f"{i},{10000 + i % 7}\n" for i in range(300)) + "100,10005\n")
    b.write_text("pid,zip\n" + "".join(f"{i},{10000 + i % 7}\n" for i in range(300)) + "100,N/A\n")
    meta = Metadata(columns={"zip": Categorical(value_type="integer")}, privacy_unit="pid")
    sessions = [
        dp.Session.from_csv(p, table="t", budget=dp.Budget(epsilon=10.0), metadata=meta, rng=np.random.default_rng(0))
        for p in (a, b)
    ]
    assert sessions[0].columns == sessions[1].columns == {"zip": "numeric", "pid": "unit"}
    seen = [observe(lambda s=s: s.sql("SELECT COUNT(*) FROM t WHERE zip = 10005", epsilon=1.0)) for s in sessions]
    assert seen[0] == seen[1] and seen[0][0] == "answered"
    # integer categories declared for a text column: every value reads as NULL — zeros, not errors
    text = Metadata(columns={"sex": Categorical((1, 2))}, row_level=True)
    s = dp.Session(
        pd.DataFrame({"sex": ["F", "M"] * 50}),
        budget=dp.Budget(epsilon=1e6),
        metadata=text,
        rng=np.random.default_rng(0),
    )
    r = s.group_by("sex").count(epsilon=1e5)
    assert r.table["sex"].tolist() == [1, 2] and r.table["count"].abs().max() < 1
    assert observe(lambda: s.where("sex = 1").count(epsilon=1.0))[0] == "answered"


def test_undeclared_columns_and_no_unit_are_refused() -> None:
    df = base_people()
    with pytest.raises(InvalidParameterError, match="privacy_unit"):
        dp.Session(df, budget=dp.Budget(epsilon=1.0), metadata=Metadata(columns={"age": Numeric(0, 120)}))
    s = dp.Session(
        df, budget=dp.Budget(epsilon=1.0), metadata=Metadata(columns={"age": Numeric(0, 120)}, privacy_unit="pid")
    )
    assert set(s.columns) == {"age", "pid"}
    with pytest.raises(InvalidParameterError, match="declared column"):
        s.where("zip = 5").count(epsilon=0.1)
    with pytest.raises(InvalidParameterError, match="privacy unit"):
        s.where("pid = 7").count(epsilon=0.1)
    assert s.spent == (0.0, 0.0)


def test_results_state_their_privacy_unit() -> None:
    s = dp.Session(base_people(), budget=dp.Budget(epsilon=1.0), metadata=META, rng=np.random.default_rng(0))
    r = s.group_by("sex").count(epsilon=0.1)
    assert (r.privacy_unit, r.max_groups, r.max_rows, r.neighbours) == ("pid", 2, 2, "add_remove")
    assert r.to_dict()["privacy_unit"] == {
        "column": "pid",
        "row_level": False,
        "max_groups": 2,
        "max_rows": 2,
        "neighbours": "add_remove",
    }
    assert "privacy unit: pid" in repr(r)
    rows = dp.Session(
        base_people(), budget=dp.Budget(epsilon=1.0), metadata=Metadata(columns={}, row_level=True)
    ).count(epsilon=0.1)
    assert rows.privacy_unit is None and "a row" in rows.unit_description


# ---- power: the comparison catches the old behaviour ----------------------------------------------------


def test_the_comparison_has_power(tmp_path: Path) -> None:
    """Run the comparison against the pre-fix pipeline — DuckDB sniffing the CSV's types, the
    engine run before the debit — and it must tell the neighbours apart."""
    a, b = write_pair(tmp_path, ODD_PEOPLE[0])

    def old_pipeline(path: Path) -> Any:
        rel = duckdb.connect().read_csv(str(path))  # types sniffed from the rows
        return rel.filter("zip = 5").aggregate("count(*)").fetchall()

    assert observe(lambda: old_pipeline(a)) != observe(lambda: old_pipeline(b))


# ---- the same on Spark --------------------------------------------------------------------------------

SPARK_CORPUS = [CORPUS[i] for i in (0, 3, 5, 8, 13, 16, 17, 20, 21)]


@pytest.fixture(scope="module")
def spark():  # type: ignore[no-untyped-def]
    pytest.importorskip("pyspark")
    from dpkit.analytics.engines.spark import spark_session

    try:
        sp = spark_session()
    except Exception as exc:  # pragma: no cover - no Java on this machine
        pytest.skip(f"Spark could not start: {exc}")
    sp.conf.set("spark.sql.ansi.enabled", "true")  # a user's session: casts raise unless the engine is total
    yield sp
    sp.conf.set("spark.sql.ansi.enabled", "false")


@pytest.mark.slow
def test_corpus_is_blind_to_one_person_on_spark(tmp_path: Path, spark: Any) -> None:
    a, b = write_pair(tmp_path, ODD_PEOPLE[0])
    frames = [spark.read.csv(str(p), header=True).cache() for p in (a, b)]  # every column as text

    def make(prime: bool) -> dp.Session:
        return dp.Session(
            frames[prime],
            table="people",
            budget=dp.Budget(epsilon=1e6, delta=1e-3),
            metadata=META,
            rng=np.random.default_rng(SEED),
        )

    for sql, kwargs in SPARK_CORPUS:
        seen_d, seen_d_prime = same_on_neighbours(make, lambda s, sql=sql, kwargs=kwargs: s.sql(sql, **kwargs))
        assert seen_d == seen_d_prime, sql
        assert "SECRET" not in str(seen_d)


def test_list_columns_on_spark(spark: Any) -> None:
    from pyspark.sql import types as T

    schema = T.StructType(
        [
            T.StructField("pid", T.LongType()),
            T.StructField("tags", T.ArrayType(T.LongType())),
            T.StructField("age", T.LongType()),
        ]
    )
    rows = [(i, [1, 1], 30) for i in range(50)]
    for prime in (False, True):
        df = spark.createDataFrame(rows + ([(7000, [9, 9], 30)] if prime else []), schema)
        with pytest.raises(InvalidParameterError, match="LIST"):
            dp.Session(
                df,
                budget=dp.Budget(epsilon=1.0),
                metadata={"columns": {"tags": {"type": "categorical"}}, "privacy_unit": "pid"},
            )
        s = dp.Session(
            df,
            budget=dp.Budget(epsilon=0.1, delta=1e-6),
            metadata={"columns": {"age": {"type": "numeric", "lower": 0, "upper": 100}}, "privacy_unit": "pid"},
        )
        with pytest.raises(InvalidParameterError, match="tags"):
            s.sql("SELECT tags, COUNT(*) FROM data WHERE age = 30 GROUP BY tags", epsilon=0.1, delta=1e-7)
