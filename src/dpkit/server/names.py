"""The shapes of the names the service accepts: datasets, principals, DuckDB tables.

A name is checked before anything is looked up, so an odd path segment or body field is refused
as a bad parameter (400) naming what is accepted, and never reaches a query or a file name.

>>> check_dataset_name("people")
'people'
>>> check_principal_name("alice@example.org")
'alice@example.org'
"""

from __future__ import annotations

import re

from dpkit.errors import InvalidParameterError

__all__ = [
    "DATASET_NAME",
    "PRINCIPAL_NAME",
    "TABLE_NAME",
    "check_dataset_name",
    "check_principal_name",
    "check_release_name",
]

#: A dataset's name: it is also the table analysts write after ``FROM``.
DATASET_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")
PRINCIPAL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}")
#: A table inside a DuckDB database file, optionally with its schema.
TABLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}(\.[A-Za-z_][A-Za-z0-9_]{0,62})?")


def _check_name(kind: str, value: object, pattern: re.Pattern[str], accepted: str) -> str:
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise InvalidParameterError(kind, value, accepted)
    return value


def check_dataset_name(value: object) -> str:
    return _check_name(
        "dataset", value, DATASET_NAME, "a name of letters, digits and '_' (1–63 characters, not starting with a digit)"
    )


def check_release_name(value: object) -> str:
    """A published release's name (``publish``): the shape of a dataset's name."""
    return _check_name(
        "publish", value, DATASET_NAME, "a name of letters, digits and '_' (1–63 characters, not starting with a digit)"
    )


def check_principal_name(value: object) -> str:
    return _check_name("name", value, PRINCIPAL_NAME, "a name of letters, digits and '_.@-' (1–64 characters)")
