"""Privacy loss distributions (PLD): tight, sound (ε, δ) for composed mechanisms.

The accountant records events (lazily: ``compose`` validates and counts, nothing more) and,
when asked for ε or δ, turns every distinct event into a discrete *dominating* privacy loss
distribution on the grid h·ℤ (h = ``value_discretization_interval``), composes them all at once
in the frequency domain and reads the hockey-stick divergence off the result (Meiser &
Mohammadi 2018; Sommer, Meiser & Mohammadi 2019; Koskela, Jälkö & Honkela 2020; Doroshenko,
Ghazi, Kamath, Kumar & Manurangsi 2022; Zhu, Dong & Wang 2022).

Theorem (what the numbers mean). Write δ_M(ε) = sup over neighbours D ≃ D' of
H_{e^ε}(M(D) ‖ M(D')), where H_α(P ‖ Q) = Σ_o (P(o) − α Q(o))₊ is the hockey-stick divergence.
For every recorded composition M = M_1 ∘ … ∘ M_n (adaptive) and every ε >= 0, δ ∈ [0, 1)::

    get_delta(ε)   >= δ_M(ε)              get_epsilon(δ) >= inf{ε >= 0 : δ_M(ε) <= δ}.

Proof, one step per approximation; each step can only raise δ(ε), for every ε:

1. *Dominating pairs.* Each event has a pair (P_i, Q_i) with δ_{M_i}(ε) <= H_{e^ε}(P_i ‖ Q_i)
   for all ε ∈ ℝ, per direction of the neighbour relation (``remove``: the record is in the
   first dataset; ``add``: in the second): the Gaussian and Laplace location pairs N(1, σ²) vs
   N(0, σ²) and Lap(1, b) vs Lap(0, b) (noise relative to the sensitivity); their Poisson(q)
   mixtures (qP + (1−q)Q, Q) for ``remove`` and the reverse for ``add`` (Zhu, Dong & Wang 2022,
   subsampling of dominating pairs; dp_accounting's PLD notes); the randomized-response output
   pair; and for ``PureDPEvent`` / ``ExponentialEvent`` / ``ApproxDPEvent`` the canonical binary
   pair of (ε, δ)-DP, which dominates every (ε, δ)-DP mechanism (Kairouz, Oh & Viswanath 2015).
2. *Connect-the-dots discretisation* (Doroshenko et al. 2022, Alg. 1). ε ↦ H_{e^ε} is convex in
   x = e^ε (a supremum of the affine functions P(S) − x Q(S)). Splitting each cell's P-mass
   between its two grid ends so that the cell's P-mass and Q-mass (Σ ω(ℓ)e^{−ℓ}) are both kept
   gives a PMF ω_i whose curve equals H_{e^ε}(P_i ‖ Q_i) at the cell ends and is the chord in x
   between them — above the convex curve; below the lowest point it is the chord from x = 0.
   Mass outside the kept range moves *up*: above it to loss +∞ (counted in δ for every ε),
   below it onto the lowest grid point. Raising a loss raises every δ(ε), since
   (1 − e^{ε−ℓ})₊ grows with ℓ. (Where a block of 64 cells holds < 1e-15 of mass it is one
   wide cell; the argument is unchanged.)
3. *Composition.* If ω_i dominates M_i for all ε ∈ ℝ, ω_1 ∗ … ∗ ω_n dominates the adaptive
   composition (Zhu, Dong & Wang 2022, composition of dominating pairs). The convolution is the
   product Π ẑ_i^{k_i} of the discrete Fourier transforms (k_i copies of event i: one power, not
   k_i convolutions; many events used once are first convolved pairwise on the grid), on a
   cyclic window of N cells chosen by a Chernoff bound: at most τ/2 of
   mass lies above the window — that bound is added to the mass at +∞, because it wraps to lower
   losses — and at most τ/2 below it, which wraps *upward* (harmless). All truncations of one
   evaluation together move at most 1e-15 of mass to +∞.
4. *Reading δ.* δ(ε) = m_∞ + Σ_{ℓ>ε} r(ℓ)(1 − e^{ε−ℓ}). When few Fourier coefficients survive
   the powers (the usual case for many compositions) this sum is evaluated from the spectrum by
   Parseval, the weights' transform being two geometric series in closed form; otherwise the
   spectrum is inverted to the grid and the sum taken there. get_epsilon returns an ε at which δ
   was evaluated to be <= the target (exact piecewise solve on the grid; bracketed search on a
   spectrum), so it is never below the true ε.
5. *Directions.* Under ``add_remove`` both directions are composed and the larger δ (ε) is
   reported, as dp_accounting does. The ``add`` PMF of a subsampled mechanism is the exact
   reversal of its ``remove`` PMF (mass ω(ℓ)e^{−ℓ} at −ℓ; uncovered Q-mass to +∞), which keeps
   domination because reversing a pair inverts its trade-off function.
6. *Round-off* is bounded, not ignored: every PMF carries ``err``, a bound on |δ_computed −
   δ_exact| for every ε, added to every δ reported. Per event: connect-the-dots reproduces the
   hockey-stick values it is given at the grid points, so tail probabilities accurate to a few
   ulps give a curve accurate to 48u (u = 2⁻⁵³) everywhere; composing multiplies that by the
   number of copies at most, since the δ of a composition is an average of one factor's curve
   over the other factors' losses. The FFT: componentwise |ẑ_j − z_j| <= γ‖p‖₁ with
   γ = 8u⌈log₂N⌉ (Higham 2002, ch. 24), through the powers |Π ẑ_i^{k_i} − Π z_i^{k_i}| <=
   Π(|ẑ_i|+γ)^{k_i} Σ k_iγ/(|ẑ_i|+γ), back to losses by Parseval (‖Δr‖₁ <= ‖ΔW‖₂). The floor
   grows about linearly with the number of compositions (~1e-9 for 23,500 DP-SGD steps). A δ at
   or below it is refused with a clear error — except where the exact answer is known
   (bounded losses and no mass at +∞, e.g. Laplace: then ε = the largest loss, which also
   answers δ = 0).

Gaussian events without subsampling compose exactly (Gaussians of σ_i are one Gaussian with
μ² = Σ σ_i^{-2}); they are kept as one exact μ and, when nothing else was recorded, answered by the
analytic Gaussian curve (Balle & Wang 2018, Thm 8) with no discretisation at all.

Neighbours: the accountant has one relation; every event must carry the same one (noise
multipliers are relative to the sensitivity under that relation). Poisson subsampling is
supported under ``add_remove``, randomized response under ``replace`` (one respondent's answer
changes). If a grid would exceed 2²¹ cells (huge ε or huge counts) it is coarsened by a power of
two: the answer stays sound, only less tight.

>>> from dpkit.accounting.events import GaussianEvent, PoissonSampledEvent
>>> acc = PLDAccountant()
>>> _ = acc.compose(PoissonSampledEvent(0.01, GaussianEvent(1.0)), count=1000)
>>> round(acc.get_epsilon(1e-5), 2)   # dp_accounting's PLD: 1.8282
1.83

The code is in one layer per module: :mod:`~dpkit.accounting.pld.pmf` (the PMF type and
connect-the-dots, step 2), :mod:`~dpkit.accounting.pld.mechanisms` (dominating pairs, step 1),
:mod:`~dpkit.accounting.pld.compose` (FFT composition, reading δ and ε, steps 3–6) and
:mod:`~dpkit.accounting.pld.accountant` (:class:`PLDAccountant`).
"""

from __future__ import annotations

from dpkit.accounting.pld.accountant import PLDAccountant

__all__ = ["PLDAccountant"]
