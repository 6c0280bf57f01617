"""Private analytics over a table with a person as the privacy unit (Dwork & Roth 2014, §3.3: counting
queries and histograms; user-level contribution bounding and private key selection go beyond it).

1. A census-like table where each person has 1–3 rows (jobs).
2. Counts and means by a public key (sex), with 95% intervals, at user level.
3. Why the privacy unit matters: the same count with each row as the unit is less noisy but
   protects a row, not a person — a person with 3 jobs would be 3 rows.
4. A group-by over a column whose keys are not public (sector), selected privately with δ.
5. SQL, and the budget refusing the query that would overspend.

Run:  .venv/bin/python examples/private_analytics.py [--seed N]
"""

import argparse

import numpy as np

import dpkit as dp
from dpkit.analytics import Metadata
from dpkit.datasets import CENSUS_METADATA, census

parser = argparse.ArgumentParser()
parser.add_argument("--seed", type=int, default=None, help="seed the noise (reproducible, not secure)")
args = parser.parse_args()
rng = None if args.seed is None else np.random.default_rng(args.seed)

df = census(people=20_000)
# The curator's declared schema; "sector" is declared without its categories, so its keys are private.
meta = Metadata.from_dict(
    {**CENSUS_METADATA, "columns": {**CENSUS_METADATA["columns"], "sector": {"type": "categorical"}}}
)
session = dp.Session(df, budget=dp.Budget(epsilon=2.0, delta=1e-6), metadata=meta, rng=rng)
print(session)

# 2. counts and mean income by sex, people over 30
r = (
    session.where("age > 30")
    .group_by("sex")
    .aggregate([dp.analytics.Count(), dp.analytics.Mean("income")], epsilon=0.5)
)
truth = df[df.age > 30].groupby("sex").agg(rows=("income", "size"), mean_income=("income", "mean"))
print("\nrows and mean income by sex (age > 30), ε = 0.5 — user level, 2 rows per person per group:")
print(r.table.round(1).to_string(index=False))
print("true (unbounded) values:\n" + truth.round(1).to_string())

# 3. the unit matters: a person's rows (up to 2 kept) vs a single row
user_rows = session.count(epsilon=0.25)
people = session.count_units(epsilon=0.25)
# The same columns, declared (wrongly, for this table) as one row per person — to show what it costs.
rows_meta = Metadata(columns=meta.columns, row_level=True)
row_level = dp.Session(df, budget=dp.Budget(epsilon=1.0), metadata=rows_meta, rng=rng).count(epsilon=0.25)
print(f"\nrows, user level (≤ 2 per person): {user_rows.value:.0f} ± {(user_rows.ci[1] - user_rows.value):.0f}")
print(
    f"rows, row level: {row_level.value:.0f} ± {(row_level.ci[1] - row_level.value):.0f} (true {len(df)}) "
    "— narrower and unbiased, but it protects one job, not one person"
)
print(f"people: {people.value:.0f} ± {(people.ci[1] - people.value):.0f} (true {df.person_id.nunique()})")

# 4. keys that are not public: selected privately (costs δ and a share of ε)
sectors = session.group_by("sector").count_units(epsilon=0.5, delta=1e-7)
print(f"\npeople by sector (keys selected privately, {sectors.keys}):")
print(sectors.table.round(0).to_string(index=False))

# 5. SQL and the budget
sql = "SELECT education, MEDIAN(income) AS median_income FROM data GROUP BY education"
print("\n" + sql)
print(session.sql(sql, epsilon=0.5).table.round(0).to_string(index=False))
print(f"remaining ε = {session.remaining:.3g}")
try:
    session.sql("SELECT COUNT(*) FROM data", epsilon=0.5)
except dp.BudgetExceededError as exc:
    print(f"refused: {exc}")
