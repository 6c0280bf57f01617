"""``dpkit.client`` on a dataset of several tables: the description of each table round-trips
into the curator's metadata, and SQL with a join is answered as a local session answers it.

Deterministic (false-failure rate 0): no noisy value is compared.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("fastapi", reason="the server extra (FastAPI) is not installed")

from _live_server import live_server  # noqa: E402
from dpkit.analytics.dataset_metadata import DatasetMetadata  # noqa: E402
from dpkit.analytics.results import QueryCost, QueryResult  # noqa: E402
from dpkit.client import connect  # noqa: E402
from dpkit.errors import InvalidParameterError  # noqa: E402
from dpkit.server import Service, create_app  # noqa: E402
from server._api import UNPACED  # noqa: E402
from server._tables import HOSPITAL_FILES, HOSPITAL_METADATA, JOIN_SQL, write_hospital  # noqa: E402


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Service, str, str]]:
    directory = tmp_path_factory.mktemp("tables")
    write_hospital(directory)
    service = Service(f"sqlite:///{directory / 'ledger.sqlite'}")
    try:
        sources = {t: str(directory / f) for t, f in HOSPITAL_FILES.items()}
        service.register_dataset("hospital", sources, HOSPITAL_METADATA)
        _, key = service.create_principal("alice", "analyst")
        service.grant("alice", "hospital", epsilon=5.0)
        settings: dict[str, Any] = {"rate": 1e6, "burst": 1_000_000, **UNPACED}
        with live_server(create_app(service, **settings)) as base:
            yield service, base, key
    finally:
        service.close()


def test_the_description_of_several_tables_round_trips(live: tuple[Service, str, str]) -> None:
    _, base, key = live
    s = connect(base, key)
    described = s.dataset("hospital")
    assert described == next(d for d in s.datasets() if d["name"] == "hospital")
    tables = described["tables"]
    assert tables["visits"]["public"] is False and tables["regions"]["public"] is True
    declared = DatasetMetadata.from_dict({k: described[k] for k in ("tables", "max_groups", "max_rows")})
    assert declared == DatasetMetadata.from_dict(HOSPITAL_METADATA)


def test_sql_with_a_join_through_the_client(live: tuple[Service, str, str]) -> None:
    service, base, key = live
    s = connect(base, key)
    cost = s.cost("hospital", JOIN_SQL, epsilon=1.0)
    assert isinstance(cost, QueryCost) and cost.epsilon == 1.0
    r = s.sql("hospital", JOIN_SQL, epsilon=1.0)
    assert isinstance(r, QueryResult) and r.event == cost.event
    assert sorted(r.table["region"]) == ["east", "north", "south"] and list(r.groups) == ["region"]
    assert "before joining, regions at most 1 row(s) per join key" in str(r)  # what the interval covers
    assert s.remaining("hospital") == pytest.approx(4.0)
    # a join the metadata does not allow is refused as locally, before any debit
    with pytest.raises(InvalidParameterError, match="privacy units"):
        s.sql("hospital", "SELECT COUNT(*) FROM visits v JOIN prescriptions p ON v.ward = p.drug", epsilon=1.0)
    assert len(service.ledger.list_spends("hospital", "alice")) == 1
