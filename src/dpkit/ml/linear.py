"""Differentially private linear regression (squared loss) by noisy gradient descent."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray
from sklearn.base import BaseEstimator, RegressorMixin

from dpkit import _validate as v
from dpkit._validate import Neighbours
from dpkit.errors import InvalidDataError, InvalidParameterError
from dpkit.ml._glm_gradients import SQUARED
from dpkit.ml._noisy_gd import NoisyGDMixin, check_X, check_y
from dpkit.noise.source import RNG

__all__ = ["LinearRegression"]


class LinearRegression(NoisyGDMixin, RegressorMixin, BaseEstimator):
    """Least-squares linear regression trained by differentially private noisy gradient descent.

    Guarantee
        The fitted model is (ε, δ)-DP with respect to ``neighbours`` (default: one row added or
        removed) for the ε the accountant proves for ``event_`` at δ (at most ``epsilon`` when it
        is given). Sensitivity comes from the declared ``data_norm``, ``bounds`` and the
        clipping norm, never from the data.

    Mechanism (Abadi et al. 2016; Bassily, Smith & Thakurta 2014)
        Rows are clipped to ℓ2 norm ``data_norm`` = R (rows with a larger norm are scaled down to
        it) and targets to ``bounds`` = [lo, hi]; with an intercept the targets are centred on
        the public midpoint (lo + hi)/2. The squared-loss gradient (θᵀx̃ − y)·x̃ has no global
        bound, so every per-example gradient is clipped to ℓ2 norm C = ``max_grad_norm``
        (default R̃·(hi − lo)/2 with an intercept, R·max(|lo|, |hi|) without: the largest
        gradient at θ = 0, so early steps are not biased). Each step releases the clipped sum of a
        Poisson sample (rate q; the full batch by default) plus Gaussian noise σ = z·C (z·2C
        under ``replace``), divides by q times a noisy row count and takes a Nesterov momentum
        step; the model is the mean of the last ``tail_average`` of the iterates. Noise is
        floating-point safe (lattice discrete Gaussian).

    Accounting, budget, parameters and fitted attributes are those of
    :class:`dpkit.ml.logistic.LogisticRegression` (see there), with ``bounds`` (the declared
    range of the targets) instead of ``classes``; the default step size is 1/(R̃² + l2) (the
    squared loss is R̃²-smooth).
    ``coef_`` has shape (d,) and ``intercept_`` is a float. Predictions are not clipped.

    Example
        >>> import numpy as np
        >>> rng = np.random.default_rng(0)
        >>> X = rng.uniform(-1, 1, size=(4000, 2))
        >>> y = 2 * X[:, 0] - X[:, 1] + 0.1 * rng.normal(size=4000)
        >>> reg = LinearRegression(epsilon=1.0, delta=1e-6, data_norm=1.5, bounds=(-4, 4),
        ...                        steps=100, rng=np.random.default_rng(1)).fit(X, y)
        >>> bool(reg.score(X, y) > 0.9), bool(reg.epsilon_ <= 1.0)
        (True, True)
    """

    def __init__(
        self,
        *,
        epsilon: float | None = None,
        delta: float | None = None,
        data_norm: float | None = None,
        bounds: tuple[float, float] | None = None,
        max_grad_norm: float | None = None,
        epochs: float | None = None,
        steps: int | None = None,
        batch_size: int | None = None,
        sample_rate: float | None = None,
        learning_rate: float | None = None,
        momentum: float = 0.95,
        tail_average: float = 0.5,
        l2: float = 0.0,
        fit_intercept: bool = True,
        accountant: str = "rdp",
        noise_multiplier: float | None = None,
        budget: Any = None,
        neighbours: Neighbours = "add_remove",
        rng: RNG = None,
        progress: bool | None = None,
    ) -> None:
        self.epsilon = epsilon
        self.delta = delta
        self.data_norm = data_norm
        self.bounds: tuple[float, float] | None = bounds
        self.max_grad_norm = max_grad_norm
        self.epochs = epochs
        self.steps = steps
        self.batch_size = batch_size
        self.sample_rate = sample_rate
        self.learning_rate = learning_rate
        self.momentum = momentum
        self.tail_average = tail_average
        self.l2 = l2
        self.fit_intercept = fit_intercept
        self.accountant = accountant
        self.noise_multiplier = noise_multiplier
        self.budget = budget
        self.neighbours = neighbours
        self.rng = rng
        self.progress = progress

    def _bounds(self) -> tuple[float, float]:
        b = self.bounds
        if b is None:
            raise InvalidParameterError(
                "bounds",
                None,
                "a declared (lower, upper) range of the targets, lower < upper",
                "It sets the sensitivity, so it must come from domain knowledge, never from the data; "
                "targets outside are clipped to it",
            )
        try:
            lo, hi = b
        except (TypeError, ValueError):
            raise InvalidParameterError("bounds", b, "a pair (lower, upper) with lower < upper") from None
        return v.bounds(lo, hi, "bounds")

    def fit(self, X: ArrayLike, y: ArrayLike) -> LinearRegression:
        """Fit on (X, y): validate, plan, debit the budget, then train. Returns self."""
        p = self._validated_common()
        lo, hi = self._bounds()
        Xa = check_X(X)
        ya = check_y(y, Xa.shape[0])
        if ya.dtype == bool or ya.dtype.kind not in "iuf":
            raise InvalidDataError("y", f"has dtype {ya.dtype}", "numbers (int or float)")
        yc = np.clip(ya.astype(np.float64), lo, hi)
        if p["fit_intercept"]:
            offset = 0.5 * (lo + hi)
            half = 0.5 * (hi - lo)
            default_c = math.hypot(p["data_norm"], 1.0) * half
        else:
            offset = 0.0
            default_c = p["data_norm"] * max(abs(lo), abs(hi))
        theta = self._fit_glm(Xa, (yc - offset)[:, None], SQUARED, p, default_grad_norm=default_c)
        d = Xa.shape[1]
        self.coef_ = theta[:d, 0].copy()
        self.intercept_ = float(theta[d, 0] + offset) if p["fit_intercept"] else 0.0
        self._set_feature_info(X, d)
        return self

    def predict(self, X: ArrayLike) -> NDArray[np.float64]:
        """θᵀx + b for each row."""
        Xa = self._check_predict_X(X)
        return Xa @ self.coef_ + self.intercept_
