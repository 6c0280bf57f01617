"""Queries over several tables: the textbook's hospital, joined inside the private query.

§5.1, tables 5.1-5.3: two hospitals' blurred patient tables, each harmless alone, joined by a
reader on age band, sex and postcode prefix, give away a diagnosis. The join itself is not the
fault; releasing rows for someone else to join is. Here the curator holds the tables (generated
by ``dpkit.datasets.hospital``: visits and prescriptions of the same patients, and the public
lists of postcodes and wards), the join runs inside the query, and only noisy aggregates leave,
each priced by the most one patient can change the joined table:

1. visits x regions (public, max_matches=1), by district: priced like visits alone;
2. visits x prescriptions on the patient (private): each side truncated to its join_rows
   (4 visits, 2 prescriptions), so a patient has at most 4 x 2 = 8 joined rows — the price;
3. visits per ward with the keys from the public ward list (keys_from), and the same in SQL;

then the refusals an analyst meets, each before anything is paid.

Run:  .venv/bin/python examples/hospital_joins.py [--seed N]
"""

import argparse

import numpy as np

import dpkit as dp
from dpkit.analytics import DatasetMetadata
from dpkit.datasets import HOSPITAL_METADATA, hospital
from dpkit.errors import InvalidParameterError

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--seed", type=int, default=None, help="seed the noise (reproducible, not secure)")
args = parser.parse_args()
rng = None if args.seed is None else np.random.default_rng(args.seed)

tables = hospital()
meta = DatasetMetadata.from_dict(HOSPITAL_METADATA)
session = dp.Session(tables, metadata=meta, budget=dp.Budget(epsilon=3.0), rng=rng)
print("tables:", ", ".join(f"{name} ({len(t)} rows)" for name, t in tables.items()))
print(
    f"private: {meta.private_tables}, public: {meta.public_tables}; max_groups={meta.max_groups}, max_rows={meta.max_rows}"
)


def show(title: str, result: dp.analytics.QueryResult, truth: object = None, label: str = "true values") -> None:
    print(f"\n== {title}")
    print(f"cost ε = {result.epsilon:g}; {result.unit_description}; noise scale {result.aggregates[0].scale:g}")
    print(result.table.round(1).to_string(index=False))
    print(result.bounding.text if result.bounding is not None else "")
    if truth is not None:
        print(f"{label}:", truth)


visits, regions = tables["visits"], tables["regions"]

# 1. a private table joined with a public one
q1 = session.query("visits").join("regions", on="postcode").group_by("region")
cost = q1.cost([dp.analytics.Count()], epsilon=0.5)
print(f"\n1. priced before anything is read: ε = {cost.epsilon:g} for {cost.text!r}")
r1 = q1.count(epsilon=0.5)
truth1 = visits.merge(regions, on="postcode").groupby("region").size().to_dict()
show("visits per district (visits JOIN regions)", r1, truth1)

# 2. two private tables joined on the patient
q2 = session.query("visits").join("prescriptions", on="patient_id").where("ward = 'oncology'")
drugs = sorted(tables["prescriptions"]["drug"].unique())  # the formulary: a public list
r2 = q2.group_by("drug", keys=drugs).count_units(epsilon=0.5)
show("patients seen in oncology, per drug (visits JOIN prescriptions on the patient)", r2)
pairs = session.query("visits").join("prescriptions", on="patient_id").count(epsilon=0.5)
show("joined (visit, prescription) rows: at most 4 x 2 = 8 per patient", pairs)

# 3. group keys from a public table, builder and SQL
r3 = session.query("visits").group_by("ward", keys_from="wards").count_units(epsilon=0.5)
truth3 = visits.groupby("ward")["patient_id"].nunique().to_dict()
show(
    "patients per ward, keys from the public ward list",
    r3,
    truth3,
    "true patients with a visit there (one seen in two wards counts in both; the release, with max_groups=1, in one)",
)
r3_sql = session.sql(
    "SELECT w.ward, COUNT(DISTINCT patient_id) AS patients FROM visits v JOIN wards w ON v.ward = w.ward GROUP BY w.ward",
    epsilon=0.5,
)
show("the same in SQL (GROUP BY the public table's column)", r3_sql)
print(f"\nremaining ε: {session.remaining:g}")

# the refusals, before anything is paid
print("\nRefused before paying:")
for what, attempt in [
    (
        "private x private, not on the patient",
        lambda: session.query("visits").join("prescriptions", on={"ward": "drug"}),
    ),
    ("a public table read alone", lambda: session.query("regions").count(epsilon=0.1)),
    ("the budget spent", lambda: session.query("visits").join("regions", on="postcode").count(epsilon=1)),
]:
    try:
        attempt()
        print(f"- {what}: answered (unexpected)")
        raise SystemExit(1)
    except (InvalidParameterError, dp.BudgetExceededError) as e:
        print(f"- {what}: {type(e).__name__}: {str(e)[:160]}…")
print(f"remaining ε: {session.remaining:g}")
