"""The ingestion neighbour corpus: reading data is a release too.

For each source (CSV file, Parquet file, Parquet directory whose files disagree on physical types,
Hive-partitioned directory, pandas frame / Spark frame), each engine and each hostile one-person
addition P (a quoted line break, a stray quote, invalid UTF-8, a value that changes a file's or a
partition's inferred type, a NaN that changes a pandas dtype, −0.0 beside 0.0 in the privacy unit
under portable and native hashing, a lone surrogate, 1e300 / 1e308, a 10 MB field), the same
analyst queries run on the base table D and on D + P (see ``_ingestion_corpus`` for the tables).

* ``test_one_person_cannot_change_what_the_analyst_sees``: answered or raised, the exception's type
  and text, the result's columns, shape, keys, notes and mechanisms are the same on D and D + P;
  and with the noise switched off (``_ingestion_corpus.noise_off``, a test hook that releases
  every noisy quantity as its exact integer) every released count moves by at most the declared
  contribution bound (1 a row; max_rows for a unit) and every noisy part (counts, sums, the
  mean's parts) by at most its mechanism's sensitivity.
* ``test_the_base_table_reads_as_declared``: D itself answers every query with the exact values
  read by the declared types (otherwise D and D + P could agree by both being wrong: a Hive
  ``zip=00501`` read as the integer 501 matches no declared key on either).
* ``test_duckdb_and_spark_agree``: on every corpus table (D and each D + P) both engines release
  the same exact integers (portable hashing).

Everything is deterministic: the noise is off, every query has a fixed ``rng=`` seed (the same
salt on D and on D + P), so the false-failure rate is 0. Each table is written once per module; the
Spark cases (marker ``spark``) share one local Spark session.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from analytics._ingestion_corpus import (
    ADDITIONS,
    BY_NAME,
    QUERIES,
    SOURCES,
    VARIANTS,
    Addition,
    Outcome,
    absent,
    bound,
    run_queries,
    session_maker,
    truth,
    write_source,
)

pytestmark = [
    pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas:FutureWarning"),
    pytest.mark.filterwarnings("ignore:The copy keyword is deprecated"),  # pyspark's pandas 3 conversions
]

ENGINES = ("duckdb", "spark")


def variants(source: str) -> tuple[str, ...]:
    """Row-level runs on CSV only, where one record can become two (a bound of 1 catches it; a unit's
    max_rows could hide it); elsewhere the privacy-unit variant reads the same bytes and also
    exercises the unit's hashing."""
    return VARIANTS if source == "csv" else ("unit",)


class Corpus:
    """The module's tables and query outcomes, each made once: D and every D + P per source and
    variant (in directories of their own under ``root``), and the outcomes per engine."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._data: dict[tuple[str, str, str], Path | pd.DataFrame] = {}
        self._runs: dict[tuple[str, str, str, str, bool], tuple[Outcome, ...]] = {}

    def data(self, source: str, variant: str, addition: Addition | None) -> Path | pd.DataFrame:
        key = (source, variant, "D" if addition is None else addition.name)
        if key not in self._data:
            d = self.root / "-".join(key)
            d.mkdir()
            self._data[key] = write_source(d, source, variant, addition)
        return self._data[key]

    def run(
        self, engine: str, source: str, variant: str, addition: Addition | None, portable: bool, spark: Any
    ) -> tuple[Outcome, ...]:
        key = (engine, source, variant, "D" if addition is None else addition.name, portable)
        if key not in self._runs:
            data = self.data(source, variant, addition)
            dirs = [self.root / "-".join((source, variant, k)) for k in ("D", key[3])]
            make = session_maker(source, engine, variant, data, portable, spark)
            self._runs[key] = run_queries(make, dirs)
        return self._runs[key]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Corpus:
    return Corpus(tmp_path_factory.mktemp("corpus"))


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    pytest.importorskip("pyspark")
    from dpkit.analytics.engines.spark import spark_session

    # the process-wide session; not stopped here so later modules reuse the running JVM
    yield spark_session()


def _spark(request: pytest.FixtureRequest, engine: str) -> Any:
    return request.getfixturevalue("spark") if engine == "spark" else None


def _marks(engine: str) -> list[pytest.MarkDecorator]:
    return [pytest.mark.spark, pytest.mark.slow] if engine == "spark" else []


def _neighbour_cases() -> Iterator[Any]:
    for engine in ENGINES:
        for source in SOURCES:
            for variant in variants(source):
                for a in ADDITIONS:
                    if variant in a.variants and absent(a, source, engine) is None:
                        yield pytest.param(
                            engine,
                            source,
                            variant,
                            a.name,
                            id=f"{engine}-{source}-{variant}-{a.name}",
                            marks=_marks(engine),
                        )


def _base_cases() -> Iterator[Any]:
    for engine in ENGINES:
        for source in SOURCES:
            for variant in variants(source):
                yield pytest.param(engine, source, variant, id=f"{engine}-{source}-{variant}", marks=_marks(engine))


def _pair_cases() -> Iterator[Any]:
    """Every corpus table both engines read, hashed portably (the same rows kept on both)."""
    for source in SOURCES:
        for variant in variants(source):
            for name in ("D", *(a.name for a in ADDITIONS if a.portable and variant in a.variants)):
                a = BY_NAME.get(name)
                if a is None or all(absent(a, source, e) is None for e in ENGINES):
                    yield pytest.param(source, variant, name, id=f"{source}-{variant}-{name}", marks=_marks("spark"))


def _said(o: Outcome) -> str:
    """One line for a failure message: what the analyst saw."""
    if o.answered:
        return f"answered {o.seen[2][0]}x{o.seen[2][1]} {list(o.seen[1])}"
    text = o.seen[2].splitlines()[0] if o.seen[2] else ""
    return f"raised {o.seen[1]}: {text[:160]}"


def _moves(before: Outcome, after: Outcome, row_bound: int) -> list[str]:
    """How far the exact released quantities moved beyond their bounds (empty: within)."""
    out = []
    for name, v in before.values.items():
        if name == "count":
            moved = np.abs(after.values[name] - v)
            if not np.all(moved <= row_bound):
                out.append(
                    f"count moved by {moved.tolist()} > {row_bound}: {v.tolist()} -> {after.values[name].tolist()}"
                )
    if len(before.parts) != len(after.parts):
        return [*out, f"{len(before.parts)} noisy parts on D, {len(after.parts)} on D+P"]
    for (sens, x), (_, y) in zip(before.parts, after.parts, strict=True):
        if x.shape != y.shape:
            out.append(f"a noisy part has shape {x.shape} on D, {y.shape} on D+P")
            continue
        d = np.abs(y.astype(np.float64) - x.astype(np.float64))
        if d.sum() > sens:
            out.append(f"a noisy part moved by {d.tolist()} (L1 {d.sum():g}) > its sensitivity {sens:g}")
    return out


@pytest.mark.parametrize(("engine", "source", "variant", "name"), list(_neighbour_cases()))
def test_one_person_cannot_change_what_the_analyst_sees(
    engine: str, source: str, variant: str, name: str, corpus: Corpus, request: pytest.FixtureRequest
) -> None:
    spark = _spark(request, engine)
    a = BY_NAME[name]
    d = corpus.run(engine, source, variant, None, a.portable, spark)
    dp_ = corpus.run(engine, source, variant, a, a.portable, spark)
    problems = []
    for before, after in zip(d, dp_, strict=True):
        if before.seen != after.seen:
            problems.append(f"{before.query}: on D {_said(before)}; on D+P {_said(after)}")
        elif before.answered:
            problems += [f"{before.query}: {m}" for m in _moves(before, after, bound(variant))]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize(("engine", "source", "variant"), list(_base_cases()))
def test_the_base_table_reads_as_declared(
    engine: str, source: str, variant: str, corpus: Corpus, request: pytest.FixtureRequest
) -> None:
    outcomes = corpus.run(engine, source, variant, None, True, _spark(request, engine))
    expected = truth(variant)
    problems = []
    for o in outcomes:
        if not o.answered:
            problems.append(f"{o.query}: {_said(o)}")
            continue
        for name, want in expected[o.query].items():
            got = o.values[name]
            if got.shape != want.shape or not np.allclose(got, want, rtol=1e-12, atol=1e-9):
                problems.append(f"{o.query}: {name} = {got.tolist()}, declared reading gives {want.tolist()}")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize(("source", "variant", "name"), list(_pair_cases()))
def test_duckdb_and_spark_agree(source: str, variant: str, name: str, corpus: Corpus, spark: Any) -> None:
    a = BY_NAME.get(name)
    runs = {e: corpus.run(e, source, variant, a, True, spark if e == "spark" else None) for e in ENGINES}
    problems = []
    for on_duckdb, on_spark in zip(runs["duckdb"], runs["spark"], strict=True):
        if not (on_duckdb.answered and on_spark.answered):
            if on_duckdb.seen != on_spark.seen:
                problems.append(f"{on_duckdb.query}: DuckDB {_said(on_duckdb)}; Spark {_said(on_spark)}")
            continue
        ints = [x.tolist() for _, x in on_duckdb.parts], [x.tolist() for _, x in on_spark.parts]
        if on_duckdb.seen != on_spark.seen or ints[0] != ints[1]:
            problems.append(f"{on_duckdb.query}: DuckDB releases {ints[0]}, Spark {ints[1]}")
    assert not problems, "\n".join(problems)


def test_the_corpus_covers_every_query_and_addition() -> None:
    """The truth table names every query, and every addition is run somewhere on each engine (a
    lone surrogate exists in a pandas object column only)."""
    assert set(truth("rows")) == set(QUERIES) == set(truth("unit"))
    for a in ADDITIONS:
        for engine in ENGINES if a.name != "lone_surrogate" else ("duckdb",):
            assert any(absent(a, s, engine) is None for s in SOURCES), (a.name, engine)
