"""DP federated averaging (dpkit.torch.federated): client-level sensitivity, event/noise
consistency, calibration, learning, validation and paying before training.

Statistical checks: the noise-scale test compares the sample standard deviation of 20,200 noise
coordinates with σ·max_grad_norm at ±6 standard errors (false failure below 1e-8 for a correct sampler);
every test uses a fixed seed, so it passes or fails deterministically.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from _stats import CountingSource  # noqa: E402
from dpkit.accounting import GaussianEvent, PLDAccountant, RDPAccountant, SelfComposedEvent, dp_sgd_event  # noqa: E402
from dpkit.budget import Budget  # noqa: E402
from dpkit.errors import BudgetExceededError, InvalidDataError, InvalidParameterError  # noqa: E402
from dpkit.torch.federated import FederatedAveraging  # noqa: E402

SEED = 20240613
D = 10


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: one torch thread (conftest.py)


def make_clients(n_clients: int = 50, per_client: int = 40, seed: int = SEED):
    """A logistic ground truth, its data split evenly across clients, and a test set."""
    rng = np.random.default_rng(seed)
    w = rng.normal(size=D)

    def draw(n: int):
        X = rng.normal(size=(n, D)).astype(np.float32)
        y = (X @ w + 0.5 * rng.normal(size=n) > 0).astype(np.int64)
        return X, y

    return [draw(per_client) for _ in range(n_clients)], draw(2000)


def fed(clients, **kw):
    torch.manual_seed(0)
    args = dict(
        clients=clients,
        sample_rate=0.5,
        rounds=5,
        local_steps=5,
        local_lr=0.5,
        max_grad_norm=1.0,
        noise_multiplier=1.0,
        delta=1e-5,
        rng=np.random.default_rng(SEED),
    )
    args.update(kw)
    return FederatedAveraging(torch.nn.Linear(D, 2), **args)


def params(model) -> np.ndarray:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy().copy()


# --- sensitivity ------------------------------------------------------------------------------


def test_an_extra_client_moves_the_clipped_sum_by_at_most_max_grad_norm():
    clients, _ = make_clients(n_clients=8)
    # One client with huge features: its raw update is far outside the clipping ball.
    clients.append((clients[0][0] * 1000.0, clients[0][1]))
    f = fed(clients, local_lr=5.0)
    updates = [f._client_update(k) for k in range(len(clients))]
    norms = [float(np.linalg.norm(u)) for u in updates]
    assert max(norms) <= f.max_grad_norm
    assert norms[-1] == pytest.approx(f.max_grad_norm, rel=1e-6)  # the outlier was clipped, not dropped
    g = f.granularity
    base = updates[:-1]
    for extra in updates:
        with_extra = f._lattice_sum(base + [extra])
        without = f._lattice_sum(base)
        diff = (with_extra - without).astype(np.float64)
        # On the lattice: the integer difference is within the sensitivity the noise is calibrated for.
        assert np.linalg.norm(diff) <= float(f._lattice_sensitivity)
        # In model units: at most max_grad_norm plus half a lattice step per coordinate.
        assert np.linalg.norm(diff) * g <= f.max_grad_norm + g * math.sqrt(diff.size) / 2
        # And the float sums (what the lattice sum rounds) differ by the extra update alone.
        assert np.linalg.norm((np.sum(base, axis=0) + extra) - np.sum(base, axis=0)) <= f.max_grad_norm * (1 + 1e-12)


def test_diverging_client_counts_as_zero_update():
    clients, _ = make_clients(n_clients=3)
    f = fed(clients, local_lr=1e38, local_steps=50)
    u = f._client_update(0)
    assert np.all(np.isfinite(u)) and np.linalg.norm(u) <= f.max_grad_norm


# --- event / noise consistency --------------------------------------------------------------


@pytest.mark.parametrize("rate", [0.5, 1.0])
def test_event_matches_the_noise_drawn(rate):
    clients, _ = make_clients(n_clients=10)
    f = fed(clients, sample_rate=rate, rounds=7, noise_multiplier=1.3)
    assert f.event_ == dp_sgd_event(1.3, rate, 7)
    if rate == 1.0:
        assert f.event_ == SelfComposedEvent(GaussianEvent(1.3), 7)
    # The multiplier actually drawn on the lattice is σ, rounded up by a negligible amount.
    assert 1.3 <= f.lattice_noise_multiplier <= 1.3 * (1 + 1e-9)
    # Empirically: the noise added to an empty sum has standard deviation σ·max_grad_norm.
    torch.manual_seed(0)
    big = FederatedAveraging(
        torch.nn.Linear(100, 200),
        clients=[(np.zeros((1, 100), np.float32), np.zeros(1, np.int64))],
        sample_rate=rate,
        rounds=1,
        local_lr=0.1,
        max_grad_norm=2.0,
        noise_multiplier=1.3,
        delta=1e-5,
        rng=np.random.default_rng(SEED),
    )
    noise = big._noisy_sum([])
    assert noise.size == 100 * 200 + 200
    se = 1.0 / math.sqrt(2 * noise.size)  # relative standard error of a sample standard deviation
    assert abs(noise.std() / (1.3 * 2.0) - 1) < 6 * se
    assert abs(noise.mean()) < 6 * 1.3 * 2.0 / math.sqrt(noise.size)
    assert np.all(np.abs(noise / big.granularity - np.rint(noise / big.granularity)) == 0)  # on the lattice


# --- calibration ------------------------------------------------------------------------------


@pytest.mark.parametrize("accountant,factory", [("rdp", RDPAccountant), ("pld", PLDAccountant)])
def test_calibrated_epsilon_is_met(accountant, factory):
    clients, _ = make_clients(n_clients=20)
    f = fed(clients, noise_multiplier=None, epsilon=3.0, rounds=40, sample_rate=0.2, accountant=accountant)
    assert f.epsilon_ <= 3.0
    assert f.epsilon_ > 2.9  # calibration is tight to its 0.5 % tolerance
    # Re-checked independently: a fresh accountant on the recorded event, at the reported δ.
    assert factory().compose(f.event_).get_epsilon(1e-5) <= 3.0
    assert f.event_ == dp_sgd_event(f.noise_multiplier_, 0.2, 40)
    assert f.epsilon_after(40) == f.epsilon_ and f.epsilon_after(10) < f.epsilon_


# --- learning ---------------------------------------------------------------------------------


def test_learns_on_simulated_clients_at_large_epsilon():
    clients, (Xt, yt) = make_clients()
    f = fed(clients, rounds=30, noise_multiplier=0.5, delta=1e-4)
    accuracy = []
    model = f.fit(
        on_round=lambda t, m: accuracy.append(float((m(torch.from_numpy(Xt)).argmax(1).numpy() == yt).mean()))
    )
    assert model is f.model_ and len(accuracy) == 30
    assert accuracy[-1] > 0.9  # the Bayes rate here is about 0.94; chance is about 0.5
    assert f.epsilon_ < 100


def test_seeded_runs_reproduce_and_inputs_are_not_modified():
    clients, _ = make_clients(n_clients=10)
    torch.manual_seed(1)
    original = torch.nn.Linear(D, 2)
    before = params(original)
    runs = []
    for _ in range(2):
        f = FederatedAveraging(
            original,
            clients=clients,
            sample_rate=0.5,
            rounds=3,
            local_epochs=2,
            batch_size=16,
            local_lr=0.5,
            max_grad_norm=1.0,
            noise_multiplier=1.0,
            delta=1e-5,
            rng=np.random.default_rng(3),
        )
        runs.append(params(f.fit()))
    np.testing.assert_array_equal(runs[0], runs[1])
    np.testing.assert_array_equal(params(original), before)  # the passed module was copied
    assert not np.array_equal(runs[0], before)


def test_secure_default_model_factory_and_dataset_clients():
    data = [torch.utils.data.TensorDataset(torch.randn(6, D), torch.randint(0, 2, (6,))) for _ in range(5)]
    f = FederatedAveraging(
        lambda: torch.nn.Linear(D, 2),
        clients=data,
        sample_rate=1.0,
        rounds=2,
        local_lr=0.1,
        max_grad_norm=1.0,
        noise_multiplier=2.0,
        delta=1e-5,
        progress=False,
    )
    assert isinstance(f.fit(), torch.nn.Linear)  # rng=None: client coins and noise from the CSPRNG


def test_progress_bar_runs():
    clients, _ = make_clients(n_clients=4)
    fed(clients, rounds=2, progress=True).fit()


# --- validation and budgets ----------------------------------------------------------------


def _good(clients):
    return dict(
        clients=clients, sample_rate=0.5, rounds=3, local_lr=0.1, max_grad_norm=1.0, noise_multiplier=1.0, delta=1e-5
    )


BAD = [
    ("sample_rate", dict(sample_rate=0.0)),
    ("sample_rate", dict(sample_rate=1.5)),
    ("rounds", dict(rounds=0)),
    ("max_grad_norm", dict(max_grad_norm=-1.0)),
    ("max_grad_norm", dict(max_grad_norm=float("nan"))),
    ("local_lr", dict(local_lr=0.0)),
    ("noise_multiplier", dict(epsilon=1.0)),  # both given
    ("noise_multiplier", dict(noise_multiplier=None)),  # neither given
    ("noise_multiplier", dict(noise_multiplier=-1.0)),
    ("epsilon", dict(noise_multiplier=None, epsilon=0.0)),
    ("delta", dict(delta=0.0)),
    ("delta", dict(delta=1.0)),
    ("accountant", dict(accountant="moments")),
    ("local_epochs", dict(local_steps=2, local_epochs=2)),
    ("batch_size", dict(batch_size=0)),
    ("budget", dict(budget=1.0)),
    ("clients", dict(clients=[])),
    ("rng", dict(rng=42)),
]


@pytest.mark.parametrize("name,kw", BAD, ids=[f"{n}-{i}" for i, (n, _) in enumerate(BAD)])
def test_bad_parameters_raise_naming_the_parameter(name, kw):
    clients, _ = make_clients(n_clients=4)
    budget = Budget(epsilon=100.0, delta=1e-5, accountant=RDPAccountant)
    args = _good(clients)
    args["budget"] = budget
    args.update(kw)
    with pytest.raises(InvalidParameterError) as info:
        FederatedAveraging(torch.nn.Linear(D, 2), **args)
    assert info.value.name == name
    assert budget.spent == (0.0, 0.0)


@pytest.mark.parametrize(
    "client",
    [
        (np.full((3, D), np.nan, np.float32), np.zeros(3, np.int64)),
        (np.zeros((3, D), np.float32), np.zeros(4, np.int64)),
        (np.zeros((0, D), np.float32), np.zeros(0, np.int64)),
        "not a dataset",
        (np.zeros((3, D), np.complex64), np.zeros(3, np.int64)),
    ],
)
def test_bad_client_data_raises(client):
    clients, _ = make_clients(n_clients=3)
    with pytest.raises(InvalidDataError) as info:
        FederatedAveraging(torch.nn.Linear(D, 2), **_good(clients + [client]))
    assert info.value.name.startswith("clients[3]")


def test_model_without_parameters_and_budget_without_gaussian_support():
    clients, _ = make_clients(n_clients=3)
    with pytest.raises(InvalidParameterError) as info:
        FederatedAveraging(torch.nn.ReLU(), **_good(clients))
    assert info.value.name == "model"
    with pytest.raises(InvalidParameterError):  # basic composition cannot price Gaussian noise
        FederatedAveraging(torch.nn.Linear(D, 2), budget=Budget(epsilon=10.0, delta=1e-5), **_good(clients))


def test_budget_refusal_happens_before_anything_runs():
    clients, _ = make_clients(n_clients=10)
    budget = Budget(epsilon=1.0, delta=1e-5, accountant=RDPAccountant)
    source = CountingSource(SEED)
    f = fed(clients, budget=budget, rng=source, noise_multiplier=0.5, rounds=20)
    assert f.epsilon_ > 1.0
    before = params(f.model_)
    with pytest.raises(BudgetExceededError):
        f.fit()
    assert budget.spent == (0.0, 0.0) and budget.events == ()
    assert source.calls == 0  # no client sampled, no noise drawn
    np.testing.assert_array_equal(params(f.model_), before)


def test_budget_is_debited_by_the_run_event():
    clients, _ = make_clients(n_clients=10)
    budget = Budget(epsilon=10.0, delta=1e-5, accountant=RDPAccountant)
    f = fed(clients, budget=budget, noise_multiplier=2.0, rounds=4)
    f.fit()
    assert budget.events == (f.event_,)
    assert budget.spent[0] == pytest.approx(f.epsilon_, rel=1e-3)
    f.fit()  # a second run pays again
    assert budget.events == (f.event_, f.event_)
