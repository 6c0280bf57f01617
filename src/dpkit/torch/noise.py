"""Gaussian noise for the clipped gradient sum: exact lattice noise (default) or fast continuous.

``noise="lattice"`` (default, floating-point safe). The clipped sum S (float64) is released as
g·(round(S/g) + Y) with g = 2^k chosen from σ·C and the parameter count alone (about 2^-47 of
σ·C) and Y exact discrete Gaussian integers from dpkit's sampler (Canonne, Kamath & Steinke
2020, Alg. 3), fed by the CSPRNG: dpkit's :func:`dpkit.noise.lattice.lattice_gaussian`, the same
release as :class:`dpkit.Gaussian`. The set of reachable outputs depends on S only through its
lattice point, which defeats Mironov's (2012) attack on floating-point noise and its DP-SGD
version (Jin et al. 2022, arXiv 2112.05307); Opacus's "secure mode" sums Gaussians in floating
point instead (Opacus #616). Accounted exactly: snapping moves S by at most g√d/2 in ℓ2, so the
lattice sensitivity is C(1+κ)/g + √d (κ below), and σ_lattice = σ·(that), rounded up — the
noise is never smaller than σ·C per coordinate (it is larger by about 2^-40 relative).

κ = 2(N+1)·γ_{N+2}, γ_n = n·u/(1 − n·u), u = 2^-53, is the float64 summation error of a batch of
at most N+1 clipped gradients of norm <= C (Higham 2002, Thm 3.1 applied per coordinate): the
computed sums of two neighbouring batches differ by at most C(1+κ) when each example's
contribution is computed from that example alone (dense layers, materialised per-example
gradients). Not covered (no DP-SGD library covers them): the float32 forward/backward per example
(BLAS may round an example's activations differently depending on the batch it sits in) and,
for layers with several positions per example (convolutions, sequences), the float32 Gram
matrices of the ghost norm and the summation over positions inside the book-keeping product
(Casacuberta et al. 2022 study this class of issue).

Where, and the cost. The noise is drawn and added on the gradient's own device; the gradient
never leaves it and nothing is approximated. On CPU tensors (:mod:`dpkit.torch.cpu_noise`) the
exact sampler and the release are one loop compiled by numba, run on torch's thread count, each
thread reading its own range of one ChaCha20 stream from OpenSSL; on accelerators
(:mod:`dpkit.torch.device_noise`) they are torch integer operations, the ChaCha20 block function
included (:mod:`dpkit.torch.chacha`), with the certified integer thresholds copied to the device
once per σ. The lanes integer comparisons cannot decide (ties, the margin of the exp acceptance:
about 1.6·10^-3 of them in the CPU loop, 4·10^-3 on a device, which also sends the crowded
buckets) are finished by the unchanged exact CPU routines with more bits of the same
stream. Measured on the 2-core machine of the benchmarks (torch 2.13 CPU): see BENCHMARKS.md,
"DP-SGD: noise"; the loop needs about 7 ns of CPU time per value (2 ns of it ChaCha20), a
whole-tensor operation sampler about 25 ns.

``noise="continuous"`` (opt-in, fast, *not* floating-point safe). N(0, σ²C²) by Box–Muller on
words from dpkit's source (the CSPRNG unless ``rng`` is given) with float64 radii, added to the
clipped sum in the aggregation dtype (float32; float64 for float64 models). The float additions are
exposed to Mironov-type attacks; use it where speed matters more than that threat, and say so.
Not ``torch.randn``: in float32 it is Box–Muller on 24-bit uniforms, so its tail stops at
√(2·ln 2^24) ≈ 5.77σ (checked here: the largest of 10^9 draws was 5.759, where a Gaussian gives
about 8 draws beyond 5.77). A Gaussian truncated at T·σ is not the Gaussian mechanism: an
output beyond one neighbour's cut-off but inside the other's has infinite privacy loss, an event
of probability about φ(T)·‖v‖₁/σ per step for a change v of the clipped sum (‖v‖₁ up to √d·C
over d coordinates) that no accountant counts — φ(5.77) ≈ 2.4·10^-8, so for d = 200,000 and
σ = C this is ~10^-5 per sampled step, the size of a typical δ (float32 ``torch.normal`` is
what Opacus adds). Here the cut-off is 8.65σ, φ ≈ 2·10^-17: negligible. float64 ``torch.randn``
has no such cut-off either but costs about 6× more here; the Box–Muller above costs about as much
as float32 ``torch.randn`` and takes its bits from the CSPRNG.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import torch

from dpkit.errors import InvalidParameterError
from dpkit.noise.lattice import Lattice, choose_lattice, lattice_gaussian
from dpkit.noise.source import RNG, RandomSource, resolve_rng
from dpkit.torch import cpu_noise
from dpkit.torch.chacha import ChaChaStream, TorchSource
from dpkit.torch.device_noise import lattice_gaussian_device

__all__ = ["NOISE_KINDS", "SAMPLERS", "LatticeNoise", "ContinuousNoise", "make_noise", "summation_slack"]

NOISE_KINDS = ("lattice", "continuous")
_U = Fraction(1, 2**53)


def summation_slack(max_batch: int) -> Fraction:
    """κ = 2·m·γ_{m+1} for batches of at most m examples (float64 sums, see module docstring)."""
    m = max_batch
    n = m + 1
    return 2 * m * (n * _U) / (1 - n * _U)


SAMPLERS = ("device", "torch", "host")


@dataclass(frozen=True)
class LatticeNoise:
    """Exact discrete Gaussian noise on a 2^k lattice (float64 release).

    ``sampler``: where and how the exact draws are made, all of them exact and floating-point
    safe, the gradient never copied off its device:

    * ``"device"`` (default): on CPU tensors the fused compiled loop of
      :mod:`dpkit.torch.cpu_noise` (numba; the torch operations below if numba is missing), on
      other devices the torch operations of :mod:`dpkit.torch.device_noise`;
    * ``"torch"``: those torch operations on every device, the CPU included (what accelerators
      run, checkable on the CPU: with ``chunk=dpkit.noise.bernoulli_exp.CHUNK`` it releases what
      ``"host"`` releases from one :class:`~dpkit.torch.chacha.ChaChaStream`, draw for draw);
    * ``"host"``: the numpy path (:func:`dpkit.noise.lattice.lattice_gaussian` on the CPU).

    ``chunk``: proposals per batch of the torch-operation sampler (None: by device type); the CPU
    loop has its own (:data:`dpkit.torch.cpu_noise.CPU_CHUNK`).
    """

    noise_multiplier: float
    max_grad_norm: float
    size: int
    lattice: Lattice
    lattice_sigma: Fraction
    sensitivity_on_lattice: Fraction
    dtype: torch.dtype = torch.float64
    kind: str = "lattice"
    sampler: str = "device"
    chunk: int | None = None

    def __post_init__(self) -> None:
        if self.sampler not in SAMPLERS:
            raise InvalidParameterError(
                "sampler",
                self.sampler,
                "'device' (the fastest exact path on the gradient's device; the default), 'torch' (torch "
                "operations on every device) or 'host' (numpy, cross-checks)",
            )
        if self.chunk is not None and (
            isinstance(self.chunk, bool) or not isinstance(self.chunk, int) or self.chunk < 1
        ):
            raise InvalidParameterError("chunk", self.chunk, "None (by device type) or a positive integer")

    @classmethod
    def plan(
        cls, *, noise_multiplier: float, max_grad_norm: float, size: int, max_batch: int, sampler: str = "device"
    ) -> LatticeNoise:
        sigma_c = noise_multiplier * max_grad_norm
        lattice = choose_lattice(sigma_c, max(size, 1), norm=2)
        g = Fraction(lattice.granularity)
        root = Fraction(math.nextafter(math.sqrt(max(size, 1)), math.inf))  # sqrt is correctly rounded
        sens = Fraction(max_grad_norm) * (1 + summation_slack(max_batch)) / g + root
        lat_sigma = Fraction(math.ceil(Fraction(noise_multiplier) * sens * 256), 256)
        return cls(noise_multiplier, max_grad_norm, size, lattice, lat_sigma, sens, sampler=sampler)

    @property
    def std(self) -> float:
        """The standard deviation of the noise per coordinate (≈ σ·C, never below it)."""
        return float(self.lattice_sigma) * self.lattice.granularity

    @property
    def effective_noise_multiplier(self) -> float:
        """σ_lattice / (lattice sensitivity): the multiplier the release actually has, >= σ."""
        return float(self.lattice_sigma / self.sensitivity_on_lattice)

    def release(self, flat: torch.Tensor, src: RNG) -> torch.Tensor:
        """g·(round(clamp(flat)/g) + Y) as a new float64 tensor on ``flat``'s device.

        The device sampler's ChaCha20 stream is keyed from the operating system when ``src`` is
        the secure source, from ``src`` otherwise (a seeded source: reproducible), or is ``src``
        itself when it is a :class:`~dpkit.torch.chacha.ChaChaStream`.
        """
        if self.sampler == "host":
            x = flat.detach().to(device="cpu", dtype=torch.float64).numpy()
            out = lattice_gaussian(np.ascontiguousarray(x), self.lattice, self.lattice_sigma, resolve_rng(src))
            return torch.from_numpy(out).to(flat.device)
        if self.sampler == "device" and flat.device.type == "cpu" and cpu_noise.available():
            return cpu_noise.lattice_gaussian_cpu(flat, self.lattice, self.lattice_sigma, ChaChaStream.keyed(src))
        words = TorchSource(flat.device, src)
        return lattice_gaussian_device(flat, self.lattice, self.lattice_sigma, words, chunk=self.chunk)


def gaussian(n: int, src: RandomSource, scale: float = 1.0, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """``n`` draws of N(0, scale²) by Box–Muller on words from ``src``, returned in ``dtype``.

    Radii from 53-bit uniforms U ∈ (0, 1) (U = (k + 1/2)·2^-53) through a float64 logarithm, so
    the tail reaches √(2·ln 2^54) ≈ 8.65 (the mass beyond, ~1e-17, is the only truncation);
    angles from 32-bit uniforms; the products in ``dtype``. Not exact and not on a lattice.
    """
    h = (n + 1) // 2
    w = src.words(h + (h + 1) // 2)  # h words for radii, ⌈h/2⌉ words for 2 angles each
    t = torch.from_numpy(w.view(np.int64))
    u = ((t[:h] >> 11) & ((1 << 53) - 1)).to(torch.float64).add_(0.5).mul_(2.0**-53)
    r = u.log_().mul_(-2.0).sqrt_().mul_(scale).to(dtype)
    angle = torch.from_numpy(w[h:].view(np.uint32)[:h].astype(np.float64)).mul_(2.0 * math.pi * 2.0**-32).to(dtype)
    out = torch.empty(2 * h, dtype=dtype)
    torch.mul(r, torch.cos(angle), out=out[:h])
    torch.mul(r, torch.sin(angle), out=out[h:])
    return out[:n]


@dataclass(frozen=True)
class ContinuousNoise:
    """N(0, (σC)²) by Box–Muller on CSPRNG words (float64 radii), in the aggregation dtype."""

    noise_multiplier: float
    max_grad_norm: float
    size: int
    dtype: torch.dtype = torch.float32
    kind: str = "continuous"

    @property
    def std(self) -> float:
        return self.noise_multiplier * self.max_grad_norm

    @property
    def effective_noise_multiplier(self) -> float:
        return self.noise_multiplier

    def release(self, flat: torch.Tensor, src: RandomSource) -> torch.Tensor:
        """flat + N(0, (σC)²) per coordinate, in place."""
        noise = gaussian(flat.numel(), src, self.std, flat.dtype).view(flat.shape)
        return flat.add_(noise.to(flat.device))


def make_noise(
    kind: str, *, noise_multiplier: float, max_grad_norm: float, size: int, max_batch: int, wide: bool = False
) -> LatticeNoise | ContinuousNoise:
    """The noise plan for ``kind``; ``wide``: the model has float64 parameters."""
    if kind == "lattice":
        return LatticeNoise.plan(
            noise_multiplier=noise_multiplier, max_grad_norm=max_grad_norm, size=size, max_batch=max_batch
        )
    if kind == "continuous":
        return ContinuousNoise(noise_multiplier, max_grad_norm, size, torch.float64 if wide else torch.float32)
    raise InvalidParameterError(
        "noise",
        kind,
        "'lattice' (exact discrete Gaussian on a 2^k lattice, floating-point safe; the default) or "
        "'continuous' (Box–Muller on CSPRNG words: faster, not floating-point safe)",
    )
