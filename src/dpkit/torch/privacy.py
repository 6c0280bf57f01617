"""DP-SGD for PyTorch: ``make_private`` and the private optimizer it returns.

One step (Abadi et al. 2016, Alg. 1, "DP-SGD 完整算法流程"):

1. the data loader draws a batch with the sampler whose parameters the accountant prices
   (Poisson with rate q = b/N by default; :mod:`dpkit.torch.sampling`);
2. forward and ``loss.backward()``; dpkit records per-example activations and output gradients
   (:mod:`dpkit.torch.per_example`);
3. ``optimizer.step()``: every example's whole gradient is clipped to ℓ2 norm C and the clipped
   gradients are summed (sensitivity C under add/remove, 2C under replace);
4. the step is paid for *before* any noise is drawn: the target ε (a step count fixed when the
   noise was calibrated) and the ``budget``, if any, must both allow it, else
   :class:`~dpkit.errors.BudgetExceededError` and nothing is released;
5. Gaussian noise with standard deviation σ·C is added to the sum (exact lattice noise by
   default, :mod:`dpkit.torch.noise`), the result is divided by the *expected* batch size
   (q·N: the actual size of a Poisson batch is private), and only then the wrapped optimizer
   steps.

A logical batch larger than memory is split into physical batches
(``max_physical_batch_size``): steps 2–3 run once per physical batch, each example clipped on
its own and the clipped gradients added up; steps 4–5 run once per logical batch
(:mod:`dpkit.torch.optimizer`). A ``DistributedDataParallel`` module trains on several
processes, one logical batch across all of them, the noise drawn once
(:mod:`dpkit.torch.distributed`). Forward and backward may run under ``torch.autocast``.

Guarantee: after T steps the released parameters are (ε, δ)-DP with ε =
``optimizer.get_epsilon(δ)``: the accountant composes T copies of the sampler's step event
(``PoissonSampledEvent(q, GaussianEvent(σ))`` — Mironov, Talwar & Zhang 2019 for RDP; the PLD
accountant's dominating pairs otherwise) — for add/remove neighbours with Poisson sampling, for
replace-one neighbours with fixed-size sampling. Calibration from a target ε is re-checked with
the same accountant (Opacus #346).
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch
from torch import nn
from torch.utils._pytree import tree_map
from torch.utils.data import DataLoader, IterableDataset

from dpkit import _validate as v
from dpkit.accounting.accountant import Accountant
from dpkit.accounting.calibration import calibrate_noise_multiplier
from dpkit.accounting.events import DPEvent, SelfComposedEvent
from dpkit.accounting.registry import resolve_accountant
from dpkit.budget import Budget
from dpkit.errors import BudgetExceededError, DPError, InvalidDataError, InvalidParameterError
from dpkit.noise.source import resolve_rng
from dpkit.torch.distributed import DataParallelGroup
from dpkit.torch.noise import make_noise
from dpkit.torch.optimizer import DPOptimizer, _accounting_delta
from dpkit.torch.per_example import PerExampleEngine
from dpkit.torch.sampling import PoissonBatchSampler, UniformBatchSampler
from dpkit.torch.validation import check_module

__all__ = ["make_private", "PrivateTraining", "TrainingReport"]

_SUPPORTED_ACCOUNTANTS: tuple[str, ...] = ("rdp", "pld")

# ------------------------------------------------------------------------------------------------
# The data loader
# ------------------------------------------------------------------------------------------------


class _EmptySafeCollate:
    """The loader's collate function, plus empty batches (Poisson batches may be empty): a batch
    of no examples is the collated first example cut to length 0 (shapes and dtypes only)."""

    def __init__(self, collate: Callable[[list[Any]], Any], dataset: Any) -> None:
        self.collate = collate
        self.dataset = dataset

    def __call__(self, batch: list[Any]) -> Any:
        if len(batch) == 0:
            sample = self.collate([self.dataset[0]])
            return tree_map(lambda t: t[:0] if isinstance(t, torch.Tensor) else t, sample)
        return self.collate(batch)


def _private_loader(data_loader: DataLoader, sampler: PoissonBatchSampler | UniformBatchSampler) -> DataLoader:
    dl = data_loader
    kwargs: dict[str, Any] = {
        "batch_sampler": sampler,
        "num_workers": dl.num_workers,
        "collate_fn": _EmptySafeCollate(dl.collate_fn, dl.dataset),
        "pin_memory": dl.pin_memory,
        "timeout": dl.timeout,
        "worker_init_fn": dl.worker_init_fn,
        "multiprocessing_context": dl.multiprocessing_context,
    }
    if dl.num_workers > 0:
        kwargs["prefetch_factor"] = dl.prefetch_factor
        kwargs["persistent_workers"] = dl.persistent_workers
    return DataLoader(dl.dataset, **kwargs)


# ------------------------------------------------------------------------------------------------
# make_private
# ------------------------------------------------------------------------------------------------


@dataclass
class TrainingReport:
    """What :meth:`PrivateTraining.train` did."""

    epochs_completed: int = 0
    steps: int = 0
    epsilon: float = 0.0
    delta: float = 0.0
    losses: list[float] = field(default_factory=list)  # mean training loss per epoch
    epsilons: list[float] = field(default_factory=list)  # ε at the end of each epoch
    stopped: str | None = None  # why training stopped early (the BudgetExceededError message)


class PrivateTraining(NamedTuple):
    """What :func:`make_private` returns: unpack it as ``model, optimizer, loader = ...``.

    The module is the one passed in (hooked; its parameters are marked requires_grad=False
    while private — dpkit computes their gradients itself); the optimizer is a
    :class:`DPOptimizer`; the data loader draws batches with the private sampler.
    """

    module: nn.Module
    optimizer: DPOptimizer
    data_loader: DataLoader

    def get_epsilon(self, delta: float | None = None, *, accountant: str | None = None) -> float:
        """ε spent so far (:meth:`DPOptimizer.get_epsilon`): ``accountant="pld"`` prices the same
        steps with the tighter PLD accountant."""
        return self.optimizer.get_epsilon(delta, accountant=accountant)

    @property
    def epsilon(self) -> float:
        return self.optimizer.epsilon

    @property
    def noise_multiplier(self) -> float:
        return self.optimizer.noise_multiplier

    def detach(self) -> nn.Module:
        """Remove dpkit's hooks and restore requires_grad on the module's parameters (and a
        DistributedDataParallel module's own gradient synchronisation)."""
        self.optimizer.engine.detach()
        if self.optimizer.group is not None:
            DataParallelGroup.gradient_sync(self.module, True)
        return self.module

    def train(
        self,
        loss_fn: Callable[[Any, Any], torch.Tensor],
        *,
        epochs: int | None = None,
        progress: bool = True,
        on_step: Callable[[int, float, float], None] | None = None,
    ) -> TrainingReport:
        """Train for ``epochs`` (default: the epochs given to make_private) with a rich progress
        bar showing the running ε; stops cleanly when the next step would exceed the target ε
        or the budget (the reason is in ``report.stopped``).

        Each batch must be a tuple ``(*inputs, target)``: the loss is
        ``loss_fn(module(*inputs), target)``. ``on_step(step, loss, epsilon)`` is called after
        every (logical) step (ε is computed only when on_step is given or the bar refreshes);
        with virtual batches ``loss`` is the last physical batch's. On several processes the
        bar is shown by the first one only.
        """
        module, opt, loader = self
        n_epochs = opt.epochs if epochs is None else v.positive_int(epochs, "epochs")
        report = TrainingReport(delta=opt.delta)
        show = progress and (opt.group is None or opt.group.rank == 0)
        bar = _Bar(enabled=show, total=n_epochs * len(loader), opt=opt)
        module.train()
        with bar:
            for _epoch in range(n_epochs):
                total, count = 0.0, 0
                try:
                    for batch in loader:
                        if not isinstance(batch, (tuple, list)) or len(batch) < 2:
                            raise InvalidDataError(
                                "batch",
                                f"got {type(batch).__name__}",
                                "a tuple (*inputs, target); write your own loop for other shapes",
                            )
                        opt.zero_grad()
                        out = module(*batch[:-1])
                        loss = loss_fn(out, batch[-1])
                        loss.backward()
                        opt.step()
                        lv = float(loss.detach()) if len(batch[-1]) else 0.0
                        if math.isfinite(lv) and len(batch[-1]):
                            total, count = total + lv, count + 1
                        if not opt.released:  # a physical batch in the middle of a logical one
                            continue
                        if on_step is not None:
                            on_step(opt.steps, lv, opt.epsilon)
                        bar.advance(lv)
                except BudgetExceededError as exc:
                    report.stopped = str(exc)
                    bar.note(f"[bold red]stopped:[/] {exc}")
                    break
                report.epochs_completed += 1
                report.losses.append(total / count if count else math.nan)
                report.epsilons.append(opt.epsilon)
        report.steps = opt.steps
        report.epsilon = opt.epsilon
        return report


class _Bar:
    """A rich progress bar with the running ε (refreshed at most every 0.25 s)."""

    def __init__(self, *, enabled: bool, total: int, opt: DPOptimizer) -> None:
        self.enabled = enabled
        self.opt = opt
        self.total = total
        self._progress: Any = None
        self._task: Any = None
        self._last = 0.0

    def __enter__(self) -> _Bar:
        if self.enabled:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            self._progress = Progress(
                TextColumn("DP-SGD"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("ε={task.fields[eps]:.3f} (δ={task.fields[delta]:g})"),
                TextColumn("loss={task.fields[loss]:.4f}"),
                TimeElapsedColumn(),
                TimeRemainingColumn(),
            )
            self._progress.__enter__()
            self._task = self._progress.add_task(
                "train", total=self.total, eps=self.opt.epsilon, delta=self.opt.delta, loss=math.nan
            )
        return self

    def advance(self, loss: float) -> None:
        if self._progress is None:
            return
        now = time.monotonic()
        fields: dict[str, Any] = {"loss": loss}
        if now - self._last > 0.25:
            fields["eps"] = self.opt.epsilon
            self._last = now
        self._progress.update(self._task, advance=1, **fields)

    def note(self, text: str) -> None:
        if self._progress is not None:
            self._progress.console.print(text)

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.update(self._task, eps=self.opt.epsilon)
            self._progress.__exit__(None, None, None)


def _accountant_factory(name: object, neighbours: v.Neighbours) -> Callable[[], Accountant]:
    """Fresh accountants from the registry (:func:`dpkit.accounting.registry.resolve_accountant`);
    DP-SGD accepts the two that price subsampled Gaussian steps tightly."""
    if not isinstance(name, str) or name not in _SUPPORTED_ACCOUNTANTS:
        raise InvalidParameterError(
            "accountant", name, "'rdp' (Rényi DP, Mironov 2017) or 'pld' (privacy loss distributions: tighter, slower)"
        )
    return resolve_accountant(name, neighbours=neighbours)


def _warn_if_distributed() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        warnings.warn(
            f"torch.distributed runs {dist.get_world_size()} processes but the module is not a "
            "DistributedDataParallel: each process trains a private model of its own on samples of the whole "
            "dataset, and each model costs the ε reported; wrap the model in DistributedDataParallel (before "
            "make_private) to train one model across the processes",
            stacklevel=3,
        )


def _fingerprint(params: list[nn.Parameter]) -> list[tuple[str, float]]:
    """Three sums without cancellation per parameter tensor (Σ|x|, Σx², Σmax(x, 0)), float64:
    equal to a relative 1e-6 on processes whose parameters are the same."""
    out: list[tuple[str, float]] = []
    for i, p in enumerate(params):
        x = p.detach().double()
        out += [
            (f"parameter {i}: sum of |x|", float(x.abs().sum())),
            (f"parameter {i}: sum of x²", float(x.square().sum())),
            (f"parameter {i}: sum of positive parts", float(x.clamp(min=0).sum())),
        ]
    return out


def _max_steps(target: float, delta: float, factory: Callable[[], Accountant], step: DPEvent, planned: int) -> int:
    """The largest step count whose ε is <= target (>= planned, which calibration guarantees)."""

    def ok(t: int) -> bool:
        return factory().compose(step, count=t).get_epsilon(delta) <= target

    if not ok(planned):  # pragma: no cover - calibration re-checks this
        raise DPError("noise calibration missed its target on re-check")
    lo, hi = planned, 2 * planned
    while ok(hi):
        lo, hi = hi, 2 * hi
        if hi > 2**40:
            return lo
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo


def make_private(
    module: nn.Module,
    optimizer: torch.optim.Optimizer,
    data_loader: DataLoader,
    *,
    delta: float,
    epochs: int,
    max_grad_norm: float,
    epsilon: float | None = None,
    noise_multiplier: float | None = None,
    accountant: str = "rdp",
    poisson_sampling: bool = True,
    rng: object = None,
    budget: Budget | None = None,
    loss_reduction: str = "mean",
    grad_mode: str = "fast",
    noise: str = "lattice",
    max_physical_batch_size: int | None = None,
) -> PrivateTraining:
    """Make ``module`` / ``optimizer`` / ``data_loader`` train with DP-SGD.

    Give exactly one of ``epsilon``, the target ε (σ is calibrated so that ``epochs`` epochs cost
    at most that ε at ``delta``, and training is stopped before a step would exceed it) or
    ``noise_multiplier`` (σ given; ε is reported). ``budget`` (a :class:`dpkit.Budget` whose
    accountant prices Gaussian and subsampled events, e.g. ``accountant=RDPAccountant``) is
    charged one step event before every step, and refuses the step when it would overspend.

    - ``max_grad_norm`` C: each example's whole gradient is clipped to ℓ2 norm C.
    - ``poisson_sampling=True``: each record joins each batch with probability q = b/N (b the
      loader's batch size, N the dataset size), accounted as Poisson subsampling under
      add/remove neighbours. ``False``: independent uniform batches of exactly b records,
      accounted as sampling without replacement under replace-one neighbours (RDP only).
    - ``accountant``: ``"rdp"`` or ``"pld"``.
    - ``rng``: None (the CSPRNG, default) or a seeded ``numpy.random.Generator`` (tests only)
      for both the sampler and the noise.
    - ``loss_reduction``: how the loss combines a batch, ``"mean"`` (default) or ``"sum"``.
    - ``grad_mode``: ``"fast"`` (ghost clipping / book-keeping for Linear, Conv1d/2d,
      Embedding; torch.func elsewhere) or ``"vmap"`` (torch.func for every layer).
    - ``noise``: ``"lattice"`` (exact, floating-point safe; default) or ``"continuous"``
      (faster, not floating-point safe) — see :mod:`dpkit.torch.noise`.
    - ``max_physical_batch_size`` k (virtual batches): the loader draws each logical batch
      whole, then yields it as physical batches of at most k examples; call
      ``optimizer.step()`` after each. Examples are clipped one by one in every physical
      batch, the clipped gradients added up, and the noise added once per logical batch, when
      its last physical batch is stepped (``optimizer.released``); the accounting is
      unchanged. ``len(loader)`` still counts logical batches.

    A ``torch.nn.parallel.DistributedDataParallel`` module (built before make_private, in
    every process) trains on its process group: the loader's ``batch_size`` is per process, as
    with DDP, so q = W·batch_size/N for W processes; one Poisson sample over the whole dataset
    per step, split across the processes; per-example clipping on each; the clipped sums
    summed, the noise drawn once by the first process and broadcast
    (:mod:`dpkit.torch.distributed`). Every process passes the same arguments (checked).
    Forward and backward may run under ``torch.autocast`` (bf16 or fp16): clipping and the sum
    are computed in float32 or wider (:mod:`dpkit.torch.optimizer`).

    Returns a :class:`PrivateTraining` ``(module, optimizer, data_loader)``.

    >>> import torch, numpy as np
    >>> from torch.utils.data import DataLoader, TensorDataset
    >>> data = TensorDataset(torch.randn(100, 3), torch.randint(0, 2, (100,)))
    >>> model = torch.nn.Linear(3, 2)
    >>> private = make_private(model, torch.optim.SGD(model.parameters(), lr=0.1), DataLoader(data, batch_size=10),
    ...                        epsilon=1.0, delta=1e-3, epochs=2, max_grad_norm=1.0)
    >>> model, optimizer, loader = private
    >>> round(optimizer.noise_multiplier, 2), optimizer.sample_rate, len(loader)
    (1.71, 0.1, 10)
    """
    # -- validate everything before touching anything -------------------------------------------
    check_module(module)
    if not isinstance(optimizer, torch.optim.Optimizer) or isinstance(optimizer, DPOptimizer):
        raise InvalidParameterError(
            "optimizer",
            type(optimizer).__name__,
            "a torch.optim.Optimizer over the module's parameters (not already private)",
        )
    module_params = {id(p) for p in module.parameters()}
    foreign = [p for g in optimizer.param_groups for p in g["params"] if id(p) not in module_params]
    if foreign:
        raise InvalidParameterError(
            "optimizer",
            f"{len(foreign)} parameter(s) not in module",
            "an optimizer over the module's own parameters",
            "their gradients would not be clipped or noised",
        )
    if not isinstance(data_loader, DataLoader):
        raise InvalidParameterError("data_loader", type(data_loader).__name__, "a torch.utils.data.DataLoader")
    dataset = data_loader.dataset
    if isinstance(dataset, IterableDataset) or not hasattr(dataset, "__len__") or not hasattr(dataset, "__getitem__"):
        raise InvalidDataError(
            "data_loader.dataset",
            f"is a {type(dataset).__name__}",
            "a map-style dataset with __len__ and __getitem__ (the sampler draws indices)",
        )
    population = len(dataset)
    if population < 1:
        raise InvalidDataError("data_loader.dataset", "is empty", "at least one record")
    batch_size = data_loader.batch_size
    if batch_size is None:
        raise InvalidParameterError(
            "data_loader.batch_size",
            None,
            "an integer (dpkit replaces the loader's sampler with its own and needs the batch size)",
        )
    if batch_size > population:
        raise InvalidParameterError("data_loader.batch_size", batch_size, f"at most the dataset size {population}")
    delta = v.delta(delta, "delta", allow_zero=False)
    n_epochs = v.positive_int(epochs, "epochs")
    clip = v.positive(max_grad_norm, "max_grad_norm")
    if (epsilon is None) == (noise_multiplier is None):
        raise InvalidParameterError(
            "epsilon/noise_multiplier",
            (epsilon, noise_multiplier),
            "exactly one of them: epsilon (σ is calibrated to it) or noise_multiplier (σ given, ε reported)",
        )
    target = v.epsilon(epsilon, "epsilon") if epsilon is not None else None
    sigma_given = v.positive(noise_multiplier, "noise_multiplier") if noise_multiplier is not None else None
    if not isinstance(poisson_sampling, bool):
        raise InvalidParameterError("poisson_sampling", poisson_sampling, "True or False")
    if budget is not None and not isinstance(budget, Budget):
        raise InvalidParameterError("budget", type(budget).__name__, "None or a dpkit.Budget")
    if noise not in ("lattice", "continuous"):
        make_noise(noise, noise_multiplier=1.0, max_grad_norm=1.0, size=1, max_batch=1)  # raises
    physical = (
        None if max_physical_batch_size is None else v.positive_int(max_physical_batch_size, "max_physical_batch_size")
    )
    group = DataParallelGroup.of(module)
    world = 1 if group is None else group.world_size
    if group is None:
        _warn_if_distributed()
    elif world * batch_size > population:
        raise InvalidParameterError(
            "data_loader.batch_size",
            batch_size,
            f"at most the dataset size {population} divided by the {world} processes (the batch size is per process)",
        )
    src = resolve_rng(rng)
    if delta >= 1.0 / population:
        warnings.warn(
            f"delta={delta!r} is not below 1/N = 1/{population}: a δ this large allows mechanisms that "
            "publish a few records outright; the usual choice is δ << 1/N",
            stacklevel=2,
        )

    # -- sampler and accounting -------------------------------------------------------------------
    if group is None:
        steps_per_epoch = max(1, len(data_loader))
    else:  # the logical batch is W·b; the loader's own length may be a DistributedSampler's
        logical = world * batch_size
        steps_per_epoch = max(1, population // logical if data_loader.drop_last else -(-population // logical))
    sampler_type = PoissonBatchSampler if poisson_sampling else UniformBatchSampler
    sampler: PoissonBatchSampler | UniformBatchSampler = sampler_type(
        population=population,
        batch_size=world * batch_size,
        steps_per_epoch=steps_per_epoch,
        rng=src,
        max_physical_batch_size=physical,
        group=group,
    )
    factory = _accountant_factory(accountant, sampler.neighbours)
    probe_event = sampler.step_event(1.0)
    if not factory().supports(probe_event):
        raise InvalidParameterError(
            "accountant",
            accountant,
            "an accountant that supports this sampling ('rdp' for poisson_sampling=False)",
            f"{type(probe_event).__name__} is not supported by accountant={accountant!r}",
        )
    planned = n_epochs * steps_per_epoch
    max_steps = None
    acc_delta = _accounting_delta(delta, noise)
    if target is not None:
        sigma = calibrate_noise_multiplier(
            epsilon=target,
            delta=acc_delta,
            accountant=factory,
            event_for=lambda s: SelfComposedEvent(sampler.step_event(s), planned),
        )
        max_steps = _max_steps(target, acc_delta, factory, sampler.step_event(sigma), planned)
    else:
        sigma = sigma_given  # type: ignore[assignment]
    step_event = sampler.step_event(sigma)
    if budget is not None:
        budget.can_spend(step_event)  # raises now if the budget's accountant cannot price DP-SGD steps

    # -- attach -----------------------------------------------------------------------------------
    engine = PerExampleEngine(module, mode=grad_mode, loss_reduction=loss_reduction)
    size = sum(p.numel() for p in engine.params)
    if group is not None:
        settings = {
            "dataset size": population,
            "data_loader.batch_size": batch_size,
            "data_loader.num_workers": data_loader.num_workers,
            "steps per epoch": steps_per_epoch,
            "epochs": n_epochs,
            "noise_multiplier": sigma,
            "max_grad_norm": clip,
            "delta": delta,
            "max steps": -1 if max_steps is None else max_steps,
            "max_physical_batch_size": physical or 0,
            "poisson_sampling": poisson_sampling,
            "noise": ("lattice", "continuous").index(noise),
            "accountant": _SUPPORTED_ACCOUNTANTS.index(accountant),
            "loss_reduction": ("mean", "sum").index(loss_reduction),
            "grad_mode": ("fast", "vmap").index(grad_mode),
            "trainable parameter tensors": len(engine.params),
            "trainable values": size,
        }
        group.agree(
            "make_private",
            [(k, float(x)) for k, x in settings.items()],
            fix="call make_private with the same arguments and an equivalent data loader on every process",
        )
        group.agree(
            "module parameters",
            _fingerprint(engine.params),
            rel_tol=1e-6,
            fix="load any checkpoint on every process before wrapping the model in DistributedDataParallel "
            "(which broadcasts rank 0's parameters) and calling make_private",
        )
    plan = make_noise(
        noise,
        noise_multiplier=sigma,
        max_grad_norm=clip,
        size=size,
        max_batch=population + 1,
        wide=any(p.dtype == torch.float64 for p in engine.params),
    )
    engine.attach()
    if group is not None:  # dpkit forms the gradient; DDP's all-reduce of p.grad has nothing to do
        DataParallelGroup.gradient_sync(module, False)
    loader = _private_loader(data_loader, sampler)
    private_opt = DPOptimizer(
        optimizer,
        engine=engine,
        sampler=sampler,
        noise_multiplier=sigma,
        max_grad_norm=clip,
        delta=delta,
        accountant=accountant,
        accountant_factory=factory,
        noise=plan,
        source=src,
        epsilon=target,
        max_steps=max_steps,
        budget=budget,
        epochs=n_epochs,
        check_batches=data_loader.num_workers == 0,
        group=group,
    )
    return PrivateTraining(module, private_opt, loader)
