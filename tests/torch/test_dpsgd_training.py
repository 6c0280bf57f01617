"""End to end: DP-SGD learns at a large ε, with either gradient path and either noise, through
the user's own loop and through ``PrivateTraining.train``. Fixed seeds; the task (two Gaussian
blobs 3 standard deviations apart, Bayes accuracy ≈ 93%) is easy enough that the accuracy bars
leave a wide margin."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from dpkit.torch import make_private  # noqa: E402

SEED = 99


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: one torch thread (conftest.py)


def blobs(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 2, (n,), generator=g)
    x = torch.randn(n, 8, generator=g)
    x[:, 0] += 3.0 * y - 1.5
    return x, y


def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    with torch.no_grad():
        return float((model(x).argmax(1) == y).float().mean())


@pytest.mark.parametrize("grad_mode, noise", [("fast", "lattice"), ("vmap", "continuous")])
def test_learns_at_large_epsilon_with_the_users_loop(grad_mode: str, noise: str) -> None:
    torch.manual_seed(SEED)
    x, y = blobs(2000, SEED)
    xt, yt = blobs(1000, SEED + 1)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    assert accuracy(model, xt, yt) < 0.8
    private = make_private(
        model,
        torch.optim.SGD(model.parameters(), lr=0.5),
        DataLoader(TensorDataset(x, y), batch_size=100),
        epsilon=8.0,
        delta=1e-5,
        epochs=3,
        max_grad_norm=1.0,
        grad_mode=grad_mode,
        noise=noise,
        rng=np.random.default_rng(SEED),
    )
    model, opt, loader = private
    loss_fn = nn.CrossEntropyLoss()
    for _ in range(3):
        for xb, yb in loader:
            opt.zero_grad()
            loss_fn(model(xb), yb).backward()
            opt.step()
    assert opt.steps == 60
    assert 7.5 < opt.epsilon <= 8.0
    assert accuracy(model, xt, yt) > 0.88


def test_train_helper_reports_epsilon_per_epoch() -> None:
    torch.manual_seed(SEED)
    x, y = blobs(1000, SEED)
    model = nn.Sequential(nn.Linear(8, 2))
    private = make_private(
        model,
        torch.optim.SGD(model.parameters(), lr=0.5),
        DataLoader(TensorDataset(x, y), batch_size=50),
        epsilon=4.0,
        delta=1e-5,
        epochs=2,
        max_grad_norm=1.0,
        rng=np.random.default_rng(SEED),
    )
    seen = []
    report = private.train(nn.CrossEntropyLoss(), progress=True, on_step=lambda s, loss, eps: seen.append((s, eps)))
    assert report.epochs_completed == 2 and report.stopped is None
    assert report.steps == 40 == len(seen)
    assert [s for s, _ in seen] == list(range(1, 41))
    eps = [e for _, e in seen]
    assert eps == sorted(eps) and eps[-1] == report.epsilon == report.epsilons[-1] <= 4.0
    assert report.losses[1] < report.losses[0]
