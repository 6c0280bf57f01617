"""A query's answer, as the service encodes it (``QueryResult.to_dict()`` through JSON), rebuilt by
the client is the local result: the same dict, the same text and notebook display, the same
table types. Post-processing of released values only (a seeded, in-memory session here)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

import dpkit as dp
from dpkit.analytics import Categorical, Metadata, Numeric
from dpkit.client.results import query_result

QUERIES = [
    # means and variances: each group's own scale ("... to ... across the groups")
    ("SELECT sex, COUNT(*), AVG(age), VARIANCE(age) FROM data GROUP BY sex", 0.0),
    ("SELECT city, COUNT(*) FROM data GROUP BY city", 1e-6),  # keys selected privately
    ("SELECT MEDIAN(age) FROM data", 0.0),  # no interval: NaN, sent as null
    ("SELECT ok, SUM(age) FROM data GROUP BY ok", 1e-6),  # boolean keys
]


@pytest.fixture(scope="module")
def session() -> dp.Session:
    rng = np.random.default_rng(0)
    n = 500
    frame = pd.DataFrame(
        {
            "age": rng.integers(18, 90, n),
            "sex": rng.choice(["F", "M"], n),
            "city": rng.choice(["a", "b", "c"], n),
            "ok": rng.choice([True, False], n),
        }
    )
    columns = {
        "age": Numeric(0, 100),
        "sex": Categorical(["F", "M"]),
        "city": Categorical(),
        "ok": Categorical(value_type="boolean"),
    }
    return dp.Session(
        frame,
        budget=dp.Budget(epsilon=100, delta=1e-3),
        metadata=Metadata(columns=columns, row_level=True),
        rng=np.random.default_rng(1),
    )


@pytest.mark.parametrize(("sql", "delta"), QUERIES)
def test_the_rebuilt_result_is_the_local_one(session: dp.Session, sql: str, delta: float) -> None:
    local = session.sql(sql, epsilon=1.0, delta=delta)
    answer = json.loads(json.dumps(local.to_dict(), allow_nan=False))  # as the service sends it
    answer["budget"] = {"remaining_epsilon": local.remaining_epsilon}  # (the service's envelope)
    remote = query_result(answer)
    assert remote.to_dict() == local.to_dict()
    assert str(remote) == str(local) and remote._repr_html_() == local._repr_html_()
    assert list(remote.table.dtypes) == list(local.table.dtypes)
    assert [a.event for a in remote.aggregates] == [a.event for a in local.aggregates]
