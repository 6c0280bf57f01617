"""End-to-end empirical audit of a user-level private group-by, through the public Session API.

Neighbours: a table, and the same table plus one person with 30 rows in group "a". With
max_groups = 1 and max_rows = 2, bounding keeps exactly 2 of that person's rows, so the noisy
count of "a" moves by 2 = the sensitivity the session charges: the claimed ε = 1 is tight.
The guarantee check passes unless the real ε exceeds the claim (false failure <= 1e-6); the
power check runs the same query on an engine that skips contribution bounding — the person's
30 rows then move the count by 30, 15× the charge — and must be caught.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd

import dpkit as dp
from dpkit.analytics import Categorical, Metadata
from dpkit.analytics.engines.duckdb import DuckDBEngine
from dpkit.audit import estimate_epsilon

SEED = 20261129
STRICT = 1 - 1e-6
TRIALS = 500
META = Metadata(columns={"cat": Categorical(("a", "b"))})


def tables() -> tuple[pd.DataFrame, pd.DataFrame]:
    rng = np.random.default_rng(SEED)
    base = pd.DataFrame({"uid": rng.integers(0, 40, 120), "cat": rng.choice(np.array(["a", "b"]), 120)})
    person = pd.DataFrame({"uid": np.full(30, 999), "cat": ["a"] * 30})
    return base, pd.concat([base, person], ignore_index=True)


class UnboundedEngine(DuckDBEngine):
    """A broken engine: ignores the privacy unit, so nothing bounds a person's rows."""

    def compute(self, plan):  # type: ignore[no-untyped-def]
        return super().compute(replace(plan, unit=None))


def sampler(engine_cls):  # type: ignore[no-untyped-def]
    def sample(df: pd.DataFrame, n: int, rng: np.random.Generator) -> np.ndarray:
        s = dp.Session(
            df,
            privacy_unit="uid",
            budget=dp.Budget(epsilon=1e9),
            metadata=META,
            max_groups=1,
            max_rows=2,
            engine=engine_cls(df),
            rng=rng,
        )
        q = s.group_by("cat")
        return np.array([int(q.count(epsilon=1.0).table["count"][0]) for _ in range(n)])

    return sample


def test_user_level_group_by_count_keeps_its_epsilon() -> None:
    d0, d1 = tables()
    res = estimate_epsilon(
        sampler(DuckDBEngine), d0, d1, trials=TRIALS, confidence=STRICT, rng=np.random.default_rng(SEED)
    )
    assert res.epsilon_lower <= 1.0


def test_an_engine_that_skips_bounding_is_caught() -> None:
    d0, d1 = tables()
    res = estimate_epsilon(
        sampler(UnboundedEngine), d0, d1, trials=TRIALS, confidence=STRICT, rng=np.random.default_rng(SEED)
    )
    assert res.epsilon_lower > 1.0
