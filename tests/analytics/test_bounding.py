"""What contribution bounding did: the words every result carries next to its table, and the
optional estimate of what bounding left out — paid, in the same debit, before any row is read.

Statistical tests (fixed seeds; each states its false-failure rate and is run against a broken
variant that it must catch):

* the released counts centre on the true counts (a bounding that caps at the wrong row is caught);
* their spread is the stated noise (noise twice the stated scale is caught);
* neighbouring tables, D and D plus one hostile person with 30 rows outside the bounds: the
  estimate's output distributions differ by at most the ε each count is charged (an estimate of the
  *rows* left out, whose sensitivity is unbounded, is caught).
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

import dpkit as dp
from dpkit.analytics import Categorical, Metadata, Numeric, QuerySpec, Sum
from dpkit.analytics.engines.duckdb import DuckDBEngine
from dpkit.analytics.pricing import Priced, price
from dpkit.audit import estimate_epsilon
from dpkit.errors import InvalidParameterError

SEED = 20260611
META = Metadata(columns={"cat": Categorical(("a", "b")), "x": Numeric(0, 100)})
R = 2  # max_rows


def people(hostile: bool = False) -> pd.DataFrame:
    """120 units with 1, 2 or 5 rows in one group each; every fourth unit's values all lie above
    the bounds. So, with max_rows = 2, which units lose rows and how many kept rows are out of
    bounds does not depend on which rows bounding keeps (nor on the salt): 40 units lose rows,
    and the 30 units out of bounds keep 50 rows."""
    rows = []
    for u in range(120):
        for _ in range((1, 2, 5)[u % 3]):
            rows.append((u, "ab"[u % 2], 150.0 if u % 4 == 0 else 50.0))
    if hostile:  # one person, 30 rows, all out of bounds
        rows += [(999, "a", 1e9)] * 30
    return pd.DataFrame(rows, columns=["uid", "cat", "x"])


def truth(df: pd.DataFrame) -> tuple[int, int]:
    """(units that lose rows to max_rows, kept rows out of bounds), from the table directly."""
    n = df.groupby("uid").size()
    out = df.groupby("uid")["x"].max() > 100
    return int((n > R).sum()), int(np.minimum(n[out], R).sum())


def session(df: pd.DataFrame, budget: float = 1e9, engine: Any = None, rng: int = SEED) -> dp.Session:
    return dp.Session(
        df,
        privacy_unit="uid",
        budget=dp.Budget(epsilon=budget),
        metadata=META,
        max_rows=R,
        engine=engine,
        rng=np.random.default_rng(rng),
    )


def row_level(budget: float = 1.0) -> dp.Session:
    df = pd.DataFrame({"cat": ["a", "b"] * 50, "x": np.arange(100.0) * 2})
    return dp.Session(
        df, row_level=True, budget=dp.Budget(epsilon=budget), metadata=META, rng=np.random.default_rng(SEED)
    )


# ---- 1. every result says what its intervals cover, next to the table ----------------------------


def test_a_capped_and_clipped_result_says_so_in_every_form() -> None:
    r = session(people()).sql("SELECT cat, COUNT(*), AVG(x) FROM data GROUP BY cat", epsilon=1.0)
    b = r.bounding
    assert (b.covers, b.max_rows, b.max_groups, b.clipped_columns) == ("bounded statistic", 2, 1, ("x",))
    assert b.estimate is None
    assert "max_rows=2" in b.text and "max_groups=1" in b.text and "x to [0, 100]" in b.text
    # JSON: structured, and no estimate field without the option
    assert r.to_dict()["bounding"] == {
        "covers": "bounded statistic",
        "max_rows": 2,
        "max_groups": 1,
        "clipped_columns": ["x"],
        "declared_bounds": {"x": [0.0, 100.0]},
        "text": b.text,
    }
    # text: the line right under the table
    lines = str(r).splitlines()
    last_row = max(i for i, line in enumerate(lines) if line.lstrip().startswith("b "))
    assert lines[last_row + 1] == b.text
    assert b.text in repr(r).splitlines()  # what a console shows for `r`
    # notebook HTML: right after the table, outside the list of facts
    page = r._repr_html_()
    assert page.index("</table>") < page.index('<p class="dpkit-bounding">') < page.index("<ul>")
    assert "max_rows=2" in page.split("<ul>")[0]


def test_only_what_applies_is_named() -> None:
    unit_count = session(people()).count(epsilon=1.0).bounding
    assert unit_count.max_groups is None and not unit_count.clipped
    assert "max_rows=2" in unit_count.text and "max_groups" not in unit_count.text and "clipped" not in unit_count.text
    exact = row_level().count(epsilon=0.5).bounding
    assert (exact.covers, exact.max_rows, exact.max_groups) == ("exact statistic", None, None)
    assert "exact statistic" in exact.text
    clipped = row_level().mean("x", epsilon=0.5).bounding
    assert clipped.covers == "bounded statistic" and clipped.max_rows is None
    assert "clipped" in clipped.text and "max_rows" not in clipped.text


def test_the_cli_table_shows_it(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from dpkit.cli import app

    df = people()
    df.to_csv(tmp_path / "p.csv", index=False)
    (tmp_path / "m.json").write_text(
        '{"privacy_unit": "uid", "max_rows": 2, "columns": {"cat": {"type": "categorical", "categories": ["a", "b"]},'
        ' "x": {"type": "numeric", "lower": 0, "upper": 100}}}'
    )
    ledger = str(tmp_path / "l.sqlite")
    runner = CliRunner()
    made = runner.invoke(
        app, ["budget", "create", str(tmp_path / "p.csv"), "ann", "--epsilon", "2", "--ledger", ledger]
    )
    assert made.exit_code == 0, made.output
    args = ["query", str(tmp_path / "p.csv"), "SELECT SUM(x) FROM p", "--epsilon", "0.5"]
    done = runner.invoke(app, [*args, "--metadata", str(tmp_path / "m.json"), "--analyst", "ann", "--ledger", ledger])
    assert done.exit_code == 0, done.output
    text = " ".join(done.stdout.split())
    assert "intervals cover the statistic after bounding: each uid's rows capped at max_rows=2" in text
    assert "x to [0, 100]" in text


# ---- 2. the estimate: opt-in, paid in the same debit, refused unpaid where it cannot run ----------


def test_the_estimate_is_paid_and_absent_without_the_option() -> None:
    s = session(people(), budget=1.0)
    plain = s.sum("x", epsilon=0.1)
    assert s.remaining == 0.9 and plain.epsilon == 0.1 and plain.bounding.estimate is None
    assert "estimate" not in plain.to_dict()["bounding"]
    assert s.sql_cost("SELECT SUM(x) FROM data", epsilon=0.1, bounding_epsilon=0.05).epsilon == 0.15
    paid = s.sql("SELECT SUM(x) FROM data", epsilon=0.1, bounding_epsilon=0.05)
    assert s.remaining == 0.75  # exactly the query's 0.1 and the estimate's 0.05
    assert paid.epsilon == 0.15
    est = paid.bounding.estimate
    assert est is not None and est.epsilon == 0.05
    assert est.units_capped is not None and est.rows_clipped is not None
    assert est.units_capped.epsilon + est.rows_clipped.epsilon == 0.05
    assert (est.units_capped.sensitivity, est.rows_clipped.sensitivity) == (1, R)
    assert est.units_capped.low <= est.units_capped.value <= est.units_capped.high
    assert set(paid.to_dict()["bounding"]["estimate"]) == {"epsilon", "confidence", "units_capped", "rows_clipped"}
    assert any(line.startswith("bounding estimate (paid") for line in str(paid).splitlines())


def test_the_estimate_is_paid_from_a_ledger_with_gaussian_noise_too(tmp_path: Path) -> None:
    from dpkit.ledger import open_ledger

    with open_ledger(tmp_path / "l.sqlite") as ledger:
        ledger.create_budget("people", "ann", epsilon=1.0, delta=1e-5)
    s = dp.Session(
        people(),
        privacy_unit="uid",
        metadata=META,
        max_rows=R,
        ledger=tmp_path / "l.sqlite",
        dataset="people",
        analyst="ann",
    )
    s.sum("x", epsilon=0.2, delta=1e-6, noise="gaussian", bounding_epsilon=0.05)
    assert s.spent[0] == 0.25


@pytest.mark.parametrize("value", [0, -1.0, math.nan, math.inf, "0.1", True])
def test_a_bad_bounding_epsilon_is_refused_unpaid(value: object) -> None:
    s = session(people(), budget=1.0)
    with pytest.raises(InvalidParameterError) as err:
        s.sum("x", epsilon=0.1, bounding_epsilon=value)  # type: ignore[arg-type]
    assert err.value.name == "bounding_epsilon"
    assert s.remaining == 1.0


def test_an_estimate_of_nothing_is_refused_unpaid() -> None:
    s = row_level(budget=1.0)
    with pytest.raises(InvalidParameterError, match="nothing to estimate") as err:
        s.count(epsilon=0.1, bounding_epsilon=0.05)
    assert err.value.name == "bounding_epsilon" and s.remaining == 1.0
    # with a bounded aggregate there is: the kept rows out of bounds
    est = s.mean("x", epsilon=0.1, bounding_epsilon=0.05).bounding.estimate
    assert est is not None and est.units_capped is None and est.rows_clipped is not None
    assert est.rows_clipped.sensitivity == 1 and est.rows_clipped.epsilon == 0.05


class _NoCounts:
    """An engine that runs plans but cannot count what bounding left out (as Spark, for now)."""

    name = "other"

    def __init__(self, df: pd.DataFrame) -> None:
        self._inner = DuckDBEngine(df)

    def schema(self) -> Any:
        return self._inner.schema()

    def bind(self, types: Any, *, strip_strings: bool) -> None:
        self._inner.bind(types, strip_strings=strip_strings)

    def aggregate(self, plan: Any) -> Any:
        return self._inner.aggregate(plan)

    def compute(self, plan: Any) -> Any:
        return self._inner.compute(plan)


def test_an_engine_that_cannot_count_refuses_the_estimate_before_payment() -> None:
    df = people()
    s = session(df, budget=1.0, engine=_NoCounts(df))
    for run in (s.sql_cost, s.sql):
        with pytest.raises(InvalidParameterError, match="does not count") as err:
            run("SELECT SUM(x) FROM data", epsilon=0.1, bounding_epsilon=0.05)
        assert err.value.name == "bounding_epsilon"
    assert s.remaining == 1.0
    s.sum("x", epsilon=0.1)  # without the option the engine serves as ever
    assert s.remaining == 0.9


def test_the_engine_counts_the_truth_whatever_the_salt() -> None:
    for df in (people(), people(hostile=True)):
        engine = DuckDBEngine(df)
        s = session(df, engine=engine)
        plan = _priced(s).plan
        assert {engine.bounding_counts(replace(plan, salt=salt)) for salt in (1, 2, 3)} == {truth(df)}


# ---- statistics -----------------------------------------------------------------------------------


def _priced(s: dp.Session, bounding_epsilon: float = 2.0) -> Priced:
    spec = QuerySpec(aggregates=(Sum("x"),))
    return price(spec, s._declared, options=dp.analytics.QueryOptions(epsilon=1.0, bounding_epsilon=bounding_epsilon))


class _CapsAtOneRow(DuckDBEngine):
    """A broken engine: counts the units that lose rows as if max_rows were 1."""

    def bounding_counts(self, plan: Any) -> tuple[int, int]:
        return super().bounding_counts(replace(plan, max_rows=1))


def _estimates(engine_cls: type, n: int) -> np.ndarray:
    """n estimates (units capped, rows clipped) from n paid queries through the public API."""
    df = people()
    s = session(df, engine=engine_cls(df))
    out = []
    for _ in range(n):
        est = s.sum("x", epsilon=1.0, bounding_epsilon=2.0).bounding.estimate
        assert est is not None and est.units_capped is not None and est.rows_clipped is not None
        out.append((est.units_capped.value, est.rows_clipped.value))
    return np.array(out, dtype=np.float64)


def _laplace_sd(scale: float) -> float:
    p = math.exp(-1.0 / scale)
    return math.sqrt(2 * p) / (1 - p)


def _centred(samples: np.ndarray, true: tuple[int, int], scales: tuple[float, float]) -> bool:
    """Each mean within 5 standard errors of the truth (false failure < 6e-7 each, by the CLT)."""
    n = len(samples)
    return all(abs(samples[:, k].mean() - true[k]) <= 5 * _laplace_sd(scales[k]) / math.sqrt(n) for k in range(2))


def test_the_estimate_centres_on_the_true_counts() -> None:
    # ε_b = 2: ε = 1 per count; scales 1/1 (units, sensitivity 1) and 2/1 (rows, sensitivity G·R = 2)
    true, scales = truth(people()), (1.0, 2.0)
    assert true == (40, 50)
    assert _centred(_estimates(DuckDBEngine, 50), true, scales)
    assert not _centred(_estimates(_CapsAtOneRow, 50), true, scales)  # power: 80 units, not 40


def _stated_spread(noise: np.ndarray, scale: float, n: int) -> bool:
    """Sample variance within 5 standard errors of the stated discrete Laplace variance. The
    variance of s² is about σ⁴(2 + κ)/n with κ = 3, the excess kurtosis of the Laplace law: false
    failure < 1e-6 by the CLT at n = 40,000."""
    var = _laplace_sd(scale) ** 2
    return abs(noise.var() - var) <= 5 * var * math.sqrt(5 / n)


def test_the_estimate_noise_is_the_stated_noise() -> None:
    df = people()
    engine = DuckDBEngine(df)
    priced = _priced(session(df, engine=engine))
    report, n = priced.bounding, 40_000
    rng = np.random.default_rng(SEED)
    for mech, true in ((report.units, truth(df)[0]), (report.rows, truth(df)[1])):
        assert mech is not None
        noise = mech.release(np.full(n, true), rng=rng) - true
        assert _stated_spread(noise, mech.scale, n)
        assert not _stated_spread(2 * noise, mech.scale, n)  # power: twice the stated noise


# The audit (Ding et al. 2018, through dpkit.audit.estimate_epsilon): a bound above the claimed ε
# happens with probability at most 1 − STRICT = 1e-6 when the claim holds.
STRICT = 1 - 1e-6
TRIALS = 100_000


def _sampler(which: int, rows_left_out: bool = False) -> Any:
    """The estimate's count ``which`` (0: units capped, 1: rows clipped) as the query releases it:
    priced from the declared table, counted by the DuckDB engine on the table (once: the counts
    of these tables do not depend on the salt, tested above), noised by the priced mechanism."""

    def sample(df: pd.DataFrame, n: int, rng: np.random.Generator) -> np.ndarray:
        engine = DuckDBEngine(df)
        priced = _priced(session(df, engine=engine))
        counts = engine.bounding_counts(replace(priced.plan, salt=1))
        if rows_left_out:  # the naive design: the rows the units lost, unbounded per unit
            counts = (len(df) - int(df.groupby("uid").size().clip(upper=R).sum()), counts[1])
        mech = priced.bounding.units if which == 0 else priced.bounding.rows
        assert mech is not None
        return np.asarray(mech.release(np.full(n, counts[which]), rng=rng))

    return sample


@pytest.mark.parametrize("which", [0, 1])
def test_a_hostile_person_moves_the_estimate_by_at_most_its_epsilon(which: int) -> None:
    d0, d1 = people(), people(hostile=True)
    assert truth(d1)[0] - truth(d0)[0] == 1 and truth(d1)[1] - truth(d0)[1] == R  # the claims are tight
    res = estimate_epsilon(_sampler(which), d0, d1, trials=TRIALS, confidence=STRICT, rng=np.random.default_rng(SEED))
    assert res.epsilon_lower <= 1.0  # each count's share of ε_b = 2


def test_an_estimate_of_the_rows_left_out_is_caught() -> None:
    d0, d1 = people(), people(hostile=True)
    broken = _sampler(0, rows_left_out=True)  # the person's 28 lost rows, charged as 1
    res = estimate_epsilon(broken, d0, d1, trials=TRIALS, confidence=STRICT, rng=np.random.default_rng(SEED))
    assert res.epsilon_lower > 1.0
