"""``dpkit admin register-dataset``: the curator sees the data check (and only the curator: it is
printed on the curator's terminal, never stored); metadata without a privacy unit is refused."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from dpkit.server import Service
from dpkit.server.cli import admin_app

ROWS = "zip,age\n" + "".join(f"{i % 10},{20 + i % 50}\n" for i in range(200)) + "N/A,30\n"


def _files(tmp_path: Path, meta: dict) -> tuple[Path, Path, str]:
    csv = tmp_path / "people.csv"
    csv.write_text(ROWS)
    metadata = tmp_path / "meta.json"
    metadata.write_text(json.dumps(meta))
    return csv, metadata, f"sqlite:///{tmp_path / 'ledger.sqlite'}"


def test_register_dataset_prints_the_data_check(tmp_path: Path) -> None:
    csv, meta, ledger = _files(
        tmp_path,
        {
            "row_level": True,
            "columns": {
                "zip": {"type": "categorical", "value_type": "integer"},
                "age": {"type": "numeric", "lower": 0, "upper": 60},
            },
        },
    )
    out = CliRunner().invoke(
        admin_app, ["register-dataset", "people", str(csv), "--metadata", str(meta), "--ledger", ledger]
    )
    assert out.exit_code == 0, out.output
    assert "registered dataset 'people'" in out.output and "row-level" in out.output
    assert "curator only" in out.output and "'N/A'" in out.output  # the non-conforming value, for the curator
    with Service(ledger) as svc:
        assert [d.name for d in svc.datasets()] == ["people"]
        assert all("N/A" not in json.dumps(e.to_dict()) for e in svc.audit_entries())  # not stored in the log
    csv2 = tmp_path / "people2.csv"
    csv2.write_text(ROWS)
    out = CliRunner().invoke(
        admin_app, ["register-dataset", "people2", str(csv2), "--metadata", str(meta), "--ledger", ledger, "--json"]
    )
    assert out.exit_code == 0, out.output
    body = json.loads(out.output)
    assert body["name"] == "people2" and body["check"]["curator_only"] is True
    assert next(c for c in body["check"]["columns"] if c["name"] == "zip")["counts"]["unreadable"] == 1


def test_register_dataset_without_a_unit_is_refused(tmp_path: Path) -> None:
    csv, meta, ledger = _files(tmp_path, {"columns": {"zip": {"type": "numeric"}}})
    out = CliRunner().invoke(
        admin_app, ["register-dataset", "people", str(csv), "--metadata", str(meta), "--ledger", ledger]
    )
    assert out.exit_code == 1
    assert "privacy_unit" in out.output and "row_level" in out.output
    with Service(ledger) as svc:
        assert svc.datasets() == []


def test_admin_errors_are_worded_for_the_command_line(tmp_path: Path) -> None:
    """A refused grant names the option, not the Python keyword, and its text copies whole."""
    csv, meta, ledger = _files(
        tmp_path, {"row_level": True, "columns": {"age": {"type": "numeric", "lower": 0, "upper": 60}}}
    )
    runner = CliRunner()
    assert (
        runner.invoke(
            admin_app, ["register-dataset", "people", str(csv), "--metadata", str(meta), "--ledger", ledger]
        ).exit_code
        == 0
    )
    assert runner.invoke(admin_app, ["create-analyst", "alice", "--ledger", ledger]).exit_code == 0
    out = runner.invoke(admin_app, ["grant", "alice", "people", "--epsilon", "0", "--ledger", ledger])
    assert out.exit_code == 1
    text = " ".join(out.output.split())
    assert "--epsilon 0.0 is not accepted" in text and "epsilon=" not in text


def test_register_dataset_refuses_bad_spark_options_before_reading(tmp_path: Path) -> None:
    csv, meta, ledger = _files(
        tmp_path, {"row_level": True, "columns": {"age": {"type": "numeric", "lower": 0, "upper": 60}}}
    )
    base = [
        "register-dataset",
        "people",
        str(tmp_path),
        "--metadata",
        str(meta),
        "--ledger",
        ledger,
        "--engine",
        "spark",
    ]
    out = CliRunner().invoke(admin_app, [*base, "--spark-conf", "spark.executor.memory"])
    assert out.exit_code == 1 and "--spark-conf 'spark.executor.memory' is not accepted" in out.output
    out = CliRunner().invoke(admin_app, [*base, "--spark-master", "nowhere"])
    assert out.exit_code == 1 and "spark_master" in out.output and "spark://HOST:PORT" in out.output
    out = CliRunner().invoke(
        admin_app,
        ["register-dataset", "people", str(csv), "--metadata", str(meta), "--ledger", ledger, "--engine", "spark"],
    )
    assert out.exit_code == 1 and "source" in out.output and "Parquet" in out.output  # a CSV is not Parquet data
    with Service(ledger) as svc:
        assert svc.datasets() == []


def test_list_shows_the_published_releases(tmp_path: Path) -> None:
    from dpkit.server import SynthRequest

    csv, meta, ledger = _files(
        tmp_path,
        {
            "row_level": True,
            "columns": {
                "zip": {"type": "categorical", "value_type": "integer", "categories": list(range(10))},
                "age": {"type": "numeric", "lower": 0, "upper": 60},
            },
        },
    )
    with Service(ledger) as svc:
        svc.register_dataset("people", csv, meta)
        _, key = svc.create_principal("publisher", "analyst")
        svc.grant("publisher", "people", epsilon=1.0, delta=1e-6)
        svc.allow_publish("publisher")
        answer, _ = svc.synthesize(
            svc.authenticate(key), "people", SynthRequest(epsilon=1.0, delta=1e-6, rows=20, publish="people_2026")
        )
    out = CliRunner().invoke(admin_app, ["list", "--json", "--ledger", ledger])
    assert out.exit_code == 0, out.output
    (release,) = json.loads(out.output)["releases"]
    assert (release["name"], release["published_by"], release["rows"], release["spend_id"]) == (
        "people_2026",
        "publisher",
        20,
        answer["spend_id"],
    )
    table = CliRunner().invoke(admin_app, ["list", "--ledger", ledger])
    assert table.exit_code == 0 and "people_2026" in table.output and "published synthetic tables" in table.output


def test_register_dataset_of_several_tables_takes_table_equals_path(tmp_path: Path) -> None:
    from server._tables import HOSPITAL_FILES, write_hospital

    write_hospital(tmp_path)
    ledger = f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    pairs = [f"{t}={tmp_path / f}" for t, f in HOSPITAL_FILES.items()]
    meta = str(tmp_path / "hospital.json")
    out = CliRunner().invoke(
        admin_app, ["register-dataset", "hospital", *pairs, "--metadata", meta, "--ledger", ledger]
    )
    assert out.exit_code == 0, out.output
    assert "5 tables: visits (privacy unit 'patient_id')" in out.output and "regions (public)" in out.output
    assert "data check of prescriptions: 300 rows" in out.output
    args = ["register-dataset", "hospital2", *pairs, "--metadata", meta, "--ledger", ledger, "--json"]
    body = json.loads(CliRunner().invoke(admin_app, args).output)
    assert body["source"]["visits"] == str(tmp_path / "visits.csv") and body["tables"]["regions"]["public"] is True
    assert set(body["check"]["tables"]) == set(HOSPITAL_FILES)
    out = CliRunner().invoke(admin_app, ["list", "--ledger", ledger])
    assert out.exit_code == 0 and "visits.patient_id" in out.output, out.output
    with Service(ledger) as svc:
        assert [d.name for d in svc.datasets()] == ["hospital", "hospital2"]
        # the audit entry names every source
        entry = [e for e in svc.audit_entries() if e.action == "register_dataset"][0]
        assert entry.detail["source"]["regions"] == str(tmp_path / "regions.csv")


def test_register_dataset_arguments_follow_the_metadata(tmp_path: Path) -> None:
    from server._tables import write_hospital

    write_hospital(tmp_path)
    csv, meta, ledger = _files(tmp_path, {"row_level": True, "columns": {"age": {"type": "numeric"}}})
    # one table: one SOURCE, read as a path (nothing parsed in it)
    out = CliRunner().invoke(
        admin_app, ["register-dataset", "p", str(csv), str(csv), "--metadata", str(meta), "--ledger", ledger]
    )
    assert out.exit_code == 1 and "SOURCE: one for a dataset of one table" in out.output, out.output
    # several tables: TABLE=PATH each, and every declared table
    hospital = str(tmp_path / "hospital.json")
    out = CliRunner().invoke(
        admin_app, ["register-dataset", "h", str(tmp_path / "visits.csv"), "--metadata", hospital, "--ledger", ledger]
    )
    assert out.exit_code == 1 and "expected TABLE=PATH" in out.output, out.output
    out = CliRunner().invoke(
        admin_app,
        ["register-dataset", "h", f"visits={tmp_path / 'visits.csv'}", "--metadata", hospital, "--ledger", ledger],
    )
    assert out.exit_code == 1 and "missing" in out.output and "'regions'" in out.output, out.output
    with Service(ledger) as svc:
        assert svc.datasets() == []
