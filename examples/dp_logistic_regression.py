"""Private logistic regression (逻辑回归) on UCI Adult by noisy gradient descent (Abadi et al. 2016).

The notes' recipe, with the improvements the chapter lists: rows are clipped to a declared ℓ2
norm, so every per-example gradient of the logistic loss is bounded (the Lipschitz argument of
eq. 8.1: input clipping instead of gradient clipping); each step adds Gaussian noise to the *sum*
of the gradients and divides by a *noisy count*; the per-step noise is calibrated from a total
(ε, δ) by the RDP accountant (not split by hand), and the whole training is debited from a
budget before any noise is drawn. Accuracy on the test split against scikit-learn's non-private
model, at ε = 0.5, 1 and 4 (δ = 1e-5).

Data: ``adult.data`` (train) and ``adult.test`` (test) in the directory given as the command's
argument, else in ``$DPKIT_ADULT``, else in ``<repo>/../shared/data/adult/``. Preprocessing
uses only the public schema (``adult.names``): the six numeric columns are scaled to [0, 1] by
declared ranges, the seven categorical columns are one-hot encoded (a missing value is all
zeros), so every row has ℓ2 norm <= √(6 + 7) — the declared ``data_norm``. When the files are
absent a generated dataset of the same shape is used instead (and the output says so).

Run:  .venv/bin/python examples/dp_logistic_regression.py [ADULT_DIR] [--seed N]
"""

import argparse
import os
import time
import warnings
from pathlib import Path

import numpy as np

import dpkit as dp
from dpkit.accounting import RDPAccountant
from dpkit.datasets import ADULT_CATEGORICAL, ADULT_DATA_NORM, ADULT_NUMERIC, adult_features
from dpkit.ml.logistic import LogisticRegression

# The default location of UCI Adult: beside the repository (overridden by DPKIT_ADULT or the argument).
DEFAULT_ADULT = Path(__file__).resolve().parent.parent / ".." / "shared" / "data" / "adult"

# The public schema (adult.names). Numeric ranges are the census domain, declared, not measured.
DATA_NORM = ADULT_DATA_NORM  # each one-hot group adds at most 1 to ‖x‖²


encode = adult_features  # the public-schema encoding (dpkit.datasets), shared with the benchmark


def generated(seed: int = 20240607) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """An Adult-shaped stand-in: 6 numeric columns in [0, 1] and 7 one-hot groups, labels from a
    fixed logistic model (about 24 % positives), 32,561 train and 16,281 test rows."""
    rng = np.random.default_rng(seed)
    sizes = [len(c) for c in ADULT_CATEGORICAL.values()]
    w_num = rng.normal(0.0, 2.0, size=6)
    w_cat = [rng.normal(0.0, 1.0, size=k) for k in sizes]

    def draw(n: int) -> tuple[np.ndarray, np.ndarray]:
        num = rng.beta(2.0, 5.0, size=(n, 6))
        cats = [np.eye(k)[rng.integers(0, k, size=n)] for k in sizes]
        logit = num @ w_num + sum(c @ w for c, w in zip(cats, w_cat, strict=True)) - 1.6
        y = (rng.random(n) < 1.0 / (1.0 + np.exp(-logit))).astype(int)
        return np.hstack([num, *cats]), y

    return (*draw(32_561), *draw(16_281))


parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument(
    "adult",
    nargs="?",
    type=Path,
    default=Path(os.environ.get("DPKIT_ADULT") or DEFAULT_ADULT),
    help="directory holding adult.data and adult.test (default: $DPKIT_ADULT, else ../shared/data/adult/ "
    "beside the repository)",
)
parser.add_argument("--seed", type=int, help="seed the noise: reproducible, NOT secure (default: OS CSPRNG)")
args = parser.parse_args()
ADULT = args.adult
rng = None if args.seed is None else np.random.default_rng(args.seed)

if (ADULT / "adult.data").exists() and (ADULT / "adult.test").exists():
    X_train, y_train = encode(ADULT / "adult.data")
    X_test, y_test = encode(ADULT / "adult.test")
    source = f"UCI Adult ({ADULT.resolve()})"
else:
    X_train, y_train, X_test, y_test = generated()
    source = f"GENERATED stand-in data: UCI Adult was not found in {ADULT}"
print(f"data: {source}")
print(
    f"      {X_train.shape[0]:,} train / {X_test.shape[0]:,} test rows, {X_train.shape[1]} features, "
    f"declared data_norm = √{len(ADULT_NUMERIC) + len(ADULT_CATEGORICAL)} = {DATA_NORM:.3f}"
)

with warnings.catch_warnings():  # scikit-learn's reference model, not private
    warnings.simplefilter("ignore")
    from sklearn.linear_model import LogisticRegression as NonPrivate

    reference = NonPrivate(max_iter=2000).fit(X_train, y_train).score(X_test, y_test)
majority = max(y_test.mean(), 1 - y_test.mean())

budget = dp.Budget(epsilon=2.0, delta=1e-5, accountant=RDPAccountant)  # one analyst's whole budget
print(f"\n{'ε':>5} {'δ':>7} | {'dpkit accuracy':>14} | {'ε proved':>8} | {'noise σ/C':>9} | {'steps':>5} | {'time':>5}")
for eps in (0.5, 1.0, 4.0):
    t0 = time.perf_counter()
    clf = LogisticRegression(
        epsilon=eps,
        delta=1e-5,
        data_norm=DATA_NORM,
        classes=[0, 1],
        rng=rng,
        budget=budget if eps < 4 else None,  # ε = 4 does not fit in the budget: see below
    ).fit(X_train, y_train)
    print(
        f"{eps:>5g} {1e-5:>7g} | {clf.score(X_test, y_test):>14.4f} | {clf.epsilon_:>8.4f} | "
        f"{clf.noise_multiplier_:>9.2f} | {clf.n_steps_:>5} | {time.perf_counter() - t0:>4.1f}s"
    )
print(f"non-private scikit-learn: {reference:.4f}   majority class: {majority:.4f}")
print(f"\nevent of the last fit (what a ledger stores): {clf.event_}")

spent, _ = budget.spent
print(f"\nbudget: ε = {budget.epsilon} at δ = {budget.delta}; spent {spent:.3f} on the ε = 0.5 and 1 models")
late = LogisticRegression(epsilon=4.0, delta=1e-5, data_norm=DATA_NORM, classes=[0, 1], budget=budget, rng=rng)
try:
    late.fit(X_train, y_train)
except dp.BudgetExceededError as exc:
    print(f"the ε = 4 model, charged to it, is refused before any noise is drawn (nothing is fitted):\n  {exc}")
