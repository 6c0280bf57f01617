"""Canary audits of whole training runs (dpkit.audit.canary).

The mechanism under audit is full-batch noisy gradient descent with per-example clipping on a
logistic model (numpy), claimed (ε = 1, δ = 1e-5)-DP by dpkit's PLD accountant for
``SelfComposedEvent(GaussianEvent(σ), steps)``. The canary is an example with a feature no other
example uses, so its clipped gradient is never cancelled and the canary's margin is (nearly) the
Gaussian mechanism itself: the audit is close to the worst case.

* **Guarantee** — the correct training's bound never exceeds its claim; at confidence 1 − 1e-6
  a false failure has probability at most 1e-6 (the audit's theorem, each training an
  independent trial).
* **Power** — two deliberately broken trainings, each still claiming ε = 1, must be caught (bound
  above 1 at the same strict confidence): noise 10× too small, and no clipping. Over 6 seeds in
  development (trials = 1000): noise/10 bound 2.27 ± 0.14 (min 2.08); no clipping 3.40 ± 0.17
  (min 3.11); the correct training's bound was 0 in every run. The thresholds sit 9 and 14
  standard deviations below those means. Seeds are fixed: the tests are deterministic.
"""

from __future__ import annotations

import numpy as np
import pytest

from dpkit.accounting import GaussianEvent, PLDAccountant, SelfComposedEvent, calibrate_noise_multiplier
from dpkit.audit.canary import CanaryAuditResult, canary_audit, insert_canary
from dpkit.errors import InvalidDataError, InvalidParameterError

SEED = 20240615
STRICT = 1 - 1e-6
CLAIMED, DELTA, STEPS = 1.0, 1e-5, 10
N, D = 50, 5
B = 100.0  # the canary's private feature: its raw gradient is ~50× the clipping norm
LR = 0.003  # small steps keep the canary's margin away from saturation


def dataset():
    rng = np.random.default_rng(SEED)
    X = np.hstack([rng.normal(size=(N, D)), np.zeros((N, 1))])  # last feature: unused by the data
    y = (X[:, 0] > 0).astype(float)
    return X, y


CANARY = (np.r_[np.zeros(D), B], 1.0)


def sigma_for_claim() -> float:
    sigma = calibrate_noise_multiplier(epsilon=CLAIMED, delta=DELTA, accountant=PLDAccountant, steps=STEPS)
    assert PLDAccountant().compose(SelfComposedEvent(GaussianEvent(sigma), STEPS)).get_epsilon(DELTA) <= CLAIMED
    return sigma


def noisy_gd(noise_multiplier: float, *, clip: float | None = 1.0):
    """Full-batch DP gradient descent; ``clip=None`` forgets to clip (the noise stays σ·1)."""
    C = 1.0 if clip is None else clip

    def train(data, rng):
        X, y = data
        w = np.zeros(X.shape[1])
        for _ in range(STEPS):
            p = 0.5 * (1.0 + np.tanh(0.5 * (X @ w)))
            G = (p - y)[:, None] * X
            if clip is not None:
                G *= np.minimum(1.0, clip / np.maximum(np.linalg.norm(G, axis=1), 1e-300))[:, None]
            w -= LR * (G.sum(axis=0) + rng.normal(0.0, noise_multiplier * C, X.shape[1])) / N
        return w

    return train


def margin_score(w, canary):
    """Loss-like: the canary's negative margin (lower when the canary was trained on)."""
    return -float(w @ canary[0])


def audit(train, trials=1000):
    return canary_audit(
        train,
        dataset(),
        CANARY,
        score_fn=margin_score,
        trials=trials,
        confidence=STRICT,
        delta=DELTA,
        rng=np.random.default_rng(SEED),
    )


# --- guarantee and power ----------------------------------------------------------------------


def test_correct_dp_training_is_not_caught():
    r = audit(noisy_gd(sigma_for_claim()))
    assert isinstance(r, CanaryAuditResult)
    assert r.epsilon_lower <= CLAIMED
    assert r.scores_with.shape == r.scores_without.shape == (1000,)
    assert r.auc > 0.5  # the canary does move the model, just not more than ε allows
    assert "canary audit" in str(r)


def test_noise_ten_times_too_small_is_caught():
    r = audit(noisy_gd(sigma_for_claim() / 10))
    assert r.epsilon_lower > CLAIMED


def test_missing_clipping_is_caught():
    r = audit(noisy_gd(sigma_for_claim(), clip=None))
    assert r.epsilon_lower > CLAIMED


def test_laplace_counting_query_is_tight():
    # A mechanism with exactly ε = 1 for add/remove: a clipped sum plus Laplace(1) noise.
    def train(data, rng):
        return float(np.clip(data, 0, 1).sum() + rng.laplace(0.0, 1.0))

    r = canary_audit(
        train,
        np.zeros(20),
        1.0,
        score_fn=lambda m, c: m,
        trials=4000,
        confidence=STRICT,
        rng=np.random.default_rng(SEED),
    )
    assert 0.4 < r.epsilon_lower <= 1.0


# --- inserting the canary ---------------------------------------------------------------------


def test_insert_canary_formats():
    X, y = np.zeros((3, 2)), np.zeros(3)
    X2, y2 = insert_canary((X, y), (np.ones(2), 1.0))
    assert X2.shape == (4, 2) and y2.shape == (4,) and X2[-1].tolist() == [1.0, 1.0] and y2[-1] == 1.0
    assert insert_canary(np.zeros((3, 2)), [5, 6]).shape == (4, 2)
    assert insert_canary([1, 2], 3) == [1, 2, 3]
    with pytest.raises(InvalidDataError):
        insert_canary((X, y), np.ones(2))  # one component for two
    with pytest.raises(InvalidDataError):
        insert_canary("abc", "d")
    torch = pytest.importorskip("torch")
    Xt, yt = insert_canary((torch.zeros(3, 2), torch.zeros(3, dtype=torch.long)), (torch.ones(2), 1))
    assert Xt.shape == (4, 2) and yt.tolist() == [0, 0, 0, 1]


def test_custom_insert_and_the_scores_seen():
    seen = []

    def train(data, rng):
        seen.append(len(data))
        return len(data) + rng.normal()

    r = canary_audit(
        train,
        ["a", "b"],
        "c",
        score_fn=lambda m, c: m,
        trials=100,
        rng=np.random.default_rng(0),
        insert=lambda d, c: d + [c, c],
    )
    assert sorted(set(seen)) == [2, 4] and len(seen) == 200
    assert np.mean(r.scores_with) > np.mean(r.scores_without)


# --- validation ------------------------------------------------------------------------------


def _train(data, rng):
    return rng.normal()


@pytest.mark.parametrize(
    "kw,name",
    [
        ({"trials": 99}, "trials"),
        ({"confidence": 0.0}, "confidence"),
        ({"delta": -0.1}, "delta"),
        ({"rng": None}, "rng"),
        ({"events": "everything"}, "events"),
        ({"score_fn": 3}, "score_fn"),
        ({"insert": 3}, "insert"),
    ],
)
def test_bad_parameters(kw, name):
    args = dict(score_fn=lambda m, c: m, trials=100, rng=np.random.default_rng(0))
    args.update(kw)
    with pytest.raises(InvalidParameterError) as info:
        canary_audit(_train, [1.0], 2.0, **args)
    assert info.value.name == name
    with pytest.raises(InvalidParameterError) as info:
        canary_audit("not callable", [1.0], 2.0, score_fn=lambda m, c: m, trials=100, rng=np.random.default_rng(0))
    assert info.value.name == "train_fn"


@pytest.mark.parametrize("bad", [float("nan"), "high", None])
def test_bad_scores(bad):
    with pytest.raises(InvalidDataError) as info:
        canary_audit(_train, [1.0], 2.0, score_fn=lambda m, c: bad, trials=100, rng=np.random.default_rng(0))
    assert info.value.name == "score_fn"
