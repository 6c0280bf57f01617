"""Composition of privacy loss distributions by FFT, its error bounds, and reading (ε, δ) off it.

Proof step 3 (*composition*). If ω_i dominates M_i for all ε ∈ ℝ, ω_1 ∗ … ∗ ω_n dominates the
adaptive composition (Zhu, Dong & Wang 2022, composition of dominating pairs). The convolution
is the product Π ẑ_i^{k_i} of the discrete Fourier transforms (k_i copies of event i: one power,
not k_i convolutions; many events used once are first convolved pairwise on the grid), on a
cyclic window of N cells chosen by a Chernoff bound: at most τ/2 of mass lies above the window —
that bound is added to the mass at +∞, because it wraps to lower losses — and at most τ/2 below
it, which wraps *upward* (harmless). All truncations of one evaluation together move at most
1e-15 of mass to +∞.

Proof step 4 (*reading δ*). δ(ε) = m_∞ + Σ_{ℓ>ε} r(ℓ)(1 − e^{ε−ℓ}). When few Fourier
coefficients survive the powers this sum is evaluated from the spectrum by Parseval, the
weights' transform being two geometric series in closed form; otherwise the spectrum is
inverted to the grid and the sum taken there. ε is returned where δ was evaluated to be <= the
target, so it is never below the true ε. Both directions of ``add_remove`` are composed and the
larger δ is reported (step 5).

Proof step 6, the FFT: componentwise |ẑ_j − z_j| <= γ‖p‖₁ with γ = 8u⌈log₂N⌉ (Higham 2002,
ch. 24), through the powers |Π ẑ_i^{k_i} − Π z_i^{k_i}| <= Π(|ẑ_i|+γ)^{k_i} Σ k_iγ/(|ẑ_i|+γ),
back to losses by Parseval (‖Δr‖₁ <= ‖ΔW‖₂); composing multiplies a per-event error by the
number of copies at most. A δ at or below the resulting floor is refused.
The numbered steps are those of :mod:`dpkit.accounting.pld`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import scipy.fft as _fft

from dpkit.accounting.pld.mechanisms import (
    _REVERSED,
    _Key,
    _leaf_pmfs,
)
from dpkit.accounting.pld.pmf import (
    _LOG_TINY,
    _MAX_BINS,
    _PMF,
    _TAIL,
    _U,
    _add_inf,
    _Coarsen,
    _fft_gamma,
)
from dpkit.accounting.rounding import down2, to_float_up, up2

# ------------------------------------------------------------------- composition by FFT


class _MGF:
    """ln Σ_i p_i e^{λ x_i} (x_i = i·h) of a PMF, evaluated on demand, rounded up."""

    def __init__(self, probs: np.ndarray, h: float) -> None:
        self.probs, self.h = probs, h
        self.lp: np.ndarray | None = None

    def __call__(self, lam: float) -> float:
        if self.lp is None:  # computed on first use
            pos = np.flatnonzero(self.probs > 0)
            self.lp, self.x = np.log(self.probs[pos]), pos * self.h
            self.slack = (pos.size + 8) * 4 * _U
        v = lam * self.x + self.lp
        mx = float(v.max())
        out = mx + math.log(float(np.exp(v - mx).sum()))
        return out + self.slack * (1 + abs(out))


class _ReversedMGF:
    """The MGF of ``_reverse_pmf(p)`` from that of p, without touching the array:
    Σ_j q_j e^{λ x'_j} = e^{λ(n−1)h − lo·h} Σ_i p_i e^{−(1+λ) x_i} (q_j = p_i e^{−ℓ_i} at −ℓ_i)."""

    def __init__(self, base: _MGF, p: _PMF, h: float) -> None:
        self.base, self.span, self.shift = base, (p.probs.size - 1) * h, p.lo * h

    def __call__(self, lam: float) -> float:
        out = lam * self.span - self.shift + self.base(-1.0 - lam)
        return out + 16 * _U * (1 + abs(out))


def _chernoff(logmgf: Callable[[float], float], c: float, lam0: float, sign: int) -> float:
    """min over λ > 0 of (Λ(sign·λ) + c)/λ, by golden-section search on ln λ. The objective is
    quasi-convex in λ; any λ gives a valid Chernoff bound, the search only makes it tight."""

    def f(u: float) -> float:
        lam = math.exp(u)
        return (logmgf(sign * lam) + c) / lam

    a, b = math.log(lam0) - 4.0, math.log(lam0) + 4.0
    g = (math.sqrt(5) - 1) / 2
    x1, x2 = b - g * (b - a), a + g * (b - a)
    f1, f2 = f(x1), f(x2)
    best = min(f1, f2)
    for _ in range(8):
        if f1 <= f2:
            b, x2, f2 = x2, x1, f1
            x1 = b - g * (b - a)
            f1 = f(x1)
        else:
            a, x1, f1 = x1, x2, f2
            x2 = a + g * (b - a)
            f2 = f(x2)
        best = min(best, f1, f2)
    return best


@dataclass(frozen=True)
class _Part:
    """``count`` copies of one PMF in one direction, with the MGF of its offsets."""

    pmf: _PMF
    count: int
    mgf: Callable[[float], float]


@dataclass(frozen=True)
class _Window:
    lo: int  # offsets (from Σ count·lo_i) of the cyclic window
    hi: int
    tail: float  # Chernoff bound on the mass above hi (0 when hi is the true maximum)
    full: int  # number of offsets of the exact result


def _window(parts: list[_Part], h: float, tau: float) -> _Window:
    """Offsets [lo, hi] of the composed PMF with, by Chernoff, <= tau/2 of mass above hi and
    <= tau/2 below lo."""
    full_hi = sum(p.count * (p.pmf.probs.size - 1) for p in parts)
    mean = var = 0.0
    for p in parts:
        pr = p.pmf.probs
        mass = float(pr.sum())
        if mass > 0:
            x = np.arange(pr.size) * h
            mu = float(pr @ x) / mass
            mean += p.count * mu
            var += p.count * float(pr @ (x - mu) ** 2) / mass
    if full_hi == 0:
        return _Window(0, 0, 0.0, 1)
    var = max(var, h * h)
    c = math.log(2.0 / tau)
    lam0 = math.sqrt(2 * c / var)

    def logmgf(lam: float) -> float:
        return sum(p.count * p.mgf(lam) for p in parts)

    t_hi = _chernoff(logmgf, c, lam0, +1)
    t_lo = -_chernoff(logmgf, c, lam0, -1)
    if not math.isfinite(t_hi) or t_hi / h >= full_hi:
        hi, tail = full_hi, 0.0
    else:
        hi, tail = max(0, math.ceil(t_hi / h)), tau / 2
    lo = 0 if not math.isfinite(t_lo) else min(max(0, math.floor(t_lo / h)), hi)
    return _Window(lo, hi, tail, full_hi + 1)


@dataclass(frozen=True)
class _Spectral:
    """A composed PMF kept as its (sparse) DFT: mass r_t at loss (L0 + t)·h, t ∈ [0, N), with
    r = irfft(W) — only the coefficients ``freq`` (0..N/2) with |W| above e^{−745} are kept."""

    N: int
    L0: int
    freq: np.ndarray
    W: np.ndarray
    inf: float
    inf_mech: float
    err: float  # includes the round-off slack of evaluating δ from the spectrum
    top: int | None
    h: float

    def __post_init__(self) -> None:
        j, N, h = self.freq, self.N, self.h
        b = math.pi * j / N
        sb = np.sin(b)
        em = math.exp(-h)
        den = (-math.expm1(-h) + em * 2 * sb**2) - 1j * em * np.sin(2 * b)  # 1 − e^{−h} ω^j
        wgt = np.where((j == 0) | (2 * j == N), 1.0, 2.0) / N
        zero = j == 0
        with np.errstate(divide="ignore", invalid="ignore"):
            t1 = -np.exp(-1j * b) / sb  # Σ_{t>=t0} ω^{jt} = t1 · sin(a) e^{ia}, a = π j t0 / N
        t1[zero] = 0.0
        object.__setattr__(self, "_t1", t1)
        object.__setattr__(self, "_den_inv", 1.0 / den)
        object.__setattr__(self, "_wW", wgt * self.W)
        object.__setattr__(self, "_zero", np.flatnonzero(zero))


_SPARSE_MAX = 4096  # spectra with more kept coefficients are inverted to a grid PMF


class _Spectra:
    """rfft of each PMF at length N, computed once on first use (shared by both directions)."""

    def __init__(self, N: int) -> None:
        self.N = N
        self._cache: dict[int, np.ndarray] = {}

    def of(self, pm: _PMF) -> np.ndarray:
        z = self._cache.get(id(pm))
        if z is None:
            z = self._cache[id(pm)] = _fft.rfft(pm.probs, self.N)
        return z


def _compose(parts: list[_Part], win: _Window, N: int, h: float, spectra: _Spectra) -> _Spectral | _PMF:
    """The product of the parts' powered spectra on a cyclic window of length N (module
    docstring, step 3), with its round-off bound (step 6). Parts used once are multiplied as
    they are; powered parts go through k·ln|ẑ| and k·arg ẑ, on the coefficients that survive."""
    lo_total = sum(p.count * p.pmf.lo for p in parts)
    if win.full <= N:
        start, tail = 0, 0.0
    else:
        start, tail = win.hi - N + 1, win.tail
    L0 = lo_total + start
    if len(parts) == 1 and parts[0].count == 1 and start == 0:  # nothing to compose
        pm = parts[0].pmf
        return _PMF(pm.lo, pm.probs, pm.inf, pm.inf_mech, pm.err, pm.top)
    gam = _fft_gamma(N)
    inf = inf_mech = err = 0.0
    top: int | None = 0
    for p in parts:
        k, pm = p.count, p.pmf
        if pm.inf >= 1:
            inf = 1.0
        elif pm.inf > 0:
            inf = _add_inf(inf, -math.expm1(k * math.log1p(-pm.inf)))
        if pm.inf_mech >= 1:
            inf_mech = 1.0
        elif pm.inf_mech > 0:
            inf_mech = _add_inf(inf_mech, -math.expm1(k * math.log1p(-pm.inf_mech)))
        err += k * pm.err
        top = None if top is None or pm.top is None else top + k * pm.top
    inf = _add_inf(inf, tail)
    mass = {id(p.pmf): max(1.0, float(p.pmf.probs.sum())) for p in parts}
    plain = [p for p in parts if p.count == 1]
    powered = [p for p in parts if p.count > 1]

    # Round-off of the spectrum (module docstring, step 6). For a product of FFTs ẑ_i = z_i + e_i:
    # |Π ẑ_i^{k_i} − Π z_i^{k_i}| <= Σ_i k_i |e_i| M_i, M_i = Π_l (|ẑ_l| + γ_l)^{k_l} / (|ẑ_i| + γ_i),
    # with e_i bounded componentwise (|e_ij| <= γ‖p_i‖₁) or in norm (‖e_i‖₂ <= γ√N‖p_i‖₂).
    plain_max = 1.0
    plain_err = 0.0
    Wp = None
    if plain:
        Wp = spectra.of(plain[0].pmf).copy()
        for p in plain[1:]:
            Wp *= spectra.of(p.pmf)
        bounds = [mass[id(p.pmf)] + gam for p in plain]
        absz = [np.abs(spectra.of(p.pmf)) + gam * mass[id(p.pmf)] for p in plain]
        w_all = np.where((np.arange(N // 2 + 1) == 0) | (2 * np.arange(N // 2 + 1) == N), 1.0, 2.0)
        for i, (p, b_i) in enumerate(zip(plain, bounds, strict=True)):
            norm = gam * math.sqrt(N) * float(np.sqrt(p.pmf.probs @ p.pmf.probs)) * math.prod(bounds) / b_i
            if len(plain) <= 8:
                others = (
                    math.prod([absz[j] for j in range(len(plain)) if j != i]) if len(plain) > 1 else np.ones(N // 2 + 1)
                )
                comp = gam * mass[id(p.pmf)] * float(np.sqrt(np.sum(w_all * others**2)))
                norm = min(norm, comp)
            plain_err += norm
        plain_max = math.prod(bounds)
        plain_err += 4 * _U * len(plain) * math.sqrt(2.0) * float(np.linalg.norm(Wp))  # the products' rounding
    if powered:
        cand = None
        for p in powered:  # coefficients that can survive the powers: Π(|ẑ_i| + γ)^{k_i} > e^{−745}
            thr = math.exp((_LOG_TINY - 1.0) / p.count) - gam * mass[id(p.pmf)]
            ok = np.abs(spectra.of(p.pmf)) > thr if thr > 0 else np.ones(N // 2 + 1, dtype=bool)
            cand = ok if cand is None else cand & ok
        assert cand is not None  # powered is not empty
        idx = np.flatnonzero(cand)
        full_spectrum = np.where((idx == 0) | (2 * idx == N), 1.0, 2.0)  # rfft holds half of it
        la = np.zeros(idx.size)
        th = np.zeros(idx.size)
        logp = np.zeros(idx.size)
        logz = []
        m_total = 0
        for p in powered:
            k, pm = p.count, p.pmf
            m_total += k
            Zc = spectra.of(pm)[idx]
            absz = np.abs(Zc)
            g = gam * mass[id(pm)]
            with np.errstate(divide="ignore"):
                la += k * np.log(absz)
                lz = np.log(absz + g)
            logp += k * lz
            th += np.angle(Zc) * float(k)
            logz.append((k, g, lz, pm))
        sel = la > _LOG_TINY
        idx, la, th, logp_sel = idx[sel], la[sel], th[sel], logp[sel]
        mag = np.exp(la)
        W = mag * np.exp(1j * th)
        pow_err = 0.0
        big = logp > _LOG_TINY
        for k, g, lz, pm in logz:
            M = np.exp(np.minimum(logp[big] - lz[big], 700.0))
            comp = g * float(np.sqrt(np.sum(full_spectrum[big] * M**2)))
            norm = gam * math.sqrt(N) * float(np.sqrt(pm.probs @ pm.probs)) * (float(M.max()) if M.size else 0.0)
            pow_err += k * min(comp, norm)
        c_pow = mag * (2 * _U * np.abs(th) + 2 * _U * m_total + 4 * _U * np.abs(la) + 16 * _U * len(powered))
        pow_err += float(np.sqrt(np.sum(full_spectrum[sel] * c_pow**2)))
        pow_max = float(np.exp(np.minimum(logp_sel.max(), 700.0))) if logp_sel.size else 0.0
        if Wp is not None:
            W = W * Wp[idx]
            spec_err = (
                plain_err * max(pow_max, 1e-300)
                + plain_max * pow_err
                + 4 * _U * math.sqrt(2.0) * float(np.linalg.norm(W))
            )
        else:
            spec_err = pow_err
        freq = idx
    else:
        assert Wp is not None
        freq, W, spec_err = np.arange(N // 2 + 1), Wp, plain_err
    spec_err += N * 1e-300  # coefficients dropped below e^{−745}
    if start:
        W = W * np.exp(2j * math.pi * np.mod(freq * (start % N), N) / N)
    mag_sum = float(np.abs(W).sum())
    if freq.size <= _SPARSE_MAX:
        slack = 256 * _U * mag_sum
        return _Spectral(N, L0, freq, W, min(inf, 1.0), inf_mech, err + spec_err + slack, top, h)
    full = np.zeros(N // 2 + 1, dtype=complex)
    full[freq] = W
    r = _fft.irfft(full, N)
    length = min(N, win.full)
    # inverse FFT: componentwise (γ‖W‖₁/N per cell) or normwise (γ‖r‖₂ in ℓ2, ×√N in ℓ1)
    inv = gam * min(2.0 * mag_sum, math.sqrt(N) * float(np.sqrt(r @ r)) + spec_err)
    r = np.maximum(r[:length], 0.0)
    return _PMF(L0, r, min(inf, 1.0), inf_mech, err + spec_err + inv, top)


def _spectral_delta_fin(s: _Spectral, h: float, eps: float) -> float:
    """Σ_{t: ℓ_t > ε} r_t (1 − e^{ε − ℓ_t}) = (1/N) Σ_j W_j S_j (Parseval), where
    S_j = Σ_{t>=t0} (1 − e^{ε−ℓ_t}) ω^{jt} is two geometric sums in closed form, written with
    sines so that nothing cancels."""
    N, L0 = s.N, s.L0
    t0 = math.floor(eps / h) - L0 + 1
    while t0 > 0 and (L0 + t0 - 1) * h > eps:
        t0 -= 1
    while (L0 + t0) * h <= eps:
        t0 += 1
    t0 = max(t0, 0)
    if t0 >= N:
        return 0.0
    e0 = math.exp(min(eps - (L0 + t0) * h, 0.0))
    a = (math.pi / N) * np.mod(s.freq * t0, 2 * N)  # π j t0 / N (mod 2π)
    eia = np.exp(1j * a)
    S = s._t1 * (np.sin(a) * eia) - e0 * (eia * eia - math.exp(-h * (N - t0))) * s._den_inv  # type: ignore[attr-defined]
    if s._zero.size:  # type: ignore[attr-defined]
        S[s._zero] = (N - t0) - e0 * (-math.expm1(-h * (N - t0))) / (-math.expm1(-h))  # type: ignore[attr-defined]
    wW = s._wW  # type: ignore[attr-defined]
    return float(wW.real @ S.real - wW.imag @ S.imag)


def _search_epsilon(delta_at: Callable[[float], float], delta: float, hi: float) -> float | None:
    """Smallest ε in [0, hi] with delta_at(ε) <= delta, to 1e-12 relative: regula falsi
    (Illinois) on ln δ, always keeping a bracket; returns the bracket's upper end, a point at
    which δ was evaluated to be <= delta (so the answer is sound whatever the search did)."""
    d_lo = delta_at(0.0)
    if d_lo <= delta:
        return 0.0
    d_hi = delta_at(hi)
    if d_hi > delta:
        return None
    lo, ld = 0.0, math.log(delta)
    f_lo, f_hi = math.log(d_lo) - ld, (math.log(d_hi) - ld) if d_hi > 0 else -math.inf
    side = 0
    for _ in range(200):
        if hi - lo <= 1e-12 * max(1.0, hi):
            break
        mid = hi - f_hi * (hi - lo) / (f_hi - f_lo) if math.isfinite(f_hi) and f_lo > 0 > f_hi else 0.5 * (lo + hi)
        if not lo < mid < hi:
            mid = 0.5 * (lo + hi)
        gap = 1e-13 * max(1.0, hi)
        mid = min(max(mid, lo + gap), hi - gap)
        d = delta_at(mid)
        if d <= delta:
            hi, f_hi = mid, (math.log(d) - ld) if d > 0 else -math.inf
            if side == +1:
                f_lo /= 2
            side = +1
        else:
            lo, f_lo = mid, math.log(d) - ld
            if side == -1:
                f_hi /= 2
            side = -1
    return hi


def _top_loss(p: _PMF | _Spectral, h: float) -> float | None:
    """top·h rounded up: no loss of the exact dominating PMF exceeds it (None: unbounded)."""
    return None if p.top is None else max(0.0, to_float_up(p.top * Fraction(h)))


def _delta_of(p: _PMF | _Spectral, h: float, eps: float) -> float:
    """δ(ε) = inf + Σ_{ℓ > ε} ω(ℓ)(1 − e^{ε−ℓ}) + err, rounded up (at most 1); exactly 0
    above the support of a bounded PMF with no mass at +∞ from the mechanisms."""
    top = _top_loss(p, h)
    if top is not None and eps >= top:
        return 0.0
    if isinstance(p, _Spectral):
        fin = max(0.0, _spectral_delta_fin(p, h, eps))
    else:
        n = p.probs.size
        i0 = min(n, max(0, math.floor(eps / h) - p.lo))
        q = p.probs[i0:]
        losses = (p.lo + i0 + np.arange(q.size)) * h
        w = np.maximum(-np.expm1(eps - losses), 0.0)
        fin = float(q @ w) * (1 + (q.size + 8) * _U)
    return min(1.0, up2(p.inf + fin + p.err, 4))


def _epsilon_of(p: _PMF | _Spectral, h: float, delta: float) -> float | None:
    """Smallest ε >= 0 with δ(ε) <= delta (rounded up); None when delta is at or below the
    floor (inf + err). On a grid PMF the piece of the curve is solved exactly; on a spectrum by
    bisection — either way the returned ε is one at which δ was evaluated to be <= delta."""
    if delta - p.inf - p.err <= 0:
        return None
    if isinstance(p, _Spectral):
        return _search_epsilon(lambda e: _delta_of(p, h, e), delta, max(h, (p.L0 + p.N) * h))
    budget = down2(delta - p.inf - p.err)
    n = p.probs.size
    i_start = min(n, max(0, -p.lo))
    q = p.probs[i_start:]
    if q.size == 0 or float(q.sum()) <= budget:
        return 0.0
    l0 = (p.lo + i_start) * h  # loss of q[0], >= 0
    # A_t = Σ_{s>=t} q_s and B_t = Σ_{s>=t} q_s e^{ℓ_t − ℓ_s} (a stable backward recursion).
    from scipy.signal import lfilter  # lazy: scipy.signal is slow to import and only needed here

    A = np.cumsum(q[::-1])[::-1]
    B = lfilter([1.0], [1.0, -math.exp(-h)], q[::-1])[::-1]
    # On ε ∈ [ℓ_{t−1}, ℓ_t] (or [0, ℓ_0]) the finite part is δ(ε) = A_t − e^{ε−ℓ_t} B_t.
    if float(A[0]) - math.exp(-l0) * float(B[0]) <= budget:
        return 0.0
    R = A - B  # δ at ε = ℓ_t
    t = int(np.argmax(budget >= R))
    if not R[t] <= budget:
        t = q.size - 1
    a_t, b_t = float(A[t]), float(B[t])
    lt = l0 + t * h
    eps = lt + math.log((a_t - budget) / b_t) if b_t > 0 and a_t > budget else lt
    left = 0.0 if t == 0 else lt - h
    eps = min(max(eps, left), lt)
    eps = up2(eps * (1 + 64 * _U) + 64 * _U * h, 2)
    for _ in range(60):  # re-check with the direct formula; bump if round-off says so
        if _delta_of(p, h, eps) <= delta:
            return eps
        eps = eps * (1 + 1e-12) + 1e-12 * h
    return eps


@dataclass(frozen=True)
class _Evaluation:
    """The result of turning the recorded events into PMFs (cached until the next compose)."""

    h: float
    pmfs: tuple[_PMF | _Spectral, ...]  # one per direction (one when every pair is symmetric)
    mu: float  # Gaussian part, when answered analytically (pmfs empty)


def _convolve(a: _PMF, b: _PMF) -> _PMF:
    """The exact linear convolution of two PMFs (no truncation), by FFT unless one is tiny,
    with its round-off bound: a δ read from a ∗ b is off by at most err_a·‖b‖₁ + err_b·‖a‖₁
    plus the convolution's own error (normwise FFT bounds, ℓ1 <= √n·ℓ2)."""
    na, nb = a.probs.size, b.probs.size
    ma, mb = max(1.0, float(a.probs.sum())), max(1.0, float(b.probs.sum()))
    if min(na, nb) <= 32:
        r = np.convolve(a.probs, b.probs)
        conv_err = 2 * min(na, nb) * _U * ma * mb
    else:
        n = na + nb - 1
        N = _fft.next_fast_len(n, real=True)
        g = _fft_gamma(N)
        r = _fft.irfft(_fft.rfft(a.probs, N) * _fft.rfft(b.probs, N), N)[:n]
        l2a, l2b = float(np.sqrt(a.probs @ a.probs)), float(np.sqrt(b.probs @ b.probs))
        # In ℓ2 over the cells: forward errors (‖e‖₂ <= γ√N‖·‖₂, times sup|other spectrum| <=
        # ‖other‖₁, over √N by Parseval), the product's rounding, the inverse (γ‖r‖₂); then
        # ℓ1 <= √n·ℓ2.
        l2 = g * (l2a * mb + l2b * ma) + 4 * _U * min(l2a * mb, l2b * ma) + g * float(np.sqrt(r @ r))
        conv_err = math.sqrt(n) * l2
    r = np.maximum(r, 0.0)
    inf = _add_inf(a.inf, b.inf)
    inf_mech = _add_inf(a.inf_mech, b.inf_mech)
    top = None if a.top is None or b.top is None else a.top + b.top
    return _PMF(a.lo + b.lo, r, inf, inf_mech, a.err * mb + b.err * ma + conv_err, top)


def _merge_plain(parts: list[_Part], N: int, h: float) -> list[_Part]:
    """Many parts used once: convolve them pairwise on the grid (a balanced tree of exact
    convolutions, cheap while they are small) instead of one length-N FFT each."""
    plain = sorted((p for p in parts if p.count == 1), key=lambda p: p.pmf.probs.size)
    if len(plain) < 2 or (len(plain) <= 4 and plain[0].pmf.probs.size > 32):
        return parts
    pmfs = [p.pmf for p in plain]
    while len(pmfs) > 1:
        nxt = []
        for i in range(0, len(pmfs) - 1, 2):
            a, b = pmfs[i], pmfs[i + 1]
            nxt.append(_convolve(a, b) if a.probs.size + b.probs.size - 1 <= N else a)
            if nxt[-1] is a:
                nxt.append(b)
        if len(pmfs) % 2:
            nxt.append(pmfs[-1])
        if len(nxt) == len(pmfs):  # nothing fits in N any more
            break
        pmfs = sorted(nxt, key=lambda p: p.probs.size)
    merged = [_Part(pm, 1, _MGF(pm.probs, h)) for pm in pmfs]
    return [p for p in parts if p.count > 1] + merged


def _evaluate_at(h: float, parts: list[tuple[_Key, int]]) -> _Evaluation:
    m = len(parts)
    tau_leaf = _TAIL / (4 * m)  # per part: single-step truncation, over all its copies
    tau_win = _TAIL / 2  # per direction: the cyclic window (half above → +∞, half wraps up)
    rems: list[_Part] = []
    adds: list[_Part] = []
    asym = False
    for key, c in parts:
        rem, add = _leaf_pmfs(key, h, tau_leaf / c)
        mgf = _MGF(rem.probs, h)
        rems.append(_Part(rem, c, mgf))
        if add is None:
            adds.append(rems[-1])
        else:
            asym = True
            rev = _ReversedMGF(mgf, rem, h) if key[0] in _REVERSED else _MGF(add.probs, h)
            adds.append(_Part(add, c, rev))
    directions = [rems, adds] if asym else [rems]
    wins = [_window(d, h, tau_win) for d in directions]
    need = max(max(w.hi - w.lo + 1, max(p.pmf.probs.size for p in d)) for w, d in zip(wins, directions, strict=True))
    if need > _MAX_BINS:
        raise _Coarsen(need / _MAX_BINS)
    N = _fft.next_fast_len(need, real=True)
    if all(w.full <= N for w in wins):  # nothing wraps: the exact results fit
        N = _fft.next_fast_len(
            max(max(w.full for w in wins), max(p.pmf.probs.size for d in directions for p in d)), real=True
        )
    directions = [_merge_plain(d, N, h) for d in directions]
    spectra = _Spectra(N)
    out = tuple(_compose(d, w, N, h, spectra) for d, w in zip(directions, wins, strict=True))
    return _Evaluation(h, out, 0.0)
