"""Empirical ε audits of the sparse vector technique and of broken variants (Lyu, Su & Li 2017).

Guarantee checks run :func:`dpkit.audit.estimate_epsilon` at confidence 1 − 1e-6 on worst-case
neighbouring answer vectors (every answer moves by ±Δ): a correct mechanism fails one with
probability at most 1e-6 (Clopper–Pearson plus the selection/evaluation split), about 3e-6 for the
file. Power checks run the same estimator on broken twins built from the public pieces
(:meth:`AboveThreshold.noise_plan`, the exact discrete Laplace sampler): a bound above the claimed
ε is a statistically sound proof (again at 1 − 1e-6) that the twin is not ε-DP. Outputs are mapped
to integers (an index, a bitmask, a count statistic): any such map is post-processing, so it can
never make a correct mechanism look worse. Fixed seeds: every test is deterministic.
"""

from __future__ import annotations

import numpy as np

from dpkit.audit import estimate_epsilon
from dpkit.mechanisms.sparse_vector import AboveThreshold, Sparse
from dpkit.noise.discrete import sample_discrete_laplace
from dpkit.noise.source import resolve_rng

SEED = 20240613
STRICT = 1 - 1e-6


def audit(sampler, x0, x1, *, trials: int):
    return estimate_epsilon(sampler, x0, x1, trials=trials, confidence=STRICT, rng=np.random.default_rng(SEED))


# --- correct mechanisms --------------------------------------------------------------------------


def test_above_threshold_within_epsilon():
    # Worst case for the index (Lyu et al. 2017, proof of Thm 2): earlier answers move up by Δ
    # (stopping earlier) while the last moves down.
    at = AboveThreshold(epsilon=1.0, threshold=0.5)
    x0, x1 = [0.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 0.0]
    res = audit(lambda q, n, rng: at.release_batch(q, n, rng=rng), x0, x1, trials=200_000)
    print("AboveThreshold ε=1:", res.epsilon_lower)
    assert res.epsilon_lower <= at.epsilon
    assert res.epsilon_lower > 0.1  # the audit sees a real privacy loss (not vacuous)


def test_above_threshold_monotonic_within_epsilon():
    at = AboveThreshold(epsilon=1.0, threshold=0.5, monotonic=True)
    x0, x1 = [0.0] * 4, [1.0] * 4  # monotonic neighbours: all move together
    res = audit(lambda q, n, rng: at.release_batch(q, n, rng=rng), x0, x1, trials=200_000)
    print("AboveThreshold monotonic ε=1:", res.epsilon_lower)
    assert res.epsilon_lower <= at.epsilon


def _bitmask(matrix: np.ndarray) -> np.ndarray:
    return (matrix.astype(np.int64) << np.arange(matrix.shape[1], dtype=np.int64)).sum(axis=1)


def test_sparse_within_epsilon():
    sp = Sparse(epsilon=1.0, threshold=0.5, max_positives=2)
    x0, x1 = [0.0, 0.0, 1.0, 0.0, 1.0], [1.0, 1.0, 0.0, 1.0, 0.0]
    res = audit(lambda q, n, rng: _bitmask(sp.release_batch(q, n, rng=rng)), x0, x1, trials=200_000)
    print("Sparse c=2 ε=1:", res.epsilon_lower)
    assert res.epsilon_lower <= sp.epsilon


# --- broken twins (Lyu, Su & Li 2017) ------------------------------------------------------------


def _noisy(plan, q, n, src, *, threshold_noise=True, query_noise=True):
    points = plan.snap_values(np.asarray(q, dtype=np.float64))
    t0 = int(plan.snap_values(np.array([0.5]))[0])
    t_hat = t0 + (sample_discrete_laplace(plan.threshold_noise(), n, src) if threshold_noise else np.zeros(n, np.int64))
    noisy = np.broadcast_to(points, (n, points.size)).copy()
    if query_noise:
        noisy += sample_discrete_laplace(plan.query_noise(), n * points.size, src).reshape(n, points.size)
    return noisy, t_hat


def _first(ok: np.ndarray) -> np.ndarray:
    return np.where(ok.any(axis=1), ok.argmax(axis=1), -1)


def test_broken_no_query_noise_is_caught():
    # Lyu et al. 2017, Alg. 5 / Stoddard et al.: noisy threshold, exact answers. [0, 1] can stop at
    # index 1; [1, 0] never can (if 0 >= T̂ then 1 >= T̂ already): infinite privacy loss.
    plan = AboveThreshold(epsilon=1.0, threshold=0.5).noise_plan()

    def sample(q, n, rng):
        noisy, t_hat = _noisy(plan, q, n, resolve_rng(rng), query_noise=False)
        return _first(noisy >= t_hat[:, None])

    res = audit(sample, [0.0, 1.0], [1.0, 0.0], trials=50_000)
    print("no query noise, claimed 1:", res.epsilon_lower)
    assert res.epsilon_lower > 1.0


def test_broken_release_noisy_value_is_caught():
    # Lyu et al. 2017, Alg. 3 (Roth's notes): the positive's noisy answer q_k + ν_k is released
    # with its index. It pins ν_k, so the proof's shift of ν_k cannot hide the earlier answers'
    # move; with a low released value (T̂ <= v is low) every earlier answer that moved up costs ε/4.
    eps = 4.0
    at = AboveThreshold(epsilon=eps, threshold=0.5)
    plan = at.noise_plan()
    m = 16

    def sample(q, n, rng):
        noisy, t_hat = _noisy(plan, q, n, resolve_rng(rng))
        idx = _first(noisy >= t_hat[:, None])
        value = noisy[np.arange(n), np.maximum(idx, 0)] * plan.granularity
        low = value <= 1.0
        return np.where(idx < 0, -1, idx + m * low)  # index, and whether the value was low

    x0 = [0.0] * (m - 1) + [1.0]
    x1 = [1.0] * (m - 1) + [0.0]
    res = audit(sample, x0, x1, trials=2_000_000)
    print("value released, claimed", eps, ":", res.epsilon_lower, res)
    assert res.epsilon_lower > eps


def test_broken_no_stopping_is_caught():
    # Lyu et al. 2017, Alg. 4/6 style: budget split for c = 1 positive (T + Lap(2Δ/ε), answers
    # + Lap(4Δ/ε)) but ⊤/⊥ answered for every query instead of halting. Half the answers move up,
    # half down; the statistic #⊤(first half) − #⊤(second half) separates the neighbours by far
    # more than e^ε allows (each answer leaks ~ε/4 on its own).
    eps, h = 1.0, 24
    plan = AboveThreshold(epsilon=eps, threshold=0.5).noise_plan()

    def sample(q, n, rng):
        noisy, t_hat = _noisy(plan, q, n, resolve_rng(rng))
        above = noisy >= t_hat[:, None]
        return above[:, :h].sum(axis=1) - above[:, h:].sum(axis=1)

    x0 = [0.0] * h + [1.0] * h
    x1 = [1.0] * h + [0.0] * h
    res = audit(sample, x0, x1, trials=100_000)
    print("no stopping, claimed", eps, ":", res.epsilon_lower)
    assert res.epsilon_lower > eps
