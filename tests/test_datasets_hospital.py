"""The hospital example (``dpkit.datasets.hospital``): the facts the joins guide and
``examples/hospital_joins.py`` rely on — keys that the declared ``max_matches`` really bound,
rows per patient within what the guide says, out-of-town postcodes for the LEFT JOIN, empty key
groups — and metadata that opens a session whose private join is priced at 4 x 2 rows."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import dpkit as dp
from dpkit.analytics import DatasetMetadata
from dpkit.datasets import HOSPITAL_METADATA, hospital
from dpkit.errors import InvalidParameterError


@pytest.fixture(scope="module")
def tables() -> dict[str, pd.DataFrame]:
    return hospital(patients=600)


def test_it_is_deterministic_per_seed() -> None:
    a, b, c = hospital(patients=200), hospital(patients=200), hospital(patients=200, seed=1)
    for name in a:
        pd.testing.assert_frame_equal(a[name], b[name])
    assert not a["visits"].equals(c["visits"])


def test_the_public_tables_hold_their_declared_max_matches(tables: dict[str, pd.DataFrame]) -> None:
    # max_matches = 1 in HOSPITAL_METADATA: the join keys are keys of the public tables
    assert tables["regions"]["postcode"].is_unique and tables["wards"]["ward"].is_unique
    for name in ("regions", "wards"):
        assert HOSPITAL_METADATA["tables"][name]["max_matches"] == 1


def test_rows_per_patient(tables: dict[str, pd.DataFrame]) -> None:
    visits = tables["visits"].groupby("patient_id").size()
    assert len(visits) == 600 and visits.min() >= 1 and visits.max() <= 6
    assert (visits > HOSPITAL_METADATA["tables"]["visits"]["join_rows"]).any()  # truncation has work to do
    prescribed = tables["prescriptions"].groupby("patient_id").size()
    assert prescribed.max() <= 4 and len(prescribed) < 600  # some patients have none (LEFT JOIN)
    assert set(prescribed.index) <= set(visits.index)


def test_what_the_guide_shows_is_in_the_data(tables: dict[str, pd.DataFrame]) -> None:
    visits, regions = tables["visits"], tables["regions"]
    away = ~visits["postcode"].isin(regions["postcode"])
    assert 0 < away.sum() < 0.1 * len(visits)  # out-of-town visits: inner and left joins differ
    assert set(visits["ward"]) < set(tables["wards"]["ward"])  # paediatrics: an empty key group
    harbour = regions.loc[regions["region"] == "Harbour", "postcode"]
    assert len(harbour) and not visits["postcode"].isin(harbour).any()
    assert visits["cost"].ge(0).all() and tables["prescriptions"]["dose"].between(0, 1000).all()


def test_the_metadata_declares_every_column_and_opens_a_session(tables: dict[str, pd.DataFrame]) -> None:
    meta = DatasetMetadata.from_dict(HOSPITAL_METADATA)
    assert DatasetMetadata.from_dict(meta.to_dict()) == meta
    for name, t in meta.tables.items():
        declared = set(t.columns) | ({t.privacy_unit} if t.privacy_unit else set())
        assert declared == set(tables[name].columns), name
    s = dp.Session(tables, metadata=meta, budget=dp.Budget(epsilon=1), rng=np.random.default_rng(0))
    # the guide's private join: 4 visits x 2 prescriptions = 8 rows per patient, below max_rows = 10
    r = s.query("visits").join("prescriptions", on="patient_id").count(epsilon=1)
    assert r.max_rows == 8 and r.scale == 8.0


@pytest.mark.parametrize("bad", [{"patients": 0}, {"patients": 1.5}, {"seed": -1}, {"seed": True}])
def test_bad_arguments_are_refused(bad: dict[str, object]) -> None:
    with pytest.raises(InvalidParameterError):
        hospital(**bad)  # type: ignore[arg-type]
