"""The noise of :class:`dpkit.ml.KMeans`, fixed before the data is looked at: the textbook's
Laplace mechanisms (Blum, Dwork, McSherry & Nissim 2005, "Practical privacy: the SuLQ framework")
and the default Gaussian mechanisms calibrated by ρ-zCDP (Bun & Steinke 2016) with the
count/sum split of Su et al. (2016, Sec. 4.2).
"""

from __future__ import annotations

import math

from dpkit._validate import Neighbours, decimal_fraction
from dpkit.accounting.events import ComposedEvent, DPEvent, GaussianEvent, SelfComposedEvent
from dpkit.accounting.rounding import to_decimal_down
from dpkit.accounting.zcdp import ZCDPAccountant
from dpkit.errors import DPError, InvalidParameterError
from dpkit.mechanisms.gaussian import Gaussian
from dpkit.mechanisms.laplace import Laplace

#: Typical norm of a cluster centre relative to the domain radius, used only to split ρ between
#: counts and sums (a public constant: the norm of a uniform point of a cube is about 1/√3 of
#: its half-diagonal).
_TYPICAL_CENTRE_NORM = 1.0 / math.sqrt(3.0)


def _div_down(x: float, k: int) -> float:
    """x / k as a double whose decimal value (the amount it is charged) is at most the exact
    share: privacy splits round down, and k shares never cost more than x."""
    return to_decimal_down(decimal_fraction(x) / k)


def _textbook_mechanisms(epsilon: float, n_iter: int, neighbours: Neighbours) -> tuple[Laplace, Laplace]:
    """Laplace noise of scale 2/ε' with ε' = ε/(2T) on every count and every sum coordinate.

    On the unit ℓ1 ball the vector of k counts and the (k, d) sums each have ℓ1 sensitivity 1
    under add/remove (one row enters one cluster) and 2 under replace (one row leaves a cluster
    and joins another, or moves within one). Scale 2/ε' is therefore ε'-DP per release under
    replace — the text's relation ("1-相邻": one row changed) — and ε'/2-DP under add/remove.
    """
    if neighbours == "replace":
        eps_release, sens = _div_down(epsilon, 2 * n_iter), 2.0  # ε' with Δ = 2: scale 2/ε'
    else:
        eps_release, sens = _div_down(epsilon, 4 * n_iter), 1.0  # ε'/2 with Δ = 1: scale 2/ε'
    mech = Laplace(epsilon=eps_release, sensitivity=sens, neighbours=neighbours)
    return mech, mech


def _gaussian_sensitivities(neighbours: Neighbours) -> tuple[float, float]:
    """ℓ2 sensitivities (counts, sums) on the unit ℓ2 ball: add/remove 1 and 1; replace √2 (two
    counts move by 1) and 2 (‖y' − y‖ <= 2 within one cluster; √2 across two). Under replace the
    two worst cases cannot happen together: with r_c = 1/(2σ_c²), r_s = 1/(2σ_s²) the true
    per-iteration ρ is max(4r_s, 2r_c + 2r_s), and accounting the releases separately charges
    2r_c + 4r_s — conservative under replace, exact under add/remove."""
    return (1.0, 1.0) if neighbours == "add_remove" else (math.sqrt(2.0), 2.0)


def _gaussian_event(mu_count: float, mu_sum: float, n_iter: int, neighbours: Neighbours) -> tuple[DPEvent, DPEvent]:
    step = ComposedEvent((GaussianEvent(mu_count, neighbours), GaussianEvent(mu_sum, neighbours)))
    return SelfComposedEvent(step, n_iter), step


def _gaussian_mechanisms(
    epsilon: float, delta: float, n_iter: int, d: int, neighbours: Neighbours
) -> tuple[Gaussian, Gaussian, float]:
    """zCDP calibration: the largest total ρ whose (ε, δ) conversion meets the target.

    Per iteration ρ/T, split ρ_sum : ρ_count = √d·(Δ_sum/Δ_count)/c with c = 1/√3 — the split
    minimising the centre's mean squared error d·σ_sum²/n² + ‖centre‖²·σ_count²/n² when
    ‖centre‖ = c (the Gaussian analogue of Su et al. 2016's count/sum split, Sec. 4.2).
    The answer is re-checked with :class:`ZCDPAccountant` before it is returned.
    """
    dc, ds = _gaussian_sensitivities(neighbours)
    ratio = math.sqrt(d) * (ds / dc) / _TYPICAL_CENTRE_NORM  # ρ_sum / ρ_count
    w_count, w_sum = 1.0 / (1.0 + ratio), ratio / (1.0 + ratio)

    def mus(rho: float) -> tuple[float, float]:
        step = rho / n_iter
        return 1.0 / math.sqrt(2.0 * w_count * step), 1.0 / math.sqrt(2.0 * w_sum * step)

    def eps_of(rho: float) -> float:
        event, _ = _gaussian_event(*mus(rho), n_iter, neighbours)
        return ZCDPAccountant(neighbours=neighbours).compose(event).get_epsilon(delta)

    # The classic conversion ε = ρ + 2√(ρ ln(1/δ)) overstates ε, so its ρ is a lower bracket.
    log_inv = -math.log(delta)
    lo = (math.sqrt(log_inv + epsilon) - math.sqrt(log_inv)) ** 2 * (1.0 - 1e-9)
    if not (lo > 0 and eps_of(lo) <= epsilon):
        lo = 1e-300
        if not eps_of(lo) <= epsilon:
            raise InvalidParameterError(
                "epsilon", epsilon, "a value the Gaussian noise can meet at this delta (larger)"
            )
    hi = max(lo, 1e-12) * 2.0
    while eps_of(hi) <= epsilon:
        lo, hi = hi, hi * 2.0
        if hi > 1e12:
            raise InvalidParameterError("epsilon", epsilon, "a value some finite Gaussian noise can meet at this delta")
    for _ in range(60):  # bisection in log ρ: relative precision far below 1e-9
        mid = math.sqrt(lo * hi)
        if eps_of(mid) <= epsilon:
            lo = mid
        else:
            hi = mid
        if hi <= lo * (1.0 + 1e-12):
            break
    if not eps_of(lo) <= epsilon:  # re-check the answer before using it
        raise DPError("k-means noise calibration missed its target on re-check")  # pragma: no cover
    mu_c, mu_s = mus(lo)
    # The Gaussian mechanism at exactly these multipliers: same lattice, same exact sampler, same
    # event. Its own ε describes one release at δ (at least 2^-58, the least it states a bound
    # for); the fit's guarantee is the zCDP composition above, not that number.
    cal_delta = max(delta, 2.0**-58)
    return (
        Gaussian.from_noise_multiplier(mu_c, delta=cal_delta, sensitivity=dc, neighbours=neighbours),
        Gaussian.from_noise_multiplier(mu_s, delta=cal_delta, sensitivity=ds, neighbours=neighbours),
        lo,
    )
