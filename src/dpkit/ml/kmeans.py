"""Differentially private k-means clustering (DP Lloyd), as a scikit-learn estimator.

Two algorithms, one estimator:

* ``method="gaussian"`` (default): Lloyd's iterations with Gaussian noise on the per-cluster
  counts and sums, accounted in zCDP, with a private initialisation; (ε, δ)-DP.
* ``method="textbook"``: the DP Lloyd algorithm of Blum, Dwork, McSherry & Nissim 2005
  and McSherry 2009 ("DP 版本 Lloyd 算法"): Laplace noise, ε-DP.

Both release only the cluster centres; everything else on the fitted estimator that is computed
from the training data (``labels_``, ``inertia_``) is *not* private. See :class:`KMeans`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy.special import ndtri
from sklearn.base import BaseEstimator, ClusterMixin, clone
from sklearn.utils import TransformerTags
from sklearn.utils.validation import check_is_fitted

from dpkit import _validate as v
from dpkit._progress import ProgressBar, check_progress, shows_bar
from dpkit._validate import Neighbours
from dpkit.accounting.composition import BasicAccountant
from dpkit.accounting.events import ComposedEvent, DPEvent, SelfComposedEvent
from dpkit.accounting.zcdp import ZCDPAccountant
from dpkit.budget import Budget
from dpkit.errors import InvalidDataError, InvalidParameterError
from dpkit.mechanisms.gaussian import Gaussian, GaussianNoisePlan
from dpkit.mechanisms.laplace import Laplace, LaplaceNoisePlan
from dpkit.ml._kmeans_domain import _Domain, _domain, _uniform
from dpkit.ml._kmeans_noise import _gaussian_event, _gaussian_mechanisms, _textbook_mechanisms
from dpkit.noise.discrete import laplace_plan, sample_discrete_gaussian, sample_discrete_laplace
from dpkit.noise.lattice import Lattice, exact_lattice_sum, lattice_gaussian
from dpkit.noise.source import RandomSource, resolve_rng

__all__ = ["KMeans"]

Method = Literal["gaussian", "textbook"]
METHODS: tuple[str, ...] = ("gaussian", "textbook")

#: The private initialisation runs one noisy iteration on this many uniformly random candidate
#: centres per cluster (more candidates: finer cells, so fewer clusters merged in one cell, but
#: fewer rows and so more relative noise per cell; 16 was best on blobs in 2–10 dimensions).
_OVERSEED = 16
#: Restarts of the (free) weighted k-means on the initial noisy centroids.
_RESTARTS = 10
#: With ``progress=None`` a fit of at least this many iterations shows a bar on an interactive
#: terminal: every fit, since an iteration is a full pass with exact per-cluster sums (on UCI
#: Adult's shape about the work of 100 gradient steps, the GLMs' threshold). Decided on the plan.
_LONG_FIT_ITERATIONS = 1


def _no_progress() -> None:
    return None


# ---------------------------------------------------------------------------------------------
# Noise: the Laplace or Gaussian mechanism on exact per-cluster lattice sums
# ---------------------------------------------------------------------------------------------


Mechanism = Laplace | Gaussian


def _noise_scale(mech: Mechanism) -> float:
    """The scale of ``mech``'s noise: b for Laplace, σ for Gaussian."""
    return mech.scale if isinstance(mech, Laplace) else mech.sigma


def _draw_lattice_noise(plan: LaplaceNoisePlan | GaussianNoisePlan, n: int, src: RandomSource) -> NDArray[np.int64]:
    if isinstance(plan, LaplaceNoisePlan):
        return sample_discrete_laplace(laplace_plan(plan.lattice_scale), n, src)
    return sample_discrete_gaussian(plan.lattice_sigma, n, src)


def _exact_group_sums(Y: NDArray[np.float64], labels: NDArray[np.int64], k: int, lattice: Lattice) -> NDArray[Any]:
    """Σ over each cluster of round(y/g), exactly, as a (k, d) array of Python ints: a float sum
    is not sensitivity-bounded (:func:`~dpkit.noise.lattice.exact_lattice_sum`)."""
    steps = np.rint(Y * math.ldexp(1.0, -lattice.exponent)).astype(np.int64)  # |y| < 1: fits (checked by caller)
    return exact_lattice_sum(steps, labels=labels, groups=k)


def _noisy_sums(
    mech: Mechanism, Y: NDArray[np.float64], labels: NDArray[np.int64], k: int, src: RandomSource
) -> NDArray[np.float64]:
    """The (k, d) per-cluster sums of ``Y`` plus ``mech``'s noise, on its lattice, exactly."""
    d = Y.shape[1]
    plan = mech.noise_plan(k * d)
    total = _exact_group_sums(Y, labels, k, plan.lattice)
    noise = _draw_lattice_noise(plan, k * d, src).reshape(k, d).astype(object)
    return (total + noise).astype(np.float64) * plan.lattice.granularity


def _noisy_counts(mech: Mechanism, labels: NDArray[np.int64], k: int, src: RandomSource) -> NDArray[np.float64]:
    counts = np.bincount(labels, minlength=k).astype(np.float64)  # integers: exact
    if isinstance(mech, Gaussian):
        # Gaussian.release on finite values, drawn here on the mechanism's own noise plan.
        plan = mech.noise_plan(k)
        return lattice_gaussian(counts, plan.lattice, plan.lattice_sigma, src)
    return np.asarray(mech.release(counts, rng=src), dtype=np.float64)


def _sq_distances(Y: NDArray[np.float64], C: NDArray[np.float64]) -> NDArray[np.float64]:
    d2 = np.einsum("ij,ij->i", Y, Y)[:, None] - 2.0 * (Y @ C.T) + np.einsum("ij,ij->i", C, C)[None, :]
    return np.maximum(d2, 0.0)


def _assign(Y: NDArray[np.float64], C: NDArray[np.float64]) -> tuple[NDArray[np.int64], NDArray[np.float64]]:
    """Nearest centre of every row and the squared distance to it (vectorised, in blocks of
    rows so that the distance matrix stays small)."""
    n = Y.shape[0]
    labels = np.empty(n, dtype=np.int64)
    best = np.empty(n, dtype=np.float64)
    block = max(1, (1 << 22) // max(1, C.shape[0]))
    for s in range(0, n, block):
        d2 = _sq_distances(Y[s : s + block], C)
        lab = np.argmin(d2, axis=1)
        labels[s : s + block] = lab
        best[s : s + block] = d2[np.arange(lab.shape[0]), lab]
    return labels, best


# ---------------------------------------------------------------------------------------------
# The plan of a fit: everything decided before the data is looked at
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Plan:
    method: str
    n_clusters: int
    n_iter: int
    domain: _Domain
    count_mech: Mechanism
    sum_mech: Mechanism
    event: DPEvent  # the whole training
    step_event: DPEvent  # one iteration: counts and sums
    epsilon: float  # what the accountant makes of ``event`` (at ``delta``)
    delta: float
    init: NDArray[np.float64] | None  # public initial centres, normalised


# ---------------------------------------------------------------------------------------------
# The estimator
# ---------------------------------------------------------------------------------------------


def _check_X(X: object, name: str = "X") -> NDArray[np.float64]:
    arr = v.finite_array(X, name)  # type: ignore[arg-type]
    if arr.ndim != 2:
        raise InvalidDataError(name, f"has shape {arr.shape}", "a 2-D array of shape (n_samples, n_features)")
    return arr.astype(np.float64)


class KMeans(ClusterMixin, BaseEstimator):
    """Differentially private k-means (DP Lloyd), a scikit-learn clustering estimator.

    Only ``cluster_centers_`` is differentially private. ``labels_``, ``inertia_``, ``predict``,
    ``transform`` and ``score`` apply the private centres to whatever data they are given — on the
    training data they are *not* private (as in every DP k-means library).

    Guarantee
    ---------
    ``method="gaussian"`` (default): (ε, δ)-DP w.r.t. ``neighbours``; the whole training is the
    event ``event_`` = T × [Gaussian on the k counts, Gaussian on the (k, d) sums], which is
    ρ-zCDP with ρ = T(1/(2μ_count²) + 1/(2μ_sum²)) (Bun & Steinke 2016, Prop 1.6 and Lemma 2.3;
    discrete Gaussian: Canonne, Kamath & Steinke 2020, Thm 14), converted to (ε, δ) by CKS 2020,
    Prop 12. ``epsilon_`` is that ε (<= ``epsilon``). Needs δ > 0.

    ``method="textbook"``: ε-DP under the neighbour relation of that algorithm (one
    row *changed*, "1-相邻", i.e. ``neighbours="replace"``) by sequential composition of 2T
    Laplace releases (Dwork & Roth 2014, Thm 3.6 and 3.16). Under ``neighbours="add_remove"``
    the same noise is ε/2-DP, and ``epsilon_`` says so (see *Sensitivities* below).

    Neighbour relation: ``neighbours="add_remove"`` (default: one row added or removed; the
    number of rows stays private) or ``"replace"`` (one row changed). The event, the budget
    debit and ``epsilon_`` all carry it.

    The textbook algorithm (McSherry 2009 "PINQ", Sec. 5; Blum, Dwork,
    McSherry & Nissim 2005)
    -----------------------------------------------------------------------------------------
    Data in 𝒳 = {‖x‖₁ <= 1}. ε' = ε/(2T); initial centres uniform in 𝒳; then T times, for every
    cluster j: S_j = the rows whose nearest centre is c_j; n̂_j = |S_j| + Lap(2/ε');
    â_j = Σ_{S_j} x + (Lap(2/ε'))^d; c_j = â_j/n̂_j if n̂_j >= 1, else a uniform point of 𝒳.
    Implemented exactly so: rows are mapped into the unit ℓ1 ball (see *Data domain*), centres
    are not post-processed, and a centre whose noisy count is below 1 is redrawn uniformly from
    the declared domain.

    Sensitivities (why the text's "2" is there). On the unit ℓ1 ball the k counts and the k sum
    vectors each have ℓ1 sensitivity 1 under add/remove (the row enters one cluster: one count
    moves by 1, one sum by ‖x‖₁ <= 1) and 2 under replace (a count −1 and another +1; a sum −x and
    another +x', or x' − x within one cluster: ‖·‖₁ <= 2). Lap(2/ε') is thus ε'-DP per release
    under replace — exactly tight, the text's relation — and conservative by a factor 2 under
    add/remove (ε'/2 per release, ε/2 in all). To get ε under add/remove with the textbook
    method, pass ``epsilon=2ε``; the default method calibrates to the relation directly.

    The default algorithm (differences from the text)
    -------------------------------------------------
    * ℓ2-bounded data (radius ``data_norm``, or the half-diagonal of ``bounds``) and Gaussian
      noise: the sum's ℓ2 sensitivity is R, not the ℓ1 radius (√d smaller for a box), and
      Gaussian noise composes over T iterations in zCDP (σ grows as √T, not T).
    * ρ per iteration = ρ/T, split between counts and sums as ρ_sum/ρ_count = √(3d)·Δ_sum/Δ_count,
      which minimises the centre's error for a centre at the typical norm R/√3 (the Gaussian
      analogue of Su, Cao, Li, Bertino & Jin 2016, "Differentially private k-means clustering",
      CODASPY, Sec. 4.2, which splits ε between count and sums for Laplace noise).
    * Private initialisation (``init="private"``): the first of the T iterations runs on 16k
      candidate centres drawn uniformly from the domain (data-independent); the resulting
      noisy centroids, weighted by their noisy counts, are reduced to k centres by weighted
      k-means++ and Lloyd (best of 10 restarts) — post-processing, so the initialisation costs
      exactly one iteration's budget. (The random start is the text's main weakness: centres
      start far from the data, or two share one cluster; Su et al. 2016 also replace it.)
    * Post-processing of every noisy centre (free): it is projected onto the domain (a convex set
      holding every row, so this only brings it closer to the data). A cluster whose noisy count
      n̂ is too small for its noisy mean to mean anything (n̂ < max(1, 2σ_count, 2σ_sum·√d),
      normalised units) is "dead": its centre is moved next to the centre of the largest live
      cluster (split by a random hyperplane in the next iteration), since a dead centre usually
      means two true clusters share one centre.

    Data domain (declared, never computed from the data)
    ---------------------------------------------------
    Exactly one of ``bounds=(lower, upper)`` (numbers or per-feature arrays: a box) or
    ``data_norm=R`` (a ball around 0: ℓ1 radius for the textbook method, whose 𝒳 is an ℓ1 ball;
    ℓ2 radius for the gaussian method). Rows outside are moved in before anything is computed:
    clipped to the box, or scaled onto the ball's sphere (x·R/‖x‖). The domain is then centred
    and scaled to the unit ball of the method's norm (a box by its ℓ1 or ℓ2 half-diagonal).
    Missing both → :class:`~dpkit.errors.InvalidParameterError` naming ``bounds``.

    Order of a fit: validate everything → build the noise plan and the event → debit ``budget``
    (if given; a refusal raises :class:`~dpkit.errors.BudgetExceededError` and nothing is
    sampled or fitted) → run. A budget needs an accountant that supports the event: Gaussian
    events need e.g. ``Budget(..., accountant=dp.ZCDPAccountant)`` (or RDP, PLD); the textbook's
    Laplace events work with the default one.

    Floating-point safety: all privacy noise is dpkit's lattice noise (exact discrete Laplace /
    discrete Gaussian on a 2^k grid, Mironov 2012; CKS 2020), and the per-cluster sums are
    computed *exactly* on that grid (snapped rows summed in integers), so a float sum's rounding
    cannot exceed the sensitivity. Randomness: ``rng=None`` is the CSPRNG; a numpy Generator only
    for tests. Random centres (textbook re-draws, initial candidates) come from the same source.

    Parameters (keyword-only; stored as given, validated by :meth:`fit`)
    --------------------------------------------------------------------
    n_clusters: int >= 1. epsilon: > 0. delta: in [0, 1); > 0 for ``"gaussian"``, unused (pure
    DP) for ``"textbook"``. method: ``"gaussian"`` or ``"textbook"``. n_iter: T >= 1 noisy
    iterations (for ``"gaussian"`` with ``init="private"``, the first is the initialisation).
    bounds / data_norm: the domain. init: ``"private"`` or an (n_clusters, n_features) array of
    *public* initial centres (it must not depend on the private data). neighbours:
    ``"add_remove"`` or ``"replace"``. budget: an optional :class:`dpkit.Budget`, shared (not
    copied) by :func:`sklearn.base.clone`, so cross-validation folds all spend from it (keep
    ``n_jobs=1`` then: a budget cannot be pickled into worker processes, and a copy there would
    not be the same budget).
    rng: ``None`` or a numpy Generator / RandomSource (copied by ``clone``, as sklearn does).
    progress: a ``rich`` progress bar of the iterations done and the total (ε, δ) being spent.
    None (default): only when stderr is an interactive terminal (every fit: an iteration is a
    full pass with exact per-cluster sums; the bar disappears when done); True: always (needs
    ``rich``); False: never. It shows nothing computed on the data and draws no randomness.

    Fitted attributes: ``cluster_centers_`` (private), ``labels_``, ``inertia_`` (not private),
    ``n_iter_``, ``event_``, ``epsilon_``, ``delta_``, ``n_features_in_``, and ``noise_scale_``
    — the noise per count and per sum coordinate (Laplace scale or Gaussian σ) in data units:
    a centre's coordinate is off by about noise_sum / (cluster size).

    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> X = np.concatenate([rng.normal(-5, 1, (2000, 2)), rng.normal(5, 1, (2000, 2))])
    >>> km = KMeans(n_clusters=2, epsilon=1.0, delta=1e-6, bounds=(-10, 10), rng=rng).fit(X)
    >>> np.round(np.sort(km.cluster_centers_[:, 0]))
    array([-5.,  5.])
    >>> km.epsilon_ <= 1.0, km.delta_
    (True, 1e-06)
    >>> tb = KMeans(n_clusters=2, epsilon=4.0, method="textbook", n_iter=3, bounds=(-10, 10),
    ...             neighbours="replace", rng=rng).fit(X)
    >>> tb.epsilon_
    4.0
    """

    def __init__(
        self,
        *,
        n_clusters: int,
        epsilon: float,
        delta: float = 0.0,
        method: Method = "gaussian",
        n_iter: int = 5,
        bounds: Any = None,
        data_norm: float | None = None,
        init: str | ArrayLike = "private",
        neighbours: Neighbours = "add_remove",
        budget: Budget | None = None,
        rng: Any = None,
        progress: bool | None = None,
    ) -> None:
        self.n_clusters = n_clusters
        self.epsilon = epsilon
        self.delta = delta
        self.method = method
        self.n_iter = n_iter
        self.bounds = bounds
        self.data_norm = data_norm
        self.init = init
        self.neighbours = neighbours
        self.budget = budget
        self.rng = rng
        self.progress = progress

    # -- sklearn plumbing ------------------------------------------------------------------------

    def __sklearn_tags__(self) -> Any:
        # ``transform`` gives distances to the centres, as scikit-learn's KMeans does.
        tags = super().__sklearn_tags__()
        tags.transformer_tags = TransformerTags()
        return tags

    def __sklearn_clone__(self) -> KMeans:
        """Like :func:`sklearn.base.clone`, except that the budget is shared, not deep-copied: a
        copied budget would let every clone spend the whole budget again."""
        params = self.get_params(deep=False)
        budget = params.pop("budget")
        return type(self)(**{k: clone(p, safe=False) for k, p in params.items()}, budget=budget)

    # -- the plan ---------------------------------------------------------------------------------

    def _plan(self, n_features: int) -> _Plan:
        """Validate every parameter and decide all the noise, before the data is looked at."""
        k = v.positive_int(self.n_clusters, "n_clusters")
        eps = v.epsilon(self.epsilon)
        if not isinstance(self.method, str) or self.method not in METHODS:
            raise InvalidParameterError("method", self.method, "'gaussian' or 'textbook'")
        gaussian = self.method == "gaussian"
        delta = v.delta(self.delta)
        if gaussian and delta == 0.0:
            raise InvalidParameterError(
                "delta", self.delta, "a number in (0, 1) for method='gaussian'", "use method='textbook' for pure ε-DP"
            )
        T = v.positive_int(self.n_iter, "n_iter")
        nb = v.neighbours(self.neighbours)
        if self.budget is not None and not isinstance(self.budget, Budget):
            raise InvalidParameterError("budget", v.short_repr(self.budget), "None or a dpkit.Budget")
        resolve_rng(self.rng)  # validates rng without drawing
        check_progress(self.progress)
        domain = _domain(self.bounds, self.data_norm, n_features, 2 if gaussian else 1)
        init = self._public_init(k, n_features, domain)
        count_mech: Mechanism
        sum_mech: Mechanism
        try:
            if gaussian:
                g_count, g_sum, _ = _gaussian_mechanisms(eps, delta, T, n_features, nb)
                event, step = _gaussian_event(g_count.event.noise_multiplier, g_sum.event.noise_multiplier, T, nb)
                count_mech, sum_mech = g_count, g_sum
                spent = ZCDPAccountant(neighbours=nb).compose(event).get_epsilon(delta)
                spent_delta = delta
            else:
                count_mech, sum_mech = _textbook_mechanisms(eps, T, nb)
                step = ComposedEvent((count_mech.event, sum_mech.event))
                event = SelfComposedEvent(step, T)
                spent, spent_delta = BasicAccountant(neighbours=nb).compose(event).get_epsilon(0.0), 0.0
            # The per-cluster sums are snapped to the noise lattice and summed in int64 halves; the
            # finest lattice a fit uses is that of its largest release (the private initialisation's).
            largest = (_OVERSEED if gaussian and init is None else 1) * k * n_features
            lattice = sum_mech.noise_plan(largest).lattice
            if lattice.exponent < -61:
                raise InvalidParameterError(
                    "epsilon",
                    self.epsilon,
                    "a value whose per-iteration noise scale is at least 2**-14 of the data radius",
                )
        except InvalidParameterError as exc:
            if exc.name == "epsilon":
                raise
            raise InvalidParameterError(
                "epsilon", self.epsilon, f"a value whose noise is representable ({exc.name} must be {exc.accepted})"
            ) from exc
        return _Plan(self.method, k, T, domain, count_mech, sum_mech, event, step, spent, spent_delta, init)

    def _public_init(self, k: int, d: int, domain: _Domain) -> NDArray[np.float64] | None:
        if isinstance(self.init, str):
            if self.init != "private":
                raise InvalidParameterError(
                    "init", self.init, "'private' or an (n_clusters, n_features) array of public centres"
                )
            return None
        try:
            arr = np.asarray(self.init, dtype=np.float64)
        except (TypeError, ValueError) as exc:
            raise InvalidParameterError(
                "init", v.short_repr(self.init), f"'private' or a ({k}, {d}) array of finite numbers"
            ) from exc
        if arr.shape != (k, d) or not np.all(np.isfinite(arr)):
            raise InvalidParameterError(
                "init", v.short_repr(self.init), f"'private' or a ({k}, {d}) array of finite numbers"
            )
        return (arr - domain.offset) * domain.factor

    # -- fitting ---------------------------------------------------------------------------------

    def fit(self, X: ArrayLike, y: object = None) -> KMeans:
        """Cluster ``X`` privately; ``y`` is ignored. Pays before any noise is drawn."""
        data = _check_X(X)
        plan = self._plan(data.shape[1])
        src = resolve_rng(self.rng)
        if self.budget is not None:
            try:
                self.budget.spend(plan.event)
            except InvalidParameterError as exc:
                if exc.name != "event":
                    raise
                raise InvalidParameterError(
                    "budget",
                    self.budget,
                    f"a Budget whose accountant supports {type(plan.count_mech.event).__name__}s with neighbours={plan.count_mech.neighbours!r}",
                    "e.g. dp.Budget(epsilon=..., delta=..., accountant=dp.ZCDPAccountant) for method='gaussian'",
                ) from exc
        Y = plan.domain.normalise(data)
        bar = ProgressBar(
            shows_bar(self.progress, plan.n_iter, _LONG_FIT_ITERATIONS),
            total=plan.n_iter,
            label="KMeans",
            unit="iterations",
            epsilon=plan.epsilon,
            delta=plan.delta,
            transient=self.progress is None,
        )
        with bar as advance:  # shown once paid; advances once per noisy iteration
            run = _run_textbook if plan.method == "textbook" else _run_gaussian
            centres = run(Y, plan, src, advance)
        self.cluster_centers_ = plan.domain.denormalise(centres)
        self.n_features_in_ = data.shape[1]
        self.labels_, d2 = _assign(data, self.cluster_centers_)
        self.inertia_ = float(d2.sum())
        self.n_iter_ = plan.n_iter
        self.event_ = plan.event
        self.epsilon_ = plan.epsilon
        self.delta_ = plan.delta
        scale = 1.0 / plan.domain.factor
        self.noise_scale_ = {"count": _noise_scale(plan.count_mech), "sum": _noise_scale(plan.sum_mech) * scale}
        return self

    # -- using the private centres ------------------------------------------------------------------

    def _check_predict_X(self, X: ArrayLike) -> NDArray[np.float64]:
        check_is_fitted(self, "cluster_centers_")
        data = _check_X(X)
        if data.shape[1] != self.n_features_in_:
            raise InvalidDataError("X", f"has {data.shape[1]} features", f"{self.n_features_in_} features, as in fit")
        return data

    def predict(self, X: ArrayLike) -> NDArray[np.int64]:
        """Index of the nearest private centre of every row."""
        return _assign(self._check_predict_X(X), self.cluster_centers_)[0]

    def transform(self, X: ArrayLike) -> NDArray[np.float64]:
        """Euclidean distance of every row to every private centre, shape (n, n_clusters)."""
        return np.sqrt(_sq_distances(self._check_predict_X(X), self.cluster_centers_))

    def fit_transform(self, X: ArrayLike, y: object = None) -> NDArray[np.float64]:
        return self.fit(X).transform(X)

    def score(self, X: ArrayLike, y: object = None) -> float:
        """Minus the k-means cost of ``X`` with the private centres (higher is better)."""
        return -float(_assign(self._check_predict_X(X), self.cluster_centers_)[1].sum())


# ---------------------------------------------------------------------------------------------
# The two algorithms (normalised coordinates; ‖y‖ < 1 in the method's norm)
# ---------------------------------------------------------------------------------------------


def _run_textbook(
    Y: NDArray[np.float64], plan: _Plan, src: RandomSource, advance: Callable[[], None] = _no_progress
) -> NDArray[np.float64]:
    k = plan.n_clusters
    C = plan.domain.uniform(k, src) if plan.init is None else plan.init.copy()
    for _ in range(plan.n_iter):
        labels, _ = _assign(Y, C)
        n_hat = _noisy_counts(plan.count_mech, labels, k, src)
        a_hat = _noisy_sums(plan.sum_mech, Y, labels, k, src)
        ok = n_hat >= 1.0
        C = np.where(ok[:, None], a_hat / np.where(ok, n_hat, 1.0)[:, None], 0.0)
        if not ok.all():
            C[~ok] = plan.domain.uniform(int((~ok).sum()), src)
        advance()
    return C


def _min_count(plan: _Plan, d: int) -> float:
    """The noisy count below which a noisy mean is mostly noise: its error, about
    σ_sum·√d / n̂ (normalised units), exceeds the domain's radius 1 / 2 — or n̂ below 2σ_count."""
    return max(1.0, 2.0 * _noise_scale(plan.sum_mech) * math.sqrt(d), 2.0 * _noise_scale(plan.count_mech))


def _weighted_lloyd(
    P: NDArray[np.float64], w: NDArray[np.float64], C: NDArray[np.float64], iters: int = 20
) -> tuple[NDArray[np.float64], float]:
    for _ in range(iters):
        labels, _ = _assign(P, C)
        tot = np.bincount(labels, weights=w, minlength=C.shape[0])
        sums = np.stack(
            [np.bincount(labels, weights=w * P[:, j], minlength=C.shape[0]) for j in range(P.shape[1])], axis=1
        )
        C = np.where(tot[:, None] > 0, sums / np.where(tot > 0, tot, 1.0)[:, None], C)
    return C, float((w * _assign(P, C)[1]).sum())


def _weighted_kmeans(
    P: NDArray[np.float64], w: NDArray[np.float64], k: int, domain: _Domain, src: RandomSource
) -> NDArray[np.float64]:
    """k centres for weighted points (post-processing of released values): the best of
    ``_RESTARTS`` runs of weighted k-means++ seeding (the first greedy: heaviest point, then
    argmax of weight × squared distance; the others sampled ∝ weight × squared distance)
    followed by weighted Lloyd. Missing centres (fewer than k usable points) are drawn uniformly."""
    keep = w > 0
    P, w = P[keep], w[keep]
    if P.shape[0] == 0:
        return domain.uniform(k, src)
    m = min(k, P.shape[0])
    best, best_cost = None, math.inf
    for r in range(_RESTARTS):
        u = _uniform(src, (m,))
        first = int(np.argmax(w)) if r == 0 else int(min(np.searchsorted(np.cumsum(w), u[0] * w.sum()), P.shape[0] - 1))
        idx = [first]
        d2 = np.einsum("ij,ij->i", P - P[first], P - P[first])
        for t in range(1, m):
            score = w * d2
            total = score.sum()
            if not total > 0:
                break
            i = (
                int(np.argmax(score))
                if r == 0
                else int(min(np.searchsorted(np.cumsum(score), u[t] * total), P.shape[0] - 1))
            )
            idx.append(i)
            d2 = np.minimum(d2, np.einsum("ij,ij->i", P - P[i], P - P[i]))
        C, cost = _weighted_lloyd(P, w, P[idx].copy())
        if cost < best_cost:
            best, best_cost = C, cost
    assert best is not None
    if best.shape[0] < k:
        best = np.concatenate([best, domain.uniform(k - best.shape[0], src)])
    return best


def _run_gaussian(
    Y: NDArray[np.float64], plan: _Plan, src: RandomSource, advance: Callable[[], None] = _no_progress
) -> NDArray[np.float64]:
    k, d = plan.n_clusters, Y.shape[1]
    threshold = _min_count(plan, d)
    steps = plan.n_iter
    if plan.init is None:  # one noisy iteration on 16k random cells, then free post-processing
        cand = plan.domain.uniform(_OVERSEED * k, src)
        labels, _ = _assign(Y, cand)
        n_hat = _noisy_counts(plan.count_mech, labels, cand.shape[0], src)
        s_hat = _noisy_sums(plan.sum_mech, Y, labels, cand.shape[0], src)
        ok = n_hat >= threshold
        means = plan.domain.project(s_hat / np.maximum(n_hat, threshold)[:, None])
        C = _weighted_kmeans(means, np.where(ok, n_hat, 0.0), k, plan.domain, src)
        steps -= 1
        advance()
    else:
        C = plan.domain.project(plan.init)
    for _ in range(steps):
        labels, _ = _assign(Y, C)
        n_hat = _noisy_counts(plan.count_mech, labels, k, src)
        s_hat = _noisy_sums(plan.sum_mech, Y, labels, k, src)
        ok = n_hat >= threshold
        new = plan.domain.project(s_hat / np.maximum(n_hat, threshold)[:, None])
        C = np.where(ok[:, None], new, C)
        if ok.any() and not ok.all():
            C = _relocate(C, ok, n_hat, src)
        advance()
    return C


def _relocate(
    C: NDArray[np.float64], ok: NDArray[np.bool_], n_hat: NDArray[np.float64], src: RandomSource
) -> NDArray[np.float64]:
    """Move every dead centre (noisy count below the threshold) next to the centre of the
    largest live cluster, so that the next iteration splits that cluster (two merged clusters
    are the usual reason a centre dies). Post-processing of the released counts."""
    C = C.copy()
    size = np.where(ok, n_hat, -np.inf)
    eps = 1e-6
    for j in np.flatnonzero(~ok):
        big = int(np.argmax(size))
        u = ndtri(_uniform(src, (C.shape[1],)))
        u /= max(float(np.linalg.norm(u)), 1e-300)
        C[j] = C[big] + eps * u
        C[big] = C[big] - eps * u
        size[big] /= 2.0
    return C
