"""Reading data is a release too: one person's bytes cannot change how anyone else is read.

Differential privacy bounds how much one person changes an answer — but only if the rows the
mechanism sees are the rows the people gave. A reader that decides record boundaries or column
types from the file as a whole lets one person's line change every other row, and no noise covers
that. This script builds a table D of 200 people and D+1, the same with one hostile person, in three
forms, and shows what an exact count (noise switched off by a huge ε) sees:

1. CSV: the person's field opens a quote and never closes it (``33,A,"oops``). A reader that lets a
   quoted field run across lines swallows every following line; dpkit reads one line a record and
   drops the malformed line alone.
2. Parquet: the person's file stores ``age`` as text (``"N/A"``) while the others store integers;
   dpkit reads each file by its own types.
3. pandas: the person's missing code (NaN) turns an int64 column float64; dpkit reads ``1.0`` as the
   category ``"1"`` whatever the dtype.

Then ``dpkit check``'s reading report tells the curator what was dropped or repaired.

Run:  .venv/bin/python examples/reading_is_a_release.py
"""

import tempfile
from pathlib import Path

import duckdb
import numpy as np
import pandas as pd

import dpkit as dp
from dpkit.analytics import Categorical, Metadata, Numeric
from dpkit.analytics.check import check_data

rng = np.random.default_rng(7)
people = pd.DataFrame(
    {"age": rng.integers(18, 90, 200), "city": rng.choice(["A", "B"], 200), "code": rng.choice([1, 2], 200)}
)
meta = Metadata(
    columns={"age": Numeric(0, 100), "city": Categorical(("A", "B")), "code": Categorical(("1", "2"))}, row_level=True
)


def exact_count(session: dp.Session) -> int:
    # ε = 10^6: noise of scale 10^-6, so the rounded count is the exact count the mechanism saw
    return round(session.count(epsilon=1e6).value)


def by_code(session: dp.Session) -> dict[str, int]:
    r = session.group_by("code").count(epsilon=1e6)
    return {str(k): round(v) for k, v in zip(r.table["code"], r.table["count"], strict=True)}


work = Path(tempfile.mkdtemp())
budget = 1e8

# 1. CSV with a stray quote, written in the middle of the file
lines = [f"{a},{c},{k}\n" for a, c, k in people.itertuples(index=False)]
d_csv, d1_csv = work / "d.csv", work / "d_plus.csv"
d_csv.write_text("age,city,code\n" + "".join(lines))
d1_csv.write_text("age,city,code\n" + "".join(lines[:100]) + '33,A,"oops\n' + "".join(lines[100:]))
old = duckdb.sql(
    f"SELECT count(*) FROM read_csv('{d1_csv}', header = true, auto_detect = false, quote = '\"', escape = '\"', "
    "columns = {'age': 'VARCHAR', 'city': 'VARCHAR', 'code': 'VARCHAR'}, null_padding = true, ignore_errors = true, "
    "strict_mode = false)"
).fetchall()[0][0]
print("1. CSV, one person's line opens a quote that never closes")
print(f"   a reader whose quotes span lines reads {old} rows of D+1 (D has 200): the rest were swallowed")
for name, path in (("D", d_csv), ("D+1", d1_csv)):
    print(
        f"   dpkit, {name:3}: exact count {exact_count(dp.Session.from_csv(path, metadata=meta, budget=dp.Budget(epsilon=budget)))}"
    )

# 2. Parquet files that disagree on a column's physical type
parts = work / "parts"
parts.mkdir()
people.iloc[:100].to_parquet(parts / "part-0.parquet")
people.iloc[100:].to_parquet(parts / "part-1.parquet")
print("\n2. Parquet, one person's file stores age as text")
d_age = dp.Session.from_parquet(parts, metadata=meta, budget=dp.Budget(epsilon=budget)).mean("age", epsilon=1e6).value
pd.DataFrame({"age": ["N/A"], "city": ["A"], "code": [1]}).to_parquet(parts / "part-2.parquet")
d1 = dp.Session.from_parquet(parts, metadata=meta, budget=dp.Budget(epsilon=budget))
print(f"   D: mean age {d_age:.2f}; D+1: mean age {d1.mean('age', epsilon=1e6).value:.2f}, count {exact_count(d1)} "
      "(the person's 'N/A' is NULL; the other files read as before)")  # fmt: skip

# 3. pandas: a NaN that turns the column float64
d1_frame = pd.concat([people, pd.DataFrame({"age": [40], "city": ["B"], "code": [np.nan]})], ignore_index=True)
print(f"\n3. pandas, one person's missing code makes the column {d1_frame['code'].dtype} (was {people['code'].dtype})")
for name, frame in (("D", people), ("D+1", d1_frame)):
    print(f"   {name:3}: counts by code {by_code(dp.Session(frame, metadata=meta, budget=dp.Budget(epsilon=budget)))}")

# What the curator's check says about the hostile CSV (curator only: it is not a private release)
print("\nThe curator's check of D+1.csv:")
reading = check_data(d1_csv, meta).reading
print("   " + "\n   ".join(reading.lines() if reading is not None else []))
