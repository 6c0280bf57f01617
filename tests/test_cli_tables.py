"""``dpkit query`` and ``dpkit check`` on a dataset of several tables: one ``TABLE=PATH`` per
declared table when the metadata declares ``tables``; the one-table form is unchanged.

Every check here is deterministic (false-failure rate 0): no noisy value is compared.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dpkit.cli import app
from dpkit.ledger import open_ledger
from server._tables import HOSPITAL_FILES, JOIN_SQL, write_hospital

runner = CliRunner()


@pytest.fixture
def hospital(tmp_path: Path) -> dict[str, str]:
    """The hospital's tables, its metadata and a ledger with ``ann``'s budget on ``hospital``."""
    write_hospital(tmp_path)
    ledger = str(tmp_path / "ledger.sqlite")
    made = runner.invoke(app, ["budget", "create", "hospital", "ann", "--epsilon", "3", "--ledger", ledger])
    assert made.exit_code == 0, made.output
    return {"dir": str(tmp_path), "meta": str(tmp_path / "hospital.json"), "ledger": ledger}


def _pairs(h: dict[str, str]) -> list[str]:
    return [f"{t}={Path(h['dir']) / f}" for t, f in HOSPITAL_FILES.items()]


def _query(h: dict[str, str], sql: str, *args: str):  # type: ignore[no-untyped-def]
    return runner.invoke(
        app,
        [
            "query",
            *_pairs(h),
            sql,
            "--metadata",
            h["meta"],
            "--epsilon",
            "1",
            "--ledger",
            h["ledger"],
            "--analyst",
            "ann",
        ]
        + list(args),
    )


def test_check_reports_each_table(hospital: dict[str, str]) -> None:
    out = runner.invoke(app, ["check", *_pairs(hospital), "--metadata", hospital["meta"]])
    assert out.exit_code == 0, out.output
    assert "data check of visits: 400 rows" in out.output and "data check of regions: 5 rows" in out.output
    assert "public table" in out.output
    out = runner.invoke(app, ["check", *_pairs(hospital), "--metadata", hospital["meta"], "--json"])
    body = json.loads(out.output)
    assert body["ok"] is True and set(body["tables"]) == set(HOSPITAL_FILES)
    assert body["tables"]["prescriptions"]["rows"] == 300 and body["tables"]["wards"]["public"] is True


def test_check_exits_1_when_a_table_does_not_conform(hospital: dict[str, str]) -> None:
    visits = Path(hospital["dir"]) / "visits.csv"
    visits.write_text(visits.read_text() + "7,A,999,w1\n")  # a cost above its bound
    out = runner.invoke(app, ["check", *_pairs(hospital), "--metadata", hospital["meta"], "--json"])
    assert out.exit_code == 1, out.output
    body = json.loads(out.output)
    assert body["ok"] is False and body["tables"]["visits"]["ok"] is False and body["tables"]["regions"]["ok"]


@pytest.mark.parametrize(
    ("data", "options", "said"),
    [
        (["visits"], [], "expected TABLE=PATH"),
        (["visits=a.csv", "visits=b.csv"], [], "given twice"),
        (None, ["--table", "x"], "--table: not with several tables"),
        (None, ["--delimiter", ";"], "--delimiter: not with several tables"),
    ],
)
def test_check_refuses_a_malformed_command_line(
    hospital: dict[str, str], data: list[str] | None, options: list[str], said: str
) -> None:
    args = ["check", *(data or _pairs(hospital)), "--metadata", hospital["meta"], *options]
    out = runner.invoke(app, args)
    assert out.exit_code == 2 and said in " ".join(out.output.split()), out.output


def test_check_names_a_missing_table(hospital: dict[str, str]) -> None:
    out = runner.invoke(app, ["check", *_pairs(hospital)[:-1], "--metadata", hospital["meta"]])
    assert out.exit_code == 2 and "missing ['notes']" in " ".join(out.output.split()), out.output


def test_query_joins_several_tables_paid_from_the_named_budget(hospital: dict[str, str]) -> None:
    out = _query(hospital, JOIN_SQL, "--dataset", "hospital", "--json")
    assert out.exit_code == 0, out.output
    body = json.loads(out.stdout)
    assert sorted(r["region"] for r in body["rows"]) == ["east", "north", "south"]
    assert body["budget"]["dataset"] == "hospital" and body["budget"]["spent_epsilon"] == 1.0
    out = _query(hospital, "SELECT COUNT(*) FROM prescriptions", "--dataset", "hospital")
    assert out.exit_code == 0, out.output
    assert "budget hospital/ann: spent ε=2 of 3" in out.stdout


def test_query_of_several_tables_needs_the_dataset_named(hospital: dict[str, str]) -> None:
    out = _query(hospital, JOIN_SQL)
    assert out.exit_code == 1 and "--dataset NAME" in out.output, out.output


@pytest.mark.parametrize("option", [["--unit", "patient_id"], ["--table", "visits"], ["--engine", "spark"]])
def test_query_refuses_one_table_options_with_several_tables(hospital: dict[str, str], option: list[str]) -> None:
    out = _query(hospital, JOIN_SQL, "--dataset", "hospital", *option)
    assert out.exit_code == 1 and f"{option[0]}: not with several tables" in out.output, out.output


def test_query_refuses_a_bad_join_before_paying(hospital: dict[str, str]) -> None:
    sql = "SELECT COUNT(*) FROM visits v JOIN prescriptions p ON v.ward = p.drug"
    out = _query(hospital, sql, "--dataset", "hospital")
    assert out.exit_code == 1 and "privacy units" in " ".join(out.output.split()), out.output
    with open_ledger(hospital["ledger"]) as ledger:
        assert ledger.get_budget("hospital", "ann").spent_epsilon == 0


def test_one_table_form_takes_one_data_argument(hospital: dict[str, str], tmp_path: Path) -> None:
    meta = tmp_path / "one.json"
    meta.write_text(json.dumps({"row_level": True, "columns": {"ward": {"type": "categorical"}}}))
    out = runner.invoke(
        app,
        ["query", "a.csv", "b.csv", "SELECT COUNT(*) FROM a", "--metadata", str(meta), "--epsilon", "1"],
    )
    assert out.exit_code == 1 and "DATA: one file" in out.output, out.output
    out = runner.invoke(app, ["check", "a.csv", "b.csv", "--metadata", str(meta)])
    assert out.exit_code == 2 and "DATA: one file" in out.output, out.output


def test_generate_hospital_writes_a_table_per_declared_table_that_queries_read(tmp_path: Path) -> None:
    out, meta = tmp_path / "hospital", tmp_path / "hospital.json"
    made = runner.invoke(app, ["generate", "hospital", str(out), "--people", "300", "--metadata", str(meta)])
    assert made.exit_code == 0, made.output
    declared = json.loads(meta.read_text(encoding="utf-8"))
    assert sorted(p.stem for p in out.glob("*.csv")) == sorted(declared["tables"])
    ledger = str(tmp_path / "ledger.sqlite")
    assert (
        runner.invoke(app, ["budget", "create", "hospital", "ann", "--epsilon", "3", "--ledger", ledger]).exit_code == 0
    )
    pairs = [f"{t}={out / f'{t}.csv'}" for t in declared["tables"]]
    sql = "SELECT COUNT(*) FROM visits v JOIN prescriptions p ON v.patient_id = p.patient_id"
    args = ["--metadata", str(meta), "--dataset", "hospital", "--epsilon", "1", "--ledger", ledger, "--analyst", "ann"]
    answered = runner.invoke(app, ["query", *pairs, sql, *args])
    assert answered.exit_code == 0, answered.output
    assert open_ledger(ledger).get_budget("hospital", "ann").spent_epsilon == pytest.approx(1.0)


def test_generate_hospital_refuses_a_file_as_its_directory(tmp_path: Path) -> None:
    target = tmp_path / "taken.csv"
    target.write_text("x\n", encoding="utf-8")
    result = runner.invoke(app, ["generate", "hospital", str(target)])
    assert result.exit_code == 1 and "is a file" in " ".join(result.output.split())
