"""DP-SGD on several processes (one per GPU): a ``DistributedDataParallel`` model, torch.distributed's
collectives, and one release per logical batch.

Pass a ``torch.nn.parallel.DistributedDataParallel`` module to :func:`dpkit.torch.make_private`
(wrap the model first: DDP refuses a module whose parameters do not require grad, and dpkit
turns that off). DDP's own gradient all-reduce is switched off (``require_backward_grad_sync``;
dpkit forms the gradient itself); what DDP still does is broadcast the first process's
parameters when it is built. dpkit then does, on the process group of the DDP module
(:class:`DataParallelGroup`):

1. **Sampling.** Each logical batch is *one* Poisson sample over the whole dataset, drawn by the
   group's first process (rank 0) from its source (the CSPRNG) and broadcast as indices; rank r
   loads the r-th of W contiguous slices (:mod:`dpkit.torch.sampling`). A record is in the
   logical batch with probability exactly q = W·b/N (b the loader's batch size per process, as
   with DDP) and at most once, so ``PoissonSampledEvent(q, GaussianEvent(σ))`` is the right
   event and ε is the one-process ε of a batch of W·b. The alternative, each process
   Poisson-sampling its own shard of N/W records at rate q, is also exactly Poisson(q) — but only
   if the W sources are independent (a seeded ``rng`` given to every process, as tests and
   examples do, makes the shards' draws identical, so one record's inclusion reveals its twins'
   and the amplification argument fails), and it gives every process a different number of
   physical batches to agree on. The classic mistakes this rules out: sampling at rate b/(N/W)
   per shard while accounting b/N, or every process sampling the whole dataset at rate q (a
   record then joins with probability ≈ W·q and possibly twice, sensitivity 2C).
2. **Clipping.** Each process clips its own examples, per example, to C (physical batches of at
   most ``max_physical_batch_size`` each, added up).
3. **Release.** The clipped sums are summed onto rank 0 (``reduce``; an all-reduce would hand
   every process the un-noised sum, which none needs). Rank 0 pays for the step (the target ε
   and the budget), adds the noise *once*, N(0, σ²C²) per coordinate (exact lattice noise by
   default), and broadcasts the noisy sum, with a status word; every process divides it by the
   expected logical batch size q·N and applies it: the same bits, so the same parameters.
   Noise added by every process would have variance W·σ²C² (or, scaled down by √W on each,
   would depend on every process being honest): the tests measure the variance of the release
   and catch that variant.

Accounting is the one-process accounting, on every process (each knows the step count); the
``budget`` is charged by rank 0 alone, which tells the others whether the step was paid. The
float64 summation bound of the lattice noise (:mod:`dpkit.torch.noise`) covers the reduction
across processes: it holds for any order of summing at most N + 1 clipped gradients.
:meth:`DataParallelGroup.agree` checks at ``make_private`` that every process has the same
dataset size, batch size, σ, C, parameter count and parameters (as far as a checksum sees).

Tested on CPU with the gloo backend (two processes); with NCCL the collectives run on the
parameters' GPU. Every process must run the same loop: one ``optimizer.step()`` per physical
batch of the private loader.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from dpkit.errors import BudgetExceededError, InvalidParameterError

__all__ = ["DataParallelGroup"]


class DataParallelGroup:
    """The processes of one data-parallel training: their collectives for dpkit.

    Built by :func:`dpkit.torch.make_private` from a ``DistributedDataParallel`` module
    (:meth:`of`); ``rank`` and ``world_size`` are within the module's process group, whose
    first process (``rank == 0``) draws the batches and the noise.
    """

    def __init__(self, group: Any, device: torch.device) -> None:
        self.group = group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        self.src = dist.get_global_rank(group, 0) if group is not None else 0
        self.device = device

    @classmethod
    def of(cls, module: nn.Module) -> DataParallelGroup | None:
        """The group of a ``DistributedDataParallel`` module, None for any other module."""
        from torch.nn.parallel import DistributedDataParallel

        if not isinstance(module, DistributedDataParallel):
            return None
        group = module.process_group
        backend = str(dist.get_backend(group))
        params = list(module.parameters())
        device = params[0].device if params and params[0].is_cuda and backend != "gloo" else torch.device("cpu")
        return cls(group, device)

    @staticmethod
    def gradient_sync(module: nn.Module, enabled: bool) -> None:
        """Switch a DistributedDataParallel module's own all-reduce of ``p.grad`` on or off (off
        while private: the parameters get no autograd gradient and dpkit reduces the clipped
        sums itself)."""
        from torch.nn.parallel import DistributedDataParallel

        if isinstance(module, DistributedDataParallel):
            module.require_backward_grad_sync = enabled

    def __repr__(self) -> str:
        return f"DataParallelGroup(rank={self.rank}, world_size={self.world_size}, device={str(self.device)!r})"

    # -- set-up -------------------------------------------------------------------------------------

    def _any(self, flags: Sequence[bool]) -> list[bool]:
        """For each flag, whether it is true on any process (every process gets the same answers)."""
        t = torch.tensor([1.0 if f else 0.0 for f in flags], dtype=torch.float64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.group)
        return [bool(x > 0) for x in t.cpu()]

    def _from_first(self, values: Sequence[float]) -> list[float]:
        t = torch.tensor(list(values), dtype=torch.float64, device=self.device)
        dist.broadcast(t, src=self.src, group=self.group)
        return [float(x) for x in t.cpu()]

    def agree(self, what: str, named: Sequence[tuple[str, float]], rel_tol: float = 0.0, fix: str = "") -> None:
        """Raise :class:`InvalidParameterError` on every process unless each value is the first
        process's (to ``rel_tol``; exactly by default), naming the first value that differs
        somewhere. Collective: every process calls it with the same names."""
        expected = "the same value on every process (the same dataset, loader, model and privacy settings)"
        (count_differs,) = self._any([self._from_first([float(len(named))])[0] != len(named)])
        if count_differs:
            raise InvalidParameterError(f"{what}: number of values", len(named), expected)
        if not named:
            return
        theirs = self._from_first([float(x) for _, x in named])
        local = [
            not (mine == first or abs(mine - first) <= rel_tol * max(abs(mine), abs(first)))
            for (_, mine), first in zip(named, theirs, strict=True)
        ]
        differs = self._any(local)
        if any(differs):
            k = differs.index(True)
            raise InvalidParameterError(
                named[k][0],
                named[k][1],
                expected,
                f"{what}: {named[k][0]} differs between processes ({named[k][1]!r} on rank {self.rank}, "
                f"{theirs[k]!r} on rank 0)" + (f"; {fix}" if fix else ""),
            )

    # -- per step -------------------------------------------------------------------------------

    def broadcast_indices(self, idx: np.ndarray | None) -> np.ndarray:
        """Rank 0's ``idx`` (int64) on every process; the others pass None."""
        n = torch.tensor([0 if idx is None else int(idx.size)], dtype=torch.int64, device=self.device)
        dist.broadcast(n, src=self.src, group=self.group)
        if idx is not None:
            t = torch.as_tensor(np.asarray(idx, dtype=np.int64)).to(self.device)
        else:
            t = torch.empty(int(n.item()), dtype=torch.int64, device=self.device)
        if t.numel():
            dist.broadcast(t, src=self.src, group=self.group)
        return t.cpu().numpy()

    def release(
        self,
        flat: torch.Tensor,
        noise: Any,
        src: Any,
        charge: Callable[[bool], None],
    ) -> torch.Tensor:
        """The noisy sum of every process's clipped sum ``flat``, the same on every process.

        The sums are reduced onto rank 0, which calls ``charge(True)`` (pay: may raise
        :class:`BudgetExceededError`), draws the noise once (``noise.release(sum, src)``) and
        broadcasts the result with a status word; the other processes call ``charge(False)``
        (count the step) once rank 0 has paid, or raise if it refused.
        """
        payload = torch.cat([flat.detach().reshape(-1), flat.new_zeros(1)]).to(self.device)
        dist.reduce(payload, dst=self.src, op=dist.ReduceOp.SUM, group=self.group)
        refused: BudgetExceededError | None = None
        if self.rank == 0:
            try:
                charge(True)  # the debit comes before any noise is drawn
            except BudgetExceededError as exc:
                refused = exc
            if refused is None:
                noisy = noise.release(payload[:-1].to(flat.device), src)
                payload = torch.cat([noisy.reshape(-1).to(self.device, payload.dtype), payload.new_ones(1)])
            else:
                payload.zero_()  # status 0; the un-noised sum never leaves rank 0
        dist.broadcast(payload, src=self.src, group=self.group)
        if refused is not None:
            raise refused
        if float(payload[-1]) != 1.0:
            raise BudgetExceededError(
                "the next DP-SGD step, which rank 0 of the process group refused",
                "what rank 0's error says (rank 0 holds the stop at the target ε and the budget)",
            )
        if self.rank != 0:
            charge(False)
        return payload[:-1].to(flat.device)
