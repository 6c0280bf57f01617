"""Which models DP-SGD can train as they are, and what to change in the others.

Per-example clipping bounds one example's influence only if every layer treats the examples of
a batch independently. Layers that mix examples, or that update state from the private data
outside the gradient, break that and are refused up front with the layer's name and the fix
(Opacus's ModuleValidator does the same; its message is the model for ours). So are set-ups
whose gradients dpkit's hooks would not see whole: gradient checkpointing (the forward runs
again inside backward) and peft's LoRA variants such as DoRA (they compute with the adapter
weights outside the adapter layers' forward).
"""

from __future__ import annotations

from torch import nn

from dpkit.errors import InvalidParameterError

__all__ = ["check_module", "module_problems"]


def _path(name: str) -> str:
    return repr(name) if name else "the root module"


def _checkpointing(module: nn.Module) -> list[str]:
    """The modules with Hugging Face's gradient checkpointing switched on."""
    return [name for name, m in module.named_modules() if getattr(m, "gradient_checkpointing", False) is True]


def module_problems(module: nn.Module) -> list[str]:
    """Human-readable problems, one per offending layer (empty when the model is fine)."""
    problems: list[str] = []
    checkpointed = _checkpointing(module)
    if checkpointed:
        problems.append(
            f"gradient checkpointing is on at {', '.join(_path(n) for n in checkpointed[:3])}: it runs the forward "
            "pass again inside backward, where dpkit's hooks would record the layers a second time, and it saves "
            "no memory here (dpkit keeps each layer's input until the step); switch it off "
            "(model.activation_checkpointing_disable(); gradient_checkpointing_disable() before transformers 5) "
            "and save memory with smaller physical batches instead"
        )
    for name, m in module.named_modules():
        kind = type(m).__name__
        where = _path(name)
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            problems.append(
                f"{kind} at {where} normalises each example with statistics of the whole batch (and keeps "
                "running statistics of the private data), so one example's gradient depends on the others "
                "and clipping no longer bounds its influence; replace it with nn.GroupNorm(num_groups, "
                f"{getattr(m, 'num_features', 'C')}) or nn.LayerNorm"
            )
        elif isinstance(m, nn.modules.instancenorm._InstanceNorm) and m.track_running_stats:
            problems.append(
                f"{kind} at {where} has track_running_stats=True: its running statistics are computed from "
                "the private data without noise; pass track_running_stats=False or use nn.GroupNorm"
            )
        elif isinstance(m, nn.RNNBase) and not m.batch_first:
            problems.append(
                f"{kind} at {where} has batch_first=False: dpkit.torch needs the examples on the first "
                "dimension of every layer's input; construct it with batch_first=True"
            )
        elif (
            isinstance(m, nn.MultiheadAttention)
            and not m.batch_first
            or isinstance(m, (nn.TransformerEncoderLayer, nn.TransformerDecoderLayer))
            and not getattr(m.self_attn, "batch_first", True)
        ):
            problems.append(f"{kind} at {where} has batch_first=False: construct it with batch_first=True")
        elif isinstance(m, nn.Embedding) and m.max_norm is not None:
            problems.append(
                f"{kind} at {where} has max_norm={m.max_norm}: it renormalises the rows the batch looks up, "
                "in place, outside the gradient (a data-dependent update without noise); use max_norm=None"
            )
        elif isinstance(m, nn.Embedding) and m.scale_grad_by_freq:
            problems.append(
                f"{kind} at {where} has scale_grad_by_freq=True: it scales gradients by how often each index "
                "occurs in the whole batch, which mixes examples; use scale_grad_by_freq=False"
            )
        elif isinstance(m, nn.EmbeddingBag) and (m.max_norm is not None or m.scale_grad_by_freq):
            problems.append(f"{kind} at {where}: use max_norm=None and scale_grad_by_freq=False")
        elif isinstance(getattr(m, "lora_variant", None), dict) and m.lora_variant:
            problems.append(
                f"peft {kind} at {where} uses the LoRA variant "
                f"{', '.join(sorted({type(x).__name__ for x in m.lora_variant.values()}))} (DoRA or another): it "
                "computes with the adapter weights outside the adapter layers' forward, where "
                "dpkit cannot see their per-example gradients; use plain LoRA (LoraConfig(use_dora=False))"
            )
    return problems


def check_module(module: object) -> nn.Module:
    """Return ``module`` if DP-SGD can train it, else raise InvalidParameterError listing every
    offending layer and its fix.

    >>> import torch.nn as nn
    >>> check_module(nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2)))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    dpkit.errors.InvalidParameterError: module='Sequential' is not accepted: ... BatchNorm1d at '1' normalises ...
    """
    if not isinstance(module, nn.Module):
        raise InvalidParameterError("module", type(module).__name__, "a torch.nn.Module")
    problems = module_problems(module)
    if problems:
        raise InvalidParameterError(
            "module",
            type(module).__name__,
            "a model whose layers treat each example of a batch independently",
            "; ".join(problems),
        )
    trainable = [p for p in module.parameters() if p.requires_grad]
    if not trainable:
        raise InvalidParameterError("module", type(module).__name__, "a model with at least one trainable parameter")
    return module
