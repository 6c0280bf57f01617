"""The curator's data check (dpkit.analytics.check) and ``dpkit check``: exact counts on a small
messy table, near misses, the privacy unit, problems that are reported instead of raised, bad
input, the command line, and UCI Adult (skipped when ../shared/data/adult/ is absent)."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pandas as pd
import pytest
from typer.testing import CliRunner

from dpkit import datasets
from dpkit.analytics import Categorical, DataCheck, Metadata, Numeric, check_data
from dpkit.analytics.check import nearest_category
from dpkit.cli import app
from dpkit.errors import InvalidParameterError

ADULT = Path(__file__).resolve().parents[3] / "shared" / "data" / "adult" / "adult.data"
runner = CliRunner()

# 8 rows: text in numeric columns ('N/A', 'abc', 'inf'), ' Male' and 'male', NULLs (empty
# fields), out-of-bounds values (150, -5, 120000), unknown categories ('Other', 'Berlin', 7), a
# spelling slip ('Femal'), '3.5' in an integer column and a row without a unit.
MESSY = """pid,age,sex,kids,income,city
1,34,Male,2,50000,Paris
1,N/A, Male,3.5,120000,paris
2,,male,1,-5,Lyon
3,150,Female,,,Nice
3,45,Femal,0,30000,Berlin
3,29,Other,2,abc,Paris
,40,Female,1,1000,Lyon
4,inf,Female,7,2000,Paris
"""
META = {
    "privacy_unit": "pid",
    "max_rows": 2,
    "max_groups": 1,
    "columns": {
        "age": {"type": "numeric", "lower": 0, "upper": 120},
        "sex": {"type": "categorical", "categories": ["Female", "Male"]},
        "kids": {"type": "categorical", "categories": [0, 1, 2, 3]},
        "income": {"type": "numeric", "lower": 0, "upper": 100000},
        "city": {"type": "categorical", "categories": ["Paris", "Lyon", "Nice"]},
    },
}
CLEAN = "pid,age,sex\n1,34,Male\n2,51,Female\n2,52,Female\n"
CLEAN_META = {
    "privacy_unit": "pid",
    "max_rows": 2,
    "columns": {
        "age": {"type": "numeric", "lower": 0, "upper": 120},
        "sex": {"type": "categorical", "categories": ["Female", "Male"]},
    },
}


@pytest.fixture
def messy(tmp_path: Path) -> Path:
    path = tmp_path / "messy.csv"
    path.write_text(MESSY, encoding="utf-8")
    return path


def _counts(report: DataCheck, name: str) -> tuple[int, ...]:
    c = report.column(name)
    return c.conforming, c.null, c.unreadable, c.below, c.above, c.outside_categories


def _values(report: DataCheck, name: str) -> list[tuple[str, int, str, object, object]]:
    return [(v.value, v.count, v.issue, v.nearest, v.reason) for v in report.column(name).values]


def test_messy_csv_exact_counts(messy: Path) -> None:
    report = check_data(messy, META)
    assert report.name == "messy" and report.rows == 8 and not report.ok and report.problems == ()
    assert [c.name for c in report.columns] == ["age", "sex", "kids", "income", "city", "pid"]
    #                                 conforming null unreadable below above outside
    assert _counts(report, "age") == (4, 1, 2, 0, 1, 0)  # 'N/A' and 'inf' unreadable, 150 above
    assert _counts(report, "sex") == (5, 0, 0, 0, 0, 3)  # ' Male' is stripped (strip_strings=True)
    assert _counts(report, "kids") == (5, 1, 1, 0, 0, 1)  # '3.5' is not an integer, 7 is no category
    assert _counts(report, "income") == (4, 1, 1, 1, 1, 0)
    assert _counts(report, "city") == (6, 0, 0, 0, 0, 2)
    assert _counts(report, "pid") == (7, 1, 0, 0, 0, 0)
    for c in report.columns:
        assert c.checked and c.rows == 8
        assert c.conforming + c.null + c.nonconforming == c.rows
    age = report.column("age")
    assert (age.minimum, age.maximum, age.physical, age.source_type, age.read_as) == (
        29.0,
        150.0,
        "string",
        "VARCHAR",
        "double",
    )
    assert age.conforming_share == 0.5 and not age.ok
    assert report.column("sex").distinct == 5  # as read: Male, male, Female, Femal, Other
    assert _values(report, "sex") == [
        ("Femal", 1, "outside_categories", "Female", "spelling"),
        ("Other", 1, "outside_categories", None, None),
        ("male", 1, "outside_categories", "Male", "case"),
    ]
    assert _values(report, "age") == [
        ("N/A", 1, "unreadable", None, "missing marker"),
        ("inf", 1, "unreadable", None, None),
    ]
    assert _values(report, "kids") == [("3.5", 1, "unreadable", None, None), ("7", 1, "outside_categories", None, None)]
    assert _values(report, "city") == [
        ("Berlin", 1, "outside_categories", None, None),
        ("paris", 1, "outside_categories", "Paris", "case"),
    ]
    pid = report.column("pid")
    assert pid.is_unit and pid.declared == "unit (text)" and not pid.ok  # a row without a unit
    u = report.unit
    assert u is not None and u.column == "pid"
    assert (
        u.units,
        u.rows_without_unit,
        u.rows_per_unit_max,
        u.max_rows,
        u.units_over_max_rows,
        u.rows_over_max_rows,
    ) == (4, 1, 3, 2, 1, 1)
    assert u.rows_per_unit_median in (1, 2) and u.rows_per_unit_p99 == 3
    spread = {g.column: (g.max_per_unit, g.units_over_max_groups) for g in u.groups}
    # only declared categories are keys: unit 3 has kids 0 and 2, cities Nice and Paris ('Berlin' is no key)
    assert spread == {"sex": (1, 0), "kids": (2, 1), "city": (2, 1)}


def test_strip_strings_false_flags_the_leading_space(messy: Path) -> None:
    report = check_data(messy, META | {"strip_strings": False})
    assert _counts(report, "sex") == (4, 0, 0, 0, 0, 4)
    assert (" Male", 1, "outside_categories", "Male", "whitespace") in _values(report, "sex")


def test_dataframe_source_reads_like_a_query() -> None:
    df = pd.DataFrame({"age": [34.0, float("nan"), float("inf"), 200.0], "sex": ["Male", None, "male", 3]})
    meta = Metadata(row_level=True, columns={"age": Numeric(0, 120), "sex": Categorical(("Female", "Male"))})
    report = check_data(df, meta)
    assert report.name == "data" and report.unit is None and report.row_level
    assert _counts(report, "age") == (1, 1, 1, 0, 1, 0)  # NaN is NULL in the frame; inf is not a number
    assert report.column("age").physical == "numeric"
    assert _counts(report, "sex") == (1, 1, 0, 0, 0, 2)
    assert _values(report, "sex") == [
        ("3", 1, "outside_categories", None, None),
        ("male", 1, "outside_categories", "Male", "case"),
    ]


def test_problems_are_reported_not_raised() -> None:
    con = duckdb.connect()
    con.execute("CREATE TABLE t AS SELECT * FROM (VALUES (1, [1, 2], 'a'), (2, [3], 'b')) v(id, tags, incom)")
    meta = {
        "privacy_unit": "id",
        "columns": {
            "tags": {"type": "categorical"},
            "income": {"type": "numeric", "lower": 0, "upper": 1},
            "incom": {"type": "categorical"},
        },
    }
    report = check_data((con, "t"), meta)
    assert report.name == "t" and not report.ok and len(report.problems) == 2
    assert "'tags' has a nested type" in report.problems[0]
    assert "'income' is not in the source (did you mean 'incom'?)" in report.problems[1]
    tags, income = report.column("tags"), report.column("income")
    assert (tags.checked, tags.physical, income.checked, income.physical) == (False, "nested", False, "missing")
    assert report.column("incom").ok and report.column("incom").distinct == 2
    assert report.column("id").ok and report.unit is not None and report.unit.units == 2
    same = check_data(con, meta, table="t")
    assert same.to_dict() == report.to_dict()


def test_parquet_and_duckdb_files_keep_their_physical_types(tmp_path: Path) -> None:
    df = pd.DataFrame({"uid": [1.0, 1.0, 2.0, None], "flag": [True, False, True, True], "x": [1.5, 2.0, 3.0, 4.0]})
    df.to_parquet(tmp_path / "t.parquet")
    meta = {
        "privacy_unit": "uid",
        "columns": {
            "uid": {"type": "categorical", "value_type": "integer"},
            "flag": {"type": "categorical", "categories": [True, False]},
            "x": {"type": "numeric", "lower": 0, "upper": 3},
        },
    }
    report = check_data(tmp_path / "t.parquet", meta)
    assert [(c.name, c.source_type, c.physical, c.read_as) for c in report.columns] == [
        ("uid", "DOUBLE", "numeric", "integer"),
        ("flag", "BOOLEAN", "boolean", "boolean"),
        ("x", "DOUBLE", "numeric", "double"),
    ]
    assert (
        _counts(report, "uid") == (3, 1, 0, 0, 0, 0)
        and _counts(report, "flag") == (4, 0, 0, 0, 0, 0)
        and _counts(report, "x") == (3, 0, 0, 0, 1, 0)
    )
    assert report.unit is not None and (report.unit.units, report.unit.rows_per_unit_max) == (2, 2)
    with duckdb.connect(str(tmp_path / "db.duckdb")) as con:
        con.execute(f"CREATE TABLE people AS SELECT * FROM read_parquet('{tmp_path / 't.parquet'}')")
    from_db = check_data(tmp_path / "db.duckdb", meta, table="people")
    assert from_db.name == "people" and from_db.to_dict()["columns"] == report.to_dict()["columns"]
    with pytest.raises(InvalidParameterError, match="a table or view of the DuckDB database") as e:
        check_data(tmp_path / "db.duckdb", meta, table="nobody")
    assert e.value.name == "table"


def test_clean_data_is_ok_and_serialises(tmp_path: Path) -> None:
    path = tmp_path / "clean.csv"
    path.write_text(CLEAN, encoding="utf-8")
    report = check_data(path, Metadata.from_dict(CLEAN_META), table="people")
    assert report.ok and report.name == "people"
    assert all(c.conforming_share == 1.0 for c in report.columns)
    d = json.loads(json.dumps(report.to_dict()))
    assert d["ok"] and d["curator_only"] and d["rows"] == 3
    assert d["columns"][0]["counts"]["conforming"] == 3 and d["columns"][0]["shares"]["conforming"] == 1.0
    assert d["unit"]["rows_per_unit"]["max"] == 2 and d["unit"]["units_over_max_rows"] == 0
    text = str(report)
    assert text == report.to_text() and "curator only" in text and "every declared column conforms" in text


def test_text_report_shows_near_misses(messy: Path) -> None:
    text = check_data(messy, META | {"strip_strings": False}).to_text()
    assert "' Male' × 1: outside the categories → nearest 'Male' (whitespace)" in text
    assert "'N/A' × 1: not a value of the declared type (a missing-value marker?)" in text
    assert "age: 0 below and 1 above the bounds (queries clip them); values range from 29 to 150" in text
    assert "max_rows=2: 1 units have more rows (1 rows left out of a query without GROUP BY)" in text
    assert "does not conform" in text


def test_nearest_category() -> None:
    cats = ("Female", "Male", "United-States")
    assert nearest_category(" Male ", cats) == ("Male", "whitespace")
    assert nearest_category(" MALE", cats) == ("Male", "case")
    assert nearest_category("United-Stats", cats) == ("United-States", "spelling")
    assert nearest_category("Mars", cats) == (None, None)


def test_bad_input_names_the_parameter(tmp_path: Path, messy: Path) -> None:
    with pytest.raises(InvalidParameterError, match=r"metadata=.*nope\.json.*an existing JSON file") as e:
        check_data(messy, tmp_path / "nope.json")
    assert e.value.name == "metadata"
    broken = tmp_path / "broken.json"
    broken.write_text("{not json", encoding="utf-8")
    with pytest.raises(InvalidParameterError, match="a readable JSON file") as e:
        check_data(messy, broken)
    assert e.value.name == "metadata"
    with pytest.raises(InvalidParameterError, match="keys among") as e:
        check_data(messy, {"privacy_unit": "pid", "colums": {}})
    assert e.value.name == "metadata"
    with pytest.raises(InvalidParameterError, match="a Metadata, a dict") as e:
        check_data(messy, 42)  # type: ignore[arg-type]
    with pytest.raises(
        InvalidParameterError, match=r"data=.*missing\.csv.*an existing CSV, Parquet or DuckDB database file"
    ) as e:
        check_data(tmp_path / "missing.csv", META)
    assert e.value.name == "data"
    with pytest.raises(InvalidParameterError, match="a pandas DataFrame, a CSV or Parquet path") as e:
        check_data(42, META)
    assert e.value.name == "data"
    with pytest.raises(InvalidParameterError) as e:
        check_data(duckdb.connect(), META)
    assert e.value.name == "table"
    with pytest.raises(InvalidParameterError) as e:
        check_data(messy, META, table="")
    assert e.value.name == "table"


# ---- the command line ---------------------------------------------------------------------------------


def _write_meta(tmp_path: Path, meta: dict) -> Path:  # type: ignore[type-arg]
    path = tmp_path / "meta.json"
    path.write_text(json.dumps(meta), encoding="utf-8")
    return path


def test_cli_json_and_exit_code_1(tmp_path: Path, messy: Path) -> None:
    result = runner.invoke(app, ["check", str(messy), "--metadata", str(_write_meta(tmp_path, META)), "--json"])
    assert result.exit_code == 1, result.output
    out = json.loads(result.stdout)
    assert out["ok"] is False and out["rows"] == 8 and out["curator_only"] is True
    sex = next(c for c in out["columns"] if c["name"] == "sex")
    assert sex["counts"]["outside_categories"] == 3 and sex["shares"]["conforming"] == 5 / 8


def test_cli_table_and_exit_code_0(tmp_path: Path) -> None:
    data = tmp_path / "clean.csv"
    data.write_text(CLEAN, encoding="utf-8")
    result = runner.invoke(app, ["check", str(data), "--metadata", str(_write_meta(tmp_path, CLEAN_META))])
    assert result.exit_code == 0, result.output
    assert "every declared column conforms" in result.stdout and "privacy unit 'pid'" in result.stdout


def test_cli_text_lists_near_misses(tmp_path: Path, messy: Path) -> None:
    result = runner.invoke(
        app, ["check", str(messy), "--metadata", str(_write_meta(tmp_path, META | {"strip_strings": False}))]
    )
    assert result.exit_code == 1
    assert "' Male' × 1: outside the categories → nearest 'Male' (whitespace)" in result.stdout


def test_cli_bad_input_exits_2(tmp_path: Path, messy: Path) -> None:
    meta = _write_meta(tmp_path, META)
    missing_meta = runner.invoke(app, ["check", str(messy), "--metadata", str(tmp_path / "nope.json")])
    assert missing_meta.exit_code == 2 and "metadata" in missing_meta.output
    broken = tmp_path / "broken.json"
    broken.write_text("{", encoding="utf-8")
    bad_json = runner.invoke(app, ["check", str(messy), "--metadata", str(broken)])
    assert bad_json.exit_code == 2 and "a readable JSON file" in " ".join(bad_json.output.split())
    missing_data = runner.invoke(app, ["check", str(tmp_path / "missing.csv"), "--metadata", str(meta)])
    assert missing_data.exit_code == 2 and "no such data file" in missing_data.output
    no_meta = runner.invoke(app, ["check", str(messy)])
    assert no_meta.exit_code == 2 and "--metadata" in no_meta.output


def test_cli_help_states_the_exit_codes() -> None:
    result = runner.invoke(app, ["check", "--help"])
    assert result.exit_code == 0
    text = " ".join(result.output.split())
    assert "curator only" in text and "0 when everything conforms, 1 when something does not, 2 on bad input" in text


# ---- UCI Adult -------------------------------------------------------------------------------------------

needs_adult = pytest.mark.skipif(not ADULT.exists(), reason="the UCI Adult data is not available")
ADULT_META = Metadata(
    row_level=True,
    columns={n: Numeric(*b) for n, b in datasets.ADULT_NUMERIC.items()}
    | {n: Categorical(c) for n, c in datasets.ADULT_CATEGORICAL.items()},
)


@needs_adult
def test_adult_strip_strings_reads_sex_as_declared() -> None:
    report = check_data(ADULT, ADULT_META)
    assert report.rows == 32_561 and report.problems == ()
    sex = report.column("sex")
    assert sex.conforming == 32_561 and sex.conforming_share == 1.0 and sex.ok
    for name in datasets.ADULT_NUMERIC:
        assert report.column(name).ok, name
    # '?' marks a missing value in Adult: outside the categories, and not a near miss
    assert _counts(report, "workclass") == (30_725, 0, 0, 0, 0, 1_836)
    assert _values(report, "workclass") == [(" ?", 1_836, "outside_categories", None, "missing marker")]
    assert not report.ok


@needs_adult
def test_adult_without_strip_strings_flags_the_leading_space() -> None:
    report = check_data(ADULT, Metadata(columns=ADULT_META.columns, row_level=True, strip_strings=False))
    sex = report.column("sex")
    assert sex.conforming == 0 and sex.outside_categories == 32_561
    assert [(v.value, v.nearest, v.reason) for v in sex.values] == [
        (" Male", "Male", "whitespace"),
        (" Female", "Female", "whitespace"),
    ]
    assert report.column("age").ok  # numbers are read with or without the space


@needs_adult
def test_adult_cli(tmp_path: Path) -> None:
    meta = _write_meta(tmp_path, ADULT_META.to_dict())
    result = runner.invoke(app, ["check", str(ADULT), "--metadata", str(meta), "--json"])
    assert result.exit_code == 1, result.output
    out = json.loads(result.stdout)
    assert (
        out["rows"] == 32_561 and next(c for c in out["columns"] if c["name"] == "sex")["shares"]["conforming"] == 1.0
    )


def test_a_unit_without_categorical_columns() -> None:
    """The unit's report needs no categorical column (a bound parameter left unused used to make
    DuckDB refuse the statement)."""
    report = check_data(
        pd.DataFrame({"u": ["a", "b", "b"], "x": [1, 2, 3]}),
        {"privacy_unit": "u", "max_rows": 1, "columns": {"x": {"type": "numeric"}}},
    )
    assert (
        report.unit is not None
        and report.unit.units == 2
        and report.unit.rows_per_unit_max == 2
        and report.unit.units_over_max_rows == 1
    )
