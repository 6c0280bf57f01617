"""``nn.Linear`` (on (B, d_in), on sequences, on any (B, ..., d_in)) and Hugging Face's
``Conv1D`` (GPT-2's projections: a Linear layer whose weight is stored transposed), as matrix
products over positions (:mod:`dpkit.torch._units.matmul`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from dpkit.errors import InvalidDataError
from dpkit.torch._units.base import Call, describe, first_arg
from dpkit.torch._units.matmul import MatmulUnit


class LinearUnit(MatmulUnit):
    """``nn.Linear`` on (B, d_in) or on sequences (B, T, d_in), or any (B, ..., d_in)."""

    layer = "nn.Linear"

    def _check_forward(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        x = first_arg(args, kwargs)
        if not isinstance(x, torch.Tensor) or x.dim() < 2:
            raise InvalidDataError(
                f"input of {self.name!r}",
                f"{self.layer} received {describe(x)}",
                "a batch: a tensor whose first dimension indexes the examples",
            )

    def _as_matrices(self, call: Call, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = first_arg(call.args, call.kwargs)
        n = x.shape[0]
        return x.reshape(n, -1, x.shape[-1]), grad.reshape(n, -1, grad.shape[-1])


class HFConv1DUnit(LinearUnit):
    """Hugging Face's ``transformers.pytorch_utils.Conv1D`` (GPT-2's projections): a Linear
    layer whose weight is stored transposed, (d_in, d_out)."""

    layer = "Conv1D"
    transposed = True

    def _as_matrices(self, call: Call, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = first_arg(call.args, call.kwargs, "x")
        n = x.shape[0]
        return x.reshape(n, -1, x.shape[-1]), grad.reshape(n, -1, grad.shape[-1])

    def _check_forward(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        super()._check_forward(args, {"input": first_arg(args, kwargs, "x")})


def hf_conv1d_class(m: nn.Module) -> type[nn.Module] | None:
    """Hugging Face's Conv1D class if ``m`` is one (found by name: transformers is not imported)."""
    for cls in type(m).__mro__:
        if cls.__name__ == "Conv1D" and cls.__module__ == "transformers.pytorch_utils":
            return cls
    return None
