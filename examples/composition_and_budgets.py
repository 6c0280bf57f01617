"""Composition, privacy accounting and budgets (隐私预算与组合定理; seeds 003 and 004).

* Answering k queries, each ε-DP: basic composition spends kε; advanced composition
  (Dwork–Rothblum–Vadhan) spends about ε·sqrt(2k ln(1/δ')) + kε(e^ε − 1), and the simpler
  form 2ε·sqrt(2k ln(1/δ')); the optimal bound (Kairouz–Oh–Viswanath) is smaller still.
* DP-SGD (Abadi et al. 2016; Mironov 2017): Rényi DP with ε = R(α) + ln(1/δ)/(α − 1) minimised over α, against the
  tighter conversion and the privacy-loss-distribution accountant.
* Budgets: an in-memory filter that refuses the query that would overspend, and a ledger on disk.

Run:  .venv/bin/python examples/composition_and_budgets.py
"""

import tempfile
from pathlib import Path

import dpkit as dp
from dpkit.accounting import (
    advanced_composition,
    advanced_composition_simple,
    basic_composition,
    dp_sgd_event,
    optimal_homogeneous_composition,
)

# 1. k counting queries at ε = 0.1 each, δ' = 1e-5.
eps, delta_prime = 0.1, 1e-5
print("k queries at ε = 0.1 each: total ε by each theorem (δ' = 1e-5)")
print(f"{'k':>6} {'basic':>8} {'advanced':>9} {'simple':>8} {'optimal':>8}")
for k in (10, 100, 1000):
    basic, _ = basic_composition([(eps, 0.0)] * k)
    adv, _ = advanced_composition(eps, 0.0, k, delta_prime)
    try:
        simple = f"{advanced_composition_simple(eps, 0.0, k, delta_prime)[0]:8.3f}"
    except dp.InvalidParameterError:
        simple = "  n/a"  # the simple form is not a valid bound for so few queries
    opt = optimal_homogeneous_composition(eps, 0.0, k, delta_prime)
    print(f"{k:>6} {basic:8.3f} {adv:9.3f} {simple:>8} {opt:8.3f}")

# 2. DP-SGD on MNIST: q = 256/60000, σ = 1.1, 60 epochs of 235 steps, δ = 1e-5.
event = dp_sgd_event(noise_multiplier=1.1, sample_rate=256 / 60000, steps=60 * 235)
rdp = dp.RDPAccountant().compose(event)
print("\nDP-SGD, 60 epochs: ε at δ = 1e-5")
print(f"  RDP, ε = R(α) + ln(1/δ)/(α−1):  {rdp.get_epsilon(1e-5, conversion='classic'):.3f}")
print(f"  RDP, improved conversion:        {rdp.get_epsilon(1e-5):.3f}")
print(f"  PLD (tight):                     {dp.PLDAccountant().compose(event).get_epsilon(1e-5):.3f}")
sigma = dp.accounting.calibrate_noise_multiplier(
    epsilon=1.0, delta=1e-5, accountant=dp.PLDAccountant, sample_rate=256 / 60000, steps=60 * 235
)
print(f"  noise multiplier for ε = 1:      {sigma:.3f}")

# 3. A budget refuses the query that would overspend; nothing is released for it.
budget = dp.Budget(epsilon=1.0)
count = dp.Laplace(epsilon=0.3, sensitivity=1.0)
for i in range(4):
    try:
        budget.spend(count.event)  # pay first ...
        print(f"\nquery {i + 1}: released {count.release(42.0):.2f}; remaining ε = {budget.remaining:.2f}", end="")
    except dp.BudgetExceededError as exc:  # ... or release nothing
        print(f"\nquery {i + 1}: refused ({exc})")

# 4. The same on disk, shared by every process that opens the ledger.
with dp.open_ledger(Path(tempfile.mkdtemp()) / "ledger.sqlite") as ledger:
    ledger.create_budget("census", "alice", epsilon=1.0)
    ledger.debit("census", "alice", count.event, "SELECT COUNT(*) FROM people WHERE age >= 65")
    print(f"ledger: census/alice has ε = {ledger.get_budget('census', 'alice').remaining_epsilon:.2f} left")
