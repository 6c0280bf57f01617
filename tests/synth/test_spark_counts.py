"""dpkit.synth on Spark: the marginals counted on the cluster equal DuckDB's cell for cell, the
budget pays before Spark reads a row, a missing column is refused before paying, and what
reaches the driver is bounded by the domain, not by the rows.

Deterministic (fixed seeds and salts); the sampled table's checks allow more than 6 standard
deviations of sampling error (false-failure rate below 1e-8)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import dpkit as dp
from dpkit.analytics import Categorical, Metadata, Numeric
from dpkit.analytics.engines.base import is_spark_frame
from dpkit.errors import InvalidParameterError
from dpkit.synth import Domain, Synthesizer
from dpkit.synth import spark_counts as spark_module
from dpkit.synth.measure import TableCounts
from dpkit.synth.spark_counts import SparkTableCounts

pyspark = pytest.importorskip("pyspark")

META = Metadata(
    columns={
        "sex": Categorical(("F", "M")),
        "age": Numeric(0, 100),
        "city": Categorical(("a", "b", "c")),
        "kids": Categorical((0, 1, 2)),
    },
    row_level=True,
)


def _frame(n: int = 3_000, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    sex = rng.choice(np.array(["F", "M", " F ", "x", None], dtype=object), n, p=[0.45, 0.45, 0.04, 0.03, 0.03])
    age = rng.normal(45, 30, n)  # past both bounds
    age[rng.random(n) < 0.03] = np.nan
    city = rng.choice(np.array(["a", "b", "c", "d"], dtype=object), n)
    kids = rng.integers(0, 4, n)  # 3: not a declared category
    return pd.DataFrame({"sex": sex, "age": age, "city": city, "kids": kids})


@pytest.fixture(scope="module")
def spark():
    from dpkit.analytics.engines.spark import spark_session

    return spark_session()


def _all_counts(counts, d: int) -> dict:  # type: ignore[no-untyped-def]
    counts.prepare(salt=12345)
    cliques = [(i,) for i in range(d)] + [(i, j) for i in range(d) for j in range(i + 1, d)]
    return {c: counts.counts(c) for c in cliques}


TAGS = ("O'Brien", "a\\b", "x\ty", "plain")  # a quote, a backslash, a tab: built without SQL text


@pytest.mark.parametrize("strip", [True, False])
def test_spark_counts_every_marginal_as_duckdb_does(spark, strip: bool) -> None:
    meta = Metadata(columns={**META.columns, "tag": Categorical(TAGS)}, row_level=True, strip_strings=strip)
    frame = _frame()
    frame["tag"] = np.random.default_rng(9).choice(np.array([*TAGS, "other", None], dtype=object), len(frame))
    domain = Domain.from_metadata(meta, bins={"age": [0, 18, 30, 50, 65, 100]})
    duck = _all_counts(TableCounts(frame, meta, domain), 5)
    sp = _all_counts(SparkTableCounts(spark.createDataFrame(frame), meta, domain), 5)
    assert duck.keys() == sp.keys()
    for clique in duck:
        np.testing.assert_array_equal(sp[clique], duck[clique], err_msg=str(clique))
        assert sp[clique].sum() == len(frame)
    # the cells the rules must send somewhere: unknown labels and NULL to the missing cell, NaN
    # and ages past the bounds clipped into the edge bins
    assert duck[(0,)][2] == int((~frame["sex"].isin(["F", "M"] + ([" F "] if strip else []))).sum())
    assert list(sp[(4,)][:4]) == [int((frame["tag"] == t).sum()) for t in TAGS]


def test_one_row_per_unit_on_both_engines(spark) -> None:
    rng = np.random.default_rng(3)
    frame = _frame(4_000)
    frame["pid"] = rng.integers(0, 700, len(frame))
    frame.loc[rng.random(len(frame)) < 0.02, "pid"] = None  # rows of no one: dropped
    meta = Metadata(columns=META.columns, privacy_unit="pid")
    domain = Domain.from_metadata(meta)
    duck = _all_counts(TableCounts(frame, meta, domain), 4)
    sp = _all_counts(SparkTableCounts(spark.createDataFrame(frame), meta, domain), 4)
    units = frame["pid"].nunique()
    for clique in duck:
        assert duck[clique].sum() == sp[clique].sum() == units
    # A person whose rows are all alike: the kept row is that row on both engines.
    same = frame.drop_duplicates("pid").dropna(subset=["pid"])
    same = same.loc[same.index.repeat(3)].reset_index(drop=True)
    duck = _all_counts(TableCounts(same, meta, domain), 4)
    sp = _all_counts(SparkTableCounts(spark.createDataFrame(same), meta, domain), 4)
    for clique in duck:
        np.testing.assert_array_equal(sp[clique], duck[clique])


def test_what_reaches_the_driver_is_bounded_by_the_domain(spark, monkeypatch: pytest.MonkeyPatch) -> None:
    collected: list[int] = []
    frames = [spark.createDataFrame(_frame(n, seed=n)) for n in (1_000, 20_000)]
    kind = type(frames[0])  # pyspark's classic DataFrame
    original = kind.toPandas
    monkeypatch.setattr(kind, "toPandas", lambda self: (lambda f: (collected.append(len(f)), f)[1])(original(self)))
    domain = Domain.from_metadata(META)
    cells = sum(c.size for c in domain.columns) + sum(
        a.size * b.size for i, a in enumerate(domain.columns) for b in domain.columns[i + 1 :]
    )
    for frame in frames:
        SparkTableCounts(frame, META, domain).prepare(salt=1)
    assert len(collected) == 2 and all(k <= cells for k in collected), (collected, cells)


def test_a_spark_frame_is_fitted_on_spark_and_paid_first(spark, monkeypatch: pytest.MonkeyPatch) -> None:
    order: list[str] = []
    budget = dp.Budget(epsilon=1.0, delta=1e-9, accountant="zcdp")
    spend, prepare = dp.Budget.spend, SparkTableCounts.prepare
    monkeypatch.setattr(dp.Budget, "spend", lambda self, e: (order.append("pay"), spend(self, e))[1])
    monkeypatch.setattr(SparkTableCounts, "prepare", lambda self, salt: (order.append("read"), prepare(self, salt))[1])
    frame = _frame(5_000)
    sdf = spark.createDataFrame(frame)
    assert is_spark_frame(sdf) and not is_spark_frame(frame)
    syn = Synthesizer(epsilon=1.0, delta=1e-9, metadata=META, budget=budget, rng=np.random.default_rng(2)).fit(sdf)
    assert order == ["pay", "read"] and len(budget.events) == 1
    assert syn.report is not None and abs(syn.report.rows - len(frame)) < 200
    rows = syn.sample(4_000)
    assert list(rows.columns) == ["sex", "age", "city", "kids"] and len(rows) == 4_000
    # F and M (with " F " read as F) are about 47 % each; at n = 4,000 six standard deviations are 4.7 %
    assert abs((rows["sex"] == "M").mean() - 0.45) < 0.08


def test_spark_refusals_spend_nothing(spark, monkeypatch: pytest.MonkeyPatch) -> None:
    read: list[int] = []
    monkeypatch.setattr(spark_module.SparkTableCounts, "prepare", lambda self, salt: read.append(1))
    budget = dp.Budget(epsilon=1.0, delta=1e-9, accountant="zcdp")
    sdf = spark.createDataFrame(_frame(200).drop(columns="city"))
    with pytest.raises(InvalidParameterError, match="metadata.columns.city"):
        Synthesizer(epsilon=1.0, delta=1e-9, metadata=META, budget=budget).fit(sdf)
    with pytest.raises(InvalidParameterError, match="table"):
        Synthesizer(epsilon=1.0, delta=1e-9, metadata=META, budget=budget).fit(
            spark.createDataFrame(_frame(200)), table="t"
        )
    assert not budget.events and not read


def test_dpkit_synth_on_spark_reads_a_parquet_directory(spark, tmp_path) -> None:  # type: ignore[no-untyped-def]
    import json

    from typer.testing import CliRunner

    from dpkit.cli import app

    frame = _frame(3_000)
    for k, part in frame.groupby(np.arange(len(frame)) % 2):
        (tmp_path / "people" / f"part={k}").mkdir(parents=True)
        part.to_parquet(tmp_path / "people" / f"part={k}" / "rows.parquet", index=False)
    (tmp_path / "meta.json").write_text(json.dumps(META.to_dict()))
    args = ["synth", str(tmp_path / "people"), "--metadata", str(tmp_path / "meta.json"), "--epsilon", "1",
            "--delta", "1e-9", "--out", str(tmp_path / "out.csv"), "--rows", "300", "--engine", "spark",
            "--master", "local[2]", "--conf", "spark.sql.shuffle.partitions=4"]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    out = pd.read_csv(tmp_path / "out.csv")
    assert len(out) == 300 and list(out.columns) == ["sex", "age", "city", "kids"]
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "a.parquet").write_text("not parquet")
    bad = CliRunner().invoke(app, [*args[:1], str(tmp_path / "junk"), *args[2:]])
    assert bad.exit_code == 1 and "Parquet files whose footers can be read" in bad.output, bad.output


def test_columns_declared_never_missing_count_alike_on_both_engines(spark) -> None:
    """``nullable=False``: no missing cell, and a NULL or an unlisted value counted in the first
    cell (first category, first bin) — the same on Spark as on DuckDB."""
    strict = Metadata(
        columns={
            name: Numeric(spec.lower, spec.upper, nullable=False)
            if isinstance(spec, Numeric)
            else Categorical(spec.categories, nullable=False)
            for name, spec in META.columns.items()
        },
        row_level=True,
    )
    frame = _frame()
    domain = Domain.from_metadata(strict, bins={"age": [0, 18, 30, 50, 65, 100]})
    assert domain.shape == (2, 5, 3, 3)
    duck = _all_counts(TableCounts(frame, strict, domain), 4)
    sp = _all_counts(SparkTableCounts(spark.createDataFrame(frame), strict, domain), 4)
    for clique in duck:
        np.testing.assert_array_equal(sp[clique], duck[clique], err_msg=str(clique))
    # "F", " F " (stripped to "F"), and the NULLs and the unlisted "x" (the first category) in cell 0
    first = int(((frame["sex"] == "F") | ~frame["sex"].isin(["F", "M"])).sum())
    assert duck[(0,)].tolist() == [first, len(frame) - first]
