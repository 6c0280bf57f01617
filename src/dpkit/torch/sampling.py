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

**Virtual batches** (``max_physical_batch_size=k``). The whole logical batch is drawn first, as
above (so the accounting is unchanged: one event per logical batch), and then yielded as
*physical* batches of at most k examples: ``max(1, ⌈B/k⌉)`` of them (one empty physical batch
for an empty logical batch, which still gets its noise). Each physical batch carries a
:class:`Chunk` tag (logical batch, position, count) that the optimizer reads to know when the
logical batch is complete; it clips every example of every physical batch, adds the clipped
gradients up, and releases once per logical batch. The random size B is used for nothing else.

**Several processes** (``group``, a :class:`dpkit.torch.distributed.DataParallelGroup`). The
logical batch is one Poisson (or fixed-size) sample over the *whole* dataset, drawn by the
group's first process from its source and broadcast; process r takes the r-th of W contiguous
near-equal slices (``numpy.array_split``) and splits it into physical batches as above, the
count computed from ⌈B/W⌉ so that every process steps the same number of times. Each record is
in the logical batch with probability exactly q and at most once, whichever process loads it —
the q the accountant prices (see :mod:`dpkit.torch.distributed` for why this and not a Poisson
sample per process).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from fractions import Fraction
from typing import TYPE_CHECKING

import numpy as np

from dpkit import _validate as v
from dpkit.accounting.events import DPEvent, GaussianEvent, PoissonSampledEvent, SampledWithoutReplacementEvent
from dpkit.errors import InvalidParameterError
from dpkit.noise.integers import bernoulli
from dpkit.noise.source import RandomSource, resolve_rng

if TYPE_CHECKING:  # torch.distributed is imported only where a group is used
    from dpkit.torch.distributed import DataParallelGroup

__all__ = ["PoissonBatchSampler", "UniformBatchSampler", "Chunk", "poisson_rate"]

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


@dataclass(frozen=True)
class Chunk:
    """One physical batch: physical batch ``index`` of ``count`` of logical batch ``step``
    (counted from 1 by each sampler), with ``size`` examples (on this process)."""

    step: int
    index: int
    count: int
    size: int

    @property
    def last(self) -> bool:
        """Whether this physical batch completes its logical batch."""
        return self.index == self.count - 1


class _Sampler:
    """Shared plumbing: the batch sampler protocol DataLoader expects, plus bookkeeping.

    ``batches_drawn`` counts logical batches, ``last_batch_size`` is the size of the last
    physical batch yielded; the tags of the physical batches yielded and not yet stepped on wait
    in order for the optimizer (:meth:`take_chunks`).
    """

    def __init__(
        self,
        population: int,
        steps_per_epoch: int,
        rng: object,
        max_physical_batch_size: int | None = None,
        group: DataParallelGroup | None = None,
    ) -> None:
        self.population = v.positive_int(population, "population")
        self.steps_per_epoch = v.positive_int(steps_per_epoch, "steps_per_epoch")
        self._src: RandomSource = resolve_rng(rng)
        self.max_physical_batch_size = (
            None
            if max_physical_batch_size is None
            else v.positive_int(max_physical_batch_size, "max_physical_batch_size")
        )
        self.group = group
        self.last_batch_size: int | None = None
        self.batches_drawn = 0
        self._pending: deque[Chunk] = deque()

    def __len__(self) -> int:
        return self.steps_per_epoch

    def _batch_size(self, batch_size: object) -> int:
        """The (expected) batch size: an integer in [1, population]."""
        b = v.positive_int(batch_size, "batch_size")
        if b > self.population:
            raise InvalidParameterError("batch_size", b, f"an integer in [1, {self.population}] (the dataset size)")
        return b

    def _draw(self) -> np.ndarray:  # pragma: no cover - abstract
        raise NotImplementedError

    def _logical_batch(self) -> np.ndarray:
        """The whole logical batch: drawn here, or by the group's first process and received."""
        if self.group is None:
            return self._draw()
        return self.group.broadcast_indices(self._draw() if self.group.rank == 0 else None)

    def physical_batches(self, idx: np.ndarray) -> list[np.ndarray]:
        """This process's physical batches of the logical batch ``idx``: its slice (all of it
        without a group), cut into pieces of at most ``max_physical_batch_size``; always at
        least one (possibly empty), and the same number on every process of a group."""
        world = 1 if self.group is None else self.group.world_size
        mine = idx if world == 1 else np.array_split(idx, world)[self.group.rank]  # type: ignore[union-attr]
        k = self.max_physical_batch_size
        if k is None:
            return [mine]
        widest = -(-int(idx.size) // world)  # the largest slice of any process
        count = max(1, -(-widest // k))
        return [mine[j * k : (j + 1) * k] for j in range(count)]

    def __iter__(self) -> Iterator[list[int]]:
        self._pending.clear()  # a new pass over the loader: tags of an abandoned one are void
        for _ in range(self.steps_per_epoch):
            parts = self.physical_batches(self._logical_batch())
            self.batches_drawn += 1
            for j, part in enumerate(parts):
                self.last_batch_size = int(part.size)
                self._pending.append(Chunk(self.batches_drawn, j, len(parts), int(part.size)))
                yield part.tolist()

    def _extra(self) -> str:
        out = (
            "" if self.max_physical_batch_size is None else f", max_physical_batch_size={self.max_physical_batch_size}"
        )
        return out if self.group is None else f"{out}, group={self.group!r}"

    def take_chunks(self, *, all_pending: bool) -> list[Chunk]:
        """The tags of physical batches yielded and not yet stepped on, oldest first: all of
        them (a loader without workers: the last one is the batch just used) or only the oldest
        (with workers the loader runs ahead; batches arrive in order)."""
        if all_pending:
            out = list(self._pending)
            self._pending.clear()
            return out
        return [self._pending.popleft()] if self._pending else []


class PoissonBatchSampler(_Sampler):
    """Poisson sampling: each record is in each batch independently with probability q.

    ``sample_rate`` is q as a double; the draw uses its exact value (:func:`poisson_rate`), so
    the accountant's q and the sampler's q are the same number. The expected batch size is q·N;
    batch sizes vary (and may be 0).

    >>> import numpy as np
    >>> s = PoissonBatchSampler(population=1000, batch_size=100, steps_per_epoch=3, rng=np.random.default_rng(0))
    >>> s.sample_rate, len(list(s))
    (0.1, 3)

    Virtual batches: the same three logical batches (106, 106 and 88 records), in physical
    batches of at most 40; ``len`` still counts logical batches.

    >>> s = PoissonBatchSampler(population=1000, batch_size=100, steps_per_epoch=3, rng=np.random.default_rng(0),
    ...                         max_physical_batch_size=40)
    >>> [len(b) for b in s], len(s)
    ([40, 40, 26, 40, 40, 26, 40, 40, 8], 3)
    """

    def __init__(
        self,
        *,
        population: int,
        batch_size: int,
        steps_per_epoch: int,
        rng: object = None,
        max_physical_batch_size: int | None = None,
        group: DataParallelGroup | None = None,
    ) -> None:
        super().__init__(population, steps_per_epoch, rng, max_physical_batch_size, group)
        b = self._batch_size(batch_size)
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
        return f"PoissonBatchSampler(population={self.population}, sample_rate={self.sample_rate!r}, steps_per_epoch={self.steps_per_epoch}{self._extra()})"


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

    def __init__(
        self,
        *,
        population: int,
        batch_size: int,
        steps_per_epoch: int,
        rng: object = None,
        max_physical_batch_size: int | None = None,
        group: DataParallelGroup | None = None,
    ) -> None:
        super().__init__(population, steps_per_epoch, rng, max_physical_batch_size, group)
        b = self._batch_size(batch_size)
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
        return f"UniformBatchSampler(population={self.population}, batch_size={self.batch_size}, steps_per_epoch={self.steps_per_epoch}{self._extra()})"
