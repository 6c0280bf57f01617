"""Sessions and queries: accuracy, intervals, costs, user-level bounding, and bad input.

Statistical tests use fixed seeds; each states how often it would fail for a correct
implementation (over the choice of seed).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import dpkit as dp
from _stats import CountingSource, binomial_z
from dpkit.accounting import ComposedEvent, LaplaceEvent
from dpkit.accounting.composition import basic_cost
from dpkit.analytics import Categorical, Count, CountUnits, Mean, Metadata, Numeric, QuantileAgg, Std, Sum, Variance
from dpkit.errors import BudgetExceededError, InvalidParameterError, LedgerError

SEED = 20261127


def people(n_units: int = 3000, seed: int = SEED) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    rows = rng.integers(1, 5, n_units)
    uid = np.repeat(np.arange(n_units), rows)
    n = uid.size
    return pd.DataFrame(
        {
            "uid": uid,
            "sex": rng.choice(np.array(["F", "M"]), n),
            "city": rng.choice(np.array(["north", "south", "east"]), n, p=[0.5, 0.3, 0.2]),
            "age": rng.integers(18, 90, n),
            "income": rng.gamma(2.0, 20_000.0, n),
        }
    )


META = Metadata(
    columns={
        "age": Numeric(0, 100),
        "income": Numeric(0, 200_000),
        "sex": Categorical(("F", "M", "X")),
        "city": Categorical(),
        "uid": Numeric(),  # declared without bounds: usable as the unit and in filters, never summed
    }
)


def session(
    df: pd.DataFrame | None = None, *, epsilon: float = 1e6, delta: float = 1e-3, rng: object = None, **kw
) -> dp.Session:  # type: ignore[no-untyped-def]
    if "privacy_unit" not in kw:
        kw["row_level"] = True
    return dp.Session(
        people() if df is None else df,
        budget=dp.Budget(epsilon=epsilon, delta=delta),
        metadata=META,
        rng=np.random.default_rng(SEED) if rng is None else rng,
        **kw,
    )


# ---- values at large ε are the bounded statistics ---------------------------------------------------


def test_row_level_values_match_pandas_at_large_epsilon() -> None:
    df = people()
    s = session(df)
    r = s.group_by("sex").aggregate(
        [Count(), Sum("age"), Mean("age"), Variance("age"), Std("income"), QuantileAgg("age", 0.5)], epsilon=1e5
    )
    g = df.groupby("sex")
    t = r.table.set_index("sex")
    assert t.loc["X", "count"] == pytest.approx(0, abs=1)  # declared but absent key: reported with noise
    for key in ("F", "M"):
        assert t.loc[key, "count"] == pytest.approx(g.size()[key], abs=1)
        assert t.loc[key, "sum_age"] == pytest.approx(g["age"].sum()[key], abs=5)
        assert t.loc[key, "mean_age"] == pytest.approx(g["age"].mean()[key], abs=1e-3)
        assert t.loc[key, "var_age"] == pytest.approx(g["age"].var(ddof=0)[key], rel=1e-3)
        clipped = df.assign(income=df["income"].clip(0, 200_000)).groupby("sex")["income"]
        assert t.loc[key, "std_income"] == pytest.approx(clipped.std(ddof=0)[key], rel=1e-3)
        assert abs(t.loc[key, "median_age"] - g["age"].median()[key]) <= 1.0
    assert r.keys == "public" and r.groups == ("sex",)
    assert r.epsilon == 1e5 and r.delta == 0.0


def test_user_level_bounding_caps_what_one_unit_adds() -> None:
    df = people()
    s = session(df, privacy_unit="uid", max_groups=1, max_rows=1)
    r = s.count(epsilon=1e5)
    assert r.value == pytest.approx(df["uid"].nunique(), abs=1)  # one row per unit kept
    r2 = s.count_units(epsilon=1e5)
    assert r2.value == pytest.approx(df["uid"].nunique(), abs=1)
    assert r.aggregates[0].sensitivity == 1 and r2.aggregates[0].sensitivity == 1


def test_sensitivities_follow_the_contribution_bounds() -> None:
    s = session(privacy_unit="uid", max_groups=3, max_rows=2)
    r = s.group_by("sex").aggregate([Count(), CountUnits(), Sum("age")], epsilon=3.0)
    sens = {a.name: a.sensitivity for a in r.aggregates}
    assert sens["count"] == 6 and sens["count_units"] == 3
    assert sens["sum_age"] == pytest.approx(6 * 100, rel=1e-6)
    scales = {a.name: a.scale for a in r.aggregates}
    assert scales["count"] == pytest.approx(6 / 1.0) and scales["count_units"] == pytest.approx(3 / 1.0)
    # without a group-by a unit is in one group: max_groups does not enter
    r0 = s.count(epsilon=1.0)
    assert r0.aggregates[0].sensitivity == 2
    # replace neighbours: twice the add/remove sensitivity
    rr = session(privacy_unit="uid", max_groups=3, max_rows=2, neighbours="replace").group_by("sex").count(epsilon=1.0)
    assert rr.aggregates[0].sensitivity == 12 and rr.event.neighbours == "replace"


def test_events_describe_the_noise_and_compose_to_the_query_epsilon() -> None:
    s = session(privacy_unit="uid", max_groups=2, max_rows=2)
    r = s.group_by("sex").aggregate([Count(), Mean("age"), QuantileAgg("age", 0.25)], epsilon=0.9)
    assert isinstance(r.event, ComposedEvent)
    assert basic_cost(r.event)[0] == pytest.approx(0.9, rel=1e-12)
    assert s.spent[0] == pytest.approx(0.9, rel=1e-12)
    assert r.aggregates[0].event == LaplaceEvent.for_epsilon(0.3)
    assert [a.epsilon for a in r.aggregates] == pytest.approx([0.3, 0.3, 0.3])


def test_split_weights_the_budget() -> None:
    r = session().aggregate([Count(), Mean("age")], epsilon=1.0, split=[1, 3])
    assert [a.epsilon for a in r.aggregates] == pytest.approx([0.25, 0.75])


# ---- confidence intervals cover at (at least) their level --------------------------------------------


def test_count_and_sum_intervals_cover_at_their_level() -> None:
    """200 releases of 3 groups at 90 %: coverage ≥ 0.9 − 4.75σ (false failure ~1e-6)."""
    df = people(400)
    s = session(df, privacy_unit="uid", max_groups=2, max_rows=2)
    truth_q = s.group_by("sex").aggregate([Count(), Sum("age")], epsilon=1e5)
    truth = truth_q.table.set_index("sex")
    hits = {"count": 0, "sum_age": 0}
    total = 0
    for _ in range(200):
        t = s.group_by("sex").aggregate([Count(), Sum("age")], epsilon=0.5, confidence=0.9).table.set_index("sex")
        for name in hits:
            hits[name] += int(
                ((t[f"{name}_low"] <= truth[name].round()) & (truth[name].round() <= t[f"{name}_high"])).sum()
            )
        total += len(t)
    for name, h in hits.items():
        assert binomial_z(h, total, 0.9) > -4.75, (name, h / total)


def test_mean_and_variance_intervals_cover_at_least_their_level() -> None:
    """Interval arithmetic is conservative: coverage must be ≥ 90 % (−4.75σ, false failure ~1e-6)."""
    df = people(300)
    s = session(df)
    exact = s.aggregate([Mean("age"), Variance("age")], epsilon=1e5).table.iloc[0]
    hit_m = hit_v = 0
    for _ in range(300):
        row = s.aggregate([Mean("age"), Variance("age")], epsilon=0.5, confidence=0.9).table.iloc[0]
        hit_m += row.mean_age_low <= exact.mean_age <= row.mean_age_high
        hit_v += row.var_age_low <= exact.var_age <= row.var_age_high
    assert binomial_z(hit_m, 300, 0.9) > -4.75 and binomial_z(hit_v, 300, 0.9) > -4.75


# ---- key selection -------------------------------------------------------------------------------------


def test_private_keys_release_common_groups_and_hide_a_singleton() -> None:
    df = people()
    df.loc[len(df)] = [999_999, "F", "atlantis", 40, 1000.0]  # one unit with a unique city
    s = session(df, privacy_unit="uid", max_groups=1, max_rows=1)
    for _ in range(20):
        r = s.group_by("city").count(epsilon=1.0, delta=1e-6)
        assert set(r.table["city"]) == {"north", "south", "east"}
        assert r.keys == "truncated_geometric"
    with pytest.raises(InvalidParameterError, match="delta"):
        s.group_by("city").count(epsilon=1.0)  # keys not public and δ = 0
    for strategy in ("laplace", "gaussian"):
        r = s.group_by("city").count(epsilon=1.0, delta=1e-6, key_selection=strategy)
        assert set(r.table["city"]) == {"north", "south", "east"} and r.keys == strategy
        assert r.delta == pytest.approx(1e-6) and r.epsilon == 1.0


def test_explicit_public_keys_report_missing_ones() -> None:
    s = session()
    r = s.group_by("city", keys=["north", "west"]).count(epsilon=1e4)
    assert r.table["city"].tolist() == ["north", "west"] and abs(r.table["count"][1]) <= 2
    r2 = s.group_by("sex", "city", keys=[("F", "north"), ("M", "south")]).count(epsilon=1e4)
    assert list(zip(r2.table["sex"], r2.table["city"], strict=True)) == [("F", "north"), ("M", "south")]
    assert r2.keys == "public" and r2.delta == 0


def test_histogram_over_categories_and_bins() -> None:
    df = people()
    s = session(df)
    h = s.histogram("sex", epsilon=1e4)
    assert h.table["sex"].tolist() == ["F", "M", "X"]
    hb = s.histogram("age", bins=[0, 30, 60, 100], epsilon=1e4)
    assert hb.table["age"].tolist() == ["[0, 30)", "[30, 60)", "[60, 100]"]
    assert hb.value.sum() == pytest.approx(len(df), abs=5)
    with pytest.raises(InvalidParameterError, match="public"):
        s.histogram("city", epsilon=1.0)


# ---- budgets -------------------------------------------------------------------------------------------


def test_budget_is_debited_once_per_query_and_refusal_releases_nothing() -> None:
    s = session(epsilon=1.0)
    s.group_by("sex").aggregate([Count(), Mean("age")], epsilon=0.6)
    assert s.remaining == pytest.approx(0.4)
    with pytest.raises(BudgetExceededError):
        s.group_by("sex").aggregate([Count(), Mean("age"), Sum("age")], epsilon=0.6)  # exhausted mid-query
    assert s.remaining == pytest.approx(0.4)  # nothing of the refused query was debited
    s.count(epsilon=0.4)
    assert s.remaining == 0.0


def test_noise_is_drawn_only_after_the_debit() -> None:
    src = CountingSource(1)
    s = session(epsilon=0.5, rng=src)
    with pytest.raises(BudgetExceededError):
        s.count(epsilon=1.0)
    drawn_before = src.calls  # the bounding salt only
    assert drawn_before <= 1
    s.count(epsilon=0.5)
    assert src.calls > drawn_before


def test_ledger_budget(tmp_path: Path) -> None:
    ledger = dp.open_ledger(tmp_path / "l.sqlite")
    ledger.create_budget("people", "ann", epsilon=1.0, delta=1e-6)
    s = dp.Session(people(), ledger=ledger, dataset="people", analyst="ann", metadata=META, row_level=True)
    s.sql("SELECT sex, COUNT(*) FROM data GROUP BY sex", epsilon=0.5)
    r = s.group_by("city").count(epsilon=0.25, delta=1e-7, noise="gaussian")  # no basic cost: charged (ε, δ)
    assert r.delta == pytest.approx(1e-7)
    spends = ledger.list_spends("people", "ann")
    assert [sp.epsilon_cost for sp in spends] == pytest.approx([0.5, 0.25])
    assert spends[0].query_text.startswith("SELECT sex")
    with pytest.raises(BudgetExceededError):
        s.count(epsilon=0.5)
    assert len(ledger.list_spends("people", "ann")) == 2
    with pytest.raises(LedgerError):
        dp.Session(people(), ledger=ledger, dataset="people", analyst="nobody", metadata=META, row_level=True)


def test_a_seed_never_meets_a_ledger(tmp_path: Path) -> None:
    """Seeded noise can be replayed and subtracted: with a ledger it is refused (nothing spent);
    with an in-memory budget it is allowed and the result says so."""
    ledger = dp.open_ledger(tmp_path / "l.sqlite")
    ledger.create_budget("people", "ann", epsilon=1.0)
    with pytest.raises(InvalidParameterError, match="rng"):
        dp.Session(
            people(),
            ledger=ledger,
            dataset="people",
            analyst="ann",
            metadata=META,
            row_level=True,
            rng=np.random.default_rng(0),
        )
    s = dp.Session(people(), ledger=ledger, dataset="people", analyst="ann", metadata=META, row_level=True)
    with pytest.raises(InvalidParameterError, match="rng"):
        s.count(epsilon=0.1, rng=np.random.default_rng(0))
    with pytest.raises(InvalidParameterError, match="rng"):
        s.sql("SELECT COUNT(*) FROM data", epsilon=0.1, rng=np.random.default_rng(0))
    assert ledger.list_spends("people", "ann") == []
    r = s.count(epsilon=0.1)
    assert not r.seeded and not r.to_dict()["seeded"]
    seeded = session().count(epsilon=0.1)
    assert seeded.seeded and "SEEDED" in repr(seeded) and any("NOT private" in n for n in seeded.notes)


def test_gaussian_noise_needs_delta_and_an_accountant_that_prices_it() -> None:
    s = dp.Session(
        people(),
        budget=dp.Budget(epsilon=2.0, delta=1e-5, accountant=dp.RDPAccountant),
        metadata=META,
        rng=np.random.default_rng(0),
        row_level=True,
    )
    r = s.group_by("sex").aggregate([Count(), Mean("age")], epsilon=1.0, delta=1e-6, noise="gaussian")
    assert all(a.mechanism == "gaussian" for a in r.aggregates)
    with pytest.raises(InvalidParameterError, match="delta"):
        s.count(epsilon=0.1, noise="gaussian")


# ---- bad input: a clear error, no debit, no release ------------------------------------------------------


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda s: s.mean("nope", epsilon=1.0), "unknown column"),
        (lambda s: s.mean("city", epsilon=1.0), "Numeric column"),
        (lambda s: s.mean("uid", epsilon=1.0), "declared bounds"),
        (lambda s: s.count(epsilon=0.0), "epsilon"),
        (lambda s: s.count(epsilon=float("nan")), "epsilon"),
        (lambda s: s.count(epsilon=1.0, delta=1.5), "delta"),
        (lambda s: s.count(epsilon=1.0, noise="cauchy"), "noise"),
        (lambda s: s.count(epsilon=1.0, confidence=1.0), "confidence"),
        (lambda s: s.group_by("sex").count(epsilon=1.0, key_selection="magic"), "key_selection"),
        (lambda s: s.aggregate([], epsilon=1.0), "aggregates"),
        (lambda s: s.aggregate([Count(), Count()], epsilon=1.0), "collide"),
        (lambda s: s.aggregate([Sum("age", name="a_low"), Count(name="a")], epsilon=1.0), "collide"),
        (lambda s: s.group_by("sex").aggregate([Count(name="SEX")], epsilon=1.0), "collide"),
        (lambda s: s.mean("income", epsilon=1.0, rng=object()), "rng"),
        (lambda s: s.aggregate([Count()], epsilon=1.0, split=[1, 2]), "split"),
        (lambda s: s.where("nope > 3").count(epsilon=1.0), "unknown column"),
        (lambda s: s.where("age > 'x'").count(epsilon=1.0), "numeric literal"),
        (lambda s: s.where("city = 3").count(epsilon=1.0), "string literal"),
        (lambda s: s.group_by("nope").count(epsilon=1.0), "columns"),
        (lambda s: s.group_by("sex", keys=[1, 2]).count(epsilon=1.0), "keys"),
        (lambda s: s.group_by("age", bins={"age": [3, 1]}).count(epsilon=1.0), "bins"),
        (lambda s: s.group_by("city", bins={"city": [0, 1]}).count(epsilon=1.0), "numeric"),
        (lambda s: s.quantile("age", 1.5, epsilon=1.0), "q"),
    ],
)
def test_bad_queries_raise_and_spend_nothing(call, match: str) -> None:  # type: ignore[no-untyped-def]
    s = session(epsilon=10.0)
    with pytest.raises(InvalidParameterError, match=match):
        call(s)
    assert s.spent == (0.0, 0.0)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"privacy_unit": "nope"}, "privacy_unit"),
        ({"max_groups": 0, "privacy_unit": "uid"}, "max_groups"),
        ({"max_rows": 2}, "max_rows"),  # no unit: each row is a unit
        ({"neighbours": "swap"}, "neighbours"),
        ({"engine": "oracle"}, "engine"),
        ({"metadata": {"columns": {"age": {"type": "numeric", "lower": 5}}}}, "lower"),
        ({"metadata": {"columns": {"age": {"type": "numeric", "lower": 5, "upper": 1}}}}, "lower < upper"),
        ({"metadata": {"columns": {"ghost": {"type": "numeric", "lower": 0, "upper": 1}}}}, "metadata"),
        ({"metadata": {"columns": {"city": {"type": "categorical", "categories": [1, "a"]}}}}, "one type"),
        ({"metadata": {"columns": {"age": {"type": "numeric", "lower": 0, "upper": 1e-310}}}}, "bounds"),
        (
            {"metadata": {"columns": {"sex": {"type": "categorical", "categories": ["F"], "value_type": "integer"}}}},
            "value_type",
        ),
        ({"row_level": True, "privacy_unit": "uid"}, "row_level"),
        ({"row_level": None}, "privacy_unit"),
        ({"rng": "seed"}, "rng"),
        ({"metadata": {"columns": {"sex": {"type": "categorical", "categories": ["F", "F"]}}}}, "duplicates"),
    ],
)
def test_bad_sessions_raise(kwargs: dict, match: str) -> None:
    unit = {} if "privacy_unit" in kwargs or "row_level" in kwargs else {"row_level": True}
    with pytest.raises(InvalidParameterError, match=match):
        dp.Session(people(), budget=dp.Budget(epsilon=1.0), **{"metadata": META, **unit, **kwargs})


def test_a_session_needs_exactly_one_place_to_pay() -> None:
    with pytest.raises(InvalidParameterError, match="budget"):
        dp.Session(people(), metadata=META, row_level=True)
    with pytest.raises(InvalidParameterError, match="budget"):
        dp.Session(people(), budget=dp.Budget(epsilon=1.0), ledger="x.sqlite", metadata=META, row_level=True)
    with pytest.raises(InvalidParameterError, match="budget"):
        dp.Session(people(), budget=1.0, metadata=META, row_level=True)  # type: ignore[arg-type]


def test_empty_tables_and_nan_values() -> None:
    empty = people().iloc[:0]
    s = session(empty)
    r = s.group_by("sex").aggregate([Count(), Mean("age")], epsilon=1.0)
    assert r.table["sex"].tolist() == ["F", "M", "X"]
    assert (r.table["mean_age_low"] == 0).all() and (r.table["mean_age_high"] == 100).all()  # nothing known
    assert s.count(epsilon=1.0).value == pytest.approx(0, abs=60)
    assert len(s.group_by("city").count(epsilon=1.0, delta=1e-6).table) == 0
    df = people()
    df["age"] = df["age"].astype(float)
    df.loc[::2, "age"] = np.nan
    r2 = session(df).mean("age", epsilon=1e5)
    assert r2.value == pytest.approx(df["age"].mean(), abs=1e-3)  # NaN skipped, not clipped


def test_sources_csv_parquet_and_duckdb(tmp_path: Path) -> None:
    import duckdb

    df = people(500)
    df.to_csv(tmp_path / "adult.csv", index=False)
    df.to_parquet(tmp_path / "adult.parquet")
    want = len(df)
    for s in (
        dp.Session.from_csv(tmp_path / "adult.csv", budget=dp.Budget(epsilon=1e6), metadata=META, row_level=True),
        dp.Session.from_parquet(
            tmp_path / "adult.parquet", budget=dp.Budget(epsilon=1e6), metadata=META, row_level=True
        ),
    ):
        assert s.table == "adult"
        assert s.sql("SELECT COUNT(*) FROM adult", epsilon=1e5).value == pytest.approx(want, abs=1)
    con = duckdb.connect()
    con.register("src", df)
    con.execute("CREATE TABLE people AS SELECT * FROM src")
    s = dp.Session.from_duckdb(con, "people", budget=dp.Budget(epsilon=1e6), metadata=META, row_level=True)
    assert s.count(epsilon=1e5).value == pytest.approx(want, abs=1)
    rel = duckdb.sql("SELECT 1 AS age UNION ALL SELECT 2")
    s2 = dp.Session(
        rel, budget=dp.Budget(epsilon=1e6), metadata=Metadata(columns={"age": Numeric(0, 10)}, row_level=True)
    )
    assert s2.sum("age", epsilon=1e5).value == pytest.approx(3, abs=0.1)


def test_result_accessors_and_json() -> None:
    r = session().group_by("sex").aggregate([Count(), Mean("age")], epsilon=1.0)
    assert list(r["count"].index) == ["F", "M", "X"]
    with pytest.raises(AttributeError):
        r.value  # noqa: B018 — two aggregates
    d = r.to_dict()
    assert d["epsilon"] == 1.0 and len(d["rows"]) == 3 and d["event"]["type"]
    single = session().count(epsilon=1.0)
    lo, hi = single.ci
    assert lo < single.value < hi and math.isfinite(single.scale)
