"""DP-SGD for PyTorch (optional extra: ``pip install 'dpkit[torch]'``).

>>> import dpkit.torch as dpt                                   # doctest: +SKIP
>>> model, optimizer, loader = dpt.make_private(
...     model, optimizer, loader, epsilon=3.0, delta=1e-5,
...     epochs=10, max_grad_norm=1.0)                             # doctest: +SKIP
>>> for x, y in loader:                                           # doctest: +SKIP
...     optimizer.zero_grad(); loss_fn(model(x), y).backward(); optimizer.step()
>>> optimizer.epsilon                                             # doctest: +SKIP

- :func:`make_private` — Poisson sampling from the CSPRNG, per-example clipping of the whole
  gradient (ghost clipping / book-keeping for Linear — on sequences too —, Hugging Face Conv1D,
  Conv1d/2d, Embedding, LayerNorm/RMSNorm and MultiheadAttention; torch.func elsewhere; tied
  weights clipped as one parameter; only trainable parameters, so a peft LoRA model trains its
  adapters), exact lattice Gaussian noise, RDP or PLD accounting, a hard stop at the target ε
  or the :class:`dpkit.Budget`; virtual batches (``max_physical_batch_size=``), torch.autocast,
  and DistributedDataParallel (one Poisson sample per step split across ranks, the noise drawn
  once by rank 0). Returns ``PrivateTraining(module, optimizer, data_loader)``;
  ``PrivateTraining.train(loss_fn)`` is a loop with a rich progress bar showing the running ε.
- :class:`PoissonBatchSampler`, :class:`UniformBatchSampler` — the samplers, each of which
  builds its own accounting event.
- :func:`check_module` — refuses layers that mix examples (BatchNorm) with the fix.

Non-goals and limits: gradient accumulation over several batches before a step is refused (it
would clip sums of examples; use ``max_physical_batch_size=``, which clips every example); a
module that draws random numbers inside a unit recomputed by torch.func (Dropout inside a module
that owns parameters directly) is refused; only batch-first layers; gradient checkpointing and
peft's DoRA are refused; tested on CPU (gloo for several processes), not yet on a GPU.
"""

from dpkit.torch.noise import ContinuousNoise, LatticeNoise
from dpkit.torch.optimizer import DPOptimizer
from dpkit.torch.per_example import PerExampleEngine
from dpkit.torch.privacy import PrivateTraining, TrainingReport, make_private
from dpkit.torch.sampling import PoissonBatchSampler, UniformBatchSampler
from dpkit.torch.validation import check_module

__all__ = [
    "make_private",
    "PrivateTraining",
    "TrainingReport",
    "DPOptimizer",
    "PerExampleEngine",
    "PoissonBatchSampler",
    "UniformBatchSampler",
    "LatticeNoise",
    "ContinuousNoise",
    "check_module",
    "FederatedAveraging",
]


def __getattr__(name: str) -> object:
    # Loaded lazily: DP federated averaging lives in its own module (dpkit.torch.federated).
    if name == "FederatedAveraging":
        from dpkit.torch.federated import FederatedAveraging

        return FederatedAveraging
    raise AttributeError(f"module 'dpkit.torch' has no attribute {name!r}")
