"""The exact lattice release on CPU tensors in one compiled pass: words, decisions and release fused.

:mod:`dpkit.torch.device_noise` runs the exact discrete Gaussian as about thirty whole-tensor
torch operations per batch (gathers, masks, a compaction). On a GPU they are cheap; on the CPU
each is a pass over memory, and the release ran at 0.09–0.17× float32 ``torch.randn``. Here the
same per-proposal decisions run in one loop compiled by numba (``nogil``), chunk by chunk, on
torch's thread count of threads, each thread reading its own range of the ChaCha20 stream from
OpenSSL (which also runs without the GIL) and writing the release g·(round(clamp(x)/g) + Y):

* the chunks' words are reserved up front in whole blocks (:meth:`ChaChaStream.take_blocks`);
  chunk j reads its own blocks at a fixed offset, so the result does not depend on how many
  threads run. A proposal uses 96 bits (:func:`chunk_words`): a 32-bit uniform R (two per word)
  and a word_b whose top bit is the sign and whose 63 low bits are the low part and the
  acceptance prefix — the bits the numpy sampler reads from its (word_a, word_b) pair
  (:func:`proposal_words` maps one layout onto the other);
* R is counted with one load from a 256 KiB table (:func:`_bucket_table`): for the 2^16-bucket
  of R, the count at its top, whether the next threshold lies in it and that threshold's low 16
  bits. R in the crowded buckets (far tails, about 2·10^-3 of lanes) is counted by bisection
  over all thresholds. The acceptance prefix is compared with the certified integer limit of
  :mod:`dpkit.torch.device_noise` (``_prefix_limits``). Integer operations only;
* the loop *lists* the lanes those integer tests do not decide: a tie with a threshold, a prefix
  above its limit (about 1.6·10^-3 of the lanes), the (−, 0) proposal the sampler rejects, and
  in a release noise of 2^53 or more (added to the point in exact integers). After all chunks the
  listed lanes alone are decided by the numpy sampler's own per-lane decision,
  :func:`dpkit.noise.discrete.gaussian_decide`, reading more words of the same stream after the
  reserved range in lane order; the lanes it rejects take fresh exact draws of their own (this
  module again, about 10^-3 of the lanes per round).

Why this is exact. Every proposal is decided exactly: by integer tests whose certificates
:mod:`dpkit.torch.device_noise` proves, or by the exact numpy routines. Coordinate i's value is
the first accepted proposal of its own i.i.d. sequence (its lane, then fresh draws if rejected),
so each coordinate is exactly discrete Gaussian and the coordinates are independent; whether a
lane is listed is a function of the proposal's own words, never of x. The numpy sampler keeps
the first n accepted proposals of one sequence instead: the same distribution, another
assignment of proposals to coordinates, so the draws are not the numpy sampler's. The tests
compare the loop draw for draw with an oracle built from ``gaussian_decide`` alone (random words
from σ = 0.5 to 2^52 and scripted words on every rare path) and the output with the PMF.

The release arithmetic is the lattice module's, operation for operation: x clamped to
±value_limit (NaN → 0, ±inf → the limit), x·2^-k (exact), rounded half to even (``np.rint``),
one correctly rounded float64 sum with the exactly representable noise, × g. numba compiles
without fast-math, so nothing is contracted into fused multiply-adds. Nothing is approximated;
nothing is added to δ. The loop's branches and its time depend on the words, never on x.

Cost on the 2-core benchmark machine: about 7 ns of CPU time per value — ChaCha20 about 2 ns
(96 bits), the decision about 3.5 ns (scalar: LLVM does not vectorise the table loads), the
release 0.8 ns. numba is a dependency of the ``torch`` extra; without it :func:`available` is
False and :class:`~dpkit.torch.noise.LatticeNoise` uses the torch operations on the CPU too
(exact, slower). The first call in a process imports numba and loads the compiled loop from
numba's on-disk cache (compiled once, about 1 s).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache
from typing import Any, Protocol

import numpy as np
import torch
from numpy.typing import NDArray

from dpkit.errors import InvalidParameterError
from dpkit.noise.discrete import GaussianPlan, gaussian_decide
from dpkit.noise.lattice import Lattice, value_limit
from dpkit.torch.device_noise import add_noise, device_gaussian, snap_points

__all__ = [
    "CPU_CHUNK",
    "SeekableSource",
    "available",
    "chunk_words",
    "lattice_gaussian_cpu",
    "proposal_words",
    "sample_discrete_gaussian_cpu",
]

CPU_CHUNK = 1 << 16  # proposals per chunk: 1.5·2^16 words (768 KiB); the chunk's arrays stay in cache
_MASK32 = 0xFFFFFFFF
_MASK63 = (1 << 63) - 1
_SIGN = np.uint64(1 << 63)


class SeekableSource(Protocol):
    """A stream of 64-bit words whose blocks of 8 can be reserved and then read from any block
    on (a reader per thread), and that is read on in order: :class:`~dpkit.torch.chacha.ChaChaStream`."""

    def take_blocks(self, blocks: int) -> int:
        """Reserve the next ``blocks`` blocks (from the next block boundary); the first's index."""
        ...

    def reader(self, block: int) -> Callable[..., NDArray[np.uint64]]:
        """Reads consecutive reserved blocks from ``block`` on: ``read(m, out)`` gives the next m
        blocks (8·m words), written into ``out``."""
        ...

    def words(self, n: int) -> NDArray[np.uint64]:
        """The next ``n`` words (reserved and read)."""
        ...


def chunk_words(k: int) -> int:
    """Words a chunk of k proposals reads: ⌈k/2⌉ for the 32-bit uniforms R (two per word, low
    half first), then k for word_b (its top bit the sign, its 63 low bits the low part and the
    acceptance prefix)."""
    return (k + 1) // 2 + k


def proposal_words(
    w: NDArray[np.uint64], k: int, lanes: NDArray[np.intp]
) -> tuple[NDArray[np.uint64], NDArray[np.uint64]]:
    """Lanes ``lanes`` of a chunk of k proposals read from words ``w``, as the (word_a, word_b)
    pairs of the numpy sampler's layout: word_a = R + sign·2^63, word_b = the 63 low bits (its
    top bit is not read by the sampler). The same 96 bits per proposal, every bit used once."""
    half = (k + 1) // 2
    r = np.ascontiguousarray(w[:half]).view(np.uint32)[lanes].astype(np.uint64)
    b = w[half + lanes]
    return r | (b & _SIGN), b & np.uint64(_MASK63)


@dataclass(frozen=True, eq=False)
class _Tables:
    """The plan's integer tables as the loop reads them."""

    plan: GaussianPlan
    bucket: NDArray[np.int32]  # per 2^16-bucket j: count, whether and where a threshold lies in it (_bucket_table)
    thresholds: NDArray[np.int64]  # T_1 > T_2 > … > 0, padded with a final 0 (for crowded buckets)
    check_from: NDArray[np.int64]  # per count A: word_b mod 2^63 below this is accepted (device_noise)
    crowded_below: int


def _bucket_table(guide: NDArray[np.int64], thr: NDArray[np.int64]) -> NDArray[np.int32]:
    """One 32-bit entry per 2^16-bucket j, so that the count of R in a bucket holding at most one
    threshold takes one load from a 256 KiB table (cache-resident; a 64-bit table that also held
    the acceptance limits measured 30 % slower): c = guide[j] (bits 17–30, the thresholds at or
    above the bucket's top), has (bit 16: the next threshold T = thr[c] lies in bucket j) and T's
    low 16 bits. Then the count is c + (has and T's low bits > R's), R ties T iff has and they
    are equal, and a T below the bucket is below every R in it."""
    t = thr[guide]
    has = ((t >> 16) == np.arange(guide.size, dtype=np.int64)).astype(np.int64)
    return ((guide << 17) | (has << 16) | (t & 0xFFFF)).astype(np.int32)


@lru_cache(maxsize=32)
def _tables(sigma: Fraction) -> _Tables:
    dg = device_gaussian(sigma, torch.device("cpu"))
    guide, thr = dg.guide.numpy(), dg.thresholds.numpy()
    if int(guide.max()) >= min(thr.size, 1 << 14) or int(thr.max()) > _MASK32:
        raise AssertionError("inversion tables out of shape")
    check = dg.check_from.numpy() if dg.check_from is not None else None
    if check is not None and check.size < thr.size:
        raise AssertionError("prefix limits out of shape")
    never = np.full(thr.size, _MASK63, dtype=np.int64)  # no acceptance step: no lane is checked
    bucket = _bucket_table(guide, thr)
    return _Tables(dg.plan, bucket, thr, check if check is not None else never, dg.crowded_below)


@lru_cache(maxsize=1)
def _compiled() -> tuple[Callable[..., int], Callable[..., None]] | None:
    """The compiled loop, or None without numba."""
    try:
        import numba
    except ImportError:
        return None

    @numba.njit(nogil=True, cache=True, boundscheck=False, error_model="numpy")
    def lane(  # pragma: no cover - compiled (numba)
        r: Any, b: Any, thr: Any, check_from: Any, jbits: Any
    ) -> Any:
        """Proposal (R, word_b)'s value, and whether the host must decide it: the count by
        bisection over all thresholds, for R in the crowded buckets."""
        lo, hi = np.int64(0), np.int64(thr.shape[0])
        while lo < hi:  # #{k : T_k > R}
            mid = (lo + hi) >> 1
            if thr[mid] > r:
                lo = mid + 1
            else:
                hi = mid
        cnt = lo  # below the table's size: its final 0 is never above R
        f = thr[lo] == r  # a tie: more bits of the uniform decide (on the host)
        if jbits > 0:
            f |= (b & np.int64(_MASK63)) >= check_from[cnt]
            m = (cnt << jbits) | (b & ((np.int64(1) << jbits) - 1))
        else:
            m = cnt
        s = b >> 63  # −1 or 0
        f |= (m == 0) & (s != 0)
        return (m ^ s) - s, f

    @numba.njit(nogil=True, cache=True, boundscheck=False, error_model="numpy")
    def decide(  # pragma: no cover - compiled (numba); checked lane for lane against gaussian_decide
        w: Any,
        k: int,
        bucket: Any,
        thr: Any,
        check_from: Any,
        jbits: int,
        crowded_below: int,
        bigcheck: bool,
        y: Any,
        found: Any,
    ) -> int:
        """Decides the chunk's k proposals into ``y`` and lists the lanes the host must decide in
        ``found`` (k entries), in order; returns how many. ``bigcheck``: flag values of 2^53 or
        more too (only when the tables allow them)."""
        big = np.int64(1) << 53
        lomask = (np.int64(1) << jbits) - 1
        half = (k + 1) >> 1
        r32 = w[:half].view(np.uint32)
        # The common case without branches, one load from the bucket table and one from the
        # acceptance limits per lane. Flagged lanes and lanes of crowded buckets are appended to
        # `found` (always written, the count advanced only if listed); the crowded ones are
        # redone by `lane` below.
        nf = 0
        for i in range(k):
            r = np.int64(r32[i])
            b = w[half + i]
            e = np.int64(bucket[r >> 16])
            has = (e >> 16) & 1
            t, rl = e & 0xFFFF, r & 0xFFFF
            cnt = (e >> 17) + (has & (t > rl))
            m = (cnt << jbits) | (b & lomask)
            s = b >> 63  # −1 or 0
            v = (m ^ s) - s
            y[i] = v
            f = (has & (t == rl)) | (r < crowded_below) | ((m == 0) & (s != 0)) | ((b & _MASK63) >= check_from[cnt])
            if bigcheck:
                f |= (v >= big) | (v <= -big)
            found[nf] = i
            nf += f
        keep = 0
        for j in range(nf):  # keep <= j: compacted in place
            i = found[j]
            if np.int64(r32[i]) < crowded_below:
                v, f = lane(np.int64(r32[i]), w[half + i], thr, check_from, jbits)
                y[i] = v
                if not (f or (bigcheck and (v >= big or v <= -big))):
                    continue
            found[keep] = i
            keep += 1
        return keep

    @numba.njit(nogil=True, cache=True, boundscheck=False, error_model="numpy")
    def release(x: Any, y: Any, limit: float, scale: float, g: float, out: Any) -> None:  # pragma: no cover
        """out = g·(round(clamp(x)·2^-k) + y), operation for operation as the lattice module
        (vectorised by the compiler: no loads depend on data)."""
        for i in range(x.shape[0]):
            xi = min(max(x[i], -limit), limit)
            xi = 0.0 if xi != xi else xi  # NaN → 0 (min/max pass it through)
            out[i] = (np.rint(xi * scale) + np.float64(y[i])) * g

    return decide, release


def available() -> bool:
    """True when numba is installed: :class:`~dpkit.torch.noise.LatticeNoise` then uses this
    module on CPU tensors."""
    return _compiled() is not None


@lru_cache(maxsize=4)
def _pool(workers: int) -> ThreadPoolExecutor:
    return ThreadPoolExecutor(workers, thread_name_prefix="dpkit-noise")


def _workers(workers: int | None) -> int:
    if workers is None:
        return max(1, min(torch.get_num_threads(), os.cpu_count() or 1))
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise InvalidParameterError("workers", workers, "None (torch's thread count) or a positive integer")
    return workers


def _chunk(chunk: int | None) -> int:
    if chunk is None:
        return CPU_CHUNK
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 2 or chunk % 2:
        raise InvalidParameterError("chunk", chunk, "None (2**16) or an even integer >= 2")
    return chunk


_Flagged = tuple[NDArray[np.intp], NDArray[np.uint64], NDArray[np.uint64]]


def _run(
    tab: _Tables,
    n: int,
    stream: SeekableSource,
    x: NDArray[np.float64] | None,
    lattice: Lattice | None,
    chunk: int,
    workers: int,
) -> tuple[NDArray[Any], _Flagged]:
    """The loop over all chunks: the release (or the values) and the flagged lanes with their
    (word_a, word_b). Chunk j covers lanes [j·chunk, …) and reads its chunk_words at a fixed
    offset of the range reserved up front, whatever the number of threads."""
    compiled = _compiled()
    assert compiled is not None
    decide, release = compiled
    jbits = tab.plan.lo_bits
    bigcheck = (tab.thresholds.size << jbits) > 1 << 53  # a table count that reaches 2^53
    if x is not None:
        assert lattice is not None
        limit, scale, g = value_limit(lattice), math.ldexp(1.0, -lattice.exponent), lattice.granularity
        result: NDArray[Any] = np.empty(n, dtype=np.float64)
    else:
        result = np.empty(n, dtype=np.int64)
    blocks = -(-chunk_words(chunk) // 8)  # a chunk's words, in whole blocks
    first = stream.take_blocks((n // chunk) * blocks + -(-chunk_words(n % chunk) // 8))

    def lanes(lo: int, hi: int) -> list[_Flagged]:
        found = []
        read = stream.reader(first + (lo // chunk) * blocks)
        words = np.empty(8 * blocks, dtype=np.uint64)  # reused by every chunk of this range
        buf = np.empty(chunk, dtype=np.int64)
        y = np.empty(chunk, dtype=np.int64) if x is not None else None
        for s in range(lo, hi, chunk):
            k = min(chunk, n - s)
            w = read(-(-chunk_words(k) // 8), words)
            ys = result[s : s + k] if y is None else y[:k]
            nf = decide(w.view(np.int64), k, tab.bucket, tab.thresholds, tab.check_from, jbits,
                        tab.crowded_below, bigcheck, ys, buf)  # fmt: skip
            if x is not None:
                release(x[s : s + k], ys, limit, scale, g, result[s : s + k])
            if nf:
                idx = np.sort(buf[:nf])
                found.append((idx + s, *proposal_words(w, k, idx)))
        return found

    chunks = -(-n // chunk)
    per = -(-chunks // workers) * chunk  # lanes per thread: whole chunks
    ranges = [(lo, min(n, lo + per)) for lo in range(0, n, per)] if n else []
    if len(ranges) <= 1:
        found = lanes(0, n)
    else:  # this thread takes the first range itself: one wake-up fewer
        rest = [_pool(workers).submit(lanes, *r) for r in ranges[1:]]
        found = lanes(*ranges[0])
        for job in rest:
            found += job.result()
    if not found:
        empty = np.empty(0, dtype=np.uint64)
        return result, (np.empty(0, dtype=np.intp), empty, empty)
    return result, (
        np.concatenate([f[0] for f in found]),
        np.concatenate([f[1] for f in found]),
        np.concatenate([f[2] for f in found]),
    )


def _settle(
    tab: _Tables, flagged: _Flagged, stream: SeekableSource, chunk: int, workers: int
) -> tuple[NDArray[np.int64], int]:
    """The flagged lanes' values: decided by the numpy sampler's own per-lane decision
    (:func:`~dpkit.noise.discrete.gaussian_decide`, reading more words of the stream in lane
    order), the rejected ones replaced by fresh exact draws (this module again; about 10^-3 of the
    lanes at each round). Returns the values and the largest count: every |Y| < (top + 1)·2^J."""
    _, wa, wb = flagged
    y, ok = gaussian_decide(tab.plan, wa, lambda: wb, stream)
    top = int(np.abs(y).max(initial=0)) >> tab.plan.lo_bits
    rejected = np.flatnonzero(~ok)
    if rejected.size:
        y[rejected], t = _values(tab, rejected.size, stream, chunk, workers)
        top = max(top, t)
    return y, top


def _values(tab: _Tables, n: int, stream: SeekableSource, chunk: int, workers: int) -> tuple[NDArray[np.int64], int]:
    """n exact draws, and the largest count among them (see _settle)."""
    y, flagged = _run(tab, n, stream, None, None, chunk, workers)
    top = tab.thresholds.size
    if flagged[0].size:
        y[flagged[0]], t = _settle(tab, flagged, stream, chunk, workers)
        top = max(top, t)
    return y, top


def sample_discrete_gaussian_cpu(
    sigma: Fraction, n: int, stream: SeekableSource, *, chunk: int | None = None, workers: int | None = None
) -> torch.Tensor:
    """n exact draws of the discrete Gaussian with parameter σ (a Fraction in [2^-20, 2^52]) as
    an int64 CPU tensor, from ``stream`` (a :class:`~dpkit.torch.chacha.ChaChaStream`)."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise InvalidParameterError("n", n, "an integer >= 0")
    return torch.from_numpy(_values(_tables(sigma), n, stream, _chunk(chunk), _workers(workers))[0])


def lattice_gaussian_cpu(
    x: torch.Tensor,
    lattice: Lattice,
    lattice_sigma: Fraction,
    stream: SeekableSource,
    *,
    chunk: int | None = None,
    workers: int | None = None,
) -> torch.Tensor:
    """:func:`dpkit.noise.lattice.lattice_gaussian` on a CPU tensor: x (as float64) clamped to
    ±value_limit (NaN → 0), snapped to g·ℤ, plus g·DiscreteGaussian(lattice_sigma) per coordinate,
    as a new float64 tensor of x's shape; total on values. ``stream``: a
    :class:`~dpkit.torch.chacha.ChaChaStream` (keyed from the operating system per release)."""
    if x.device.type != "cpu":
        raise InvalidParameterError("x", f"a tensor on {x.device}", "a CPU tensor (other devices: device_noise)")
    size, threads = _chunk(chunk), _workers(workers)
    tab = _tables(lattice_sigma)
    flat = np.ascontiguousarray(x.detach().reshape(-1).to(torch.float64).numpy())
    out, flagged = _run(tab, flat.size, stream, flat, lattice, size, threads)
    lanes = flagged[0]
    if lanes.size:
        noise, top = _settle(tab, flagged, stream, size, threads)
        fixed = np.empty(lanes.size, dtype=np.float64)
        if (top + 1) << tab.plan.lo_bits <= 1 << 53:  # exact doubles: the loop's own arithmetic
            compiled = _compiled()
            assert compiled is not None
            scale = math.ldexp(1.0, -lattice.exponent)
            compiled[1](flat[lanes], noise, value_limit(lattice), scale, lattice.granularity, fixed)
        else:
            points = snap_points(torch.from_numpy(flat[lanes]), lattice)
            add_noise(
                points, torch.from_numpy(noise), (top + 1) << tab.plan.lo_bits, lattice, out=torch.from_numpy(fixed)
            )
        out[lanes] = fixed
    return torch.from_numpy(out).view(x.shape)
