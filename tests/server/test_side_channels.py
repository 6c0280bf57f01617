"""Side channels of the curator service: nothing an analyst receives depends on the data except
the noised, paid-for answer (DESIGN core idea 1).

* A poisoned row (text in a column that looks integer, far past any sniffing sample) cannot fail
  the load or a query, and its value never appears in an analyst's response; only the curator's
  data check at registration shows it.
* Metadata that does not say who is protected is refused at registration.
* A query the budget cannot pay for is refused before the engine runs: the engine is never
  called, and the refusal is the same, byte for byte, whether the person the query filters on
  has 1 row or 150,000.
* A failure after the debit is one fixed ``500 query_failed`` answer with the spend id; the
  spend stands and is in the audit log; the engine's message (which may quote data) goes to the
  curator's log only. Unexpected errors before the debit and sources that can no longer be read
  are fixed answers too.

Noise comes from the service's CSPRNG; the one assertion on a noisy value states its tail.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("httpx")

from fastapi.testclient import TestClient  # noqa: E402

from dpkit.analytics.engines.duckdb import DuckDBEngine  # noqa: E402
from dpkit.analytics.results import QueryResult  # noqa: E402
from dpkit.errors import InvalidParameterError, QueryFailedError  # noqa: E402
from dpkit.server import Service, create_app  # noqa: E402
from dpkit.server.errors import DatasetUnavailableError  # noqa: E402
from server._api import UNPACED  # noqa: E402

POISON = "SECRET-ZIP-9"
ROWS = 30_000  # the poisoned row is row 30,001: past DuckDB's sniffing sample (20,480 rows)


class Env:
    """A service over one CSV dataset ``people``, a curator and the analyst ``alice``."""

    def __init__(
        self, directory: Path, csv: Path, metadata: dict[str, Any], *, epsilon: float = 10.0, delta: float = 1e-5
    ) -> None:
        self.dir = directory
        self.service = Service(f"sqlite:///{directory / 'ledger.sqlite'}")
        _, self.curator_key = self.service.create_principal("carol", "curator")
        _, self.alice_key = self.service.create_principal("alice", "analyst")
        self.client = TestClient(
            create_app(self.service, rate=1e9, burst=10**9, **UNPACED), raise_server_exceptions=False
        )
        r = self.client.post(
            "/v1/datasets", headers=self.h("carol"), json={"name": "people", "source": str(csv), "metadata": metadata}
        )
        assert r.status_code == 201, r.text
        self.registration = r.json()
        r = self.client.post(
            "/v1/grants",
            headers=self.h("carol"),
            json={"analyst": "alice", "dataset": "people", "epsilon": epsilon, "delta": delta},
        )
        assert r.status_code == 201, r.text
        self.analyst_texts: list[str] = []  # every body an analyst received

    def h(self, who: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.curator_key if who == 'carol' else self.alice_key}"}

    def ask(self, method: str, path: str, body: Any = None) -> Any:
        """A request as alice; its body is kept for the leak checks."""
        r = self.client.request(method, path, headers=self.h("alice"), json=body)
        self.analyst_texts.append(r.text)
        return r

    def query(self, sql: str, epsilon: float = 1.0, **extra: Any) -> Any:
        return self.ask("POST", "/v1/datasets/people/query", {"epsilon": epsilon, "sql": sql, **extra})

    def spends(self) -> list[Any]:
        return self.service.ledger.list_spends("people", "alice")

    def close(self) -> None:
        self.client.close()
        self.service.close()


@pytest.fixture
def engine_calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every call of the DuckDB engine's row-reading method (compute: aggregates and quantile
    counts in one pass), in order."""
    calls: list[str] = []
    for name in ("compute",):
        original = getattr(DuckDBEngine, name)

        def counted(self: DuckDBEngine, plan: Any, _original: Any = original, _name: str = name) -> Any:
            calls.append(_name)
            return _original(self, plan)

        monkeypatch.setattr(DuckDBEngine, name, counted)
    return calls


def _leaks(text: str) -> bool:
    return "SECRET" in text or "Traceback" in text


# ------------------------------------------------------------------------------------------------
# (a) a poisoned row
# ------------------------------------------------------------------------------------------------


def _write_poisoned(path: Path) -> tuple[Path, int]:
    """``zip`` holds integers 0–9 in 30,000 rows, then 'SECRET-ZIP-9' in row 30,001. The number
    of rows with zip = 5 is returned."""
    rng = np.random.default_rng(30001)
    zips = rng.integers(0, 10, ROWS)
    frame = pd.DataFrame({"zip": zips.astype(str), "age": rng.integers(18, 90, ROWS)})
    frame.loc[ROWS] = [POISON, 40]
    frame.to_csv(path, index=False)
    return path, int((zips == 5).sum())


ZIP_DECLARATIONS = {
    "categorical-integer": {"type": "categorical", "value_type": "integer"},
    "numeric": {"type": "numeric"},
}


@pytest.mark.parametrize("declaration", list(ZIP_DECLARATIONS), ids=str)
def test_a_poisoned_row_cannot_fail_a_query_or_reach_an_analyst(
    declaration: str, tmp_path: Path, engine_calls: list[str]
) -> None:
    csv, truth = _write_poisoned(tmp_path / "people.csv")
    meta = {
        "row_level": True,
        "columns": {"zip": ZIP_DECLARATIONS[declaration], "age": {"type": "numeric", "lower": 0, "upper": 100}},
    }
    env = Env(tmp_path, csv, meta)
    try:
        # The curator — and only the curator — sees the poisoned value, in the data check.
        check = env.registration["check"]
        zip_check = next(c for c in check["columns"] if c["name"] == "zip")
        assert check["curator_only"] is True and zip_check["counts"]["unreadable"] == 1
        assert [v["value"] for v in zip_check["values"]] == [POISON]

        r = env.query("SELECT COUNT(*) FROM people WHERE zip = 5", epsilon=2.0)
        assert r.status_code == 200, r.text
        # ε = 2 on a count: discrete Laplace of scale 0.5, P[|noise| ≥ 20] = 2e^-40/(1 + e^-2) ≈ 7.5e-18
        assert abs(r.json()["rows"][0]["count"] - truth) < 20
        assert engine_calls == ["compute"]
        assert env.query("SELECT AVG(age), COUNT(*) FROM people WHERE zip = 9 OR zip IS NULL").status_code == 200
        assert env.query("SELECT zip, COUNT(*) FROM people GROUP BY zip", epsilon=1.0, delta=1e-6).status_code == 200
        assert env.query("SELECT MEDIAN(age) FROM people WHERE zip IN (1, 2, 3)").status_code == 200
        assert (
            env.ask(
                "POST",
                "/v1/datasets/people/query/cost",
                {"epsilon": 1.0, "sql": "SELECT COUNT(*) FROM people WHERE zip = 5"},
            ).status_code
            == 200
        )
        for path in ("/v1/datasets", "/v1/datasets/people", "/v1/budgets", "/v1/history"):
            assert env.ask("GET", path).status_code == 200
        assert not any(_leaks(t) for t in env.analyst_texts), [t for t in env.analyst_texts if _leaks(t)]
        # …nor does the audit log (which analysts see through their history) hold it
        assert not any(POISON in json.dumps(e.to_dict()) for e in env.service.audit_entries(limit=10**6))
    finally:
        env.close()


def test_the_poisoned_csv_is_copied_with_the_engines_fixed_read(tmp_path: Path) -> None:
    """The service's copy has every CSV column as text (typed only when a session binds it), so
    the poisoned row is in the copy, as NULL once read as an integer."""
    import duckdb

    csv, _ = _write_poisoned(tmp_path / "people.csv")
    with Service(f"sqlite:///{tmp_path / 'ledger.sqlite'}") as svc:
        info = svc.register_dataset(
            "people", csv, {"row_level": True, "columns": {"zip": {"type": "categorical", "value_type": "integer"}}}
        )
        conn = duckdb.connect(str(svc._load(info)), read_only=True)
        try:
            types = dict(
                conn.execute(
                    "SELECT column_name, data_type FROM information_schema.columns WHERE table_name = 'people'"
                ).fetchall()
            )
            assert types == {"zip": "VARCHAR", "age": "VARCHAR"}
            assert conn.execute("SELECT count(*) FROM people").fetchone()[0] == ROWS + 1
        finally:
            conn.close()
        assert info.check is not None and info.check.column("zip").unreadable == 1 and info.check.rows == ROWS + 1


# ------------------------------------------------------------------------------------------------
# (b) the privacy unit must be declared
# ------------------------------------------------------------------------------------------------


def test_metadata_without_a_unit_is_refused_at_registration(tmp_path: Path) -> None:
    csv, _ = _write_poisoned(tmp_path / "people.csv")
    with Service(f"sqlite:///{tmp_path / 'ledger.sqlite'}") as svc:
        for meta in ({"columns": {"zip": {"type": "numeric"}}}, {"row_level": False, "columns": {}}):
            with pytest.raises(InvalidParameterError) as info:
                svc.register_dataset("people", csv, meta)
            assert info.value.name == "metadata.privacy_unit" and "row_level" in str(info.value)
        assert svc.datasets() == []
        _, key = svc.create_principal("carol", "curator")
        with TestClient(create_app(svc), raise_server_exceptions=False) as client:
            r = client.post(
                "/v1/datasets",
                headers={"Authorization": f"Bearer {key}"},
                json={"name": "people", "source": str(csv), "metadata": {"columns": {}}},
            )
        assert r.status_code == 400 and r.json()["error"]["parameter"] == "metadata.privacy_unit"
        assert svc.datasets() == []


# ------------------------------------------------------------------------------------------------
# (c) a refusal never reaches the engine, and says nothing about the data
# ------------------------------------------------------------------------------------------------


def _write_people(path: Path, target_rows: int) -> Path:
    """1,000 people with one row each, and the person 'target' with ``target_rows`` rows."""
    others = pd.DataFrame({"person": [f"p{i}" for i in range(1000)], "age": np.arange(1000) % 70 + 18})
    target = pd.DataFrame({"person": ["target"] * target_rows, "age": np.full(target_rows, 50)})
    pd.concat([others, target]).to_csv(path, index=False)
    return path


UNIT_METADATA = {
    "privacy_unit": "person",
    "max_rows": 2,
    "columns": {
        "person": {"type": "categorical", "value_type": "string"},
        "age": {"type": "numeric", "lower": 0, "upper": 100},
    },
}
TARGET_SQL = "SELECT COUNT(*), AVG(age), MEDIAN(age) FROM people WHERE person = 'target'"


def _refusals(
    tmp_path: Path, target_rows: int, engine_calls: list[str], debits: list[str]
) -> list[tuple[int, dict[str, Any]]]:
    """Spend part of the budget, then ask what it cannot pay for: refused by the service's early
    check, and (ε a hair above the rest, within that check's slack) by the ledger's atomic debit
    inside the session. Each refusal must leave the engine uncalled."""
    d = tmp_path / f"rows{target_rows}"
    d.mkdir()
    env = Env(d, _write_people(d / "people.csv", target_rows), UNIT_METADATA, epsilon=1.0, delta=0.0)
    try:
        assert env.query("SELECT COUNT(*) FROM people", epsilon=0.5).status_code == 200
        spends = [s.id for s in env.spends()]
        out = []
        for epsilon, at_the_debit in ((0.75, False), (0.5 * (1 + 1e-10), True), (100.0, False)):
            engine_calls.clear()
            debits.clear()
            r = env.query(TARGET_SQL, epsilon=epsilon)
            assert r.status_code == 409, r.text
            assert engine_calls == [], f"a refused query ran the engine: {engine_calls}"
            assert debits == (["refused"] if at_the_debit else []), debits
            assert [s.id for s in env.spends()] == spends
            out.append((r.status_code, r.json()))
            preview = env.ask("POST", "/v1/datasets/people/query/cost", {"epsilon": epsilon, "sql": TARGET_SQL})
            assert preview.status_code == 200 and engine_calls == []
            out.append((preview.status_code, preview.json()))
        return out
    finally:
        env.close()


@pytest.fixture
def debits(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The outcome of every debit a session attempts ("paid" or "refused")."""
    from dpkit.analytics.session import Session
    from dpkit.errors import BudgetExceededError

    seen: list[str] = []
    original = Session._pay

    def pay(self: Session, *args: Any, **kwargs: Any) -> Any:
        try:
            out = original(self, *args, **kwargs)
        except BudgetExceededError:
            seen.append("refused")
            raise
        seen.append("paid")
        return out

    monkeypatch.setattr(Session, "_pay", pay)
    return seen


def test_a_refused_query_does_not_run_and_does_not_depend_on_the_data(
    tmp_path: Path, engine_calls: list[str], debits: list[str]
) -> None:
    one = _refusals(tmp_path, 1, engine_calls, debits)
    many = _refusals(tmp_path, 150_000, engine_calls, debits)
    assert one == many  # status and body, byte for byte (a refusal carries no volatile id)
    assert one[0][1]["error"]["code"] == "budget_exceeded"


# ------------------------------------------------------------------------------------------------
# (d) failures after the debit, and other failures
# ------------------------------------------------------------------------------------------------


@pytest.fixture
def people_env(tmp_path: Path) -> Iterator[Env]:
    csv, _ = _write_poisoned(tmp_path / "people.csv")
    meta = {
        "row_level": True,
        "columns": {
            "zip": {"type": "categorical", "value_type": "integer"},
            "age": {"type": "numeric", "lower": 0, "upper": 100},
        },
    }
    env = Env(tmp_path, csv, meta)
    yield env
    env.close()


def _assert_query_failed(env: Env, r: Any, epsilon: float, caplog: pytest.LogCaptureFixture) -> int:
    assert r.status_code == 500, r.text
    body = r.json()
    spend_id = body["error"]["spend_id"]
    assert body == {"error": {"code": "query_failed", "message": QueryFailedError.MESSAGE, "spend_id": spend_id}}
    assert "SECRET" not in r.text and "Traceback" not in r.text
    # the spend stands with the entry its debit wrote; the request's own entry says the answer
    # failed and names the spend without recording the amount twice
    spends = env.spends()
    assert [s.id for s in spends] == [spend_id] and spends[0].epsilon_cost == pytest.approx(epsilon)
    paid, entry = env.service.audit_entries(limit=10**6)[-2:]
    assert (paid.action, paid.outcome, paid.detail.get("spend_id")) == (
        "query",
        "paid",
        spend_id,
    ) and paid.epsilon is not None
    assert (entry.action, entry.status, entry.detail.get("spend_id")) == ("query_failed", 500, spend_id)
    assert (
        entry.outcome.startswith("query_failed")
        and entry.epsilon is None
        and "SECRET" not in json.dumps(entry.to_dict())
    )
    env.service.verify_log()
    assert env.service.unlogged_spends() == []
    history = env.ask("GET", "/v1/history")
    assert history.status_code == 200 and "SECRET" not in history.text
    # the details went to the curator's log
    assert any(r.name == "dpkit.curator" and r.exc_info for r in caplog.records)
    return spend_id


@pytest.mark.parametrize("query", ["count", "median"])
def test_a_failure_after_the_debit_is_one_generic_answer(
    query: str, people_env: Env, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def fail(self: DuckDBEngine, plan: Any) -> Any:
        raise RuntimeError(
            f"Conversion Error: could not convert string {POISON!r} on line 30002 of {people_env.dir}/people.csv"
        )

    monkeypatch.setattr(DuckDBEngine, "compute", fail)
    sql = (
        "SELECT COUNT(*) FROM people WHERE zip = 5"
        if query == "count"
        else "SELECT MEDIAN(age) FROM people WHERE zip = 5"
    )
    with caplog.at_level(logging.ERROR, logger="dpkit.curator"):
        r = people_env.query(sql, epsilon=0.5)
    _assert_query_failed(people_env, r, 0.5, caplog)
    assert str(people_env.dir) not in r.text
    assert any(
        POISON in (rec.exc_text or "") or (rec.exc_info and POISON in str(rec.exc_info[1])) for rec in caplog.records
    )


def test_a_failure_while_answering_after_the_debit_is_the_same_answer(
    people_env: Env, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def fail(self: QueryResult) -> Any:
        raise ValueError(f"cannot encode {POISON}")

    monkeypatch.setattr(QueryResult, "to_dict", fail)
    with caplog.at_level(logging.ERROR, logger="dpkit.curator"):
        r = people_env.query("SELECT COUNT(*) FROM people", epsilon=0.25)
    _assert_query_failed(people_env, r, 0.25, caplog)


def test_an_unexpected_error_before_the_debit_is_a_fixed_answer(
    people_env: Env, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def fail(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"bug near {POISON}")

    monkeypatch.setattr(Service, "_compile", staticmethod(fail))
    with caplog.at_level(logging.ERROR, logger="dpkit.curator"):
        for path in ("/v1/datasets/people/query", "/v1/datasets/people/query/cost"):
            r = people_env.ask("POST", path, {"epsilon": 0.5, "sql": "SELECT COUNT(*) FROM people"})
            assert r.status_code == 500 and r.json() == {
                "error": {"code": "query_failed", "message": QueryFailedError.MESSAGE, "spend_id": None}
            }
            assert "SECRET" not in r.text
    assert people_env.spends() == []
    assert any(rec.name == "dpkit.curator" for rec in caplog.records)


def test_a_source_that_can_no_longer_be_read_is_a_fixed_answer(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The CSV and the service's copy of it disappear between registration and the first query
    (the copy alone would still answer, and a missing copy alone is re-made from the CSV): a
    fixed 503 before any spend, naming no path (the curator's log says what happened)."""
    csv, _ = _write_poisoned(tmp_path / "people.csv")
    env = Env(tmp_path, csv, {"row_level": True, "columns": {"zip": {"type": "numeric"}}})
    try:
        csv.unlink()
        for copy in (tmp_path / "ledger.sqlite.datasets").glob("people-*.duckdb"):
            copy.unlink()
        with caplog.at_level(logging.WARNING, logger="dpkit.curator"):
            r = env.query("SELECT COUNT(*) FROM people")
        assert r.status_code == 503
        assert r.json() == {"error": {"code": "dataset_unavailable", "message": DatasetUnavailableError.MESSAGE}}
        assert "people.csv" not in r.text and str(tmp_path) not in r.text
        assert env.spends() == []
        assert any(rec.name == "dpkit.curator" for rec in caplog.records)
    finally:
        env.close()
