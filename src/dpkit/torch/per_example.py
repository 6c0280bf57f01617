"""Per-example gradients, their norms, and the clipped sum — one example at a time, always.

The model is split into *units*: a module of a fast-path type (``nn.Linear``, ``nn.Conv1d``,
``nn.Conv2d``, Hugging Face's ``Conv1D``, ``nn.Embedding``, ``nn.LayerNorm``, ``nn.RMSNorm``,
``nn.MultiheadAttention``) or, failing that, the smallest module that owns trainable parameters
directly (with everything below it). Only trainable parameters (requires_grad=True) belong to
units: frozen ones (a LoRA model's base weights) get no gradient, no norm, no noise. A forward
hook records each unit's inputs and passes its outputs through an identity autograd node that
records their gradients; the trainable parameters are marked ``requires_grad=False`` while
private, so autograd never forms the non-private (unclipped) gradient at all. After
``loss.backward()`` the engine has, per unit and per example i, the activations a_i and the
output gradients b_i.

Per-example squared norms (summed over every unit: the clip is on the whole gradient):

* fast path, ``nn.Linear`` (on (B, d) or sequences (B, T, d)), ``Conv1D`` and convolutions as
  matrix products over positions t (convolutions through im2col): the per-example weight
  gradient is G_i = Σ_t b_itᵀ a_it, so ‖G_i‖² = ‖a_i‖²·‖b_i‖² for one position and
  ⟨a_i a_iᵀ, b_i b_iᵀ⟩ = Σ_t Σ_s (a_t·a_s)(b_t·b_s) for several ("ghost clipping", Goodfellow
  2015; Li, Tramèr, Liang & Hashimoto 2022) — or G_i itself where that takes less memory
  (2T² > d_in·d_out, the per-layer rule of Bu et al.'s mixed ghost norm, 2022, and book-keeping,
  2023); the clipped sum Σ_i c_i G_i is then one matrix product (c ⊙ b)ᵀ a ("book-keeping"):
  no per-example gradient is materialised and no second backward pass is needed.
  ``nn.MultiheadAttention``: the same for its four projections, with the gradients of q, k, v
  from one recomputation of the attention (see :mod:`dpkit.torch._units.attention`).
  ``nn.Embedding``: the per-example gradient is sparse (rows of the indices seen); its norm is
  computed by a segment sum over (example, index) pairs. ``nn.LayerNorm`` / ``nn.RMSNorm``: the per-example gradients
  are materialised, (B, d).
* everything else (and every unit in ``mode="vmap"``): exact per-example gradients by
  ``torch.func``: ``vmap`` over the batch of ``vjp(functional_call(unit, params, x_i), b_i)``.
* a parameter shared by several units (tied weights, e.g. GPT-2's ``lm_head`` and ``wte``): its
  per-example gradient is the sum of each use's, so the cross terms 2⟨G_u,i, G_v,i⟩ are added to
  the squared norm (Gram matrices over positions, or a gather for an embedding tied to a
  Linear layer) and the clipped sums of the uses add up.

Both paths compute the same numbers up to float rounding (the tests compare them with a
one-example-at-a-time oracle at 1e-5).

The clip factor is c_i = min(1, C·(1 − m)/‖ĝ_i‖): each piece's squared norm is reduced in its
own precision (float32: up to 2,045 values; longer ones in float64) and summed in float64, and
m = max(2⁻²⁰, 1.01·η) where η bounds the relative rounding error of the computed squared norm
(twice γ_n for a reduction of n terms, Higham 2002, Thm 3.1; η <= 2⁻¹² by construction). For one
position per example (dense layers) and for materialised gradients this keeps ‖c_i g_i‖ <= C for
the computed g_i.
The Gram matrices of multi-position layers (ghost branch) and the cross terms of tied
parameters are float32 products, and the book-keeping product sums over positions inside one
matrix product: no rounding bound is claimed there (see :mod:`dpkit.torch.noise`). A non-finite
per-example gradient gets c_i = 0 and its data is zeroed, so it contributes nothing (not NaN).
There is no way to clip a sum of several examples: a step refuses records from more than one
forward pass (gradient accumulation over batches would be sum-then-clip, not the per-example
clipping of Abadi et al. 2016), and the parameters are marked ``requires_grad=False`` so that
autograd never forms the unclipped gradient.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_flatten

from dpkit.errors import DPError, InvalidDataError, InvalidParameterError
from dpkit.torch._units.attention import AttentionUnit
from dpkit.torch._units.base import Unit, on_tape
from dpkit.torch._units.conv import ConvUnit
from dpkit.torch._units.embedding import EmbeddingUnit
from dpkit.torch._units.linear import HFConv1DUnit, LinearUnit, hf_conv1d_class
from dpkit.torch._units.normalisation import NormUnit
from dpkit.torch._units.norms import Norms, inner
from dpkit.torch._units.vmap import VmapUnit

__all__ = ["PerExampleEngine", "CLIP_MARGIN", "MODES"]

CLIP_MARGIN = 2.0**-20  # the smallest relative margin; rounding bounds may ask for more
MODES = ("fast", "vmap")

# ------------------------------------------------------------------------------------------------
# The engine
# ------------------------------------------------------------------------------------------------


class PerExampleEngine:
    """Attaches to a module; after forward + backward, computes Σ_i clip_C(g_i).

    ``mode="fast"`` uses the ghost / book-keeping path for Linear, Conv1d/2d, Conv1D, Embedding
    and MultiheadAttention, materialised gradients for LayerNorm / RMSNorm and torch.func
    elsewhere; ``mode="vmap"`` uses torch.func everywhere. Both compute the same numbers (up to
    float rounding). ``params`` lists each trainable parameter once (a tied parameter too).
    """

    def __init__(self, module: nn.Module, *, mode: str = "fast", loss_reduction: str = "mean") -> None:
        if mode not in MODES:
            raise InvalidParameterError(
                "grad_mode", mode, "'fast' (ghost clipping / book-keeping where possible) or 'vmap'"
            )
        if loss_reduction not in ("mean", "sum"):
            raise InvalidParameterError(
                "loss_reduction", loss_reduction, "'mean' or 'sum' (how the loss combines the examples of a batch)"
            )
        self.module = module
        self.mode = mode
        self.loss_reduction = loss_reduction
        self.recomputing = False
        self.pass_id = 0
        self.pass_batch: int | None = None  # the leading dimension of the model's first input
        self.last_margin = CLIP_MARGIN
        self.anchor = torch.empty(0, requires_grad=True)
        self.units = self._find_units(module)
        self.params: list[nn.Parameter] = []
        # id(parameter) → the (unit, name) pairs that use it; more than one for a tied parameter
        self._uses: dict[int, list[tuple[Unit, str]]] = {}
        for u in self.units:
            for n, p in u.params:
                if id(p) not in self._uses:
                    self._uses[id(p)] = []
                    self.params.append(p)
                self._uses[id(p)].append((u, n))
        self._handles: list[Any] = []
        self._attached = False

    # -- structure ----------------------------------------------------------------------------

    def _find_units(self, root: nn.Module) -> list[Unit]:
        units: list[Unit] = []

        def visit(mod: nn.Module, prefix: str) -> None:
            own = [(n, p) for n, p in mod.named_parameters(recurse=False) if p.requires_grad]
            whole = [(n, p) for n, p in mod.named_parameters() if p.requires_grad]
            if owns_its_subtree(mod) and whole:
                own = whole
            fast = _fast_unit_type(mod) if self.mode == "fast" else None
            if fast is not None and own:
                units.append(fast(self, mod, prefix, own))
                return
            if own:
                units.append(VmapUnit(self, mod, prefix, whole))
                return
            for name, child in mod.named_children():
                visit(child, f"{prefix}.{name}" if prefix else name)

        visit(root, "")
        return units

    def shared(self) -> list[list[str]]:
        """The tied parameters: for each, the full names of its uses (one per unit)."""
        return [
            [f"{u.name}.{n}" if u.name != "<root>" else n for u, n in uses]
            for uses in self._uses.values()
            if len(uses) > 1
        ]

    def attach(self) -> None:
        if self._attached:
            return
        self._handles.append(self.module.register_forward_pre_hook(self._root_pre_hook, with_kwargs=True))
        for m in self.module.modules():
            if isinstance(m, nn.TransformerEncoder):  # see _units.base._OnTape: no nested-tensor fast path
                self._handles.append(m.register_forward_pre_hook(self._tape_pre_hook, with_kwargs=True))
        for u in self.units:
            if u.has_pre_hook:
                self._handles.append(u.module.register_forward_pre_hook(u.pre_hook, with_kwargs=True))
            self._handles.append(u.module.register_forward_hook(u.hook, with_kwargs=True))
        for p in self.params:
            p.requires_grad_(False)
            p.grad = None
        self._attached = True

    def detach(self) -> None:
        """Remove the hooks and give the parameters back their requires_grad=True."""
        for h in self._handles:
            h.remove()
        self._handles = []
        for p in self.params:
            p.requires_grad_(True)
        self.clear()
        self._attached = False

    def _root_pre_hook(self, module: nn.Module, args: Any, kwargs: Any) -> None:
        if not self.recomputing and torch.is_grad_enabled():
            self.pass_id += 1
            leaves, _ = tree_flatten((args, kwargs))
            first = next((x for x in leaves if isinstance(x, torch.Tensor) and x.dim() > 0), None)
            self.pass_batch = int(first.shape[0]) if first is not None else None

    def _tape_pre_hook(self, module: nn.Module, args: Any, kwargs: Any) -> Any:
        if self.recomputing or not torch.is_grad_enabled():
            return None
        if args:
            return (on_tape(args[0], self.anchor), *args[1:]), kwargs
        if "src" in kwargs:
            return args, {**kwargs, "src": on_tape(kwargs["src"], self.anchor)}
        return None

    def clear(self) -> None:
        for u in self.units:
            u.release()

    # -- the clipped sum --------------------------------------------------------------------------

    def batch_size(self) -> int | None:
        """The number of examples of the recorded pass (None when nothing was recorded)."""
        seen: dict[int, list[str]] = {}
        for u in self.units:
            for b in u.batch_sizes():
                seen.setdefault(b, []).append(u.name)
        if len(seen) > 1:
            where = "; ".join(f"{b}: {', '.join(repr(n) for n in names[:3])}" for b, names in sorted(seen.items()))
            raise InvalidDataError(
                "batch",
                f"the layers saw different leading dimensions ({where})",
                "inputs whose first dimension indexes the examples of the batch in every layer (batch_first=True); "
                "a layer applied to a tensor shared by the whole batch (leading dimension 1, broadcast later) has "
                "no per-example gradient: expand its input to the batch first (x.expand(batch, ...)) — dpkit does "
                "this itself for nn.Embedding (position ids)",
            )
        return next(iter(seen)) if seen else None

    def clipped_sum(
        self, max_grad_norm: float, dtype: torch.dtype
    ) -> tuple[list[torch.Tensor], int | None, torch.Tensor]:
        """(Σ_i clip(g_i) per parameter in ``self.params`` order, batch size B — None when no
        forward/backward pass was recorded —, the per-example norms ‖g_i‖). Per-example
        clipping of the whole gradient; nothing else is possible."""
        if self._attached:
            loose = [n for n, p in self.module.named_parameters() if p.requires_grad and id(p) not in self._uses]
            if loose:  # unfrozen after make_private: autograd gave it an unclipped gradient
                raise DPError(
                    f"dpkit.torch: {len(loose)} parameter(s) of the module became trainable after make_private "
                    f"({', '.join(repr(n) for n in loose[:3])}): their gradients would be neither clipped nor "
                    "noised. Set requires_grad before calling make_private (call it again after unfreezing)."
                )
        live = {u: u.live_calls() for u in self.units}
        passes = {c.pass_id for calls in live.values() for c in calls}
        if len(passes) > 1:
            raise DPError(
                f"dpkit.torch: {len(passes)} forward/backward passes were recorded since the last optimizer step. "
                "Accumulating gradients over several batches before one step would clip sums of examples "
                "rather than each example (sum-then-clip breaks the sensitivity bound). Call optimizer.step() "
                "(or optimizer.zero_grad()) after each batch."
            )
        recorded = self.batch_size()
        batch = recorded or 0
        device = self.params[0].device if self.params else torch.device("cpu")
        acc = Norms(batch, device)
        scale = float(batch) if self.loss_reduction == "mean" else 1.0
        active = {u for u in self.units if batch and live[u]}
        try:
            for u in self.units:
                if u in active:
                    u.prepare(live[u], batch, scale, acc)
            for p in self.params:  # tied parameters: ‖Σ_u G_u‖² = Σ_u ‖G_u‖² + 2 Σ_{u<v} ⟨G_u, G_v⟩
                uses = [(u, n) for u, n in self._uses[id(p)] if u in active]
                for i in range(len(uses)):
                    for j in range(i + 1, len(uses)):
                        (u1, n1), (u2, n2) = uses[i], uses[j]
                        acc.add(inner(u1.rep(n1), u2.rep(n2), p.shape), 0.0, 2.0)
            norms = acc.sq.clamp(min=0.0).sqrt()  # cross terms may round a zero norm below 0
            # ‖g‖² >= computed·(1 − η) ⇒ shrinking C by a margin >= η keeps ‖c·g‖ <= C
            self.last_margin = max(CLIP_MARGIN, 1.01 * acc.eta + 2.0**-50)
            c = torch.clamp(max_grad_norm * (1.0 - self.last_margin) / norms, max=1.0)
            finite = torch.isfinite(norms)
            if not bool(finite.all()):  # a non-finite gradient contributes nothing (not NaN·0)
                c = torch.where(finite, c, torch.zeros_like(c))
                for u in active:
                    u.mask(finite)
            total: dict[int, torch.Tensor] = {}
            for u in self.units:
                if u in active:
                    got = u.clipped_sums(c, dtype)
                else:
                    got = [torch.zeros(p.shape, dtype=dtype, device=p.device) for _, p in u.params]
                for (_, p), s in zip(u.params, got, strict=True):
                    total[id(p)] = total[id(p)] + s if id(p) in total else s
            sums = [total[id(p)] for p in self.params]
        finally:
            self.clear()
        return sums, recorded, norms

    def describe(self) -> list[tuple[str, str, int]]:
        """(unit name, path kind, number of trainable values) per unit (a tied parameter is
        counted in each unit that uses it)."""
        return [(u.name, u.kind, sum(p.numel() for _, p in u.params)) for u in self.units]


# ------------------------------------------------------------------------------------------------
# Which unit a module gets
# ------------------------------------------------------------------------------------------------


def _fast_unit_type(m: nn.Module) -> type[Unit] | None:
    if type(m) is nn.Linear or (isinstance(m, nn.Linear) and type(m).forward is nn.Linear.forward):
        return LinearUnit
    conv1d = hf_conv1d_class(m)
    if conv1d is not None and type(m).forward is conv1d.forward and getattr(m, "weight", None) is not None:
        return HFConv1DUnit
    if ConvUnit.supports(m) and type(m).forward in (nn.Conv1d.forward, nn.Conv2d.forward):
        return ConvUnit
    if EmbeddingUnit.supports(m) and type(m).forward is nn.Embedding.forward:
        return EmbeddingUnit
    if NormUnit.supports(m):
        return NormUnit
    if AttentionUnit.supports(m):
        return AttentionUnit
    return None


def owns_its_subtree(m: nn.Module) -> bool:
    """Modules that use their submodules' parameters without calling them (so the submodules'
    hooks never run): nn.MultiheadAttention passes ``out_proj.weight`` to a function, and a
    module holding trainable parameters in an nn.ParameterList / nn.ParameterDict (a container
    that is never called; peft's LoRA embeddings) uses them in its own forward."""
    if isinstance(m, nn.MultiheadAttention):
        return True
    return any(
        isinstance(c, (nn.ParameterList, nn.ParameterDict)) and any(p.requires_grad for p in c.parameters())
        for c in m.children()
    )
