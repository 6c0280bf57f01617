"""dpkit.Budget: an in-memory privacy filter that prices before it records, atomically."""

from __future__ import annotations

import math
import threading
from fractions import Fraction

import pytest

from dpkit.accounting import (
    ApproxDPEvent,
    ComposedEvent,
    DPEvent,
    ExponentialEvent,
    GaussianEvent,
    LaplaceEvent,
    PoissonSampledEvent,
    PureDPEvent,
    RandomizedResponseEvent,
    SelfComposedEvent,
)
from dpkit.accounting.composition import BasicAccountant
from dpkit.budget import Budget
from dpkit.errors import BudgetExceededError, InvalidParameterError
from dpkit.mechanisms.laplace import Laplace


def test_spend_spent_remaining_events() -> None:
    budget = Budget(epsilon=1.0)
    assert (budget.epsilon, budget.delta, budget.spent, budget.remaining, budget.events) == (
        1.0,
        0.0,
        (0.0, 0.0),
        1.0,
        (),
    )
    first, second = LaplaceEvent(noise_multiplier=4), PureDPEvent(0.5)
    assert budget.spend(first) is None
    budget.spend(second)
    assert budget.spent == (0.75, 0.0)
    assert budget.remaining == 0.25
    assert budget.events == (first, second)
    assert "events=2" in repr(budget)


def test_over_spend_is_refused_and_records_nothing() -> None:
    budget = Budget(epsilon=1.0)
    budget.spend(PureDPEvent(0.75))
    with pytest.raises(BudgetExceededError) as info:
        budget.spend(LaplaceEvent(noise_multiplier=2))
    message = str(info.value)
    assert "LaplaceEvent(ε=0.5)" in message  # the requested event
    assert "ε=1.25" in message  # the would-be total
    assert "remaining ε=0.25" in message
    assert budget.spent == (0.75, 0.0) and budget.remaining == 0.25 and len(budget.events) == 1
    budget.spend(PureDPEvent(0.25))  # exactly the rest is accepted
    assert budget.remaining == 0.0
    with pytest.raises(BudgetExceededError):
        budget.spend(LaplaceEvent(noise_multiplier=10**9))


def test_can_spend_is_a_dry_run() -> None:
    budget = Budget(epsilon=1.0)
    budget.spend(PureDPEvent(0.5))
    assert budget.can_spend(PureDPEvent(0.5))
    assert not budget.can_spend(PureDPEvent(0.5), count=2)
    assert not budget.can_spend(ApproxDPEvent(0.1, 1e-9))  # δ budget is 0
    assert budget.spent == (0.5, 0.0) and len(budget.events) == 1
    with pytest.raises(InvalidParameterError):
        budget.can_spend(0.5)  # type: ignore[arg-type]


def test_count_records_a_self_composed_event() -> None:
    budget = Budget(epsilon=1.0)
    budget.spend(LaplaceEvent(noise_multiplier=10), count=3)
    assert budget.events == (SelfComposedEvent(LaplaceEvent(noise_multiplier=10), 3),)
    budget.spend(SelfComposedEvent(PureDPEvent(0.125), 2))
    assert budget.spent[0] == pytest.approx(0.55) and budget.spent[0] >= 0.55


def test_threads_never_overshoot() -> None:
    """8 threads × 200 spends of ε = 1/100 against ε = 1: exactly 100 accepted."""
    budget = Budget(epsilon=1.0)
    event = LaplaceEvent.for_epsilon(Fraction(1, 100))  # noise multiplier exactly 100
    accepted: list[int] = []
    refused: list[int] = []
    seen: list[float] = []
    stop = threading.Event()

    def spender() -> None:
        ok = bad = 0
        for _ in range(200):
            try:
                budget.spend(event)
                ok += 1
            except BudgetExceededError:
                bad += 1
        accepted.append(ok)
        refused.append(bad)

    def watcher() -> None:
        while not stop.is_set():
            seen.append(budget.spent[0])

    watch = threading.Thread(target=watcher)
    watch.start()
    threads = [threading.Thread(target=spender) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    watch.join()
    assert sum(accepted) == 100 and sum(refused) == 1500
    assert budget.spent == (1.0, 0.0) and budget.remaining == 0.0 and len(budget.events) == 100
    assert seen and max(seen) <= 1.0
    assert seen == sorted(seen)  # spent only grows


def test_budgets_compare_exactly_at_decimal_values() -> None:
    """ε = 0.01 is read as 1/100 (the decimal it prints as), by the mechanism that calibrates to
    it and by the budget: exactly 100 spends fit ε = 1 and the 101st is refused. At the doubles'
    binary values (0.01 is a little more than 1/100) only 99 would fit."""
    budget = Budget(epsilon=1.0)
    accepted = 0
    for _ in range(101):
        try:
            budget.spend(Laplace(epsilon=0.01).event)
            accepted += 1
        except BudgetExceededError:
            pass
    assert accepted == 100 and budget.remaining == 0.0
    assert Fraction(0.01) * 100 > 1  # what the binary reading would have charged
    # Ten spends of 0.1 (the friction a new user hit: "remaining ε=0.09999999999999987").
    tenth = Budget(epsilon=1.0)
    for _ in range(10):
        tenth.spend(PureDPEvent(0.1))
    assert tenth.spent[0] == 1.0 and not tenth.can_spend(PureDPEvent(1e-300))
    # A decimal above its double is charged in full: 0.3 is 3/10 > the double 0.29999999999999998.
    budget = Budget(epsilon=0.9)
    budget.spend(PureDPEvent(0.3), count=3)
    assert not budget.can_spend(PureDPEvent(1e-300))
    assert Fraction(0.3) * 3 < Fraction(9, 10)  # a binary reading would have left room


def test_the_noise_is_calibrated_to_exactly_the_amount_charged() -> None:
    """Laplace(ε = 0.1) draws discrete Laplace noise of scale exactly (Δ/g + 1)·10 lattice steps
    and charges exactly 1/10; the power check: the same noise charged at the double's binary value
    would be a different (larger) amount."""
    mech = Laplace(epsilon=0.1, sensitivity=1.0)
    plan = mech.noise_plan()
    assert plan.sensitivity_on_lattice / plan.lattice_scale == Fraction(1, 10)
    assert BasicAccountant().compose(mech.event)._exact_epsilon(0.0) == Fraction(1, 10)
    assert Fraction(0.1) != Fraction(1, 10)


def test_delta_accumulates_and_is_capped_by_the_budget() -> None:
    budget = Budget(epsilon=1.0, delta=1e-6)
    budget.spend(ApproxDPEvent(0.25, 4e-7))
    assert budget.spent == (0.25, 4e-7)
    budget.spend(LaplaceEvent(noise_multiplier=4))
    assert budget.spent == (0.5, 4e-7)
    with pytest.raises(BudgetExceededError):
        budget.spend(ApproxDPEvent(0.25, 7e-7))  # δ would be 1.1e-6 > 1e-6
    assert budget.spent == (0.5, 4e-7)
    budget.spend(ApproxDPEvent(0.25, 6e-7))
    assert budget.spent[1] == pytest.approx(1e-6) and budget.spent[1] <= 1e-6


@pytest.mark.parametrize("value", [0.5, "LaplaceEvent", None, (1.0, 0.0), LaplaceEvent, [PureDPEvent(0.1)]])
def test_only_events_can_be_spent(value: object) -> None:
    budget = Budget(epsilon=1.0)
    with pytest.raises(InvalidParameterError) as info:
        budget.spend(value)  # type: ignore[arg-type]
    assert info.value.name == "event"
    assert budget.events == () and budget.spent == (0.0, 0.0)


@pytest.mark.parametrize("count", [0, -1, True, 1.5, "2"])
def test_count_must_be_a_positive_integer(count: object) -> None:
    budget = Budget(epsilon=1.0)
    with pytest.raises(InvalidParameterError) as info:
        budget.spend(PureDPEvent(0.1), count=count)  # type: ignore[arg-type]
    assert info.value.name == "count"
    assert budget.events == ()


@pytest.mark.parametrize(
    "make",
    [
        lambda: PureDPEvent(-0.5),
        lambda: PureDPEvent(float("nan")),
        lambda: PureDPEvent(float("inf")),
        lambda: ApproxDPEvent(0.5, -1e-6),
        lambda: LaplaceEvent(noise_multiplier=-2),
        lambda: SelfComposedEvent(PureDPEvent(0.1), 0),
        lambda: SelfComposedEvent(PureDPEvent(0.1), -2),
    ],
)
def test_negative_nan_or_infinite_spends_cannot_be_written(make) -> None:
    with pytest.raises(InvalidParameterError):
        make()


def test_a_budget_never_grows_by_spending() -> None:
    budget = Budget(epsilon=1.0)
    budget.spend(PureDPEvent(0.5))
    negative = PureDPEvent(0.5)
    object.__setattr__(negative, "epsilon", -0.5)  # forced past the frozen dataclass
    repeated = SelfComposedEvent(PureDPEvent(0.1), 2)
    object.__setattr__(repeated, "count", -5)
    nan = PureDPEvent(0.1)
    object.__setattr__(nan, "epsilon", float("nan"))
    for bad in (negative, repeated, nan):
        with pytest.raises(InvalidParameterError):
            budget.spend(bad)
    assert budget.spent == (0.5, 0.0) and budget.remaining == 0.5 and len(budget.events) == 1


def test_randomized_response_costs_its_likelihood_ratio() -> None:
    budget = Budget(epsilon=2.0, accountant=None)
    budget.spend(RandomizedResponseEvent(p_truth=0.75))  # ln 3
    assert math.log(3) <= budget.spent[0] <= math.log(3) + 1e-15
    other = Budget(epsilon=2.0)
    other.spend(RandomizedResponseEvent(p_truth=0.25))  # lies more often than not: still ln 3
    assert other.spent == budget.spent
    with pytest.raises(InvalidParameterError, match="p_truth"):
        Budget(epsilon=2.0).spend(RandomizedResponseEvent(p_truth=1.0))


def test_exponential_and_composed_events() -> None:
    budget = Budget(epsilon=1.0)
    budget.spend(ComposedEvent((ExponentialEvent(0.25), SelfComposedEvent(LaplaceEvent(noise_multiplier=8), 2))))
    assert budget.spent == (0.5, 0.0)


@pytest.mark.parametrize("event", [GaussianEvent(1.0), PoissonSampledEvent(0.01, PureDPEvent(1.0))])
def test_default_accountant_points_to_rdp_or_pld(event: DPEvent) -> None:
    budget = Budget(epsilon=10.0, delta=1e-5)
    with pytest.raises(InvalidParameterError, match="RDPAccountant or PLDAccountant") as info:
        budget.spend(event)
    assert info.value.name == "event"
    assert budget.events == ()


def test_one_neighbour_relation_per_budget() -> None:
    budget = Budget(epsilon=5.0)
    budget.spend(LaplaceEvent(noise_multiplier=1))
    with pytest.raises(InvalidParameterError, match="neighbour"):
        budget.spend(RandomizedResponseEvent(p_truth=0.75))
    assert len(budget.events) == 1


def test_configuration_is_frozen() -> None:
    budget = Budget(epsilon=1.0)
    with pytest.raises(AttributeError):
        budget.epsilon = 2.0  # type: ignore[misc]
    with pytest.raises(AttributeError):
        budget._epsilon = 2.0  # type: ignore[misc]
    assert budget.epsilon == 1.0


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"epsilon": 0.0}, "epsilon"),
        ({"epsilon": -1.0}, "epsilon"),
        ({"epsilon": float("nan")}, "epsilon"),
        ({"epsilon": float("inf")}, "epsilon"),
        ({"epsilon": True}, "epsilon"),
        ({"epsilon": 1.0, "delta": 1.0}, "delta"),
        ({"epsilon": 1.0, "delta": float("nan")}, "delta"),
        ({"epsilon": 1.0, "accountant": 3}, "accountant"),
        ({"epsilon": 1.0, "accountant": BasicAccountant()}, "accountant"),  # an instance, not a factory
        ({"epsilon": 1.0, "accountant": lambda: object()}, "accountant"),
    ],
)
def test_bad_budget_arguments(kwargs: dict, name: str) -> None:
    with pytest.raises(InvalidParameterError) as info:
        Budget(**kwargs)
    assert info.value.name == name


def test_exact_budget_is_kept_exactly() -> None:
    budget = Budget(epsilon=Fraction(1, 3))  # type: ignore[arg-type]
    assert budget.epsilon <= Fraction(1, 3) and budget.epsilon == pytest.approx(1 / 3)  # shown rounded down
    budget.spend(LaplaceEvent(noise_multiplier=3))  # exactly 1/3 fits exactly 1/3
    with pytest.raises(BudgetExceededError):
        budget.spend(PureDPEvent(1e-300))
    assert budget.remaining == 0.0


# ------------------------------------------------------------------------------------------------
# a custom accountant factory
# ------------------------------------------------------------------------------------------------


class RecordingAccountant:
    """Charges 0.3 per composed repetition; logs every call on the class."""

    instances: list[RecordingAccountant] = []

    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.total = 0
        RecordingAccountant.instances.append(self)

    def supports(self, event: DPEvent) -> bool:
        return True

    def compose(self, event: DPEvent, count: int = 1) -> RecordingAccountant:
        self.calls.append(("compose", event, count))
        self.total += count
        return self

    def get_epsilon(self, delta: float) -> float:
        self.calls.append(("get_epsilon", delta))
        return 0.3 * self.total

    def get_delta(self, epsilon: float) -> float:
        self.calls.append(("get_delta", epsilon))
        return 0.0


def test_custom_accountant_factory_prices_the_whole_history_afresh() -> None:
    RecordingAccountant.instances.clear()
    budget = Budget(epsilon=1.0, delta=1e-5, accountant=RecordingAccountant)
    a, b = GaussianEvent(3.0), GaussianEvent(4.0)  # the default accountant would refuse these
    budget.spend(a)
    budget.spend(b)
    budget.spend(b)
    first, second, third = RecordingAccountant.instances[-3:]
    assert len({id(x) for x in (first, second, third)}) == 3  # a fresh accountant per spend
    assert first.calls[:2] == [("compose", a, 1), ("get_epsilon", 1e-5)]
    assert second.calls[:3] == [("compose", a, 1), ("compose", b, 1), ("get_epsilon", 1e-5)]
    # identical consecutive events are composed as one run with a count
    assert third.calls[:3] == [("compose", a, 1), ("compose", b, 2), ("get_epsilon", 1e-5)]
    assert budget.spent == (pytest.approx(0.9), 0.0)
    n = len(RecordingAccountant.instances)
    with pytest.raises(BudgetExceededError):
        budget.spend(a)  # 1.2 > 1.0
    assert len(RecordingAccountant.instances) == n + 1 and len(budget.events) == 3
    assert budget.can_spend(a) is False and len(budget.events) == 3


class BrokenAccountant(RecordingAccountant):
    answer: object = None

    def get_epsilon(self, delta: float) -> float:
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer  # type: ignore[return-value]


@pytest.mark.parametrize("answer", [RuntimeError("boom"), float("nan"), float("inf"), -0.1, None, "0.1"])
def test_an_accountant_that_fails_refuses_the_spend(answer: object, monkeypatch) -> None:
    monkeypatch.setattr(BrokenAccountant, "answer", answer)
    budget = Budget(epsilon=1.0, accountant=BrokenAccountant)
    with pytest.raises(BudgetExceededError):
        budget.spend(PureDPEvent(0.1))
    assert budget.events == () and budget.spent == (0.0, 0.0)
    assert budget.can_spend(PureDPEvent(0.1)) is False


def test_spent_never_decreases_even_if_the_accountant_says_so() -> None:
    answers = iter([0.5, 0.2])

    class Shrinking(RecordingAccountant):
        def get_epsilon(self, delta: float) -> float:
            return next(answers)

    budget = Budget(epsilon=1.0, accountant=Shrinking)
    budget.spend(PureDPEvent(0.1))
    budget.spend(PureDPEvent(0.1))
    assert budget.spent[0] == 0.5 and budget.remaining == 0.5
