"""The private optimizer of :func:`dpkit.torch.make_private`: it wraps a ``torch.optim`` optimizer
and, at every step, replaces the gradient by the clipped per-example sum plus exact noise, after
charging the step to the accountant (and the budget) — the DP-SGD of Abadi et al. (2016, "Deep
learning with differential privacy") with the accounting of :mod:`dpkit.torch.privacy`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from dpkit import _validate as v
from dpkit._renamed import MISSING, take_renamed
from dpkit.accounting.accountant import Accountant
from dpkit.accounting.events import DPEvent, SelfComposedEvent
from dpkit.budget import Budget
from dpkit.errors import BudgetExceededError, DPError, InvalidDataError
from dpkit.noise.lattice import DELTA_MARGIN
from dpkit.noise.source import RandomSource
from dpkit.torch.noise import ContinuousNoise, LatticeNoise
from dpkit.torch.per_example import PerExampleEngine
from dpkit.torch.sampling import PoissonBatchSampler, UniformBatchSampler

__all__ = ["DPOptimizer", "LATTICE_DELTA_SHARE"]

# With lattice noise, ε is computed at δ·(1 − 2^-20): the discrete Gaussian at σ/g ≈ 2^40 differs
# from the continuous one by O(2^-78) in δ per step (CKS 2020, Sec. 4; as dpkit.mechanisms.gaussian
# and dpkit.torch.federated do), which that share covers for any realistic number of steps.
LATTICE_DELTA_SHARE = 1.0 - DELTA_MARGIN  # exactly 2^-20

#: Deprecated keyword → the vocabulary's name (docs/glossary.md: a target ε is still ``epsilon``).
_TARGET_ALIASES = {"target_epsilon": "epsilon", "target_delta": "delta"}


def _accounting_delta(delta: float, noise_kind: str) -> float:
    return delta * DELTA_MARGIN if noise_kind == "lattice" else delta


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
        delta: float = MISSING,
        accountant: str,
        accountant_factory: Callable[[], Accountant],
        noise: LatticeNoise | ContinuousNoise,
        source: RandomSource,
        epsilon: float | None = None,
        max_steps: int | None,
        budget: Budget | None,
        epochs: int,
        check_batches: bool,
        **renamed: Any,
    ) -> None:  # no super().__init__: the wrapped optimizer owns the parameter groups
        # ``epsilon``/``delta`` are the targets (the glossary's one spelling); the attributes keep
        # their names ``target_epsilon``/``target_delta`` beside the running ``epsilon``.
        given = {"delta": delta, "epsilon": MISSING if epsilon is None else epsilon}
        take_renamed("DPOptimizer", renamed, _TARGET_ALIASES, given)
        if given["delta"] is MISSING:
            raise TypeError("DPOptimizer() missing 1 required keyword-only argument: 'delta'")
        target_delta = given["delta"]
        target_epsilon = None if given["epsilon"] is MISSING else given["epsilon"]
        self.original_optimizer = optimizer
        self.engine = engine
        self.sampler = sampler
        self.noise_multiplier = noise_multiplier
        self.max_grad_norm = max_grad_norm
        self.target_delta = target_delta
        self.target_epsilon = target_epsilon
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
        self._eps_cache: dict[tuple[int, float], float] = {}

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
            f"noise={self.noise.kind!r}, accountant={self.accountant!r})"
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

    def get_epsilon(self, delta: float | None = None) -> float:
        """ε after the steps taken so far, at ``delta`` (default: the target δ). With lattice
        noise the accountant is asked at δ·(1 − 2^-20) (see ``LATTICE_DELTA_SHARE``)."""
        d = self.target_delta if delta is None else v.delta(delta, allow_zero=False)
        return self._epsilon_after(self.steps, d)

    @property
    def epsilon(self) -> float:
        """ε spent so far at the target δ."""
        return self.get_epsilon()

    def _epsilon_after(self, steps: int, delta: float) -> float:
        if steps == 0:
            return 0.0
        key = (steps, delta)
        if key not in self._eps_cache:
            if len(self._eps_cache) > 64:
                self._eps_cache.clear()
            acc = self._factory().compose(self.step_event, count=steps)
            self._eps_cache[key] = acc.get_epsilon(_accounting_delta(delta, self.noise.kind))
        return self._eps_cache[key]

    def _charge(self) -> None:
        """Pay for the next step, or raise BudgetExceededError having paid nothing."""
        nxt = self.steps + 1
        if self.max_steps is not None and nxt > self.max_steps:
            eps_next = self._epsilon_after(nxt, self.target_delta)
            raise BudgetExceededError(
                f"DP-SGD step {nxt} (noise multiplier σ={self.noise_multiplier:.6g}, sample rate q={self.sample_rate:.6g}), "
                f"which would bring ε to {eps_next:.6g} at δ={self.target_delta:g} against the target ε={self.target_epsilon!r}",
                f"ε={max(0.0, self.target_epsilon - self.epsilon):.6g} (target ε={self.target_epsilon!r}: {self.max_steps} steps "  # type: ignore[operator]
                f"allowed, {self.steps} taken); stop training here, or call make_private again with a larger "
                "target_epsilon or more epochs (which calibrates more noise)",
            )
        if self.budget is not None:
            self.budget.spend(self.step_event)
        self.steps = nxt

    # -- the step -----------------------------------------------------------------------------

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.engine.clear()
        for p in self.engine.params:
            p.grad = None
        self.original_optimizer.zero_grad(set_to_none=set_to_none)

    def _check_batch(self, batch: int | None) -> None:
        last = self.sampler.last_batch_size
        if batch is None:
            if last == 0:  # an empty Poisson batch the loop did not run the model on
                return
            raise DPError(
                "dpkit.torch: optimizer.step() was called without a forward and backward pass since the last "
                "step; run the model on the batch and call loss.backward() first"
            )
        if self._check_batches and last is not None and batch != last:
            raise InvalidDataError(
                "batch",
                f"the model's layers saw {batch} examples but the private data loader's last batch had {last}",
                "one optimizer step per batch of the private data loader, with the examples on the first "
                "dimension of every layer's input (batch_first=True)",
            )

    def private_gradient(self) -> list[torch.Tensor]:
        """Clip, pay, add noise: the noisy average gradient per parameter (not yet applied).

        :meth:`step` calls this and then the wrapped optimizer; call it directly to inspect the
        released gradient. Counts as a step for the accountant.
        """
        engine = self.engine
        sums, batch, _ = engine.clipped_sum(self.max_grad_norm, self.noise.dtype)
        self._check_batch(batch)
        self._charge()  # the debit comes before any noise is drawn
        flat = torch.cat([s.reshape(-1) for s in sums]) if sums else torch.zeros(0, dtype=self.noise.dtype)
        noisy = self.noise.release(flat, self._src).div_(self.expected_batch_size)
        out, offset = [], 0
        for p in engine.params:
            n = p.numel()
            out.append(noisy[offset : offset + n].view(p.shape).to(dtype=p.dtype, device=p.device))
            offset += n
        return out

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for p, g in zip(self.engine.params, self.private_gradient(), strict=True):
            p.grad = g
        self.original_optimizer.step()
        return loss
