"""Every command that reads, creates or debits a budget says which ledger (its absolute location)
and which dataset (the name the budget is kept under, and where that name came from): on stderr
for people, as fields with --json. No budget is ever created implicitly: a query for data that
has no budget is refused, naming the datasets that have one and the option that pays from one.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

import dpkit as dp
from dpkit.cli import app
from dpkit.ledger.identity import dataset_identity

runner = CliRunner()
SQL = "SELECT COUNT(*) FROM census"


def said(text: str) -> str:
    return " ".join(text.split())


@pytest.fixture
def census(tmp_path: Path) -> dict[str, Path]:
    data, meta = tmp_path / "census.csv", tmp_path / "census.json"
    assert (
        runner.invoke(app, ["generate", "census", str(data), "--people", "300", "--metadata", str(meta)]).exit_code == 0
    )
    clean = tmp_path / "adult_clean.csv"  # a cleaned copy: other bytes, the same people
    clean.write_text(data.read_text().replace("\n", "\r\n"))
    assert dataset_identity(clean) != dataset_identity(data)
    return {"data": data, "meta": meta, "clean": clean, "ledger": tmp_path / "ledger.sqlite"}


def create(c: dict[str, Path], dataset: str, *args: str):  # type: ignore[no-untyped-def]
    return runner.invoke(
        app, ["budget", "create", dataset, "ann", "--epsilon", "1", "--ledger", str(c["ledger"]), *args]
    )


def query(c: dict[str, Path], data: Path, *args: str):  # type: ignore[no-untyped-def]
    return runner.invoke(
        app,
        [
            "query",
            str(data),
            SQL,
            "--epsilon",
            "0.25",
            "--metadata",
            str(c["meta"]),
            "--ledger",
            str(c["ledger"]),
            "--analyst",
            "ann",
            "--table",
            "census",
            *args,
        ],
    )


def test_a_query_states_its_dataset_and_ledger(census: dict[str, Path]) -> None:
    assert create(census, str(census["data"])).exit_code == 0
    result = query(census, census["data"])
    assert result.exit_code == 0, result.output
    identity = dataset_identity(census["data"])
    assert f"dataset: {identity} (the content of {census['data']})" in result.stderr
    assert f"ledger: {census['ledger'].resolve()}" in result.stderr
    doc = json.loads(query(census, census["data"], "--json").stdout)
    assert doc["budget"]["ledger"] == str(census["ledger"].resolve())
    assert doc["budget"]["dataset"] == identity and doc["budget"]["dataset_from"] == "DATA"
    assert doc["budget"]["file"] == str(census["data"])


def test_a_relative_ledger_is_stated_absolute(census: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(census["ledger"].parent)
    assert runner.invoke(app, ["budget", "create", "census.csv", "ann", "--epsilon", "1"]).exit_code == 0
    where = str((census["ledger"].parent / ".dpkit" / "ledger.sqlite").resolve())
    result = runner.invoke(
        app, ["query", "census.csv", SQL, "--epsilon", "0.1", "--metadata", "census.json", "--analyst", "ann"]
    )
    assert result.exit_code == 0, result.output
    assert f"ledger: {where}" in result.stderr
    shown = runner.invoke(app, ["budget", "--json"])
    assert json.loads(shown.stdout)["ledger"] == where
    assert f"ledger: {where}" in runner.invoke(app, ["budget"]).stderr


def test_dataset_pays_a_cleaned_copy_from_the_named_budget(census: dict[str, Path]) -> None:
    assert create(census, "adult").exit_code == 0
    result = query(census, census["clean"], "--dataset", "adult")
    assert result.exit_code == 0, result.output
    assert "dataset: adult (named by --dataset)" in result.stderr
    ledger = dp.open_ledger(census["ledger"])
    assert ledger.get_budget("adult", "ann").spent_epsilon == pytest.approx(0.25)
    assert [b.dataset for b in ledger.list_budgets()] == ["adult"]  # no budget for the copy's content
    doc = json.loads(query(census, census["clean"], "--dataset", "adult", "--json").stdout)
    assert doc["budget"]["dataset"] == "adult" and doc["budget"]["dataset_from"] == "--dataset"
    assert doc["budget"]["file"] is None and doc["budget"]["spent_epsilon"] == pytest.approx(0.5)


def test_dataset_can_name_the_file_whose_budget_pays(census: dict[str, Path]) -> None:
    assert create(census, str(census["data"])).exit_code == 0
    result = query(census, census["clean"], "--dataset", str(census["data"]))
    assert result.exit_code == 0, result.output
    identity = dataset_identity(census["data"])
    assert f"dataset: {identity} (the content of {census['data']}, from --dataset)" in result.stderr
    assert dp.open_ledger(census["ledger"]).get_budget(identity, "ann").spent_epsilon == pytest.approx(0.25)


def test_a_file_without_a_budget_is_refused_never_given_one(census: dict[str, Path]) -> None:
    assert create(census, "adult").exit_code == 0
    assert create(census, str(census["data"])).exit_code == 0
    before = dp.open_ledger(census["ledger"]).list_budgets()
    result = query(census, census["clean"])
    assert result.exit_code == 1
    text = said(result.output)
    clean = dataset_identity(census["clean"])
    assert f"dataset: {clean} (the content of {census['clean']})" in text
    assert f"there is no budget for analyst 'ann' on dataset '{clean}'" in text
    assert f"('adult', '{dataset_identity(census['data'])}')" in text and "--dataset NAME" in text
    assert dp.open_ledger(census["ledger"]).list_budgets() == before  # nothing was created


def test_a_refused_debit_states_the_budget_it_asked(census: dict[str, Path]) -> None:
    assert create(census, str(census["data"])).exit_code == 0
    assert query(census, census["data"], "--epsilon", "1").exit_code == 0
    refused = query(census, census["data"], "--epsilon", "1")
    assert refused.exit_code == 1 and "budget exceeded" in said(refused.output)
    assert f"ledger: {census['ledger'].resolve()}" in refused.stderr
    assert f"dataset: {dataset_identity(census['data'])}" in refused.stderr


def test_a_missing_ledger_is_named_absolute_and_not_created(
    census: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(census["ledger"].parent)
    result = runner.invoke(
        app,
        ["query", "census.csv", SQL, "--epsilon", "0.1", "--metadata", "census.json", "--ledger", "elsewhere.sqlite"],
    )
    assert result.exit_code == 1
    where = str((census["ledger"].parent / "elsewhere.sqlite").resolve())
    assert f"no ledger at {where}" in said(result.output) and f"ledger: {where}" in result.stderr
    assert not Path(where).exists()


def test_budget_create_states_the_dataset_and_lists_the_others(census: dict[str, Path]) -> None:
    first = create(census, "adult")
    assert first.exit_code == 0
    assert f"for dataset adult, analyst ann, in {census['ledger'].resolve()}" in said(first.stdout)
    assert "new dataset" not in first.stderr  # the ledger's first: nothing to confuse it with
    copy = create(census, str(census["clean"]))
    assert copy.exit_code == 0
    clean = dataset_identity(census["clean"])
    assert f"for dataset {clean} (the content of {census['clean']})" in said(copy.stdout)
    warning = said(copy.stderr)
    assert f"{clean} is a new dataset in this ledger" in warning and "budgets for adult" in warning
    assert "--dataset NAME" in warning
    bob = runner.invoke(
        app,
        [
            "budget",
            "create",
            str(census["clean"]),
            "bob",
            "--epsilon",
            "1",
            "--ledger",
            str(census["ledger"]),
            "--json",
        ],
    )
    assert bob.exit_code == 0 and "new dataset" not in bob.stderr  # a known dataset, another analyst
    doc = json.loads(bob.stdout)
    assert doc["ledger"] == str(census["ledger"].resolve()) and doc["created"] is True
    assert doc["dataset"] == clean and doc["dataset_from"] == "DATASET" and doc["file"] == str(census["clean"])
    assert doc["other_datasets"] == [] and doc["budget"]["analyst"] == "bob"


def test_budget_show_states_the_dataset_it_was_given(census: dict[str, Path]) -> None:
    assert create(census, str(census["data"])).exit_code == 0
    args = ["budget", "--ledger", str(census["ledger"]), "--dataset", str(census["data"]), "--analyst", "ann"]
    shown = runner.invoke(app, args)
    assert shown.exit_code == 0, shown.output
    identity = dataset_identity(census["data"])
    assert f"dataset: {identity} (the content of {census['data']}, from --dataset)" in shown.stderr
    assert f"ledger: {census['ledger'].resolve()}" in shown.stderr
    doc = json.loads(runner.invoke(app, [*args, "--json"]).stdout)
    assert doc["dataset"] == identity and doc["dataset_from"] == "--dataset" and len(doc["budgets"]) == 1
