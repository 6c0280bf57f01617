"""Ten queries of ε = 0.1 fit a budget of 1.0: every ε is read at its decimal value, by the
mechanisms a query builds, by the in-memory budget and by the ledger (the friction a new user hit:
"the tenth is refused, remaining ε=0.09999999999999987")."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

import dpkit as dp
from dpkit.accounting.composition import basic_cost
from dpkit.analytics import Categorical, Metadata, Numeric
from dpkit.datasets import census
from dpkit.errors import BudgetExceededError

META = Metadata(
    columns={"age": Numeric(18, 90), "income": Numeric(0, 250_000), "sex": Categorical(["Female", "Male"])},
    privacy_unit="person_id",
)
QUERIES = [
    "SELECT COUNT(*) FROM data",
    "SELECT sex, COUNT(*), AVG(income) FROM data GROUP BY sex",  # ε split three ways
    "SELECT AVG(age), MEDIAN(age) FROM data",
    "SELECT sex, VARIANCE(age) FROM data WHERE age > 30 GROUP BY sex",
]


@pytest.mark.parametrize("sql", QUERIES)
def test_a_query_costs_exactly_its_epsilon_or_less(sql: str) -> None:
    s = dp.Session(census(), max_groups=2, max_rows=2, budget=dp.Budget(epsilon=1.0), metadata=META)
    cost = s.sql_cost(sql, epsilon=0.1)
    eps, _, _ = basic_cost(cost.event)
    # The parts never cost more than the decimal 1/10, and lose at most a few ulps of it.
    assert Fraction(1, 10) * (1 - Fraction(1, 10**14)) <= eps <= Fraction(1, 10)


def test_ten_queries_of_a_tenth_fit_a_budget_of_one() -> None:
    s = dp.Session(census(), max_groups=2, max_rows=2, budget=dp.Budget(epsilon=1.0), metadata=META)
    for i in range(10):
        s.sql(QUERIES[i % 2], epsilon=0.1, rng=np.random.default_rng(i))
    assert s.remaining < 1e-12
    with pytest.raises(BudgetExceededError):
        s.sql(QUERIES[0], epsilon=0.1, rng=np.random.default_rng(10))


def test_ten_queries_of_a_tenth_fit_a_ledger_budget_of_one(tmp_path: Path) -> None:
    ledger = dp.open_ledger(tmp_path / "ledger.sqlite")
    ledger.create_budget("census", "ann", epsilon=1.0)
    s = dp.Session(census(), max_groups=2, max_rows=2, ledger=ledger, dataset="census", analyst="ann", metadata=META)
    for _ in range(10):
        s.sql(QUERIES[0], epsilon=0.1)
    record = ledger.get_budget("census", "ann")
    assert (record.spent_epsilon, record.remaining_epsilon) == (1.0, 0.0)
    assert [sp.epsilon_cost for sp in ledger.list_spends("census", "ann")] == [0.1] * 10
    with pytest.raises(BudgetExceededError):
        s.sql(QUERIES[0], epsilon=0.1)
    ledger.verify()


def test_the_power_check_a_binary_reading_refuses_the_tenth(monkeypatch: pytest.MonkeyPatch) -> None:
    """The deliberately broken variant: amounts read at their binary values (the rule before)
    refuse the tenth spend of 0.1, so the tests above would catch a regression to it."""
    import dpkit._validate as validate

    exact = validate.exact_amount

    def binary(name: str, value: object, **kwargs: object) -> Fraction:
        kwargs.pop("decimal", None)
        return exact(name, value, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(validate, "exact_amount", binary)
    budget = dp.Budget(epsilon=1.0)
    for _ in range(9):
        budget.spend(dp.accounting.PureDPEvent(0.1))
    with pytest.raises(BudgetExceededError):
        budget.spend(dp.accounting.PureDPEvent(0.1))
    assert 10 * Fraction(0.1) > 1 and 10 * Fraction(repr(0.1)) == 1
