"""Privacy accounting: events, composition theorems and accountants that turn events into (ε, δ).

Accountants share one small interface (:class:`Accountant`): ``compose(event, count)``,
``get_epsilon(delta)``, ``get_delta(epsilon)``, ``supports(event)``.

- :class:`BasicAccountant` — sequential composition of pure / approximate DP events, exact sums.
- :class:`RDPAccountant` — Rényi DP (Gaussian, Laplace, randomized response, pure DP, Poisson
  and without-replacement subsampled Gaussians).
- :class:`ZCDPAccountant` — zero-concentrated DP.
- :class:`PLDAccountant` — privacy loss distributions: the tightest numbers.

:data:`ACCOUNTANTS` maps the names ``"basic"``, ``"rdp"``, ``"zcdp"`` and ``"pld"`` to these
classes; :func:`resolve_accountant` turns a name, a class or a factory into a factory of fresh
accountants.
"""

from dpkit.accounting.accountant import Accountant
from dpkit.accounting.analytic_gaussian import analytic_gaussian_sigma, classic_gaussian_sigma, gaussian_delta
from dpkit.accounting.calibration import calibrate_noise_multiplier, dp_sgd_event
from dpkit.accounting.composition import (
    BasicAccountant,
    advanced_composition,
    advanced_composition_simple,
    basic_composition,
    group_privacy,
    optimal_homogeneous_composition,
    parallel_composition,
    post_processing,
)
from dpkit.accounting.events import (
    ApproxDPEvent,
    ComposedEvent,
    DPEvent,
    ExponentialEvent,
    GaussianEvent,
    LaplaceEvent,
    PoissonSampledEvent,
    PureDPEvent,
    RandomizedResponseEvent,
    SampledWithoutReplacementEvent,
    SelfComposedEvent,
    event_from_dict,
    event_from_json,
    event_to_dict,
    event_to_json,
)
from dpkit.accounting.pld import PLDAccountant
from dpkit.accounting.rdp import RDPAccountant
from dpkit.accounting.registry import ACCOUNTANTS, resolve_accountant
from dpkit.accounting.tight import TightEpsilon, tight_epsilon
from dpkit.accounting.zcdp import ZCDPAccountant

__all__ = [
    "Accountant",
    "BasicAccountant",
    "RDPAccountant",
    "ZCDPAccountant",
    "PLDAccountant",
    "ACCOUNTANTS",
    "resolve_accountant",
    "basic_composition",
    "parallel_composition",
    "post_processing",
    "group_privacy",
    "advanced_composition",
    "advanced_composition_simple",
    "optimal_homogeneous_composition",
    "tight_epsilon",
    "TightEpsilon",
    "calibrate_noise_multiplier",
    "dp_sgd_event",
    "gaussian_delta",
    "analytic_gaussian_sigma",
    "classic_gaussian_sigma",
    "DPEvent",
    "PureDPEvent",
    "ApproxDPEvent",
    "ExponentialEvent",
    "LaplaceEvent",
    "GaussianEvent",
    "RandomizedResponseEvent",
    "ComposedEvent",
    "SelfComposedEvent",
    "PoissonSampledEvent",
    "SampledWithoutReplacementEvent",
    "event_to_dict",
    "event_from_dict",
    "event_to_json",
    "event_from_json",
]
