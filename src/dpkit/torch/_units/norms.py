"""Per-example squared norms with a bound on their rounding error, and the shapes a unit's
per-example gradient of one parameter takes, from which the cross terms of a tied parameter
are computed.

A parameter shared by several units (tied weights: GPT-2's ``lm_head`` and ``wte``) has one
per-example gradient, the sum of each use's; its squared norm is Σ_u ‖G_u‖² + 2 Σ_{u<v} ⟨G_u, G_v⟩.
Each unit adds its own ‖G_u‖² as usual, and describes G_u (:class:`Outer`, :class:`Rows`,
:class:`Dense`) so that the engine adds the cross terms without materialising where it can
(:func:`inner`).

Apart from the units because it is arithmetic on tensors, with no hook or module in it: the
rounding bounds here are what the engine's clipping margin covers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

_F64 = torch.float64


# ------------------------------------------------------------------------------------------------
# Norms and their rounding bounds
# ------------------------------------------------------------------------------------------------


_ROUNDOFF = {torch.float64: 2.0**-53, torch.float32: 2.0**-24, torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}


def gamma(n: int, u: float) -> float:
    """γ_k = k·u/(1 − k·u) with k = 2(n + 3): a bound on the relative error of a norm² of n
    terms however the reduction is ordered or scaled (a sum of n non-negative rounded terms is
    within γ_n, Higham 2002, Thm 3.1; doubled to cover a scaled two-pass norm, plus the square,
    square root and final square)."""
    k = 2 * (n + 3) * u
    return k / (1 - k) if k < 0.5 else math.inf


def sumsq(x: torch.Tensor) -> tuple[torch.Tensor, float]:
    """Per-example squared ℓ2 norms (first dim = example) as float64, with a bound η on their
    relative rounding error. Computed in the tensor's own precision when η <= 2^-12 (float32:
    up to 2,045 values per example), else in float64."""
    flat = x.reshape(x.shape[0], -1)
    n = flat.shape[1]
    eta = gamma(n, _ROUNDOFF.get(flat.dtype, 2.0**-8))
    if eta <= 2.0**-12:
        return torch.linalg.vector_norm(flat, dim=1).to(_F64).square(), eta
    return torch.linalg.vector_norm(flat, dim=1, dtype=_F64).square(), gamma(n, 2.0**-53)


class Norms:
    """The per-example squared norms of the whole gradient, summed over units, and η."""

    def __init__(self, batch: int, device: torch.device) -> None:
        self.sq = torch.zeros(batch, dtype=_F64, device=device)
        self.eta = 0.0

    def add(self, sq: torch.Tensor, eta: float, weight: float = 1.0) -> None:
        self.sq.add_(sq.to(device=self.sq.device), alpha=weight)
        self.eta = max(self.eta, eta)


def product_eta(e1: float, e2: float) -> float:
    return e1 + e2 + e1 * e2 + 2.0**-52


def weighted_sum(c: torch.Tensor, per_example: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Σ_i c_i x_i for x of shape (B, *shape), in ``dtype``."""
    flat = per_example.reshape(per_example.shape[0], -1).to(dtype)
    return (c.to(dtype=dtype, device=flat.device) @ flat).reshape(per_example.shape[1:])


def zero_rows(x: torch.Tensor | None, keep: torch.Tensor) -> torch.Tensor | None:
    if x is None:
        return None
    keep = keep.to(x.device)
    return torch.where(keep.view(-1, *([1] * (x.dim() - 1))), x, torch.zeros((), dtype=x.dtype, device=x.device))


# ------------------------------------------------------------------------------------------------
# What one unit's per-example gradient of one parameter looks like (for tied parameters)
# ------------------------------------------------------------------------------------------------


@dataclass
class Outer:
    """G_i = scale · Σ_t u_it ⊗ v_it, the parameter seen as a (n0, n1) matrix (u: (B, T, n0),
    v: (B, T, n1)): a Linear layer's weight is Σ_t b_t ⊗ a_t, a ``Conv1D``'s Σ_t a_t ⊗ b_t."""

    u: torch.Tensor
    v: torch.Tensor
    scale: float


@dataclass
class Rows:
    """G_i = Σ_t e_{idx_it} ⊗ g_it: the rows an embedding looked up (idx (B, T), g (B, T, d),
    already scaled), the parameter (num_rows, d)."""

    idx: torch.Tensor
    g: torch.Tensor
    num_rows: int


@dataclass
class Dense:
    """The per-example gradients themselves, (B, *shape), already scaled."""

    g: torch.Tensor


Rep = Outer | Rows | Dense


def _materialise(r: Rep, shape: Sequence[int]) -> torch.Tensor:
    if isinstance(r, Dense):
        return r.g.reshape(r.g.shape[0], *shape)
    if isinstance(r, Outer):
        return (torch.bmm(r.u.transpose(1, 2), r.v) * r.scale).reshape(r.u.shape[0], *shape)
    b, d = r.idx.shape[0], r.g.shape[2]
    out = torch.zeros((b * r.num_rows, d), dtype=r.g.dtype, device=r.g.device)
    key = (torch.arange(b, device=r.idx.device)[:, None] * r.num_rows + r.idx).reshape(-1)
    out.index_add_(0, key, r.g.reshape(-1, d))
    return out.reshape(b, *shape)


def inner(r1: Rep, r2: Rep, shape: Sequence[int]) -> torch.Tensor:
    """⟨G_i, G'_i⟩ per example, as float64: Gram matrices over positions where both are sums of
    outer products or looked-up rows (T·T' values per example), materialised otherwise."""
    if isinstance(r1, Rows) and isinstance(r2, Outer):
        r1, r2 = r2, r1
    if isinstance(r1, Outer) and isinstance(r2, Outer):
        dt = torch.promote_types(r1.u.dtype, r2.u.dtype)
        gu = torch.bmm(r1.u.to(dt), r2.u.to(dt).transpose(1, 2))
        gv = torch.bmm(r1.v.to(dt), r2.v.to(dt).transpose(1, 2))
        return (gu * gv).sum(dim=(1, 2), dtype=_F64) * (r1.scale * r2.scale)
    if isinstance(r1, Outer) and isinstance(r2, Rows):  # Σ_t Σ_s u_t[idx_s] (v_t · g_s)
        b, t, _ = r1.u.shape
        s = r2.idx.shape[1]
        dt = torch.promote_types(r1.u.dtype, r2.g.dtype)
        picked = torch.gather(r1.u, 2, r2.idx[:, None, :].expand(b, t, s)).to(dt)
        dots = torch.bmm(r1.v.to(dt), r2.g.to(dt).transpose(1, 2))
        return (picked * dots).sum(dim=(1, 2), dtype=_F64) * r1.scale
    if isinstance(r1, Rows) and isinstance(r2, Rows):  # Σ_s Σ_s' [idx_s = idx'_s'] (g_s · g'_s')
        dt = torch.promote_types(r1.g.dtype, r2.g.dtype)
        same = r1.idx[:, :, None] == r2.idx[:, None, :]
        dots = torch.bmm(r1.g.to(dt), r2.g.to(dt).transpose(1, 2))
        return (dots * same).sum(dim=(1, 2), dtype=_F64)
    m1 = _materialise(r1, shape).reshape(-1, math.prod(shape)).to(_F64)
    m2 = _materialise(r2, shape).reshape(-1, math.prod(shape)).to(_F64)
    return (m1 * m2).sum(dim=1)
