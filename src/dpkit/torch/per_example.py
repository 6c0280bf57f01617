"""Per-example gradients, their norms, and the clipped sum — one example at a time, always.

The model is split into *units*: a module of a fast-path type (``nn.Linear``, ``nn.Conv1d``,
``nn.Conv2d``, ``nn.Embedding``) or, failing that, the smallest module that owns trainable
parameters directly (with everything below it). A forward hook records each unit's inputs and
passes its outputs through an identity autograd node that records their gradients; the trainable
parameters are marked ``requires_grad=False`` while private, so autograd never forms the
non-private (unclipped) gradient at all. After ``loss.backward()`` the engine has, per unit and
per example i, the activations a_i and the output gradients b_i.

Per-example squared norms (summed over every unit: the clip is on the whole gradient):

* fast path, ``nn.Linear`` and convolutions as matrix products over positions t
  (convolutions through im2col): the per-example weight gradient is G_i = Σ_t b_itᵀ a_it, so
  ‖G_i‖² = ‖a_i‖²·‖b_i‖² for one position and ⟨a_i a_iᵀ, b_i b_iᵀ⟩ for several ("ghost
  clipping", Goodfellow 2015; Li, Tramèr, Liang & Hashimoto 2022) — or G_i itself where that is
  cheaper (T·(d_in + d_out) > d_in·d_out, the rule of Bu et al. 2022's mixed ghost clipping);
  the clipped sum Σ_i c_i G_i is then one matrix product (c ⊙ b)ᵀ a ("book-keeping", Bu, Mao &
  Xu 2022): no per-example gradient is materialised and no second backward pass is needed.
  ``nn.Embedding``: the per-example gradient is sparse (rows of the indices seen); its norm is
  computed by a segment sum over (example, index) pairs.
* everything else (and every unit in ``mode="vmap"``): exact per-example gradients by
  ``torch.func``: ``vmap`` over the batch of ``vjp(functional_call(unit, params, x_i), b_i)``.

Both paths compute the same numbers up to float rounding (the tests compare them with a
one-example-at-a-time oracle at 1e-5).

The clip factor is c_i = min(1, C·(1 − m)/‖ĝ_i‖): each piece's squared norm is reduced in its
own precision (float32: up to 2,045 values; longer ones in float64) and summed in float64, and
m = max(2⁻²⁰, 1.01·η) where η bounds the relative rounding error of the computed squared norm
(twice γ_n for a reduction of n terms, Higham 2002, Thm 3.1; η <= 2⁻¹² by construction). For one
position per example (dense layers) and for materialised gradients this keeps ‖c_i g_i‖ <= C for
the computed g_i.
The Gram matrices of multi-position layers (ghost branch) are float32 products, and the
book-keeping product sums over positions inside one matrix product: no rounding bound is claimed
there (see :mod:`dpkit.torch.noise`). A non-finite per-example gradient gets c_i = 0 and its
data is zeroed, so it contributes nothing (not NaN). There is no way to clip a sum of several
examples: a step refuses records from more than one forward pass (gradient accumulation over
batches would be sum-then-clip, seed 003's warning), and the parameters are marked
``requires_grad=False`` so that autograd never forms the unclipped gradient.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._pytree import tree_flatten, tree_unflatten

from dpkit.errors import DPError, InvalidDataError, InvalidParameterError

__all__ = ["PerExampleEngine", "CLIP_MARGIN", "MODES"]

CLIP_MARGIN = 2.0**-20  # the smallest relative margin; rounding bounds may ask for more
MODES = ("fast", "vmap")
_F64 = torch.float64


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

    def grad(self, k: int) -> torch.Tensor:
        """The gradient of tapped output k (zeros where none flowed back)."""
        g = self.grads[k] if self.grads is not None else None
        if g is None:
            shape, dtype, device = self.out_meta[k]
            return torch.zeros(shape, dtype=dtype, device=device)
        return g


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
        got = [g.detach() if g is not None else None for g in grads]
        if call.grads is None:
            call.grads = got
        else:  # a second backward through the same graph (retain_graph=True): the loss adds up
            call.grads = [a if b is None else (b if a is None else a + b) for a, b in zip(call.grads, got)]
        return (None, None, *grads)


def _detach_tree(tree: Any) -> Any:
    leaves, spec = tree_flatten(tree)
    return tree_unflatten([x.detach() if isinstance(x, torch.Tensor) else x for x in leaves], spec)


# ------------------------------------------------------------------------------------------------
# Units
# ------------------------------------------------------------------------------------------------


class _Unit:
    """A module whose trainable parameters get per-example gradients from recorded calls."""

    kind = "vmap"

    def __init__(self, engine: PerExampleEngine, module: nn.Module, name: str, params: list[tuple[str, nn.Parameter]]) -> None:
        self.engine = engine
        self.module = module
        self.name = name or "<root>"
        self.params = params  # (name relative to the unit, parameter)
        self.calls: list[_Call] = []

    # -- hook ---------------------------------------------------------------------------------

    def hook(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> Any:
        eng = self.engine
        if eng.recomputing or not torch.is_grad_enabled():
            return None
        self._check_forward(args, kwargs)
        if isinstance(output, torch.Tensor):  # the common case, without pytree overhead
            if not output.is_floating_point():
                return None
            call = _Call(eng.pass_id, self._keep(args), self._keep(kwargs), 1, None, (0,), ((output.shape, output.dtype, output.device),))
            self.calls.append(call)
            return _Tap.apply(call, eng.anchor, output)[0]
        leaves, spec = tree_flatten(output)
        tapped = tuple(i for i, x in enumerate(leaves) if isinstance(x, torch.Tensor) and x.is_floating_point())
        if not tapped:
            return None
        meta = tuple((leaves[i].shape, leaves[i].dtype, leaves[i].device) for i in tapped)
        call = _Call(eng.pass_id, self._keep(args), self._keep(kwargs), len(leaves), spec, tapped, meta)
        self.calls.append(call)
        new = _Tap.apply(call, eng.anchor, *(leaves[i] for i in tapped))
        leaves = list(leaves)
        for i, t in zip(tapped, new):
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
        raise NotImplementedError

    def mask(self, keep: torch.Tensor) -> None:
        """Zero the stored per-example data of examples not in ``keep`` (non-finite gradients)."""
        raise NotImplementedError

    def release(self) -> None:
        self.calls = []


def _zero_rows(x: torch.Tensor | None, keep: torch.Tensor) -> torch.Tensor | None:
    if x is None:
        return None
    return torch.where(keep.view(-1, *([1] * (x.dim() - 1))), x, torch.zeros((), dtype=x.dtype, device=x.device))


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
        self.sq.add_(sq, alpha=weight)
        self.eta = max(self.eta, eta)


def _product_eta(e1: float, e2: float) -> float:
    return e1 + e2 + e1 * e2 + 2.0**-52


def _weighted_sum(c: torch.Tensor, per_example: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Σ_i c_i x_i for x of shape (B, *shape), in ``dtype``."""
    flat = per_example.reshape(per_example.shape[0], -1).to(dtype)
    return (c.to(dtype) @ flat).reshape(per_example.shape[1:])


class _VmapUnit(_Unit):
    """Exact per-example gradients of any unit by torch.func (vmap over vjp)."""

    kind = "vmap"

    def __init__(self, *a: Any, **k: Any) -> None:
        super().__init__(*a, **k)
        self._per_example: list[torch.Tensor] | None = None

    def prepare(self, calls: list[_Call], batch: int, scale: float, norms: _Norms) -> None:
        total: list[torch.Tensor] | None = None
        for call in calls:
            grads = self._call_grads(call, batch, scale)
            total = grads if total is None else [a + b for a, b in zip(total, grads)]
        assert total is not None
        for g in total:
            norms.add(*_sumsq(g))
        self._per_example = total

    def clipped_sums(self, c: torch.Tensor, dtype: torch.dtype) -> list[torch.Tensor]:
        assert self._per_example is not None
        return [_weighted_sum(c, g, dtype) for g in self._per_example]

    def mask(self, keep: torch.Tensor) -> None:
        assert self._per_example is not None
        self._per_example = [_zero_rows(g, keep) for g in self._per_example]  # type: ignore[misc]

    def release(self) -> None:
        super().release()
        self._per_example = None

    def _call_grads(self, call: _Call, batch: int, scale: float) -> list[torch.Tensor]:
        from torch.func import functional_call, vjp, vmap

        module = self.module
        names = [n for n, _ in self.params]
        params = {n: p.detach() for n, p in self.params}
        leaves, spec = tree_flatten((call.args, call.kwargs))
        batched = [isinstance(x, torch.Tensor) and x.dim() > 0 and x.shape[0] == batch for x in leaves]
        b_leaves = [x for x, bt in zip(leaves, batched) if bt]
        cot = [call.grad(k) for k in range(len(call.tapped))]

        def one(p: dict[str, torch.Tensor], xs: list[torch.Tensor], gs: list[torch.Tensor]) -> list[torch.Tensor]:
            it = iter(xs)
            full = [next(it).unsqueeze(0) if bt else x for x, bt in zip(leaves, batched)]
            args, kwargs = tree_unflatten(full, spec)

            def fwd(pp: dict[str, torch.Tensor]) -> tuple[torch.Tensor, ...]:
                out = functional_call(module, pp, args, kwargs)
                o_leaves, _ = tree_flatten(out)
                return tuple(o_leaves[i] for i in call.tapped)

            _, pull = vjp(fwd, p)
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


class _MatmulUnit(_Unit):
    """Linear and convolution layers as products over positions: book-keeping ghost clipping.

    Per call the layer is seen as Y = A Wᵀ (+ bias) with A (B, T, K_in), Y (B, T, K_out);
    several calls of one layer concatenate along T (the per-example gradient is the sum over
    every position of every call).
    """

    kind = "fast"

    def __init__(self, *a: Any, **k: Any) -> None:
        super().__init__(*a, **k)
        mod = self.module
        self.weight = mod.weight if mod.weight.requires_grad else None
        self.bias = mod.bias if getattr(mod, "bias", None) is not None and mod.bias.requires_grad else None
        self._a: torch.Tensor | None = None
        self._b: torch.Tensor | None = None
        self._bsum: torch.Tensor | None = None
        self._direct: torch.Tensor | None = None
        self._scale = 1.0

    def _as_matrices(self, call: _Call, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def prepare(self, calls: list[_Call], batch: int, scale: float, norms: _Norms) -> None:
        mats = [self._as_matrices(c, c.grad(0)) for c in calls]
        a = torch.cat([m[0] for m in mats], dim=1) if len(mats) > 1 else mats[0][0]
        b = torch.cat([m[1] for m in mats], dim=1) if len(mats) > 1 else mats[0][1]
        t, k_in, k_out = a.shape[1], a.shape[2], b.shape[2]
        # b is kept unscaled: the loss scale multiplies the norms (squared) and the clip factors.
        s2 = scale * scale
        bsum = b[:, 0] if t == 1 else b.sum(dim=1)  # per-example bias gradient / scale
        nb, eb = _sumsq(bsum) if (self.bias is not None or t == 1) else (None, 0.0)
        self._a, self._b, self._bsum, self._direct, self._scale = a, b, bsum, None, scale
        if self.weight is not None:
            if t == 1:  # ‖b_i a_iᵀ‖² = ‖a_i‖²‖b_i‖²
                na, ea = _sumsq(a[:, 0])
                norms.add(na * nb, _product_eta(ea, eb), s2)
            elif t * (k_in + k_out) <= k_in * k_out:  # ghost: Gram matrices over positions (no bound claimed)
                w = (torch.bmm(a, a.transpose(1, 2)) * torch.bmm(b, b.transpose(1, 2))).sum(dim=(1, 2), dtype=_F64)
                norms.add(w, 0.0, s2)
            else:  # materialise G_i = b_iᵀ a_i (cheaper than the Grams here)
                self._direct = torch.bmm(b.transpose(1, 2), a)
                norms.add(*_sumsq(self._direct), s2)
        if self.bias is not None:
            norms.add(nb, eb, s2)  # type: ignore[arg-type]

    def clipped_sums(self, c: torch.Tensor, dtype: torch.dtype) -> list[torch.Tensor]:
        a, b, bsum = self._a, self._b, self._bsum
        assert a is not None and b is not None and bsum is not None
        cs = (c * self._scale).to(dtype)
        out = []
        if self.weight is not None:
            if self._direct is not None:
                gw = _weighted_sum(cs, self._direct, dtype)
            else:
                a2, b2 = a.reshape(-1, a.shape[2]).to(dtype), b.reshape(-1, b.shape[2]).to(dtype)
                w = cs if a.shape[1] == 1 else cs.repeat_interleave(a.shape[1])
                if b2.shape[1] <= a2.shape[1]:  # scale the narrower side by the clip factors
                    gw = torch.mm((b2 * w[:, None]).t(), a2)
                else:
                    gw = torch.mm(b2.t(), a2 * w[:, None])
            out.append(gw.reshape(self.weight.shape))
        if self.bias is not None:
            out.append(cs @ bsum.to(dtype))
        return out

    def mask(self, keep: torch.Tensor) -> None:
        self._a, self._b, self._bsum, self._direct = (_zero_rows(x, keep) for x in (self._a, self._b, self._bsum, self._direct))

    def release(self) -> None:
        super().release()
        self._a = self._b = self._bsum = self._direct = None


class _LinearUnit(_MatmulUnit):
    def _check_forward(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        x = args[0] if args else kwargs.get("input")
        if not isinstance(x, torch.Tensor) or x.dim() < 2:
            raise InvalidDataError(
                f"input of {self.name!r}",
                f"nn.Linear received {'a tensor of shape ' + str(tuple(x.shape)) if isinstance(x, torch.Tensor) else type(x).__name__}",
                "a batch: a tensor whose first dimension indexes the examples",
            )

    def _as_matrices(self, call: _Call, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = call.args[0] if call.args else call.kwargs["input"]
        n = x.shape[0]
        return x.reshape(n, -1, x.shape[-1]), grad.reshape(n, -1, grad.shape[-1])


def _patches(x: torch.Tensor, k: Sequence[int], d: Sequence[int], p: Sequence[int], s: Sequence[int]) -> torch.Tensor:
    """im2col as one strided view and one copy: (B, C, H, W) → (B, H_out·W_out, C·kh·kw), the
    column order of ``weight.view(C_out, -1)`` (what ``F.unfold`` gives, transposed, faster)."""
    if p[0] or p[1]:
        x = F.pad(x, (p[1], p[1], p[0], p[0]))
    b, c, h, w = x.shape
    ho = (h - d[0] * (k[0] - 1) - 1) // s[0] + 1
    wo = (w - d[1] * (k[1] - 1) - 1) // s[1] + 1
    st = x.stride()
    view = x.as_strided((b, ho, wo, c, k[0], k[1]), (st[0], st[2] * s[0], st[3] * s[1], st[1], st[2] * d[0], st[3] * d[1]))
    return view.reshape(b, ho * wo, c * k[0] * k[1])


class _ConvUnit(_MatmulUnit):
    """Conv1d / Conv2d (groups=1, zero padding given as numbers) through ``unfold``."""

    def _as_matrices(self, call: _Call, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        m = self.module
        x = call.args[0] if call.args else call.kwargs["input"]
        n = x.shape[0]
        if isinstance(m, nn.Conv1d):
            x4 = x.unsqueeze(2)
            k, d, p, s = (1, m.kernel_size[0]), (1, m.dilation[0]), (0, m.padding[0]), (1, m.stride[0])
        else:
            x4, k, d, p, s = x, m.kernel_size, m.dilation, m.padding, m.stride
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


class _EmbeddingUnit(_Unit):
    """nn.Embedding: per-example sparse gradients, norms by a segment sum over (example, index)."""

    kind = "fast"

    def __init__(self, *a: Any, **k: Any) -> None:
        super().__init__(*a, **k)
        self._idx: torch.Tensor | None = None
        self._g: torch.Tensor | None = None

    @staticmethod
    def supports(m: nn.Module) -> bool:
        return isinstance(m, nn.Embedding) and m.max_norm is None and not m.scale_grad_by_freq

    def prepare(self, calls: list[_Call], batch: int, scale: float, norms: _Norms) -> None:
        m = self.module
        idx_l, g_l = [], []
        for c in calls:
            idx = c.args[0] if c.args else c.kwargs["input"]
            idx_l.append(idx.reshape(batch, -1))
            g_l.append(c.grad(0).reshape(batch, -1, m.embedding_dim))
        if not idx_l:
            self._idx, self._g = torch.zeros((batch, 0), dtype=torch.long), torch.zeros((batch, 0, m.embedding_dim))
            return
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
        norms.sq.index_add_(0, uniq // m.num_embeddings, per_row)
        norms.eta = max(norms.eta, _gamma(m.embedding_dim + int(t), 2.0**-53))
        self._idx, self._g = idx, g

    def clipped_sums(self, c: torch.Tensor, dtype: torch.dtype) -> list[torch.Tensor]:
        m = self.module
        assert self._idx is not None and self._g is not None
        out = torch.zeros(m.weight.shape, dtype=dtype, device=m.weight.device)
        cg = self._g.to(dtype) * c.to(dtype)[:, None, None]
        out.index_add_(0, self._idx.reshape(-1), cg.reshape(-1, m.embedding_dim))
        return [out]

    def mask(self, keep: torch.Tensor) -> None:
        self._g = _zero_rows(self._g, keep)

    def release(self) -> None:
        super().release()
        self._idx = self._g = None


def _fast_unit_type(m: nn.Module) -> type[_Unit] | None:
    if type(m) is nn.Linear or (isinstance(m, nn.Linear) and type(m).forward is nn.Linear.forward):
        return _LinearUnit
    if _ConvUnit.supports(m) and type(m).forward in (nn.Conv1d.forward, nn.Conv2d.forward):
        return _ConvUnit
    if _EmbeddingUnit.supports(m) and type(m).forward is nn.Embedding.forward:
        return _EmbeddingUnit
    return None


# ------------------------------------------------------------------------------------------------
# The engine
# ------------------------------------------------------------------------------------------------


class PerExampleEngine:
    """Attaches to a module; after forward + backward, computes Σ_i clip_C(g_i).

    ``mode="fast"`` uses the ghost / book-keeping path for Linear, Conv1d/2d and Embedding and
    torch.func elsewhere; ``mode="vmap"`` uses torch.func everywhere. Both compute the same
    numbers (up to float rounding).
    """

    def __init__(self, module: nn.Module, *, mode: str = "fast", loss_reduction: str = "mean") -> None:
        if mode not in MODES:
            raise InvalidParameterError("grad_mode", mode, "'fast' (ghost clipping / book-keeping where possible) or 'vmap'")
        if loss_reduction not in ("mean", "sum"):
            raise InvalidParameterError("loss_reduction", loss_reduction, "'mean' or 'sum' (how the loss combines the examples of a batch)")
        self.module = module
        self.mode = mode
        self.loss_reduction = loss_reduction
        self.recomputing = False
        self.pass_id = 0
        self.last_margin = CLIP_MARGIN
        self.anchor = torch.empty(0, requires_grad=True)
        self.units = self._find_units(module)
        self.params: list[nn.Parameter] = [p for u in self.units for _, p in u.params]
        self._handles: list[Any] = []
        self._attached = False

    # -- structure ----------------------------------------------------------------------------

    def _find_units(self, root: nn.Module) -> list[_Unit]:
        units: list[_Unit] = []
        owner: dict[int, str] = {}

        def visit(mod: nn.Module, prefix: str) -> None:
            own = [(n, p) for n, p in mod.named_parameters(recurse=False) if p.requires_grad]
            fast = _fast_unit_type(mod) if self.mode == "fast" else None
            if fast is not None and own:
                units.append(fast(self, mod, prefix, own))
                return
            if own:
                units.append(_VmapUnit(self, mod, prefix, [(n, p) for n, p in mod.named_parameters() if p.requires_grad]))
                return
            for name, child in mod.named_children():
                visit(child, f"{prefix}.{name}" if prefix else name)

        visit(root, "")
        for u in units:
            for n, p in u.params:
                full = f"{u.name}.{n}" if u.name != "<root>" else n
                if id(p) in owner:
                    raise InvalidParameterError(
                        "module",
                        f"parameter shared by {owner[id(p)]!r} and {full!r}",
                        "a model whose trainable parameters each belong to one module",
                        "dpkit.torch does not support tied weights yet: a shared parameter's per-example gradient "
                        "would have to be summed across modules before clipping; untie them or freeze one copy",
                    )
                owner[id(p)] = full
        return units

    def attach(self) -> None:
        if self._attached:
            return
        self._handles.append(self.module.register_forward_pre_hook(self._root_pre_hook))
        for u in self.units:
            self._handles.append(u.module.register_forward_hook(u.hook, with_kwargs=True))
        for p in self.params:
            p.requires_grad_(False)
            p.grad = None
        self._attached = True

    def detach(self) -> None:
        """Remove the hooks and give the parameters back their requires_grad=True."""
        for h in self._handles:
            h.remove()
        self._handles = []
        for p in self.params:
            p.requires_grad_(True)
        self.clear()
        self._attached = False

    def _root_pre_hook(self, module: nn.Module, args: Any) -> None:
        if not self.recomputing and torch.is_grad_enabled():
            self.pass_id += 1

    def clear(self) -> None:
        for u in self.units:
            u.release()

    # -- the clipped sum --------------------------------------------------------------------------

    def batch_size(self) -> int | None:
        """The number of examples of the recorded pass (None when nothing was recorded)."""
        sizes: set[int] = set()
        for u in self.units:
            sizes |= u.batch_sizes()
        if len(sizes) > 1:
            raise InvalidDataError(
                "batch",
                f"the layers saw different leading dimensions {sorted(sizes)}",
                "inputs whose first dimension indexes the examples of the batch in every layer (batch_first=True)",
            )
        return next(iter(sizes)) if sizes else None

    def clipped_sum(self, max_grad_norm: float, dtype: torch.dtype) -> tuple[list[torch.Tensor], int | None, torch.Tensor]:
        """(Σ_i clip(g_i) per parameter in ``self.params`` order, batch size B — None when no
        forward/backward pass was recorded —, the per-example norms ‖g_i‖). Per-example
        clipping of the whole gradient; nothing else is possible."""
        live = {u: u.live_calls() for u in self.units}
        passes = {c.pass_id for calls in live.values() for c in calls}
        if len(passes) > 1:
            raise DPError(
                f"dpkit.torch: {len(passes)} forward/backward passes were recorded since the last optimizer step. "
                "Accumulating gradients over several batches before one step would clip sums of examples "
                "rather than each example (sum-then-clip breaks the sensitivity bound). Call optimizer.step() "
                "(or optimizer.zero_grad()) after each batch."
            )
        recorded = self.batch_size()
        batch = recorded or 0
        device = self.params[0].device if self.params else torch.device("cpu")
        acc = _Norms(batch, device)
        scale = float(batch) if self.loss_reduction == "mean" else 1.0
        sums: list[torch.Tensor] = []
        try:
            for u in self.units:
                if batch and live[u]:
                    u.prepare(live[u], batch, scale, acc)
            norms = acc.sq.sqrt()
            # ‖g‖² >= computed·(1 − η) ⇒ shrinking C by a margin >= η keeps ‖c·g‖ <= C
            self.last_margin = max(CLIP_MARGIN, 1.01 * acc.eta + 2.0**-50)
            c = torch.clamp(max_grad_norm * (1.0 - self.last_margin) / norms, max=1.0)
            finite = torch.isfinite(norms)
            if not bool(finite.all()):  # a non-finite gradient contributes nothing (not NaN·0)
                c = torch.where(finite, c, torch.zeros_like(c))
                for u in self.units:
                    if batch and live[u]:
                        u.mask(finite)
            for u in self.units:
                if batch and live[u]:
                    sums.extend(u.clipped_sums(c, dtype))
                else:
                    sums.extend(torch.zeros(p.shape, dtype=dtype, device=p.device) for _, p in u.params)
        finally:
            self.clear()
        return sums, recorded, norms

    def describe(self) -> list[tuple[str, str, int]]:
        """(unit name, path kind, number of trainable values) per unit."""
        return [(u.name, u.kind, sum(p.numel() for _, p in u.params)) for u in self.units]
