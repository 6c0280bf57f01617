"""A joined query's pre-noise aggregates are exactly those of the join written by hand in pandas.

For each kind of join (:mod:`dpkit.analytics.joins`) the session runs the query with the noise
switched off (``_joins_data.exact_run``) and the answer is compared with a pandas computation of
the same thing: each table truncated to the rows the join keeps, joined with ``pandas.merge``,
bounded and aggregated. Where which rows a truncation keeps changes the answer, the session is
``portable`` and the reference reproduces the keyed hash (md5 of the salt the query drew and the
row's declared columns); where it cannot (counts of kept rows, rows of a unit all alike), both
hashings are checked. Every check is exact and deterministic (false-failure rate 0).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from analytics._joins_data import (
    AREA_MATCHES,
    AREAS,
    COST,
    DOSE,
    JOIN_ROWS,
    REGIONS,
    by_key,
    clip,
    exact_run,
    joined_relation,
    metadata,
    priority,
    session,
    tables,
    truncate,
)
from dpkit.analytics import Count, Sum
from dpkit.analytics.plan import JoinPlan, join_salt

PORTABLE = pytest.mark.parametrize("portable", [False, True], ids=["native", "portable"])


def _expect(frame: pd.DataFrame, key: str, keys: list[str], **columns: pd.Series) -> pd.DataFrame:
    """A reference answer: one row per key of ``keys`` (zeros for empty groups)."""
    out = pd.DataFrame({key: keys})
    for name, values in columns.items():
        out[name] = out[key].map(values).fillna(0).astype(float)
    return out


def _released(frame: pd.DataFrame, key: str, names: list[str]) -> pd.DataFrame:
    return frame[[key, *names]].astype({n: float for n in names}).reset_index(drop=True)


def _counts_by_unit(df: pd.DataFrame) -> pd.Series:
    return df.groupby("pid").size()


# -- public tables -----------------------------------------------------------------------------------


@PORTABLE
def test_a_public_inner_join_counts_and_sums_every_region_of_the_public_table(portable: bool) -> None:
    d = tables()
    s = session(d, metadata(), portable=portable)
    with exact_run():
        r = (
            s.query("visits")
            .join("regions", on="postcode")
            .group_by("region")
            .aggregate([Count(), Sum("cost")], epsilon=1)
        )
    m = d["visits"].merge(REGIONS, on="postcode")  # a visit in Z matches no region
    regions = sorted(REGIONS["region"].unique())  # the public table's values, "east" with no visit
    want = _expect(
        m,
        "region",
        regions,
        count=m.groupby("region").size(),
        sum_cost=m.assign(c=clip(m["cost"], COST)).groupby("region")["c"].sum(),
    )
    pd.testing.assert_frame_equal(_released(r.table, "region", ["count", "sum_cost"]), want)
    assert by_key(r.table, "region", "count")["east"] == 0


@PORTABLE
def test_a_public_left_join_keeps_the_unmatched_rows(portable: bool) -> None:
    d = tables()
    s = session(d, metadata(), portable=portable)
    q = s.query("visits").join("regions", on="postcode", how="left")
    v = d["visits"]
    with exact_run():
        everything = q.aggregate([Count(), Sum("cost")], epsilon=1).table.iloc[0]
        unmatched = q.where("region IS NULL").count(epsilon=1).value
        by_region = q.group_by("region").count(epsilon=1).table
    assert everything["count"] == len(v)  # max_matches = 1: a visit is one joined row
    assert everything["sum_cost"] == clip(v["cost"], COST).sum()
    assert unmatched == (v["postcode"] == "Z").sum()
    m = v.merge(REGIONS, on="postcode")  # the NULL region is not a group
    want = _expect(m, "region", sorted(REGIONS["region"].unique()), count=m.groupby("region").size())
    pd.testing.assert_frame_equal(_released(by_region, "region", ["count"]), want)


@PORTABLE
def test_a_public_table_with_duplicate_keys_meets_each_row_at_most_max_matches_times(portable: bool) -> None:
    d = tables()
    v = d["visits"]
    s = session(d, metadata(), portable=portable)
    matches = v["postcode"].map(AREAS.groupby("postcode").size()).fillna(0)
    with exact_run():
        inner = s.query("visits").join("areas", on="postcode").count(epsilon=1).value
        left = s.query("visits").join("areas", on="postcode", how="left").count(epsilon=1).value
    assert (AREAS.groupby("postcode").size() > AREA_MATCHES).any()  # the bound binds
    assert inner == matches.clip(upper=AREA_MATCHES).sum()
    assert left == matches.clip(lower=1, upper=AREA_MATCHES).sum()


def test_which_rows_of_a_duplicated_key_are_joined_is_the_keyed_hash() -> None:
    d = tables()
    s = session(d, metadata(), portable=True)
    with exact_run() as run:
        r = s.query("visits").join("areas", on="postcode").group_by("area").count(epsilon=1)
    src = run.plans[-1].join.sources[1]  # type: ignore[union-attr]
    assert (src.keep, src.partition) == (AREA_MATCHES, ("postcode",))
    kept = truncate(AREAS, ["postcode"], AREA_MATCHES, src.hashed, join_salt(run.salt, 1))
    m = d["visits"].merge(kept, on="postcode")
    want = _expect(m, "area", sorted(AREAS["area"]), count=m.groupby("area").size())
    pd.testing.assert_frame_equal(_released(r.table, "area", ["count"]), want)
    assert (want["count"] == 0).sum() == len(AREAS) - len(kept)  # the areas not kept are empty groups


# -- private tables joined on the unit ------------------------------------------------------------------


@PORTABLE
@pytest.mark.parametrize("how", ["inner", "left"])
def test_a_private_join_counts_min_n_k_rows_of_each_side_per_person(portable: bool, how: str) -> None:
    d = tables()
    s = session(d, metadata(), portable=portable)
    with exact_run():
        got = s.query("visits").join("prescriptions", on="pid", how=how).count(epsilon=1).value  # type: ignore[arg-type]
    nv = _counts_by_unit(d["visits"]).clip(upper=JOIN_ROWS["visits"])
    npr = _counts_by_unit(d["prescriptions"]).clip(upper=JOIN_ROWS["prescriptions"])
    npr = npr.reindex(nv.index).fillna(0)
    per_person = nv * (npr if how == "inner" else npr.clip(lower=1))
    assert got == per_person.sum()


@pytest.mark.parametrize("stored", ["text", "double"])
def test_units_stored_as_different_types_meet_by_their_canonical_text(stored: str) -> None:
    d = tables()
    pid = d["prescriptions"]["pid"]
    d["prescriptions"] = d["prescriptions"].assign(pid=pid.astype(str) if stored == "text" else pid.astype(float))
    s = session(d, metadata())
    with exact_run():
        one = s.query("visits").join("prescriptions", on="pid").count(epsilon=1).value
        other = s.query("prescriptions").join("visits", on="pid").count(epsilon=1).value
    nv = _counts_by_unit(tables()["visits"]).clip(upper=JOIN_ROWS["visits"])
    npr = _counts_by_unit(tables()["prescriptions"]).clip(upper=JOIN_ROWS["prescriptions"])
    assert one == other == (nv * npr.reindex(nv.index).fillna(0)).sum() > 0


@pytest.mark.parametrize("how", ["inner", "left"])
def test_a_private_join_sums_exactly_the_rows_the_keyed_hash_keeps(how: str) -> None:
    d = tables()
    s = session(d, metadata(), portable=True)
    with exact_run() as run:
        r = (
            s.query("visits")
            .join("prescriptions", on="pid", how=how)  # type: ignore[arg-type]
            .group_by("drug")
            .aggregate([Count(), Sum("cost"), Sum("dose")], epsilon=1)
        )
    plan = run.plans[-1].join
    assert plan is not None
    v, p = plan.sources
    kv = truncate(d["visits"], ["pid"], JOIN_ROWS["visits"], v.hashed, join_salt(run.salt, 0))
    kp = truncate(d["prescriptions"], ["pid"], JOIN_ROWS["prescriptions"], p.hashed, join_salt(run.salt, 1))
    m = kv.merge(kp, on="pid", how=how)
    m = m.assign(c=clip(m["cost"], COST), x=clip(m["dose"], DOSE))
    g = m.groupby("drug")  # a visit without prescriptions (left join) has no drug: no group
    want = _expect(m, "drug", ["x", "y"], count=g.size(), sum_cost=g["c"].sum(), sum_dose=g["x"].sum())
    pd.testing.assert_frame_equal(_released(r.table, "drug", ["count", "sum_cost", "sum_dose"]), want)


@pytest.mark.parametrize("how", ["inner", "left"])
def test_when_a_persons_rows_are_alike_any_hashing_gives_the_same_sums(how: str) -> None:
    """Every row of a person identical in each table: which rows truncation keeps cannot matter,
    so the native hash is checked against the same reference."""
    d = tables()
    first_v = d["visits"].groupby("pid").transform("first")
    d["visits"] = first_v.assign(pid=d["visits"]["pid"])
    first_p = d["prescriptions"].groupby("pid").transform("first")
    d["prescriptions"] = first_p.assign(pid=d["prescriptions"]["pid"])
    s = session(d, metadata(), portable=False)
    with exact_run():
        got = (
            s.query("visits")
            .join("prescriptions", on="pid", how=how)  # type: ignore[arg-type]
            .aggregate([Sum("cost"), Sum("dose")], epsilon=1)
            .table.iloc[0]
        )
    kv = d["visits"].groupby("pid").head(JOIN_ROWS["visits"])
    kp = d["prescriptions"].groupby("pid").head(JOIN_ROWS["prescriptions"])
    m = kv.merge(kp, on="pid", how=how)
    assert got["sum_cost"] == clip(m["cost"], COST).sum()
    assert got["sum_dose"] == clip(m["dose"], DOSE).fillna(0).sum()


@PORTABLE
def test_truncation_keeps_exactly_min_n_k_of_each_persons_own_rows(portable: bool) -> None:
    d = tables()
    s = session(d, metadata(), portable=portable)
    with exact_run() as run:
        s.query("visits").join("prescriptions", on="pid").count(epsilon=1)
    plan = run.plans[-1].join
    assert plan is not None
    for name, src in zip(("visits", "prescriptions"), plan.sources, strict=True):
        names = {**dict(src.columns), "pid": "pid"}  # declared column -> (one of) its joined names
        cols = [c for c in names if c != "pid"]
        shown = replace(src, columns=tuple(names.items()))  # the unit too (the others' is not joined)
        alone = joined_relation(s, JoinPlan(shown, ()), run.salt)  # (index 0: salted as the base)
        alone = pd.DataFrame({c: alone[names[c]] for c in ["pid", *cols]})
        whole = d[name]
        assert alone.groupby("pid").size().to_dict() == (_counts_by_unit(whole).clip(upper=JOIN_ROWS[name]).to_dict())
        # the kept rows are the person's own (as multisets) ...
        kept, have = alone.value_counts(), whole[["pid", *cols]].value_counts()
        assert (kept <= have.reindex(kept.index).fillna(0)).all()
        if portable:  # ... and those of smallest keyed hash
            want = truncate(whole, ["pid"], JOIN_ROWS[name], src.hashed, join_salt(run.salt, 0))
            key = ["pid", *cols]
            pd.testing.assert_frame_equal(
                alone.sort_values(key).reset_index(drop=True),
                want[key].sort_values(key).reset_index(drop=True),
                check_dtype=False,
            )


def test_a_chain_private_private_public_is_the_pandas_chain() -> None:
    d = tables()
    s = session(d, metadata(), portable=True)
    q = s.query("visits").join("prescriptions", on="pid").join("areas", on="postcode")
    assert q._t.max_unit_rows == JOIN_ROWS["visits"] * JOIN_ROWS["prescriptions"] * AREA_MATCHES
    with exact_run() as run:
        r = q.group_by("area").aggregate([Count(), Sum("dose")], epsilon=1)
    plan = run.plans[-1].join
    assert plan is not None
    v, p, a = plan.sources
    kv = truncate(d["visits"], ["pid"], JOIN_ROWS["visits"], v.hashed, join_salt(run.salt, 0))
    kp = truncate(d["prescriptions"], ["pid"], JOIN_ROWS["prescriptions"], p.hashed, join_salt(run.salt, 1))
    ka = truncate(AREAS, ["postcode"], AREA_MATCHES, a.hashed, join_salt(run.salt, 2))
    m = kv.merge(kp, on="pid").merge(ka, on="postcode")
    m = m.assign(x=clip(m["dose"], DOSE))
    g = m.groupby("area")
    want = _expect(m, "area", sorted(AREAS["area"]), count=g.size(), sum_dose=g["x"].sum())
    pd.testing.assert_frame_equal(_released(r.table, "area", ["count", "sum_dose"]), want)


# -- contribution bounds after the join ------------------------------------------------------------------


@PORTABLE
def test_max_rows_caps_each_persons_joined_rows(portable: bool) -> None:
    d = tables()
    s = session(d, metadata(max_groups=1, max_rows=2), portable=portable)
    with exact_run():
        got = s.query("visits").join("areas", on="postcode").count(epsilon=1).value
    m = d["visits"].merge(AREAS.groupby("postcode").head(AREA_MATCHES), on="postcode")  # any 2 areas: same count
    assert got == _counts_by_unit(m).clip(upper=2).sum()


def test_max_groups_keeps_the_groups_of_smallest_keyed_hash() -> None:
    d = tables()
    s = session(d, metadata(max_groups=1, max_rows=2), portable=True)
    with exact_run() as run:
        r = s.query("visits").join("regions", on="postcode").group_by("region").count(epsilon=1)
    m = d["visits"].merge(REGIONS, on="postcode")[["pid", "region"]]
    m = m.assign(h=priority(m, ["pid", "region"], run.salt)).sort_values(["pid", "h", "region"])
    first = m.groupby("pid").head(1)[["pid", "region"]]  # each person's one group ...
    rows = m.merge(first, on=["pid", "region"]).groupby(["pid", "region"]).size().clip(upper=2)  # ... and 2 rows
    want = _expect(m, "region", sorted(REGIONS["region"].unique()), count=rows.groupby("region").sum())
    pd.testing.assert_frame_equal(_released(r.table, "region", ["count"]), want)


# -- public key tables and row-level data -----------------------------------------------------------------


@PORTABLE
def test_keys_from_reports_every_row_of_the_key_table_and_only_those(portable: bool) -> None:
    d = tables()
    s = session(d, metadata(), portable=portable)
    with exact_run():
        r = s.query("visits").group_by("ward", keys_from="wards").aggregate([Count(), Sum("cost")], epsilon=1)
    v = d["visits"].assign(c=clip(d["visits"]["cost"], COST))
    want = _expect(v, "ward", ["w1", "w2", "w3"], count=v.groupby("ward").size(), sum_cost=v.groupby("ward")["c"].sum())
    pd.testing.assert_frame_equal(_released(r.table, "ward", ["count", "sum_cost"]), want)
    assert (v["ward"] == "w9").any()  # a ward of the data that the key table does not list: not released


@PORTABLE
def test_a_row_level_dataset_joins_public_tables(portable: bool) -> None:
    d = tables()
    s = session(d, metadata(row_level=True), portable=portable)
    v = d["visits"]
    with exact_run():
        by_region = s.query("visits").join("regions", on="postcode").group_by("region").count(epsilon=1).table
        areas = s.query("visits").join("areas", on="postcode").aggregate([Count(), Sum("cost")], epsilon=1)
    m = v.merge(REGIONS, on="postcode")
    want = _expect(m, "region", sorted(REGIONS["region"].unique()), count=m.groupby("region").size())
    pd.testing.assert_frame_equal(_released(by_region, "region", ["count"]), want)
    matches = v["postcode"].map(AREAS.groupby("postcode").size()).fillna(0).clip(upper=AREA_MATCHES)
    assert areas.table["count"][0] == matches.sum()  # no contribution bound caps a row's matches
    assert areas.table["sum_cost"][0] == (clip(v["cost"], COST) * matches).sum()
    assert np.isclose(areas.aggregates[0].sensitivity, AREA_MATCHES)
