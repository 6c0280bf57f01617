"""The per-layer units behind :class:`dpkit.torch.PerExampleEngine`: how each kind of layer
records its activations and output gradients and turns them into per-example gradient norms and
clipped sums.

Ghost clipping and book-keeping for Linear, Conv, Hugging Face's ``Conv1D`` and Embedding layers
and for ``nn.MultiheadAttention``'s projections (Goodfellow 2015, "Efficient per-example gradient
computations"; Li et al. 2022, "Large language models can be strong differentially private
learners"; Bu et al. 2023, "Differentially private optimization on large model at small cost"),
materialised per-example gradients for LayerNorm and RMSNorm (they are (B, d)), ``torch.func``
(vmap of grad) for every other unit. The rounding bounds (η) that the engine's clipping margin
covers are computed here, as in :mod:`dpkit.torch.per_example`.

A parameter shared by several units (tied weights: GPT-2's ``lm_head`` and ``wte``) has one
per-example gradient, the sum of each use's; its squared norm is Σ_u ‖G_u‖² + 2 Σ_{u<v} ⟨G_u, G_v⟩.
Each unit adds its own ‖G_u‖² as usual, and describes G_u (:class:`_Outer`, :class:`_Rows`,
:class:`_Dense`) so that the engine adds the cross terms without materialising where it can
(:func:`_inner`).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import torch.nn.functional as F
from torch.utils._pytree import tree_flatten, tree_unflatten

import torch
from dpkit.errors import InvalidDataError, InvalidParameterError
from torch import nn

_F64 = torch.float64

if TYPE_CHECKING:  # the engine owns its units; imported for annotations only
    from dpkit.torch.per_example import PerExampleEngine


# ------------------------------------------------------------------------------------------------
# Recording
# ------------------------------------------------------------------------------------------------


@dataclass
class _Call:
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
    def forward(ctx: Any, call: _Call, anchor: torch.Tensor, *outs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        ctx.call = call
        return tuple(o.clone() for o in outs)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[Any, ...]:
        call: _Call = ctx.call
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


def _first_arg(args: tuple[Any, ...], kwargs: dict[str, Any], name: str = "input") -> Any:
    return args[0] if args else kwargs.get(name)


def _describe(x: object) -> str:
    return f"a tensor of shape {tuple(x.shape)}" if isinstance(x, torch.Tensor) else type(x).__name__


# ------------------------------------------------------------------------------------------------
# Norms and their rounding bounds
# ------------------------------------------------------------------------------------------------


_ROUNDOFF = {torch.float64: 2.0**-53, torch.float32: 2.0**-24, torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}


def _gamma(n: int, u: float) -> float:
    """γ_k = k·u/(1 − k·u) with k = 2(n + 3): a bound on the relative error of a norm² of n
    terms however the reduction is ordered or scaled (a sum of n non-negative rounded terms is
    within γ_n, Higham 2002, Thm 3.1; doubled to cover a scaled two-pass norm, plus the square,
    square root and final square)."""
    k = 2 * (n + 3) * u
    return k / (1 - k) if k < 0.5 else math.inf


def _sumsq(x: torch.Tensor) -> tuple[torch.Tensor, float]:
    """Per-example squared ℓ2 norms (first dim = example) as float64, with a bound η on their
    relative rounding error. Computed in the tensor's own precision when η <= 2^-12 (float32:
    up to 2,045 values per example), else in float64."""
    flat = x.reshape(x.shape[0], -1)
    n = flat.shape[1]
    eta = _gamma(n, _ROUNDOFF.get(flat.dtype, 2.0**-8))
    if eta <= 2.0**-12:
        return torch.linalg.vector_norm(flat, dim=1).to(_F64).square(), eta
    return torch.linalg.vector_norm(flat, dim=1, dtype=_F64).square(), _gamma(n, 2.0**-53)


class _Norms:
    """The per-example squared norms of the whole gradient, summed over units, and η."""

    def __init__(self, batch: int, device: torch.device) -> None:
        self.sq = torch.zeros(batch, dtype=_F64, device=device)
        self.eta = 0.0

    def add(self, sq: torch.Tensor, eta: float, weight: float = 1.0) -> None:
        self.sq.add_(sq.to(device=self.sq.device), alpha=weight)
        self.eta = max(self.eta, eta)


def _product_eta(e1: float, e2: float) -> float:
    return e1 + e2 + e1 * e2 + 2.0**-52


def _weighted_sum(c: torch.Tensor, per_example: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Σ_i c_i x_i for x of shape (B, *shape), in ``dtype``."""
    flat = per_example.reshape(per_example.shape[0], -1).to(dtype)
    return (c.to(dtype=dtype, device=flat.device) @ flat).reshape(per_example.shape[1:])


def _zero_rows(x: torch.Tensor | None, keep: torch.Tensor) -> torch.Tensor | None:
    if x is None:
        return None
    keep = keep.to(x.device)
    return torch.where(keep.view(-1, *([1] * (x.dim() - 1))), x, torch.zeros((), dtype=x.dtype, device=x.device))


# ------------------------------------------------------------------------------------------------
# What one unit's per-example gradient of one parameter looks like (for tied parameters)
# ------------------------------------------------------------------------------------------------


@dataclass
class _Outer:
    """G_i = scale · Σ_t u_it ⊗ v_it, the parameter seen as a (n0, n1) matrix (u: (B, T, n0),
    v: (B, T, n1)): a Linear layer's weight is Σ_t b_t ⊗ a_t, a ``Conv1D``'s Σ_t a_t ⊗ b_t."""

    u: torch.Tensor
    v: torch.Tensor
    scale: float


@dataclass
class _Rows:
    """G_i = Σ_t e_{idx_it} ⊗ g_it: the rows an embedding looked up (idx (B, T), g (B, T, d),
    already scaled), the parameter (num_rows, d)."""

    idx: torch.Tensor
    g: torch.Tensor
    num_rows: int


@dataclass
class _Dense:
    """The per-example gradients themselves, (B, *shape), already scaled."""

    g: torch.Tensor


_Rep = _Outer | _Rows | _Dense


def _materialise(r: _Rep, shape: Sequence[int]) -> torch.Tensor:
    if isinstance(r, _Dense):
        return r.g.reshape(r.g.shape[0], *shape)
    if isinstance(r, _Outer):
        return (torch.bmm(r.u.transpose(1, 2), r.v) * r.scale).reshape(r.u.shape[0], *shape)
    b, d = r.idx.shape[0], r.g.shape[2]
    out = torch.zeros((b * r.num_rows, d), dtype=r.g.dtype, device=r.g.device)
    key = (torch.arange(b, device=r.idx.device)[:, None] * r.num_rows + r.idx).reshape(-1)
    out.index_add_(0, key, r.g.reshape(-1, d))
    return out.reshape(b, *shape)


def _inner(r1: _Rep, r2: _Rep, shape: Sequence[int]) -> torch.Tensor:
    """⟨G_i, G'_i⟩ per example, as float64: Gram matrices over positions where both are sums of
    outer products or looked-up rows (T·T' values per example), materialised otherwise."""
    if isinstance(r1, _Rows) and isinstance(r2, _Outer):
        r1, r2 = r2, r1
    if isinstance(r1, _Outer) and isinstance(r2, _Outer):
        dt = torch.promote_types(r1.u.dtype, r2.u.dtype)
        gu = torch.bmm(r1.u.to(dt), r2.u.to(dt).transpose(1, 2))
        gv = torch.bmm(r1.v.to(dt), r2.v.to(dt).transpose(1, 2))
        return (gu * gv).sum(dim=(1, 2), dtype=_F64) * (r1.scale * r2.scale)
    if isinstance(r1, _Outer) and isinstance(r2, _Rows):  # Σ_t Σ_s u_t[idx_s] (v_t · g_s)
        b, t, _ = r1.u.shape
        s = r2.idx.shape[1]
        dt = torch.promote_types(r1.u.dtype, r2.g.dtype)
        picked = torch.gather(r1.u, 2, r2.idx[:, None, :].expand(b, t, s)).to(dt)
        dots = torch.bmm(r1.v.to(dt), r2.g.to(dt).transpose(1, 2))
        return (picked * dots).sum(dim=(1, 2), dtype=_F64) * r1.scale
    if isinstance(r1, _Rows) and isinstance(r2, _Rows):  # Σ_s Σ_s' [idx_s = idx'_s'] (g_s · g'_s')
        dt = torch.promote_types(r1.g.dtype, r2.g.dtype)
        same = r1.idx[:, :, None] == r2.idx[:, None, :]
        dots = torch.bmm(r1.g.to(dt), r2.g.to(dt).transpose(1, 2))
        return (dots * same).sum(dim=(1, 2), dtype=_F64)
    m1 = _materialise(r1, shape).reshape(-1, math.prod(shape)).to(_F64)
    m2 = _materialise(r2, shape).reshape(-1, math.prod(shape)).to(_F64)
    return (m1 * m2).sum(dim=1)


# ------------------------------------------------------------------------------------------------
# Units
# ------------------------------------------------------------------------------------------------


class _Unit:
    """A module whose trainable parameters get per-example gradients from recorded calls."""

    kind = "vmap"

    def __init__(
        self, engine: PerExampleEngine, module: nn.Module, name: str, params: list[tuple[str, nn.Parameter]]
    ) -> None:
        self.engine = engine
        self.module = module
        self.name = name or "<root>"
        self.params = params  # (name relative to the unit, parameter)
        self.calls: list[_Call] = []
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
            call = _Call(
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
        call = _Call(eng.pass_id, self._keep(args), self._keep(kwargs), len(leaves), spec, tapped, meta, extra=extra)
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

    def live_calls(self) -> list[_Call]:
        return [c for c in self.calls if c.grads is not None]

    def batch_sizes(self) -> set[int]:
        out = set()
        for c in self.live_calls():
            leaves, _ = tree_flatten((c.args, c.kwargs))
            first = next((x for x in leaves if isinstance(x, torch.Tensor) and x.dim() > 0), None)
            if first is not None:
                out.add(int(first.shape[0]))
        return out

    def prepare(self, calls: list[_Call], batch: int, scale: float, norms: _Norms) -> None:
        """Add this unit's per-example squared norms to ``norms`` and keep what the clipped
        sum needs."""
        raise NotImplementedError

    def clipped_sums(self, c: torch.Tensor, dtype: torch.dtype) -> list[torch.Tensor]:
        """Σ_i c_i g_i for each parameter of ``self.params`` (in that order), in ``dtype``."""
        sums = self._sums(c, dtype)
        return [sums[n] for n, _ in self.params]

    def _sums(self, c: torch.Tensor, dtype: torch.dtype) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def rep(self, name: str) -> _Rep:
        """This unit's per-example gradient of parameter ``name`` (after :meth:`prepare`)."""
        raise NotImplementedError

    def mask(self, keep: torch.Tensor) -> None:
        """Zero the stored per-example data of examples not in ``keep`` (non-finite gradients)."""
        raise NotImplementedError

    def release(self) -> None:
        self.calls = []
        self._pending = None


class _DenseUnit(_Unit):
    """A unit that materialises its per-example gradients: ``self._per_example[name]`` is
    (B, *shape), scaled."""

    def __init__(self, *a: Any, **k: Any) -> None:
        super().__init__(*a, **k)
        self._per_example: dict[str, torch.Tensor] | None = None

    def _store(self, grads: dict[str, torch.Tensor], norms: _Norms) -> None:
        for n, _ in self.params:
            norms.add(*_sumsq(grads[n]))
        self._per_example = grads

    def _sums(self, c: torch.Tensor, dtype: torch.dtype) -> dict[str, torch.Tensor]:
        assert self._per_example is not None
        return {n: _weighted_sum(c, g, dtype) for n, g in self._per_example.items()}

    def rep(self, name: str) -> _Rep:
        assert self._per_example is not None
        return _Dense(self._per_example[name])

    def mask(self, keep: torch.Tensor) -> None:
        assert self._per_example is not None
        self._per_example = {n: cast(torch.Tensor, _zero_rows(g, keep)) for n, g in self._per_example.items()}

    def release(self) -> None:
        super().release()
        self._per_example = None


class _VmapUnit(_DenseUnit):
    """Exact per-example gradients of any unit by torch.func (vmap over vjp)."""

    kind = "vmap"

    def prepare(self, calls: list[_Call], batch: int, scale: float, norms: _Norms) -> None:
        total: list[torch.Tensor] | None = None
        for call in calls:
            grads = self._call_grads(call, batch, scale)
            total = grads if total is None else [a + b for a, b in zip(total, grads, strict=True)]
        assert total is not None
        self._store({n: g for (n, _), g in zip(self.params, total, strict=True)}, norms)

    def _call_grads(self, call: _Call, batch: int, scale: float) -> list[torch.Tensor]:
        from torch.func import functional_call, vjp, vmap

        module = self.module
        names = [n for n, _ in self.params]
        params = {n: p.detach() for n, p in self.params}
        leaves, spec = tree_flatten((call.args, call.kwargs))
        batched = [isinstance(x, torch.Tensor) and x.dim() > 0 and x.shape[0] == batch for x in leaves]
        b_leaves = [x for x, bt in zip(leaves, batched, strict=True) if bt]
        cot = [call.grad(k) for k in range(len(call.tapped))]

        def one(p: dict[str, torch.Tensor], xs: list[torch.Tensor], gs: list[torch.Tensor]) -> list[torch.Tensor]:
            it = iter(xs)
            full = [next(it).unsqueeze(0) if bt else x for x, bt in zip(leaves, batched, strict=True)]
            args, kwargs = tree_unflatten(full, spec)

            def fwd(pp: dict[str, torch.Tensor]) -> tuple[torch.Tensor, ...]:
                out = functional_call(module, pp, args, kwargs)
                o_leaves, _ = tree_flatten(out)
                return tuple(o_leaves[i] for i in call.tapped)

            pull = vjp(fwd, p)[1]
            (grads,) = pull(tuple(g.unsqueeze(0) * scale for g in gs))
            return [grads[n] for n in names]

        eng = self.engine
        eng.recomputing = True
        try:
            return vmap(one, in_dims=(None, 0, 0), randomness="error")(params, b_leaves, cot)
        except RuntimeError as exc:
            if "random" in str(exc).lower():
                raise InvalidParameterError(
                    "module",
                    f"{type(module).__name__} at {self.name!r}",
                    "a unit without randomness in training mode",
                    "dpkit recomputes this module one example at a time to get exact per-example gradients, "
                    "and it draws random numbers (e.g. Dropout) inside, so the recomputation would not match the "
                    "forward pass; move the Dropout outside the module that owns the parameters, or call .eval() on it",
                ) from exc
            raise
        finally:
            eng.recomputing = False


# -- matrix products: Linear, Conv1d/2d, Hugging Face Conv1D, attention projections -------------


def uses_ghost_norm(positions: int, k_in: int, k_out: int) -> bool:
    """The book-keeping literature's per-layer choice for a product over T positions
    (Bu et al. 2022, "Scalable and efficient training of large convolutional neural networks
    with differential privacy", mixed ghost norm; Bu et al. 2023, book-keeping): the ghost norm
    (two T×T Gram matrices per example) when 2T² <= d_in·d_out, else the per-example gradient
    itself (d_out×d_in per example) — whichever needs less memory."""
    return 2 * positions * positions <= k_in * k_out


class _Product:
    """The per-example gradient of one matrix product Y_t = W a_t (+ bias) over positions t:
    G_i = Σ_t b_it ⊗ a_it (K_out × K_in) and the bias's Σ_t b_it, for a (B, T, K_in) and the
    output gradients b (B, T, K_out), kept unscaled (the loss scale multiplies the norms,
    squared, and the clip factors)."""

    def __init__(self, a: torch.Tensor, b: torch.Tensor, *, weight: bool, bias: bool, scale: float) -> None:
        self.a, self.b, self.weight, self.bias, self.scale = a, b, weight, bias, scale
        t = a.shape[1]
        self.bsum = b[:, 0] if t == 1 else b.sum(dim=1)  # per-example bias gradient / scale
        self.direct: torch.Tensor | None = None  # G_i / scale, when materialised

    def add_norms(self, norms: _Norms) -> None:
        a, b, bsum = self.a, self.b, self.bsum
        t, k_in, k_out = a.shape[1], a.shape[2], b.shape[2]
        s2 = self.scale * self.scale
        nb, eb = _sumsq(bsum) if (self.bias or t == 1) else (None, 0.0)
        if self.weight:
            if t == 1:  # ‖b_i a_iᵀ‖² = ‖a_i‖²‖b_i‖²
                assert nb is not None  # computed above whenever t == 1
                na, ea = _sumsq(a[:, 0])
                norms.add(na * nb, _product_eta(ea, eb), s2)
            elif uses_ghost_norm(t, k_in, k_out):  # ghost: Gram matrices over positions (no bound claimed)
                w = (torch.bmm(a, a.transpose(1, 2)) * torch.bmm(b, b.transpose(1, 2))).sum(dim=(1, 2), dtype=_F64)
                norms.add(w, 0.0, s2)
            else:  # materialise G_i = b_iᵀ a_i (less memory than the Grams here)
                self.direct = torch.bmm(b.transpose(1, 2), a)
                norms.add(*_sumsq(self.direct), s2)
        if self.bias:
            assert nb is not None
            norms.add(nb, eb, s2)

    def weight_sum(self, c: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """Σ_i c_i G_i as (K_out, K_in), in ``dtype``: one matrix product (c ⊙ b)ᵀ a."""
        cs = (c * self.scale).to(dtype=dtype, device=self.a.device)
        if self.direct is not None:
            return _weighted_sum(cs, self.direct, dtype)
        a, b = self.a, self.b
        a2, b2 = a.reshape(-1, a.shape[2]).to(dtype), b.reshape(-1, b.shape[2]).to(dtype)
        w = cs if a.shape[1] == 1 else cs.repeat_interleave(a.shape[1])
        if b2.shape[1] <= a2.shape[1]:  # scale the narrower side by the clip factors
            return torch.mm((b2 * w[:, None]).t(), a2)
        return torch.mm(b2.t(), a2 * w[:, None])

    def bias_sum(self, c: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        cs = (c * self.scale).to(dtype=dtype, device=self.bsum.device)
        return cs @ self.bsum.to(dtype)

    def weight_per_example(self) -> torch.Tensor:
        """G_i, (B, K_out, K_in), scaled (materialised: for tied parameters only)."""
        g = self.direct if self.direct is not None else torch.bmm(self.b.transpose(1, 2), self.a)
        return g * self.scale

    def outer(self, transposed: bool = False) -> _Outer:
        if transposed:  # the parameter is stored (K_in, K_out)
            return _Outer(self.a, self.b, self.scale)
        return _Outer(self.b, self.a, self.scale)

    def mask(self, keep: torch.Tensor) -> None:
        self.a, self.b, self.bsum = (cast(torch.Tensor, _zero_rows(x, keep)) for x in (self.a, self.b, self.bsum))
        self.direct = _zero_rows(self.direct, keep)


def _concat(mats: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Several calls of one layer: the per-example gradient sums over every position of every
    call, so the positions concatenate."""
    if len(mats) == 1:
        return mats[0]
    return torch.cat([m[0] for m in mats], dim=1), torch.cat([m[1] for m in mats], dim=1)


class _MatmulUnit(_Unit):
    """Linear and convolution layers as products over positions: book-keeping ghost clipping.

    Per call the layer is seen as Y = A Wᵀ (+ bias) with A (B, T, K_in), Y (B, T, K_out);
    several calls of one layer concatenate along T (the per-example gradient is the sum over
    every position of every call).
    """

    kind = "fast"
    transposed = False  # the weight is stored (K_in, K_out) (Hugging Face's Conv1D)

    def __init__(self, *a: Any, **k: Any) -> None:
        super().__init__(*a, **k)
        names = {n for n, _ in self.params}
        self._has_weight = "weight" in names
        self._has_bias = "bias" in names
        self._product: _Product | None = None

    def _as_matrices(self, call: _Call, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def prepare(self, calls: list[_Call], batch: int, scale: float, norms: _Norms) -> None:
        a, b = _concat([self._as_matrices(c, c.grad(0)) for c in calls])
        self._product = _Product(a, b, weight=self._has_weight, bias=self._has_bias, scale=scale)
        self._product.add_norms(norms)

    def _weight_shape(self) -> torch.Size:
        return cast(torch.Tensor, self.module.weight).shape

    def _sums(self, c: torch.Tensor, dtype: torch.dtype) -> dict[str, torch.Tensor]:
        p = self._product
        assert p is not None
        out = {}
        if self._has_weight:
            gw = p.weight_sum(c, dtype)
            out["weight"] = (gw.t() if self.transposed else gw).reshape(self._weight_shape())
        if self._has_bias:
            out["bias"] = p.bias_sum(c, dtype)
        return out

    def rep(self, name: str) -> _Rep:
        p = self._product
        assert p is not None
        if name == "bias":
            return _Dense(p.bsum * p.scale)
        return p.outer(self.transposed)

    def mask(self, keep: torch.Tensor) -> None:
        if self._product is not None:
            self._product.mask(keep)

    def release(self) -> None:
        super().release()
        self._product = None


class _LinearUnit(_MatmulUnit):
    """``nn.Linear`` on (B, d_in) or on sequences (B, T, d_in), or any (B, ..., d_in)."""

    layer = "nn.Linear"

    def _check_forward(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        x = _first_arg(args, kwargs)
        if not isinstance(x, torch.Tensor) or x.dim() < 2:
            raise InvalidDataError(
                f"input of {self.name!r}",
                f"{self.layer} received {_describe(x)}",
                "a batch: a tensor whose first dimension indexes the examples",
            )

    def _as_matrices(self, call: _Call, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = _first_arg(call.args, call.kwargs)
        n = x.shape[0]
        return x.reshape(n, -1, x.shape[-1]), grad.reshape(n, -1, grad.shape[-1])


class _HFConv1DUnit(_LinearUnit):
    """Hugging Face's ``transformers.pytorch_utils.Conv1D`` (GPT-2's projections): a Linear
    layer whose weight is stored transposed, (d_in, d_out)."""

    layer = "Conv1D"
    transposed = True

    def _as_matrices(self, call: _Call, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = _first_arg(call.args, call.kwargs, "x")
        n = x.shape[0]
        return x.reshape(n, -1, x.shape[-1]), grad.reshape(n, -1, grad.shape[-1])

    def _check_forward(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        super()._check_forward(args, {"input": _first_arg(args, kwargs, "x")})


def _hf_conv1d_class(m: nn.Module) -> type[nn.Module] | None:
    """Hugging Face's Conv1D class if ``m`` is one (found by name: transformers is not imported)."""
    for cls in type(m).__mro__:
        if cls.__name__ == "Conv1D" and cls.__module__ == "transformers.pytorch_utils":
            return cls
    return None


def _patches(x: torch.Tensor, k: Sequence[int], d: Sequence[int], p: Sequence[int], s: Sequence[int]) -> torch.Tensor:
    """im2col as one strided view and one copy: (B, C, H, W) → (B, H_out·W_out, C·kh·kw), the
    column order of ``weight.view(C_out, -1)`` (what ``F.unfold`` gives, transposed, faster)."""
    if p[0] or p[1]:
        x = F.pad(x, (p[1], p[1], p[0], p[0]))
    b, c, h, w = x.shape
    ho = (h - d[0] * (k[0] - 1) - 1) // s[0] + 1
    wo = (w - d[1] * (k[1] - 1) - 1) // s[1] + 1
    st = x.stride()
    view = x.as_strided(
        (b, ho, wo, c, k[0], k[1]), (st[0], st[2] * s[0], st[3] * s[1], st[1], st[2] * d[0], st[3] * d[1])
    )
    return view.reshape(b, ho * wo, c * k[0] * k[1])


class _ConvUnit(_MatmulUnit):
    """Conv1d / Conv2d (groups=1, zero padding given as numbers) through ``unfold``."""

    def _as_matrices(self, call: _Call, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        m = self.module
        x = _first_arg(call.args, call.kwargs)
        n = x.shape[0]
        k: tuple[int, ...]
        d: tuple[int, ...]
        p: tuple[int, ...]
        s: tuple[int, ...]
        if isinstance(m, nn.Conv1d):
            x4 = x.unsqueeze(2)
            pad = cast("tuple[int, ...]", m.padding)  # a string padding is refused by supports()
            k, d, p, s = (1, m.kernel_size[0]), (1, m.dilation[0]), (0, pad[0]), (1, m.stride[0])
        else:
            conv = cast(nn.Conv2d, m)
            x4, k, d, s = x, conv.kernel_size, conv.dilation, conv.stride
            p = cast("tuple[int, ...]", conv.padding)
        return _patches(x4, k, d, p, s), grad.reshape(n, grad.shape[1], -1).transpose(1, 2)

    @staticmethod
    def supports(m: nn.Module) -> bool:
        return (
            isinstance(m, (nn.Conv1d, nn.Conv2d))
            and m.groups == 1
            and m.padding_mode == "zeros"
            and not isinstance(m.padding, str)
            and not isinstance(m, nn.modules.conv._ConvTransposeNd)
        )


# -- embeddings ------------------------------------------------------------------------------------


def _per_example_lookup(engine: PerExampleEngine, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """An nn.Embedding's forward pre-hook: indices with a leading dimension of 1 while the batch
    has B > 1 examples (Hugging Face's position ids, shape (1, T), whose embeddings are broadcast
    against the batch's) are looked up once per example instead — the same values, broadcast
    the same way — so that each example's gradient reaches its own copy (the gradient of one
    shared lookup is the batch's sum, which no clipping can split)."""
    if engine.recomputing or not torch.is_grad_enabled():
        return None
    idx = _first_arg(args, kwargs)
    batch = engine.pass_batch
    if not (isinstance(idx, torch.Tensor) and batch is not None and batch > 1 and idx.dim() >= 2):
        return None
    if idx.shape[0] != 1:
        return None
    wide = idx.expand(batch, *idx.shape[1:])
    if args:
        return (wide, *args[1:]), kwargs
    return args, {**kwargs, "input": wide}


class _EmbeddingUnit(_Unit):
    """nn.Embedding: per-example sparse gradients, norms by a segment sum over (example, index).
    Shared indices (leading dimension 1) are looked up per example (:func:`_per_example_lookup`).
    """

    kind = "fast"

    def __init__(self, *a: Any, **k: Any) -> None:
        super().__init__(*a, **k)
        self._idx: torch.Tensor | None = None
        self._g: torch.Tensor | None = None

    @staticmethod
    def supports(m: nn.Module) -> bool:
        return isinstance(m, nn.Embedding) and m.max_norm is None and not m.scale_grad_by_freq

    def prepare(self, calls: list[_Call], batch: int, scale: float, norms: _Norms) -> None:
        m = cast(nn.Embedding, self.module)
        idx_l, g_l = [], []
        for c in calls:
            idx = _first_arg(c.args, c.kwargs)
            idx_l.append(idx.reshape(batch, -1))
            g_l.append(c.grad(0).reshape(batch, -1, m.embedding_dim))
        idx = torch.cat(idx_l, dim=1)
        g = torch.cat(g_l, dim=1) * scale
        if m.padding_idx is not None:
            g = g * (idx != m.padding_idx).unsqueeze(-1).to(g.dtype)
        t = idx.shape[1]
        example = torch.arange(batch, device=idx.device).repeat_interleave(t)
        key = example * m.num_embeddings + idx.reshape(-1)
        uniq, inv = torch.unique(key, return_inverse=True)
        rows = torch.zeros((uniq.numel(), m.embedding_dim), dtype=_F64, device=g.device)
        rows.index_add_(0, inv, g.reshape(-1, m.embedding_dim).to(_F64))
        per_row = rows.square().sum(dim=1)
        sq = torch.zeros(batch, dtype=_F64, device=g.device)
        sq.index_add_(0, uniq // m.num_embeddings, per_row)
        norms.add(sq, _gamma(m.embedding_dim + int(t), 2.0**-53))
        self._idx, self._g = idx, g

    def _sums(self, c: torch.Tensor, dtype: torch.dtype) -> dict[str, torch.Tensor]:
        m = cast(nn.Embedding, self.module)
        assert self._idx is not None and self._g is not None
        out = torch.zeros(m.weight.shape, dtype=dtype, device=m.weight.device)
        cg = self._g.to(dtype) * c.to(dtype=dtype, device=self._g.device)[:, None, None]
        out.index_add_(0, self._idx.reshape(-1), cg.reshape(-1, m.embedding_dim))
        return {"weight": out}

    def rep(self, name: str) -> _Rep:
        assert self._idx is not None and self._g is not None
        return _Rows(self._idx, self._g, cast(nn.Embedding, self.module).num_embeddings)

    def mask(self, keep: torch.Tensor) -> None:
        self._g = _zero_rows(self._g, keep)

    def release(self) -> None:
        super().release()
        self._idx = self._g = None


# -- normalisation layers ------------------------------------------------------------------------


class _NormUnit(_DenseUnit):
    """nn.LayerNorm and nn.RMSNorm: the per-example gradients are cheap to materialise,
    Σ_t g_t ⊙ x̂_t for the weight and Σ_t g_t for the bias, (B, *normalized_shape), with x̂ the
    normalised input recomputed from the recorded one."""

    kind = "fast"

    @staticmethod
    def supports(m: nn.Module) -> bool:
        return (type(m).forward is nn.LayerNorm.forward and isinstance(m, nn.LayerNorm)) or (
            isinstance(m, nn.RMSNorm) and type(m).forward is nn.RMSNorm.forward
        )

    def _dims(self) -> int:
        return len(cast("tuple[int, ...]", self.module.normalized_shape))

    def _check_forward(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        x = _first_arg(args, kwargs)
        if not isinstance(x, torch.Tensor) or x.dim() <= self._dims():
            raise InvalidDataError(
                f"input of {self.name!r}",
                f"{type(self.module).__name__} received {_describe(x)}",
                "a batch: a tensor whose first dimension indexes the examples, followed by the normalised shape",
            )

    def _normalised(self, x: torch.Tensor) -> torch.Tensor:
        m = self.module
        dims = tuple(range(-self._dims(), 0))
        xf = x.to(_F64 if x.dtype == _F64 else torch.float32)
        if isinstance(m, nn.LayerNorm):
            var, mean = torch.var_mean(xf, dim=dims, keepdim=True, correction=0)
            return (xf - mean) * torch.rsqrt(var + m.eps)
        eps = cast("float | None", m.eps)
        eps = torch.finfo(x.dtype).eps if eps is None else eps
        return xf * torch.rsqrt(xf.square().mean(dim=dims, keepdim=True) + eps)

    def prepare(self, calls: list[_Call], batch: int, scale: float, norms: _Norms) -> None:
        names = {n for n, _ in self.params}
        total: dict[str, torch.Tensor] = {}
        for c in calls:
            x = _first_arg(c.args, c.kwargs)
            g = c.grad(0)
            over = tuple(range(1, x.dim() - self._dims()))  # the positions
            got: dict[str, torch.Tensor] = {}
            if "weight" in names:
                gw = g.to(torch.promote_types(g.dtype, torch.float32)) * self._normalised(x)
                got["weight"] = gw.sum(dim=over) if over else gw
            if "bias" in names:
                got["bias"] = g.sum(dim=over) if over else g
            for n, v in got.items():
                total[n] = total[n] + v if n in total else v
        self._store({n: (total[n] * scale).to(p.dtype) for n, p in self.params}, norms)


# -- attention -----------------------------------------------------------------------------------


def _rng_state(device: torch.device) -> tuple[torch.Tensor, torch.Tensor | None]:
    cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    return torch.get_rng_state(), cuda


@contextmanager
def _replayed_rng(state: tuple[torch.Tensor, torch.Tensor | None] | None, device: torch.device) -> Iterator[None]:
    """Run the block with the random state ``state`` (as activation checkpointing does), then
    restore the state from before the block."""
    if state is None:
        yield
        return
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.set_rng_state(state[0])
        if state[1] is not None:
            torch.cuda.set_rng_state(state[1], device)
        yield


class _AttentionUnit(_Unit):
    """nn.MultiheadAttention (batch_first=True, without add_bias_kv): book-keeping on its four
    projections.

    The module computes q = W_q·query + b_q, k = W_k·key + b_k, v = W_v·value + b_v (the three
    row blocks of ``in_proj_weight``), the attention o of (q, k, v), and W_o·o + b_o
    (``out_proj``). Each projection is a product over positions, like a Linear layer; what the
    hooks cannot see are the gradients of q, k, v and the activation o, inside the module. At the
    step, the attention alone is recomputed for the batch by the module's own forward with
    identity projections (exact: multiplying by 1 and adding 0 rounds nothing) on q, k, v, and
    its gradients with respect to q, k, v are taken against the recorded output gradient — one
    extra forward and backward of the attention, no per-example loop. Attention dropout is
    replayed with the random state saved when the layer ran (as activation checkpointing does),
    so the recomputation draws the same mask.
    """

    kind = "fast"
    _signature = inspect.signature(nn.MultiheadAttention.forward)
    _options = ("key_padding_mask", "need_weights", "attn_mask", "average_attn_weights", "is_causal")

    def __init__(self, *a: Any, **k: Any) -> None:
        super().__init__(*a, **k)
        self.has_pre_hook = True
        self._names = {n for n, _ in self.params}
        self._products: dict[str, _Product] = {}

    @staticmethod
    def supports(m: nn.Module) -> bool:
        return (
            type(m).forward is nn.MultiheadAttention.forward
            and isinstance(m, nn.MultiheadAttention)
            and m.batch_first
            and m.bias_k is None
            and m.bias_v is None
            and type(m.out_proj).forward is nn.Linear.forward
        )

    def _bind(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        bound = self._signature.bind(self.module, *args, **kwargs)
        bound.apply_defaults()
        return dict(bound.arguments)

    def pre_hook(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        eng = self.engine
        if eng.recomputing or not torch.is_grad_enabled():
            return None
        m = cast(nn.MultiheadAttention, module)
        query = _first_arg(args, kwargs, "query")
        if isinstance(query, torch.Tensor) and m.training and m.dropout > 0:
            if query.device.type not in ("cpu", "cuda"):
                raise InvalidParameterError(
                    "module",
                    f"nn.MultiheadAttention at {self.name!r} with dropout={m.dropout}",
                    "attention dropout on the CPU or a CUDA device",
                    "dpkit recomputes the attention at the step and replays its dropout from the saved random "
                    "state, which it can do only for the CPU and CUDA generators; construct the layer with "
                    "dropout=0.0 or call .eval() on it",
                )
            self._pending = _rng_state(query.device)
        # keep the inference fast path (a fused kernel) off: it would compute the same values by
        # another route than the one recomputed at the step
        a = self._bind(args, kwargs)
        if not any(isinstance(a[k], torch.Tensor) and a[k].requires_grad for k in ("query", "key", "value")):
            q = on_tape(a["query"], eng.anchor)
            k = q if a["key"] is a["query"] else a["key"]
            v = k if a["value"] is a["key"] else a["value"]
            a.pop("self", None)
            a.update(query=q, key=k, value=v)
            return (), a
        return None

    def _check_forward(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        q = _first_arg(args, kwargs, "query")
        if not isinstance(q, torch.Tensor) or q.dim() != 3:
            raise InvalidDataError(
                f"input of {self.name!r}",
                f"nn.MultiheadAttention received {_describe(q)}",
                "a batch (batch_first=True): query, key and value of shape (batch, length, features)",
            )

    def _weights(self) -> tuple[list[torch.Tensor], list[torch.Tensor | None]]:
        m = cast(nn.MultiheadAttention, self.module)
        e = m.embed_dim
        if m._qkv_same_embed_dim:
            w = cast(torch.Tensor, m.in_proj_weight).detach()
            ws = [w[:e], w[e : 2 * e], w[2 * e :]]
        else:
            ws = [cast(torch.Tensor, getattr(m, f"{r}_proj_weight")).detach() for r in "qkv"]
        bias = m.in_proj_bias
        bs: list[torch.Tensor | None] = (
            [None, None, None] if bias is None else [bias.detach()[i * e : (i + 1) * e] for i in range(3)]
        )
        return ws, bs

    def _in_trainable(self) -> tuple[bool, bool]:
        n = self._names
        weight = bool(n & {"in_proj_weight", "q_proj_weight", "k_proj_weight", "v_proj_weight"})
        return weight, "in_proj_bias" in n

    def _recompute(self, call: _Call) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(input, gradient of the projection's output) for q, k, v and the output projection."""
        from torch.func import functional_call

        m = cast(nn.MultiheadAttention, self.module)
        a = self._bind(call.args, call.kwargs)
        ins = [a["query"], a["key"], a["value"]]
        ws, bs = self._weights()
        e, dtype, device = m.embed_dim, ws[0].dtype, ws[0].device
        need_in = any(self._in_trainable())
        with torch.no_grad():
            proj = [F.linear(x.to(dtype), w, b) for x, w, b in zip(ins, ws, bs, strict=True)]
        proj = [p.requires_grad_(need_in) for p in proj]
        eye = torch.eye(e, dtype=dtype, device=device)
        ident: dict[str, torch.Tensor] = {"out_proj.weight": eye}
        if m._qkv_same_embed_dim:
            ident["in_proj_weight"] = torch.cat([eye, eye, eye])
        else:
            ident.update(q_proj_weight=eye, k_proj_weight=eye, v_proj_weight=eye)
        if m.in_proj_bias is not None:
            ident["in_proj_bias"] = torch.zeros(3 * e, dtype=dtype, device=device)
        if m.out_proj.bias is not None:
            ident["out_proj.bias"] = torch.zeros(e, dtype=dtype, device=device)
        options = {k: a[k] for k in self._options}
        eng = self.engine
        eng.recomputing = True
        try:
            with _replayed_rng(call.extra, device), torch.enable_grad():
                out = functional_call(m, ident, tuple(proj), options)
        finally:
            eng.recomputing = False
        o, weights = out
        g_out = call.grad_of_leaf(0)
        if g_out is None:  # the output was not used; its attention weights may have been
            g_out = torch.zeros_like(o)
        result: list[tuple[torch.Tensor, torch.Tensor]] = []
        if need_in:
            w_out = m.out_proj.weight.detach()
            targets, cots = [o], [g_out.to(dtype) @ w_out]
            g_w = call.grad_of_leaf(1)
            if isinstance(weights, torch.Tensor) and g_w is not None:
                targets.append(weights)
                cots.append(g_w.to(weights.dtype))
            grads = torch.autograd.grad(targets, proj, cots, allow_unused=True)
            for x, p, g in zip(ins, proj, grads, strict=True):
                result.append((x.to(dtype), torch.zeros_like(p) if g is None else g))
        return [*result, (o.detach(), g_out.to(dtype))]

    def prepare(self, calls: list[_Call], batch: int, scale: float, norms: _Norms) -> None:
        per_call = [self._recompute(c) for c in calls]
        names = self._names
        in_w, in_b = self._in_trainable()
        self._products = {}
        flags = {"out": ("out_proj.weight" in names, "out_proj.bias" in names)}
        if in_w or in_b:
            for r in "qkv":
                own_w = in_w if "in_proj_weight" in names else f"{r}_proj_weight" in names
                flags[r] = (own_w, in_b)
        order = [*("qkv" if len(per_call[0]) == 4 else ""), "out"]
        for i, role in enumerate(order):
            weight, bias = flags[role]
            if not (weight or bias):
                continue
            a, b = _concat([pc[i] for pc in per_call])
            self._products[role] = _Product(a, b, weight=weight, bias=bias, scale=scale)
            self._products[role].add_norms(norms)

    def _sums(self, c: torch.Tensor, dtype: torch.dtype) -> dict[str, torch.Tensor]:
        pr = self._products
        out: dict[str, torch.Tensor] = {}
        for n in self._names:
            if n == "in_proj_weight":
                out[n] = torch.cat([pr[r].weight_sum(c, dtype) for r in "qkv"])
            elif n == "in_proj_bias":
                out[n] = torch.cat([pr[r].bias_sum(c, dtype) for r in "qkv"])
            elif n.endswith("_proj_weight"):
                out[n] = pr[n[0]].weight_sum(c, dtype)
            elif n == "out_proj.weight":
                out[n] = pr["out"].weight_sum(c, dtype)
            elif n == "out_proj.bias":
                out[n] = pr["out"].bias_sum(c, dtype)
        return out

    def rep(self, name: str) -> _Rep:
        pr = self._products
        if name == "in_proj_weight":
            return _Dense(torch.cat([pr[r].weight_per_example() for r in "qkv"], dim=1))
        if name == "in_proj_bias":
            return _Dense(torch.cat([pr[r].bsum * pr[r].scale for r in "qkv"], dim=1))
        if name == "out_proj.bias":
            return _Dense(pr["out"].bsum * pr["out"].scale)
        return pr["out" if name == "out_proj.weight" else name[0]].outer()

    def mask(self, keep: torch.Tensor) -> None:
        for p in self._products.values():
            p.mask(keep)

    def release(self) -> None:
        super().release()
        self._products = {}


# ------------------------------------------------------------------------------------------------
# Which unit a module gets
# ------------------------------------------------------------------------------------------------


def _fast_unit_type(m: nn.Module) -> type[_Unit] | None:
    if type(m) is nn.Linear or (isinstance(m, nn.Linear) and type(m).forward is nn.Linear.forward):
        return _LinearUnit
    conv1d = _hf_conv1d_class(m)
    if conv1d is not None and type(m).forward is conv1d.forward and getattr(m, "weight", None) is not None:
        return _HFConv1DUnit
    if _ConvUnit.supports(m) and type(m).forward in (nn.Conv1d.forward, nn.Conv2d.forward):
        return _ConvUnit
    if _EmbeddingUnit.supports(m) and type(m).forward is nn.Embedding.forward:
        return _EmbeddingUnit
    if _NormUnit.supports(m):
        return _NormUnit
    if _AttentionUnit.supports(m):
        return _AttentionUnit
    return None


def owns_its_subtree(m: nn.Module) -> bool:
    """Modules that use their submodules' parameters without calling them (so the submodules'
    hooks never run): nn.MultiheadAttention passes ``out_proj.weight`` to a function, and a
    module holding trainable parameters in an nn.ParameterList / nn.ParameterDict (a container
    that is never called; peft's LoRA embeddings) uses them in its own forward."""
    if isinstance(m, nn.MultiheadAttention):
        return True
    return any(
        isinstance(c, (nn.ParameterList, nn.ParameterDict)) and any(p.requires_grad for p in c.parameters())
        for c in m.children()
    )
