"""A layer as a matrix product over positions, Y_t = W a_t (+ bias): its per-example gradient
norms by the ghost norm or the materialised gradient (whichever needs less memory) and its
clipped sum as one matrix product ("book-keeping").

Apart from the layers that are such products (:mod:`~dpkit.torch._units.linear`,
:mod:`~dpkit.torch._units.conv`, and the four projections of
:mod:`~dpkit.torch._units.attention`) because they share all of it and differ only in how they
see their inputs as matrices.
"""

from __future__ import annotations

from typing import Any, cast

import torch

from dpkit.torch._units.base import Call, Unit
from dpkit.torch._units.norms import Dense, Norms, Outer, Rep, product_eta, sumsq, weighted_sum, zero_rows

_F64 = torch.float64


def uses_ghost_norm(positions: int, k_in: int, k_out: int) -> bool:
    """The book-keeping literature's per-layer choice for a product over T positions
    (Bu et al. 2022, "Scalable and efficient training of large convolutional neural networks
    with differential privacy", mixed ghost norm; Bu et al. 2023, book-keeping): the ghost norm
    (two T×T Gram matrices per example) when 2T² <= d_in·d_out, else the per-example gradient
    itself (d_out×d_in per example) — whichever needs less memory."""
    return 2 * positions * positions <= k_in * k_out


class Product:
    """The per-example gradient of one matrix product Y_t = W a_t (+ bias) over positions t:
    G_i = Σ_t b_it ⊗ a_it (K_out × K_in) and the bias's Σ_t b_it, for a (B, T, K_in) and the
    output gradients b (B, T, K_out), kept unscaled (the loss scale multiplies the norms,
    squared, and the clip factors)."""

    def __init__(self, a: torch.Tensor, b: torch.Tensor, *, weight: bool, bias: bool, scale: float) -> None:
        self.a, self.b, self.weight, self.bias, self.scale = a, b, weight, bias, scale
        t = a.shape[1]
        self.bsum = b[:, 0] if t == 1 else b.sum(dim=1)  # per-example bias gradient / scale
        self.direct: torch.Tensor | None = None  # G_i / scale, when materialised

    def add_norms(self, norms: Norms) -> None:
        a, b, bsum = self.a, self.b, self.bsum
        t, k_in, k_out = a.shape[1], a.shape[2], b.shape[2]
        s2 = self.scale * self.scale
        nb, eb = sumsq(bsum) if (self.bias or t == 1) else (None, 0.0)
        if self.weight:
            if t == 1:  # ‖b_i a_iᵀ‖² = ‖a_i‖²‖b_i‖²
                assert nb is not None  # computed above whenever t == 1
                na, ea = sumsq(a[:, 0])
                norms.add(na * nb, product_eta(ea, eb), s2)
            elif uses_ghost_norm(t, k_in, k_out):  # ghost: Gram matrices over positions (no bound claimed)
                w = (torch.bmm(a, a.transpose(1, 2)) * torch.bmm(b, b.transpose(1, 2))).sum(dim=(1, 2), dtype=_F64)
                norms.add(w, 0.0, s2)
            else:  # materialise G_i = b_iᵀ a_i (less memory than the Grams here)
                self.direct = torch.bmm(b.transpose(1, 2), a)
                norms.add(*sumsq(self.direct), s2)
        if self.bias:
            assert nb is not None
            norms.add(nb, eb, s2)

    def weight_sum(self, c: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """Σ_i c_i G_i as (K_out, K_in), in ``dtype``: one matrix product (c ⊙ b)ᵀ a."""
        cs = (c * self.scale).to(dtype=dtype, device=self.a.device)
        if self.direct is not None:
            return weighted_sum(cs, self.direct, dtype)
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

    def outer(self, transposed: bool = False) -> Outer:
        if transposed:  # the parameter is stored (K_in, K_out)
            return Outer(self.a, self.b, self.scale)
        return Outer(self.b, self.a, self.scale)

    def mask(self, keep: torch.Tensor) -> None:
        self.a, self.b, self.bsum = (cast(torch.Tensor, zero_rows(x, keep)) for x in (self.a, self.b, self.bsum))
        self.direct = zero_rows(self.direct, keep)


def concat(mats: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Several calls of one layer: the per-example gradient sums over every position of every
    call, so the positions concatenate."""
    if len(mats) == 1:
        return mats[0]
    return torch.cat([m[0] for m in mats], dim=1), torch.cat([m[1] for m in mats], dim=1)


class MatmulUnit(Unit):
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
        self._product: Product | None = None

    def _as_matrices(self, call: Call, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def prepare(self, calls: list[Call], batch: int, scale: float, norms: Norms) -> None:
        a, b = concat([self._as_matrices(c, c.grad(0)) for c in calls])
        self._product = Product(a, b, weight=self._has_weight, bias=self._has_bias, scale=scale)
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

    def rep(self, name: str) -> Rep:
        p = self._product
        assert p is not None
        if name == "bias":
            return Dense(p.bsum * p.scale)
        return p.outer(self.transposed)

    def mask(self, keep: torch.Tensor) -> None:
        if self._product is not None:
            self._product.mask(keep)

    def release(self) -> None:
        super().release()
        self._product = None
