"""Reading a file laid out like UCI Adult: a title line before the header (``skip_rows``), fields
separated by ``", "`` (a delimiter of several characters) and ``" ?"`` for a missing value (``null``
compared with the field's spaces trimmed).

The file is generated here (the real one is used only where it is present, beside the repository).
Deterministic: the reader has no noise, so there is no false-failure rate; each option is also
checked against a read without it (the power check). Spark reads the same rows (tests taking the
``spark`` fixture).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import duckdb
import pytest
from typer.testing import CliRunner

from dpkit.analytics import Categorical, Metadata, Numeric
from dpkit.analytics.engines.csv_source import CsvFile, CsvOptions, csv_names, csv_source_sql, read_csv_spark
from dpkit.cli import app
from dpkit.errors import InvalidParameterError

ADULT = Path(__file__).resolve().parents[3] / "shared" / "data" / "adult" / "adult.data"
TITLE = "|1x3 Cross validator"  # the first line of UCI Adult's adult.test
HEADER = "age, workclass, sex, Y"
WORKCLASS = ("Private", "State-gov", "?")
PEOPLE = [(20 + i % 60, WORKCLASS[i % 3], ("Female", "Male")[i % 2], ("<=50K", ">50K")[i % 5 == 0]) for i in range(90)]
META = Metadata(
    columns={
        "age": Numeric(17, 90),
        "workclass": Categorical(("Private", "State-gov")),
        "sex": Categorical(("Female", "Male")),
        "Y": Categorical(("<=50K", ">50K")),
    },
    row_level=True,
)


def adult_like(tmp_path: Path, *, title: bool = True, extra: list[str] = ()) -> Path:  # type: ignore[assignment]
    lines = [TITLE] if title else []
    lines += [HEADER, *(", ".join(str(v) for v in p) for p in PEOPLE), *extra]
    path = tmp_path / "adult_like.test"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def rows(path: Path, options: CsvOptions) -> Counter[tuple[object, ...]]:
    with duckdb.connect() as con:
        return Counter(con.sql(f"SELECT * FROM {csv_source_sql(path, options)}").fetchall())


def expected(null: bool = True) -> Counter[tuple[object, ...]]:
    return Counter((str(a), None if w == "?" and null else w, s, y) for a, w, s, y in PEOPLE)


def test_skip_rows_reads_the_header_after_the_title(tmp_path: Path) -> None:
    path = adult_like(tmp_path)
    options = CsvOptions(delimiter=", ", null=("?",), skip_rows=1)
    assert csv_names(path, options) == ["age", "workclass", "sex", "Y"]
    assert rows(path, options) == expected()
    # Without it the title is taken for the header: one column, named after the title.
    assert csv_names(path, CsvOptions(delimiter=", ")) == [TITLE]
    # A line equal to a skipped one is skipped too (the same on Spark, which reads files in parts).
    again = adult_like(tmp_path, extra=[TITLE, "33, Private, Male, >50K"])
    assert rows(again, options) == expected() + Counter({("33", "Private", "Male", ">50K"): 1})


def test_skip_rows_past_the_end_names_the_line(tmp_path: Path) -> None:
    short = tmp_path / "short.csv"
    short.write_text("title\n\n", encoding="utf-8")
    with pytest.raises(InvalidParameterError, match=r"line 4 \(after the 3 skipped\)") as caught:
        csv_names(short, CsvOptions(skip_rows=3))
    assert caught.value.name == "data"


def test_a_delimiter_of_several_characters(tmp_path: Path) -> None:
    quoted = [
        '34, "Self-emp, inc", Male, >50K',  # the delimiter inside a quoted field is text
        '35, "say ""hi""", Female, <=50K',
        '36, "a\x1fb", Female, <=50K',  # U+001F and a quote: malformed, dropped alone
        "37, a\x1fb, Female, <=50K",  # U+001F without quotes: split as it is
        '38, "x",Female, <=50K',  # only the delimiter may follow a closing quote: dropped
    ]
    path = adult_like(tmp_path, title=False, extra=quoted)
    got = rows(path, CsvOptions(delimiter=", "))
    assert got == expected(null=False) + Counter(
        {
            ("34", "Self-emp, inc", "Male", ">50K"): 1,
            ("35", 'say "hi"', "Female", "<=50K"): 1,
            ("37", "a\x1fb", "Female", "<=50K"): 1,
        }
    )
    # The power check: with "," every field but the first keeps its leading space.
    assert ("20", " Private", " Female", " >50K") in rows(path, CsvOptions())


def test_null_is_compared_with_the_spaces_trimmed(tmp_path: Path) -> None:
    """Split at "," every field after the first starts with a space: " ?" is NULL for null "?"."""
    path = adult_like(tmp_path, title=False)
    nulls = Counter(w for _, w, _, _ in rows(path, CsvOptions(null=("?",))).elements())
    assert nulls[None] == 30 and " Private" in nulls and " ?" not in nulls
    assert Counter(w for _, w, _, _ in rows(path, CsvOptions()).elements())[" ?"] == 30  # the power check
    assert CsvOptions(null=(" NA ", "\u00a0?")).null == ("NA", "?")  # the texts are trimmed alike
    # A quoted field is text, never NULL, and only the field's ends are trimmed.
    quoted = tmp_path / "q.csv"
    quoted.write_text('a,b\n1,"?"\n2,\u2003?\n3,?x\n4, ? ?\n', encoding="utf-8")
    assert sorted(rows(quoted, CsvOptions(null=("?",))).elements()) == [
        ("1", "?"),
        ("2", None),
        ("3", "?x"),
        ("4", " ? ?"),
    ]


#: One person's line each, hostile to the options of this module.
HOSTILE = [
    TITLE,  # a skipped line again: skipped
    HEADER,
    '33, "open, Male, >50K',
    '33, "a\x1fb", Male, >50K',
    "33, a\x1fb\x1f, Male, >50K",
    '33, "x, y",Male',
    "33,, Private,, Male",
    " ?,  ?, ?",
    "\u00a0?\u2003, \u3000?",
]


@pytest.mark.parametrize("line", HOSTILE)
def test_one_hostile_line_adds_at_most_its_own_row(tmp_path: Path, line: str) -> None:
    """Row-local with these options too: a line inserted mid-file adds at most one row, and no
    other row changes (the same property as tests/analytics/test_csv_source.py's)."""
    options = CsvOptions(delimiter=", ", null=("?",), skip_rows=1)
    before = rows(adult_like(tmp_path), options)
    lines = adult_like(tmp_path).read_text(encoding="utf-8").splitlines()
    path = tmp_path / "d_plus.test"
    path.write_text("\n".join([*lines[:40], line, *lines[40:]]) + "\n", encoding="utf-8")
    after = rows(path, options)
    assert not (before - after) and sum((after - before).values()) <= 1


def test_the_command_line_reads_the_adult_layout(tmp_path: Path) -> None:
    path = adult_like(tmp_path)
    meta = tmp_path / "meta.json"
    meta.write_text(json.dumps(META.to_dict()), encoding="utf-8")
    runner = CliRunner()
    base = ["check", str(path), "--metadata", str(meta), "--json"]
    good = runner.invoke(app, [*base, "--skip-rows", "1", "--delimiter", ", ", "--null", "?"])
    assert good.exit_code == 0, good.output
    report = json.loads(good.stdout)
    assert report["ok"] is True and report["rows"] == len(PEOPLE)
    # The power check: without --skip-rows the title is the header, and no declared column is found.
    assert runner.invoke(app, [*base, "--delimiter", ", ", "--null", "?"]).exit_code != 0
    bad = runner.invoke(app, [*base, "--skip-rows", "-1"])
    assert bad.exit_code == 2 and "--skip-rows" in bad.output


def test_spark_reads_the_same_rows(tmp_path: Path, spark) -> None:  # type: ignore[no-untyped-def]
    extra = [TITLE, '34, "Self-emp, inc", Male, >50K', '36, "a\x1fb", Female, <=50K', "37, a\x1fb, ?, x"]
    path = adult_like(tmp_path, extra=extra)
    for options in (
        CsvOptions(delimiter=", ", null=("?",), skip_rows=1),
        CsvOptions(null=("?",), skip_rows=1),
        CsvOptions(header=False, columns=("a", "b", "c", "d"), delimiter=", ", skip_rows=2),
    ):
        on_spark = Counter(tuple(r) for r in read_csv_spark(spark, CsvFile(path, options)).collect())
        assert on_spark == rows(path, options), options


@pytest.fixture(scope="module")
def spark():  # type: ignore[no-untyped-def]
    pytest.importorskip("pyspark")
    from dpkit.analytics.engines.spark import spark_session

    return spark_session()  # the process-wide session, left running for later modules


@pytest.mark.skipif(not ADULT.exists(), reason="the UCI Adult data is not beside the repository")
def test_the_real_adult_file() -> None:
    import pandas as pd

    truth = pd.read_csv(ADULT, skipinitialspace=True, na_values="?", keep_default_na=False, dtype=str)
    got = rows(ADULT, CsvOptions(delimiter=", ", null=("?",)))
    assert sum(got.values()) == len(truth)
    names = csv_names(ADULT, CsvOptions(delimiter=", "))
    workclass = Counter(r[names.index("workclass")] for r in got.elements())
    assert workclass[None] == truth["workclass"].isna().sum() > 0
    assert not any(isinstance(w, str) and w != w.strip() for w in workclass)
