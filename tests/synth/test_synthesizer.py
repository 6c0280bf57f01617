"""dpkit.synth: the domain comes from the metadata, the budget pays once and before the data is
read, bad input is refused before paying, and what the rows keep. (The sampler's own tests, a
row-order twin included, are in test_graphical.py.)

Deterministic (fixed seeds) except where a bound is stated: the sampler tests bound sampling
error at more than 6 standard deviations (false-failure rate below 1e-8 each)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import dpkit as dp
from dpkit.analytics import Categorical, Metadata, Numeric
from dpkit.errors import BudgetExceededError, InvalidParameterError
from dpkit.synth import Domain, Synthesizer
from dpkit.synth import measure as measure_module
from dpkit.synth.model import systematic_counts
from synth._frames import correlated_frame

META = Metadata(
    columns={"sex": Categorical(("F", "M")), "age": Numeric(0, 100), "city": Categorical(("a", "b", "c"))},
    row_level=True,
)


# -- the domain -----------------------------------------------------------------------------------


def test_the_domain_is_the_metadatas() -> None:
    d = Domain.from_metadata(META, bins={"age": [0, 20, 40, 100]})
    assert d.names == ["sex", "age", "city"] and d.shape == (3, 4, 4)
    assert d.columns[1].labels() == ["[0, 20)", "[20, 40)", "[40, 100]", "(missing)"]


@pytest.mark.parametrize(
    ("meta", "bins", "name"),
    [
        (
            Metadata(columns={"a": Categorical(), "b": Categorical(("x",))}, row_level=True),
            None,
            "metadata.columns.a.categories",
        ),
        (Metadata(columns={"a": Numeric(), "b": Categorical(("x",))}, row_level=True), None, "bins.a"),
        (META, {"age": [3, 2]}, "bins.age"),
        (META, {"age": 0}, "bins.age"),
        (META, {"sex": 3}, "bins.sex"),
        (META, {"nope": 3}, "bins.nope"),
        (Metadata(columns={"a": Categorical(("x",))}, row_level=True), None, "columns"),
        (
            Metadata(columns={"a": Categorical(tuple(range(20_000))), "b": Categorical(("x",))}, row_level=True),
            None,
            "metadata.columns.a",
        ),
        (
            Metadata(
                columns={"a": Categorical(tuple(range(3_000))), "b": Categorical(tuple(range(3_000)))}, row_level=True
            ),
            None,
            "bins",
        ),
        # one pair of 3,001² ≈ 9·10⁶ cells is refused by the pair cap; 30 columns of 1,999 cells by the total (1.7·10⁹)
        (
            Metadata(columns={f"c{i}": Categorical(tuple(range(1_998))) for i in range(30)}, row_level=True),
            None,
            "columns",
        ),
    ],
)
def test_a_domain_the_metadata_cannot_give_is_refused(meta: Metadata, bins: dict | None, name: str) -> None:
    with pytest.raises(InvalidParameterError) as err:
        Synthesizer(epsilon=1.0, delta=1e-9, metadata=meta, bins=bins)
    assert err.value.name == name, err.value


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"epsilon": 0.0}, "epsilon"),
        ({"epsilon": 1e-7}, "epsilon"),  # too little budget for any table
        ({"delta": 0.0}, "delta"),
        ({"delta": 1.5}, "delta"),
        ({"metadata": Metadata(columns=META.columns)}, "metadata.privacy_unit"),
        ({"budget": 3}, "budget"),
        ({"progress": "yes"}, "progress"),
        ({"method": "pgm"}, "method"),
        ({"method": "mst", "rounds": 5}, "rounds"),
        ({"rounds": 0}, "rounds"),
    ],
)
def test_bad_settings_are_refused_before_anything_is_paid(kwargs: dict, name: str) -> None:
    args = {"epsilon": 1.0, "delta": 1e-9, "metadata": META, **kwargs}
    with pytest.raises(InvalidParameterError) as err:
        Synthesizer(**args)
    assert err.value.name == name, err.value


# -- paying ---------------------------------------------------------------------------------------


def test_the_budget_pays_once_before_the_data_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    order: list[str] = []
    budget = dp.Budget(epsilon=2.0, delta=1e-6, accountant="zcdp")
    original_spend, original_prepare = dp.Budget.spend, measure_module.TableCounts.prepare
    monkeypatch.setattr(dp.Budget, "spend", lambda self, e, **k: (order.append("pay"), original_spend(self, e, **k))[1])
    monkeypatch.setattr(
        measure_module.TableCounts,
        "prepare",
        lambda self, salt: (order.append("read"), original_prepare(self, salt))[1],
    )
    syn = Synthesizer(epsilon=1.0, delta=1e-9, metadata=META, budget=budget, rng=np.random.default_rng(1)).fit(
        correlated_frame()
    )
    assert order == ["pay", "read"]
    assert budget.events == (syn.event,) and syn.event_ == syn.event
    assert 0 < budget.spent[0] <= 1.0 + 1e-9


def test_a_budget_that_cannot_pay_reads_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    read: list[int] = []
    monkeypatch.setattr(measure_module.TableCounts, "prepare", lambda self, salt: read.append(1))
    budget = dp.Budget(epsilon=0.5, delta=1e-9, accountant="zcdp")
    with pytest.raises(BudgetExceededError):
        Synthesizer(epsilon=1.0, delta=1e-9, metadata=META, budget=budget).fit(correlated_frame())
    assert read == [] and budget.events == ()


def test_a_missing_column_is_named_and_nothing_is_paid() -> None:
    budget = dp.Budget(epsilon=2.0, delta=1e-6, accountant="zcdp")
    with pytest.raises(InvalidParameterError) as err:
        Synthesizer(epsilon=1.0, delta=1e-9, metadata=META, budget=budget).fit(correlated_frame().drop(columns="city"))
    assert err.value.name == "metadata.columns.city" and budget.events == ()


# -- what the rows keep -----------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["aim", "mst"])
def test_the_rows_keep_the_tables_structure(tmp_path, method: str) -> None:  # type: ignore[no-untyped-def]
    frame = correlated_frame(20_000)
    path = tmp_path / "people.csv"
    frame.to_csv(path, index=False)
    syn = Synthesizer(
        epsilon=2.0, delta=1e-9, metadata=META, bins={"age": 10}, method=method, rng=np.random.default_rng(3)
    )
    syn.fit(str(path))
    out = syn.sample()
    assert abs(len(out) - 20_000) < 300  # the measured row count (noise σ ≈ 25 per one-way cell)
    assert list(out.columns) == ["sex", "age", "city"]
    means = out.groupby("sex")["age"].mean()
    assert means["M"] - means["F"] > 20  # the true gap is 30
    # city depends on sex: no "c" among women, no "a" among men (up to noise)
    share = pd.crosstab(out["sex"], out["city"], normalize="index")
    assert share.loc["F", "c"] < 0.05 and share.loc["M", "a"] < 0.05
    assert syn.report is not None and "spent ε=2" in syn.report.to_text()
    assert len(syn.report.selected) == (2 if method == "mst" else 9)  # MST: a spanning tree; AIM: 3·d rounds


def test_a_privacy_unit_keeps_one_row_per_person() -> None:
    rng = np.random.default_rng(4)
    frame = correlated_frame(6_000)
    frame["pid"] = rng.integers(0, 1_000, len(frame))  # about 6 rows a person
    meta = Metadata(columns=META.columns, privacy_unit="pid")
    syn = Synthesizer(epsilon=4.0, delta=1e-9, metadata=meta, rng=np.random.default_rng(5)).fit(frame)
    assert syn.report is not None and abs(syn.report.rows - frame["pid"].nunique()) < 60


def test_integer_columns_come_back_as_whole_numbers_inside_their_bins() -> None:
    rng = np.random.default_rng(6)
    n = 4_000
    frame = correlated_frame(n)
    frame["kids"] = np.where(rng.random(n) < 0.7, 0, rng.integers(1, 7, n)).astype(float)
    frame.loc[rng.random(n) < 0.05, "kids"] = np.nan
    meta = Metadata(columns={**META.columns, "kids": Numeric(0, 6)}, row_level=True)
    edges = [0, 1, 2.5, 2.7, 6]  # [2.5, 2.7) holds no integer: its rows get 3, the nearest to its middle
    syn = Synthesizer(
        epsilon=4.0, delta=1e-9, metadata=meta, bins={"kids": edges, "age": [0, 10.5, 50, 100]},
        integers=["kids", "age"], rng=np.random.default_rng(7),
    ).fit(frame)  # fmt: skip
    rows = syn.sample(20_000)
    assert str(rows["kids"].dtype) == "Int64" and str(rows["age"].dtype) == "Int64"
    kids = rows["kids"].dropna().astype(int)
    assert set(kids.unique()) <= {0, 1, 2, 3, 4, 5, 6} and 6 in set(kids.unique())  # the last bin is closed
    # the bin [0, 1) is all zeros: 70 % of the real non-missing values. Sampling error at
    # n = 19,000 is 0.33 % a standard deviation and the noise of the fit (ε = 4 on 4,000 rows)
    # adds well under 1 %: 3 % is more than 6 standard deviations.
    assert abs((kids == 0).mean() - 0.70) < 0.03
    assert rows["kids"].isna().mean() == pytest.approx(0.05, abs=0.02)
    assert rows["age"].dropna().between(0, 100).all()


@pytest.mark.parametrize("integers", [["sex"], ["nope"], "age", [1]])
def test_integers_must_name_numeric_columns_before_anything_is_paid(integers: object) -> None:
    budget = dp.Budget(epsilon=1.0, delta=1e-9, accountant="zcdp")
    with pytest.raises(InvalidParameterError) as err:
        Synthesizer(epsilon=1.0, delta=1e-9, metadata=META, budget=budget, integers=integers)  # type: ignore[arg-type]
    assert err.value.name == "integers" and not budget.events


# -- the sampler --------------------------------------------------------------------------------------


def test_systematic_counts_sum_to_n_and_stay_within_one_row() -> None:
    p = np.array([0.5, 0.25, 0.125, 0.125])
    for u in (0.0, 0.3, 0.999):
        c = systematic_counts(p, 1001, u)
        assert c.sum() == 1001 and np.all(np.abs(c - 1001 * p) < 1)


# -- the command line -----------------------------------------------------------------------------------


def test_dpkit_synth_writes_a_table_and_its_report(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import json

    from typer.testing import CliRunner

    from dpkit.cli import app

    correlated_frame(3_000).to_csv(tmp_path / "people.csv", index=False)
    (tmp_path / "meta.json").write_text(json.dumps(META.to_dict()))
    args = ["synth", str(tmp_path / "people.csv"), "--metadata", str(tmp_path / "meta.json"), "--epsilon", "1",
            "--delta", "1e-9", "--out", str(tmp_path / "out.csv"), "--rows", "500", "--bins", "age=0,25,50,75,100",
            "--report", str(tmp_path / "report.txt")]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    out = pd.read_csv(tmp_path / "out.csv")
    assert len(out) == 500 and list(out.columns) == ["sex", "age", "city"]
    assert "spent ε=1" in (tmp_path / "report.txt").read_text()
    bad = CliRunner().invoke(app, [*args[:-4], "--bins", "age"])
    assert bad.exit_code == 1 and "--bins 'age' is not accepted" in bad.output
    bad = CliRunner().invoke(app, [*args[:4], "--epsilon", "1", "--delta", "0", "--out", str(tmp_path / "x.csv")])
    assert bad.exit_code == 1 and "delta" in bad.output and not (tmp_path / "x.csv").exists()
    mst = CliRunner().invoke(app, [*args, "--method", "mst"])
    assert mst.exit_code == 0 and "method mst" in (tmp_path / "report.txt").read_text(), mst.output
    bad = CliRunner().invoke(app, [*args, "--method", "gan"])
    assert bad.exit_code == 1 and "--method" in bad.output and "'aim'" in bad.output
    whole = CliRunner().invoke(app, [*args, "--integers", "age"])
    assert whole.exit_code == 0, whole.output
    ages = pd.read_csv(tmp_path / "out.csv")["age"].dropna()
    assert (ages == ages.round()).all()
    bad = CliRunner().invoke(app, [*args, "--integers", "sex"])
    assert bad.exit_code == 1 and "--integers" in bad.output
    # Spark options, refused before Spark starts or anything is read
    for extra, said in [
        (["--master", "local[2]"], "--master 'local[2]' is not accepted without --engine spark"),
        (["--engine", "spark", "--master", "mesos://x"], "--master mesos://x is not accepted"),
        (["--engine", "spark"], "--engine spark reads Parquet data"),
        (["--engine", "flink"], "--engine flink is not accepted"),
        (["--engine", "spark", "--conf", "nokey"], "--conf 'nokey' is not accepted"),
    ]:
        bad = CliRunner().invoke(app, [*args, *extra])
        assert bad.exit_code == 1 and said in bad.output, (extra, bad.output)
    uri = CliRunner().invoke(app, ["synth", "hdfs://nn/people", *args[2:]])
    assert uri.exit_code == 1 and "is a URI" in uri.output
