"""Noise calibration: the smallest noise multiplier that meets a target (ε, δ).

Every answer is re-checked with the accountant before it is returned (a rule that comes from
Opacus #346, where a calibration returned a σ that missed its target).
"""

from __future__ import annotations

import math
from collections.abc import Callable

from dpkit import _validate as v
from dpkit.accounting.accountant import Accountant
from dpkit.accounting.events import DPEvent, GaussianEvent, PoissonSampledEvent, SelfComposedEvent
from dpkit.accounting.registry import resolve_accountant
from dpkit.errors import DPError, InvalidParameterError

__all__ = ["calibrate_noise_multiplier", "dp_sgd_event"]

#: What ``accountant=`` may be: a registry name, an accountant class, or a factory.
AccountantSpec = str | type[Accountant] | Callable[[], Accountant]


def dp_sgd_event(noise_multiplier: float, sample_rate: float, steps: int) -> DPEvent:
    """The event of ``steps`` DP-SGD steps: Poisson sampling at ``sample_rate`` of a Gaussian
    with σ = noise_multiplier × clipping norm (Abadi et al. 2016)."""
    inner: DPEvent = GaussianEvent(noise_multiplier)
    if sample_rate < 1:
        inner = PoissonSampledEvent(sample_rate, inner)
    return SelfComposedEvent(inner, steps)


def calibrate_noise_multiplier(
    *,
    epsilon: float,
    delta: float,
    accountant: AccountantSpec,
    event_for: Callable[[float], DPEvent] | None = None,
    sample_rate: float = 1.0,
    steps: int = 1,
    tolerance: float = 0.005,
) -> float:
    """The smallest σ (within ``tolerance`` relative, rounded up) whose event meets the target.

    ``epsilon`` and ``delta`` are the target guarantee. ``event_for(σ)`` builds the event to
    price (default: :func:`dp_sgd_event` with ``sample_rate`` and ``steps``); ``accountant`` is a
    registry name (``"rdp"``, ``"pld"``, ``"zcdp"``, ``"basic"``), an accountant
    class, or a zero-argument factory (see :func:`~dpkit.accounting.resolve_accountant`). The
    search is a bisection on σ, over which ε is non-increasing; the returned σ has been checked:
    ``accountant().compose(event_for(σ)).get_epsilon(delta) <= epsilon``.

    >>> sigma = calibrate_noise_multiplier(epsilon=1.0, delta=1e-5, accountant="rdp")
    >>> round(sigma, 1)
    4.0
    """
    target = v.epsilon(epsilon, "epsilon")
    delta = v.delta(delta, "delta", allow_zero=False)
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
            raise InvalidParameterError("epsilon", target, "a value some σ <= 1e6 can meet with this δ")
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
