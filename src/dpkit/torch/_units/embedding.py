"""``nn.Embedding``: per-example gradients are sparse (the rows of the indices an example looked
up), so their norms are a segment sum over (example, index) pairs and the clipped sum one
``index_add``; nothing of the table's size is made per example.
"""

from __future__ import annotations

from typing import Any, cast

import torch
from torch import nn

from dpkit.torch._units.base import Call, Unit, first_arg
from dpkit.torch._units.norms import Norms, Rep, Rows, gamma, zero_rows

_F64 = torch.float64


class EmbeddingUnit(Unit):
    """nn.Embedding: per-example sparse gradients, norms by a segment sum over (example, index).
    Shared indices (leading dimension 1) are looked up per example (by the pre-hook of
    :class:`~dpkit.torch._units.base.Unit`, which a unit of any kind over an embedding needs)."""

    kind = "fast"

    def __init__(self, *a: Any, **k: Any) -> None:
        super().__init__(*a, **k)
        self._idx: torch.Tensor | None = None
        self._g: torch.Tensor | None = None

    @staticmethod
    def supports(m: nn.Module) -> bool:
        return isinstance(m, nn.Embedding) and m.max_norm is None and not m.scale_grad_by_freq

    def prepare(self, calls: list[Call], batch: int, scale: float, norms: Norms) -> None:
        m = cast(nn.Embedding, self.module)
        idx_l, g_l = [], []
        for c in calls:
            idx = first_arg(c.args, c.kwargs)
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
        norms.add(sq, gamma(m.embedding_dim + int(t), 2.0**-53))
        self._idx, self._g = idx, g

    def _sums(self, c: torch.Tensor, dtype: torch.dtype) -> dict[str, torch.Tensor]:
        m = cast(nn.Embedding, self.module)
        assert self._idx is not None and self._g is not None
        out = torch.zeros(m.weight.shape, dtype=dtype, device=m.weight.device)
        cg = self._g.to(dtype) * c.to(dtype=dtype, device=self._g.device)[:, None, None]
        out.index_add_(0, self._idx.reshape(-1), cg.reshape(-1, m.embedding_dim))
        return {"weight": out}

    def rep(self, name: str) -> Rep:
        assert self._idx is not None and self._g is not None
        return Rows(self._idx, self._g, cast(nn.Embedding, self.module).num_embeddings)

    def mask(self, keep: torch.Tensor) -> None:
        self._g = zero_rows(self._g, keep)

    def release(self) -> None:
        super().release()
        self._idx = self._g = None
