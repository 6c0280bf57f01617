"""Reconstruction attacks (seed 004 ch. 1): they break naive and sticky noise, not dpkit's Laplace.

Seeds are fixed, so every test is deterministic. The thresholds are chosen so that a fresh seed
would also pass with overwhelming probability (the false-failure reasoning is in each test); a
change that breaks an attack or weakens the DP curator moves the numbers far past them.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import dpkit as dp
from dpkit.attacks.reconstruction import (
    BNP_THRESHOLD,
    DPCurator,
    IdentifierCondition,
    NaiveCurator,
    StickyCurator,
    diffix_attack,
    dinur_nissim_attack,
    exhaustive_attack,
    split_epsilon,
)
from dpkit.errors import BudgetExceededError, InvalidDataError, InvalidParameterError


def bits(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 2, n)


# -- Theorem 1.1: exhaustive attack -------------------------------------------------------------


@pytest.mark.parametrize("n,noise", [(8, 0.4), (10, 1.0), (12, 2.0), (12, 3.0)])
def test_exhaustive_attack_within_4E(n: int, noise: float) -> None:
    # Deterministic guarantee (any consistent candidate is within 4E), so no false failures.
    cur = NaiveCurator(bits(n, n), noise_bound=noise, rng=1)
    res = exhaustive_attack(cur, n)
    assert res.queries_used == 2**n == cur.queries_answered
    assert res.guarantee == 4 * noise
    assert res.hamming_errors <= 4 * noise and res.within_guarantee
    if noise < 0.5:  # consistent within E < 1/2 pins down every bit
        assert res.hamming_errors == 0


def test_exhaustive_attack_refuses_large_n_and_dp_noise() -> None:
    with pytest.raises(InvalidParameterError, match="n=17"):
        exhaustive_attack(NaiveCurator(bits(17), noise_bound=1.0, rng=0), 17)
    cur = DPCurator(bits(4), budget=dp.Budget(epsilon=100.0), epsilon_per_query=1.0, rng=np.random.default_rng(0))
    with pytest.raises(InvalidParameterError, match="error_bound"):
        exhaustive_attack(cur, 4)


# -- Theorem 1.2: Dinur–Nissim ------------------------------------------------------------------


@pytest.mark.parametrize("method", ["lp", "lp_max", "lstsq"])
def test_dinur_nissim_small_noise_reconstructs(method: str) -> None:
    # noise = 1 ≪ √n = 10: per-bit error of the fit is ~ σ/√n ≈ 0.06, so P(a bit flips) ~ 1e-15;
    # > 0.95 fails only if > 5 of 100 bits flip.
    n = 100
    cur = NaiveCurator(bits(n), noise_bound=1.0, rng=1)
    res = dinur_nissim_attack(cur, n, method=method, rng=2)
    assert res.queries_used == 4 * n
    assert res.recovered_fraction > 0.95
    assert res.blatantly_non_private and BNP_THRESHOLD == 0.9


@pytest.mark.parametrize("method", ["lp", "lstsq"])
def test_dinur_nissim_large_noise_is_guessing(method: str) -> None:
    # noise = 20√n: least-squares per-bit error sd ≈ (20/√3)·√n·2/√(4n) ≈ 11.5, so each bit is
    # right with p ≈ 0.52; recovered ~ Bin(200, 0.52)/200 (sd 0.035) and 0.7 is > 5 sd away.
    n = 200
    cur = NaiveCurator(bits(n), noise_bound=20 * math.sqrt(n), rng=1)
    res = dinur_nissim_attack(cur, n, method=method, rng=2)
    assert res.recovered_fraction < 0.7
    assert not res.blatantly_non_private


# -- Diffix ---------------------------------------------------------------------------------------


def test_sticky_noise_repeats_and_diffix_attack_defeats_it() -> None:
    n = 100
    x = bits(n)
    cur = StickyCurator(x, noise_bound=2.0, rng=1)
    # repeating a query gains nothing: same answer
    a, b = cur.query([3, 5, 7]), cur.query(np.array([3, 5, 7]))
    assert a == b and abs(a - x[[3, 5, 7]].sum()) <= 2.0
    # a dummy condition that holds for the row changes the noise but not the count
    cond = IdentifierCondition(mult=5, offset=1, modulus=1_000_003)
    c = cur.query([3], conditions=(cond,))
    assert c != cur.query([3]) and abs(c - x[3]) <= 2.0
    # averaging 32 equivalent queries: error sd = 2/√96 ≈ 0.2, a bit flips w.p. ≈ 1.3%;
    # > 0.95 fails only if ≥ 5 of 100 flip (P ≈ 0.04 for a fresh seed; deterministic here).
    res = diffix_attack(cur, n, repeats=32, rng=2)
    assert res.recovered_fraction > 0.95 and res.blatantly_non_private
    assert res.queries_used == 32 * n
    # noise 2 ≥ 1 per answer, so answering one query at a time gives only ~guessing per bit
    naive_guess = np.array([cur.query([i]) >= 0.5 for i in range(n)])
    assert np.mean(naive_guess == x) < res.recovered_fraction


# -- dpkit's DP curator -----------------------------------------------------------------------------


def test_dp_curator_refuses_when_budget_spent() -> None:
    n = 50
    budget = dp.Budget(epsilon=1.0)
    cur = DPCurator(bits(n), budget=budget, epsilon_per_query=0.25, rng=np.random.default_rng(0))
    for _ in range(4):
        cur.query(np.arange(10))
    assert budget.remaining == 0.0 and cur.queries_answered == 4
    with pytest.raises(BudgetExceededError):
        cur.query(np.arange(10))
    assert cur.queries_answered == 4 and len(budget.events) == 4  # nothing recorded or released
    with pytest.raises(BudgetExceededError):
        dinur_nissim_attack(cur, n, rng=1)


def test_dp_curator_spends_laplace_events() -> None:
    budget = dp.Budget(epsilon=1.0)
    cur = DPCurator(bits(10), budget=budget, epsilon_per_query=0.5, rng=np.random.default_rng(0))
    cur.query([1, 2])
    assert budget.events == (cur.mechanism.event,)
    assert cur.mechanism.scale == 2.0 and cur.mechanism.sensitivity == 1.0


def test_split_epsilon_fits_exactly() -> None:
    for k in (3, 7, 400, 4000):
        eps = split_epsilon(1.0, k)
        b = dp.Budget(epsilon=1.0)
        b.spend(dp.Laplace(epsilon=eps).event, count=k)  # does not raise
        assert eps == pytest.approx(1.0 / k, rel=1e-12)


def test_dp_curator_defeats_dinur_nissim() -> None:
    # Total ε = 1 over 4n = 800 queries: Laplace scale 800 per answer, per-bit fit error sd ≈
    # 800·√2·2/√800 ≈ 80 ≫ 1/2, so each bit is right with p ≤ 0.51; recovered ~ Bin(200, ≤0.51)/200
    # (sd 0.035) and 0.6 is ≈ 2.6 sd away (P ≈ 0.5% for a fresh seed; fixed seed here).
    n = 200
    budget = dp.Budget(epsilon=1.0)
    cur = DPCurator(bits(n), budget=budget, epsilon_per_query=split_epsilon(1.0, 4 * n), rng=np.random.default_rng(3))
    res = dinur_nissim_attack(cur, n, rng=4)
    assert res.queries_used == 4 * n and cur.queries_answered == 4 * n
    assert res.recovered_fraction <= 0.6 and not res.blatantly_non_private
    assert budget.spent[0] <= 1.0


def test_broken_dp_curator_is_caught() -> None:
    # The deliberately broken variant (STYLE §11): ε = 50 per query is "DP" in name only, and the
    # same attack and threshold flag it — so the test above can fail.
    n = 200
    cur = DPCurator(
        bits(n), budget=dp.Budget(epsilon=50.0 * 4 * n), epsilon_per_query=50.0, rng=np.random.default_rng(3)
    )
    res = dinur_nissim_attack(cur, n, rng=4)
    assert res.recovered_fraction > 0.6 and res.blatantly_non_private


# -- bad input ----------------------------------------------------------------------------------------


def test_bad_input_errors() -> None:
    with pytest.raises(InvalidParameterError, match="n=0"):
        dinur_nissim_attack(NaiveCurator(bits(5), noise_bound=1.0, rng=0), 0)
    with pytest.raises(InvalidParameterError, match="n=0"):
        exhaustive_attack(NaiveCurator(bits(5), noise_bound=1.0, rng=0), 0)
    with pytest.raises(InvalidParameterError, match="n=6"):  # n must match the curator
        dinur_nissim_attack(NaiveCurator(bits(5), noise_bound=1.0, rng=0), 6)
    for bad in (-1.0, math.nan, math.inf):
        with pytest.raises(InvalidParameterError, match="noise_bound"):
            NaiveCurator(bits(5), noise_bound=bad)
        with pytest.raises(InvalidParameterError, match="noise_bound"):
            StickyCurator(bits(5), noise_bound=bad)
    for x in ([0, 1, 2], [0.5, 1.0], [[0, 1]], [], ["a", "b"]):
        with pytest.raises(InvalidDataError, match="x"):
            NaiveCurator(x, noise_bound=1.0)
    with pytest.raises(InvalidDataError):
        DPCurator([0, 3], budget=dp.Budget(epsilon=1.0), epsilon_per_query=0.1)
    with pytest.raises(InvalidParameterError, match="method"):
        dinur_nissim_attack(NaiveCurator(bits(5), noise_bound=1.0, rng=0), 5, method="magic")  # type: ignore[arg-type]
    with pytest.raises(InvalidParameterError, match="budget"):
        DPCurator(bits(5), budget=1.0, epsilon_per_query=0.1)  # type: ignore[arg-type]
    with pytest.raises(InvalidParameterError, match="epsilon"):
        DPCurator(bits(5), budget=dp.Budget(epsilon=1.0), epsilon_per_query=-1.0)
    with pytest.raises(InvalidParameterError, match="curator"):
        diffix_attack(NaiveCurator(bits(5), noise_bound=1.0, rng=0), 5)  # type: ignore[arg-type]
    with pytest.raises(InvalidDataError, match="subset"):
        NaiveCurator(bits(5), noise_bound=1.0, rng=0).query([7])
    with pytest.raises(InvalidParameterError, match="total_epsilon"):
        split_epsilon(0.0, 10)
