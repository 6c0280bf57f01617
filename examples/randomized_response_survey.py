"""Randomized response (随机应答): how many students cheated in an exam? (seeds 000 §5.3.1 and 002)

Each student randomises their own answer before handing it in, so a "yes" report is deniable.
Warner's design reports the truth with probability 2/3 (ln 2-DP per student) and the teacher
estimates the true rate as p̂ = 3·mean(Y) − 1. The two-coin design (ln 3-DP) answers truthfully on
tails and otherwise with a second coin; its estimate is 2·P_B − 1/2.

Run:  .venv/bin/python examples/randomized_response_survey.py [--seed N]
"""

import argparse

import numpy as np

import dpkit as dp
from dpkit.datasets import cheating_survey

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--seed", type=int, help="seed the noise: reproducible, NOT secure (default: OS CSPRNG)")
args = parser.parse_args()
rng = None if args.seed is None else np.random.default_rng(args.seed)  # None = secure randomness

survey = cheating_survey(n=10_000, true_rate=0.3)  # generated data; the true answers stay private
print(f"{survey.n:,} students, true cheating rate {survey.true_rate}")

for name, mech, formula in [
    ("Warner, truth w.p. 2/3", dp.RandomizedResponse(p_truth=2 / 3), "3·mean(Y) − 1"),
    ("two fair coins", dp.ForcedResponse(), "2·P_B − 1/2"),
]:
    reports = mech.release(survey.answers, rng=rng)  # what each student hands in
    est = mech.estimate_frequency(reports)  # post-processing: no extra privacy cost
    low, high = est.confidence_interval(0.95)
    print(
        f"{name:24s} ε = {mech.epsilon:.4f}  'yes' reports: {reports.mean():.4f}  "
        f"estimate {formula} = {est.proportion:.4f}  95% CI [{low[1]:.4f}, {high[1]:.4f}]"
    )
