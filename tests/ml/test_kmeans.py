"""dpkit.ml.kmeans.KMeans: sklearn conventions, accuracy, bad input, budget, events, audits.

Randomness: every test uses a fixed seed (``rng=np.random.default_rng(SEED…)``), so it passes or
fails deterministically. Where a test checks a random outcome, its comment gives the failure
rate measured over many seeds during development (the fixed seed is not cherry-picked: any seed
fails with at most that probability).

Audits (DESIGN.md core idea 5) release one iteration — the noisy counts and sums — many times on
neighbouring datasets, with the very mechanisms a fit uses (``KMeans._plan``), and bound its ε with
:func:`dpkit.audit.estimate_epsilon` at confidence 1 − 1e-6: a correct implementation fails a
guarantee check with probability <= 1e-6. Each audit has a broken twin (the factor 2 of the text
forgotten; the whole budget spent in every iteration) that must be caught; thresholds sit far
from the means measured over 20 seeds (given in the comments). As in tests/audit, the trials are
vectorised: one release of ``np.full(trials, value)`` is ``trials`` independent releases of the
scalar (only the lattice, which depends on the length and never on the data, is finer).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from sklearn.base import clone
from sklearn.model_selection import GridSearchCV, cross_val_score
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import FunctionTransformer

import dpkit as dp
import dpkit.mechanisms.laplace as laplace_module
import dpkit.ml.kmeans as km_module
from _stats import CountingSource
from dpkit.accounting import BasicAccountant, PLDAccountant, ZCDPAccountant
from dpkit.audit import estimate_epsilon
from dpkit.errors import BudgetExceededError, DPError, InvalidDataError, InvalidParameterError
from dpkit.ml._kmeans_domain import _SHRINK
from dpkit.ml.kmeans import KMeans
from dpkit.noise.lattice import Lattice

SEED = 20240620
STRICT = 1 - 1e-6
TRUE_CENTRES = np.array([[-6.0, -6.0], [6.0, -6.0], [0.0, 6.0]])


def blobs(n_per: int = 1500, seed: int = SEED, centres: np.ndarray = TRUE_CENTRES) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.concatenate([rng.normal(c, 1.0, size=(n_per, centres.shape[1])) for c in centres])


def match_error(found: np.ndarray, truth: np.ndarray) -> float:
    """Largest distance from a true centre to the found centre matched to it (greedy on sorted
    distances; the centres here are far apart, so greedy matching is the optimal one)."""
    d = np.linalg.norm(found[:, None, :] - truth[None, :, :], axis=2)
    worst, used_f, used_t = 0.0, set(), set()
    for flat in np.argsort(d, axis=None):
        i, j = divmod(int(flat), truth.shape[0])
        if i in used_f or j in used_t:
            continue
        used_f.add(i)
        used_t.add(j)
        worst = max(worst, float(d[i, j]))
    return worst


def model(**kw: Any) -> KMeans:
    params: dict[str, Any] = dict(
        n_clusters=3, epsilon=1.0, delta=1e-6, bounds=(-10.0, 10.0), rng=np.random.default_rng(SEED)
    )
    params.update(kw)
    return KMeans(**params)


def halve(x: np.ndarray) -> np.ndarray:  # a public, data-independent transformation
    return x / 2.0


# --- scikit-learn conventions ---------------------------------------------------------------------


def test_get_params_returns_the_arguments_as_given():
    budget = dp.Budget(epsilon=5.0, delta=1e-5, accountant=ZCDPAccountant)
    est = KMeans(n_clusters=4, epsilon=2, delta=1e-7, n_iter=3, bounds=(0, 1), budget=budget)
    p = est.get_params()
    assert p["n_clusters"] == 4 and p["epsilon"] == 2 and p["bounds"] == (0, 1) and p["budget"] is budget
    assert p["method"] == "gaussian" and p["init"] == "private" and p["neighbours"] == "add_remove"
    assert est.set_params(n_iter=7) is est and est.n_iter == 7


def test_clone_copies_parameters_but_shares_the_budget():
    budget = dp.Budget(epsilon=5.0, delta=1e-5, accountant=ZCDPAccountant)
    est = model(budget=budget)
    twin = clone(est)
    assert twin is not est
    assert twin.get_params()["bounds"] == est.get_params()["bounds"]
    assert twin.budget is budget  # a copied budget would let every clone spend it all again
    assert twin.rng is not est.rng  # generators are copied, as sklearn does
    assert not hasattr(twin, "cluster_centers_")


def test_fit_predict_transform_score_are_consistent():
    X = blobs(500)
    est = model(epsilon=5.0)
    labels = est.fit_predict(X)
    assert labels.shape == (X.shape[0],) and labels.dtype.kind == "i"
    np.testing.assert_array_equal(labels, est.labels_)
    np.testing.assert_array_equal(est.predict(X), est.labels_)
    dist = est.transform(X)
    assert dist.shape == (X.shape[0], 3)
    np.testing.assert_array_equal(np.argmin(dist, axis=1), est.labels_)
    assert est.score(X) == pytest.approx(-est.inertia_)
    assert est.inertia_ == pytest.approx(float((dist.min(axis=1) ** 2).sum()))
    assert est.n_iter_ == 5 and est.n_features_in_ == 2 and est.cluster_centers_.shape == (3, 2)
    assert est.delta_ == 1e-6 and 0 < est.epsilon_ <= 5.0


def test_pipeline_and_cross_validation_run():
    X = blobs(400)
    pipe = Pipeline([("halve", FunctionTransformer(halve)), ("km", model(bounds=(-5.0, 5.0), epsilon=4.0))])
    pipe.fit(X)
    assert pipe.predict(X).shape == (X.shape[0],)
    scores = cross_val_score(pipe, X, cv=3)
    assert scores.shape == (3,) and np.all(np.isfinite(scores)) and np.all(scores < 0)


def test_grid_search_spends_every_fit_from_one_shared_budget():
    X = blobs(300)
    budget = dp.Budget(epsilon=100.0, delta=1e-5, accountant=ZCDPAccountant)
    search = GridSearchCV(model(epsilon=1.0, budget=budget), {"n_iter": [2, 4]}, cv=2)
    search.fit(X)
    assert search.best_params_["n_iter"] in (2, 4)
    # 2 settings × 2 folds + the refit on all of X: five trainings, all paid for.
    assert len(budget.events) == 5


# --- accuracy --------------------------------------------------------------------------------------


def test_default_method_recovers_separated_centres_at_large_epsilon():
    X = blobs(1500)
    est = model(epsilon=20.0, delta=1e-6).fit(X)
    # Over 200 seeds (data and noise): median error 0.047, largest 0.12 — mostly the sampling
    # error of a 1500-point mean (0.04), not the noise.
    assert match_error(est.cluster_centers_, TRUE_CENTRES) < 0.5


def test_default_method_is_close_to_nonprivate_cost_at_moderate_epsilon():
    from sklearn.cluster import KMeans as SkKMeans

    X = blobs(1500)
    est = model(epsilon=1.0, delta=1e-6).fit(X)
    base = SkKMeans(n_clusters=3, n_init=10, random_state=0).fit(X).inertia_
    # Over 200 seeds (data and noise): cost ratio median 1.015, largest 1.052 (threshold 1.5).
    assert est.inertia_ / base < 1.5


def test_textbook_method_recovers_centres_from_public_init_at_large_epsilon():
    X = blobs(1500)
    init = np.array([[-3.0, -3.0], [3.0, -3.0], [0.0, 3.0]])
    est = model(method="textbook", epsilon=200.0, n_iter=5, init=init).fit(X)
    # Laplace scale 2/ε' = 0.05 per sum coordinate in the unit ℓ1 ball (1.0 in data units, on
    # sums of 1500 rows). Over 200 seeds: median error 0.044, largest 0.11 (sampling error).
    assert match_error(est.cluster_centers_, TRUE_CENTRES) < 0.2


def test_textbook_random_start_is_its_weakness_and_private_init_removes_it():
    X = blobs(1500)
    ok_textbook = ok_default = 0
    for seed in range(20):
        rng = np.random.default_rng(seed)
        tb = model(method="textbook", epsilon=200.0, n_iter=10, rng=rng).fit(X)
        ok_textbook += match_error(tb.cluster_centers_, TRUE_CENTRES) < 0.2
        ok_default += match_error(model(epsilon=200.0, rng=rng).fit(X).cluster_centers_, TRUE_CENTRES) < 0.2
    # The text's uniform random start leaves a centre stuck (two clusters under one centre) in
    # 17.5% of 200 fits measured; here >= 10 of 20 succeed (P[fail] < 1e-4 at p = 0.825).
    # The default's private initialisation recovered every centre in 200 of 200.
    assert ok_textbook >= 10
    assert ok_default == 20


def test_data_outside_the_declared_domain_is_clipped_not_trusted():
    X = blobs(800)
    far = X.copy()
    far[0] = [1e6, -1e6]  # one outlier far outside the box
    a = model(epsilon=5.0, rng=np.random.default_rng(1)).fit(X).cluster_centers_
    b = model(epsilon=5.0, rng=np.random.default_rng(1)).fit(far).cluster_centers_
    assert np.all(np.abs(b) <= 10.0)
    assert match_error(a, b) < 0.5  # the outlier counts as a point on the box's edge


def test_data_norm_domain_for_both_methods():
    X = blobs(800) / 10.0
    g = model(bounds=None, data_norm=1.2, epsilon=10.0).fit(X)
    assert np.all(np.linalg.norm(g.cluster_centers_, axis=1) <= 1.2 + 1e-12)  # projected on the ℓ2 ball
    t = model(bounds=None, data_norm=1.5, method="textbook", epsilon=100.0, init=TRUE_CENTRES / 20).fit(X)
    assert match_error(t.cluster_centers_, TRUE_CENTRES / 10) < 0.1


# --- bad input: dpkit errors, nothing spent, nothing drawn ----------------------------------------


BAD_PARAMS = [
    ("no domain", dict(bounds=None), InvalidParameterError, "bounds"),
    ("two domains", dict(data_norm=1.0), InvalidParameterError, "data_norm"),
    ("reversed bounds", dict(bounds=(1.0, -1.0)), InvalidParameterError, "bounds"),
    ("bounds of wrong length", dict(bounds=([0, 0, 0], [1, 1, 1])), InvalidParameterError, "bounds"),
    ("infinite bounds", dict(bounds=(-np.inf, 1.0)), InvalidParameterError, "bounds"),
    ("epsilon 0", dict(epsilon=0.0), InvalidParameterError, "epsilon"),
    ("epsilon negative", dict(epsilon=-1.0), InvalidParameterError, "epsilon"),
    ("epsilon nan", dict(epsilon=float("nan")), InvalidParameterError, "epsilon"),
    ("epsilon string", dict(epsilon="1"), InvalidParameterError, "epsilon"),
    ("epsilon too large for the lattice", dict(method="textbook", epsilon=1e9), InvalidParameterError, "epsilon"),
    ("epsilon too small for the noise", dict(method="textbook", epsilon=1e-300), InvalidParameterError, "epsilon"),
    ("delta 0 with gaussian", dict(delta=0.0), InvalidParameterError, "delta"),
    ("delta 1", dict(delta=1.0), InvalidParameterError, "delta"),
    ("n_clusters 0", dict(n_clusters=0), InvalidParameterError, "n_clusters"),
    ("n_clusters float", dict(n_clusters=2.5), InvalidParameterError, "n_clusters"),
    ("n_iter 0", dict(n_iter=0), InvalidParameterError, "n_iter"),
    ("bad method", dict(method="lloyd"), InvalidParameterError, "method"),
    ("bad neighbours", dict(neighbours="swap"), InvalidParameterError, "neighbours"),
    ("bad init name", dict(init="k-means++"), InvalidParameterError, "init"),
    ("bad init shape", dict(init=np.zeros((2, 2))), InvalidParameterError, "init"),
    ("bad data_norm", dict(bounds=None, data_norm=-1.0), InvalidParameterError, "data_norm"),
    ("bad rng", dict(rng=42), InvalidParameterError, "rng"),
]


@pytest.mark.parametrize("case, kw, error, name", BAD_PARAMS, ids=[c[0] for c in BAD_PARAMS])
def test_bad_parameters_raise_spend_nothing_and_draw_nothing(case, kw, error, name):
    budget = dp.Budget(epsilon=10.0, delta=1e-5, accountant=ZCDPAccountant)
    src = CountingSource(SEED)
    params = dict(rng=src, budget=budget)
    params.update(kw)
    est = model(**params)
    with pytest.raises(error) as info:
        est.fit(blobs(50))
    assert info.value.name == name
    assert budget.spent == (0.0, 0.0) and budget.events == ()
    assert src.calls == 0
    assert not hasattr(est, "cluster_centers_")


BAD_DATA = [
    ("1-D", np.arange(10.0)),
    ("3-D", np.zeros((4, 2, 2))),
    ("NaN", np.array([[0.0, 1.0], [np.nan, 2.0]])),
    ("inf", np.array([[0.0, np.inf]])),
    ("empty", np.zeros((0, 2))),
    ("strings", np.array([["a", "b"]])),
]


@pytest.mark.parametrize("case, X", BAD_DATA, ids=[c[0] for c in BAD_DATA])
def test_bad_data_raises_spends_nothing_and_draws_nothing(case, X):
    budget = dp.Budget(epsilon=10.0, delta=1e-5, accountant=ZCDPAccountant)
    src = CountingSource(SEED)
    with pytest.raises(InvalidDataError) as info:
        model(rng=src, budget=budget).fit(X)
    assert info.value.name == "X"
    assert budget.events == () and src.calls == 0


def test_predict_checks_features_and_fit():
    from sklearn.exceptions import NotFittedError

    with pytest.raises(NotFittedError):
        model().predict(blobs(5))
    est = model(epsilon=5.0).fit(blobs(100))
    with pytest.raises(InvalidDataError):
        est.predict(np.zeros((3, 3)))
    with pytest.raises(InvalidDataError):
        est.predict(np.array([[np.nan, 0.0]]))


def test_errors_are_dpkit_errors_and_name_what_is_accepted():
    with pytest.raises(DPError) as info:
        model(bounds=None).fit(blobs(10))
    text = str(info.value)
    assert "bounds=None" in text and "data_norm" in text and "never derives" in text


# --- budget: paid before any noise, refused when exhausted ---------------------------------------


class _PaidFirst:
    """A random source that records what the budget had spent when randomness was first asked."""

    def __init__(self, budget: dp.Budget, seed: int) -> None:
        self.budget = budget
        self.inner = CountingSource(seed)
        self.spent_at_first_draw: tuple[float, float] | None = None

    def words(self, n: int) -> np.ndarray:
        if self.spent_at_first_draw is None:
            self.spent_at_first_draw = self.budget.spent
        return self.inner.words(n)


@pytest.mark.parametrize("method", ["gaussian", "textbook"])
def test_budget_is_spent_before_any_noise_is_drawn(method):
    accountant = ZCDPAccountant if method == "gaussian" else BasicAccountant
    budget = dp.Budget(epsilon=3.0, delta=1e-5, accountant=accountant)
    src = _PaidFirst(budget, SEED)
    est = model(method=method, epsilon=1.0, rng=src, budget=budget).fit(blobs(200))
    assert src.spent_at_first_draw is not None and src.spent_at_first_draw[0] > 0
    assert budget.events == (est.event_,)
    # The budget prices the recorded event with its own accountant at its own δ.
    assert budget.spent[0] == accountant().compose(est.event_).get_epsilon(budget.delta)
    if method == "textbook":
        assert budget.spent[0] == est.epsilon_ == 0.5  # ε/2: add/remove neighbours (see the docstring)


def test_budget_refusal_fits_nothing_and_draws_nothing():
    budget = dp.Budget(epsilon=1.2, delta=1e-6, accountant=ZCDPAccountant)
    model(epsilon=1.0, budget=budget).fit(blobs(200))  # a second fit would bring ε to 1.45
    spent = budget.spent
    src = CountingSource(SEED)
    est = model(epsilon=1.0, budget=budget, rng=src)
    with pytest.raises(BudgetExceededError):
        est.fit(blobs(200))
    assert src.calls == 0 and not hasattr(est, "cluster_centers_")
    assert budget.spent == spent and len(budget.events) == 1


def test_budget_whose_accountant_cannot_price_gaussians_is_an_error_naming_budget():
    budget = dp.Budget(epsilon=10.0, delta=1e-5)  # basic composition: no Gaussian events
    src = CountingSource(SEED)
    with pytest.raises(InvalidParameterError) as info:
        model(budget=budget, rng=src).fit(blobs(50))
    assert info.value.name == "budget" and "ZCDPAccountant" in str(info.value)
    assert budget.events == () and src.calls == 0


def test_cross_validation_folds_spend_from_the_shared_budget_until_refused():
    X = blobs(300)
    budget = dp.Budget(epsilon=1.6, delta=1e-6, accountant=ZCDPAccountant)
    # ρ adds up: two fits at ε = 1 cost ε = 1.45 at δ = 1e-6, three 1.81 > 1.6.
    with pytest.raises(BudgetExceededError):
        cross_val_score(model(epsilon=1.0, budget=budget), X, cv=3, error_score="raise")
    assert len(budget.events) == 2


# --- events, epsilon_ and the noise actually drawn ------------------------------------------------


@pytest.fixture
def spy_noise(monkeypatch):
    """Record the scale (in normalised units) of every noise draw a fit makes, in order: the
    counts go through Laplace.release / _GaussianNoise.release, the sums through the samplers."""
    rec: list[tuple[str, float, int]] = []
    real_ll, real_lg = laplace_module.lattice_laplace, km_module.lattice_gaussian
    real_sl, real_sg = km_module.sample_discrete_laplace, km_module.sample_discrete_gaussian

    def ll(x, lattice, lattice_scale, src):
        rec.append(("count", float(lattice_scale) * lattice.granularity, x.size))
        return real_ll(x, lattice, lattice_scale, src)

    def lg(x, lattice, lattice_sigma, src):
        rec.append(("count", float(lattice_sigma) * lattice.granularity, x.size))
        return real_lg(x, lattice, lattice_sigma, src)

    def wrap_sampler(real, attr):
        def sampler(param, n, src):
            value = getattr(param, attr) if attr else param
            rec.append(("sum", float(value), n))  # lattice units; converted by the test
            return real(param, n, src)

        return sampler

    monkeypatch.setattr(laplace_module, "lattice_laplace", ll)
    monkeypatch.setattr(km_module, "lattice_gaussian", lg)
    monkeypatch.setattr(km_module, "sample_discrete_laplace", wrap_sampler(real_sl, "scale"))
    monkeypatch.setattr(km_module, "sample_discrete_gaussian", wrap_sampler(real_sg, None))
    return rec


@pytest.mark.parametrize("neighbours, sens, eps_claim", [("add_remove", 1.0, 0.5), ("replace", 2.0, 1.0)])
def test_textbook_event_equals_the_laplace_noise_drawn(spy_noise, neighbours, sens, eps_claim):
    T, eps, k = 4, 1.0, 3
    X = blobs(200) / 20.0  # inside the ℓ1 ball of radius 1: no clipping
    est = model(method="textbook", n_iter=T, epsilon=eps, bounds=None, data_norm=1.0, neighbours=neighbours).fit(X)
    plan = est._plan(2)
    lattice_g = plan.sum_mech.noise_plan(k * 2).lattice.granularity
    # The text: Lap(2/ε') with ε' = ε/(2T) on every count and every sum coordinate.
    text_scale = 2.0 / (eps / (2 * T))
    assert [(kind, size) for kind, _, size in spy_noise] == [("count", k), ("sum", k * 2)] * T
    for kind, scale, _ in spy_noise:
        drawn = scale if kind == "count" else scale * lattice_g
        assert text_scale <= drawn <= text_scale * (1 + 1e-9)
    # The event: 2T Laplace releases with scale = noise_multiplier × (true ℓ1 sensitivity).
    step = est.event_.event
    assert est.event_.count == T
    for ev in step.events:
        assert ev.neighbours == neighbours
        assert float(ev.noise_multiplier) * sens == pytest.approx(text_scale, rel=1e-12)
    # ε = 2T/(scale/Δ): the text's ε under replace; half of it under add/remove.
    assert est.epsilon_ == pytest.approx(eps_claim, rel=1e-12) and est.epsilon_ <= eps_claim
    assert est.noise_scale_["sum"] == pytest.approx(text_scale / _SHRINK, rel=1e-9)
    assert est.delta_ == 0.0


@pytest.mark.parametrize("neighbours", ["add_remove", "replace"])
def test_gaussian_event_equals_the_gaussian_noise_drawn(spy_noise, neighbours):
    T, eps, delta, k, d = 3, 1.0, 1e-6, 3, 2
    est = model(n_iter=T, epsilon=eps, delta=delta, neighbours=neighbours).fit(blobs(200))
    plan = est._plan(d)
    dc, ds = (1.0, 1.0) if neighbours == "add_remove" else (math.sqrt(2), 2.0)
    mu_c, mu_s = (ev.noise_multiplier for ev in est.event_.event.events)
    sizes = [(kind, size) for kind, _, size in spy_noise]
    m = km_module._OVERSEED * k  # the private initialisation's candidate cells
    assert sizes == [("count", m), ("sum", m * d)] + [("count", k), ("sum", k * d)] * (T - 1)
    for kind, sigma, size in spy_noise:
        if kind == "sum":
            sigma *= plan.sum_mech.noise_plan(size).lattice.granularity
            want = mu_s * ds
        else:
            want = mu_c * dc
        assert want <= sigma <= want * (1 + 1e-9)
    # The recorded event prices to at most the ε asked for, and the calibration wastes < 0.1 %.
    zcdp = ZCDPAccountant(neighbours=neighbours).compose(est.event_).get_epsilon(delta)
    assert zcdp == est.epsilon_ and 0.999 * eps <= est.epsilon_ <= eps
    # A tighter accountant (PLD: exact for Gaussians) re-evaluates the same event lower.
    assert PLDAccountant(neighbours=neighbours).compose(est.event_).get_epsilon(delta) < est.epsilon_


def test_exact_group_sums_match_python_integers():
    rng = np.random.default_rng(SEED)
    Y = rng.uniform(-1, 1, size=(3000, 3)) * (1 - 2.0**-20)
    labels = rng.integers(0, 4, size=3000)
    lattice = Lattice(-45)
    got = km_module._exact_group_sums(Y, labels, 4, lattice)
    for j in range(4):
        for c in range(3):
            want = sum(int(round(y * 2.0**45)) for y in Y[labels == j, c])
            assert got[j, c] == want


# --- audits of one iteration's release --------------------------------------------------------


def audit(sampler, x0, x1, *, trials: int, delta: float = 0.0, seed: int = SEED):
    return estimate_epsilon(
        sampler, x0, x1, trials=trials, delta=delta, confidence=STRICT, rng=np.random.default_rng(seed)
    )


def textbook_sampler(count_mech, sum_mech, neighbours: str):
    """One iteration's release, reduced to the statistic whose upper tail shows its privacy loss:
    the smallest move, in the direction the changed row pushes, over every released coordinate
    it touches. For Laplace noise each such coordinate contributes a factor e^{Δ_i/b} to the
    probability of {statistic > t} for t >= 1, so the event reaches the full loss."""

    def sample(stats, n, rng):
        if neighbours == "add_remove":  # k = 1, d = 1: (count, sum) of the cluster
            c, s = stats
            nc = count_mech.release(np.full(n, c), rng=rng)
            ns = sum_mech.release(np.full(n, s), rng=rng)
            return np.minimum(nc - 10.0, ns - 3.0)
        c1, c2, s1, s2 = stats  # replace: the row leaves cluster 1 (s1 −= y) and joins 2 (s2 += y')
        nc = count_mech.release(np.stack([np.full(n, c1), np.full(n, c2)], axis=1), rng=rng)
        ns = sum_mech.release(np.stack([np.full(n, s1), np.full(n, s2)], axis=1), rng=rng)
        return np.minimum.reduce([11.0 - nc[:, 0], nc[:, 1] - 10.0, 3.0 - ns[:, 0], -2.0 - ns[:, 1]])

    return sample


Y_MAX = _SHRINK  # the largest normalised row norm (the unit ball, shrunk by 2^-20)
TEXTBOOK_NEIGHBOURS = {
    # x0: 10 rows summing to 3 in the cluster; x1: one row at the ball's edge added.
    "add_remove": ((10.0, 3.0), (11.0, 3.0 + Y_MAX)),
    # x0: cluster 1 holds a row at +edge; x1: it is replaced by a row at −edge in cluster 2.
    "replace": ((11.0, 10.0, 3.0, -2.0), (10.0, 11.0, 3.0 - Y_MAX, -2.0 - Y_MAX)),
}


@pytest.mark.slow
@pytest.mark.parametrize("neighbours", ["add_remove", "replace"])
def test_textbook_iteration_is_valid_and_tight(neighbours):
    T = 2
    eps = 1.0 * T if neighbours == "replace" else 2.0 * T  # one iteration claims ε = 1 either way
    plan = model(method="textbook", epsilon=eps, n_iter=T, neighbours=neighbours)._plan(1)
    claimed = BasicAccountant(neighbours=neighbours).compose(plan.step_event).get_epsilon(0.0)
    assert claimed == pytest.approx(1.0)
    x0, x1 = TEXTBOOK_NEIGHBOURS[neighbours]
    result = audit(textbook_sampler(plan.count_mech, plan.sum_mech, neighbours), x0, x1, trials=400_000)
    assert result.epsilon_lower <= claimed  # guarantee: false failure <= 1e-6
    # Tight: over 20 seeds add_remove 0.947 ± 0.011 (min 0.926), replace 0.887 ± 0.016
    # (min 0.852); 0.7 is > 11 sd below.
    assert result.epsilon_lower >= 0.7 * claimed


@pytest.mark.parametrize("neighbours", ["add_remove", "replace"])
def test_textbook_without_the_factor_two_is_caught(neighbours):
    # Lap(1/ε') instead of Lap(2/ε'): twice the claimed loss per iteration.
    T = 2
    eps = 1.0 * T if neighbours == "replace" else 2.0 * T
    plan = model(method="textbook", epsilon=eps, n_iter=T, neighbours=neighbours)._plan(1)
    claimed = BasicAccountant(neighbours=neighbours).compose(plan.step_event).get_epsilon(0.0)
    broken = dp.Laplace(epsilon=1.0, sensitivity=plan.count_mech.scale / 2.0)  # half the scale
    x0, x1 = TEXTBOOK_NEIGHBOURS[neighbours]
    result = audit(textbook_sampler(broken, broken, neighbours), x0, x1, trials=200_000)
    # Over 20 seeds add_remove 1.894 ± 0.019 (min 1.851), replace 1.788 ± 0.024 (min 1.737):
    # > 30 sd above the claim of 1.
    assert result.epsilon_lower > claimed


def gaussian_sampler(count_mech, sum_mech):
    """The likelihood-ratio statistic of one iteration (k = 1, d = 1, add/remove): the noisy count
    and sum weighted by 1/σ² — the privacy loss is monotone in it, so thresholds on it see the
    mechanism's whole (ε, δ) curve."""
    wc, ws = 1.0 / count_mech.sigma**2, 1.0 / sum_mech.sigma**2

    def sample(stats, n, rng):
        c, s = stats
        nc = count_mech.release(np.full(n, c), rng=rng)
        ns = sum_mech.release(np.full(n, s), rng=rng)
        return (nc - 10.0) * wc + (ns - 3.0) * ws

    return sample


GAUSS_EPS, GAUSS_DELTA, GAUSS_T, AUDIT_DELTA = 3.0, 1e-3, 4, 1e-3


@pytest.mark.slow
def test_gaussian_iteration_is_valid():
    plan = model(epsilon=GAUSS_EPS, delta=GAUSS_DELTA, n_iter=GAUSS_T)._plan(1)
    # The claim of one iteration, read tightly (PLD: exact for Gaussians) at the audit's δ.
    claimed = PLDAccountant().compose(plan.step_event).get_epsilon(AUDIT_DELTA)
    x0, x1 = (10.0, 3.0), (11.0, 3.0 + Y_MAX)
    result = audit(gaussian_sampler(plan.count_mech, plan.sum_mech), x0, x1, trials=1_000_000, delta=AUDIT_DELTA)
    assert result.epsilon_lower <= claimed  # guarantee: false failure <= 1e-6
    # Over 20 seeds 0.958 ± 0.025 (min 0.903) of a claim of 1.149: the Gaussian's worst case
    # lies in tails too rare to measure at this confidence (as in tests/audit), but most of the
    # loss is seen. 0.6 × claim = 0.69 is > 10 sd below.
    assert result.epsilon_lower > 0.6 * claimed


@pytest.mark.slow
def test_gaussian_spending_the_whole_budget_every_iteration_is_caught():
    # The noise of n_iter = 1 (the total ρ in one iteration) used for each of T iterations.
    plan = model(epsilon=GAUSS_EPS, delta=GAUSS_DELTA, n_iter=GAUSS_T)._plan(1)
    broken = model(epsilon=GAUSS_EPS, delta=GAUSS_DELTA, n_iter=1)._plan(1)
    claimed = PLDAccountant().compose(plan.step_event).get_epsilon(AUDIT_DELTA)
    x0, x1 = (10.0, 3.0), (11.0, 3.0 + Y_MAX)
    result = audit(gaussian_sampler(broken.count_mech, broken.sum_mech), x0, x1, trials=1_000_000, delta=AUDIT_DELTA)
    # True per-iteration ε 2.65; over 20 seeds the audit gives 2.235 ± 0.076 (min 2.108),
    # > 14 sd above the claim of 1.149.
    assert result.epsilon_lower > claimed
