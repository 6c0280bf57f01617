"""Session.from_csv's reading options (header, columns, delimiter, null), threaded to DuckDB's
read_csv, and dpkit query's --no-header/--columns/--delimiter/--null.

Answers are checked with a budget so large (ε = 10^6 per aggregate) that the Laplace noise has
scale 10^-6: a count is off by more than 0.5 with probability e^(-500000), so "round(count) ==
truth" never fails for a correct reader.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

import dpkit as dp
from dpkit.analytics import Categorical, Metadata, Numeric
from dpkit.analytics.engines.csv_source import CsvOptions, csv_source_sql
from dpkit.cli import app
from dpkit.errors import InvalidParameterError

META = Metadata(columns={"age": Numeric(0, 100), "sex": Categorical(("F", "M", "NA"))}, row_level=True)
ROWS = [(31, "F"), (45, "M"), (52, "F"), (None, "NA"), (28, "M"), (61, "F")]


def write(tmp_path: Path, name: str, lines: list[str]) -> Path:
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def session(path: Path, **options) -> dp.Session:  # type: ignore[no-untyped-def]
    return dp.Session.from_csv(path, metadata=META, budget=dp.Budget(epsilon=1e7), **options)


def counts(s: dp.Session) -> dict[str, int]:
    r = s.group_by("sex").count(epsilon=1e6)
    return {str(k): round(v) for k, v in zip(r.table["sex"], r.table["count"], strict=True)}


def total_age(s: dp.Session) -> int:
    return round(s.sum("age", epsilon=1e6).value)


TRUE_SUM = sum(a for a, _ in ROWS if a is not None)


def test_a_headerless_file_with_columns(tmp_path: Path) -> None:
    path = write(tmp_path, "people.csv", [f"{'' if a is None else a},{s}" for a, s in ROWS])
    s = session(path, header=False, columns=["age", "sex"])
    assert s.table == "people" and total_age(s) == TRUE_SUM
    assert counts(s) == {"F": 3, "M": 2, "NA": 1}  # the first line is data, not a header


def test_a_semicolon_delimited_file(tmp_path: Path) -> None:
    path = write(tmp_path, "people.csv", ["age;sex", *(f"{'' if a is None else a};{s}" for a, s in ROWS)])
    s = session(path, delimiter=";")
    assert total_age(s) == TRUE_SUM and counts(s) == {"F": 3, "M": 2, "NA": 1}
    tabs = write(tmp_path, "tabs.tsv", ["age\tsex", *(f"{'' if a is None else a}\t{s}" for a, s in ROWS)])
    assert total_age(session(tabs, delimiter="\t")) == TRUE_SUM


def test_null_texts_are_read_as_null(tmp_path: Path) -> None:
    path = write(tmp_path, "people.csv", ["age,sex", *(f"{'NA' if a is None else a},{s}" for a, s in ROWS)])
    assert counts(session(path)) == {"F": 3, "M": 2, "NA": 1}  # "NA" is text: a category here
    s = session(path, null="NA")
    assert counts(s) == {"F": 3, "M": 2, "NA": 0} and total_age(s) == TRUE_SUM
    assert counts(session(path, null=["?", "NA"])) == {"F": 3, "M": 2, "NA": 0}
    empty = write(tmp_path, "empty.csv", ["age,sex", "31,", "45,M"])
    assert counts(session(empty, null=["NA"])) == {"F": 0, "M": 1, "NA": 0}  # the empty field stays NULL


def test_columns_replace_a_header_line(tmp_path: Path) -> None:
    path = write(tmp_path, "people.csv", ["Age (years),Sex", *(f"{'' if a is None else a},{s}" for a, s in ROWS)])
    s = session(path, columns=["age", "sex"])  # the header line is skipped, its names replaced
    assert total_age(s) == TRUE_SUM and sum(counts(s).values()) == len(ROWS)


def test_the_default_dialect_is_unchanged(tmp_path: Path) -> None:
    """Without options the read is the fixed dialect the curator service copies files with."""
    path = write(tmp_path, "people.csv", ["age,sex", "31,F"])
    assert csv_source_sql(path) == csv_source_sql(path, CsvOptions())
    assert "'age,sex'" in csv_source_sql(path)  # the header line is recognised by its text
    assert total_age(session(path)) == 31


@pytest.mark.parametrize(
    ("options", "name"),
    [
        ({"header": "yes"}, "header"),
        ({"header": 0}, "header"),
        ({"header": False}, "columns"),  # a headerless file must be given its names
        ({"columns": "age,sex"}, "columns"),
        ({"columns": []}, "columns"),
        ({"columns": ["age", "age"]}, "columns"),
        ({"columns": ["age", 3]}, "columns"),
        ({"columns": ["age", " "]}, "columns"),
        ({"delimiter": ";\x1f"}, "delimiter"),  # U+001F: how a delimiter of several characters is matched
        ({"delimiter": ""}, "delimiter"),
        ({"delimiter": '"'}, "delimiter"),
        ({"delimiter": "\n"}, "delimiter"),
        ({"delimiter": 59}, "delimiter"),
        ({"null": 0}, "null"),
        ({"null": ["NA", None]}, "null"),
        ({"null": "a,b"}, "null"),  # holds the delimiter
        ({"delimiter": ";", "null": ["x;y"]}, "null"),
        ({"skip_rows": -1}, "skip_rows"),
        ({"skip_rows": "1"}, "skip_rows"),
        ({"skip_rows": True}, "skip_rows"),
        ({"skip_rows": 1.0}, "skip_rows"),
        ({"skip_rows": 1001}, "skip_rows"),
        ({"engine": "polars"}, "engine"),
    ],
)
def test_bad_options_name_the_option(tmp_path: Path, options: dict[str, object], name: str) -> None:
    path = write(tmp_path, "people.csv", ["age,sex", "31,F"])
    with pytest.raises(InvalidParameterError) as caught:
        session(path, **options)
    assert caught.value.name == name, str(caught.value)


def test_bad_options_are_refused_before_the_file_is_opened(tmp_path: Path) -> None:
    with pytest.raises(InvalidParameterError) as caught:
        session(tmp_path / "missing.csv", delimiter=':"')
    assert caught.value.name == "delimiter"
    with pytest.raises(InvalidParameterError) as caught:
        dp.Session.from_csv(42, metadata=META, budget=dp.Budget(epsilon=1.0))  # type: ignore[arg-type]
    assert caught.value.name == "path"


def test_the_command_line_reads_the_same_options(tmp_path: Path) -> None:
    runner = CliRunner()
    path = write(tmp_path, "people.csv", [f"{'NA' if a is None else a};{s}" for a, s in ROWS])
    meta = tmp_path / "meta.json"
    meta.write_text(json.dumps(META.to_dict()))
    ledger = str(tmp_path / "ledger.sqlite")
    assert (
        runner.invoke(app, ["budget", "create", str(path), "ann", "--epsilon", "1e7", "--ledger", ledger]).exit_code
        == 0
    )
    base = [
        "query",
        str(path),
        "SELECT sex, COUNT(*) FROM people GROUP BY sex",
        "--epsilon",
        "1e6",
        "--metadata",
        str(meta),
        "--ledger",
        ledger,
        "--analyst",
        "ann",
    ]
    result = runner.invoke(
        app, [*base, "--no-header", "--columns", "age, sex", "--delimiter", ";", "--null", "NA", "--json"]
    )
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert {r["sex"]: round(r["count"]) for r in doc["rows"]} == {"F": 3, "M": 2, "NA": 0}
    missing = runner.invoke(app, [*base, "--no-header"])
    assert missing.exit_code == 1 and "--columns is missing" in " ".join(missing.output.split())
    bad = runner.invoke(app, [*base, "--no-header", "--columns", "age,sex", "--delimiter", ':"'])
    assert bad.exit_code == 1 and "--delimiter ':\"' is not accepted" in " ".join(bad.output.split()), bad.output


def test_dpkit_check_reads_the_same_options(tmp_path: Path) -> None:
    """The curator's data check reads a headerless, semicolon-delimited file as the query does:
    with the options every value conforms (exit 0); without them the file's first row is taken for
    a header and the declared columns are missing (exit 1)."""
    path = write(tmp_path, "people.csv", [f"{'' if a is None else a};{s}" for a, s in ROWS])
    meta = tmp_path / "meta.json"
    meta.write_text(json.dumps(META.to_dict()), encoding="utf-8")
    runner = CliRunner()
    base = ["check", str(path), "--metadata", str(meta), "--json"]
    good = runner.invoke(app, [*base, "--no-header", "--columns", "age,sex", "--delimiter", ";"])
    assert good.exit_code == 0, good.output
    report = json.loads(good.stdout)
    assert report["ok"] is True
    assert runner.invoke(app, base).exit_code == 1  # the power check: read without the options
    bad = runner.invoke(app, [*base, "--no-header"])  # no names for a headerless file
    assert bad.exit_code == 2 and "--columns" in bad.output
