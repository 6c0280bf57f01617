"""Virtual batches: a Poisson logical batch drawn whole, processed as physical batches of at most
``max_physical_batch_size`` examples, each example clipped on its own, the noise added once per
logical batch, one optimizer step per logical batch. Every test uses a fixed seed.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from dpkit.accounting import SelfComposedEvent  # noqa: E402
from dpkit.errors import DPError, InvalidParameterError  # noqa: E402
from dpkit.torch import PoissonBatchSampler, UniformBatchSampler, make_private  # noqa: E402
from dpkit.torch.sampling import Chunk  # noqa: E402

SEED = 20240917
N, BATCH = 400, 40


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: one torch thread (conftest.py)


def dataset(n: int = N, d: int = 6) -> TensorDataset:
    g = torch.Generator().manual_seed(SEED)
    x = torch.randn(n, d, generator=g)
    return TensorDataset(x, (x[:, 0] + x[:, 1] > 0).long())


def mlp() -> nn.Module:
    torch.manual_seed(7)
    # Linear layers take the ghost-clipping path; the LayerNorm is a torch.func (vmap) unit.
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.LayerNorm(16), nn.Linear(16, 2))


def setup(k: int | None, *, model: nn.Module | None = None, batch: int = BATCH, seed: int = SEED, **kwargs):
    model = model if model is not None else mlp()
    opt = torch.optim.SGD(model.parameters(), lr=kwargs.pop("lr", 0.5))
    kwargs.setdefault("noise_multiplier", 1.0)
    return make_private(
        model,
        opt,
        DataLoader(kwargs.pop("data", None) or dataset(), batch_size=batch),
        delta=1e-5,
        epochs=kwargs.pop("epochs", 1),
        max_grad_norm=kwargs.pop("max_grad_norm", 1.0),
        rng=np.random.default_rng(seed),
        max_physical_batch_size=k,
        **kwargs,
    )


def run_epoch(private, loss_fn=None) -> tuple[list[list[torch.Tensor]], list[int]]:
    """The user's loop over one pass of the loader: the released gradients and the physical
    batch sizes the model saw."""
    model, opt, loader = private
    loss_fn = loss_fn or nn.CrossEntropyLoss()
    released, seen = [], []
    for x, y in loader:
        opt.zero_grad()
        seen.append(len(x))
        loss_fn(model(x), y).backward()
        grads = opt.private_gradient()
        if grads is not None:
            released.append(grads)
            for p, g in zip(opt.engine.params, grads, strict=True):
                p.grad = g
            opt.original_optimizer.step()
    return released, seen


# -- the sampler ---------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", [PoissonBatchSampler, UniformBatchSampler])
def test_the_logical_batch_is_drawn_whole_then_cut_into_physical_batches(kind) -> None:
    plain = kind(population=500, batch_size=60, steps_per_epoch=20, rng=np.random.default_rng(SEED))
    cut = kind(
        population=500, batch_size=60, steps_per_epoch=20, rng=np.random.default_rng(SEED), max_physical_batch_size=16
    )
    logical = list(plain)
    physical, tags = [], []
    for part in cut:
        physical.append(part)
        tags.extend(cut.take_chunks(all_pending=True))
    assert len(tags) == len(physical) and cut.batches_drawn == plain.batches_drawn == 20
    assert all(len(p) <= 16 for p in physical)
    rebuilt: dict[int, list[int]] = {}
    for part, tag in zip(physical, tags, strict=True):
        assert tag.size == len(part)
        rebuilt.setdefault(tag.step, []).extend(part)
    assert [rebuilt[s] for s in sorted(rebuilt)] == logical  # the same draws, in the same order
    for step in rebuilt:
        mine = [t for t in tags if t.step == step]
        assert [t.index for t in mine] == list(range(len(mine)))
        assert all(t.count == len(mine) == max(1, math.ceil(len(rebuilt[step]) / 16)) for t in mine)
        assert [t.last for t in mine] == [False] * (len(mine) - 1) + [True]
    assert cut.step_event(1.3) == plain.step_event(1.3)  # accounting unchanged


def test_an_empty_logical_batch_is_one_empty_physical_batch() -> None:
    s = PoissonBatchSampler(
        population=1000, batch_size=1, steps_per_epoch=50, rng=np.random.default_rng(SEED), max_physical_batch_size=4
    )
    parts = list(s)
    tags = s.take_chunks(all_pending=True)
    empties = [t for t in tags if t.size == 0]
    assert empties and all(t.count == 1 and t.last for t in empties)
    assert sum(1 for t in tags if t.last) == 50 == len(parts)  # about 1 example per batch: one physical each


def test_sampler_validation() -> None:
    for bad in (0, -3, 2.5, True):
        with pytest.raises(InvalidParameterError, match="max_physical_batch_size"):
            PoissonBatchSampler(population=10, batch_size=2, steps_per_epoch=1, max_physical_batch_size=bad)


# -- the release ---------------------------------------------------------------------------------


@pytest.mark.parametrize("noise", ["lattice", "continuous"])
@pytest.mark.parametrize("k", [1, 7, 32])
def test_the_released_update_is_the_one_without_virtual_batches(k: int, noise: str) -> None:
    """Same seed: the same logical batches and the same noise words; per-example clipping in
    physical batches of at most k gives the released gradients of one pass over each logical
    batch, to float rounding, at every one of the ten steps of an epoch."""
    whole = setup(None, noise=noise)
    split = setup(k, noise=noise)
    want, seen_whole = run_epoch(whole)
    got, seen = run_epoch(split)
    assert len(got) == len(want) == len(whole.data_loader) == 10
    assert max(seen) <= k < max(seen_whole)
    assert len(seen) > len(seen_whole)
    for g_step, w_step in zip(got, want, strict=True):
        for g, w in zip(g_step, w_step, strict=True):
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)
    for p, q in zip(split.module.parameters(), whole.module.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-5)
    assert split.optimizer.steps == whole.optimizer.steps == 10
    assert split.epsilon == whole.epsilon


def test_each_example_is_clipped_not_each_physical_batch() -> None:
    """loss = Σ_i 10·w·x_i with x_i = 1: every example's gradient is 10, clipped to C = 1, so the
    clipped sum is the logical batch size B. Clipping a physical batch's summed gradient would
    give at most the number of physical batches."""
    model = nn.Linear(1, 1, bias=False)
    data = TensorDataset(torch.ones(N, 1), torch.zeros(N))
    private = setup(4, model=model, data=data, noise_multiplier=1e-6, loss_reduction="sum")
    _, opt, loader = private
    sizes, parts = [], 0
    for x, _ in loader:
        opt.zero_grad()
        (10.0 * model(x)).sum().backward()
        parts += 1
        grads = opt.private_gradient()
        sizes.append(len(x))
        if grads is not None:
            (g,) = grads
            clip = 1.0 * (1.0 - opt.engine.last_margin)
            assert float(g) * opt.expected_batch_size == pytest.approx(sum(sizes) * clip, abs=1e-3)
            assert sum(sizes) > 4 * len(sizes) - 4  # several full physical batches
            sizes = []
    assert parts > opt.steps == len(loader)


def test_optimizer_steps_equal_logical_steps_and_accounting_is_unchanged() -> None:
    whole = setup(None, epochs=2)
    split = setup(8, epochs=2)
    inner_steps = []
    split.optimizer.original_optimizer.register_step_post_hook(lambda *_: inner_steps.append(1))
    physical = 0
    for _ in range(2):
        model, opt, loader = split
        for x, y in loader:
            opt.zero_grad()
            nn.CrossEntropyLoss()(model(x), y).backward()
            opt.step()
            physical += 1
    assert opt.steps == len(inner_steps) == 2 * len(loader) == 20 < physical
    assert opt.event == SelfComposedEvent(opt.step_event, 20)
    assert opt.step_event == whole.optimizer.step_event
    assert opt.sample_rate == whole.optimizer.sample_rate == BATCH / N
    assert opt.expected_batch_size == whole.optimizer.expected_batch_size


def test_an_empty_logical_batch_still_draws_noise_and_steps_once() -> None:
    """batch_size=1 of 400: about a third of the logical batches are empty; each is one empty physical batch,
    released with noise only (no forward pass needed)."""
    model = nn.Linear(6, 2)
    private = setup(3, model=model, batch=1, loss_reduction="sum")
    _, opt, loader = private
    empties = 0
    for x, y in loader:
        before = [p.detach().clone() for p in model.parameters()]
        steps = opt.steps
        opt.zero_grad()
        if len(x):
            nn.CrossEntropyLoss(reduction="sum")(model(x), y).backward()
        opt.step()
        if len(x) == 0:
            empties += 1
            assert opt.released and opt.steps == steps + 1
            assert all(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    assert empties > 100 and opt.steps == len(loader) == N  # P(empty) = (1 − 1/N)^N ≈ e^-1


def test_zero_grad_between_physical_batches_keeps_the_partial_sum() -> None:
    """The user's loop calls zero_grad() before every physical batch; that must not drop the
    clipped gradients added so far (or every release would hold only the last physical batch)."""
    model = nn.Linear(1, 1, bias=False)
    data = TensorDataset(torch.ones(N, 1), torch.zeros(N))
    private = setup(2, model=model, data=data, noise_multiplier=1e-6, loss_reduction="sum")
    _, opt, loader = private
    total = 0
    for x, _ in loader:
        opt.zero_grad()
        opt.zero_grad()
        (5.0 * model(x)).sum().backward()
        total += len(x)
        grads = opt.private_gradient()
        if grads is not None:
            assert float(grads[0]) * opt.expected_batch_size == pytest.approx(total, rel=1e-4, abs=1e-3)
            return


def test_train_helper_counts_logical_steps() -> None:
    private = setup(5, epochs=2)
    calls = []
    report = private.train(nn.CrossEntropyLoss(), progress=False, on_step=lambda s, loss, e: calls.append(s))
    assert report.steps == private.optimizer.steps == 20 == len(calls)
    assert calls == list(range(1, 21))
    assert report.epsilon == private.epsilon and len(report.losses) == 2


# -- misuse --------------------------------------------------------------------------------------


def test_two_passes_before_a_step_are_still_refused() -> None:
    """The pitfall stays impossible: physical batches are added up only as clipped examples,
    each after its own step(); two backward passes before one step are refused as before."""
    private = setup(4)
    model, opt, loader = private
    it = iter(loader)
    x, y = next(it)
    for _ in range(2):
        nn.CrossEntropyLoss()(model(x), y).backward()
    with pytest.raises(DPError, match="sum-then-clip"):
        opt.step()
    assert opt.steps == 0


def test_a_skipped_physical_batch_is_refused_and_nothing_is_released() -> None:
    private = setup(4)
    model, opt, loader = private
    it = iter(loader)
    x, y = next(it)
    nn.CrossEntropyLoss()(model(x), y).backward()
    assert opt.private_gradient() is None  # physical batch 1 of about 10
    next(it)  # physical batch 2, never stepped
    x, y = next(it)
    nn.CrossEntropyLoss()(model(x), y).backward()
    with pytest.raises(DPError, match="in order"):
        opt.step()
    assert opt.steps == 0 and not opt.released
    assert all(p.grad is None for p in model.parameters())


def test_a_foreign_batch_in_the_middle_of_a_logical_batch_is_refused() -> None:
    private = setup(4)
    model, opt, loader = private
    x, y = next(iter(loader))
    nn.CrossEntropyLoss()(model(x), y).backward()
    opt.step()
    nn.CrossEntropyLoss()(model(torch.randn(3, 6)), torch.zeros(3, dtype=torch.long)).backward()
    with pytest.raises(DPError, match="did not come from the private data loader"):
        opt.step()
    assert opt.steps == 0


def test_an_abandoned_logical_batch_is_dropped_with_a_warning() -> None:
    private = setup(4)
    model, opt, loader = private
    for x, y in loader:  # the user breaks after one physical batch
        nn.CrossEntropyLoss()(model(x), y).backward()
        opt.step()
        break
    with pytest.warns(UserWarning, match="abandoned"):
        for x, y in loader:
            opt.zero_grad()
            nn.CrossEntropyLoss()(model(x), y).backward()
            opt.step()
            if opt.released:
                break
    assert opt.steps == 1


def test_chunk_tag() -> None:
    assert Chunk(step=3, index=1, count=2, size=5).last and not Chunk(3, 0, 2, 5).last
