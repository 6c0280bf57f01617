"""DP-SGD on two processes: DistributedDataParallel over torch.distributed (gloo, CPU).

The two processes are fresh interpreters (``python -c`` with torchrun-like arguments; forking the
pytest worker would copy its torch threads and state), started once for the module; each runs
every scenario below in turn and writes what it saw, and the tests read that:

- training: the same ε as one process with the same logical batch; both processes end with
  identical parameters, equal (to float rounding) to those of one process given the same seed
  (one Poisson sample over the whole dataset per step, split across processes; noise drawn once
  by rank 0); the slices of each logical batch are disjoint and make up the one-process batch;
  rank 1 draws no random numbers at all;
- noise: with zero data gradients the released gradient is pure noise; its variance over
  4 steps × 10,100 coordinates is tested against σ²C² with a χ² test on n = 40,400 values at
  α = 1e-6 (a correct release falsely fails with probability 1e-6 under a fresh seed; the
  seed is fixed, so the outcome is deterministic). Power: a deliberately broken release that
  adds noise on every process (variance 2σ²C²) gives a statistic near 2n, far outside;
- a budget held by rank 0 stops both processes at the same step; settings that differ between
  processes are refused on both, before anything is attached.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():  # pragma: no cover
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

from scipy import stats  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from dpkit.torch import make_private  # noqa: E402

SEED = 4242
N, PER_RANK, WORLD = 400, 20, 2
SIGMA, CLIP = 0.7, 3.0
ALPHA_VAR = 1e-6

# The worker: run as `python -c WORKER rank world store out`. Every scenario is collective: both
# processes run them in the same order.
WORKER = r"""
import datetime, gc, json, sys
import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset

from dpkit.budget import Budget
from dpkit.accounting import RDPAccountant
from dpkit.errors import BudgetExceededError, InvalidParameterError
from dpkit.torch import make_private
from dpkit.torch.distributed import DataParallelGroup

rank, world, store, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
SEED, N, PER_RANK, SIGMA, CLIP = __SETTINGS__
torch.set_num_threads(1)
dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=world,
                        timeout=datetime.timedelta(seconds=120))
results = {}


def data():
    g = torch.Generator().manual_seed(SEED)
    x = torch.randn(N, 6, generator=g)
    return TensorDataset(x, (x[:, 0] + x[:, 1] > 0).long(), torch.arange(N))


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 2))


# -- settings that differ between processes are refused on every process ----------------------
model = DDP(mlp())
try:
    make_private(model, torch.optim.SGD(model.parameters(), lr=0.5), DataLoader(data(), batch_size=PER_RANK),
                 noise_multiplier=1.0, delta=1e-5, epochs=1, max_grad_norm=1.0 + rank, rng=np.random.default_rng(SEED))
    results["mismatch"] = "accepted"
except InvalidParameterError as exc:
    results["mismatch"] = str(exc)
results["mismatch_left_grad"] = all(p.requires_grad for p in model.parameters())

# -- training: virtual batches on each process, one logical batch across both ----------------
rng = np.random.default_rng(SEED)
model = DDP(mlp())
private = make_private(model, torch.optim.SGD(model.parameters(), lr=0.5), DataLoader(data(), batch_size=PER_RANK),
                       noise_multiplier=1.0, delta=1e-5, epochs=2, max_grad_norm=1.0, rng=rng,
                       max_physical_batch_size=8)
_, opt, loader = private
seen = []
for _ in range(2):
    for x, y, idx in loader:
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        seen.append([opt.steps + 1, idx.tolist()])
        opt.step()
results["train"] = {
    "params": torch.cat([p.detach().reshape(-1) for p in model.parameters()]).double().tolist(),
    "epsilon": opt.epsilon, "steps": opt.steps, "sample_rate": opt.sample_rate,
    "expected_batch_size": opt.expected_batch_size, "len_loader": len(loader), "seen": seen,
    "untouched_rng": rng.bit_generator.state == np.random.default_rng(SEED).bit_generator.state,
    "repr": repr(opt),
}


# -- noise: zero data gradients, the release is pure noise ------------------------------------
def noise_run(rng):
    torch.manual_seed(1)
    model = DDP(nn.Linear(100, 100))  # 10,100 coordinates
    xs = TensorDataset(torch.randn(N, 100), torch.zeros(N))
    private = make_private(model, torch.optim.SGD(model.parameters(), lr=0.1), DataLoader(xs, batch_size=PER_RANK),
                           noise_multiplier=SIGMA, delta=1e-5, epochs=1, max_grad_norm=CLIP, rng=rng)
    _, opt, loader = private
    released = []
    for step, (x, _) in enumerate(loader):
        opt.zero_grad()
        (model(x) * 0.0).sum().backward()
        grads = opt.private_gradient()
        released.append(torch.cat([g.reshape(-1) for g in grads]).double() * opt.expected_batch_size)
        if step == 3:
            break
    return torch.cat(released).numpy(), opt


flat, opt = noise_run(np.random.default_rng(SEED))
np.save(f"{out}/noise_rank{rank}.npy", flat)
results["noise_std"] = opt.noise_std

# -- a budget held by rank 0 stops both processes at the same step ------------------------------
budget = Budget(epsilon=1.0, delta=1e-5, accountant=RDPAccountant) if rank == 0 else None
model = DDP(mlp())
private = make_private(model, torch.optim.SGD(model.parameters(), lr=0.5), DataLoader(data(), batch_size=PER_RANK),
                       noise_multiplier=2.0, delta=1e-5, epochs=50, max_grad_norm=1.0, budget=budget,
                       rng=np.random.default_rng(SEED))
_, opt, loader = private
stopped = None
try:
    for _ in range(50):
        for x, y, _idx in loader:
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
except BudgetExceededError as exc:
    stopped = str(exc)
results["budget"] = {"steps": opt.steps, "stopped": stopped,
                     "spent": None if budget is None else len(budget.events)}


# -- power: a broken release that adds noise on every process -----------------------------------
def every_process_adds_noise(self, flat, noise, src, charge):
    charge(self.rank == 0)
    noisy = noise.release(flat.clone(), src)  # each process's own source
    dist.all_reduce(noisy, group=self.group)
    return noisy


DataParallelGroup.release = every_process_adds_noise
flat, _ = noise_run(np.random.default_rng(SEED + 1000 * (rank + 1)))
np.save(f"{out}/broken_rank{rank}.npy", flat)

with open(f"{out}/rank{rank}.json", "w") as f:
    json.dump(results, f)
# Free every holder of the process group first: gloo's threads joined by destructors at
# interpreter exit may abort the process.
del model, private, opt, loader
gc.collect()
dist.barrier()
dist.destroy_process_group()
"""


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    """Both processes, once for the module; the directory holds what each wrote."""
    out = tmp_path_factory.mktemp("ddp")
    code = WORKER.replace("__SETTINGS__", repr((SEED, N, PER_RANK, SIGMA, CLIP)))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(r), str(WORLD), str(out / "store"), str(out)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for r in range(WORLD)
    ]
    failed = []
    for r, p in enumerate(procs):
        try:
            _, err = p.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail(f"rank {r} did not finish in 300 s")
        if p.returncode != 0:
            failed.append(f"rank {r} exited {p.returncode}:\n{err[-3000:]}")
    assert not failed, "\n".join(failed)
    return out


def result(runs: Path, rank: int) -> dict:
    return json.loads((runs / f"rank{rank}.json").read_text())


@functools.cache
def one_process_reference():
    """The same training in this process: batch_size = W × per-process batch, same seed."""
    g = torch.Generator().manual_seed(SEED)
    x = torch.randn(N, 6, generator=g)
    data = TensorDataset(x, (x[:, 0] + x[:, 1] > 0).long(), torch.arange(N))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 2))
    private = make_private(
        model,
        torch.optim.SGD(model.parameters(), lr=0.5),
        DataLoader(data, batch_size=WORLD * PER_RANK),
        noise_multiplier=1.0,
        delta=1e-5,
        epochs=2,
        max_grad_norm=1.0,
        rng=np.random.default_rng(SEED),
    )
    _, opt, loader = private
    batches = []
    for _ in range(2):
        for xb, yb, idx in loader:
            opt.zero_grad()
            nn.functional.cross_entropy(model(xb), yb).backward()
            batches.append(sorted(idx.tolist()))
            opt.step()
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).double(), opt, batches


def test_same_epsilon_as_one_process_and_identical_parameters(runs: Path) -> None:
    r0, r1 = result(runs, 0)["train"], result(runs, 1)["train"]
    params, opt, batches = one_process_reference()
    assert r0["params"] == r1["params"]  # bit for bit: both applied the same broadcast release
    assert r0["steps"] == r1["steps"] == opt.steps == 20 == 2 * r0["len_loader"]
    assert r0["epsilon"] == r1["epsilon"] == opt.epsilon
    assert r0["sample_rate"] == opt.sample_rate == WORLD * PER_RANK / N
    assert r0["expected_batch_size"] == pytest.approx(opt.expected_batch_size)
    # Same seed: rank 0 drew the same logical batches and noise as the one process did.
    torch.testing.assert_close(torch.tensor(r0["params"], dtype=torch.float64), params, rtol=1e-5, atol=1e-5)
    assert "world_size=2" in r0["repr"] and "max_physical_batch_size=8" in r0["repr"]


def test_each_logical_batch_is_one_sample_split_across_processes(runs: Path) -> None:
    r0, r1 = result(runs, 0)["train"], result(runs, 1)["train"]
    _, _, batches = one_process_reference()
    per_step: dict[int, list[list[int]]] = {}
    counts: dict[tuple[int, int], int] = {}
    for rank, r in enumerate((r0, r1)):
        for step, idx in r["seen"]:
            assert len(idx) <= 8  # physical batches of at most max_physical_batch_size
            per_step.setdefault(step, [[], []])[rank].extend(idx)
            counts[rank, step] = counts.get((rank, step), 0) + 1
    assert sorted(per_step) == list(range(1, 21))
    for step, (a, b) in per_step.items():
        assert not set(a) & set(b)  # no example on both processes
        assert sorted(a + b) == batches[step - 1]  # together: the one-process logical batch
        assert abs(len(a) - len(b)) <= 1
        assert counts[0, step] == counts[1, step]  # the same number of steps on each process
    assert r1["untouched_rng"] and not r0["untouched_rng"]  # only rank 0 draws randomness


def _variance_statistic(flat: np.ndarray, variance: float) -> float:
    """Σx²/v: χ² with n = flat.size degrees of freedom for N(0, v) values."""
    return float(np.sum(flat.astype(np.float64) ** 2) / variance)


def test_released_noise_has_variance_sigma_squared_c_squared_not_world_times(runs: Path) -> None:
    honest = np.load(runs / "noise_rank0.npy")
    assert np.array_equal(honest, np.load(runs / "noise_rank1.npy"))  # the same release on both
    n = honest.size
    assert n == 4 * 10_100
    v = result(runs, 0)["noise_std"] ** 2
    assert v == pytest.approx((SIGMA * CLIP) ** 2, rel=1e-9)  # σ·C, the lattice's 2^-40 above it
    lo, hi = stats.chi2.ppf(ALPHA_VAR / 2, n), stats.chi2.ppf(1 - ALPHA_VAR / 2, n)
    t = _variance_statistic(honest, v)
    assert lo < t < hi, (t / n, lo / n, hi / n)
    assert abs(float(honest.mean())) < 6 * SIGMA * CLIP / np.sqrt(n)


def test_a_release_that_adds_noise_on_every_process_is_caught(runs: Path) -> None:
    broken = np.load(runs / "broken_rank0.npy")
    v = (SIGMA * CLIP) ** 2
    n = broken.size
    t = _variance_statistic(broken, v)
    assert not stats.chi2.ppf(ALPHA_VAR / 2, n) < t < stats.chi2.ppf(1 - ALPHA_VAR / 2, n)
    assert t / n == pytest.approx(WORLD, rel=0.05)  # variance W·σ²C²


def test_a_budget_on_rank_0_stops_every_process_at_the_same_step(runs: Path) -> None:
    b0, b1 = result(runs, 0)["budget"], result(runs, 1)["budget"]
    assert b0["steps"] == b1["steps"] == b0["spent"] == 11  # as in one process: q = 0.1, σ = 2, ε = 1
    assert "privacy budget exceeded" in b0["stopped"] and "rank 0 of the process group refused" in b1["stopped"]


def test_settings_that_differ_between_processes_are_refused_on_every_process(runs: Path) -> None:
    for rank in range(WORLD):
        r = result(runs, rank)
        assert "max_grad_norm" in r["mismatch"] and "differs between processes" in r["mismatch"]
        assert r["mismatch_left_grad"]  # refused before anything was attached


def test_a_plain_module_under_several_processes_warns(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda *a, **k: 4)
    model = nn.Linear(3, 2)
    data = TensorDataset(torch.randn(40, 3), torch.zeros(40, dtype=torch.long))
    with pytest.warns(UserWarning, match="not a DistributedDataParallel"):
        make_private(
            model,
            torch.optim.SGD(model.parameters(), lr=0.1),
            DataLoader(data, batch_size=4),
            noise_multiplier=1.0,
            delta=1e-5,
            epochs=1,
            max_grad_norm=1.0,
        )
