"""Noise calibration: the smallest noise multiplier that meets a target (ε, δ).

Every answer is re-checked with the accountant before it is returned (a rule that comes from
Opacus #346, where a calibration returned a σ that missed its target).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable

from dpkit import _validate as v
from dpkit.accounting.accountant import Accountant
from dpkit.accounting.events import DPEvent, GaussianEvent, PoissonSampledEvent, SelfComposedEvent
from dpkit.accounting.registry import resolve_accountant
from dpkit.errors import DPError, InvalidParameterError

__all__ = ["calibrate_noise_multiplier", "dp_sgd_event"]

#: What ``accountant=`` may be: a registry name, an accountant class, or a factory.
AccountantSpec = str | type[Accountant] | Callable[[], Accountant]


def _renamed(name: str, value: float | None, old: str, old_value: float | None) -> tuple[str, float | None]:
    """The value of a parameter that may still be passed under its deprecated name ``old``,
    with the name errors should use (the one the caller wrote)."""
    if old_value is None:
        return name, value
    if value is not None:
        raise InvalidParameterError(old, old_value, f"omitted when {name} is given ({old} is its deprecated spelling)")
    warnings.warn(f"{old}= is deprecated; use {name}=", DeprecationWarning, stacklevel=3)
    return old, old_value


def dp_sgd_event(noise_multiplier: float, sample_rate: float, steps: int) -> DPEvent:
    """The event of ``steps`` DP-SGD steps: Poisson sampling at ``sample_rate`` of a Gaussian
    with σ = noise_multiplier × clipping norm (Abadi et al. 2016)."""
    inner: DPEvent = GaussianEvent(noise_multiplier)
    if sample_rate < 1:
        inner = PoissonSampledEvent(sample_rate, inner)
    return SelfComposedEvent(inner, steps)


def calibrate_noise_multiplier(
    *,
    epsilon: float | None = None,
    delta: float | None = None,
    accountant: AccountantSpec,
    event_for: Callable[[float], DPEvent] | None = None,
    sample_rate: float = 1.0,
    steps: int = 1,
    tolerance: float = 0.005,
    **renamed: float,
) -> float:
    """The smallest σ (within ``tolerance`` relative, rounded up) whose event meets the target.

    ``epsilon`` and ``delta`` are the target guarantee. ``event_for(σ)`` builds the event to
    price (default: :func:`dp_sgd_event` with ``sample_rate`` and ``steps``); ``accountant`` is a
    registry name (``"rdp"``, ``"pld"``, ``"zcdp"``, ``"basic"``), an accountant
    class, or a zero-argument factory (see :func:`~dpkit.accounting.resolve_accountant`). The
    search is a bisection on σ, over which ε is non-increasing; the returned σ has been checked:
    ``accountant().compose(event_for(σ)).get_epsilon(delta) <= epsilon``.

    ``target_epsilon`` / ``target_delta`` are deprecated spellings of ``epsilon`` / ``delta``
    (they still work, with a :class:`DeprecationWarning`; errors then name the old spelling).

    >>> sigma = calibrate_noise_multiplier(epsilon=1.0, delta=1e-5, accountant="rdp")
    >>> round(sigma, 1)
    4.0
    """
    # The deprecated spellings stay out of the signature (docs/glossary.md), as Python would
    # refuse any other unexpected keyword.
    unknown = sorted(set(renamed) - {"target_epsilon", "target_delta"})
    if unknown:
        raise TypeError(f"calibrate_noise_multiplier() got an unexpected keyword argument {unknown[0]!r}")
    eps_name, epsilon = _renamed("epsilon", epsilon, "target_epsilon", renamed.get("target_epsilon"))
    delta_name, delta = _renamed("delta", delta, "target_delta", renamed.get("target_delta"))
    target = v.epsilon(epsilon, eps_name)
    delta = v.delta(delta, delta_name, allow_zero=False)
    accountant = resolve_accountant(accountant)
    if not (isinstance(tolerance, float) and 0 < tolerance < 0.5):
        raise InvalidParameterError("tolerance", tolerance, "a float in (0, 0.5)")
    if event_for is None:
        rate = v.probability(sample_rate, "sample_rate", high_open=False)
        count = v.positive_int(steps, "steps")
        event_for = lambda sigma: dp_sgd_event(sigma, rate, count)  # noqa: E731

    def epsilon_at(sigma: float) -> float:
        eps = accountant().compose(event_for(sigma)).get_epsilon(delta)
        return eps if math.isfinite(eps) else math.inf

    lo, hi = 1e-3, 1.0
    while epsilon_at(hi) > target:
        lo, hi = hi, hi * 2.0
        if hi > 1e6:
            raise InvalidParameterError(eps_name, target, "a value some σ <= 1e6 can meet with this δ")
    while lo > 1e-6 and epsilon_at(lo) <= target:
        hi, lo = lo, lo / 2.0
    while hi - lo > tolerance * hi / 2:
        mid = 0.5 * (lo + hi)
        if epsilon_at(mid) <= target:
            hi = mid
        else:
            lo = mid
    if epsilon_at(hi) > target:  # re-check the answer before returning it
        raise DPError("noise calibration missed its target on re-check")  # pragma: no cover
    return hi
