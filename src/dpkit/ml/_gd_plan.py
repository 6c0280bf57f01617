"""The plan of a noisy gradient descent, fixed before the budget is debited and before anything
random is drawn: the training's DP event, the accountant, and :func:`plan_training`, which fixes
the sampling rate q, the steps T, the clipping norm C, the step size η and the noise multiplier z
(calibrated to ε when ε is given) in a :class:`TrainingPlan` (private module: its names may change).

The algorithm, its guarantee and the noise's lattice arithmetic are described in
:mod:`dpkit.ml._noisy_gd`, which runs the plan (``train``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dpkit import _validate as v
from dpkit._validate import Neighbours
from dpkit.accounting.calibration import calibrate_noise_multiplier
from dpkit.accounting.events import ComposedEvent, DPEvent, GaussianEvent, PoissonSampledEvent, SelfComposedEvent
from dpkit.accounting.registry import resolve_accountant
from dpkit.errors import DPError, InvalidParameterError
from dpkit.mechanisms.gaussian import GaussianNoisePlan, gaussian_noise_plan
from dpkit.ml._glm_gradients import GLMLoss
from dpkit.noise.lattice import DELTA_MARGIN

__all__ = [
    "COUNT_SHARE",
    "DEFAULT_EPOCHS",
    "DEFAULT_STEPS",
    "SUPPORTED_ACCOUNTANTS",
    "TrainingPlan",
    "accountant_factory",
    "count_noise_multiplier",
    "plan_training",
    "training_event",
]

# δ is calibrated at δ·DELTA_MARGIN = δ·(1 − 2^-20), as in dpkit.Gaussian (the lattice's discrete
# Gaussian vs the continuous curve); DELTA_MARGIN is dpkit.noise.lattice's, imported above.

#: For small q the count costs about 1/COUNT_SHARE of the training's Rényi divergence.
COUNT_SHARE = 20.0
#: Defaults: full-batch steps, and epochs when Poisson sampling.
DEFAULT_STEPS = 400
DEFAULT_EPOCHS = 10.0


# ------------------------------------------------------------------------------------------------
# Noise plans and events
# ------------------------------------------------------------------------------------------------


def count_noise_multiplier(noise_multiplier: float, sample_rate: float, steps: int) -> float:
    """z_c = z·max(1, √(20/T)/(2q)) (see the docstring of :mod:`dpkit.ml._noisy_gd`)."""
    return noise_multiplier * max(1.0, math.sqrt(COUNT_SHARE / steps) / (2.0 * sample_rate))


def _replace_with_sampling(sample_rate: float) -> InvalidParameterError:
    return InvalidParameterError(
        "neighbours",
        "replace",
        "'add_remove' when sampling (sample_rate < 1)",
        f"Poisson subsampling amplification (Mironov, Talwar & Zhang 2019) is proved for add/remove neighbours "
        f"only, and the sampling rate here is {sample_rate!r}; use neighbours='add_remove' or the full batch",
    )


def training_event(
    noise_multiplier: float, sample_rate: float, steps: int, neighbours: Neighbours = "add_remove"
) -> DPEvent:
    """The event of a whole training (see the docstring of :mod:`dpkit.ml._noisy_gd`)."""
    if neighbours == "replace":
        if sample_rate < 1:
            raise _replace_with_sampling(sample_rate)
        return SelfComposedEvent(GaussianEvent(noise_multiplier, neighbours="replace"), steps)
    step: DPEvent = GaussianEvent(noise_multiplier)
    if sample_rate < 1:
        step = PoissonSampledEvent(sample_rate, step)
    count = GaussianEvent(count_noise_multiplier(noise_multiplier, sample_rate, steps))
    return ComposedEvent((count, SelfComposedEvent(step, steps)))


#: The registry names a fit accepts: the accountants that price Poisson-subsampled Gaussian steps.
SUPPORTED_ACCOUNTANTS: tuple[str, ...] = ("rdp", "pld")


def accountant_factory(name: object, neighbours: Neighbours) -> Callable[[], Any]:
    """A fresh-accountant factory for ``"rdp"`` or ``"pld"`` under ``neighbours``, from
    :func:`dpkit.accounting.registry.resolve_accountant` (one name → class map for dpkit)."""
    if not isinstance(name, str) or name not in SUPPORTED_ACCOUNTANTS:
        raise InvalidParameterError("accountant", name, "'rdp' or 'pld'")
    return resolve_accountant(name, neighbours=neighbours)


# ------------------------------------------------------------------------------------------------
# The plan: everything fixed before the budget is debited
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TrainingPlan:
    """Everything a training does, fixed before any randomness is drawn.

    ``sum_noise`` is exactly the noise added to each gradient sum (``n_params × n_outputs``
    coordinates), ``count_noise`` that of the row count (None under replace); ``event`` is what
    is debited and ``epsilon`` what the accountant proves for it at ``delta``·(1 − 2^-20).
    """

    steps: int
    sample_rate: float
    noise_multiplier: float
    count_noise_multiplier: float | None
    max_grad_norm: float
    sensitivity: float
    neighbours: Neighbours
    learning_rate: float
    momentum: float
    tail_average: float
    l2: float
    n_params: int
    n_outputs: int
    fit_intercept: bool
    sum_noise: GaussianNoisePlan
    count_noise: GaussianNoisePlan | None
    event: DPEvent
    epsilon: float
    delta: float
    accountant: str


def plan_training(
    *,
    n_rows: int,
    n_params: int,
    n_outputs: int,
    loss: GLMLoss,
    row_bound: float,
    fit_intercept: bool,
    epsilon: float | None,
    delta: float,
    noise_multiplier: float | None,
    neighbours: Neighbours,
    accountant: str,
    max_grad_norm: float | None,
    default_grad_norm: float | None = None,
    steps: int | None = None,
    epochs: float | None = None,
    batch_size: int | None = None,
    sample_rate: float | None = None,
    learning_rate: float | None = None,
    momentum: float = 0.95,
    tail_average: float = 0.5,
    l2: float = 0.0,
) -> TrainingPlan:
    """Fix q, T, C, z, η and the event, calibrating z to ε when ε is given (nothing random).

    ``row_bound`` is R̃, the bound on ‖x̃‖₂ of the augmented rows. The default step size is
    1/(smoothness·R̃² + λ) — 1/(smoothness constant) of the average loss — times L·R̃/C when
    gradients are clipped below their bound L·R̃, so that the largest possible step is the same.
    """
    # Sampling rate.
    if batch_size is not None and sample_rate is not None:
        raise InvalidParameterError("batch_size", batch_size, "None when sample_rate is given", "give one of the two")
    if batch_size is not None:
        q = min(1.0, v.positive_int(batch_size, "batch_size") / n_rows)
    elif sample_rate is not None:
        q = v.probability(sample_rate, "sample_rate", high_open=False)
    else:
        q = 1.0
    if neighbours == "replace" and q < 1:
        raise _replace_with_sampling(q)
    # Number of steps.
    if steps is not None and epochs is not None:
        raise InvalidParameterError("steps", steps, "None when epochs is given", "give one of the two")
    if steps is not None:
        T = v.positive_int(steps, "steps")
    else:
        e = DEFAULT_EPOCHS if epochs is None and q < 1 else epochs
        T = DEFAULT_STEPS if e is None else max(1, math.ceil(v.positive(e, "epochs") / q - 1e-9))
    # Clipping norm and sensitivity.
    bound = None if loss.lipschitz is None else loss.lipschitz * row_bound
    if max_grad_norm is None:
        C = bound if bound is not None else default_grad_norm
        if C is None:  # pragma: no cover - the estimators always pass a default
            raise InvalidParameterError("max_grad_norm", None, "a finite number > 0")
    else:
        C = v.positive(max_grad_norm, "max_grad_norm")
        if bound is not None:
            C = min(C, bound)
    sensitivity = 2.0 * C if neighbours == "replace" else C
    # Step size.
    if learning_rate is None:
        natural = bound if bound is not None else (default_grad_norm or C)
        eta = max(1.0, natural / C) / (loss.smoothness * row_bound * row_bound + l2)
    else:
        eta = v.positive(learning_rate, "learning_rate")
    # Noise multiplier and event.
    factory = accountant_factory(accountant, neighbours)
    cal_delta = delta * DELTA_MARGIN
    if noise_multiplier is None:
        if epsilon is None:  # pragma: no cover - validated by the estimators
            raise InvalidParameterError("epsilon", epsilon, "a finite number > 0")
        z = calibrate_noise_multiplier(
            epsilon=epsilon,
            delta=cal_delta,
            accountant=factory,
            event_for=lambda s: training_event(s, q, T, neighbours),
        )
    else:
        z = noise_multiplier
    event = training_event(z, q, T, neighbours)
    proved = float(factory().compose(event).get_epsilon(cal_delta))
    if epsilon is not None and not proved <= epsilon:  # re-check before anything is spent (Opacus #346)
        raise DPError(
            f"noise calibration missed its target on re-check: ε={proved!r} > {epsilon!r}"
        )  # pragma: no cover
    sum_noise = gaussian_noise_plan(z, sensitivity, n_params * n_outputs)
    zc: float | None = None
    count_noise: GaussianNoisePlan | None = None
    if neighbours == "add_remove":
        z_count = count_noise_multiplier(z, q, T)
        zc, count_noise = z_count, gaussian_noise_plan(z_count, 1.0, 1)
    return TrainingPlan(
        steps=T,
        sample_rate=q,
        noise_multiplier=z,
        count_noise_multiplier=zc,
        max_grad_norm=C,
        sensitivity=sensitivity,
        neighbours=neighbours,
        learning_rate=float(eta),
        momentum=momentum,
        tail_average=tail_average,
        l2=l2,
        n_params=n_params,
        n_outputs=n_outputs,
        fit_intercept=fit_intercept,
        sum_noise=sum_noise,
        count_noise=count_noise,
        event=event,
        epsilon=proved,
        delta=delta,
        accountant=accountant,
    )
