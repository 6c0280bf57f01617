"""DP-SGD on two processes: DistributedDataParallel over torch.distributed (gloo, CPU).

The same script trains on several GPUs with the NCCL backend and torchrun; here two CPU
processes stand in for them. Each process wraps the model in ``DistributedDataParallel`` and
calls ``make_private`` with the same arguments; the loader's batch size is per process, as with
DDP, so the logical batch is 2 × 256 = 512 examples in expectation (q = 512/N). Every step:

1. rank 0 draws one Poisson sample over the whole dataset from its CSPRNG and broadcasts it;
   each process loads its half (so each example is in the logical batch with probability q,
   and at most once — the q the accountant prices);
2. each process clips its own examples, one by one;
3. the clipped sums are summed onto rank 0, which pays for the step, adds the noise σ·C once
   and broadcasts the noisy sum; both processes apply the same update.

Noise added on each process would have variance 2σ²C²; dpkit's tests measure it. ε is the
one-process ε of a logical batch of 512, which the script checks, along with the parameters
being identical on both processes after training.

Here: a synthetic two-class problem (20,000 training examples, 20 features), an MLP 20-64-2,
target ε = 2 at δ = 1e-5 over 3 epochs.

Run:  .venv/bin/python examples/dpsgd_ddp.py [--seed N]   (about 10 s on 2 cores)
"""

import argparse
import datetime
import gc
import os
import tempfile
import time
import warnings

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset

from dpkit.accounting import RDPAccountant
from dpkit.noise.lattice import DELTA_MARGIN
from dpkit.torch import make_private

WORLD, PER_PROCESS, EPOCHS, EPSILON, DELTA, CLIP = 2, 256, 3, 2.0, 1e-5, 1.0
N_TRAIN, N_TEST, D = 20_000, 4_000, 20


def problem():
    """A fixed public problem, the same in every process."""
    data_rng = np.random.default_rng(0)
    w = data_rng.normal(size=D)
    x = data_rng.normal(size=(N_TRAIN + N_TEST, D)).astype(np.float32)
    y = (x @ w + 0.5 * data_rng.normal(size=N_TRAIN + N_TEST) > 0).astype(np.int64)
    x, y = torch.from_numpy(x), torch.from_numpy(y)
    return TensorDataset(x[:N_TRAIN], y[:N_TRAIN]), x[N_TRAIN:], y[N_TRAIN:]


def new_model() -> nn.Module:
    return nn.Sequential(nn.Linear(D, 64), nn.ReLU(), nn.Linear(64, 2))


def worker(rank: int, store: str, seed: int | None) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD, timeout=datetime.timedelta(seconds=120)
    )
    train, x_test, y_test = problem()
    torch.manual_seed(rank if seed is None else seed + rank)  # different on purpose: DDP broadcasts rank 0's
    model = DistributedDataParallel(new_model())  # wrap first, then make_private
    private = make_private(
        model,
        torch.optim.SGD(model.parameters(), lr=2.0, momentum=0.9),
        DataLoader(train, batch_size=PER_PROCESS),
        epsilon=EPSILON,
        delta=DELTA,
        epochs=EPOCHS,
        max_grad_norm=CLIP,
        rng=None if seed is None else np.random.default_rng(seed),  # only rank 0's is used
    )
    opt = private.optimizer
    sizes: list[int] = []  # the examples this process sees at each step
    model.register_forward_pre_hook(lambda m, inputs: sizes.append(len(inputs[0])) if m.training else None)

    report = private.train(nn.CrossEntropyLoss(), progress=False)
    gathered: list = [None] * WORLD
    dist.all_gather_object(gathered, sizes[:3])
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    every = [torch.empty_like(flat) for _ in range(WORLD)]
    dist.all_gather(every, flat)
    if rank == 0:
        # One process with the same logical batch (priced, not trained; a plain module under
        # torch.distributed warns that it would be a separate model): the same σ and step event.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            plain = new_model()
            alone = make_private(
                plain,
                torch.optim.SGD(plain.parameters(), lr=1.0),
                DataLoader(train, batch_size=WORLD * PER_PROCESS),
                epsilon=EPSILON,
                delta=DELTA,
                epochs=EPOCHS,
                max_grad_norm=CLIP,
            ).optimizer
        # ε after as many steps (lattice noise: read at δ·(1 − 2^-20), as make_private does)
        one_eps = RDPAccountant().compose(alone.step_event, count=opt.steps).get_epsilon(DELTA * DELTA_MARGIN)
        model.eval()
        with torch.no_grad():
            accuracy = float((model(x_test).argmax(1) == y_test).float().mean())
        print(
            f"{WORLD} processes, batch {PER_PROCESS} each: q = {opt.sample_rate:.4f} (logical batch "
            f"{opt.expected_batch_size:.0f} of {N_TRAIN}), σ = {opt.noise_multiplier:.3f}"
        )
        for step in range(3):
            print(
                f"  logical batch {step + 1}: "
                + " + ".join(f"{g[step]} (rank {r})" for r, g in enumerate(gathered))
                + f" = {sum(g[step] for g in gathered)} examples"
            )
        print(
            f"trained {report.steps} steps: ε = {opt.epsilon:.3f} at δ = {DELTA:g} (target {EPSILON:g}); "
            f"one process with a logical batch of {WORLD * PER_PROCESS}: ε = {one_eps:.3f}"
        )
        agree = all(torch.equal(every[0], e) for e in every)
        print(
            f"parameters identical on all {WORLD} processes: {agree} "
            f"(max |difference| {max(float((every[0] - e).abs().max()) for e in every):.1e}); "
            f"test accuracy {accuracy:.3f}"
        )
        assert (
            agree
            and alone.step_event == opt.step_event
            and alone.noise_multiplier == opt.noise_multiplier
            and abs(one_eps - opt.epsilon) < 1e-12
        )
        del alone, plain
    # Drop every holder of the process group (DDP's reducer, the optimizer's collectives)
    # before destroying it, so that gloo's threads are joined now and not by the C++
    # destructors at interpreter exit, where they may abort the process.
    del model, private, opt, report
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--seed", type=int, help="seed models and DP noise: reproducible, NOT secure (default: OS CSPRNG)"
    )
    args = parser.parse_args()
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(worker, args=(os.path.join(tmp, "rendezvous"), args.seed), nprocs=WORLD)
    print(f"({time.perf_counter() - t_start:.1f} s)")
