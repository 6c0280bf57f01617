"""``nn.LayerNorm`` and ``nn.RMSNorm``: their per-example gradients are (B, d), cheap to
materialise from the recorded input and output gradient, so they are (no ghost norm needed).
"""

from __future__ import annotations

from typing import Any, cast

import torch
from torch import nn

from dpkit.errors import InvalidDataError
from dpkit.torch._units.base import Call, DenseUnit, describe, first_arg
from dpkit.torch._units.norms import Norms

_F64 = torch.float64


class NormUnit(DenseUnit):
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
        x = first_arg(args, kwargs)
        if not isinstance(x, torch.Tensor) or x.dim() <= self._dims():
            raise InvalidDataError(
                f"input of {self.name!r}",
                f"{type(self.module).__name__} received {describe(x)}",
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

    def prepare(self, calls: list[Call], batch: int, scale: float, norms: Norms) -> None:
        names = {n for n, _ in self.params}
        total: dict[str, torch.Tensor] = {}
        for c in calls:
            x = first_arg(c.args, c.kwargs)
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
