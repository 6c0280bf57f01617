"""The command line words dpkit's errors in its own terms (dpkit.cli._errors), and the Python API
keeps its own.

Each remedy a library message suggests in Python (``Numeric(lower, upper) in the metadata``,
``Categorical([...]) in the metadata``, ``pass keys=``, ``pass exist_ok=True``,
``create_budget(...)``) is checked twice: from the command line, where it must be the metadata
file's JSON form, an option or a command to run; and from Python, where the message is unchanged.
Parameters set by an option are named as the option (``--epsilon``, ``--max-groups``,
``--row-level``). No test here draws noise that matters: none is statistical.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import dpkit as dp
from dpkit.analytics import Metadata
from dpkit.cli import app
from dpkit.cli._errors import FIXES, Arg, CliContext, cli_message
from dpkit.errors import FIX_KINDS, Fix, InvalidParameterError, LedgerError
from dpkit.ledger.identity import dataset_identity

runner = CliRunner()


def said(result) -> str:  # type: ignore[no-untyped-def]
    """Everything a command printed (stdout and stderr), on one line."""
    return " ".join(result.output.split())


@pytest.fixture
def census(tmp_path: Path) -> dict[str, Path]:
    """The census example with a ledger, and a metadata file with an unbounded numeric column
    (hours_per_week) and a categorical column without public categories (education)."""
    data, meta, ledger = tmp_path / "census.csv", tmp_path / "census.json", tmp_path / "ledger.sqlite"
    assert (
        runner.invoke(app, ["generate", "census", str(data), "--people", "300", "--metadata", str(meta)]).exit_code == 0
    )
    loose = json.loads(meta.read_text())
    loose["columns"]["hours_per_week"] = {"type": "numeric"}
    loose["columns"]["education"] = {"type": "categorical"}
    (tmp_path / "loose.json").write_text(json.dumps(loose))
    result = runner.invoke(app, ["budget", "create", str(data), "ann", "--epsilon", "1", "--ledger", str(ledger)])
    assert result.exit_code == 0, result.output
    return {"data": data, "meta": meta, "loose": tmp_path / "loose.json", "ledger": ledger}


def query(c: dict[str, Path], sql: str, *args: str, meta: str = "loose"):  # type: ignore[no-untyped-def]
    return runner.invoke(
        app,
        [
            "query",
            str(c["data"]),
            sql,
            "--metadata",
            str(c[meta]),
            "--ledger",
            str(c["ledger"]),
            "--analyst",
            "ann",
            *(args if "--epsilon" in args else ("--epsilon", "0.1", *args)),
        ],
    )


def python_session(c: dict[str, Path], **kwargs) -> dp.Session:  # type: ignore[no-untyped-def]
    return dp.Session.from_csv(
        c["data"],
        table="census",
        metadata=Metadata.from_json(c["loose"]),
        budget=dp.Budget(epsilon=10.0),
        rng=np.random.default_rng(0),
        **kwargs,
    )


def unspent(c: dict[str, Path]) -> bool:
    return dp.open_ledger(c["ledger"]).get_budget(dataset_identity(c["data"]), "ann").spent_epsilon == 0


# -- remedies ---------------------------------------------------------------------------------------


def test_missing_bounds_name_the_metadata_files_json_form(census: dict[str, Path]) -> None:
    result = query(census, "SELECT AVG(hours_per_week) FROM census")
    assert result.exit_code == 1
    text = said(result)
    entry = '"hours_per_week": {"type": "numeric", "lower": ..., "upper": ...} in the metadata file'
    assert entry in text and "Numeric(" not in text, text
    assert "column 'hours_per_week' is not accepted" in text  # no Python keyword syntax
    # the suggestion, filled in, is a column the metadata loader accepts (docs/metadata.md)
    filled = json.loads("{" + entry.split(" in the")[0].replace("...", "0", 1).replace("...", "80", 1) + "}")
    assert Metadata.from_dict({"columns": filled, "row_level": True}).columns["hours_per_week"].bounded
    assert unspent(census)
    # the Python API keeps the Python remedy
    with pytest.raises(InvalidParameterError, match=r"Numeric\(lower, upper\) in the metadata"):
        python_session(census).mean("hours_per_week", epsilon=0.1)


def test_private_keys_name_the_categories_json_form_and_delta(census: dict[str, Path]) -> None:
    result = query(census, "SELECT education, COUNT(*) FROM census GROUP BY education")
    assert result.exit_code == 1
    text = said(result)
    assert '"education": {"type": "categorical", "categories": [...]}' in text and "in the metadata file" in text
    assert "--delta 0.0 is not accepted: --delta must be" in text and "--delta D" in text
    assert "keys=" not in text and "delta=" not in text, text
    assert unspent(census)
    with pytest.raises(InvalidParameterError) as caught:
        python_session(census).sql("SELECT education, COUNT(*) FROM census GROUP BY education", epsilon=0.1)
    assert "declare categories in the metadata, pass keys=, or give δ > 0" in str(caught.value)
    assert caught.value.fix is not None and caught.value.fix.facts["columns"] == ("education",)


def test_a_histogram_without_categories_names_the_json_form(census: dict[str, Path]) -> None:
    """The command line has no histogram (SQL groups instead), so the wording is checked on the
    error the Python API raises."""
    with pytest.raises(InvalidParameterError) as caught:
        python_session(census).histogram("education", epsilon=0.1)
    exc = caught.value
    assert "Categorical([...]) in the metadata" in str(exc)  # Python
    assert exc.fix is not None and exc.fix.kind == "declare_categories"
    text = cli_message(exc)
    assert '"education": {"type": "categorical", "categories": [...]} in the metadata file' in text
    assert "Categorical(" not in text


def test_an_existing_budget_names_the_exist_ok_flag(census: dict[str, Path]) -> None:
    base = ["budget", "create", str(census["data"]), "ann", "--ledger", str(census["ledger"])]
    again = runner.invoke(app, [*base, "--epsilon", "1"])
    assert again.exit_code == 1
    assert "add --exist-ok to reuse it" in said(again) and "exist_ok" not in said(again)
    reused = runner.invoke(app, [*base, "--epsilon", "1", "--exist-ok"])
    assert reused.exit_code == 0, reused.output
    assert "already exists" in said(reused) and "created budget" not in said(reused)
    other = runner.invoke(app, [*base, "--epsilon", "2", "--exist-ok"])  # exist_ok never changes a budget
    assert other.exit_code == 1 and "never changed" in said(other) and "reuse" not in said(other)
    changed = runner.invoke(app, [*base, "--epsilon", "2"])  # --exist-ok would not help: not suggested
    assert changed.exit_code == 1 and "--exist-ok" not in said(changed)
    assert len(dp.open_ledger(census["ledger"]).list_budgets()) == 1


def test_the_python_api_still_says_exist_ok(tmp_path: Path) -> None:
    with dp.open_ledger(tmp_path / "l.sqlite") as ledger:
        ledger.create_budget("census", "alice", epsilon=1.0)
        with pytest.raises(LedgerError, match=r"; pass exist_ok=True to reuse it$") as caught:
            ledger.create_budget("census", "alice", epsilon=1.0)
        assert caught.value.fix == Fix(
            "reuse_budget", "pass exist_ok=True to reuse it", {"dataset": "census", "analyst": "alice"}
        )
        with pytest.raises(LedgerError, match="never changed") as caught:
            ledger.create_budget("census", "alice", epsilon=2.0)
        assert "exist_ok" not in str(caught.value) and caught.value.fix is None  # it would not help
        with pytest.raises(LedgerError, match=r"create_budget\(dataset, analyst, epsilon=\.\.\., delta=\.\.\.\)"):
            ledger.get_budget("census", "bob")


def test_a_missing_budget_names_the_command_that_creates_it(census: dict[str, Path]) -> None:
    result = query(census, "SELECT COUNT(*) FROM census", "--analyst", "bob")
    assert result.exit_code == 1
    text = said(result)
    ledger = str(census["ledger"].resolve())
    assert f"create it first with: dpkit budget create {census['data']} bob --epsilon E --ledger {ledger}" in text
    assert "create_budget(" not in text
    assert "--dataset NAME" not in text  # the dataset has budgets here (ann's): only bob's is missing
    created = runner.invoke(app, ["budget", "create", str(census["data"]), "bob", "--epsilon", "1", "--ledger", ledger])
    assert created.exit_code == 0  # the suggested command works as printed
    assert query(census, "SELECT COUNT(*) FROM census", "--analyst", "bob").exit_code == 0


# -- parameters as options ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "says", "python"),
    [
        (["--epsilon", "0"], "--epsilon 0.0 is not accepted: --epsilon must be a finite number > 0", "epsilon="),
        (["--max-groups", "0"], "--max-groups 0 is not accepted: --max-groups must be an integer >= 1", "max_groups="),
        (["--max-rows", "0"], "--max-rows 0 is not accepted", "max_rows="),
        (["--noise", "cauchy"], "--noise cauchy is not accepted: --noise must be 'laplace' or 'gaussian'", "noise="),
        (["--confidence", "2"], "--confidence 2.0 is not accepted", "confidence="),
        (["--unit", "nope"], "--unit nope is not accepted: --unit must be a column of the source", "privacy_unit"),
        (
            ["--row-level"],
            "--row-level is not accepted: the metadata declares the privacy unit 'person_id'",
            "row_level",
        ),
    ],
)
def test_parameters_are_named_as_their_options(
    census: dict[str, Path], args: list[str], says: str, python: str
) -> None:
    result = query(census, "SELECT COUNT(*) FROM census", *args, meta="meta")
    assert result.exit_code == 1
    assert says in said(result) and python not in said(result), said(result)
    assert unspent(census)


def test_a_missing_unit_names_both_options(census: dict[str, Path], tmp_path: Path) -> None:
    meta = json.loads(census["meta"].read_text())
    del meta["privacy_unit"]
    (tmp_path / "nounit.json").write_text(json.dumps(meta))
    census["nounit"] = tmp_path / "nounit.json"
    text = said(query(census, "SELECT COUNT(*) FROM census", meta="nounit"))
    assert (
        "--unit is missing" in text and "(--unit user_id), or --row-level when every row is a different person" in text
    )
    assert "privacy_unit" not in text and "row_level" not in text, text
    with pytest.raises(InvalidParameterError, match=r"privacy_unit='user_id'\), or row_level=True"):
        dp.Session.from_csv(census["data"], metadata=meta, budget=dp.Budget(epsilon=1.0))


def test_a_seed_is_refused_in_command_line_terms(census: dict[str, Path]) -> None:
    result = query(census, "SELECT COUNT(*) FROM census", "--seed", "3", meta="meta")
    assert result.exit_code == 1
    assert "--seed 3 is refused" in said(result) and "budget=dp.Budget" not in said(result)
    assert unspent(census)


def test_a_command_can_spell_a_parameter_as_its_argument(tmp_path: Path) -> None:
    result = runner.invoke(
        app, ["budget", "create", "", "ann", "--epsilon", "1", "--ledger", str(tmp_path / "l.sqlite")]
    )
    assert result.exit_code == 1
    assert "DATASET '' is not accepted: DATASET must be" in said(result), said(result)


def test_messages_are_text_never_markup(census: dict[str, Path]) -> None:
    result = query(census, "SELECT COUNT(*) FROM census", "--analyst", "[bold]eve[/bold]", meta="meta")
    assert result.exit_code == 1 and "[bold]eve[/bold]" in said(result)


# -- the renderer ---------------------------------------------------------------------------------------


def test_every_fix_kind_has_a_command_line_wording() -> None:
    assert set(FIXES) == set(FIX_KINDS)


def test_quoted_values_are_never_rewritten() -> None:
    exc = InvalidParameterError("column", "max_groups=1", "a column such as 'row_level=True' (privacy_unit='user_id')")
    text = cli_message(exc)
    assert (
        text
        == "column 'max_groups=1' is not accepted: column must be a column such as 'row_level=True' (--unit user_id)"
    )


def test_the_missing_bounds_error_carries_its_fix() -> None:
    """analytics/building.py tags the missing-bounds error with its Fix, so the command line words
    it for the metadata file while the Python message is unchanged."""
    import pandas as pd

    from dpkit.analytics import Numeric

    s = dp.Session(
        pd.DataFrame({"age": [1.0]}),
        metadata=Metadata(columns={"age": Numeric()}),
        row_level=True,
        budget=dp.Budget(epsilon=1.0),
    )
    with pytest.raises(InvalidParameterError) as info:
        s.mean("age", epsilon=0.5)
    assert isinstance(info.value.fix, Fix) and info.value.fix.kind == "declare_bounds"
    assert "Numeric(lower, upper) in the metadata" in str(info.value)
    assert '"age": {"type": "numeric", "lower": ..., "upper": ...}' in cli_message(info.value)


def test_a_commands_own_spelling_wins() -> None:
    exc = InvalidParameterError("analyst", "", "a non-empty name")
    assert cli_message(exc).startswith("--analyst '' is not accepted")
    assert cli_message(exc, CliContext(options={"analyst": Arg("ANALYST")})).startswith("ANALYST '' is not accepted")


def test_fix_texts_appear_in_the_python_messages(census: dict[str, Path], tmp_path: Path) -> None:
    """The command line swaps Fix.text inside the message: each raise site's text is verbatim."""
    errors: list[Exception] = []
    s = python_session(census)
    for call in (
        lambda: s.histogram("education", epsilon=0.1),
        lambda: s.sql("SELECT education, COUNT(*) FROM census GROUP BY education", epsilon=0.1),
    ):
        with pytest.raises(InvalidParameterError) as caught:
            call()
        errors.append(caught.value)
    with dp.open_ledger(tmp_path / "l.sqlite") as ledger:
        ledger.create_budget("d", "a", epsilon=1.0)
        for call in (lambda: ledger.create_budget("d", "a", epsilon=1.0), lambda: ledger.get_budget("d", "b")):
            with pytest.raises(LedgerError) as caught:
                call()
            errors.append(caught.value)
    for exc in errors:
        fix = exc.fix  # type: ignore[attr-defined]
        assert fix is not None and fix.kind in FIX_KINDS and fix.text in str(exc)
        assert fix.text not in cli_message(exc, CliContext(ledger="/l.sqlite"))
