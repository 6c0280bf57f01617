"""The tight ε is the smaller of two sound bounds and never above RDP's."""

from __future__ import annotations

import itertools

import pytest

from dpkit.accounting import GaussianEvent, LaplaceEvent, RDPAccountant, SelfComposedEvent, dp_sgd_event
from dpkit.accounting.tight import tight_epsilon
from dpkit.errors import InvalidParameterError


@pytest.mark.parametrize("q, sigma, steps", list(itertools.product([0.001, 0.01, 0.1], [0.6, 1.1, 2.0], [100, 1000])))
def test_tight_is_never_above_rdp(q: float, sigma: float, steps: int) -> None:
    event = dp_sgd_event(sigma, q, steps)
    t = tight_epsilon(event, 1e-5)
    rdp = RDPAccountant().compose(event).get_epsilon(1e-5)
    assert t.epsilon <= rdp
    assert t.epsilon == min(t.candidates.values()) and t.accountant in t.candidates


def test_says_which_accountant() -> None:
    t = tight_epsilon(SelfComposedEvent(LaplaceEvent(noise_multiplier=10.0), 5), 1e-6)
    assert set(t.candidates) == {"pld", "rdp"}
    assert t.accountant == min(t.candidates, key=t.candidates.get)
    assert t.epsilon <= 0.5 + 1e-9  # five Laplace(ε = 0.1): basic composition's 0.5 is sound too


def test_single_gaussian_matches_the_analytic_curve() -> None:
    from dpkit.accounting import gaussian_delta

    t = tight_epsilon(GaussianEvent(2.0), 1e-5)
    assert gaussian_delta(t.epsilon, 2.0) <= 1e-5 * (1 + 1e-6)


def test_bad_delta() -> None:
    with pytest.raises(InvalidParameterError, match="delta"):
        tight_epsilon(GaussianEvent(1.0), 1.5)
