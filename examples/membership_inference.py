"""Membership inference (成员推断攻击): attack a non-private model and DP-trained ones.

Yeom et al. (2018): guess "member" when the model's loss on an example is small. An overfit
logistic regression (few examples, many features, 10 % noisy labels) memorises its training set,
so members have far lower loss than fresh examples; the same model trained with noisy clipped
gradient descent (DP-GD, ε from dpkit's RDP accountant) leaks little. For each model: test
accuracy, attack AUC, TPR at 1 % FPR, and the "implied ε" — a Clopper–Pearson lower bound from
a held-out threshold. Over examples of one model that number is only an indication (the examples
are not independent trials); `dpkit.audit.canary.canary_audit` turns the same idea into a proof
by retraining with and without one canary (last line).

Run:  .venv/bin/python examples/membership_inference.py [--seed N]
"""

import argparse

import numpy as np
from sklearn.linear_model import LogisticRegression

from dpkit.accounting import RDPAccountant, calibrate_noise_multiplier
from dpkit.audit.canary import canary_audit
from dpkit.audit.membership import loss_threshold_attack, per_example_losses

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--seed", type=int, default=0, help="seed data, training noise and the attack's split (NOT secure)")
args = parser.parse_args()
rng = np.random.default_rng(args.seed)

members, dim, flip, delta = 500, 1000, 0.1, 1e-5
w_true = rng.normal(size=dim)
w_true *= 3.0 / np.linalg.norm(w_true)
X = rng.normal(size=(3 * members, dim))
y = (X @ w_true > 0).astype(int)
noisy = rng.random(3 * members) < flip
y[noisy] = 1 - y[noisy]
Xm, ym = X[:members], y[:members]  # training set (members)
Xn, yn = X[members : 2 * members], y[members : 2 * members]  # non-members, same distribution
Xt, yt = X[2 * members :], y[2 * members :]  # for test accuracy


def dp_gradient_descent(X, y, *, steps, lr, clip, noise_multiplier, rng, denominator=None):
    """Full-batch DP-GD: per-example gradients clipped to ``clip``, N(0, (σ·clip)²) on their sum,
    divided by a public ``denominator`` (default: the number of rows; an audit that adds a canary
    must fix it, or the denominator itself would differ between the neighbours)."""
    n = X.shape[0] if denominator is None else denominator
    w = np.zeros(X.shape[1])
    for _ in range(steps):
        p = 0.5 * (1.0 + np.tanh(0.5 * (X @ w)))
        G = (p - y)[:, None] * X
        G *= np.minimum(1.0, clip / np.maximum(np.linalg.norm(G, axis=1), 1e-300))[:, None]
        w -= lr * (G.sum(axis=0) + rng.normal(0.0, noise_multiplier * clip, X.shape[1])) / n
    return w


def logistic_losses(w, X, y):
    return np.logaddexp(0.0, -np.where(y == 1, 1.0, -1.0) * (X @ w))


print(f"{members} members, {members} non-members, {dim} features, {flip:.0%} noisy labels")
print(f"{'model':<28} {'test acc':>8} {'AUC':>6} {'TPR@1%FPR':>10} {'implied ε ≥':>12}")

clf = LogisticRegression(C=1.0, max_iter=5000).fit(Xm, ym)
r = loss_threshold_attack(per_example_losses(clf, Xm, ym), per_example_losses(clf, Xn, yn), delta=delta, rng=rng)
print(
    f"{'non-private (sklearn)':<28} {clf.score(Xt, yt):>8.3f} {r.auc:>6.3f} {r.tpr_at_1pct_fpr:>10.3f} {r.epsilon_lower:>12.3f}"
)

steps = 30
for target in (1.0, 8.0):
    sigma = calibrate_noise_multiplier(epsilon=target, delta=delta, accountant=RDPAccountant, steps=steps)
    w = dp_gradient_descent(Xm, ym, steps=steps, lr=2.0, clip=1.0, noise_multiplier=sigma, rng=rng)
    acc = float(((Xt @ w > 0).astype(int) == yt).mean())
    r = loss_threshold_attack(logistic_losses(w, Xm, ym), logistic_losses(w, Xn, yn), delta=delta, rng=rng)
    label = f"DP-GD ε={target:g} (σ={sigma:.2f})"
    print(f"{label:<28} {acc:>8.3f} {r.auc:>6.3f} {r.tpr_at_1pct_fpr:>10.3f} {r.epsilon_lower:>12.3f}")
print("(implied ε at 95 % confidence, δ = 1e-5; a heuristic for one model's examples)")

# A sound audit of the ε = 1 trainer: 2 × 400 retrainings on a small set, with and without a
# canary whose feature no other example uses; the score is the canary's negative margin.
small, d_small = 50, 6
Xs = np.hstack([rng.normal(size=(small, d_small - 1)), np.zeros((small, 1))])
ys = (Xs[:, 0] > 0).astype(float)
canary = (np.r_[np.zeros(d_small - 1), 100.0], 1.0)
sigma = calibrate_noise_multiplier(epsilon=1.0, delta=delta, accountant=RDPAccountant, steps=10)
for name, noise in (("correct DP-GD, claims ε=1", sigma), ("broken: noise ÷ 10, claims ε=1", sigma / 10)):
    audit = canary_audit(
        lambda data, g, noise=noise: dp_gradient_descent(
            *data, steps=10, lr=0.003, clip=1.0, noise_multiplier=noise, rng=g, denominator=small
        ),
        (Xs, ys),
        canary,
        score_fn=lambda w, c: -float(w @ c[0]),
        trials=400,
        confidence=0.95,
        delta=delta,
        rng=rng,
    )
    verdict = "VIOLATION" if audit.epsilon_lower > 1.0 else "consistent"
    print(f"canary audit, {name:<32}: ε ≥ {audit.epsilon_lower:.3f} (95 %)  -> {verdict}")
print(f"(each line: {2 * 400} trainings; a lower bound can prove a violation, never privacy)")
