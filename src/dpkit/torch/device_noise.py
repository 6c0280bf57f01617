"""The exact discrete Gaussian and the lattice release in torch operations, on the tensor's device.

The same sampler as :func:`dpkit.noise.discrete.sample_discrete_gaussian`, step for step, with
its batches held in torch tensors (see that module for the scheme and its proof):

* the plan — certified 32-bit inversion thresholds and their 2^16-bucket guide table — is
  computed once per σ on the CPU (:func:`~dpkit.noise.discrete.gaussian_plan`) and copied to the
  device once, with one more integer table (:func:`_prefix_limits`): per count A, the largest
  acceptance prefix that passes the numpy sampler's first float test e^{−γ} >= 1 − γ̂(1 + 2^−50)
  − 2^−50 for every low part. That test is a chain of correctly rounded (hence monotone)
  operations, so the table certifies it: the device decides almost every lane with integer
  operations only (no float arithmetic, so no question of fused multiply-adds or flushed
  subnormals on an accelerator);
* the lanes the device does not decide go to the host, and only those lanes' candidate and the
  bits already drawn: a uniform that ties a threshold or falls in a bucket holding several
  thresholds (about 2·10^-3 of the lanes; counted by the numpy ``InversionTable``, ties settled
  by ``_resolve_count`` reading more bits of the same stream), and the lanes above their
  prefix limit (about γ ≈ 10^-3; decided by the unchanged
  :func:`~dpkit.noise.bernoulli_exp.decide_exp_neg_small`, whose certified enclosure sends about
  2^-19 of them on to the exact comparison with more bits). Nothing is redrawn and nothing is
  approximated: the output is exactly discrete Gaussian, and no term is added to δ;
* rejected lanes are replaced by the next batch (keeping the first n accepted draws of an
  i.i.d. proposal stream is exact).

Words come from a :class:`~dpkit.torch.chacha.TorchSource` (ChaCha20 on the device, or OpenSSL
on the CPU) whose ``host`` view continues the same stream, so the words read on the host follow
the device's in stream order. The batches, the order in which words are read and every
decision are those of the numpy sampler: with ``chunk=CHUNK`` (2^15, the numpy sampler's block)
and the same stream, :func:`lattice_gaussian_device` returns exactly what
:func:`dpkit.noise.lattice.lattice_gaussian` returns, draw for draw (tested, on scripted words
that force every rare path too). Other chunk sizes change only how proposals are batched, not
the distribution.

The release g·(round(clamp(x)/g) + Y) is computed on the device in float64 exactly as
:mod:`dpkit.noise.lattice` does it (clamped first, then x·2^-k, round half to even, one rounded
sum, ×g); the gradient never leaves the device. Noise of 2^53 or more (beyond 2^22 standard
deviations even at the largest lattice scales: probability below 2^-180) is added in exact
integer arithmetic, on the host only for lattice points of 2^62 or more.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache
from typing import Protocol

import numpy as np
import torch

from dpkit.errors import InvalidParameterError
from dpkit.noise.bernoulli_exp import decide_exp_neg, decide_exp_neg_small
from dpkit.noise.discrete import GaussianPlan, _resolve_count, gaussian_plan
from dpkit.noise.lattice import Lattice, value_limit
from dpkit.noise.source import RandomSource

__all__ = [
    "DeviceSource",
    "DeviceGaussian",
    "device_gaussian",
    "default_chunk",
    "sample_discrete_gaussian_device",
    "lattice_gaussian_device",
]

_MASK32 = 0xFFFFFFFF
_MASK63 = (1 << 63) - 1
_SMALL_COUNT = 1 << 14  # counts below this keep γ̂'s factors below 2^53 (see discrete._gaussian_batch)
_CPU_CHUNK = 1 << 17
_DEVICE_CHUNK = 1 << 22


class DeviceSource(Protocol):
    """Words on a device, and the same stream continued on the host."""

    def words(self, n: int) -> torch.Tensor:
        """The next ``n`` uniform 64-bit words as an int64 tensor on the sampler's device."""
        ...

    @property
    def host(self) -> RandomSource:
        """The stream, continued on the host after the last word handed out."""
        ...


@dataclass(frozen=True, eq=False)
class DeviceGaussian:
    """The tables of :func:`~dpkit.noise.discrete.gaussian_plan` for one σ, on one device."""

    plan: GaussianPlan
    device: torch.device
    guide: torch.Tensor  # int64 (65536,): #{k : T_k >= (j+1)·2^16}
    thresholds: torch.Tensor  # int64: T_1 > T_2 > … > 0, padded with a final 0
    crowded_below: int  # every bucket holding two or more thresholds lies below this R
    check_from: torch.Tensor | None  # int64 per count A: word_b mod 2^63 below this passes the fast test
    rate: float  # the acceptance rate _fill sizes its batches with (as the numpy sampler)

    @property
    def max_fast_count(self) -> int:
        """The largest count the tables give (a resolved tie can give more)."""
        return int(self.plan.table.thresholds.size) - 1


def _prefix_limits(plan: GaussianPlan, counts: int) -> np.ndarray:
    """For A = 0 … counts−1: the largest prefix P (−1 if none) such that every lane with count A
    and prefix <= P passes decide_exp_neg_small's first test, whatever its low bits, and −1 for
    one more entry (any larger count). Integer thresholds that certify a float test.

    The test is (fl(P)·2^-u + 2^-u <= 1 − γ̂(1 + 2^-50) − 2^-50) with γ̂ = fl(fl(low)·fl(m))·inv,
    m = 2^{J+1}·A + low: every operation is correctly rounded, hence monotone, so γ̂ is largest
    at low = 2^J − 1, the right side smallest there, and the left side grows with P. The limit is
    found by bisection on exactly those float operations (numpy float64 = torch float64).
    """
    jbits = plan.lo_bits
    ubits = 63 - jbits
    ulp = 2.0**-ubits
    a = np.arange(counts, dtype=np.int64)
    low = np.int64((1 << jbits) - 1)
    base = a << np.int64(jbits)
    gamma_max = np.float64(low) * ((base << np.int64(1)) + low).astype(np.float64) * plan.inv_two_sigma2
    rhs = 1.0 - gamma_max * (1.0 + 2.0**-50) - 2.0**-50
    lo = np.full(counts, -1, dtype=np.int64)  # passes (or the sentinel −1)
    hi = np.full(counts, 1 << ubits, dtype=np.int64)  # fails (prefixes are below 2^u)
    while np.any(hi - lo > 1):
        mid = lo + (hi - lo) // 2
        ok = mid.astype(np.float64) * ulp + ulp <= rhs
        lo = np.where(ok, mid, lo)
        hi = np.where(ok, hi, mid)
    return np.append(lo, np.int64(-1))


def _check_from(plan: GaussianPlan, limits: np.ndarray) -> np.ndarray:
    """(P + 1)·2^J per count, capped at 2^63 − 1: with word_b mod 2^63 = prefix·2^J + low,
    prefix <= P iff word_b mod 2^63 < (P + 1)·2^J. The cap only sends the all-ones word to the
    host, which decides it as numpy would."""
    return np.minimum((limits.astype(object) + 1) << plan.lo_bits, 2**63 - 1).astype(np.int64)


@lru_cache(maxsize=32)
def device_gaussian(sigma: Fraction, device: torch.device) -> DeviceGaussian:
    """The plan for σ with its tables copied to ``device`` (once per σ and device)."""
    plan = gaussian_plan(sigma)
    table = plan.table
    if table.thresholds.size >= _SMALL_COUNT:  # s < 1024 keeps the table near 6.7·s entries
        raise AssertionError("inversion table longer than 2**14 entries")

    def put(a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(a)).to(device)

    crowded = np.flatnonzero(table.crowded)
    crowded_below = (int(crowded.max()) + 1) << 16 if crowded.size else 0
    check_from = put(_check_from(plan, _prefix_limits(plan, table.thresholds.size))) if plan.lo_bits else None
    rate = (1.0 - plan.p_zero / 2) * (0.99 if plan.lo_bits else 1.0)  # as sample_discrete_gaussian
    return DeviceGaussian(
        plan,
        device,
        put(table.guide.astype(np.int64)),
        put(table.thresholds.astype(np.int64)),
        crowded_below,
        check_from,
        rate,
    )


def _exact_gamma(plan: GaussianPlan, low: list[int], count: list[int]) -> Callable[[int], Fraction]:
    """Lane i's exact γ = low·(2^{J+1}·a + low)/(2σ²), as in discrete._gaussian_batch."""
    two_s2 = 2 * plan.sigma * plan.sigma
    jbits = plan.lo_bits

    def exact(i: int) -> Fraction:
        lo_i = low[i]
        return Fraction(lo_i * (2 * (count[i] << jbits) + lo_i)) / two_s2

    return exact


def _host(t: torch.Tensor) -> np.ndarray:
    return t.detach().to("cpu").numpy()


def _counts(dg: DeviceGaussian, r: torch.Tensor, src: DeviceSource) -> tuple[torch.Tensor, int]:
    """A = #{k : T_k > R} per lane (InversionTable.count), ties settled exactly on the host.

    In a bucket holding at most one threshold that threshold is T[guide]: R ties a threshold iff
    it equals T[guide]. Those lanes and every lane in the crowded range (about 2·10^-3 of them)
    go to the host, where InversionTable.count and the tie resolution of the numpy sampler run
    on them unchanged. Returns the counts and the largest count any lane holds (known on the host).
    """
    c = dg.guide.index_select(0, r >> 16)
    t = dg.thresholds.index_select(0, c)
    cnt = c.add_(t > r)
    special = torch.nonzero((t == r) | (r < dg.crowded_below)).view(-1)
    top = dg.max_fast_count
    if special.numel():
        plan = dg.plan
        r_h = _host(r[special]).astype(np.uint64)
        cnt_h, ties = plan.table.count(r_h)
        for i in ties:  # R equals a threshold (about 2^-32 per lane): more bits of the same U decide
            cnt_h[i] = _resolve_count(int(r_h[i]), plan.tail, int(cnt_h[i]) + 1, src.host)
            top = max(top, int(cnt_h[i]))
        cnt[special] = torch.from_numpy(cnt_h).to(cnt.device)
    return cnt, top


def _accept(
    dg: DeviceGaussian, cnt: torch.Tensor, word_b: torch.Tensor, top: int, src: DeviceSource
) -> torch.Tensor | None:
    """The lanes (indices) whose U >= e^{−γ}: rejected, exactly; None when there are none.

    Decided on the device by one integer comparison per lane (:func:`_prefix_limits`). The rest,
    about γ ≈ 10^-3 of the lanes, go to the host: decide_exp_neg_small there, as the numpy sampler
    (its float test on those lanes, then the certified enclosure and, for about 2^-19 of them, the
    exact comparison with more bits of the same stream).
    """
    plan = dg.plan
    jbits, ubits = plan.lo_bits, 63 - plan.lo_bits
    if top >= _SMALL_COUNT:  # a resolved tie gave a count of 2^14 or more: probability < 2^-180
        ok = _accept_large(dg, cnt, word_b, src)
        return torch.nonzero(~ok).view(-1)
    assert dg.check_from is not None
    index = cnt if top <= dg.max_fast_count else cnt.clamp(max=dg.max_fast_count + 1)
    check = torch.nonzero((word_b & _MASK63) >= dg.check_from.index_select(0, index)).view(-1)
    if not check.numel():
        return None
    a, wb = _host(cnt[check]), _host(word_b[check])
    lo, pre = wb & np.int64((1 << jbits) - 1), ((wb >> np.int64(jbits)) & np.int64((1 << ubits) - 1)).view(np.uint64)
    # discrete._gaussian_batch's γ̂ on these lanes, operation for operation
    base = a << np.int64(jbits)
    gamma_hat = lo.astype(np.float64) * ((base << np.int64(1)) + lo).astype(np.float64) * plan.inv_two_sigma2
    exact = _exact_gamma(plan, lo.tolist(), a.tolist())
    decided = decide_exp_neg_small(gamma_hat, pre, ubits, exact, src.host)
    return check[torch.from_numpy(~decided).to(check.device)]


def _accept_large(dg: DeviceGaussian, cnt: torch.Tensor, word_b: torch.Tensor, src: DeviceSource) -> torch.Tensor:
    """The decision when a count is 2^14 or more: the whole batch on the host, as
    discrete._gaussian_batch does it (those lanes go to the exact branch)."""
    plan = dg.plan
    jbits, ubits = plan.lo_bits, 63 - plan.lo_bits
    a, wb = _host(cnt), _host(word_b)
    lo, pre = wb & np.int64((1 << jbits) - 1), ((wb >> np.int64(jbits)) & np.int64((1 << ubits) - 1)).view(np.uint64)
    base = a << np.int64(jbits)
    gamma_hat = lo.astype(np.float64) * ((base << np.int64(1)) + lo).astype(np.float64) * plan.inv_two_sigma2
    small = a < _SMALL_COUNT
    err = np.where(small, gamma_hat * 2.0**-50, np.inf)
    exact = _exact_gamma(plan, lo.tolist(), a.tolist())
    ok = decide_exp_neg(np.where(small, gamma_hat, 0.0), err, pre, ubits, exact, src.host)
    return torch.from_numpy(ok).to(cnt.device)


def _decide(
    dg: DeviceGaussian, word_a: torch.Tensor, word_b: Callable[[], torch.Tensor], src: DeviceSource
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Each proposal's value and whether it is accepted (discrete.gaussian_decide, lane by lane),
    and a bound on the values: every |Y| is below (top + 1)·2^J. ``word_b()`` gives the second
    words, read after the ties of R are settled and only when the plan has low bits, as the
    numpy sampler reads them."""
    plan = dg.plan
    cnt, top = _counts(dg, word_a & _MASK32, src)
    sign = word_a >> 63  # −1 where the uint64 word's top bit is set (arithmetic shift), else 0
    jbits = plan.lo_bits
    rejected = None
    if jbits:
        wb = word_b()
        rejected = _accept(dg, cnt, wb, top, src)
        m = (cnt << jbits).bitwise_or_(wb & ((1 << jbits) - 1))  # 2^J·A + Lo
    else:
        m = cnt
    keep = (m != 0).bitwise_or_(sign == 0)  # reject (−, 0): zero would otherwise be counted twice
    if rejected is not None:
        keep[rejected] = False
    y = (m ^ sign).sub_(sign)  # −m where sign = −1 (two's complement), m elsewhere
    return y, keep, top


def _batch(dg: DeviceGaussian, k: int, src: DeviceSource) -> tuple[torch.Tensor, int]:
    """The accepted draws among k proposals, in order (discrete._gaussian_batch), and a bound
    on their magnitude: every |Y| is below (top + 1)·2^J."""
    y, keep, top = _decide(dg, src.words(k), lambda: src.words(k), src)
    return torch.masked_select(y, keep), top


def _fill(dg: DeviceGaussian, n: int, src: DeviceSource, chunk: int) -> tuple[torch.Tensor, int]:
    """n accepted draws (discrete._fill with ``chunk`` for CHUNK) and the bound of _batch."""
    parts, have, top = [], 0, 0
    while have < n:
        need = n - have
        got, t = _batch(dg, min(chunk, int(need / dg.rate * 1.02) + 16), src)
        parts.append(got[:need])
        have += parts[-1].numel()
        top = max(top, t)
    if len(parts) == 1:
        return parts[0], top
    return (torch.cat(parts) if parts else torch.empty(0, dtype=torch.int64, device=dg.device)), top


def default_chunk(device: torch.device) -> int:
    """Coordinates per block, and proposals per batch at most: 2^17 on the CPU (cache-sized
    int64 temporaries, large enough for torch's threads and per-call overheads); 2^22 elsewhere,
    so that kernel launches and the three device-to-host synchronisations per batch are
    amortised."""
    return _CPU_CHUNK if device.type == "cpu" else _DEVICE_CHUNK


def _chunk(device: torch.device, chunk: int | None) -> int:
    if chunk is None:
        return default_chunk(device)
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
        raise InvalidParameterError("chunk", chunk, "a positive integer")
    return chunk


def sample_discrete_gaussian_device(
    sigma: Fraction, n: int, src: DeviceSource, *, device: torch.device | str = "cpu", chunk: int | None = None
) -> torch.Tensor:
    """n exact draws of the discrete Gaussian with parameter σ (``sigma`` a Fraction in
    [2^-20, 2^52]) as an int64 tensor on ``device``, from the words of ``src``; with
    ``chunk=CHUNK``, draw for draw those of ``sample_discrete_gaussian`` on the same stream."""
    dev = torch.device(device)
    return _fill(device_gaussian(sigma, dev), n, src, _chunk(dev, chunk))[0]


def _add_exactly(points: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """points + noise rounded once, for noise of 2^53 or more (lattice._add_exactly): in int64
    where neither term reaches 2^62, in Python integers (on the host) for the rest."""
    safe = (points.abs() < 2.0**62) & (noise.abs() < 2**62)
    # clamped first so that no lane converts or adds out of int64's range (those lanes are redone)
    total = points.clamp(-(2.0**62), 2.0**62).to(torch.int64) + noise.clamp(1 - 2**62, 2**62 - 1)
    out = total.to(torch.float64)
    rest = torch.nonzero(~safe).view(-1)
    if rest.numel():
        vals = [
            float(int(p) + int(y))
            for p, y in zip(_host(points[rest]).tolist(), _host(noise[rest]).tolist(), strict=True)
        ]
        out[rest] = torch.tensor(vals, dtype=torch.float64, device=out.device)
    return out


def lattice_gaussian_device(
    x: torch.Tensor, lattice: Lattice, lattice_sigma: Fraction, src: DeviceSource, *, chunk: int | None = None
) -> torch.Tensor:
    """:func:`dpkit.noise.lattice.lattice_gaussian` on ``x``'s device: x (as float64) clamped to
    ±value_limit (NaN → 0), snapped to the lattice g·ℤ, plus g·DiscreteGaussian(lattice_sigma) per
    coordinate. Returns a new float64 tensor of x's shape on x's device; total on values.

    ``src`` must give words on x's device. With ``chunk=CHUNK`` the result equals
    ``lattice_gaussian`` on the same stream, draw for draw.
    """
    dev = x.device
    dg = device_gaussian(lattice_sigma, dev)
    size = _chunk(dev, chunk)
    flat = x.detach().reshape(-1)
    out = torch.empty(flat.shape, dtype=torch.float64, device=dev)
    for s in range(0, flat.numel(), size):
        points = snap_points(flat[s : s + size], lattice)
        noise, top = _fill(dg, points.numel(), src, size)
        add_noise(points, noise, (top + 1) << dg.plan.lo_bits, lattice, out=out[s : s + size])
    return out.view(x.shape)


def snap_points(x: torch.Tensor, lattice: Lattice) -> torch.Tensor:
    """round(clamp(x)/g) as float64: clamped first (lattice module docstring, "Totality"), NaN
    to 0, then snapped: x·2^-k is exact and round() rounds half to even, as np.rint."""
    limit = value_limit(lattice)
    points = torch.nan_to_num(x.to(torch.float64), nan=0.0, posinf=limit, neginf=-limit)
    return points.clamp_(-limit, limit).mul_(math.ldexp(1.0, -lattice.exponent)).round_()


def add_noise(points: torch.Tensor, noise: torch.Tensor, bound: int, lattice: Lattice, *, out: torch.Tensor) -> None:
    """out ← g·(points + noise), the sum rounded once; ``bound`` > every |noise|."""
    if bound > 1 << 53 and bool((noise.abs() >= 1 << 53).any()):
        out.copy_(_add_exactly(points, noise))
    else:  # both exact doubles: one correctly rounded sum
        torch.add(points, noise.to(torch.float64), out=out)
    out.mul_(lattice.granularity)
