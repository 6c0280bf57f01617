"""Rényi differential privacy (RDP) accounting — the moments accountant.

A mechanism M is (α, R)-RDP (Mironov 2017) if D_α(M(x) ‖ M(x')) <= R for all neighbours x, x',
where D_α(P ‖ Q) = 1/(α − 1) · ln E_Q[(P/Q)^α]. RDP composes by addition at every order
(Mironov 2017, Prop 1), so the accountant keeps one
number per order α and converts to (ε, δ) at the end, minimising over the orders.

Per-event RDP curves (each registered in a table keyed by event type — no if/elif ladder):

* ``GaussianEvent(σ)``: α / (2σ²) (Mironov 2017, Prop 7), exact.
* ``LaplaceEvent(b)``: with ε = 1/b, for α > 1
  R(α) = 1/(α − 1) · ln(α/(2α − 1) · e^{(α−1)ε} + (α − 1)/(2α − 1) · e^{−αε})
  (Mironov 2017, Table II), exact; evaluated as ε + log1p((α−1)/(2α−1) · expm1(−(2α−1)ε))/(α−1).
* ``RandomizedResponseEvent(p, k)`` (replace neighbours): the exact divergence between the
  output distributions for two different true answers, P = (p, q, …, q), Q = (q, p, q, …, q),
  q = (1 − p)/(k − 1).
* ``PureDPEvent(ε)``: the tight bound for ε-DP, R(α) = 1/(α−1) · ln[(sinh(αε) − sinh((α−1)ε))
  / sinh(ε)] (Bun & Steinke 2016, Prop 3.3 and its proof). It is the divergence of binary
  randomized response at e^ε, which every ε-DP pair post-processes (Kairouz, Oh & Viswanath 2015),
  and it is <= min(ε, αε²/2), the bound usually quoted.
* ``ExponentialEvent(ε)``: min(pure-DP bound above, αε²/8) — ε-bounded range gives ε²/8-zCDP
  (Cesar & Rogers 2021, Lemma 3.2).
* ``ApproxDPEvent(ε, δ)``: δ = 0 is pure DP; δ > 0 is unsupported (an (ε, δ)-DP mechanism may
  have D_α = ∞ at every α).
* ``PoissonSampledEvent(q, Gaussian…)``: Mironov, Talwar & Zhang 2019 (add/remove neighbours).
  Integer α: A_α = Σ_i C(α, i) q^i (1 − q)^{α−i} e^{(i² − i)/(2σ²)}; we sum A_α − 1 (terms
  i >= 2 only, each weight times expm1(·)) in log space, so tiny q keeps full relative precision.
  Fractional α: the two series of their Sec 3.3 (split at z₀ = σ² ln(1/q − 1) + 1/2) with the
  generalised binomial coefficients in absolute value, summed until both terms decrease and fall
  30 nats below the running total, as dp_accounting does (values agree to ~1e-9). For k > ⌈α⌉
  the true coefficients alternate in sign, so the absolute-value sum over-counts every negative
  term it has summed, while the omitted alternating tail is at most its first term (< e^{-30} of
  the total); the tests check the result lies above a 40-digit quadrature of A_α. Where a
  series has not converged after 2,048 terms (q large, σ small, α near 1 — dp_accounting then
  drops the order) we use the convex interpolation of the integer orders around α (ln A_α is a
  cumulant generating function, hence convex in α), an upper bound. Every order is also capped by the unsampled
  Gaussian's α/(2σ²) (quasi-convexity of Rényi divergence).
* ``SampledWithoutReplacementEvent(n, m, Gaussian…)``: Wang, Balle & Kasiviswanathan 2019,
  Theorem 9 with γ = m/n, for integer α >= 2, with the Gaussian's ε(j) = j/(2σ²) and
  ε(∞) = ∞; capped by α/(2σ²). A fractional α takes the smaller of the bound at ⌈α⌉ (RDP is
  non-decreasing in α) and the convex interpolation between ⌊α⌋ and ⌈α⌉ (their Corollary 10;
  at ⌊α⌋ = 1 the cumulant is 0). The theorem is for replace-one neighbours on a dataset of
  public size n, so it needs an accountant with ``neighbours="replace"``.
* ``ComposedEvent`` / ``SelfComposedEvent``: sums (count multiplies).

Neighbours: the accountant has one relation; every leaf event must carry the same one (a
GaussianEvent calibrated to add/remove sensitivity is *not* accounted under replace).
Poisson subsampling needs add_remove, sampling without replacement needs replace.

Conversion to (ε, δ) (``conversion="improved"``, the default): per order the smaller of
Canonne–Kamath–Steinke 2020 Prop 12 / Balle et al. 2020 Thm 21,
ε = R(α) + ln((α − 1)/α) − (ln δ + ln α)/(α − 1), and Mironov 2017 Prop 3,
ε = R(α) + ln(1/δ)/(α − 1); plus ε = 0 when δ >= √(1 − e^{−R(α)}) (KL <= R(α), then
Bretagnolle–Huber bounds the total variation). The improved bound is always the smaller of the
first two; ``conversion="classic"`` uses Mironov's alone. The minimum over orders is rounded up.
δ = 0 gives ε = ∞ (unless nothing has been spent): RDP at a finite order bounds the privacy
loss only in the tail-probability sense, and δ → 0 needs α → ∞.

Rounding: composition rounds each sum up by one ulp; conversions add a bound on their own
floating-point error before rounding up. The RDP curves themselves are double-precision
evaluations (relative error well below 1e-9 in the tested ranges), not interval arithmetic.

>>> from dpkit.accounting.events import GaussianEvent, PoissonSampledEvent, SelfComposedEvent
>>> acc = RDPAccountant()
>>> acc.compose(SelfComposedEvent(PoissonSampledEvent(256 / 60000, GaussianEvent(1.1)), 23400))
RDPAccountant(neighbours='add_remove', orders=173)
>>> round(acc.get_epsilon(1e-5), 2)
3.43

The code is in three layers: :mod:`~dpkit.accounting.rdp.curves` (per-mechanism curves and the
orders), :mod:`~dpkit.accounting.rdp.conversion` (RDP → (ε, δ)) and
:mod:`~dpkit.accounting.rdp.accountant` (the rule table and :class:`RDPAccountant`).
"""

from __future__ import annotations

from dpkit.accounting.rdp.accountant import RDPAccountant, event_rdp, register_rdp
from dpkit.accounting.rdp.conversion import rdp_to_delta, rdp_to_epsilon
from dpkit.accounting.rdp.curves import (
    DEFAULT_RDP_ORDERS,
    gaussian_rdp,
    laplace_rdp,
    poisson_subsampled_gaussian_rdp,
    pure_dp_rdp,
    randomized_response_rdp,
    sampled_without_replacement_gaussian_rdp,
)

__all__ = [
    "RDPAccountant",
    "DEFAULT_RDP_ORDERS",
    "register_rdp",
    "event_rdp",
    "gaussian_rdp",
    "laplace_rdp",
    "randomized_response_rdp",
    "pure_dp_rdp",
    "poisson_subsampled_gaussian_rdp",
    "sampled_without_replacement_gaussian_rdp",
    "rdp_to_epsilon",
    "rdp_to_delta",
]
