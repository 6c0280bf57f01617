"""The private optimizer of :func:`dpkit.torch.make_private`: it wraps a ``torch.optim`` optimizer
and, at every step, replaces the gradient by the clipped per-example sum plus exact noise, after
charging the step to the accountant (and the budget) — the DP-SGD of Abadi et al. (2016, "Deep
learning with differential privacy") with the accounting of :mod:`dpkit.torch.privacy`.

**Virtual batches.** With ``max_physical_batch_size`` the loader yields a logical batch as
several physical batches (:mod:`dpkit.torch.sampling`), and ``step()`` is called after each.
Every call clips the physical batch's examples one by one (the engine never sees a sum of
examples) and adds their clipped gradients to the logical batch's sum; only the call on the last
physical batch pays, adds the noise once and steps the wrapped optimizer (``released`` says
which calls did). A physical batch skipped or taken out of order is refused: the logical batch
released must be the sampled one.

**Mixed precision.** A forward and backward pass under ``torch.autocast`` (bf16 or fp16)
records half-precision activations and output gradients. ``step()`` widens them to float32
(for layers whose parameters are float32 or wider) and runs with autocast off, so the
per-example norms (float32 reductions bounded by η, or float64), the clip factors and the
clipped sum (float64 for lattice noise, else float32 or the parameters' float64) are never
computed in half precision, and the release is the same float64 lattice release. The half-
precision forward and backward themselves — which per-example gradient is computed — are not
covered by the floating-point analysis, as the float32 ones are not (:mod:`dpkit.torch.noise`).
``torch.amp.GradScaler`` is not supported: it unscales ``p.grad`` before ``step()``, when
dpkit has not formed a gradient yet (loss scaling would shrink the clipping norm C by the
scale); use bf16, or fp16 without a scaler.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch.utils._pytree import tree_map

from dpkit import _validate as v
from dpkit.accounting.accountant import Accountant
from dpkit.accounting.events import DPEvent, SelfComposedEvent
from dpkit.accounting.registry import resolve_accountant
from dpkit.budget import Budget
from dpkit.errors import BudgetExceededError, DPError, InvalidDataError, InvalidParameterError
from dpkit.noise.lattice import DELTA_MARGIN
from dpkit.noise.source import RandomSource
from dpkit.torch.noise import ContinuousNoise, LatticeNoise
from dpkit.torch.per_example import PerExampleEngine
from dpkit.torch.sampling import Chunk, PoissonBatchSampler, UniformBatchSampler

if TYPE_CHECKING:
    from dpkit.torch.distributed import DataParallelGroup

__all__ = ["DPOptimizer", "LATTICE_DELTA_SHARE"]

# With lattice noise, ε is computed at δ·(1 − 2^-20): the discrete Gaussian at σ/g ≈ 2^40 differs
# from the continuous one by O(2^-78) in δ per step (CKS 2020, Sec. 4; as dpkit.mechanisms.gaussian
# and dpkit.torch.federated do), which that share covers for any realistic number of steps.
LATTICE_DELTA_SHARE = 1.0 - DELTA_MARGIN  # exactly 2^-20


def _accounting_delta(delta: float, noise_kind: str) -> float:
    return delta * DELTA_MARGIN if noise_kind == "lattice" else delta


# ------------------------------------------------------------------------------------------------
# Mixed precision
# ------------------------------------------------------------------------------------------------

_HALF = (torch.float16, torch.bfloat16)


def _widen(x: Any) -> Any:
    return x.float() if isinstance(x, torch.Tensor) and x.dtype in _HALF else x


def _has_half(tree: Any) -> bool:
    if isinstance(tree, torch.Tensor):
        return tree.dtype in _HALF
    if isinstance(tree, (tuple, list)):
        return any(_has_half(x) for x in tree)
    if isinstance(tree, dict):
        return any(_has_half(x) for x in tree.values())
    return False


def _widen_recorded(engine: PerExampleEngine) -> None:
    """Give float32 copies of the half-precision activations and output gradients that an
    autocast forward/backward recorded, for units whose parameters are float32 or wider: the
    per-example norms, clip factors and clipped sums are then computed as without autocast
    (and the per-example recomputation of torch.func units sees the dtypes of its parameters).
    Units of a model that is itself in half precision are left as they are."""
    for unit in engine.units:
        if not unit.calls or any(p.dtype in _HALF for _, p in unit.params):
            continue
        for call in unit.calls:
            if _has_half(call.args):
                call.args = tree_map(_widen, call.args)
            if _has_half(call.kwargs):
                call.kwargs = tree_map(_widen, call.kwargs)
            if call.grads is not None and _has_half(call.grads):
                call.grads = [_widen(g) for g in call.grads]
            if any(dtype in _HALF for _, dtype, _ in call.out_meta):
                call.out_meta = tuple(
                    (shape, torch.float32 if dtype in _HALF else dtype, device)
                    for shape, dtype, device in call.out_meta
                )


def _autocast_off(params: list[torch.nn.Parameter]) -> contextlib.ExitStack:
    """Autocast disabled where it is on, for the parameters' device types (step() may run inside
    the user's autocast block; the clipping and the sum must not be recast to half precision)."""
    stack = contextlib.ExitStack()
    for kind in sorted({p.device.type for p in params} | {"cpu"}):
        with contextlib.suppress(RuntimeError, AttributeError):  # a device type without autocast
            if torch.is_autocast_enabled(kind):
                stack.enter_context(torch.autocast(device_type=kind, enabled=False))
    return stack


# ------------------------------------------------------------------------------------------------
# The private optimizer
# ------------------------------------------------------------------------------------------------


class DPOptimizer(torch.optim.Optimizer):
    """Wraps a torch optimizer: ``step()`` clips per example, pays, adds noise, then steps.

    Built by :func:`make_private`; not meant to be constructed by hand. ``param_groups``,
    ``state`` and ``defaults`` are the wrapped optimizer's, so learning-rate schedulers work.
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        *,
        engine: PerExampleEngine,
        sampler: PoissonBatchSampler | UniformBatchSampler,
        noise_multiplier: float,
        max_grad_norm: float,
        delta: float,
        accountant: str,
        accountant_factory: Callable[[], Accountant],
        noise: LatticeNoise | ContinuousNoise,
        source: RandomSource,
        epsilon: float | None = None,
        max_steps: int | None,
        budget: Budget | None,
        epochs: int,
        check_batches: bool,
        group: DataParallelGroup | None = None,
    ) -> None:  # no super().__init__: the wrapped optimizer owns the parameter groups
        # ``epsilon`` is the target (the glossary's one spelling); it is kept as ``max_epsilon``,
        # the ε that ``max_steps`` stays within, beside the property ``epsilon`` (ε spent so far).
        self.original_optimizer = optimizer
        self.engine = engine
        self.sampler = sampler
        self.noise_multiplier = noise_multiplier
        self.max_grad_norm = max_grad_norm
        self.delta = delta
        self.max_epsilon = epsilon
        self.accountant = accountant
        self._factory = accountant_factory
        self.noise = noise
        self._src = source
        self.max_steps = max_steps
        self.budget = budget
        self.epochs = epochs
        self.steps = 0
        self.step_event: DPEvent = sampler.step_event(noise_multiplier)
        self._check_batches = check_batches
        self._eps_cache: dict[tuple[int, float, str], float] = {}
        self.group = group
        #: Whether the last step() released a noisy gradient and stepped the wrapped optimizer
        #: (False after a physical batch that did not complete its logical batch).
        self.released = False
        self._acc: torch.Tensor | None = None  # the logical batch's clipped sum so far
        self._acc_chunk: Chunk | None = None  # the last physical batch added to it
        #: The per-example gradient norms (float64) that the last step's clip factors used.
        self.last_norms: torch.Tensor | None = None

    # -- what the wrapped optimizer owns --------------------------------------------------------

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.original_optimizer.param_groups

    @param_groups.setter
    def param_groups(self, value: list[dict[str, Any]]) -> None:
        self.original_optimizer.param_groups = value

    @property
    def state(self) -> Any:
        return self.original_optimizer.state

    @state.setter
    def state(self, value: Any) -> None:
        self.original_optimizer.state = value

    @property
    def defaults(self) -> dict[str, Any]:
        return self.original_optimizer.defaults

    @defaults.setter
    def defaults(self, value: dict[str, Any]) -> None:
        self.original_optimizer.defaults = value

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        raise DPError("dpkit.torch: parameters cannot be added to a private optimizer; call make_private again")

    def state_dict(self) -> dict[str, Any]:
        out = dict(self.original_optimizer.state_dict())
        out["dpkit"] = {"steps": self.steps, "step_event": repr(self.step_event)}
        return out

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load the wrapped optimizer's state; the step count only ever grows (an older
        checkpoint cannot make the accountant forget steps already taken)."""
        state = dict(state_dict)
        saved = state.pop("dpkit", None)
        self.original_optimizer.load_state_dict(state)
        if saved is not None:
            self.steps = max(self.steps, int(saved.get("steps", 0)))

    def __repr__(self) -> str:
        return (
            f"DPOptimizer({type(self.original_optimizer).__name__}, noise_multiplier={self.noise_multiplier:.6g}, "
            f"max_grad_norm={self.max_grad_norm!r}, sample_rate={self.sampler.sample_rate:.6g}, steps={self.steps}, "
            f"noise={self.noise.kind!r}, accountant={self.accountant!r}"
            + (
                ""
                if self.sampler.max_physical_batch_size is None
                else f", max_physical_batch_size={self.sampler.max_physical_batch_size}"
            )
            + ("" if self.group is None else f", world_size={self.group.world_size}")
            + ")"
        )

    # -- privacy ------------------------------------------------------------------------------

    @property
    def expected_batch_size(self) -> float:
        """q·N for Poisson sampling, b for fixed-size batches: the divisor of the noisy sum."""
        return self.sampler.expected_batch_size

    @property
    def sample_rate(self) -> float:
        return self.sampler.sample_rate

    @property
    def noise_std(self) -> float:
        """Standard deviation of the noise added to each coordinate of the clipped *sum*
        (σ·C; the lattice adds about 2^-40 relative, never less)."""
        return self.noise.std

    @property
    def event(self) -> DPEvent | None:
        """Everything released so far, as one event (None before the first step)."""
        return SelfComposedEvent(self.step_event, self.steps) if self.steps else None

    def get_epsilon(self, delta: float | None = None, *, accountant: str | None = None) -> float:
        """ε after the steps taken so far, at ``delta`` (default: the target δ). With lattice
        noise the accountant is asked at δ·(1 − 2^-20) (see ``LATTICE_DELTA_SHARE``).

        ``accountant``: ``"rdp"`` or ``"pld"`` prices the same steps with that accountant
        (default: the run's own, which calibrated the noise and stops at the target). Each is a
        valid ε for the steps taken — they bound the same event — so a run calibrated and
        stopped by RDP can report the tighter PLD ε of the same release with
        ``get_epsilon(accountant="pld")``."""
        d = self.delta if delta is None else v.delta(delta, allow_zero=False)
        if accountant is None or accountant == self.accountant:
            return self._epsilon_after(self.steps, d)
        if accountant not in ("rdp", "pld"):
            raise InvalidParameterError("accountant", accountant, "'rdp' or 'pld' (or None: the run's own accountant)")
        factory = resolve_accountant(accountant, neighbours=self.sampler.neighbours)
        if not factory().supports(self.step_event):
            raise InvalidParameterError(
                "accountant",
                accountant,
                f"an accountant that prices {type(self.step_event).__name__} ('rdp' for poisson_sampling=False)",
            )
        return self._epsilon_after(self.steps, d, accountant, factory)

    @property
    def epsilon(self) -> float:
        """ε spent so far at the target δ."""
        return self.get_epsilon()

    def _epsilon_after(
        self, steps: int, delta: float, name: str | None = None, factory: Callable[[], Accountant] | None = None
    ) -> float:
        if steps == 0:
            return 0.0
        key = (steps, delta, name or self.accountant)
        if key not in self._eps_cache:
            if len(self._eps_cache) > 64:
                self._eps_cache.clear()
            acc = (factory or self._factory)().compose(self.step_event, count=steps)
            self._eps_cache[key] = acc.get_epsilon(_accounting_delta(delta, self.noise.kind))
        return self._eps_cache[key]

    def _charge(self, pay: bool = True) -> None:
        """Pay for the next step, or raise BudgetExceededError having paid nothing. ``pay=False``
        (the other processes of a group, once its first one has paid): count the step only."""
        nxt = self.steps + 1
        if not pay:
            self.steps = nxt
            return
        if self.max_steps is not None and nxt > self.max_steps:
            eps_next = self._epsilon_after(nxt, self.delta)
            raise BudgetExceededError(
                f"DP-SGD step {nxt} (noise multiplier σ={self.noise_multiplier:.6g}, sample rate q={self.sample_rate:.6g}), "
                f"which would bring ε to {eps_next:.6g} at δ={self.delta:g} against the target ε={self.max_epsilon!r}",
                f"ε={max(0.0, self.max_epsilon - self.epsilon):.6g} (target ε={self.max_epsilon!r}: {self.max_steps} steps "  # type: ignore[operator]
                f"allowed, {self.steps} taken); stop training here, or call make_private again with a larger "
                "epsilon or more epochs (which calibrates more noise)",
            )
        if self.budget is not None:
            self.budget.spend(self.step_event)
        self.steps = nxt

    # -- the step -----------------------------------------------------------------------------

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Forget the recorded pass and the parameters' gradients. The clipped sum of a logical
        batch split into physical batches is kept until its last physical batch is stepped."""
        self.engine.clear()
        for p in self.engine.params:
            p.grad = None
        self.original_optimizer.zero_grad(set_to_none=set_to_none)

    @property
    def virtual(self) -> bool:
        """Whether logical batches are split into physical batches (``max_physical_batch_size``)."""
        return self.sampler.max_physical_batch_size is not None

    def _check_batch(self, batch: int | None, chunk: Chunk | None) -> None:
        last = chunk.size if chunk is not None else self.sampler.last_batch_size
        if batch is None:
            if last == 0:  # an empty Poisson batch the loop did not run the model on
                return
            raise DPError(
                "dpkit.torch: optimizer.step() was called without a forward and backward pass since the last "
                "step; run the model on the batch and call loss.backward() first"
            )
        if (self._check_batches or (self.virtual and chunk is not None)) and last is not None and batch != last:
            raise InvalidDataError(
                "batch",
                f"the model's layers saw {batch} examples but the private data loader's last batch had {last}",
                "one optimizer step per batch of the private data loader, with the examples on the first "
                "dimension of every layer's input (batch_first=True)",
            )

    def _this_chunk(self) -> Chunk | None:
        """The tag of the physical batch this step is for (None: not from the private loader),
        checked, with virtual batches, against the logical batch being added up."""
        taken = self.sampler.take_chunks(all_pending=self._check_batches)
        chunk = taken[-1] if taken else None
        if not self.virtual:
            return chunk
        prev = self._acc_chunk  # set while a logical batch is partly added up
        if prev is not None and chunk is None:
            self._drop()
            raise DPError(
                "dpkit.torch: optimizer.step() on a batch that did not come from the private data loader, in the "
                f"middle of logical batch {prev.step} ({prev.index + 1} of its {prev.count} physical batches were "
                "stepped); the partial sum was dropped and nothing was released"
            )
        if (
            prev is not None
            and chunk is not None
            and chunk.index == 0
            and chunk.step != prev.step
            and all(c.step != prev.step for c in taken)
        ):  # a new pass over the loader began (e.g. after a break): the old logical batch is void
            warnings.warn(
                f"dpkit.torch: logical batch {prev.step} was abandoned after {prev.index + 1} of its {prev.count} "
                "physical batches (a new pass over the data loader began); its partial sum was dropped: nothing "
                "was released or charged for it",
                stacklevel=5,  # the caller of optimizer.step()
            )
            self._drop()
            prev = None
        if chunk is None:
            return None
        if prev is None:
            in_order = chunk.index == 0
        else:
            in_order = chunk.step == prev.step and chunk.index == prev.index + 1 and len(taken) == 1
        if not in_order:
            due = "its first physical batch" if prev is None else f"physical batch {prev.index + 2} of {prev.count}"
            self._drop()
            raise DPError(
                f"dpkit.torch: optimizer.step() after physical batch {chunk.index + 1} of {chunk.count} of logical "
                f"batch {chunk.step}, where {due} was due: with max_physical_batch_size, call optimizer.step() "
                "once after every physical batch of the private data loader, in order (a skipped physical batch "
                "would leave its examples out of the release). The partial sum was dropped; nothing was released"
            )
        return chunk

    def _drop(self) -> None:
        self._acc = None
        self._acc_chunk = None

    def _accumulate(self) -> bool:
        """Clip this (physical) batch per example and add it to the logical batch's clipped sum.
        True when the logical batch is complete (always, without virtual batches)."""
        engine = self.engine
        with _autocast_off(engine.params):
            _widen_recorded(engine)
            sums, batch, norms = engine.clipped_sum(self.max_grad_norm, self.noise.dtype)
        self.last_norms = norms  # the per-example norms the clip factors used (float64)
        chunk = self._this_chunk()
        try:
            self._check_batch(batch, chunk)
        except DPError:
            self._drop()
            raise
        flat = (torch.cat([s.reshape(-1) for s in sums]) if sums else torch.zeros(0, dtype=self.noise.dtype)).to(
            self.noise.dtype
        )
        self._acc = flat if self._acc is None else self._acc.add_(flat)
        if chunk is not None and not chunk.last:
            self._acc_chunk = chunk
            return False
        return True

    def _release(self) -> list[torch.Tensor]:
        """Pay, add the noise once, divide by the expected batch size: the released gradient."""
        flat, self._acc, self._acc_chunk = self._acc, None, None
        assert flat is not None
        with _autocast_off(self.engine.params):
            if self.group is None:
                self._charge()  # the debit comes before any noise is drawn
                noisy = self.noise.release(flat, self._src)
            else:
                noisy = self.group.release(flat, self.noise, self._src, self._charge)
            noisy = noisy.div_(self.expected_batch_size)
        out, offset = [], 0
        for p in self.engine.params:
            n = p.numel()
            out.append(noisy[offset : offset + n].view(p.shape).to(dtype=p.dtype, device=p.device))
            offset += n
        return out

    def private_gradient(self) -> list[torch.Tensor] | None:
        """Clip, pay, add noise: the noisy average gradient per parameter (not yet applied).

        :meth:`step` calls this and then the wrapped optimizer; call it directly to inspect the
        released gradient. Counts as a step for the accountant. With virtual batches, a physical
        batch that does not complete its logical batch is only clipped and added up: None
        (nothing released, nothing charged).
        """
        self.released = False
        if not self._accumulate():
            return None
        grads = self._release()
        self.released = True
        return grads

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        grads = self.private_gradient()
        if grads is None:  # the middle of a logical batch: nothing to apply yet
            return loss
        for p, g in zip(self.engine.params, grads, strict=True):
            p.grad = g
        self.original_optimizer.step()
        return loss
