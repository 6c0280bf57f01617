"""The tables, metadata and reference computations of the join tests (``test_joins*``).

A small hospital dataset: ``visits`` and ``prescriptions`` are private (unit ``pid``; a join on
the unit keeps 2 visits and 3 prescriptions per person), ``regions`` maps a postcode to a region
(one row per postcode), ``areas`` has several rows per postcode (``max_matches=2``: a join keeps
two of them), ``wards`` lists the wards (a key table). Values are multiples of 1/8 so every sum
is exact on the quantisation grid; a few costs lie outside their declared bounds (clipped).

The references are written with pandas, independently of the engine's SQL: each table is truncated
by :func:`truncate` (the keyed hash the plan documents for ``portable=True`` — md5 of the salt and
the row's declared columns, as text — reproduced in Python), joined with ``pandas.merge``, bounded
and aggregated. :func:`exact_run` runs a query through the session with the noise switched off and
records the plans the engine ran (so a reference can use the salt the query drew).
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import pytest

import dpkit as dp
from analytics._ingestion_corpus import noise_off
from dpkit.analytics import Categorical, Metadata, Numeric
from dpkit.analytics.dataset_metadata import DatasetMetadata
from dpkit.analytics.engines.duckdb import DuckDBEngine
from dpkit.analytics.engines.duckdb_joins import join_sql
from dpkit.analytics.plan import AggregationPlan, JoinPlan

SEED = 20260611
HOSTILE = 999
COST = (0.0, 16.0)
DOSE = (0.0, 8.0)
JOIN_ROWS = {"visits": 2, "prescriptions": 3}
AREA_MATCHES = 2

REGIONS = pd.DataFrame(
    {
        "postcode": ["A", "B", "C", "D", "E", "F"],
        "region": ["north", "north", "south", "south", "west", "east"],  # "east": no visit is in F
    }
)
#: Several rows per postcode (A has 5: a hostile person's visits there meet all of them unless
#: the join keeps max_matches), none for D.
AREAS = pd.DataFrame(
    {
        "postcode": ["A"] * 5 + ["B"] + ["C"] * 2 + ["E"] * 3,
        "area": ["a1", "a2", "a3", "a4", "a5", "b1", "c1", "c2", "e1", "e2", "e3"],
    }
)
WARDS = pd.DataFrame({"ward": ["w1", "w2", "w3"]})  # w3: nobody; the data also has w9, not listed


def visits(seed: int = SEED, units: int = 40) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    n = rng.integers(1, 6, units)
    pid = np.repeat(np.arange(units), n)
    return pd.DataFrame(
        {
            "pid": pid,
            "postcode": rng.choice(np.array(["A", "B", "C", "D", "E", "Z"]), pid.size),
            "cost": rng.integers(-8, 150, pid.size) / 8,  # some below 0 and above 16: clipped
            "ward": rng.choice(np.array(["w1", "w2", "w9"]), pid.size),
        }
    )


def prescriptions(seed: int = SEED, units: int = 50) -> pd.DataFrame:
    rng = np.random.default_rng(seed + 1)
    n = rng.integers(0, 6, units)  # some people have none; 40..49 have no visit
    pid = np.repeat(np.arange(units), n)
    return pd.DataFrame(
        {"pid": pid, "drug": rng.choice(np.array(["x", "y"]), pid.size), "dose": rng.integers(0, 72, pid.size) / 8}
    )


def hostile_visits(rows: int = 40) -> pd.DataFrame:
    """One person's many visits, at the extremes of every value, all in postcode A (5 areas)."""
    return pd.DataFrame(
        {
            "pid": np.full(rows, HOSTILE),
            "postcode": ["A"] * rows,
            "cost": np.where(np.arange(rows) % 2 == 0, 1e6, 16.0),
            "ward": ["w1"] * rows,
        }
    )


def hostile_prescriptions(rows: int = 40) -> pd.DataFrame:
    return pd.DataFrame({"pid": np.full(rows, HOSTILE), "drug": ["x"] * rows, "dose": np.full(rows, 1e6)})


def tables(seed: int = SEED, *, hostile: bool = False) -> dict[str, pd.DataFrame]:
    v, p = visits(seed), prescriptions(seed)
    if hostile:
        v = pd.concat([v, hostile_visits()], ignore_index=True)
        p = pd.concat([p, hostile_prescriptions()], ignore_index=True)
    return {"visits": v, "prescriptions": p, "regions": REGIONS, "areas": AREAS, "wards": WARDS}


def metadata(*, max_groups: int = 8, max_rows: int = 100, row_level: bool = False) -> DatasetMetadata:
    """The dataset's metadata; by default its contribution bounds cap nobody (at most 4 regions
    and 10 joined rows per person), so the references need not choose rows. ``row_level``: the
    visits alone, each row a different person."""
    unit: dict[str, Any] = {"row_level": True} if row_level else {"privacy_unit": "pid"}
    tables: dict[str, Metadata] = {
        "visits": Metadata(
            columns={"postcode": Categorical(), "cost": Numeric(*COST), "ward": Categorical()},
            join_rows=None if row_level else JOIN_ROWS["visits"],
            **unit,
        ),
        "regions": Metadata(columns={"postcode": Categorical(), "region": Categorical()}, public=True, max_matches=1),
        "areas": Metadata(
            columns={"postcode": Categorical(), "area": Categorical()}, public=True, max_matches=AREA_MATCHES
        ),
        "wards": Metadata(columns={"ward": Categorical()}, public=True, max_matches=1),
    }
    if not row_level:
        tables["prescriptions"] = Metadata(
            columns={"drug": Categorical(("x", "y")), "dose": Numeric(*DOSE)},
            privacy_unit="pid",
            join_rows=JOIN_ROWS["prescriptions"],
        )
        return DatasetMetadata(tables=tables, max_groups=max_groups, max_rows=max_rows)
    return DatasetMetadata(tables=tables)


def session(
    data: dict[str, pd.DataFrame],
    meta: DatasetMetadata,
    *,
    portable: bool = False,
    seed: int = SEED,
    epsilon: float = 1e9,
) -> dp.Session:
    if "prescriptions" not in meta.tables:
        data = {k: v for k, v in data.items() if k != "prescriptions"}
    return dp.Session(
        data, metadata=meta, budget=dp.Budget(epsilon=epsilon), portable=portable, rng=np.random.default_rng(seed)
    )


# -- running a query with the noise off -----------------------------------------------------------------


@dataclass
class Run:
    """What :func:`exact_run` recorded: the plans the engine ran, and each noisy part's
    (sensitivity, exact integers) in release order."""

    plans: list[AggregationPlan] = field(default_factory=list)
    parts: list[tuple[float, np.ndarray]] = field(default_factory=list)

    @property
    def salt(self) -> int:
        return self.plans[-1].salt


@contextlib.contextmanager
def exact_run() -> Iterator[Run]:
    """Within: queries release their exact pre-noise integers (``noise_off``), and the plans the
    DuckDB engine computes are recorded."""
    run = Run()
    real = DuckDBEngine.compute

    def spy(self: DuckDBEngine, plan: AggregationPlan) -> Any:
        run.plans.append(plan)
        return real(self, plan)

    with noise_off() as log, pytest.MonkeyPatch.context() as mp:
        mp.setattr(DuckDBEngine, "compute", spy)
        run.parts = log
        yield run


def joined_relation(s: dp.Session, join: JoinPlan, salt: int) -> pd.DataFrame:
    """The relation ``join`` builds on the session's tables (truncated and joined, before the
    contribution bounds), read directly from the engine's connection."""
    engines = s._tables.engines  # type: ignore[union-attr]
    values: list[Any] = []

    def add(value: Any) -> str:
        values.append(value)
        return f"${len(values)}"

    sql = join_sql(join, {n: e.relation() for n, e in engines.items()}, salt, s._portable, add)
    con = next(iter(engines.values()))._con  # type: ignore[attr-defined]
    return con.execute(f"SELECT * FROM {sql} AS j", values).df()


# -- pandas references -----------------------------------------------------------------------------------


def _text(x: Any) -> str:
    return str(x)  # DuckDB's text of a BIGINT, a VARCHAR and of these doubles ("2.0", "0.125") alike


def priority(df: pd.DataFrame, hashed: Sequence[str], salt: int) -> pd.Series:
    """The portable truncation priority of each row: md5 of ``salt|col1|col2|...`` (hex)."""
    rows = df[list(hashed)].itertuples(index=False, name=None)
    return pd.Series(
        ["|".join([str(salt), *map(_text, row)]).encode() for row in rows], index=df.index, dtype=object
    ).map(lambda b: hashlib.md5(b).hexdigest())


def truncate(df: pd.DataFrame, partition: Sequence[str], keep: int, hashed: Sequence[str], salt: int) -> pd.DataFrame:
    """At most ``keep`` rows per value of ``partition``: those of smallest priority."""
    ranked = df.assign(__p=priority(df, hashed, salt)).sort_values([*partition, "__p"], kind="stable")
    return ranked.groupby(list(partition), sort=False).head(keep).drop(columns="__p")


def clip(x: pd.Series, bounds: tuple[float, float]) -> pd.Series:
    return x.clip(*bounds)


def by_key(frame: pd.DataFrame, column: str, value: str) -> pd.Series:
    """``frame`` (a released table) indexed by its group column."""
    return frame.set_index(column)[value]
