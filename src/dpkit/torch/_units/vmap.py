"""The unit for any module without a fast path (and for every module in ``mode="vmap"``):
exact per-example gradients by ``torch.func``, vmap over the vjp of the module called on one
example at a time.

Apart from the layer families because it knows no layer: it recomputes whatever the module
does, which is also why it refuses a module that draws random numbers inside.
"""

from __future__ import annotations

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from dpkit.errors import InvalidParameterError
from dpkit.torch._units.base import Call, DenseUnit
from dpkit.torch._units.norms import Norms


class VmapUnit(DenseUnit):
    """Exact per-example gradients of any unit by torch.func (vmap over vjp)."""

    kind = "vmap"

    def prepare(self, calls: list[Call], batch: int, scale: float, norms: Norms) -> None:
        total: list[torch.Tensor] | None = None
        for call in calls:
            grads = self._call_grads(call, batch, scale)
            total = grads if total is None else [a + b for a, b in zip(total, grads, strict=True)]
        assert total is not None
        self._store({n: g for (n, _), g in zip(self.params, total, strict=True)}, norms)

    def _call_grads(self, call: Call, batch: int, scale: float) -> list[torch.Tensor]:
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
