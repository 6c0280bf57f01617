"""The gradients of dpkit's private GLMs: the losses (logistic, multinomial, squared), per-row
and per-example clipping, and the clipped gradient sum whose sensitivity the noise is calibrated
for.

Clipping every example's gradient to ℓ2 norm C bounds the sum's sensitivity by C under add/remove
and 2C under replace (Abadi et al. 2016, "Deep learning with differential privacy", Sec. 3.1);
:mod:`dpkit.ml._noisy_gd` adds the noise and does the accounting.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

# Losses
# ------------------------------------------------------------------------------------------------


def _sigmoid(z: NDArray[np.float64]) -> NDArray[np.float64]:
    return 0.5 * (1.0 + np.tanh(0.5 * z))  # stable for every z, no overflow


def _softmax(z: NDArray[np.float64]) -> NDArray[np.float64]:
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def _logistic_residual(z: NDArray[np.float64], y: NDArray[np.float64]) -> NDArray[np.float64]:
    return _sigmoid(z) - y


def _multinomial_residual(z: NDArray[np.float64], y: NDArray[np.float64]) -> NDArray[np.float64]:
    return _softmax(z) - y


def _squared_residual(z: NDArray[np.float64], y: NDArray[np.float64]) -> NDArray[np.float64]:
    return z - y


@dataclass(frozen=True)
class GLMLoss:
    """A GLM loss ℓ(z, y) given by its residual r = ∂ℓ/∂z (per example, K outputs).

    ``lipschitz``: sup ‖r‖₂ (None when unbounded); ``smoothness``: sup of the operator norm of
    ∂²ℓ/∂z², so the average loss is smoothness·R̃²-smooth in θ."""

    name: str
    residual: Callable[[NDArray[np.float64], NDArray[np.float64]], NDArray[np.float64]]
    lipschitz: float | None
    smoothness: float


#: Binary logistic loss, y ∈ {0, 1}: r = σ(z) − y, |r| < 1; ℓ'' = σ(1 − σ) <= 1/4.
LOGISTIC = GLMLoss("logistic", _logistic_residual, 1.0, 0.25)
#: Multinomial (softmax) loss, y one-hot: r = p − e_y, ‖r‖₂² = Σp² − 2p_y + 1 <= 2; the Hessian
#: diag(p) − ppᵀ has operator norm <= 1/2.
MULTINOMIAL = GLMLoss("multinomial", _multinomial_residual, math.sqrt(2.0), 0.5)
#: Squared loss ½(z − y)²: r = z − y is unbounded, so gradients must be clipped.
SQUARED = GLMLoss("squared", _squared_residual, None, 1.0)


# ------------------------------------------------------------------------------------------------
# Deterministic, sensitivity-bounded pieces
# ------------------------------------------------------------------------------------------------

_SHRINK = np.nextafter(1.0, 0.0) ** 8  # a few ulps: rounding never leaves a norm above its bound


def clip_rows(X: NDArray[np.float64], norm: float) -> NDArray[np.float64]:
    """Each row scaled to ℓ2 norm at most ``norm``; rows already inside are unchanged."""
    norms = np.linalg.norm(X, axis=1)
    scale = np.where(norms > norm, (norm / np.maximum(norms, np.finfo(np.float64).tiny)) * _SHRINK, 1.0)
    return X * scale[:, None]


def augment(X: NDArray[np.float64], fit_intercept: bool) -> NDArray[np.float64]:
    """[X, 1] when fitting an intercept (the intercept is the last row of θ)."""
    return np.hstack([X, np.ones((X.shape[0], 1))]) if fit_intercept else np.ascontiguousarray(X)


def per_example_clip_factors(
    X_aug: NDArray[np.float64], R: NDArray[np.float64], C: float, row_norms: NDArray[np.float64] | None = None
) -> NDArray[np.float64]:
    """min(1, C/‖g_i‖₂) for g_i = x̃_i ⊗ r_i, using ‖g_i‖₂ = ‖x̃_i‖₂‖r_i‖₂ (vectorised)."""
    if row_norms is None:
        row_norms = np.linalg.norm(X_aug, axis=1)
    rnorm = np.abs(R[:, 0]) if R.shape[1] == 1 else np.linalg.norm(R, axis=1)
    gnorm = row_norms * rnorm
    return np.where(gnorm > C, (C / np.maximum(gnorm, np.finfo(np.float64).tiny)) * _SHRINK, 1.0)


def clipped_gradient_sum(
    X_aug: NDArray[np.float64], R: NDArray[np.float64], C: float, row_norms: NDArray[np.float64] | None = None
) -> NDArray[np.float64]:
    """Σ_i clip_C(x̃_i ⊗ r_i) as a (D, K) matrix. Adding or removing one row moves it by at most
    C in Frobenius (ℓ2) norm; replacing one row by at most 2C."""
    return X_aug.T @ (R * per_example_clip_factors(X_aug, R, C, row_norms)[:, None])
