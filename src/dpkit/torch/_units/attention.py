"""``nn.MultiheadAttention``: book-keeping on its four projections, with the gradients of q, k
and v from one recomputation of the attention at the step, its dropout replayed.

Apart from the other layers because it is the one unit that recomputes part of the forward pass
(with the random state saved when the layer ran); its projections are matrix products like a
Linear layer's (:mod:`dpkit.torch._units.matmul`).
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn

from dpkit.errors import InvalidDataError, InvalidParameterError
from dpkit.torch._units.base import Call, Unit, describe, first_arg, on_tape
from dpkit.torch._units.matmul import Product, concat
from dpkit.torch._units.norms import Dense, Norms, Rep


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


class AttentionUnit(Unit):
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
        self._products: dict[str, Product] = {}

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
        query = first_arg(args, kwargs, "query")
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
        q = first_arg(args, kwargs, "query")
        if not isinstance(q, torch.Tensor) or q.dim() != 3:
            raise InvalidDataError(
                f"input of {self.name!r}",
                f"nn.MultiheadAttention received {describe(q)}",
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

    def _recompute(self, call: Call) -> list[tuple[torch.Tensor, torch.Tensor]]:
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

    def prepare(self, calls: list[Call], batch: int, scale: float, norms: Norms) -> None:
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
            a, b = concat([pc[i] for pc in per_call])
            self._products[role] = Product(a, b, weight=weight, bias=bias, scale=scale)
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

    def rep(self, name: str) -> Rep:
        pr = self._products
        if name == "in_proj_weight":
            return Dense(torch.cat([pr[r].weight_per_example() for r in "qkv"], dim=1))
        if name == "in_proj_bias":
            return Dense(torch.cat([pr[r].bsum * pr[r].scale for r in "qkv"], dim=1))
        if name == "out_proj.bias":
            return Dense(pr["out"].bsum * pr["out"].scale)
        return pr["out" if name == "out_proj.weight" else name[0]].outer()

    def mask(self, keep: torch.Tensor) -> None:
        for p in self._products.values():
            p.mask(keep)

    def release(self) -> None:
        super().release()
        self._products = {}
