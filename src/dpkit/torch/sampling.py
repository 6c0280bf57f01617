"""Batch samplers whose sampling parameters are the ones the accountant prices.

A rule from real bugs (Opacus #80, #813): an accountant that assumes Poisson sampling while the
training loop used shuffled fixed-size batches reports an ε that does not hold. Here the sampler
*is* the source of the accounting parameters: each sampler builds the per-step event itself
(:meth:`PoissonBatchSampler.step_event`), from the very numbers it samples with.

* :class:`PoissonBatchSampler` — every step keeps each of the N records independently with
  probability q (exactly: a uniform integer below the denominator of q compared with its
  numerator, from dpkit's CSPRNG by default). Event: ``PoissonSampledEvent(q, GaussianEvent(σ))``
  under add/remove neighbours (Mironov, Talwar & Zhang 2019; Abadi et al. 2016).
* :class:`UniformBatchSampler` — every step draws an *independent* uniformly random subset of
  exactly b of the N records (a partial Fisher–Yates shuffle with exact uniform integers). Event:
  ``SampledWithoutReplacementEvent(N, b, GaussianEvent(σ/2, "replace"))`` under replace-one
  neighbours (Wang, Balle & Kasiviswanathan 2019): replacing one record moves the clipped sum by
  up to 2C, so the multiplier relative to the replace sensitivity is σ/2. Batches are not the
  disjoint blocks of a per-epoch shuffle — a shuffle is *not* sampling without replacement, and
  accounting it as such under-reports ε (Chua et al. 2024).

Abadi et al. 2016 (Alg. 1): each lot is sampled with rate q = L/N ("数据采样"), and the
accountant prices that sampling (privacy amplification by subsampling, "通过子采样进行隐私放大").
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from fractions import Fraction

import numpy as np

from dpkit import _validate as v
from dpkit.accounting.events import DPEvent, GaussianEvent, PoissonSampledEvent, SampledWithoutReplacementEvent
from dpkit.errors import InvalidParameterError
from dpkit.noise.integers import bernoulli
from dpkit.noise.source import RandomSource, resolve_rng

__all__ = ["PoissonBatchSampler", "UniformBatchSampler", "poisson_rate"]

_TWO64 = 1 << 64
_TWO32 = 1 << 32


def poisson_rate(batch_size: int, population: int) -> Fraction:
    """The sampling probability q ≈ batch_size / population as an exact binary fraction that is
    both a double and a rational with denominator <= 2**64 — the one number the sampler draws
    with and the accountant prices (rounded up where the nearest double would need a larger
    denominator, so the accounted q is never below the sampled one)."""
    q = Fraction(batch_size, population)
    f = Fraction(float(q))
    if f.denominator <= _TWO64:
        return f
    return Fraction(math.ceil(q * _TWO64), _TWO64)  # < 2**53 over 2**64: exactly a double


class _Sampler:
    """Shared plumbing: the batch sampler protocol DataLoader expects, plus bookkeeping."""

    def __init__(self, population: int, steps_per_epoch: int, rng: object) -> None:
        self.population = v.positive_int(population, "population")
        self.steps_per_epoch = v.positive_int(steps_per_epoch, "steps_per_epoch")
        self._src: RandomSource = resolve_rng(rng)
        self.last_batch_size: int | None = None
        self.batches_drawn = 0

    def __len__(self) -> int:
        return self.steps_per_epoch

    def _draw(self) -> np.ndarray:  # pragma: no cover - abstract
        raise NotImplementedError

    def __iter__(self) -> Iterator[list[int]]:
        for _ in range(self.steps_per_epoch):
            idx = self._draw()
            self.last_batch_size = int(idx.size)
            self.batches_drawn += 1
            yield idx.tolist()


class PoissonBatchSampler(_Sampler):
    """Poisson sampling: each record is in each batch independently with probability q.

    ``sample_rate`` is q as a double; the draw uses its exact value (:func:`poisson_rate`), so
    the accountant's q and the sampler's q are the same number. The expected batch size is q·N;
    batch sizes vary (and may be 0).

    >>> import numpy as np
    >>> s = PoissonBatchSampler(population=1000, batch_size=100, steps_per_epoch=3, rng=np.random.default_rng(0))
    >>> s.sample_rate, len(list(s))
    (0.1, 3)
    """

    def __init__(self, *, population: int, batch_size: int, steps_per_epoch: int, rng: object = None) -> None:
        super().__init__(population, steps_per_epoch, rng)
        b = v.positive_int(batch_size, "batch_size")
        if b > self.population:
            raise InvalidParameterError("batch_size", b, f"an integer in [1, {self.population}] (the dataset size)")
        self._q = poisson_rate(b, self.population)
        self.sample_rate: float = float(self._q)

    @property
    def expected_batch_size(self) -> float:
        return self.sample_rate * self.population

    @property
    def neighbours(self) -> v.Neighbours:
        return "add_remove"

    def step_event(self, noise_multiplier: float) -> DPEvent:
        """One step: Gaussian noise σ·C on the clipped sum of a Poisson(q) batch."""
        inner: DPEvent = GaussianEvent(noise_multiplier)
        return inner if self._q == 1 else PoissonSampledEvent(self.sample_rate, inner)

    def _draw(self) -> np.ndarray:
        return np.flatnonzero(bernoulli(self._q, self.population, rng=self._src))

    def __repr__(self) -> str:
        return f"PoissonBatchSampler(population={self.population}, sample_rate={self.sample_rate!r}, steps_per_epoch={self.steps_per_epoch})"


def _uniform_below_each(bounds: np.ndarray, src: RandomSource) -> np.ndarray:
    """One exact uniform integer in [0, bounds[i]) per lane, bounds < 2**32 (Lemire's
    multiply-shift on 32-bit halves of the words, rejecting the biased low products)."""
    bounds = bounds.astype(np.uint64)
    out = np.empty(bounds.size, dtype=np.uint64)
    todo = np.arange(bounds.size)
    thresholds = (np.uint64(_TWO32) - bounds) % bounds  # 2**32 mod bound
    while todo.size:
        w = src.words(todo.size) & np.uint64(_TWO32 - 1)
        m = w * bounds[todo]  # < 2**64
        low = m & np.uint64(_TWO32 - 1)
        ok = low >= thresholds[todo]
        out[todo[ok]] = m[ok] >> np.uint64(32)
        todo = todo[~ok]
    return out


class UniformBatchSampler(_Sampler):
    """Independent fixed-size batches: every step a uniformly random b-subset of the N records.

    Accounted as sampling without replacement under replace-one neighbours (see the module
    docstring). Requires N < 2**32.

    >>> import numpy as np
    >>> s = UniformBatchSampler(population=10, batch_size=4, steps_per_epoch=2, rng=np.random.default_rng(0))
    >>> [len(b) for b in s]
    [4, 4]
    """

    def __init__(self, *, population: int, batch_size: int, steps_per_epoch: int, rng: object = None) -> None:
        super().__init__(population, steps_per_epoch, rng)
        b = v.positive_int(batch_size, "batch_size")
        if b > self.population:
            raise InvalidParameterError("batch_size", b, f"an integer in [1, {self.population}] (the dataset size)")
        if self.population >= _TWO32:
            raise InvalidParameterError("population", self.population, "below 2**32 for fixed-size sampling")
        self.batch_size = b
        self.sample_rate: float = b / self.population  # reporting only; the event uses (N, b)

    @property
    def expected_batch_size(self) -> float:
        return float(self.batch_size)

    @property
    def neighbours(self) -> v.Neighbours:
        return "replace"

    def step_event(self, noise_multiplier: float) -> DPEvent:
        """One step: noise σ·C on the clipped sum of a uniform b-subset; the replace-one ℓ2
        sensitivity of that sum is 2C, hence the multiplier σ/2 relative to it."""
        inner = GaussianEvent(noise_multiplier / 2, neighbours="replace")
        return SampledWithoutReplacementEvent(self.population, self.batch_size, inner)

    def _draw(self) -> np.ndarray:
        n, b = self.population, self.batch_size
        # Partial Fisher–Yates on a lazily materialised permutation: position i swaps with a
        # uniform j in [i, n); only the touched positions are stored.
        offsets = _uniform_below_each(np.arange(n, n - b, -1, dtype=np.uint64), self._src).astype(np.int64)
        swapped: dict[int, int] = {}
        out = np.empty(b, dtype=np.int64)
        for i in range(b):
            j = i + int(offsets[i])
            out[i] = swapped.get(j, j)
            swapped[j] = swapped.get(i, i)
        return out

    def __repr__(self) -> str:
        return f"UniformBatchSampler(population={self.population}, batch_size={self.batch_size}, steps_per_epoch={self.steps_per_epoch})"
