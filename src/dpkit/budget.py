"""An in-memory privacy filter: a budget that refuses any spend that would exceed it.

``Budget(epsilon=1.0, delta=1e-6)`` holds an (ε, δ) budget and the events spent against it. A
spend is priced *before* it is recorded: a fresh accountant composes every event spent so far and
then the new one, and the spend is accepted only if that accountant proves ε <= the budget at the
budget's δ. Check and record happen in one critical section under a lock, so concurrent spends
from many threads can never overshoot (validate, price, debit atomically, then sample: nothing
is drawn before the budget is paid).

Pricing the whole history with the chosen accountant makes the budget a *privacy filter*: with an
adaptive sequence of mechanisms, stopping as soon as the next one would exceed the budget keeps
the whole interaction (ε, δ)-DP — for basic composition this is immediate (the ε's and δ's add);
for RDP / zCDP filters see Feldman & Zrnic 2021 (*Individual Privacy Accounting via a Rényi
Filter*) and Whitehouse, Ramdas, Rogers & Wu 2023 (*Fully-Adaptive Composition in DP*). PLD
accounting over an adaptively chosen sequence is not covered by those theorems; use it with a
sequence fixed in advance.

The default accountant is basic composition with exact :class:`~fractions.Fraction` sums
(:class:`dpkit.accounting.composition.BasicAccountant`).
Pass ``accountant=dpkit.accounting.RDPAccountant`` (or ``PLDAccountant``) for Gaussian noise and
subsampled events.

Exact decimal amounts: every ε is read as the decimal number it prints as — the budget's, and
the one each mechanism calibrates its noise to and records in its event (0.1 is exactly 1/10,
not the double 0.1000000000000000055...). Budgets compare exactly, with the exact total of basic
composition, so a budget of ε = 1.0 pays for exactly ten spends of ``Laplace(epsilon=0.1)`` and
a hundred of ε = 0.01. Accountants that work in floating point (RDP, zCDP, PLD) round their ε up,
and that bound is compared at its exact binary value. ``remaining`` is rounded down.

>>> from dpkit.accounting import LaplaceEvent
>>> budget = Budget(epsilon=1.0)
>>> budget.spend(LaplaceEvent(noise_multiplier=4))
>>> budget.spend(LaplaceEvent(noise_multiplier=2))
>>> budget.spent, budget.remaining
((0.75, 0.0), 0.25)
>>> budget.can_spend(LaplaceEvent(noise_multiplier=2))
False
>>> tenth = Budget(epsilon=1.0)
>>> for _ in range(10):
...     tenth.spend(LaplaceEvent.for_epsilon(0.1))
>>> tenth.remaining
0.0
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from fractions import Fraction
from numbers import Rational, Real

from dpkit import _validate as v
from dpkit._validate import short_repr as _short
from dpkit.accounting.accountant import Accountant
from dpkit.accounting.composition import BasicAccountant
from dpkit.accounting.events import DPEvent, SelfComposedEvent
from dpkit.accounting.registry import resolve_accountant
from dpkit.accounting.rounding import to_decimal_down, to_decimal_up, to_float_down
from dpkit.errors import BudgetExceededError, DPError, InvalidParameterError

__all__ = ["Budget"]


def _describe(event: DPEvent) -> str:
    """A short name for an event in messages: its type and, where it has one, its ε."""
    eps = getattr(event, "epsilon", None)
    return f"{type(event).__name__}(ε={eps:.6g})" if isinstance(eps, float) else _short(event)


# ================================================================================================
# Budget
# ================================================================================================


def _as_budget_float(value: float | Rational) -> float:
    """A validated budget parameter as a double, rounded down when it is an exact number (such as
    Fraction(1, 3)) that no double equals: a budget may be understated, never overstated."""
    return value if isinstance(value, float) else to_float_down(Fraction(value))


def _exact_epsilon(acc: Accountant, delta: float, eps: float) -> tuple[Fraction | None, float]:
    """The accountant's ε at ``delta`` as an exact fraction (None: unbounded), and the double
    that shows it. Where the accountant keeps an exact total (basic composition), that total,
    shown at its decimal value (7/10 as 0.7); else its float answer ``eps``, an upper bound
    rounded up, at its exact binary value and shown as it is."""
    exact = getattr(acc, "_exact_epsilon", None)
    if callable(exact):
        value = exact(delta)
        if value is None:
            return None, eps
        if isinstance(value, Fraction):
            return value, to_decimal_up(value)
    return (Fraction(eps) if math.isfinite(eps) else None), eps


class Budget:
    """An in-memory (ε, δ) privacy filter, safe to share between threads.

    Parameters (keyword-only, frozen after construction)
    -----------------------------------------------------
    epsilon:
        The total ε allowed, a finite number > 0.
    delta:
        The δ at which ε is measured, in [0, 1). Default 0 (pure DP).
    accountant:
        A zero-argument callable returning a *fresh* accountant (a class such as
        ``dpkit.accounting.RDPAccountant``, or a ``functools.partial``), or a registry name
        (``"basic"``, ``"rdp"``, ``"zcdp"``, ``"pld"``; see
        :func:`dpkit.accounting.resolve_accountant`). Default: basic
        composition (ε's and δ's add, exactly), which supports pure and approximate DP events
        but not Gaussian noise or subsampling.

    Every :meth:`spend` prices the whole history plus the new event with a fresh accountant and
    records the event only if the accountant proves ε <= ``epsilon`` at ``delta``; otherwise it
    raises :class:`~dpkit.errors.BudgetExceededError` and records nothing. Spending can only make
    the spent ε grow: a negative, NaN or infinite cost cannot be written as an event, and
    :attr:`spent` never decreases even if an accountant's answer does.

    >>> from dpkit.accounting import PureDPEvent
    >>> b = Budget(epsilon=1.0)
    >>> b.spend(PureDPEvent(0.5), count=2)
    >>> b.remaining
    0.0
    >>> b.spend(PureDPEvent(0.5))
    Traceback (most recent call last):
    ...
    dpkit.errors.BudgetExceededError: privacy budget exceeded: requested PureDPEvent(ε=0.5), which would bring the total to ε=1.5 at δ=0.0 against a budget of ε=1.0, remaining ε=0.0 of ε=1.0 (δ=0.0)
    """

    __slots__ = (
        "_epsilon",
        "_epsilon_exact",
        "_delta",
        "_factory",
        "_lock",
        "_runs",
        "_n",
        "_spent_epsilon",
        "_spent_exact",
        "_spent_delta",
    )
    _epsilon: float
    _epsilon_exact: Fraction
    _delta: float
    _factory: Callable[[], Accountant]
    _lock: threading.Lock
    _runs: tuple[tuple[DPEvent, int], ...]
    _n: int
    _spent_epsilon: float
    _spent_exact: Fraction
    _spent_delta: float

    def __init__(
        self,
        *,
        epsilon: float,
        delta: float = 0.0,
        accountant: str | Callable[[], Accountant] | None = None,
    ) -> None:
        v.epsilon(epsilon)
        v.delta(delta)
        # the limit at its decimal value (1.0 is 1, 0.3 is 3/10), as every ε is read
        exact = v.exact_amount("epsilon", epsilon, positive=True, decimal=True)
        object.__setattr__(self, "_epsilon_exact", exact)
        object.__setattr__(self, "_epsilon", epsilon if isinstance(epsilon, float) else to_decimal_down(exact))
        object.__setattr__(self, "_delta", _as_budget_float(delta))
        object.__setattr__(self, "_factory", self._check_factory(accountant))
        object.__setattr__(self, "_lock", threading.Lock())
        # The history as runs of identical consecutive events: composing (event, k) is k
        # adaptive repetitions of event, so pricing costs one compose per run, not per spend.
        object.__setattr__(self, "_runs", ())
        object.__setattr__(self, "_n", 0)
        object.__setattr__(self, "_spent_epsilon", 0.0)
        object.__setattr__(self, "_spent_exact", Fraction(0))
        object.__setattr__(self, "_spent_delta", 0.0)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"Budget is frozen: cannot set {name!r}; spend through Budget.spend")

    @staticmethod
    def _check_factory(accountant: object) -> Callable[[], Accountant]:
        if accountant is None:
            return BasicAccountant
        if isinstance(accountant, str):  # a registry name: "basic", "rdp", "zcdp" or "pld"
            return resolve_accountant(accountant)
        if not isinstance(accountant, type) and isinstance(accountant, Accountant):
            raise InvalidParameterError(
                "accountant",
                _short(accountant),
                "a class or zero-argument callable that returns a fresh accountant (e.g. accountant=dpkit.accounting.RDPAccountant)",
                "an accountant instance carries its events with it; the budget builds a fresh one for every spend",
            )
        if not callable(accountant):
            raise InvalidParameterError(
                "accountant", _short(accountant), "a class or zero-argument callable that returns a fresh accountant"
            )
        try:
            probe = accountant()
        except Exception as exc:
            raise InvalidParameterError(
                "accountant",
                _short(accountant),
                "a zero-argument callable that returns a fresh accountant",
                f"calling it raised {exc!r}",
            ) from exc
        if not isinstance(probe, Accountant):
            raise InvalidParameterError(
                "accountant",
                _short(accountant),
                "a callable returning an object with supports, compose, get_epsilon and get_delta",
                f"it returned {_short(probe, 80)}",
            )
        return accountant

    # -- read-only configuration and state ----------------------------------------------------

    @property
    def epsilon(self) -> float:
        """The total ε allowed."""
        return self._epsilon

    @property
    def delta(self) -> float:
        """The δ at which ε is measured."""
        return self._delta

    @property
    def spent(self) -> tuple[float, float]:
        """(ε, δ) spent so far: the accountant's ε at the budget's δ (rounded up), with the
        accountant's δ at that ε, capped at the budget's δ. (0.0, 0.0) before any spend."""
        with self._lock:
            return self._spent_epsilon, self._spent_delta

    @property
    def remaining(self) -> float:
        """ε left: budget ε − spent ε (exactly, at decimal values), rounded down, never below 0."""
        with self._lock:
            spent = self._spent_exact
        return max(0.0, to_decimal_down(self._epsilon_exact - spent))

    @property
    def events(self) -> tuple[DPEvent, ...]:
        """Every event spent, in order (``spend(e, count=k)`` with k > 1 is recorded as
        ``SelfComposedEvent(e, k)``)."""
        with self._lock:
            runs = self._runs
        return tuple(event for event, k in runs for _ in range(k))

    # -- spending -------------------------------------------------------------------------------

    def spend(self, event: DPEvent, *, count: int = 1) -> None:
        """Record ``count`` adaptive repetitions of ``event``, or raise and record nothing.

        Raises :class:`~dpkit.errors.InvalidParameterError` for anything that is not a
        :class:`~dpkit.accounting.DPEvent`, a ``count`` that is not an integer >= 1, or an event
        the accountant cannot account for; :class:`~dpkit.errors.BudgetExceededError` when the
        accountant cannot prove the new total within the budget (including when it fails, or
        answers with inf, NaN or a negative ε).
        """
        recorded = self._validate(event, count)
        with self._lock:
            runs = self._append(self._runs, recorded)
            acc, eps, exact, shown = self._price(runs, recorded)
            if exact is None or not exact <= self._epsilon_exact:
                raise self._exceeded(recorded, eps)
            spent_exact = max(self._spent_exact, exact)
            spent_eps = max(self._spent_epsilon, shown)
            spent_delta = max(self._spent_delta, self._delta_at(acc, eps))
            # Nothing below can raise: record.
            object.__setattr__(self, "_runs", runs)
            object.__setattr__(self, "_n", self._n + 1)
            object.__setattr__(self, "_spent_epsilon", spent_eps)
            object.__setattr__(self, "_spent_exact", spent_exact)
            object.__setattr__(self, "_spent_delta", spent_delta)

    def can_spend(self, event: DPEvent, *, count: int = 1) -> bool:
        """Whether :meth:`spend` would accept ``event`` now (a dry run: nothing is recorded).

        Invalid or unsupported events raise as in :meth:`spend`; a spend the budget would refuse
        returns False. Another thread may spend in between, so use :meth:`spend` (and catch
        :class:`~dpkit.errors.BudgetExceededError`) to actually pay.
        """
        recorded = self._validate(event, count)
        with self._lock:
            runs = self._append(self._runs, recorded)
        try:
            _, _, exact, _ = self._price(runs, recorded)
        except BudgetExceededError:
            return False
        return exact is not None and exact <= self._epsilon_exact

    # -- internals --------------------------------------------------------------------------------

    @staticmethod
    def _validate(event: object, count: object) -> DPEvent:
        if not isinstance(event, DPEvent):
            raise InvalidParameterError(
                "event",
                _short(event),
                "a dpkit.accounting.DPEvent (e.g. LaplaceEvent(noise_multiplier=...))",
                "a budget is spent by describing the mechanism, never by a bare number",
            )
        k = v.positive_int(count, "count")
        if isinstance(event, SelfComposedEvent):
            v.positive_int(event.count, "count")  # re-checked: frozen dataclasses can be forced
        return event if k == 1 else SelfComposedEvent(event, k)

    @staticmethod
    def _append(runs: tuple[tuple[DPEvent, int], ...], event: DPEvent) -> tuple[tuple[DPEvent, int], ...]:
        if runs and runs[-1][0] == event:
            return runs[:-1] + ((runs[-1][0], runs[-1][1] + 1),)
        return runs + ((event, 1),)

    def _price(
        self, runs: tuple[tuple[DPEvent, int], ...], event: DPEvent
    ) -> tuple[Accountant, float, Fraction | None, float]:
        """A fresh accountant holding the whole history, and its ε at the budget's δ: rounded up,
        exact and as shown (:func:`_exact_epsilon`).

        Errors from dpkit (unsupported event, neighbour mismatch) pass through unchanged; any
        other failure of the accountant, or an answer that is not a number >= 0, refuses the
        spend with :class:`BudgetExceededError`."""
        try:
            acc = self._factory()
            for past, k in runs:
                if k == 1:
                    acc.compose(past)
                else:
                    acc.compose(past, count=k)
            eps = acc.get_epsilon(self._delta)
        except DPError:
            raise
        except Exception as exc:
            raise BudgetExceededError(
                f"{_short(event)}, which the accountant could not price ({exc!r})",
                self._remaining_text(),
            ) from exc
        if not (isinstance(eps, Real) and not isinstance(eps, bool) and not math.isnan(eps) and eps >= 0):
            raise BudgetExceededError(
                f"{_short(event)}, for which the accountant answered ε={eps!r} (not a number >= 0)",
                self._remaining_text(),
            )
        try:
            exact, shown = _exact_epsilon(acc, self._delta, float(eps))
        except Exception as exc:  # a duck-typed accountant's own failure
            raise BudgetExceededError(
                f"{_short(event)}, which the accountant could not price ({exc!r})", self._remaining_text()
            ) from exc
        return acc, float(eps), exact, shown

    def _delta_at(self, acc: Accountant, eps: float) -> float:
        """The accountant's δ at ``eps``, capped at the budget's δ (the budget's δ if it fails)."""
        try:
            d = acc.get_delta(eps)
        except Exception:
            return self._delta
        if isinstance(d, Real) and not isinstance(d, bool) and 0 <= d <= self._delta:
            return float(d)
        return self._delta

    def _remaining_text(self) -> str:
        remaining = max(0.0, to_decimal_down(self._epsilon_exact - self._spent_exact))
        return f"ε={remaining!r} of ε={self._epsilon!r} (δ={self._delta!r})"

    def _exceeded(self, event: DPEvent, eps: float) -> BudgetExceededError:
        return BudgetExceededError(
            f"{_describe(event)}, which would bring the total to ε={eps!r} at δ={self._delta!r} "
            f"against a budget of ε={self._epsilon!r}",
            self._remaining_text(),
        )

    def __repr__(self) -> str:
        eps, dlt = self.spent
        return f"Budget(epsilon={self._epsilon!r}, delta={self._delta!r}, spent=({eps!r}, {dlt!r}), events={self._n})"
