"""The per-layer units behind :class:`dpkit.torch.PerExampleEngine`: how each kind of layer
records its activations and output gradients and turns them into per-example gradient norms and
clipped sums.

Ghost clipping and book-keeping for Linear, Conv, Hugging Face's ``Conv1D`` and Embedding layers
and for ``nn.MultiheadAttention``'s projections (Goodfellow 2015, "Efficient per-example gradient
computations"; Li et al. 2022, "Large language models can be strong differentially private
learners"; Bu et al. 2023, "Differentially private optimization on large model at small cost"),
materialised per-example gradients for LayerNorm and RMSNorm (they are (B, d)), ``torch.func``
(vmap of grad) for every other unit. The rounding bounds (η) that the engine's clipping margin
covers are computed here, as in :mod:`dpkit.torch.per_example`.

One module per layer family, each apart because it is read, tested and changed alone:

* :mod:`~dpkit.torch._units.base`: what every unit shares: the engine state it reads
  (:class:`~dpkit.torch._units.base.Recorder`), the hooks that record calls, :class:`Unit`;
* :mod:`~dpkit.torch._units.norms`: squared norms with their rounding bounds, and the shapes of
  a per-example gradient that tied parameters' cross terms are computed from;
* :mod:`~dpkit.torch._units.vmap`: exact per-example gradients of any module by ``torch.func``;
* :mod:`~dpkit.torch._units.matmul`: a layer as a matrix product over positions (ghost norm or
  materialised, book-keeping sums), which :mod:`~dpkit.torch._units.linear`,
  :mod:`~dpkit.torch._units.conv` and :mod:`~dpkit.torch._units.attention` build on;
* :mod:`~dpkit.torch._units.embedding` and :mod:`~dpkit.torch._units.normalisation`.

Which unit a module gets is the engine's choice (:mod:`dpkit.torch.per_example`): the units do
not import the engine, which owns them.
"""
