"""``nn.Conv1d`` and ``nn.Conv2d`` (groups=1, zero padding given as numbers) as matrix
products over output positions (:mod:`dpkit.torch._units.matmul`), their inputs turned into
patches (im2col) by one strided view.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from dpkit.torch._units.base import Call, first_arg
from dpkit.torch._units.matmul import MatmulUnit


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


class ConvUnit(MatmulUnit):
    """Conv1d / Conv2d (groups=1, zero padding given as numbers) through ``unfold``."""

    def _as_matrices(self, call: Call, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        m = self.module
        x = first_arg(call.args, call.kwargs)
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
