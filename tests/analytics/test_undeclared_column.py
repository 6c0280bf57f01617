"""A column the metadata does not declare: the refusal says so and lists the declared columns.

The usual cause is a table opened without ``metadata=``: the data has the column, the
declaration does not. The message names the metadata and lists the declared names only — never
the source's other columns, which only the data holds — and it is refused before any debit.
"""

from __future__ import annotations

from collections.abc import Callable

import pandas as pd
import pytest

import dpkit as dp
from dpkit.analytics import Categorical, Metadata, Numeric
from dpkit.cli._errors import cli_message
from dpkit.errors import InvalidParameterError

DATA = pd.DataFrame(
    {
        "species": ["a", "b"] * 20,
        "mass": [3000.0 + i for i in range(40)],
        "island": ["x", "y"] * 20,
        "flipper": [200.0] * 40,
        "secret_col": range(40),
    }
)

CALLS: list[tuple[Callable[[dp.Session], object], str, str]] = [
    (lambda s: s.sql("SELECT species, COUNT(*) FROM data GROUP BY species", epsilon=0.5), "sql", "species"),
    (lambda s: s.sql("SELECT AVG(mass) FROM data", epsilon=0.5), "sql", "mass"),
    (lambda s: s.sql("SELECT COUNT(*) FROM data WHERE mass > 3", epsilon=0.5), "sql", "mass"),
    (lambda s: s.where("mass > 3").count(epsilon=0.5), "where", "mass"),
    (lambda s: s.mean("mass", epsilon=0.5), "column", "mass"),
    (lambda s: s.group_by("species").count(epsilon=0.5), "columns", "species"),
]


def _session(metadata: Metadata | None) -> dp.Session:
    return dp.Session(DATA, metadata=metadata, row_level=True, budget=dp.Budget(epsilon=1.0))


@pytest.mark.parametrize("call, parameter, column", CALLS)
def test_without_metadata_the_message_names_the_metadata(
    call: Callable[[dp.Session], object], parameter: str, column: str
) -> None:
    s = _session(None)
    with pytest.raises(InvalidParameterError) as info:
        call(s)
    text = str(info.value)
    assert info.value.name == parameter and info.value.value == column
    assert f"{column!r} is not declared in the metadata" in text
    assert "declared: none" in text and "Metadata(columns=" in text
    assert "unknown column" in text  # the wording the service's clients already match on
    assert s.spent == (0.0, 0.0)


@pytest.mark.parametrize("call, parameter, column", CALLS)
def test_the_declared_columns_are_listed_and_no_other(
    call: Callable[[dp.Session], object], parameter: str, column: str
) -> None:
    declared = {"island": Categorical(("x", "y")), "flipper": Numeric(0, 300)}
    with pytest.raises(InvalidParameterError) as info:
        call(_session(Metadata(columns=declared)))
    text = str(info.value)
    assert "declared: 'island', 'flipper'" in text
    # The source's undeclared columns are the data's own names: never in a message.
    assert "secret_col" not in text and info.value.value == column


def test_a_long_declaration_is_listed_in_part() -> None:
    declared = {f"c{i:03d}": Numeric(0, 1) for i in range(50)}
    s = dp.Session(
        pd.DataFrame(dict.fromkeys(declared, [0.5])),
        metadata=Metadata(columns=declared),
        row_level=True,
        budget=dp.Budget(epsilon=1.0),
    )
    with pytest.raises(InvalidParameterError) as info:
        s.mean("mass", epsilon=0.5)
    assert "'c019' and 30 more" in str(info.value) and "'c020'" not in str(info.value)


def test_the_command_line_words_the_remedy_for_the_metadata_file() -> None:
    with pytest.raises(InvalidParameterError) as info:
        _session(None).sql("SELECT AVG(mass) FROM data", epsilon=0.5)
    assert info.value.fix is not None and info.value.fix.kind == "declare_column"
    text = cli_message(info.value)
    assert '"mass": {"type": "numeric" or "categorical", ...} in the metadata file' in text
    assert "Metadata(columns=" not in text
