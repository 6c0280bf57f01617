"""A dataset of several tables for the service, CLI and client tests: a hospital's visits and
prescriptions (private, one patient per ``patient_id``), the public regions of its postcodes and
its public list of wards.

Import it as ``from server._tables import ...`` (``tests`` is on the test path).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

#: The curator's declarations: two private tables joined on the unit (each truncated to its
#: ``join_rows`` per patient), a public table of one region per postcode (``max_matches`` 1), a
#: public key table, and a public table that declares no ``max_matches`` (it cannot be joined).
HOSPITAL_METADATA: dict[str, Any] = {
    "tables": {
        "visits": {
            "privacy_unit": "patient_id",
            "join_rows": 3,
            "columns": {
                "postcode": {"type": "categorical"},
                "cost": {"type": "numeric", "lower": 0, "upper": 100},
                "ward": {"type": "categorical"},
            },
        },
        "prescriptions": {
            "privacy_unit": "patient_id",
            "join_rows": 2,
            "columns": {"drug": {"type": "categorical"}, "dose": {"type": "numeric", "lower": 0, "upper": 10}},
        },
        "regions": {
            "public": True,
            "max_matches": 1,
            "columns": {"postcode": {"type": "categorical"}, "region": {"type": "categorical"}},
        },
        "wards": {"public": True, "max_matches": 1, "columns": {"ward": {"type": "categorical"}}},
        "notes": {"public": True, "columns": {"postcode": {"type": "categorical"}, "note": {"type": "categorical"}}},
    },
    "max_groups": 1,
    "max_rows": 10,
}

#: Each table's file, relative to the directory :func:`write_hospital` writes.
HOSPITAL_FILES = {
    "visits": "visits.csv",
    "prescriptions": "prescriptions.parquet",
    "regions": "regions.csv",
    "wards": "wards.csv",
    "notes": "notes.csv",
}

JOIN_SQL = "SELECT r.region, COUNT(*) FROM visits v JOIN regions r ON v.postcode = r.postcode GROUP BY r.region"
#: The same query in the service's JSON form.
JOIN_SPEC: dict[str, Any] = {
    "from": "visits",
    "join": [{"table": "regions", "on": ["postcode"]}],
    "group_by": ["region"],
    "aggregates": [{"kind": "count"}],
}


def write_hospital(directory: Path, seed: int = 0) -> dict[str, Path]:
    """Write the tables (CSV, and Parquet for the prescriptions) and ``hospital.json``; each
    table's path."""
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    n, m = 400, 300
    frames = {
        "visits": pd.DataFrame(
            {
                "patient_id": rng.integers(0, 50, n),
                "postcode": rng.choice(["A", "B", "C", "D"], n),
                "cost": rng.uniform(0, 100, n).round(2),
                "ward": rng.choice(["w1", "w2"], n),
            }
        ),
        "prescriptions": pd.DataFrame(
            {"patient_id": rng.integers(0, 60, m), "drug": rng.choice(["x", "y"], m), "dose": rng.uniform(0, 10, m)}
        ),
        "regions": pd.DataFrame(
            {"postcode": ["A", "B", "C", "D", "E"], "region": ["north", "north", "south", "south", "east"]}
        ),
        "wards": pd.DataFrame({"ward": ["w1", "w2", "w3"]}),
        "notes": pd.DataFrame({"postcode": ["A", "A", "B"], "note": ["n1", "n2", "n3"]}),
    }
    paths = {}
    for name, frame in frames.items():
        path = directory / HOSPITAL_FILES[name]
        if path.suffix == ".parquet":
            frame.to_parquet(path, index=False)
        else:
            frame.to_csv(path, index=False)
        paths[name] = path
    (directory / "hospital.json").write_text(json.dumps(HOSPITAL_METADATA), encoding="utf-8")
    return paths
