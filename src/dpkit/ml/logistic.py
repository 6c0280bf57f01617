"""Differentially private logistic regression by noisy gradient descent (binary and multinomial)."""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray
from sklearn.base import BaseEstimator, ClassifierMixin

from dpkit._validate import Neighbours
from dpkit.errors import InvalidDataError, InvalidParameterError
from dpkit.ml._glm_gradients import LOGISTIC, MULTINOMIAL, _sigmoid, _softmax
from dpkit.ml._noisy_gd import (
    DataDependentWarning,
    NoisyGDMixin,
    check_X,
    check_y,
    warn_data_dependent,
)
from dpkit.noise.source import RNG

__all__ = ["LogisticRegression", "DataDependentWarning"]


class LogisticRegression(NoisyGDMixin, ClassifierMixin, BaseEstimator):
    """Logistic regression trained by differentially private noisy gradient descent.

    Two classes: the binary logistic loss (one weight vector, ``coef_`` of shape (1, d)); more
    classes: the multinomial (softmax) loss (``coef_`` of shape (K, d)). A scikit-learn estimator:
    ``fit``, ``predict``, ``predict_proba``, ``decision_function``, ``score``; works with
    ``clone``, ``Pipeline``, ``cross_val_score`` and ``GridSearchCV`` (clones *share* the
    ``budget`` object, so every fold is paid for).

    Guarantee
        The fitted model is (ε, δ)-DP with respect to ``neighbours`` (default: one row added or
        removed) for the ε the accountant proves for ``event_`` at δ; with ``epsilon=`` given
        that is at most ``epsilon``. Sensitivity comes from the declared ``data_norm`` and the
        clipping norm, never from the data.

    Mechanism (noisy gradient descent: Abadi et al. 2016, "Deep learning with
    differential privacy", Alg. 1; Bassily, Smith & Thakurta 2014, noisy SGD for convex ERM)
        Rows are clipped to ℓ2 norm ``data_norm`` = R (rows with a larger norm are scaled down
        to it; nothing else reads the norms) and, with an intercept, augmented with a 1, so
        ‖x̃‖ <= R̃ = √(R² + 1). The logistic gradient (σ(θᵀx̃) − y)·x̃ then has norm <= R̃ (√2·R̃
        for the softmax loss) — the loss's Lipschitz bound — so by default no
        gradient needs clipping (input clipping); ``max_grad_norm=C`` below that bound clips
        every per-example gradient to C instead. Each step releases the sum of the clipped
        gradients of a Poisson sample (rate q; the full batch by default) plus Gaussian noise of
        σ = z·C (z·2C under ``replace``), divides it by q times a noisy row count, and takes a
        Nesterov momentum step; the model is the mean of the last ``tail_average`` of the
        iterates. Noise is floating-point safe (lattice discrete Gaussian). Everything after the
        noisy sums is post-processing.

    Accounting
        ``event_`` = ComposedEvent((GaussianEvent(z_c), SelfComposedEvent(step, T))) with
        step = PoissonSampledEvent(q, GaussianEvent(z)) (GaussianEvent(z) for the full batch).
        With ``epsilon`` the noise multiplier z is the smallest that the accountant (``"rdp"``:
        Mironov 2017 with the subsampled-Gaussian bound of Mironov, Talwar & Zhang 2019;
        ``"pld"``: privacy loss distributions) proves (ε, δ)-DP, re-checked before training;
        with ``noise_multiplier`` z is given and ``epsilon_`` reports what it buys. Poisson
        amplification is a theorem for add/remove neighbours; ``neighbours="replace"`` is
        accepted for the full batch only (then the row count is public and Δ = 2C).

    Budget
        With ``budget=`` (a :class:`dpkit.Budget`), ``event_`` is debited *before* any noise or
        sampling mask is drawn; if the budget refuses, :class:`~dpkit.errors.BudgetExceededError`
        is raised and nothing is fitted. Invalid parameters or data raise before the debit.

    Parameters (keyword-only)
        epsilon, delta: the target (ε, δ); δ is required (no default: choose it well below 1/n).
        data_norm: declared bound R on the rows' ℓ2 norm (required).
        max_grad_norm: per-example gradient clipping norm C (default: the Lipschitz bound, i.e.
            input clipping only).
        steps / epochs: number of noisy steps, or passes (T = ⌈epochs/q⌉); default 400 steps for
            the full batch, 10 epochs when sampling.
        batch_size / sample_rate: expected batch size B (q = B/n: the row count n is then treated
            as public, as in Opacus and diffprivlib) or the sampling rate q; default: full batch.
        learning_rate: step size η (default 1/(s·R̃² + l2) with s = 1/4 binary, 1/2 multinomial —
            one over the loss's smoothness constant — times R̃·L/C when clipping below the bound).
        momentum: Nesterov momentum β in [0, 1) (default 0.95: with the default step, ηL <= 1,
            inside Nesterov's stability region ηL <= 2(1 + β)/(1 + 2β)); tail_average: fraction of
            the last iterates averaged (default 0.5; 0 = last iterate). Both post-processing.
        l2: ℓ2 penalty λ·‖w‖²/2 (intercept not penalised); fit_intercept: default True.
        classes: the declared label set. Default None reads it from y, which treats the label set
            as public and emits a :class:`DataDependentWarning`.
        accountant: ``"rdp"`` (default) or ``"pld"`` (tighter, slower).
        noise_multiplier: z, instead of ``epsilon``.
        budget: a :class:`dpkit.Budget` to debit; neighbours: ``"add_remove"`` or ``"replace"``.
        rng: None (default: the CSPRNG) or an explicit ``numpy.random.Generator`` (tests only).
        progress: a ``rich`` progress bar of the steps done and the total (ε, δ) being spent.
            None (default): only when stderr is an interactive terminal and the fit has at least
            100 steps (it disappears when done); True: always (needs ``rich``); False: never.
            It shows nothing computed on the data and draws no randomness.

    Fitted attributes
        ``coef_``, ``intercept_``, ``classes_``, ``event_``, ``epsilon_`` (proved at δ·(1 − 2^-20)),
        ``delta_``, ``n_steps_``, ``noise_multiplier_``, ``sample_rate_``, ``max_grad_norm_``,
        ``learning_rate_``, ``plan_`` (the exact noise plan), ``n_features_in_``.

    Example
        >>> import numpy as np
        >>> rng = np.random.default_rng(0)
        >>> X = rng.normal(size=(2000, 2))
        >>> y = (X[:, 0] + X[:, 1] > 0).astype(int)
        >>> clf = LogisticRegression(epsilon=1.0, delta=1e-6, data_norm=3.0, classes=[0, 1], steps=50,
        ...                          rng=np.random.default_rng(1)).fit(X, y)
        >>> clf.score(X, y) > 0.9, clf.epsilon_ <= 1.0
        (True, True)
    """

    def __init__(
        self,
        *,
        epsilon: float | None = None,
        delta: float | None = None,
        data_norm: float | None = None,
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
        classes: ArrayLike | None = None,
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
        self.classes = classes
        self.accountant = accountant
        self.noise_multiplier = noise_multiplier
        self.budget = budget
        self.neighbours = neighbours
        self.rng = rng
        self.progress = progress

    # -- fit ---------------------------------------------------------------------------------------

    def _label_set(self, y: NDArray[Any]) -> NDArray[Any]:
        if self.classes is None:
            classes = np.unique(y)
            if classes.size < 2:
                raise InvalidDataError(
                    "y", f"holds a single label ({classes[0]!r})", "at least two labels, or declare classes="
                )
            warn_data_dependent(
                "LogisticRegression: the label set was read from y and is treated as public (a label held by "
                "few rows reveals them); declare it with classes=[...]"
            )
            return classes
        try:
            declared = np.asarray(self.classes)
        except Exception:  # pragma: no cover - exotic inputs
            raise InvalidParameterError("classes", self.classes, "an array-like of at least two labels") from None
        if declared.ndim != 1:
            raise InvalidParameterError("classes", self.classes, "a 1-D array-like of at least two labels")
        classes = np.unique(declared)
        if classes.size < 2 or classes.size != declared.size:
            raise InvalidParameterError("classes", self.classes, "at least two distinct labels")
        if classes.dtype.kind == "f" and not np.isfinite(classes).all():
            raise InvalidParameterError("classes", self.classes, "finite labels")
        return classes

    def fit(self, X: ArrayLike, y: ArrayLike) -> LogisticRegression:
        """Fit on (X, y): validate, plan, debit the budget, then train. Returns self."""
        p = self._validated_common()
        Xa = check_X(X)
        ya = check_y(y, Xa.shape[0])
        classes = self._label_set(ya)
        try:
            inside = np.isin(ya, classes)
        except TypeError:  # pragma: no cover - incomparable label types
            inside = np.zeros(ya.shape, dtype=bool)
        if not inside.all():
            bad = ya[~inside][0]
            raise InvalidDataError(
                "y", f"holds the label {bad!r}, not among classes {classes.tolist()!r}", "labels from classes"
            )
        K = classes.size
        codes = np.searchsorted(classes, ya)
        if K == 2:
            Y = (codes == 1).astype(np.float64)[:, None]
            loss = LOGISTIC
        else:
            Y = np.zeros((ya.size, K))
            Y[np.arange(ya.size), codes] = 1.0
            loss = MULTINOMIAL
        theta = self._fit_glm(Xa, Y, loss, p)
        d = Xa.shape[1]
        self.classes_ = classes
        self.coef_ = np.ascontiguousarray(theta[:d].T)
        self.intercept_ = theta[d].copy() if p["fit_intercept"] else np.zeros(theta.shape[1])
        self._set_feature_info(X, d)
        return self

    # -- predict -----------------------------------------------------------------------------------

    def decision_function(self, X: ArrayLike) -> NDArray[np.float64]:
        """Scores θᵀx + b: shape (n,) for two classes (positive means ``classes_[1]``), else (n, K)."""
        Xa = self._check_predict_X(X)
        scores = Xa @ self.coef_.T + self.intercept_
        return scores[:, 0] if scores.shape[1] == 1 else scores

    def predict_proba(self, X: ArrayLike) -> NDArray[np.float64]:
        """Class probabilities, columns in the order of ``classes_``."""
        scores = self.decision_function(X)
        if scores.ndim == 1:
            p = _sigmoid(scores)
            return np.column_stack([1.0 - p, p])
        return _softmax(scores)

    def predict_log_proba(self, X: ArrayLike) -> NDArray[np.float64]:
        with np.errstate(divide="ignore"):
            return np.log(self.predict_proba(X))

    def predict(self, X: ArrayLike) -> NDArray[Any]:
        """The most likely class of each row."""
        scores = self.decision_function(X)
        idx = (scores > 0).astype(np.int64) if scores.ndim == 1 else np.argmax(scores, axis=1)
        return self.classes_[idx]
