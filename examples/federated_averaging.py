"""Federated learning with client-level DP (联邦学习, 用户级差分隐私): DP-FedAvg on simulated clients.

McMahan et al. (2018): each round a Poisson sample of clients (rate q) trains locally from the
global model; each client's whole update is clipped to ℓ2 norm C; the server adds Gaussian noise
σ·C to the sum and divides by the expected number of clients q·n. The guarantee protects every
client's *entire* dataset (add/remove one client), and the accountant prices the run as
Poisson-subsampled Gaussian rounds. Below: 200 simulated clients (25 examples each, with a
client-specific shift of the features) train a logistic model; accuracy on held-out data and the
running ε after each block of rounds, for three privacy targets, next to a non-private
centralised model.

Run:  .venv/bin/python examples/federated_averaging.py [--seed N] [--progress]
"""

import argparse
import time

import numpy as np
import torch

from dpkit.torch.federated import FederatedAveraging

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument(
    "--seed", type=int, help="seed data, client sampling and noise: reproducible, NOT secure (default: OS CSPRNG)"
)
parser.add_argument("--progress", action="store_true", help="show a rich progress bar with the running ε")
args = parser.parse_args()
torch.set_num_threads(1)  # tiny models: thread start-up costs more than it saves
data_rng = np.random.default_rng(args.seed if args.seed is not None else 0)

n_clients, per_client, dim = 200, 25, 20
w_true = data_rng.normal(size=dim)


def draw(n, shift):
    X = data_rng.normal(size=(n, dim)) + shift
    y = (X @ w_true + data_rng.normal(size=n) > 0).astype(np.int64)
    return X.astype(np.float32), y


clients = [draw(per_client, 0.3 * data_rng.normal(size=dim)) for _ in range(n_clients)]
X_test, y_test = draw(5000, 0.0)
X_t = torch.from_numpy(X_test)


def accuracy(model):
    with torch.no_grad():
        return float((model(X_t).argmax(1).numpy() == y_test).mean())


from sklearn.linear_model import LogisticRegression  # noqa: E402

central = LogisticRegression(max_iter=1000).fit(
    np.vstack([c[0] for c in clients]), np.concatenate([c[1] for c in clients])
)
print(f"non-private centralised logistic regression: accuracy {central.score(X_test, y_test):.3f}")

rounds, q, delta = 60, 0.1, 1e-4  # δ < 1/n for n = 200 clients
checkpoints = (10, 20, 40, 60)
print(f"\nDP-FedAvg: {n_clients} clients, q = {q} (≈{q * n_clients:.0f} per round), clip = 1, δ = {delta:g}")
print(f"{'':>16} | " + " | ".join(f"{f'after round {t}':^17}" for t in checkpoints))
print(f"{'target ε':>9} {'σ':>6} | " + " | ".join(f"{'accuracy':>9} {'ε':>6} " for t in checkpoints) + f"| {'time':>5}")
for target in (0.5, 2.0, 8.0):
    torch.manual_seed(0 if args.seed is None else args.seed)
    fed = FederatedAveraging(
        torch.nn.Linear(dim, 2),
        clients=clients,
        sample_rate=q,
        rounds=rounds,
        local_steps=5,
        local_lr=0.5,
        server_lr=1.0,
        max_grad_norm=1.0,
        epsilon=target,
        delta=delta,
        accountant="rdp",
        rng=None if args.seed is None else np.random.default_rng(args.seed),
        progress=args.progress,
    )
    seen = {}
    start = time.perf_counter()
    fed.fit(on_round=lambda t, m, seen=seen: seen.__setitem__(t, accuracy(m)) if t in checkpoints else None)
    elapsed = time.perf_counter() - start
    cells = " | ".join(f"{seen[t]:>9.3f} {fed.epsilon_after(t):>6.2f} " for t in checkpoints)
    print(f"{target:>9g} {fed.noise_multiplier_:6.3f} | {cells}| {elapsed:4.1f}s")
print("\nε is client-level: it covers everything any one client contributed, over all rounds.")
