"""Per-mechanism privacy loss distributions: the dominating pair of each leaf event, discretised.

Proof step 1 (*dominating pairs*). Each event has a pair (P, Q) with δ_M(ε) <= H_{e^ε}(P ‖ Q)
for all ε ∈ ℝ, per direction of the neighbour relation (``remove``: the record is in the first
dataset; ``add``: in the second): the Gaussian and Laplace location pairs N(1, σ²) vs N(0, σ²)
and Lap(1, b) vs Lap(0, b) (noise relative to the sensitivity); their Poisson(q) mixtures
(qP + (1−q)Q, Q) for ``remove`` and the reverse for ``add`` (Zhu, Dong & Wang 2022, subsampling
of dominating pairs); the randomized-response output pair; and for ``PureDPEvent`` /
``ExponentialEvent`` / ``ApproxDPEvent`` the canonical binary pair of (ε, δ)-DP, which
dominates every (ε, δ)-DP mechanism (Kairouz, Oh & Viswanath 2015).

Unsubsampled Gaussians compose exactly (one Gaussian with μ² = Σ σ_i^{-2}) and are answered by
the analytic Gaussian curve (Balle & Wang 2018, Thm 8), rounded up, with no grid at all.
The numbered steps are those of :mod:`dpkit.accounting.pld`.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
from scipy.special import expit, ndtr, ndtri

from dpkit.accounting.analytic_gaussian import gaussian_delta
from dpkit.accounting.pld.pmf import (
    _MAX_BINS,
    _PMF,
    _Coarsen,
    _ctd,
    _from_atoms,
    _reverse_pmf,
)
from dpkit.accounting.rounding import down2, log_up, to_float_down, to_float_up, up2

# ------------------------------------------------------------------------------ mechanisms


def _grid_size_ok(j0: int, j1: int) -> None:
    if j1 - j0 + 1 > _MAX_BINS:
        raise _Coarsen((j1 - j0 + 1) / _MAX_BINS)


def _phi_pair(y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(Φ(y), Φ(−y)), each accurate to a few ulps relative where it is the smaller one."""
    small = ndtr(-np.abs(y))
    big = 1.0 - small
    neg = y < 0
    return np.where(neg, small, big), np.where(neg, big, small)


def _grid_index_up(x: float, h: float) -> int:
    """The smallest j with j·h >= x, in exact arithmetic on the two doubles."""
    return math.ceil(Fraction(x) / Fraction(h))


def _grid_index_down(x: float, h: float) -> int:
    return math.floor(Fraction(x) / Fraction(h))


def _gaussian(mu: float, h: float, tau: float) -> _PMF:
    """N(μ²/2, μ²) under P and N(−μ²/2, μ²) under Q (the Gaussian mechanism with μ = Δ/σ);
    symmetric. Loss mass beyond ±z·μ of the mean (z = Φ⁻¹(1 − τ)) moves to +∞ / the bottom."""
    z = -float(ndtri(tau))
    m = mu * mu / 2
    j0 = math.floor((m - z * mu) / h)
    j1 = math.ceil((m + z * mu) / h)
    _grid_size_ok(j0, j1)

    def tails(eps: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        CP, TP = _phi_pair((eps - m) / mu)
        CQ, TQ = _phi_pair((eps + m) / mu)
        return TP, CP, TQ, CQ

    pmf, _ = _ctd(h, j0, j1, tails, top=None)
    return pmf


def _log_ratio_threshold(eps: np.ndarray, q: float) -> np.ndarray:
    """ln r with r = 1 + (e^ε − 1)/q: the un-subsampled loss whose subsampled loss
    ln(1 − q + q e^ρ) equals ε; −∞ where ε <= ln(1 − q)."""
    if q == 1.0:
        return eps.copy()
    out = np.full(eps.shape, -np.inf)
    lmin = math.log1p(-q)
    ok = eps > lmin
    small = ok & (eps < 1.0)
    big = ok & ~small
    with np.errstate(divide="ignore", invalid="ignore"):
        out[small] = np.log1p(np.expm1(eps[small]) / q)
        out[big] = eps[big] - math.log(q) + np.log1p(-(1 - q) * np.exp(-eps[big]))
    return out


def _subsampled_gaussian(sigma: float, q: float, h: float, tau: float) -> tuple[_PMF, float]:
    """``remove`` PMF of Poisson(q)-subsampled N(0, σ²) with sensitivity 1:
    P = (1−q)N(0, σ²) + qN(−1, σ²), Q = N(0, σ²), loss ln(1 − q + q e^{−(2x+1)/(2σ²)}),
    decreasing in x. Returns (pmf, Q-mass not covered) for the reversal to ``add``."""
    z = -float(ndtri(tau))
    s2 = sigma * sigma
    x_lo = -1.0 - z * sigma  # P(x < x_lo) <= Φ(−z) = τ
    lmin = math.log1p(-q)
    lmax = float(np.logaddexp(lmin, math.log(q) - (2 * x_lo + 1) / (2 * s2)))
    j0 = math.floor(lmin / h)  # below ln(1 − q): no loss, the bottom cell is empty
    j1 = math.ceil(lmax / h)
    _grid_size_ok(j0, j1)

    def tails(eps: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        with np.errstate(invalid="ignore"):
            x = -s2 * _log_ratio_threshold(eps, q) - 0.5  # loss > ε ⇔ x < x(ε); +∞ below ln(1−q)
        F1, S1 = _phi_pair(x / sigma)
        F2, S2 = _phi_pair((x + 1.0) / sigma)
        return (1 - q) * F1 + q * F2, (1 - q) * S1 + q * S2, F1, S1

    return _ctd(h, j0, j1, tails, top=None)


def _laplace_cdf_pair(x: np.ndarray, b: float) -> tuple[np.ndarray, np.ndarray]:
    """(F(x), 1 − F(x)) of Laplace(0, b), each accurate where small."""
    small = 0.5 * np.exp(-np.abs(x) / b)
    big = 1.0 - small
    neg = x < 0
    return np.where(neg, small, big), np.where(neg, big, small)


def _laplace(b: float, q: float, h: float) -> tuple[_PMF, float, int]:
    """``remove`` PMF of Poisson(q)-subsampled Laplace(b) with sensitivity 1 (q = 1: plain):
    P = (1−q)Lap(0, b) + qLap(−1, b), Q = Lap(0, b); loss ln(1 − q + q e^{ρ(x)}) with
    ρ(x) = (|x| − |x+1|)/b ∈ [−1/b, 1/b]. Bounded losses, no truncation, no mass at +∞.
    Returns (pmf, Q-mass not covered, lowest grid index)."""
    ib = 1.0 / b
    if q == 1.0:
        lmax, lmin = to_float_up(1 / Fraction(b)), to_float_down(-1 / Fraction(b))
    else:
        lq, l1q = math.log(q), math.log1p(-q)
        lmax = up2(float(np.logaddexp(l1q, lq + ib)), 8)
        lmin = down2(float(np.logaddexp(l1q, lq - ib)), 8)
    j0 = _grid_index_down(lmin, h)
    j1 = _grid_index_up(lmax, h)
    _grid_size_ok(j0, j1)

    def tails(eps: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        lr = _log_ratio_threshold(eps, q)
        x = np.where(lr >= ib, -np.inf, np.where(lr < -ib, np.inf, -(b * np.clip(lr, -ib, ib) + 1.0) / 2.0))
        F1, S1 = _laplace_cdf_pair(x, b)
        F2, S2 = _laplace_cdf_pair(x + 1.0, b)
        return (1 - q) * F1 + q * F2, (1 - q) * S1 + q * S2, F1, S1

    pmf, deficit = _ctd(h, j0, j1, tails, top=j1)
    return pmf, deficit, j0


def _gaussian_delta_up(mu: float, eps: float) -> float:
    """δ(ε) of the Gaussian mechanism with μ = Δ/σ (Balle & Wang 2018, Thm 8), rounded up."""
    d = gaussian_delta(eps, down2(1.0 / mu))
    return min(1.0, max(up2(d * (1 + 1e-10)), 5e-324))


def _gaussian_epsilon_up(mu: float, delta: float) -> float:
    """Smallest ε >= 0 with the analytic Gaussian δ(ε) <= delta, by bisection, rounded up."""
    if _gaussian_delta_up(mu, 0.0) <= delta:
        return 0.0
    hi = max(1.0, mu * mu)
    while _gaussian_delta_up(mu, hi) > delta:
        hi *= 2.0
    lo = 0.0
    for _ in range(200):
        if hi - lo <= 1e-13 * hi:
            break
        mid = 0.5 * (lo + hi)
        if _gaussian_delta_up(mu, mid) <= delta:
            hi = mid
        else:
            lo = mid
    return up2(hi)


# ---------------------------------------------------------------------------- leaves

# A leaf key names one dominating pair: ("gauss", σ) | ("sgauss", σ, q) | ("lap", b, q) |
# ("rr", p_truth, k) | ("pure", ε) | ("approx", ε, δ).
_Key = tuple
_REVERSED = ("sgauss", "lap")  # leaves whose add PMF is _reverse_pmf of the remove PMF


def _leaf_pmfs(key: _Key, h: float, tau1: float) -> tuple[_PMF, _PMF | None]:
    """(remove PMF, add PMF or None when the pair is symmetric) of one leaf on grid h."""
    kind = key[0]
    if kind == "sgauss":
        rem, deficit = _subsampled_gaussian(key[1], key[2], h, tau1)
        return rem, _reverse_pmf(rem, deficit, h, None)
    if kind == "gauss":
        return _gaussian(1.0 / down2(key[1]), h, tau1), None
    if kind == "lap":
        b, q = key[1], key[2]
        rem, deficit, j0 = _laplace(b, q, h)
        if q == 1.0:
            return rem, None
        return rem, _reverse_pmf(rem, deficit, h, -j0)
    if kind in ("pure", "approx"):
        eps = key[1]
        d = key[2] if kind == "approx" else 0.0
        up = min(1.0 - d, up2((1.0 - d) * float(expit(eps)), 4))
        low = max(0.0, down2((1.0 - d) - up, 4))
        return _from_atoms(h, [eps, -eps], [up, low], inf=up2(d) if d else 0.0), None
    if kind == "rr":
        p, k = Fraction(key[1]), key[2]
        r = (1 - p) / (k - 1)
        big, small, mid = max(p, r), min(p, r), (k - 2) * r
        if small == 0:  # the likelier answer is impossible under the other input: loss +∞
            return _from_atoms(h, [0.0], [to_float_down(mid)], inf=to_float_up(big)), None
        if big == small:
            return _from_atoms(h, [0.0], [1.0]), None
        ratio = big / small
        e_up, e_down = log_up(ratio), down2(math.log(ratio))
        up, mid_f = to_float_up(big), to_float_down(mid)
        low = max(0.0, down2(1.0 - up - mid_f, 4))
        return _from_atoms(h, [e_up, 0.0, -e_down], [up, mid_f, low]), None
    raise AssertionError(kind)  # pragma: no cover
