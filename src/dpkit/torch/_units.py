"""The per-layer units behind :class:`dpkit.torch.PerExampleEngine`: how each kind of layer
records its activations and output gradients and turns them into per-example gradient norms and
clipped sums.

Ghost clipping and book-keeping for Linear, Conv and Embedding layers (Goodfellow 2015,
"Efficient per-example gradient computations"; Li et al. 2022, "Large language models can be
strong differentially private learners"; Bu et al. 2023, "Differentially private optimization on
large model at small cost"), ``torch.func`` (vmap of grad) for every other unit. The rounding
bounds (η) that the engine's clipping margin covers are computed here, as in
:mod:`dpkit.torch.per_example`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
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
        got: list[torch.Tensor | None] = [g.detach() if g is not None else None for g in grads]
        if call.grads is None:
            call.grads = got
        else:  # a second backward through the same graph (retain_graph=True): the loss adds up
            call.grads = [a if b is None else (b if a is None else a + b) for a, b in zip(call.grads, got, strict=True)]
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

    def __init__(
        self, engine: PerExampleEngine, module: nn.Module, name: str, params: list[tuple[str, nn.Parameter]]
    ) -> None:
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
            call = _Call(
                eng.pass_id,
                self._keep(args),
                self._keep(kwargs),
                1,
                None,
                (0,),
                ((output.shape, output.dtype, output.device),),
            )
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
            total = grads if total is None else [a + b for a, b in zip(total, grads, strict=True)]
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
        weight = cast(torch.Tensor, mod.weight)
        bias = cast("torch.Tensor | None", getattr(mod, "bias", None))
        self.weight: torch.Tensor | None = weight if weight.requires_grad else None
        self.bias: torch.Tensor | None = bias if bias is not None and bias.requires_grad else None
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
                assert nb is not None  # computed above whenever t == 1
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
        self._a, self._b, self._bsum, self._direct = (
            _zero_rows(x, keep) for x in (self._a, self._b, self._bsum, self._direct)
        )

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
    view = x.as_strided(
        (b, ho, wo, c, k[0], k[1]), (st[0], st[2] * s[0], st[3] * s[1], st[1], st[2] * d[0], st[3] * d[1])
    )
    return view.reshape(b, ho * wo, c * k[0] * k[1])


class _ConvUnit(_MatmulUnit):
    """Conv1d / Conv2d (groups=1, zero padding given as numbers) through ``unfold``."""

    def _as_matrices(self, call: _Call, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        m = self.module
        x = call.args[0] if call.args else call.kwargs["input"]
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
        m = cast(nn.Embedding, self.module)
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
        m = cast(nn.Embedding, self.module)
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
