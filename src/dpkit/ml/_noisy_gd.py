"""Noisy (mini-batch) gradient descent for generalised linear models — the engine of
:class:`dpkit.ml.logistic.LogisticRegression` and :class:`dpkit.ml.linear.LinearRegression`
(private module: its names may change).

The algorithm (Abadi et al. 2016; Bassily, Smith & Thakurta 2014)
--------------------------------------------------------------------------------------
Rows are first clipped to the declared ℓ2 norm R (``data_norm``); with an intercept each row is
augmented with a constant 1, so ‖x̃‖₂ <= R̃ = √(R² + 1). A GLM's per-example gradient is the outer
product x̃ ⊗ r(θᵀx̃, y) of the row and a *residual* r (σ(z) − y for the logistic loss,
softmax(z) − e_y for the multinomial loss, z − y for the squared loss), so its ℓ2 (Frobenius)
norm is ‖x̃‖₂·‖r‖₂: every per-example quantity is computed for all rows at once and the n
per-example gradients are never materialised.

Step 0 (add/remove only): a noisy row count n̂ = n + N(0, z_c²) (sensitivity 1) — "noisy sum
over noisy count": the mean gradient is a noisy sum divided by a noisy count. Then, for t = 1 … T:

1. *Sample.* Poisson sampling: each row joins the batch independently with probability q, an
   exact Bernoulli trial for the binary value of q from the secure source (``noise.bernoulli``).
   q = 1 is full-batch gradient descent.
2. *Clip.* Each per-example gradient is scaled by min(1, C / ‖g_i‖₂). When C is at least the
   loss's Lipschitz bound L·R̃ (L = 1 logistic, √2 multinomial) clipping the
   *inputs* already bounds every gradient and C is lowered to L·R̃ — the input-clipping
   variant (no per-example gradient is ever scaled).
3. *Noisy sum.* S_t = Σ_{i∈B_t} clip(g_i) + N(0, σ²I), σ = z·Δ with Δ = C under add/remove (one
   row added or removed moves the clipped sum by at most C) and Δ = 2C under replace.
4. *Step* (post-processing): ĝ = S_t/(q·n̂) + λθ_w (λ the ℓ2 penalty; the intercept is not
   penalised) and a Nesterov momentum step θ ← θ − η(β v + ĝ(θ − ηβv)), v ← βv + ĝ. The model
   returned is the mean of the last ``tail_average``·T iterates (tail averaging; Polyak &
   Juditsky 1992), or the last iterate when ``tail_average`` = 0.

The count's noise multiplier is z_c = z·max(1, √(20/T)/(2q)): for small q its Rényi divergence
is about 1/20 of the training's (Mironov, Talwar & Zhang 2019: a Poisson-subsampled Gaussian
costs ≈ 2q²α/z² at order α), for the full batch about one step's.

Guarantee
---------
The training is an adaptive composition of Gaussian mechanisms on the count and on the clipped
gradient sums (each Poisson-subsampled when q < 1), recorded as the event ::

    ComposedEvent((GaussianEvent(z_c),                                        # the count
                   SelfComposedEvent(PoissonSampledEvent(q, GaussianEvent(z)), T)))

(no Poisson wrapper when q = 1; under ``replace`` only ``SelfComposedEvent(GaussianEvent(z,
neighbours="replace"), T)``: the row count is then public). The model is post-processing of
those releases, so the fit is (ε, δ)-DP for the ε the chosen accountant proves for that event at
δ: RDP (Mironov 2017; Poisson-subsampled Gaussian: Mironov, Talwar & Zhang 2019) or PLD
(Koskela, Jälkö & Honkela 2020; Doroshenko et al. 2022). Poisson amplification is a theorem for
add/remove neighbours only, so ``replace`` is accepted only for the full batch.

When ε is given, z is the smallest multiplier (bisection, 0.5 % tolerance, rounded up) whose
event the accountant proves ε-DP at δ (``dpkit.accounting.calibrate_noise_multiplier``, which
re-checks its answer); :func:`plan_training` re-checks it once more.

Floating point (Mironov 2012): each noisy sum is released on a lattice g·ℤ (g = 2^k about 2^-40
of σ, chosen from σ and the dimension only) as g·(round(S/g) + Y), Y an exact discrete Gaussian
of parameter σ/g (Canonne, Kamath & Steinke 2020), with the arithmetic of :class:`dpkit.Gaussian`:
snapping moves neighbouring sums apart by at most Δ/g + √d lattice steps, so σ/g is z·(Δ/g + √d)
rounded up to a multiple of 2^-8, and δ is calibrated as δ·(1 − 2^-20) to cover the lattice's
O(2^-78) deviation from the continuous privacy curve.

Row count. With ``batch_size=B`` the sampling rate is q = B/n and, from ``epochs``, T = ⌈epochs/q⌉:
the number of rows n is then treated as public, as in Abadi et al. 2016, Opacus, TF Privacy and
diffprivlib. With ``sample_rate=q`` (or the full batch) only the noisy count depends on n.

Budget: :func:`train` debits the whole training's event *before* it draws anything (count,
masks, noise); a refused debit raises and nothing is sampled or fitted.

This module holds the randomised part (masks, noisy sums, the descent in :func:`train`), the input
checks and the estimators' mixin; the plan — event, accountant, calibration of z, T, q, C and η —
is in :mod:`dpkit.ml._gd_plan`; the clipped gradients are in :mod:`dpkit.ml._glm_gradients`.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from numbers import Real
from typing import Any

import numpy as np
from numpy.typing import NDArray

from dpkit import _validate as v
from dpkit._progress import ProgressBar, check_progress, shows_bar
from dpkit._validate import short_repr
from dpkit.errors import InvalidDataError, InvalidParameterError
from dpkit.mechanisms.gaussian import GaussianNoisePlan
from dpkit.ml._gd_plan import TrainingPlan, accountant_factory, plan_training
from dpkit.ml._glm_gradients import GLMLoss, augment, clip_rows, clipped_gradient_sum
from dpkit.noise.discrete import sample_discrete_gaussian
from dpkit.noise.integers import bernoulli
from dpkit.noise.lattice import add_lattice_noise, snap
from dpkit.noise.source import RandomSource, resolve_rng

__all__ = [
    "DataDependentWarning",
    "NoisyGDMixin",
    "TrainingResult",
    "check_X",
    "check_y",
    "poisson_masks",
    "release_sums",
    "train",
    "warn_data_dependent",
]

#: Largest number of noise integers (or mask entries) drawn in one call.
DRAW_BLOCK = 1 << 21
#: With ``progress=None`` a fit of at least this many steps shows a bar on an interactive
#: terminal (the default plan has 400). Decided on the plan, never on the data.
LONG_FIT_STEPS = 100


class DataDependentWarning(UserWarning):
    """Something that should be declared was read from the private data and treated as public
    (for example the label set of a classifier fitted without ``classes=``)."""


# ------------------------------------------------------------------------------------------------
# Randomised pieces (called only after the debit)
# ------------------------------------------------------------------------------------------------


def poisson_masks(sample_rate: float, n_rows: int, count: int, src: RandomSource) -> NDArray[np.bool_]:
    """``count`` independent Poisson-sampling masks over ``n_rows`` rows, shape (count, n_rows):
    each entry an exact Bernoulli(q) trial (q at its exact binary value) from ``src``."""
    return bernoulli(sample_rate, count * n_rows, rng=src).reshape(count, n_rows)


def release_sums(sums: NDArray[np.float64], plan: GaussianNoisePlan, src: RandomSource) -> NDArray[np.float64]:
    """``sums`` (any shape) released with the plan's lattice Gaussian noise, every coordinate
    independently: g·(round(s/g) + Y), Y ~ discrete Gaussian(σ/g) sampled exactly."""
    flat = np.ascontiguousarray(sums, dtype=np.float64).ravel()
    noise = sample_discrete_gaussian(plan.lattice_sigma, flat.size, src)
    return add_lattice_noise(snap(flat, plan.lattice), noise, plan.lattice).reshape(np.shape(sums))


@dataclass(frozen=True)
class TrainingResult:
    theta: NDArray[np.float64]  # (n_params, n_outputs); the intercept is the last row
    noisy_count: float | None


def train(
    plan: TrainingPlan,
    X_aug: NDArray[np.float64],
    Y: NDArray[np.float64],
    loss: GLMLoss,
    *,
    budget: Any,
    src: RandomSource,
    bar: ProgressBar | None = None,
) -> TrainingResult:
    """Debit ``plan.event`` from ``budget`` (if any), then run the noisy gradient descent.

    ``X_aug``: the clipped (and augmented) rows; ``Y``: the targets as an (n, K) array. Nothing
    random happens before the debit; a refused debit raises and draws nothing. ``bar`` (shown
    only once paid) advances once per step: its total is ``plan.steps``, fixed in advance, and it
    reads nothing computed on the data.
    """
    if budget is not None:
        budget.spend(plan.event)
    if bar is None:
        bar = ProgressBar(False, total=plan.steps, label="", unit="")
    with bar as advance:
        return _descend(plan, X_aug, Y, loss, src, advance)


def _descend(
    plan: TrainingPlan,
    X_aug: NDArray[np.float64],
    Y: NDArray[np.float64],
    loss: GLMLoss,
    src: RandomSource,
    advance: Callable[[], None],
) -> TrainingResult:
    """The descent of :func:`train`, after the debit (``advance()`` after every step)."""
    n, D = X_aug.shape
    K = plan.n_outputs
    size = D * K
    q, eta, beta, T = plan.sample_rate, plan.learning_rate, plan.momentum, plan.steps
    if plan.count_noise is not None:
        noisy_n = float(release_sums(np.array([float(n)]), plan.count_noise, src)[0])
    else:
        noisy_n = float(n)
    normaliser = max(q * noisy_n, 1.0)
    row_norms = np.linalg.norm(X_aug, axis=1)
    penalty = np.ones((D, 1))
    if plan.fit_intercept:
        penalty[-1] = 0.0
    theta = np.zeros((D, K))
    velocity = np.zeros((D, K))
    average = np.zeros((D, K))
    n_avg = 0
    average_from = T - int(round(plan.tail_average * T))
    lattice = plan.sum_noise.lattice
    per_step = size + (n if q < 1 else 0)
    block = max(1, DRAW_BLOCK // per_step)
    done = 0
    while done < T:
        m = min(block, T - done)
        noise = sample_discrete_gaussian(plan.sum_noise.lattice_sigma, m * size, src).reshape(m, size)
        masks = poisson_masks(q, n, m, src) if q < 1 else None
        for j in range(m):
            if masks is None:
                Xb, Yb, Nb = X_aug, Y, row_norms
            else:
                idx = np.flatnonzero(masks[j])
                Xb, Yb, Nb = X_aug[idx], Y[idx], row_norms[idx]
            look = theta - (eta * beta) * velocity if beta else theta  # Nesterov look-ahead
            if Xb.shape[0]:
                S = clipped_gradient_sum(Xb, loss.residual(Xb @ look, Yb), plan.max_grad_norm, Nb)
            else:
                S = np.zeros((D, K))
            noisy = add_lattice_noise(snap(S.ravel(), lattice), noise[j], lattice).reshape(D, K)
            grad = noisy / normaliser
            if plan.l2:
                grad = grad + plan.l2 * (look * penalty)
            velocity = beta * velocity + grad
            theta = theta - eta * velocity
            if done + j >= average_from:
                n_avg += 1
                average += (theta - average) / n_avg
            advance()
        done += m
    return TrainingResult(
        theta=average if n_avg else theta, noisy_count=noisy_n if plan.count_noise is not None else None
    )


# ------------------------------------------------------------------------------------------------
# Validation shared by the estimators
# ------------------------------------------------------------------------------------------------


def check_X(X: object, name: str = "X") -> NDArray[np.float64]:
    """A 2-D array of finite numbers (bools become 0/1) with at least one row and one column."""
    try:
        arr = np.asarray(X)
        if arr.dtype == bool or arr.dtype.kind == "O":
            arr = arr.astype(np.float64)
    except Exception as exc:
        raise InvalidDataError(
            name, f"cannot be read as an array of numbers ({type(exc).__name__})", "a 2-D array of numbers"
        ) from None
    if arr.dtype.kind not in "iuf":
        raise InvalidDataError(name, f"has dtype {arr.dtype}", "numbers (int, float or bool)")
    if arr.ndim != 2:
        raise InvalidDataError(
            name, f"has {arr.ndim} dimension(s) (shape {arr.shape})", "a 2-D array (n_samples, n_features)"
        )
    if arr.shape[0] < 1 or arr.shape[1] < 1:
        raise InvalidDataError(name, f"has shape {arr.shape}", "at least one row and one column")
    arr = arr.astype(np.float64, copy=False)
    if not np.isfinite(arr).all():  # refused before any budget is spent; the message quotes no value
        raise InvalidDataError(name, "holds a non-finite value", "finite numbers")
    return arr


def check_y(y: object, n_rows: int) -> NDArray[Any]:
    """A 1-D array with one entry per row of X."""
    try:
        arr = np.asarray(y)
    except Exception as exc:
        raise InvalidDataError(
            "y", f"cannot be read as an array ({type(exc).__name__})", "a 1-D array with one target per row of X"
        ) from None
    if arr.ndim != 1:
        raise InvalidDataError("y", f"has shape {arr.shape}", "a 1-D array with one target per row of X")
    if arr.shape[0] != n_rows:
        raise InvalidDataError("y", f"has {arr.shape[0]} values for {n_rows} rows of X", "one target per row of X")
    if arr.dtype.kind == "f" and not np.isfinite(arr).all():
        raise InvalidDataError("y", "holds a non-finite value", "finite values")
    return arr


def warn_data_dependent(message: str) -> None:
    warnings.warn(message, DataDependentWarning, stacklevel=4)


# ------------------------------------------------------------------------------------------------
# The shared estimator machinery
# ------------------------------------------------------------------------------------------------


class NoisyGDMixin:
    """Parameter validation, planning and training shared by the GLM estimators.

    Subclasses hold the sklearn parameters as attributes (set verbatim by ``__init__``) and call
    :meth:`_fit_glm`.
    """

    # sklearn's clone deep-copies parameters; a copied budget would be a *different* budget and
    # its spends would not debit the caller's. Clones share the budget object instead.
    def __sklearn_clone__(self) -> Any:
        from sklearn.base import clone

        params = self.get_params(deep=False)  # type: ignore[attr-defined]
        budget = params.pop("budget", None)
        fresh = {k: clone(p, safe=False) for k, p in params.items()}
        estimator: Any = type(self)  # a concrete estimator, whose __init__ takes the sklearn parameters
        return estimator(budget=budget, **fresh)

    def __sklearn_tags__(self) -> Any:
        tags = super().__sklearn_tags__()  # type: ignore[misc]
        tags.non_deterministic = True
        return tags

    # -- validation --------------------------------------------------------------------------------

    def _validated_common(self) -> dict[str, Any]:
        p: dict[str, Any] = {}
        nb = v.neighbours(self.neighbours)  # type: ignore[attr-defined]
        accountant_factory(self.accountant, nb)  # type: ignore[attr-defined]
        p["neighbours"], p["accountant"] = nb, self.accountant  # type: ignore[attr-defined]
        if self.delta is None:  # type: ignore[attr-defined]
            raise InvalidParameterError(
                "delta",
                None,
                "a number in [2**-58, 1), e.g. 1e-5 (well below 1/n)",
                "Gaussian noise needs δ > 0 and dpkit has no data-dependent default",
            )
        d = v.delta(self.delta, allow_zero=False)  # type: ignore[attr-defined]
        if d < 2.0**-58:
            raise InvalidParameterError("delta", self.delta, "a number in [2**-58, 1)")  # type: ignore[attr-defined]
        p["delta"] = d
        eps, z = self.epsilon, self.noise_multiplier  # type: ignore[attr-defined]
        if z is None:
            if eps is None:
                raise InvalidParameterError("epsilon", None, "a finite number > 0 (or give noise_multiplier instead)")
            p["epsilon"], p["noise_multiplier"] = v.epsilon(eps), None
        else:
            if eps is not None:
                raise InvalidParameterError(
                    "epsilon",
                    eps,
                    "None when noise_multiplier is given",
                    "noise_multiplier fixes the noise and the accountant then reports epsilon_; give one of the two",
                )
            p["epsilon"], p["noise_multiplier"] = None, v.positive(z, "noise_multiplier")
        if self.data_norm is None:  # type: ignore[attr-defined]
            raise InvalidParameterError(
                "data_norm",
                None,
                "a finite number > 0: a declared bound on the rows' ℓ2 norm",
                "It sets the sensitivity, so it must come from domain knowledge, never from the data; "
                "rows with a larger norm are scaled down to it",
            )
        p["data_norm"] = v.positive(self.data_norm, "data_norm")  # type: ignore[attr-defined]
        fi = self.fit_intercept  # type: ignore[attr-defined]
        if not isinstance(fi, (bool, np.bool_)):
            raise InvalidParameterError("fit_intercept", fi, "True or False")
        p["fit_intercept"] = bool(fi)
        p["max_grad_norm"] = None if self.max_grad_norm is None else v.positive(self.max_grad_norm, "max_grad_norm")  # type: ignore[attr-defined]
        p["learning_rate"] = None if self.learning_rate is None else v.positive(self.learning_rate, "learning_rate")  # type: ignore[attr-defined]
        p["steps"] = None if self.steps is None else v.positive_int(self.steps, "steps")  # type: ignore[attr-defined]
        p["epochs"] = None if self.epochs is None else v.positive(self.epochs, "epochs")  # type: ignore[attr-defined]
        p["batch_size"] = None if self.batch_size is None else v.positive_int(self.batch_size, "batch_size")  # type: ignore[attr-defined]
        p["sample_rate"] = (
            None if self.sample_rate is None else v.probability(self.sample_rate, "sample_rate", high_open=False)  # type: ignore[attr-defined]
        )
        l2 = self.l2  # type: ignore[attr-defined]
        if not isinstance(l2, Real) or isinstance(l2, bool) or not math.isfinite(float(l2)) or float(l2) < 0:
            raise InvalidParameterError("l2", l2, "a finite number >= 0")
        p["l2"] = float(l2)
        mom = self.momentum  # type: ignore[attr-defined]
        if not isinstance(mom, Real) or isinstance(mom, bool) or not 0 <= float(mom) < 1:
            raise InvalidParameterError("momentum", mom, "a number in [0, 1)")
        p["momentum"] = float(mom)
        ta = self.tail_average  # type: ignore[attr-defined]
        if not isinstance(ta, Real) or isinstance(ta, bool) or not 0 <= float(ta) <= 1:
            raise InvalidParameterError("tail_average", ta, "a number in [0, 1]")
        p["tail_average"] = float(ta)
        b = self.budget  # type: ignore[attr-defined]
        if b is not None and not callable(getattr(b, "spend", None)):
            raise InvalidParameterError("budget", short_repr(b), "None or a dpkit.Budget (an object with spend(event))")
        p["progress"] = check_progress(self.progress)  # type: ignore[attr-defined]
        return p

    # -- the fit -------------------------------------------------------------------------------------

    def _fit_glm(
        self,
        X: NDArray[np.float64],
        Y: NDArray[np.float64],
        loss: GLMLoss,
        p: dict[str, Any],
        default_grad_norm: float | None = None,
    ) -> NDArray[np.float64]:
        """Plan, debit, train; sets the privacy attributes and returns θ (D, K)."""
        src = resolve_rng(self.rng)  # type: ignore[attr-defined]  # a bad rng fails before the debit
        R = p["data_norm"]
        row_bound = math.hypot(R, 1.0) if p["fit_intercept"] else R
        X_aug = augment(clip_rows(X, R), p["fit_intercept"])
        plan = plan_training(
            n_rows=X.shape[0],
            n_params=X_aug.shape[1],
            n_outputs=Y.shape[1],
            loss=loss,
            row_bound=row_bound,
            fit_intercept=p["fit_intercept"],
            epsilon=p["epsilon"],
            delta=p["delta"],
            noise_multiplier=p["noise_multiplier"],
            neighbours=p["neighbours"],
            accountant=p["accountant"],
            max_grad_norm=p["max_grad_norm"],
            default_grad_norm=default_grad_norm,
            steps=p["steps"],
            epochs=p["epochs"],
            batch_size=p["batch_size"],
            sample_rate=p["sample_rate"],
            learning_rate=p["learning_rate"],
            momentum=p["momentum"],
            tail_average=p["tail_average"],
            l2=p["l2"],
        )
        bar = ProgressBar(
            shows_bar(p["progress"], plan.steps, LONG_FIT_STEPS),
            total=plan.steps,
            label=type(self).__name__,
            unit="steps",
            epsilon=plan.epsilon,
            delta=plan.delta,
            transient=p["progress"] is None,
        )
        result = train(plan, X_aug, Y, loss, budget=self.budget, src=src, bar=bar)  # type: ignore[attr-defined]
        self.plan_ = plan
        self.event_ = plan.event
        self.epsilon_ = plan.epsilon
        self.delta_ = plan.delta
        self.noise_multiplier_ = plan.noise_multiplier
        self.sample_rate_ = plan.sample_rate
        self.max_grad_norm_ = plan.max_grad_norm
        self.learning_rate_ = plan.learning_rate
        self.n_steps_ = plan.steps
        return result.theta

    def _set_feature_info(self, X: object, n_features: int) -> None:
        self.n_features_in_ = n_features
        cols = getattr(X, "columns", None)
        if cols is not None and len(cols) == n_features and all(isinstance(c, str) for c in cols):
            self.feature_names_in_ = np.asarray(list(cols), dtype=object)
        elif hasattr(self, "feature_names_in_"):
            del self.feature_names_in_

    def _check_predict_X(self, X: object) -> NDArray[np.float64]:
        from sklearn.utils.validation import check_is_fitted

        check_is_fitted(self, "coef_")
        arr = check_X(X)
        if arr.shape[1] != self.n_features_in_:
            raise InvalidDataError(
                "X",
                f"has {arr.shape[1]} features",
                f"{self.n_features_in_} features, as in fit",
            )
        return arr
