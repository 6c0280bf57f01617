"""Per-example clipping in dpkit.torch against a one-example-at-a-time oracle.

The oracle runs each example through an untouched copy of the model on its own, takes the
gradient with plain autograd, clips it to C and sums in float64. The fast path (ghost clipping /
book-keeping) and the vmap path must both give that sum to ~1e-5, for an MLP, a small CNN, an
embedding + LayerNorm model, sequences (ghost and direct branches), reused layers, frozen
parameters and Conv1d. Deterministic: fixed seeds, no noise involved.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from dpkit.errors import DPError, InvalidParameterError  # noqa: E402
from dpkit.torch import make_private  # noqa: E402
from dpkit.torch.per_example import CLIP_MARGIN  # noqa: E402

MODES = ("fast", "vmap")


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: one torch thread (conftest.py)


class SmallCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 4, 3, 1, padding=1)
        self.conv2 = nn.Conv2d(4, 6, 3, 2)
        self.gn = nn.GroupNorm(2, 6)
        self.fc = nn.Linear(6 * 3 * 3, 3)

    def forward(self, x):
        x = torch.relu_(self.conv1(x))  # in-place after a hooked layer must work
        x = torch.max_pool2d(x, 2, 1)
        x = self.gn(torch.relu(self.conv2(x)))
        return self.fc(x.flatten(1))


class EmbeddingModel(nn.Module):
    def __init__(self, padding_idx=None) -> None:
        super().__init__()
        self.emb = nn.Embedding(12, 5, padding_idx=padding_idx)
        self.ln = nn.LayerNorm(5)
        self.fc = nn.Linear(5, 3)

    def forward(self, idx):
        return self.fc(self.ln(self.emb(idx)).mean(dim=1))


class SequenceModel(nn.Module):
    """Linear layers on (B, T, d): one takes the ghost branch (T small), one the direct branch."""

    def __init__(self, t: int) -> None:
        super().__init__()
        self.t = t
        self.wide = nn.Linear(6, 40)  # T·(6+40) vs 6·40: ghost when T <= 5
        self.narrow = nn.Linear(40, 2)  # T·42 vs 80: direct for T >= 2
        self.head = nn.Linear(2, 3)

    def forward(self, x):
        h = torch.tanh(self.wide(x))
        return self.head(self.narrow(h).sum(dim=1))


class ReusedLayer(nn.Module):
    """The same Linear called twice: the per-example gradient is the sum over both calls."""

    def __init__(self) -> None:
        super().__init__()
        self.shared = nn.Linear(4, 4)
        self.out = nn.Linear(4, 3)

    def forward(self, x):
        return self.out(self.shared(torch.tanh(self.shared(x))))


class ScaledModel(nn.Module):
    """A module that owns a parameter directly: a torch.func unit around a whole subtree."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.tensor([1.5, -0.5, 2.0]))
        self.body = nn.Sequential(nn.Linear(4, 3))

    def forward(self, x):
        return self.body(x) * self.scale


class Conv1dModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv1d(2, 3, 3, stride=2, padding=1, dilation=1)
        self.fc = nn.Linear(3 * 5, 3)

    def forward(self, x):
        return self.fc(torch.relu(self.conv(x)).flatten(1))


def oracle(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, clip: float, margin: float = CLIP_MARGIN
) -> list[torch.Tensor]:
    params = [p for p in model.parameters() if p.requires_grad]
    total = [torch.zeros(p.shape, dtype=torch.float64) for p in params]
    loss_fn = nn.CrossEntropyLoss()
    for i in range(len(x)):
        grads = torch.autograd.grad(loss_fn(model(x[i : i + 1]), y[i : i + 1]), params)
        norm = torch.sqrt(sum((g.double() ** 2).sum() for g in grads))
        c = min(1.0, clip * (1 - margin) / float(norm))
        for t, g in zip(total, grads, strict=True):
            t += c * g.double()
    return total


def _private(model: nn.Module, data: DataLoader) -> Any:
    """``make_private`` with the settings these tests share: SGD, σ = 1, C = 1, one epoch."""
    return make_private(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        data,
        noise_multiplier=1.0,
        delta=1e-5,
        epochs=1,
        max_grad_norm=1.0,
    )


def private_sum(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, clip: float, mode: str
) -> tuple[list[torch.Tensor], float]:
    data = DataLoader(TensorDataset(x, y), batch_size=4)
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    private = make_private(
        model, opt, data, noise_multiplier=1.0, delta=1e-5, epochs=1, max_grad_norm=clip, grad_mode=mode
    )
    nn.CrossEntropyLoss()(model(x), y).backward()
    engine = private.optimizer.engine
    sums, batch, _ = engine.clipped_sum(clip, torch.float64)
    assert batch == len(x)
    assert CLIP_MARGIN <= engine.last_margin <= 2.0**-12
    return sums, engine.last_margin


CASES = {
    "mlp": (lambda: nn.Sequential(nn.Linear(5, 7), nn.ReLU(), nn.Linear(7, 3)), lambda n: torch.randn(n, 5)),
    "cnn": (SmallCNN, lambda n: torch.randn(n, 1, 8, 8)),
    "embedding_layernorm": (EmbeddingModel, lambda n: torch.randint(0, 12, (n, 4))),
    "embedding_padding_idx": (lambda: EmbeddingModel(padding_idx=0), lambda n: torch.randint(0, 4, (n, 6))),
    "sequence_t3": (lambda: SequenceModel(3), lambda n: torch.randn(n, 3, 6)),
    "sequence_t9": (lambda: SequenceModel(9), lambda n: torch.randn(n, 9, 6)),
    "reused_layer": (ReusedLayer, lambda n: torch.randn(n, 4)),
    "owns_parameter": (ScaledModel, lambda n: torch.randn(n, 4)),
    "conv1d": (Conv1dModel, lambda n: torch.randn(n, 2, 10)),
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("clip", [0.05, 100.0])  # most examples clipped / none clipped
def test_clipped_sum_matches_one_example_at_a_time(case: str, mode: str, clip: float) -> None:
    make_model, make_x = CASES[case]
    torch.manual_seed(7)
    model = make_model()
    reference = copy.deepcopy(model)
    x, y = make_x(12), torch.randint(0, 3, (12,))
    got, margin = private_sum(model, x, y, clip, mode)
    want = oracle(reference, x, y, clip, margin)
    assert len(got) == len(want)
    scale = max(float(w.abs().max()) for w in want)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5 * max(scale, 1e-3))


def test_fast_path_is_used_where_promised() -> None:
    model = SmallCNN()
    data = DataLoader(TensorDataset(torch.randn(8, 1, 8, 8), torch.zeros(8, dtype=torch.long)), batch_size=4)
    private = _private(model, data)
    kinds = {name: kind for name, kind, _ in private.optimizer.engine.describe()}
    assert kinds == {"conv1": "fast", "conv2": "fast", "gn": "vmap", "fc": "fast"}


def test_frozen_parameters_get_no_gradient_and_no_noise() -> None:
    torch.manual_seed(3)
    model = nn.Sequential(nn.Linear(5, 7), nn.ReLU(), nn.Linear(7, 3))
    model[0].weight.requires_grad_(False)
    reference = copy.deepcopy(model)
    x, y = torch.randn(10, 5), torch.randint(0, 3, (10,))
    got, margin = private_sum(model, x, y, 0.1, "fast")
    want = oracle(reference, x, y, 0.1, margin)
    assert [tuple(g.shape) for g in got] == [(7,), (3, 7), (3,)]
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-7)
    assert model[0].weight.grad is None


def test_sum_then_clip_is_impossible() -> None:
    """Two forward/backward passes before a step would clip sums of examples: refused."""
    model = nn.Linear(3, 2)
    data = DataLoader(TensorDataset(torch.randn(8, 3), torch.zeros(8, dtype=torch.long)), batch_size=4)
    _, opt, _ = _private(model, data)
    x = torch.randn(4, 3)
    for _ in range(2):
        nn.CrossEntropyLoss()(model(x), torch.zeros(4, dtype=torch.long)).backward()
    with pytest.raises(DPError, match="sum-then-clip"):
        opt.step()
    assert opt.steps == 0


def test_no_unclipped_gradient_is_ever_formed() -> None:
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
    data = DataLoader(TensorDataset(torch.randn(8, 3), torch.zeros(8, dtype=torch.long)), batch_size=4)
    _private(model, data)
    nn.CrossEntropyLoss()(model(torch.randn(4, 3)), torch.zeros(4, dtype=torch.long)).backward()
    assert all(p.grad is None for p in model.parameters())


def test_non_finite_example_contributes_nothing() -> None:
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    reference = copy.deepcopy(model)
    x, y = torch.randn(6, 3), torch.randint(0, 2, (6,))
    x[2, 1] = float("inf")
    data = DataLoader(TensorDataset(x, y), batch_size=3)
    private = _private(model, data)
    nn.CrossEntropyLoss()(model(x), y).backward()
    sums, _, _ = private.optimizer.engine.clipped_sum(1.0, torch.float64)
    keep = torch.tensor([0, 1, 3, 4, 5])
    want = oracle(reference, x[keep], y[keep], 1.0, private.optimizer.engine.last_margin)
    for g, w in zip(sums, want, strict=True):
        assert torch.isfinite(g).all()
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)


def test_randomness_inside_a_recomputed_unit_is_refused() -> None:
    class Noisy(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.ones(3))
            self.drop = nn.Dropout(0.5)

        def forward(self, x):
            return self.drop(x * self.w)

    model = Noisy()
    data = DataLoader(TensorDataset(torch.randn(8, 3), torch.zeros(8, dtype=torch.long)), batch_size=4)
    _, opt, _ = _private(model, data)
    nn.CrossEntropyLoss()(model(torch.randn(4, 3)), torch.zeros(4, dtype=torch.long)).backward()
    with pytest.raises(InvalidParameterError, match="Dropout"):
        opt.step()
