"""The exact discrete Gaussian and the lattice release in torch (dpkit.torch.device_noise).

Two kinds of evidence. Deterministic: with ``chunk=CHUNK`` and one ChaCha20 stream the torch
sampler returns exactly what the numpy sampler returns, draw for draw, including on scripted
words that force every rare path (a tie with a threshold, the crowded buckets, the margin of the
exp acceptance and its exact branch, a resolved count of 2^14 or more, noise of 2^53 or more);
broken twins (a tie settled without more bits, the host's decision skipped) are caught by the
same comparison. Statistical: χ² goodness of fit of the device sampler's draws (default chunk
and a small one) to the discrete Gaussian PMF at σ = 0.5, 3, 1000 and 2^30, and tail counts,
each at the shared level ALPHA = 1e-6: a correct sampler fails one of the 13 checks below with
probability at most 1.3e-5 (fixed seeds: a given build passes or fails deterministically); a
sampler with σ 2 % too large fails them (checked).
"""

from __future__ import annotations

import importlib
import math
from dataclasses import replace
from fractions import Fraction

import numpy as np
import pytest
from scipy import special

torch = pytest.importorskip("torch")

from _dgauss import lattice_noise_pvalue, pmf_pvalue, tail_probability  # noqa: E402
from _stats import ALPHA, binomial_z  # noqa: E402
from dpkit.errors import InvalidParameterError  # noqa: E402
from dpkit.noise._exact import exp_neg_bounds  # noqa: E402
from dpkit.noise.bernoulli_exp import CHUNK  # noqa: E402
from dpkit.noise.discrete import gaussian_plan, sample_discrete_gaussian  # noqa: E402
from dpkit.noise.lattice import Lattice, choose_lattice, lattice_gaussian  # noqa: E402
from dpkit.torch import device_noise  # noqa: E402
from dpkit.torch.chacha import ChaChaStream, TorchSource  # noqa: E402
from dpkit.torch.device_noise import (  # noqa: E402
    device_gaussian,
    lattice_gaussian_device,
    sample_discrete_gaussian_device,
)
from dpkit.torch.noise import LatticeNoise  # noqa: E402

bernoulli_exp = importlib.import_module("dpkit.noise.bernoulli_exp")  # (dpkit.noise.bernoulli_exp is a function)
N = 1_000_000
KEY, NONCE = bytes(range(32)), bytes(range(100, 112))
SIGMAS = [Fraction(1, 2), Fraction(3), Fraction(1000), Fraction(2**30)]
Z_ALPHA = float(-special.ndtri(ALPHA / 2))  # two-sided normal quantile at ALPHA (≈ 4.89)


@pytest.fixture(autouse=True, scope="module")
def _two_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(min(2, before))
    yield
    torch.set_num_threads(before)


# -- scripted words: one array read in order by the device and by the host ----------------------


class _HostView:
    def __init__(self, owner: Script) -> None:
        self.owner = owner

    def words(self, n: int) -> np.ndarray:
        return self.owner.take(n)


class Script:
    """Given words first, then a seeded stream: a DeviceSource (``words`` on the CPU, ``host``
    continuing the same array) and, through ``host``, a numpy RandomSource."""

    def __init__(self, planted: dict[int, int], length: int, seed: int = 1) -> None:
        w = np.random.default_rng(seed).integers(0, 2**64 - 1, size=length, dtype=np.uint64, endpoint=True)
        for pos, word in planted.items():
            w[pos] = np.uint64(word)
        self.w, self.pos = w, 0

    def take(self, n: int) -> np.ndarray:
        if self.pos + n > self.w.size:
            raise AssertionError("script too short")
        out = self.w[self.pos : self.pos + n]
        self.pos += n
        return out

    def words(self, n: int) -> torch.Tensor:
        return torch.from_numpy(self.take(n).view(np.int64).copy())

    @property
    def host(self) -> _HostView:
        return _HostView(self)


def same_draws(sigma: Fraction, n: int, planted: dict[int, int], length: int = 200_000) -> np.ndarray:
    """Device and numpy samplers on the same scripted words: identical draws, same words read."""
    dev_src, np_src = Script(planted, length), Script(planted, length)
    dev = sample_discrete_gaussian_device(sigma, n, dev_src, chunk=CHUNK).numpy()
    ref = sample_discrete_gaussian(sigma, n, np_src.host)
    assert np.array_equal(dev, ref)
    assert dev_src.pos == np_src.pos
    return dev


def first_batch(sigma: Fraction, n: int) -> int:
    """k, the size of the first batch of proposals for n draws (discrete._fill)."""
    return min(CHUNK, int(n / device_gaussian(sigma, torch.device("cpu")).rate * 1.02) + 16)


def word_with_count(sigma: Fraction, a: int, negative: bool = False) -> int:
    """A word_a whose 32-bit uniform R gives count A = a (T_a > R > T_{a+1}), not a tie."""
    t = [int(x) for x in gaussian_plan(sigma).table.thresholds]  # T_1, T_2, …, 0, 0
    r = t[a] + 1  # T_{a+1} + 1
    assert (a == 0 or t[a - 1] > r) and r < 2**32
    return r | (1 << 63 if negative else 0)


# -- draw for draw: the numpy sampler ----------------------------------------------------------


@pytest.mark.parametrize(
    "sigma",
    [*SIGMAS, Fraction(1023, 1), Fraction(1024), Fraction(2**19 + 1), Fraction(2**40 * 3 + 7, 3), Fraction(2**52)],
    ids=str,
)
def test_draw_for_draw_the_numpy_sampler(sigma: Fraction) -> None:
    """σ from 0.5 to 2^52: J = 0 (no exp step), J = 1 (63-bit prefixes, above 2^53), J = 10
    (53-bit prefixes), and the lattice scales of DP-SGD."""
    dev_stream, np_stream = ChaChaStream(KEY, NONCE), ChaChaStream(KEY, NONCE)
    dev = sample_discrete_gaussian_device(sigma, 100_003, TorchSource("cpu", dev_stream), chunk=CHUNK)
    ref = sample_discrete_gaussian(sigma, 100_003, np_stream)
    assert dev.dtype == torch.int64 and dev.shape == (100_003,)
    assert np.array_equal(dev.numpy(), ref)
    assert dev_stream.position == np_stream.position


@pytest.mark.parametrize("kernel", [False, True], ids=["openssl", "torch-kernel"])
def test_the_torch_kernel_feeds_the_same_draws(kernel: bool) -> None:
    sigma = Fraction(2**30)
    dev = sample_discrete_gaussian_device(
        sigma, 5000, TorchSource("cpu", ChaChaStream(KEY, NONCE), kernel=kernel), chunk=CHUNK
    )
    assert np.array_equal(dev.numpy(), sample_discrete_gaussian(sigma, 5000, ChaChaStream(KEY, NONCE)))


def test_a_tie_is_settled_by_the_cpu_resolver_with_more_bits(monkeypatch: pytest.MonkeyPatch) -> None:
    """Uniforms equal to a threshold, in plain and in crowded buckets: settled on the host by
    _resolve_count reading the next words, and the draws equal the numpy sampler's."""
    calls: list[tuple[int, int]] = []
    original = device_noise._resolve_count

    def spy(prefix: int, tail: object, start: int, src: object) -> int:
        calls.append((prefix, start))
        return original(prefix, tail, start, src)  # type: ignore[arg-type]

    monkeypatch.setattr(device_noise, "_resolve_count", spy)
    for sigma in (Fraction(3), Fraction(1000), Fraction(2**30)):
        t = [int(x) for x in gaussian_plan(sigma).table.thresholds]
        lanes = {0: t[0], 5: t[1] | (1 << 63), 17: t[len(t) // 2], 40: t[-3], 41: t[-2]}  # t[-2] = 0
        calls.clear()
        same_draws(sigma, 1000, lanes)
        assert sorted(calls) == sorted((int(w) & 0xFFFFFFFF, t.index(int(w) & 0xFFFFFFFF) + 1) for w in lanes.values())


def test_crowded_buckets_are_counted_on_the_host() -> None:
    sigma = Fraction(2**30)
    dg = device_gaussian(sigma, torch.device("cpu"))
    assert dg.crowded_below > 0
    rng = np.random.default_rng(3)
    lanes = {i: int(r) for i, r in enumerate(rng.integers(0, dg.crowded_below, size=300))}
    draws = same_draws(sigma, 1000, lanes)
    # those uniforms (below 149·2^16, about 2.3e-3) ask for the tail beyond about 3σ
    assert np.abs(draws[:250]).min() > 3 * float(sigma)


def margin_lanes(sigma: Fraction, n: int, reject: bool = False) -> dict[int, int]:
    """Lanes whose uniform U sits on e^{−γ} (prefix = ⌊e^{−γ}·2^u⌋, inside the certified band) —
    or, with ``reject``, clearly above it while still failing the device's integer test."""
    plan = gaussian_plan(sigma)
    jbits, ubits = plan.lo_bits, 63 - plan.lo_bits
    k = first_batch(sigma, n)
    lanes = {}
    for i, (a, low) in enumerate([(3, 5), (700, (1 << jbits) - 1), (1500, 12345), (2500, 1 << (jbits - 1))]):
        gamma = Fraction(low * (2 * (a << jbits) + low)) / (2 * plan.sigma**2)
        lo, _ = exp_neg_bounds(gamma, 200)
        prefix = lo >> (200 - ubits)
        if reject:
            prefix = min(prefix + (1 << (ubits - 12)), (1 << ubits) - 1)
        lanes[10 * i] = word_with_count(sigma, a)
        lanes[k + 10 * i] = (prefix << jbits) | low
    return lanes


def test_the_margin_of_the_exp_acceptance_is_settled_exactly(monkeypatch: pytest.MonkeyPatch) -> None:
    """Uniforms on e^{−γ}: the device sends them to the host, where the certified enclosure
    cannot decide and lazy_less reads more words of the same stream."""
    calls = []
    original = bernoulli_exp.lazy_less

    def spy(*args: object) -> tuple[bool, int, int]:
        calls.append(args[:2])
        return original(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(bernoulli_exp, "lazy_less", spy)
    for sigma in (Fraction(2**30), Fraction(2**40 * 3 + 7, 3)):
        calls.clear()
        same_draws(sigma, 1000, margin_lanes(sigma, 1000))
        assert len(calls) >= 2 * 4  # each planted lane, once by each sampler


def test_broken_twins_are_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Power of the comparisons above: settling a tie without reading more bits, or accepting
    the lanes sent to the host without deciding them, changes the draws."""
    sigma = Fraction(2**30)
    t = [int(x) for x in gaussian_plan(sigma).table.thresholds]
    ties = {i: t[300 + i] for i in range(20)}
    with monkeypatch.context() as m:
        m.setattr(device_noise, "_resolve_count", lambda prefix, tail, start, src: start - 1)
        with pytest.raises(AssertionError):
            same_draws(sigma, 1000, ties)
    with monkeypatch.context() as m:
        m.setattr(device_noise, "decide_exp_neg_small", lambda g, *a: np.ones(g.size, dtype=bool))
        with pytest.raises(AssertionError):
            same_draws(sigma, 1000, margin_lanes(sigma, 1000, reject=True))
    same_draws(sigma, 1000, ties)  # and the real sampler passes both
    same_draws(sigma, 1000, margin_lanes(sigma, 1000, reject=True))


def huge_count_script(sigma: Fraction, n: int) -> dict[int, int]:
    """Lane 0 ties the final threshold 0 and the next 14 words are zero: U < 2^-900, so the exact
    count reaches about s·√(2·900·ln 2) >= 2^14."""
    planted = {0: 0}
    k = first_batch(sigma, n)
    planted.update({k + i: 0 for i in range(14)})
    planted[k + 14] = 1 << 62
    return planted


def test_a_resolved_count_of_2_14_or_more_takes_the_numpy_route() -> None:
    """Probability below 2^-180, forced: the whole batch is decided on the host, as numpy does."""
    sigma = Fraction(2**30)
    draws = same_draws(sigma, 2000, huge_count_script(sigma, 2000))
    assert abs(int(draws[0])) >> gaussian_plan(sigma).lo_bits >= 1 << 14


def test_noise_of_2_53_or_more_is_added_exactly() -> None:
    """A lattice σ near 2^48 with a resolved count near 2^15: noise beyond 2^53, added in
    integers (and in Python integers for a lattice point beyond 2^62), as lattice_gaussian."""
    sigma = Fraction(2**48 - 1)
    lattice = Lattice(-40)
    x = np.full(3000, 0.25)
    x[0] = 2.0**30  # 2^70 lattice steps
    x[1] = -(2.0**-40) * 3
    planted = huge_count_script(sigma, 3000)
    dev_src, np_src = Script(planted, 100_000), Script(planted, 100_000)
    dev = lattice_gaussian_device(torch.from_numpy(x), lattice, sigma, dev_src, chunk=CHUNK).numpy()
    ref = lattice_gaussian(x, lattice, sigma, np_src.host)
    assert np.array_equal(dev, ref) and dev_src.pos == np_src.pos
    assert abs(dev[0] - x[0]) >= 2.0**13  # 2^53 steps of 2^-40


# -- the release -------------------------------------------------------------------------------


def awkward_values(n: int, seed: int) -> np.ndarray:
    x = np.random.default_rng(seed).normal(scale=3.0, size=n)
    x[:12] = [np.nan, np.inf, -np.inf, 1e308, -1e308, 5e-324, -0.0, 0.0, 2.0**-41, -(2.0**-41), 2.0**-40 * 1.5, 2.0**80]
    return x


@pytest.mark.parametrize("shape", [(0,), (7,), (100_003,), (300, 211)])
def test_release_is_the_numpy_release_draw_for_draw(shape: tuple[int, ...]) -> None:
    n = math.prod(shape)
    x = awkward_values(max(n, 12), 4)[:n].reshape(shape)
    lattice = choose_lattice(1.5, max(n, 1), norm=2)
    sigma = Fraction(2**43 + 11, 2)
    dev = lattice_gaussian_device(
        torch.from_numpy(x), lattice, sigma, TorchSource("cpu", ChaChaStream(KEY, NONCE)), chunk=CHUNK
    )
    ref = lattice_gaussian(x, lattice, sigma, ChaChaStream(KEY, NONCE))
    assert dev.dtype == torch.float64 and dev.shape == shape
    assert np.array_equal(dev.numpy(), ref)
    steps = dev.numpy() / lattice.granularity
    assert np.isfinite(steps).all() and np.array_equal(steps, np.round(steps))  # on the lattice


def test_lattice_noise_device_and_host_samplers_agree() -> None:
    """LatticeNoise's torch sampler (what accelerators run) with chunk=CHUNK releases what the
    numpy path releases for the same stream; its default chunk stays on the lattice."""
    plan = replace(
        LatticeNoise.plan(noise_multiplier=1.1, max_grad_norm=0.7, size=203_530, max_batch=256), sampler="torch"
    )
    assert plan.chunk is None
    flat = torch.from_numpy(awkward_values(203_530, 5)).to(torch.float32).to(torch.float64)
    dev = replace(plan, chunk=CHUNK).release(flat, ChaChaStream(KEY, NONCE))
    host = replace(plan, sampler="host").release(flat, ChaChaStream(KEY, NONCE))
    assert torch.equal(dev, host)
    default = plan.release(flat, np.random.default_rng(9))
    again = plan.release(flat, np.random.default_rng(9))
    assert torch.equal(default, again)  # a seeded source keys the stream reproducibly
    steps = default / plan.lattice.granularity
    assert torch.equal(steps, torch.round(steps)) and default.device == flat.device
    noise = (default - host).double() / plan.lattice.granularity  # a difference of lattice points
    assert float(noise.std()) == pytest.approx(math.sqrt(2) * float(plan.lattice_sigma), rel=0.02)
    with pytest.raises(InvalidParameterError, match="sampler"):
        replace(plan, sampler="gpu")
    with pytest.raises(InvalidParameterError, match="chunk"):
        replace(plan, chunk=0)


def test_only_a_few_lanes_visit_the_host(monkeypatch: pytest.MonkeyPatch) -> None:
    """What crosses to the host is the undecided lanes' words and counts (about 0.5 % of the
    values, for the DP-SGD lattice scales), never the gradient."""
    copied: list[int] = []
    original = device_noise._host

    def spy(t: torch.Tensor) -> np.ndarray:
        copied.append(t.numel())
        return original(t)

    monkeypatch.setattr(device_noise, "_host", spy)
    plan = LatticeNoise.plan(noise_multiplier=1.0, max_grad_norm=1.0, size=200_000, max_batch=256, sampler="torch")
    x = torch.randn(200_000, dtype=torch.float64)
    plan.release(x, np.random.default_rng(3))
    assert 0 < sum(copied) < 0.01 * x.numel()


def test_secure_release_draws_fresh_noise() -> None:
    plan = LatticeNoise.plan(noise_multiplier=1.0, max_grad_norm=1.0, size=1000, max_batch=10)
    flat = torch.zeros(1000, dtype=torch.float64)
    assert not torch.equal(plan.release(flat, None), plan.release(flat, None))


# -- statistics: the PMF, tails, and a broken twin -----------------------------------------------


@pytest.mark.parametrize("sigma", SIGMAS, ids=str)
@pytest.mark.parametrize("chunk", [None, 4099], ids=["default-chunk", "small-chunk"])
def test_device_draws_follow_the_pmf(sigma: Fraction, chunk: int | None) -> None:
    y = sample_discrete_gaussian_device(
        sigma, N, TorchSource("cpu", np.random.default_rng(int(sigma) + 17)), chunk=chunk
    )
    assert pmf_pvalue(y.numpy(), sigma) > ALPHA


@pytest.mark.parametrize("sigma", [Fraction(3), Fraction(2**30)], ids=str)
def test_tails_have_their_mass(sigma: Fraction) -> None:
    """Counts beyond 3σ and 4σ (where a truncated or float-limited sampler loses mass) within
    the two-sided ALPHA band of a binomial."""
    y = sample_discrete_gaussian_device(sigma, N, TorchSource("cpu", np.random.default_rng(99))).numpy()
    s = float(sigma)
    for t in (3.0, 4.0):
        assert abs(binomial_z(int((np.abs(y) > t * s).sum()), N, tail_probability(sigma, t))) < Z_ALPHA


def test_release_noise_follows_the_lattice_pmf() -> None:
    """On the DP-SGD path: (release/g − round(x/g)) is the discrete Gaussian with σ_lattice."""
    plan = LatticeNoise.plan(noise_multiplier=1.0, max_grad_norm=1.0, size=N, max_batch=256)
    x = torch.from_numpy(np.random.default_rng(1).normal(size=N))
    out = plan.release(x, np.random.default_rng(2))
    g = plan.lattice.granularity
    y = (out / g - torch.round(x / g)).numpy()
    assert np.array_equal(y, np.round(y))
    assert lattice_noise_pvalue(y, float(plan.lattice_sigma)) > ALPHA


@pytest.mark.parametrize("sigma", [Fraction(3), Fraction(1000)], ids=str)
def test_a_sampler_with_the_wrong_sigma_fails_the_same_test(sigma: Fraction) -> None:
    wrong = sigma * Fraction(102, 100)
    y = sample_discrete_gaussian_device(wrong, N, TorchSource("cpu", np.random.default_rng(5)))
    assert pmf_pvalue(y.numpy(), sigma) < ALPHA
