"""dpkit.torch.make_private: accounting, noise, stopping, and bad input.

Statistical checks: the noise-scale tests compare the sample standard deviation of 10,100
noise coordinates with the stated σ·C at ±6 standard errors (a correct sampler fails with
probability below 1e-8); every test uses a fixed seed, so it passes or fails deterministically.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, IterableDataset, TensorDataset  # noqa: E402

from _stats import CountingSource  # noqa: E402
from dpkit.accounting import (  # noqa: E402
    GaussianEvent,
    PLDAccountant,
    PoissonSampledEvent,
    RDPAccountant,
    SampledWithoutReplacementEvent,
    SelfComposedEvent,
    dp_sgd_event,
)
from dpkit.budget import Budget  # noqa: E402
from dpkit.errors import BudgetExceededError, DPError, InvalidDataError, InvalidParameterError  # noqa: E402
from dpkit.torch import DPOptimizer, make_private  # noqa: E402
from dpkit.torch.optimizer import LATTICE_DELTA_SHARE  # noqa: E402

SEED = 20240611
N, BATCH = 400, 40


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: one torch thread (conftest.py)


def dataset(n: int = N, d: int = 4) -> TensorDataset:
    g = torch.Generator().manual_seed(SEED)
    x = torch.randn(n, d, generator=g)
    return TensorDataset(x, (x[:, 0] > 0).long())


def setup(**kwargs):
    model = kwargs.pop("model", None) or nn.Linear(4, 2)
    loader = kwargs.pop("loader", None) or DataLoader(dataset(), batch_size=BATCH)
    opt = torch.optim.SGD(model.parameters(), lr=kwargs.pop("lr", 0.1))
    kwargs.setdefault("delta", 1e-5)
    kwargs.setdefault("epochs", 2)
    kwargs.setdefault("max_grad_norm", 1.0)
    if "epsilon" not in kwargs:
        kwargs.setdefault("noise_multiplier", 1.0)
    kwargs.setdefault("rng", np.random.default_rng(SEED))
    return make_private(model, opt, loader, **kwargs)


def one_step(private) -> None:
    model, opt, loader = private
    x, y = next(iter(loader))
    opt.zero_grad()
    nn.CrossEntropyLoss()(model(x), y).backward()
    opt.step()


# -- events and accounting ---------------------------------------------------------------------


def test_step_event_is_the_sampler_and_noise_actually_used() -> None:
    private = setup(noise_multiplier=1.3)
    opt = private.optimizer
    q = opt.sampler.sample_rate
    assert q == BATCH / N
    assert opt.step_event == PoissonSampledEvent(q, GaussianEvent(1.3))
    assert opt.expected_batch_size == pytest.approx(BATCH)
    # the noise actually drawn has standard deviation σ·C (the lattice adds ~2^-40 relative)
    assert opt.noise_std >= 1.3 * 1.0
    assert opt.noise_std == pytest.approx(1.3, rel=1e-9)
    assert opt.noise.effective_noise_multiplier >= 1.3
    for _ in range(3):
        one_step(private)
    assert opt.steps == 3
    assert opt.event == SelfComposedEvent(opt.step_event, 3)
    # ε is dpkit's accountant on exactly that event (at δ·(1 − 2^-20) for lattice noise)
    want = RDPAccountant().compose(dp_sgd_event(1.3, q, 3)).get_epsilon(1e-5 * (1 - LATTICE_DELTA_SHARE))
    assert opt.get_epsilon() == want == private.epsilon
    assert opt.get_epsilon(1e-3) < opt.get_epsilon(1e-6)


def test_fixed_size_batches_are_accounted_as_sampling_without_replacement() -> None:
    private = setup(poisson_sampling=False, noise_multiplier=2.0)
    opt, loader = private.optimizer, private.data_loader
    assert opt.step_event == SampledWithoutReplacementEvent(N, BATCH, GaussianEvent(1.0, neighbours="replace"))
    assert [len(y) for _, y in loader] == [BATCH] * (N // BATCH)
    one_step(private)
    want = RDPAccountant(neighbours="replace").compose(opt.step_event).get_epsilon(1e-5 * (1 - LATTICE_DELTA_SHARE))
    assert opt.epsilon == want
    with pytest.raises(InvalidParameterError, match="accountant"):
        setup(poisson_sampling=False, accountant="pld")


def test_pld_accountant() -> None:
    private = setup(accountant="pld", noise="continuous", noise_multiplier=1.0)
    one_step(private)
    want = PLDAccountant().compose(private.optimizer.step_event).get_epsilon(1e-5)
    assert private.optimizer.epsilon == want


def test_calibration_meets_the_target_and_stops_training_there() -> None:
    private = setup(epsilon=2.0, epochs=2)
    opt = private.optimizer
    planned = 2 * (N // BATCH)
    acc_delta = 1e-5 * (1 - LATTICE_DELTA_SHARE)
    eps_planned = RDPAccountant().compose(opt.step_event, count=planned).get_epsilon(acc_delta)
    assert 1.95 < eps_planned <= 2.0  # tight: the calibration bisects to 0.5%
    assert opt.max_steps >= planned
    assert RDPAccountant().compose(opt.step_event, count=opt.max_steps).get_epsilon(acc_delta) <= 2.0
    assert RDPAccountant().compose(opt.step_event, count=opt.max_steps + 1).get_epsilon(acc_delta) > 2.0
    report = private.train(nn.CrossEntropyLoss(), epochs=100, progress=False)
    assert report.steps == opt.max_steps == opt.steps
    assert report.stopped is not None and "target ε=2.0" in report.stopped
    assert report.epsilon <= 2.0
    weights = [p.detach().clone() for p in private.module.parameters()]
    with pytest.raises(BudgetExceededError, match="would bring ε to"):
        one_step(private)
    assert opt.steps == opt.max_steps  # the refused step paid nothing
    assert all(
        torch.equal(a, b) for a, b in zip(weights, private.module.parameters(), strict=True)
    )  # and released nothing


def test_budget_is_charged_before_each_step_and_stops_training() -> None:
    budget = Budget(epsilon=1.0, delta=1e-5, accountant=RDPAccountant)
    private = setup(noise_multiplier=2.0, budget=budget)
    step = private.optimizer.step_event
    allowed = max(k for k in range(1, 200) if RDPAccountant().compose(step, count=k).get_epsilon(1e-5) <= 1.0)
    assert allowed == 11
    report = private.train(nn.CrossEntropyLoss(), epochs=50, progress=False)
    assert report.steps == allowed
    assert "privacy budget exceeded" in report.stopped
    assert budget.events == (step,) * allowed
    assert budget.spent[0] <= 1.0


def test_budget_that_cannot_price_gaussian_noise_is_refused_up_front() -> None:
    with pytest.raises(InvalidParameterError):
        setup(budget=Budget(epsilon=1.0, delta=1e-5))  # basic composition: no Gaussian events


def test_checkpoint_cannot_make_the_accountant_forget() -> None:
    private = setup()
    one_step(private)
    state = private.optimizer.state_dict()
    one_step(private)
    private.optimizer.load_state_dict(state)
    assert private.optimizer.steps == 2
    fresh = setup()
    fresh.optimizer.load_state_dict(state)
    assert fresh.optimizer.steps == 1


# -- noise -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("noise", ["lattice", "continuous"])
def test_noise_scale_and_expected_batch_size_division(noise: str) -> None:
    """No signal (loss·0): the applied gradient is noise / (q·N) with std σ·C."""
    model = nn.Linear(100, 100)  # 10,100 coordinates
    loader = DataLoader(TensorDataset(torch.randn(N, 100), torch.zeros(N)), batch_size=BATCH)
    private = setup(model=model, loader=loader, noise=noise, noise_multiplier=0.7, max_grad_norm=3.0)
    opt = private.optimizer
    x, _ = next(iter(private.data_loader))
    (model(x).sum() * 0.0).backward()
    grads = opt.private_gradient()
    flat = torch.cat([g.reshape(-1) for g in grads]).double() * opt.expected_batch_size
    sd = float(flat.std())
    se = 0.7 * 3.0 / math.sqrt(2 * (flat.numel() - 1))
    assert abs(sd - opt.noise_std) < 6 * se
    assert abs(float(flat.mean())) < 6 * 0.7 * 3.0 / math.sqrt(flat.numel())
    if noise == "lattice":
        assert float(opt.noise.lattice_sigma) * opt.noise.lattice.granularity >= 0.7 * 3.0


def test_lattice_release_is_on_the_lattice() -> None:
    model = nn.Linear(10, 10)
    loader = DataLoader(TensorDataset(torch.randn(N, 10), torch.zeros(N, dtype=torch.long)), batch_size=BATCH)
    private = setup(model=model, loader=loader, noise_multiplier=1.0)
    opt = private.optimizer
    flat = torch.randn(110, dtype=torch.float64)
    released = opt.noise.release(flat.clone(), CountingSource(1))
    k = released / opt.noise.lattice.granularity
    assert torch.equal(k, torch.round(k))


def test_expected_batch_size_divides_the_sum_not_the_actual_size() -> None:
    """loss = Σ_i w·x_i with x_i = 1: every example's gradient is 1, the clipped sum is B, and
    the applied gradient is (B + noise)/(q·N) — not (B + noise)/B."""
    model = nn.Linear(1, 1, bias=False)
    loader = DataLoader(TensorDataset(torch.ones(N, 1), torch.zeros(N)), batch_size=BATCH)
    private = setup(model=model, loader=loader, noise_multiplier=1e-6, loss_reduction="sum", max_grad_norm=10.0)
    opt = private.optimizer
    sizes = []
    for x, _ in private.data_loader:
        opt.zero_grad()
        model(x).sum().backward()
        (g,) = opt.private_gradient()
        sizes.append(len(x))
        assert float(g) == pytest.approx(len(x) / opt.expected_batch_size, abs=1e-4)
    assert len(set(sizes)) > 1  # Poisson batches vary in size


def test_empty_poisson_batch_still_steps_with_noise_only() -> None:
    loader = DataLoader(dataset(), batch_size=1)
    private = setup(loader=loader, rng=np.random.default_rng(5))
    model, opt, loader = private
    empties = 0
    for x, y in loader:
        assert x.shape[1:] == (4,)
        opt.zero_grad()
        out = model(x)
        nn.CrossEntropyLoss(reduction="sum")(out, y).backward()
        opt.step()
        empties += len(x) == 0
        if empties:
            break
    assert empties == 1
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_seeded_runs_reproduce_and_secure_runs_differ() -> None:
    def run(rng):
        torch.manual_seed(0)
        private = setup(model=nn.Linear(4, 2), rng=rng)
        one_step(private)
        return torch.cat([p.detach().reshape(-1) for p in private.module.parameters()])

    assert torch.equal(run(np.random.default_rng(1)), run(np.random.default_rng(1)))
    assert not torch.equal(run(None), run(None))


# -- bad input -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"noise_multiplier": None}, InvalidParameterError, "exactly one"),
        ({"noise_multiplier": 1.0, "epsilon": 1.0}, InvalidParameterError, "exactly one"),
        ({"delta": 0.0}, InvalidParameterError, "delta"),
        ({"delta": 1.0}, InvalidParameterError, "delta"),
        ({"delta": -1e-5}, InvalidParameterError, "delta"),
        ({"delta": float("nan")}, InvalidParameterError, "delta"),
        ({"max_grad_norm": 0.0}, InvalidParameterError, "max_grad_norm"),
        ({"max_grad_norm": -1.0}, InvalidParameterError, "max_grad_norm"),
        ({"max_grad_norm": float("inf")}, InvalidParameterError, "max_grad_norm"),
        ({"noise_multiplier": 0.0}, InvalidParameterError, "noise_multiplier"),
        ({"noise_multiplier": None, "epsilon": -1.0}, InvalidParameterError, "epsilon"),
        ({"epochs": 0}, InvalidParameterError, "epochs"),
        ({"accountant": "moments"}, InvalidParameterError, "accountant"),
        ({"noise": "gaussian"}, InvalidParameterError, "noise"),
        ({"grad_mode": "hooks"}, InvalidParameterError, "grad_mode"),
        ({"loss_reduction": "none"}, InvalidParameterError, "loss_reduction"),
        ({"poisson_sampling": "yes"}, InvalidParameterError, "poisson_sampling"),
        ({"budget": 1.0}, InvalidParameterError, "budget"),
        ({"rng": 42}, InvalidParameterError, "rng"),
    ],
)
def test_bad_parameters_raise_dpkit_errors_and_touch_nothing(kwargs, error, match) -> None:
    model = nn.Linear(4, 2)
    src = CountingSource(0)
    kwargs.setdefault("rng", src)
    with pytest.raises(error, match=match):
        setup(model=model, **kwargs)
    assert src.calls == 0
    assert all(p.requires_grad for p in model.parameters())
    assert not model._forward_hooks and not model._forward_pre_hooks


def test_bad_objects_raise_dpkit_errors() -> None:
    model = nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(dataset(), batch_size=BATCH)
    common = {"noise_multiplier": 1.0, "delta": 1e-5, "epochs": 1, "max_grad_norm": 1.0}
    with pytest.raises(InvalidParameterError, match="DataLoader"):
        make_private(model, opt, list(dataset()), **common)
    with pytest.raises(InvalidParameterError, match="Optimizer"):
        make_private(model, "sgd", loader, **common)
    with pytest.raises(InvalidParameterError, match="nn.Module"):
        make_private(lambda x: x, opt, loader, **common)
    other = nn.Linear(4, 2)
    with pytest.raises(InvalidParameterError, match="not in module"):
        make_private(model, torch.optim.SGD(other.parameters(), lr=0.1), loader, **common)

    class Stream(IterableDataset):
        def __iter__(self):
            yield from dataset()

    with pytest.raises(InvalidDataError, match="map-style"):
        make_private(model, opt, DataLoader(Stream(), batch_size=4), **common)
    with pytest.raises(InvalidParameterError, match="batch_size"):
        make_private(model, opt, DataLoader(dataset(), batch_size=None), **common)
    with pytest.warns(UserWarning, match="1/N"):
        make_private(model, opt, loader, **{**common, "delta": 0.01})
    with pytest.raises(InvalidParameterError, match="not already private"):
        make_private(nn.Linear(4, 2), DPOptimizer.__new__(DPOptimizer), loader, **common)


@pytest.mark.parametrize(
    "norm", [nn.BatchNorm1d(8), nn.BatchNorm2d(8), nn.SyncBatchNorm(8), nn.InstanceNorm1d(8, track_running_stats=True)]
)
def test_layers_that_mix_examples_are_refused_with_the_fix(norm) -> None:
    model = nn.Sequential()
    model.add_module("fc", nn.Linear(4, 8))
    model.add_module("bn", norm)
    model.add_module("out", nn.Linear(8, 2))
    with pytest.raises(InvalidParameterError, match="'bn'") as info:
        setup(model=model)
    assert "GroupNorm" in str(info.value)
    assert type(norm).__name__ in str(info.value)


def test_batch_first_is_required() -> None:
    class Rnn(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.rnn = nn.GRU(4, 3)

        def forward(self, x):
            return self.rnn(x)[0][:, -1]

    with pytest.raises(InvalidParameterError, match="batch_first=True"):
        setup(model=Rnn())


def test_a_batch_that_did_not_come_from_the_private_loader_is_refused() -> None:
    private = setup()
    model, opt, loader = private
    next(iter(loader))
    x = torch.randn(BATCH + 7, 4)
    nn.CrossEntropyLoss()(model(x), torch.zeros(len(x), dtype=torch.long)).backward()
    with pytest.raises(InvalidDataError, match="private data loader"):
        opt.step()
    assert opt.steps == 0


def test_step_without_backward_is_an_error_unless_the_batch_was_empty() -> None:
    private = setup()
    _, opt, loader = private
    next(iter(loader))
    with pytest.raises(DPError):
        opt.step()


def test_lr_scheduler_and_detach() -> None:
    private = setup()
    sched = torch.optim.lr_scheduler.StepLR(private.optimizer, step_size=1, gamma=0.5)
    one_step(private)
    sched.step()
    assert private.optimizer.param_groups[0]["lr"] == pytest.approx(0.05)
    module = private.detach()
    assert all(p.requires_grad for p in module.parameters())
    assert not module._forward_hooks


def test_continuous_noise_is_gaussian_and_not_truncated_like_float32_randn() -> None:
    """Box–Muller on 53-bit uniforms from the source: N(0, s²) by a KS test (200,000 draws,
    α = 1e-6), and the extreme word gives a radius of √(2·ln 2^54) ≈ 8.65, far beyond the
    5.77σ at which float32 torch.randn stops."""
    from scipy import stats

    from dpkit.torch.noise import gaussian

    for dtype in (torch.float64, torch.float32):
        z = gaussian(200_001, CountingSource(SEED), scale=2.5, dtype=dtype).double().numpy()
        assert z.shape == (200_001,)
        assert stats.kstest(z / 2.5, "norm").pvalue > 1e-6

    class Zeros:
        def words(self, n):
            return np.zeros(n, dtype=np.uint64)

    extreme = gaussian(2, Zeros())
    assert extreme[0] == pytest.approx(math.sqrt(-2 * math.log(0.5 * 2.0**-53)))
    assert extreme[0] > 8.6
