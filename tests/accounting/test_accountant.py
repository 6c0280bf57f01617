"""The accounting kernel: the Accountant base class, the composite walker, the registry by name,
and one behaviour for ε = 0 across every accountant."""

from __future__ import annotations

import math
import subprocess
import sys
from functools import partial

import pytest
from scipy.stats import norm

from dpkit.accounting import (
    ACCOUNTANTS,
    Accountant,
    BasicAccountant,
    ComposedEvent,
    GaussianEvent,
    LaplaceEvent,
    PLDAccountant,
    PureDPEvent,
    RDPAccountant,
    SelfComposedEvent,
    ZCDPAccountant,
    calibrate_noise_multiplier,
    resolve_accountant,
)
from dpkit.accounting.walk import fold, leaves
from dpkit.budget import Budget
from dpkit.errors import InvalidParameterError

ALL = [BasicAccountant, RDPAccountant, ZCDPAccountant, PLDAccountant]
ACCEPTED = "'basic', 'rdp', 'zcdp' or 'pld', an Accountant subclass, or a factory"


# ------------------------------------------------------------------------------ the registry


def test_registry_names_every_accountant_and_is_read_only() -> None:
    assert dict(ACCOUNTANTS) == {
        "basic": BasicAccountant,
        "rdp": RDPAccountant,
        "zcdp": ZCDPAccountant,
        "pld": PLDAccountant,
    }
    with pytest.raises(TypeError):
        ACCOUNTANTS["laplace"] = BasicAccountant  # type: ignore[index]


@pytest.mark.parametrize("name", ["basic", "rdp", "zcdp", "pld"])
def test_resolve_a_name_gives_fresh_accountants(name: str) -> None:
    factory = resolve_accountant(name)
    a, b = factory(), factory()
    assert type(a) is ACCOUNTANTS[name] and a is not b


def test_resolve_a_class_or_a_factory() -> None:
    assert resolve_accountant(RDPAccountant) is RDPAccountant
    factory = partial(PLDAccountant, value_discretization_interval=1e-3)
    assert resolve_accountant(factory) is factory


@pytest.mark.parametrize("spec", ["rdp", "zcdp", "pld", RDPAccountant])
def test_resolve_binds_neighbours(spec: object) -> None:
    acc = resolve_accountant(spec, neighbours="replace")()
    assert acc.neighbours == "replace"  # type: ignore[attr-defined]


def test_resolve_binds_neighbours_for_basic_too() -> None:
    acc = resolve_accountant("basic", neighbours="replace")()
    assert acc.neighbours == "replace"


@pytest.mark.parametrize("bad", ["laplace", "RDP", "", 3, None, BasicAccountant(), int, object()])
def test_resolve_rejects_what_is_not_an_accountant(bad: object) -> None:
    with pytest.raises(InvalidParameterError) as info:
        resolve_accountant(bad, parameter="method")
    assert info.value.name == "method" and info.value.accepted == ACCEPTED


def test_budget_and_calibration_take_names() -> None:
    budget = Budget(epsilon=1.0, delta=1e-5, accountant="rdp")
    budget.spend(GaussianEvent(5.0))
    assert 0 < budget.spent[0] <= 1.0
    with pytest.raises(InvalidParameterError) as info:
        Budget(epsilon=1.0, accountant="moments")
    assert info.value.name == "accountant"
    by_name = calibrate_noise_multiplier(epsilon=1.0, delta=1e-5, accountant="rdp")
    by_class = calibrate_noise_multiplier(epsilon=1.0, delta=1e-5, accountant=RDPAccountant)
    assert by_name == by_class


def test_calibration_names_epsilon_and_delta_in_errors() -> None:
    with pytest.raises(InvalidParameterError) as info:
        calibrate_noise_multiplier(epsilon=0.0, delta=1e-5, accountant=RDPAccountant)
    assert info.value.name == "epsilon"
    with pytest.raises(InvalidParameterError) as info:
        calibrate_noise_multiplier(epsilon=1.0, delta=0.0, accountant=RDPAccountant)
    assert info.value.name == "delta"


# ------------------------------------------------------------------------------ the base class


@pytest.mark.parametrize("cls", ALL)
def test_every_accountant_derives_from_the_base_class(cls: type) -> None:
    assert issubclass(cls, Accountant) and Accountant in cls.__mro__
    assert isinstance(cls(), Accountant)


def test_a_duck_typed_accountant_is_still_an_accountant() -> None:
    class Duck:
        def supports(self, event):
            return True  # noqa: E704

        def compose(self, event, count=1):
            return self  # noqa: E704

        def get_epsilon(self, delta):
            return 0.0  # noqa: E704

        def get_delta(self, epsilon):
            return 0.0  # noqa: E704

    class NotQuite:
        def compose(self, event, count=1):
            return self  # noqa: E704

    assert isinstance(Duck(), Accountant) and not isinstance(NotQuite(), Accountant)
    with pytest.raises(TypeError):
        Accountant()  # type: ignore[abstract]


@pytest.mark.parametrize("cls", ALL)
def test_compose_records_nothing_when_a_nested_event_is_refused(cls: type) -> None:
    acc = cls().compose(PureDPEvent(0.5))
    before = acc.get_delta(1.0), acc.get_epsilon(1e-6)
    bad = ComposedEvent([PureDPEvent(0.25), SelfComposedEvent(ComposedEvent([PureDPEvent(0.1), "not an event"]), 3)])
    assert not acc.supports(bad)
    with pytest.raises(InvalidParameterError):
        acc.compose(bad)
    for count in (0, -1, 1.5, True):
        with pytest.raises(InvalidParameterError) as info:
            acc.compose(PureDPEvent(0.5), count=count)
        assert info.value.name == "count"
    assert (acc.get_delta(1.0), acc.get_epsilon(1e-6)) == before


@pytest.mark.parametrize("cls", ALL)
def test_count_and_self_composition_agree(cls: type) -> None:
    a = cls().compose(LaplaceEvent(2.0), count=6)
    b = cls().compose(SelfComposedEvent(ComposedEvent([LaplaceEvent(2.0)] * 2), 3))
    assert a.get_epsilon(1e-6) == b.get_epsilon(1e-6)


# ------------------------------------------------------------------------------ the walker


def test_leaves_and_fold_walk_in_order() -> None:
    a, b, c = PureDPEvent(0.1), PureDPEvent(0.2), PureDPEvent(0.3)
    tree = ComposedEvent([a, SelfComposedEvent(ComposedEvent([b, c]), 2), ComposedEvent([])])
    assert list(leaves(tree, 3)) == [(a, 3), (b, 6), (c, 6)]
    seen: list[object] = []
    total = fold(tree, lambda e: seen.append(e) or 1, zero=int, add=lambda x, y: x + y, scale=lambda n, x: n * x)
    assert total == 5 and seen == [a, b, c]
    with pytest.raises(LookupError):
        fold(tree, lambda e: 1, zero=int, add=lambda x, y: x + y, scale=lambda n, x: n * x, empty=lambda e: {}["x"])


# ------------------------------------------------------------------------------ ε = 0


@pytest.mark.parametrize("cls", ALL)
def test_epsilon_zero_is_valid_and_free_before_any_spend(cls: type) -> None:
    acc = cls()
    assert acc.get_delta(0.0) == 0.0 and acc.get_delta(0) == 0.0
    assert acc.get_epsilon(0.0) == 0.0


@pytest.mark.parametrize("cls", ALL)
def test_delta_at_epsilon_zero_is_a_sound_upper_bound(cls: type) -> None:
    # δ(0) of a pure ε-DP mechanism is at least the total variation distance of randomized
    # response's output pair, (e^ε − 1)/(e^ε + 1), which is ε-DP (Kairouz, Oh & Viswanath 2015).
    acc = cls().compose(PureDPEvent(1.0))
    tv = math.expm1(1.0) / (math.e + 1.0)
    d = acc.get_delta(0.0)
    assert tv * (1 - 1e-9) <= d <= 1.0
    for bad in (-1e-9, -1.0, math.nan, math.inf, "0"):
        with pytest.raises(InvalidParameterError):
            acc.get_delta(bad)


@pytest.mark.parametrize("cls", [RDPAccountant, ZCDPAccountant, PLDAccountant])
def test_delta_at_epsilon_zero_of_a_gaussian_is_sound(cls: type) -> None:
    # δ(0) of N(0, σ²) vs N(1, σ²) is their total variation distance, 2Φ(1/(2σ)) − 1.
    acc = cls().compose(GaussianEvent(2.0), count=3)
    sigma = 2.0 / math.sqrt(3)
    exact = 2 * norm.cdf(1 / (2 * sigma)) - 1
    assert exact * (1 - 1e-9) <= acc.get_delta(0.0) <= 1.0


# ------------------------------------------------------------------------------ import cost


def test_importing_accounting_does_not_load_scipy_signal() -> None:
    code = "import sys, dpkit.accounting; assert 'scipy.signal' not in sys.modules, 'scipy.signal loaded'"
    subprocess.run([sys.executable, "-c", code], check=True)
