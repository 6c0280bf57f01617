"""The exact lattice release on CPU tensors in one compiled loop (dpkit.torch.cpu_noise).

Deterministic evidence: an oracle built from the numpy sampler's own per-lane decision
(``gaussian_decide``) on the same words — every lane of every chunk decided by it, the rejected
lanes refilled by the same rule, recursively — must give the loop's output draw for draw and
read the same number of words, on random words at σ from 0.5 to 2^52 (the small σ have no
acceptance step; 2^52 has values of 2^53 and more) and on scripted words that force each rare
path: a tie with a threshold, a crowded bucket, a prefix above its limit (rejected and accepted),
the (−, 0) proposal, the exact branch of the exp acceptance. Broken loops (a crowded bucket
counted by the guide table, the acceptance limit ignored) fail the same comparison. The release
is the lattice module's arithmetic bit for bit (NaN, ±inf, halves, huge values), and the
number of worker threads does not change what is released.

Statistical evidence: χ² goodness of fit of the loop's draws to the discrete Gaussian PMF at
σ = 0.5, 3, 1000 and 2^30, tail counts at σ = 3 and 2^30, and the DP-SGD release's noise, each
at ALPHA = 1e-6: a correct sampler fails one of these 7 checks with probability at most 7e-6
(fixed seeds: a given build passes or fails deterministically); a sampler with σ 2 % too large
fails them (checked).
"""

from __future__ import annotations

import math
from dataclasses import replace
from fractions import Fraction

import numpy as np
import pytest
from scipy import special

torch = pytest.importorskip("torch")
pytest.importorskip("numba")

import dpkit.noise.lattice as lattice_module  # noqa: E402
from _dgauss import lattice_noise_pvalue, pmf_pvalue, tail_probability  # noqa: E402
from _stats import ALPHA, binomial_z  # noqa: E402
from dpkit.errors import InvalidParameterError  # noqa: E402
from dpkit.noise.discrete import gaussian_decide, gaussian_plan  # noqa: E402
from dpkit.noise.lattice import Lattice  # noqa: E402
from dpkit.torch import cpu_noise  # noqa: E402
from dpkit.torch.chacha import ChaChaStream  # noqa: E402
from dpkit.torch.cpu_noise import (  # noqa: E402
    chunk_words,
    lattice_gaussian_cpu,
    proposal_words,
    sample_discrete_gaussian_cpu,
)
from dpkit.torch.noise import LatticeNoise  # noqa: E402

N = 1_000_000
Z_ALPHA = float(-special.ndtri(ALPHA / 2))
KEY, NONCE = bytes(range(32)), bytes(range(100, 112))
DP_SGD_SIGMA = LatticeNoise.plan(noise_multiplier=1.0, max_grad_norm=1.0, size=203_530, max_batch=256).lattice_sigma


class Script:
    """Words from an array (planted words first, then seeded ones): the stream interface of
    cpu_noise (blocks reserved and read by range, the rest read in order) and a numpy source."""

    def __init__(self, planted: dict[int, int] | None = None, length: int = 400_000, seed: int = 1) -> None:
        w = np.random.default_rng(seed).integers(0, 2**64 - 1, size=length, dtype=np.uint64, endpoint=True)
        for pos, word in (planted or {}).items():
            w[pos] = np.uint64(word)
        self.w, self.pos = w, 0

    def take(self, n: int) -> int:
        if self.pos + n > self.w.size:
            raise AssertionError("script too short")
        self.pos += n
        return self.pos - n

    def take_blocks(self, blocks: int) -> int:
        self.take(-self.pos % 8)
        return self.take(8 * blocks) // 8

    def reader(self, block: int):  # noqa: ANN201
        at = [8 * block]

        def read(m: int, out: np.ndarray | None = None) -> np.ndarray:
            got = self.w[at[0] : at[0] + 8 * m]
            at[0] += 8 * m
            if out is None:
                return got.copy()
            out[: 8 * m] = got
            return out[: 8 * m]

        return read

    def words(self, n: int) -> np.ndarray:
        start = self.take(n)
        return self.w[start : start + n]


def oracle(sigma: Fraction, n: int, src: Script, chunk: int = cpu_noise.CPU_CHUNK) -> np.ndarray:
    """What the loop must return, from the numpy sampler's per-lane decision alone."""
    plan = gaussian_plan(sigma)
    blocks = -(-chunk_words(chunk) // 8)
    first = src.take_blocks((n // chunk) * blocks + -(-chunk_words(n % chunk) // 8))
    wa, wb = [], []
    for j, s in enumerate(range(0, n, chunk)):
        k = min(chunk, n - s)
        w = src.w[8 * (first + j * blocks) :][: chunk_words(k)]
        a, b = proposal_words(w, k, np.arange(k))
        wa.append(a)
        wb.append(b)
    if not wa:
        return np.empty(0, dtype=np.int64)
    y, ok = gaussian_decide(plan, np.concatenate(wa), lambda: np.concatenate(wb), src)
    bad = np.flatnonzero(~ok)
    if bad.size:
        y[bad] = oracle(sigma, bad.size, src, chunk)
    return y


def agree(
    sigma: Fraction, n: int, planted: dict[int, int] | None = None, chunk: int = cpu_noise.CPU_CHUNK
) -> np.ndarray:
    mine, ref = Script(planted), Script(planted)
    got = sample_discrete_gaussian_cpu(sigma, n, mine, chunk=chunk, workers=2).numpy()
    want = oracle(sigma, n, ref, chunk)
    assert np.array_equal(got, want)
    assert mine.pos == ref.pos  # the same words read, extra words included
    return got


def r_word(r: int, other: int = 0) -> int:
    """A word holding the 32-bit uniform R of lane 2i (low half) and ``other`` for lane 2i + 1."""
    return r | (other << 32)


def word_b(low: int, prefix: int, jbits: int, negative: bool = False) -> int:
    return (prefix << jbits) | low | ((1 << 63) if negative else 0)


# -- lane for lane: the numpy sampler's decisions ------------------------------------------------


@pytest.mark.parametrize(
    "sigma",
    [Fraction(1, 2), Fraction(3), Fraction(1000), Fraction(2**19 + 1), Fraction(2**30), DP_SGD_SIGMA, Fraction(2**52)],
    ids=lambda s: f"{float(s):.4g}",
)
def test_draw_for_draw_the_oracle(sigma: Fraction) -> None:
    agree(sigma, 100_003, chunk=1 << 14)  # several chunks, an odd last one, two threads


def test_no_proposals_and_one() -> None:
    assert agree(DP_SGD_SIGMA, 0).size == 0
    assert agree(DP_SGD_SIGMA, 1).size == 1


def planted_chunk(sigma: Fraction, lanes: dict[int, tuple[int, int]], k: int = 64) -> dict[int, int]:
    """Words of a first chunk of k proposals (the stream starts on a block boundary) with lane i's
    R and word_b set to lanes[i]."""
    half = (k + 1) // 2
    w: dict[int, int] = {}
    for i, (r, b) in sorted(lanes.items()):
        low, high = w.get(i // 2, 0) & 0xFFFFFFFF, w.get(i // 2, 0) >> 32
        w[i // 2] = r_word(r, high) if i % 2 == 0 else r_word(low, r)
        w[half + i] = b
    return w


def test_rare_paths_on_scripted_words() -> None:
    """A tie with a threshold, a crowded bucket's lane, a prefix above its limit (one far above:
    rejected; one just above: accepted by the exact decision), the (−, 0) proposal."""
    sigma = DP_SGD_SIGMA
    plan = gaussian_plan(sigma)
    thr = [int(t) for t in plan.table.thresholds]
    jbits = plan.lo_bits
    tab = cpu_noise._tables(sigma)
    a = 5
    limit = int(tab.check_from[a]) >> jbits  # the largest prefix still certified for count a
    lanes = {
        0: (thr[10], word_b(7, 0, jbits)),  # R ties T_11: more bits decide
        1: (tab.crowded_below - 1, word_b(11, 0, jbits)),  # the crowded range: bisection
        2: (thr[a] + 1, word_b(2**jbits - 1, (1 << (63 - jbits)) - 1, jbits)),  # prefix all ones: rejected
        3: (thr[a] + 1, word_b(2**jbits - 1, limit + 1, jbits)),  # just past the certificate
        4: (thr[a] + 1, word_b(0, 0, jbits, negative=True)),  # an ordinary lane
        5: (2**32 - 1, word_b(0, 0, jbits, negative=True)),  # count 0, low 0, negative: (−, 0)
    }
    planted = planted_chunk(sigma, lanes)
    got = agree(sigma, 64, planted, chunk=64)
    assert got[1] != 0
    # the flagged lanes are exactly the rare ones (lane 4 is an ordinary one)
    src = Script(planted)
    _, flagged = cpu_noise._run(tab, 64, src, None, None, 64, 1)
    assert {0, 2, 3, 5} <= set(flagged[0].tolist()) and 4 not in set(flagged[0].tolist())


def test_the_exact_branch_and_resolved_counts_at_small_sigma() -> None:
    """σ = 3: no low bits (no acceptance step), ties resolved with more bits."""
    sigma = Fraction(3)
    thr = [int(t) for t in gaussian_plan(sigma).table.thresholds]
    planted = planted_chunk(sigma, {i: (thr[i], 0) for i in range(min(8, len(thr) - 1))}, k=16)
    agree(sigma, 16, planted, chunk=16)


@pytest.mark.parametrize("fault", ["crowded-by-guide", "no-acceptance-check"])
def test_broken_loops_are_caught(monkeypatch: pytest.MonkeyPatch, fault: str) -> None:
    """The comparison has power: a loop that counts crowded buckets with the guide table alone,
    or one that accepts every prefix, disagrees with the oracle."""
    tab = cpu_noise._tables(DP_SGD_SIGMA)
    if fault == "crowded-by-guide":
        broken = replace(tab, crowded_below=0)
    else:
        broken = replace(tab, check_from=np.full_like(tab.check_from, (1 << 63) - 1))
    monkeypatch.setattr(cpu_noise, "_tables", lambda sigma: broken)
    mine, ref = Script(), Script()
    got = sample_discrete_gaussian_cpu(DP_SGD_SIGMA, 100_000, mine, workers=1).numpy()
    assert not np.array_equal(got, oracle(DP_SGD_SIGMA, 100_000, ref))


def test_threads_do_not_change_the_draws() -> None:
    one = sample_discrete_gaussian_cpu(DP_SGD_SIGMA, 300_001, ChaChaStream(KEY, NONCE), workers=1, chunk=1 << 14)
    many = sample_discrete_gaussian_cpu(DP_SGD_SIGMA, 300_001, ChaChaStream(KEY, NONCE), workers=3, chunk=1 << 14)
    assert torch.equal(one, many)


# -- the release -----------------------------------------------------------------------------------


def awkward(n: int, g: float) -> np.ndarray:
    rng = np.random.default_rng(4)
    x = rng.normal(size=n) * 3
    x[:8] = [np.nan, np.inf, -np.inf, 0.5 * g, 1.5 * g, -2.5 * g, 1e300, -1e300]
    x[8:1000] = (rng.integers(-50, 50, size=992) + 0.5) * g  # halves: ties to even
    return x


def test_release_is_the_lattice_arithmetic_bit_for_bit() -> None:
    """out = g·(round(clamp(x)/g) + Y), with Y the loop's draws for the same stream: the numpy
    lattice module's release of those draws (NaN → 0, ±inf and huge values clamped, halves to
    even), bit for bit; the value arrays and flagged lanes are fixed exactly too."""
    plan = LatticeNoise.plan(noise_multiplier=1.0, max_grad_norm=1.0, size=200_000, max_batch=256)
    lattice, sigma = plan.lattice, plan.lattice_sigma
    x = awkward(200_000, lattice.granularity)
    out = lattice_gaussian_cpu(torch.from_numpy(x), lattice, sigma, Script(), workers=2).numpy()
    y = oracle(sigma, x.size, Script())
    want = numpy_release(x, lattice, y)
    assert np.array_equal(out, want)


def test_noise_of_2_53_or_more_is_added_exactly() -> None:
    lattice = Lattice(-10)
    sigma = Fraction(2**52)
    x = awkward(20_000, lattice.granularity)
    out = lattice_gaussian_cpu(torch.from_numpy(x), lattice, sigma, Script(), workers=1).numpy()
    y = oracle(sigma, x.size, Script())
    assert (np.abs(y) >= 2**53).any()
    assert np.array_equal(out, numpy_release(x, lattice, y))


def numpy_release(x: np.ndarray, lattice: Lattice, y: np.ndarray) -> np.ndarray:
    """The lattice module's release of x with the draws y, in its own blocks."""
    at = [0]

    def draw(n: int) -> np.ndarray:
        at[0] += n
        return y[at[0] - n : at[0]]

    return lattice_module._release(x, lattice, draw)


def test_shape_dtype_and_bad_input() -> None:
    plan = LatticeNoise.plan(noise_multiplier=1.0, max_grad_norm=1.0, size=60, max_batch=8)
    x = torch.randn(3, 4, 5, dtype=torch.float32)
    out = lattice_gaussian_cpu(x, plan.lattice, plan.lattice_sigma, ChaChaStream.keyed())
    assert out.shape == x.shape and out.dtype == torch.float64
    for bad in (0, 3, -2, True, 2.0):
        with pytest.raises(InvalidParameterError, match="chunk"):
            lattice_gaussian_cpu(x, plan.lattice, plan.lattice_sigma, ChaChaStream.keyed(), chunk=bad)
    for bad in (0, -1, True):
        with pytest.raises(InvalidParameterError, match="workers"):
            lattice_gaussian_cpu(x, plan.lattice, plan.lattice_sigma, ChaChaStream.keyed(), workers=bad)
    with pytest.raises(InvalidParameterError, match="n"):
        sample_discrete_gaussian_cpu(Fraction(3), -1, ChaChaStream.keyed())


def test_lattice_noise_uses_the_loop_on_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """The default sampler on a CPU tensor is this loop; 'torch' and 'host' are not."""
    calls: list[int] = []
    original = cpu_noise.lattice_gaussian_cpu

    def spy(x, *args, **kw):  # noqa: ANN001, ANN002, ANN003, ANN202
        calls.append(x.numel())
        return original(x, *args, **kw)

    monkeypatch.setattr(cpu_noise, "lattice_gaussian_cpu", spy)
    plan = LatticeNoise.plan(noise_multiplier=1.0, max_grad_norm=1.0, size=1000, max_batch=10)
    flat = torch.zeros(1000, dtype=torch.float64)
    a, b = plan.release(flat, None), plan.release(flat, None)
    assert calls == [1000, 1000] and not torch.equal(a, b)  # fresh keys from the OS
    assert torch.equal(plan.release(flat, np.random.default_rng(1)), plan.release(flat, np.random.default_rng(1)))
    replace(plan, sampler="torch").release(flat, None)
    replace(plan, sampler="host").release(flat, None)
    assert len(calls) == 4


# -- statistics --------------------------------------------------------------------------------------


@pytest.mark.parametrize("sigma", [Fraction(1, 2), Fraction(3), Fraction(1000), Fraction(2**30)], ids=str)
def test_draws_follow_the_pmf(sigma: Fraction) -> None:
    y = sample_discrete_gaussian_cpu(sigma, N, ChaChaStream.keyed(np.random.default_rng(int(sigma) + 31)))
    assert pmf_pvalue(y.numpy(), sigma) > ALPHA


@pytest.mark.parametrize("sigma", [Fraction(3), Fraction(2**30)], ids=str)
def test_tails_have_their_mass(sigma: Fraction) -> None:
    y = sample_discrete_gaussian_cpu(sigma, N, ChaChaStream.keyed(np.random.default_rng(77))).numpy()
    s = float(sigma)
    for t in (3.0, 4.0):
        assert abs(binomial_z(int((np.abs(y) > t * s).sum()), N, tail_probability(sigma, t))) < Z_ALPHA


def test_release_noise_follows_the_lattice_pmf() -> None:
    plan = LatticeNoise.plan(noise_multiplier=1.0, max_grad_norm=1.0, size=N, max_batch=256)
    x = torch.from_numpy(np.random.default_rng(1).normal(size=N))
    out = plan.release(x, np.random.default_rng(2))
    g = plan.lattice.granularity
    y = (out / g - torch.round(x / g)).numpy()
    assert np.array_equal(y, np.round(y))
    assert lattice_noise_pvalue(y, float(plan.lattice_sigma)) > ALPHA


@pytest.mark.parametrize("sigma", [Fraction(3), Fraction(1000)], ids=str)
def test_a_sampler_with_the_wrong_sigma_fails_the_same_test(sigma: Fraction) -> None:
    y = sample_discrete_gaussian_cpu(sigma * Fraction(102, 100), N, ChaChaStream.keyed(np.random.default_rng(5)))
    assert pmf_pvalue(y.numpy(), sigma) < ALPHA


def test_std_matches_the_plan() -> None:
    plan = LatticeNoise.plan(noise_multiplier=1.3, max_grad_norm=0.5, size=200_000, max_batch=256)
    out = plan.release(torch.zeros(200_000, dtype=torch.float64), np.random.default_rng(8))
    assert float(out.std()) == pytest.approx(plan.std, rel=0.01)
    assert math.isclose(plan.std, 1.3 * 0.5, rel_tol=1e-9)
