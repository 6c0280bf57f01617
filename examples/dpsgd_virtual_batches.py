"""DP-SGD with virtual batches: a logical batch of 1,024 examples processed 128 at a time.

Large logical batches help DP-SGD (the noise σ·C is divided by the batch size), but their
activations may not fit in memory. ``make_private(..., max_physical_batch_size=128)`` draws each
Poisson logical batch whole (its random size is used for nothing but cutting it), yields it as
physical batches of at most 128 examples, clips every example of every physical batch on its own,
adds the clipped gradients up, and adds the noise once per logical batch, when its last physical
batch is stepped: the same release as one pass over the whole logical batch, and the same ε
(the accountant sees one step per logical batch). The loop calls ``optimizer.step()`` after every
physical batch; ``optimizer.released`` says which calls stepped the model.

Here: a synthetic two-class problem (20,000 training examples, 20 features), an MLP 20-64-2,
logical batch 1,024 (q ≈ 0.05), physical batches of 128, δ = 1e-5, target ε = 2 over 4 epochs.
The script shows the physical batches of the first logical batches, checks that the first
released update equals the one computed without virtual batches (same seed), trains, and prints
ε, the steps, the largest batch the model ever saw and the test accuracy.

Run:  .venv/bin/python examples/dpsgd_virtual_batches.py [--seed N]   (a few seconds on 2 cores)
"""

import argparse
import time

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from dpkit.torch import make_private

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--seed", type=int, help="seed model and DP noise: reproducible, NOT secure (default: OS CSPRNG)")
parser.add_argument("--physical", type=int, default=128, help="max_physical_batch_size (default: 128)")
args = parser.parse_args()
torch.set_num_threads(1)  # a small model: one thread is fastest
t_start = time.perf_counter()

N_TRAIN, N_TEST, D = 20_000, 4_000, 20
LOGICAL, EPOCHS, EPSILON, DELTA, CLIP = 1024, 4, 2.0, 1e-5, 1.0
data_rng = np.random.default_rng(0)  # a fixed public problem
w = data_rng.normal(size=D)
x = data_rng.normal(size=(N_TRAIN + N_TEST, D)).astype(np.float32)
y = (x @ w + 0.5 * data_rng.normal(size=N_TRAIN + N_TEST) > 0).astype(np.int64)
x, y = torch.from_numpy(x), torch.from_numpy(y)
train = TensorDataset(x[:N_TRAIN], y[:N_TRAIN])
x_test, y_test = x[N_TRAIN:], y[N_TRAIN:]


def rng():
    """A fresh seeded generator per run (so two runs draw the same batches and noise), or None."""
    return None if args.seed is None else np.random.default_rng(args.seed)


def private_run(physical):
    torch.manual_seed(0 if args.seed is None else args.seed)
    model = nn.Sequential(nn.Linear(D, 64), nn.ReLU(), nn.Linear(64, 2))
    private = make_private(
        model,
        torch.optim.SGD(model.parameters(), lr=2.0, momentum=0.9),
        DataLoader(train, batch_size=LOGICAL),
        epsilon=EPSILON,
        delta=DELTA,
        epochs=EPOCHS,
        max_grad_norm=CLIP,
        max_physical_batch_size=physical,
        rng=rng(),
    )
    seen = []  # the batch size of every forward pass
    model.register_forward_pre_hook(lambda m, inputs: seen.append(len(inputs[0])))
    return private, seen


def first_release(physical):
    """The first released (noisy, averaged) gradient, through the usual loop."""
    (model, opt, loader), _ = private_run(physical)
    for xb, yb in loader:
        opt.zero_grad()
        nn.functional.cross_entropy(model(xb), yb).backward()
        grads = opt.private_gradient()
        if grads is not None:
            return torch.cat([g.reshape(-1) for g in grads])
    raise AssertionError("the loader ended before a release")


# -- the physical batches of the first logical batches -------------------------------------------
(model, opt, loader), seen = private_run(args.physical)
print(
    f"σ = {opt.noise_multiplier:.3f}, q = {opt.sample_rate:.4f}, expected logical batch {opt.expected_batch_size:.0f}, "
    f"{len(loader)} logical steps per epoch, physical batches of at most {args.physical}"
)
parts: list[int] = []
for xb, yb in loader:
    opt.zero_grad()
    nn.functional.cross_entropy(model(xb), yb).backward()
    opt.step()
    parts.append(len(xb))
    if opt.released:
        print(f"  logical batch {opt.steps}: {sum(parts):>5} examples in {len(parts)} physical batches {parts}")
        parts = []
        if opt.steps == 3:
            break

# -- the same release with and without virtual batches (same seed) -------------------------------
if args.seed is not None:
    whole, split = first_release(None), first_release(args.physical)
    print(
        f"first released update, whole logical batch vs physical batches of {args.physical}: "
        f"max |difference| = {float((whole - split).abs().max()):.2e} (of values up to {float(whole.abs().max()):.2e})"
    )

# -- training ---------------------------------------------------------------------------------------
private, seen = private_run(args.physical)
report = private.train(nn.CrossEntropyLoss(), progress=False)
physical_batches, largest = len(seen), max(seen)
with torch.no_grad():
    accuracy = float((private.module(x_test).argmax(1) == y_test).float().mean())
print(
    f"trained {report.epochs_completed} epochs: {report.steps} logical steps in {physical_batches} physical batches; "
    f"the largest batch the model saw had {largest} examples"
)
print(f"ε = {report.epsilon:.3f} at δ = {DELTA:g} (target {EPSILON:g}); test accuracy {accuracy:.3f}")
print(f"({time.perf_counter() - t_start:.1f} s)")
