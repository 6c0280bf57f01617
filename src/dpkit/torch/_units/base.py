"""What every per-example unit shares: the engine state it reads, the hooks that record a
unit's calls (inputs, and the gradients flowing back into its outputs), and :class:`Unit`.

Apart from the layer families (:mod:`dpkit.torch._units`) because every family builds on it, and
apart from the engine (:mod:`dpkit.torch.per_example`) because the engine owns its units: a unit
sees the engine only through :class:`Recorder`, the few attributes it reads and sets.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, cast

import torch
from torch import nn
from torch.utils._pytree import tree_flatten, tree_unflatten

from dpkit.torch._units.norms import Dense, Norms, Rep, sumsq, weighted_sum, zero_rows


class Recorder(Protocol):
    """What a unit reads from the engine that records it (:class:`dpkit.torch.PerExampleEngine`):
    whether it is recomputing a forward pass (the hooks then record nothing), the number of the
    current pass, the batch size of its first input, and the anchor that puts outputs on the
    autograd tape."""

    recomputing: bool
    pass_id: int
    pass_batch: int | None
    anchor: torch.Tensor


# ------------------------------------------------------------------------------------------------
# Recording
# ------------------------------------------------------------------------------------------------


@dataclass
class Call:
    """One forward call of a unit: its inputs and, after backward, its output gradients."""

    pass_id: int
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    n_out: int
    out_spec: Any = None
    tapped: tuple[int, ...] = ()
    out_meta: tuple[tuple[torch.Size, torch.dtype, torch.device], ...] = ()
    grads: list[torch.Tensor | None] | None = None
    extra: Any = None  # what a unit kept from its pre-hook (the RNG state of a recomputed call)

    def grad(self, k: int) -> torch.Tensor:
        """The gradient of tapped output k (zeros where none flowed back)."""
        g = self.grads[k] if self.grads is not None else None
        if g is None:
            shape, dtype, device = self.out_meta[k]
            return torch.zeros(shape, dtype=dtype, device=device)
        return g

    def grad_of_leaf(self, leaf: int) -> torch.Tensor | None:
        """The gradient of output leaf ``leaf`` (its index in the flattened output), or None
        when that leaf was not a floating tensor or no gradient flowed back into it."""
        if self.grads is None or leaf not in self.tapped:
            return None
        return self.grads[self.tapped.index(leaf)]


class _Tap(torch.autograd.Function):
    """Identity on a unit's outputs that records the gradients flowing back into them.

    ``anchor`` is a 0-element leaf with requires_grad=True: it puts the outputs on the autograd
    tape even when nothing upstream requires grad (the parameters do not, on purpose). Outputs
    are cloned so that later in-place ops (``ReLU(inplace=True)``) are allowed.
    """

    @staticmethod
    def forward(ctx: Any, call: Call, anchor: torch.Tensor, *outs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        ctx.call = call
        return tuple(o.clone() for o in outs)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[Any, ...]:
        call: Call = ctx.call
        got: list[torch.Tensor | None] = [g.detach() if g is not None else None for g in grads]
        if call.grads is None:
            call.grads = got
        else:  # a second backward through the same graph (retain_graph=True): the loss adds up
            call.grads = [a if b is None else (b if a is None else a + b) for a, b in zip(call.grads, got, strict=True)]
        return (None, None, *grads)


class _OnTape(torch.autograd.Function):
    """Identity (a copy) that puts a tensor on the autograd tape through the engine's anchor.

    Used on the inputs of modules with an inference fast path (``nn.TransformerEncoder`` turns a
    padded batch into a nested tensor, ``nn.MultiheadAttention`` calls a fused kernel) that is
    taken only when nothing requires grad: with the parameters marked requires_grad=False while
    private, an input that does not require grad would take it in eval mode and skip the hooks.
    """

    @staticmethod
    def forward(ctx: Any, anchor: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[None, torch.Tensor]:
        return None, g


def on_tape(x: Any, anchor: torch.Tensor) -> Any:
    """``x`` itself unless it is a floating tensor off the autograd tape; then an on-tape copy."""
    if isinstance(x, torch.Tensor) and x.is_floating_point() and not x.requires_grad and torch.is_grad_enabled():
        return _OnTape.apply(anchor, x)
    return x


def _detach_tree(tree: Any) -> Any:
    leaves, spec = tree_flatten(tree)
    return tree_unflatten([x.detach() if isinstance(x, torch.Tensor) else x for x in leaves], spec)


def first_arg(args: tuple[Any, ...], kwargs: dict[str, Any], name: str = "input") -> Any:
    return args[0] if args else kwargs.get(name)


def describe(x: object) -> str:
    return f"a tensor of shape {tuple(x.shape)}" if isinstance(x, torch.Tensor) else type(x).__name__


def _per_example_lookup(engine: Recorder, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """An nn.Embedding's forward pre-hook: indices with a leading dimension of 1 while the batch
    has B > 1 examples (Hugging Face's position ids, shape (1, T), whose embeddings are broadcast
    against the batch's) are looked up once per example instead — the same values, broadcast
    the same way — so that each example's gradient reaches its own copy (the gradient of one
    shared lookup is the batch's sum, which no clipping can split)."""
    if engine.recomputing or not torch.is_grad_enabled():
        return None
    idx = first_arg(args, kwargs)
    batch = engine.pass_batch
    if not (isinstance(idx, torch.Tensor) and batch is not None and batch > 1 and idx.dim() >= 2):
        return None
    if idx.shape[0] != 1:
        return None
    wide = idx.expand(batch, *idx.shape[1:])
    if args:
        return (wide, *args[1:]), kwargs
    return args, {**kwargs, "input": wide}


# ------------------------------------------------------------------------------------------------
# Units
# ------------------------------------------------------------------------------------------------


class Unit:
    """A module whose trainable parameters get per-example gradients from recorded calls."""

    kind = "vmap"

    def __init__(self, engine: Recorder, module: nn.Module, name: str, params: list[tuple[str, nn.Parameter]]) -> None:
        self.engine = engine
        self.module = module
        self.name = name or "<root>"
        self.params = params  # (name relative to the unit, parameter)
        self.calls: list[Call] = []
        self._pending: Any = None  # what the pre-hook kept for the call under way
        #: whether :meth:`pre_hook` is to be registered on the module (forward pre-hook with kwargs)
        self.has_pre_hook = isinstance(module, nn.Embedding)

    # -- hooks --------------------------------------------------------------------------------

    def pre_hook(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if isinstance(module, nn.Embedding):
            return _per_example_lookup(self.engine, args, kwargs)
        return None

    def hook(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> Any:
        eng = self.engine
        if eng.recomputing or not torch.is_grad_enabled():
            return None
        self._check_forward(args, kwargs)
        extra, self._pending = self._pending, None
        if isinstance(output, torch.Tensor):  # the common case, without pytree overhead
            if not output.is_floating_point():
                return None
            call = Call(
                eng.pass_id,
                self._keep(args),
                self._keep(kwargs),
                1,
                None,
                (0,),
                ((output.shape, output.dtype, output.device),),
                extra=extra,
            )
            self.calls.append(call)
            return _Tap.apply(call, eng.anchor, output)[0]
        leaves, spec = tree_flatten(output)
        tapped = tuple(i for i, x in enumerate(leaves) if isinstance(x, torch.Tensor) and x.is_floating_point())
        if not tapped:
            return None
        meta = tuple((leaves[i].shape, leaves[i].dtype, leaves[i].device) for i in tapped)
        call = Call(eng.pass_id, self._keep(args), self._keep(kwargs), len(leaves), spec, tapped, meta, extra=extra)
        self.calls.append(call)
        new = _Tap.apply(call, eng.anchor, *(leaves[i] for i in tapped))
        leaves = list(leaves)
        for i, t in zip(tapped, new, strict=True):
            leaves[i] = t
        return tree_unflatten(leaves, spec)

    @staticmethod
    def _keep(tree: Any) -> Any:
        """The inputs, detached (they stay alive until the step, as autograd keeps them anyway)."""
        if isinstance(tree, tuple) and all(isinstance(x, torch.Tensor) for x in tree):
            return tuple(x.detach() for x in tree)
        if isinstance(tree, dict) and not tree:
            return {}
        return _detach_tree(tree)

    def _check_forward(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        pass

    # -- per-example work -----------------------------------------------------------------------

    def live_calls(self) -> list[Call]:
        return [c for c in self.calls if c.grads is not None]

    def batch_sizes(self) -> set[int]:
        out = set()
        for c in self.live_calls():
            leaves, _ = tree_flatten((c.args, c.kwargs))
            first = next((x for x in leaves if isinstance(x, torch.Tensor) and x.dim() > 0), None)
            if first is not None:
                out.add(int(first.shape[0]))
        return out

    def prepare(self, calls: list[Call], batch: int, scale: float, norms: Norms) -> None:
        """Add this unit's per-example squared norms to ``norms`` and keep what the clipped
        sum needs."""
        raise NotImplementedError

    def clipped_sums(self, c: torch.Tensor, dtype: torch.dtype) -> list[torch.Tensor]:
        """Σ_i c_i g_i for each parameter of ``self.params`` (in that order), in ``dtype``."""
        sums = self._sums(c, dtype)
        return [sums[n] for n, _ in self.params]

    def _sums(self, c: torch.Tensor, dtype: torch.dtype) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def rep(self, name: str) -> Rep:
        """This unit's per-example gradient of parameter ``name`` (after :meth:`prepare`)."""
        raise NotImplementedError

    def mask(self, keep: torch.Tensor) -> None:
        """Zero the stored per-example data of examples not in ``keep`` (non-finite gradients)."""
        raise NotImplementedError

    def release(self) -> None:
        self.calls = []
        self._pending = None


class DenseUnit(Unit):
    """A unit that materialises its per-example gradients: ``self._per_example[name]`` is
    (B, *shape), scaled."""

    def __init__(self, *a: Any, **k: Any) -> None:
        super().__init__(*a, **k)
        self._per_example: dict[str, torch.Tensor] | None = None

    def _store(self, grads: dict[str, torch.Tensor], norms: Norms) -> None:
        for n, _ in self.params:
            norms.add(*sumsq(grads[n]))
        self._per_example = grads

    def _sums(self, c: torch.Tensor, dtype: torch.dtype) -> dict[str, torch.Tensor]:
        assert self._per_example is not None
        return {n: weighted_sum(c, g, dtype) for n, g in self._per_example.items()}

    def rep(self, name: str) -> Rep:
        assert self._per_example is not None
        return Dense(self._per_example[name])

    def mask(self, keep: torch.Tensor) -> None:
        assert self._per_example is not None
        self._per_example = {n: cast(torch.Tensor, zero_rows(g, keep)) for n, g in self._per_example.items()}

    def release(self) -> None:
        super().release()
        self._per_example = None
