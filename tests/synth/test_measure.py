"""The measurement step of dpkit.synth: the noise every marginal cell gets, audited against the
ε its ρ claims, and a broken twin (half the noise) that the audit catches.

Statistical: two audits at confidence 0.999 (each falsely fails with probability at most 1e-3;
fixed seeds, so the run is reproducible)."""

from __future__ import annotations

import numpy as np

from dpkit.accounting.zcdp import zcdp_to_approx_dp
from dpkit.audit import estimate_epsilon
from dpkit.synth.measure import noisy

SIGMA = 2.0
DELTA = 0.01  # where both the honest bound (ε ≈ 1.13) and the broken twin's excess are measurable


def _sampler(sigma: float):  # type: ignore[no-untyped-def]
    # One marginal cell of count x (sensitivity 1 under add/remove), n independent releases.
    return lambda x, n, rng: noisy(np.full(n, x, dtype=np.int64), sigma, rng)


def test_a_cell_is_no_less_private_than_its_rho_claims() -> None:
    claim = zcdp_to_approx_dp(1 / (2 * SIGMA**2), DELTA)
    result = estimate_epsilon(_sampler(SIGMA), 0, 1, delta=DELTA, confidence=0.999, rng=np.random.default_rng(11))
    assert result.epsilon_lower <= claim, (result, claim)


def test_half_the_noise_is_caught() -> None:
    """The power check: the same claim with σ/2 noise is refuted."""
    claim = zcdp_to_approx_dp(1 / (2 * SIGMA**2), DELTA)
    result = estimate_epsilon(_sampler(SIGMA / 2), 0, 1, delta=DELTA, confidence=0.999, rng=np.random.default_rng(12))
    assert result.epsilon_lower > claim, (result, claim)
