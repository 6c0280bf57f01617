"""The one error hierarchy of dpkit.

Every message says what was wrong, the value received and what is accepted.
Bad input never debits a budget and never releases data.

A message that suggests a remedy in the Python API's terms (``pass exist_ok=True``,
``Numeric(lower, upper) in the metadata``) also carries it as data, :class:`Fix`, so that a front
end with other terms (the ``dpkit`` command line) can word it its own way; the message itself is
the Python API's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "Fix",
    "FIX_KINDS",
    "DPError",
    "InvalidParameterError",
    "LimitExceededError",
    "InvalidDataError",
    "BudgetExceededError",
    "QueryFailedError",
    "LedgerError",
    "AuthError",
]


@dataclass(frozen=True)
class Fix:
    """The remedy an error's message suggests, as data.

    ``kind`` names the remedy (one of :data:`FIX_KINDS`), ``text`` is its Python API wording
    exactly as it appears in the message, and ``facts`` holds the public facts another wording
    needs (a column's name, a dataset's). A front end swaps ``text`` for its own wording of
    ``kind`` (the command line's are in ``dpkit.cli._errors``)."""

    kind: str
    text: str
    facts: Mapping[str, Any] = field(default_factory=dict)


#: The remedies a :class:`Fix` names, with the facts each carries.
FIX_KINDS: dict[str, str] = {
    "declare_bounds": "declare the column's bounds in the metadata (facts: column)",
    "declare_categories": "declare the column's public categories in the metadata (facts: column)",
    "declare_column": "declare the column, with its type (and bounds), in the metadata (facts: column)",
    "public_keys": "declare categories, give the public keys, or δ > 0 for private key selection (facts: columns)",
    "reuse_budget": "reuse the existing budget of the same (ε, δ) (facts: dataset, analyst)",
    "create_budget": "create the missing budget first (facts: dataset, analyst)",
}


class DPError(Exception):
    """Base class of every error dpkit raises on purpose. ``fix``: the remedy the message
    suggests, as data (:class:`Fix`), or None."""

    fix: Fix | None = None

    def __init__(self, *args: object, fix: Fix | None = None) -> None:
        super().__init__(*args)
        if fix is not None:
            self.fix = fix


class InvalidParameterError(DPError, ValueError):
    """A privacy or mechanism parameter is outside what is accepted."""

    def __init__(self, name: str, value: object, accepted: str, why: str = "", *, fix: Fix | None = None) -> None:
        self.name = name
        self.value = value
        self.accepted = accepted
        self.why = why
        message = f"{name}={value!r} is not accepted: {name} must be {accepted}"
        if why:
            message += f". {why}"
        super().__init__(message, fix=fix)


class InvalidDataError(DPError, ValueError):
    """The data handed to a mechanism is malformed (non-finite, wrong shape or type, empty)."""

    def __init__(self, name: str, problem: str, accepted: str) -> None:
        self.name = name
        self.problem = problem
        self.accepted = accepted
        super().__init__(f"{name}: {problem}; accepted: {accepted}")


class LimitExceededError(InvalidParameterError):
    """A request is larger than a limit its operator set (the product of public group keys, the
    rows of a result, the size of an answer, the depth of a query). Decided on the request and
    the declared metadata only, before anything is paid or read; the message names the limit
    and the setting that controls it."""

    def __init__(self, name: str, value: object, limit: int | float, setting: str) -> None:
        self.limit = limit
        self.setting = setting
        super().__init__(name, value, f"at most {limit:,}", f"The limit is {setting}={limit!r}, set by the operator")


class BudgetExceededError(DPError):
    """A spend was refused because it would exceed the remaining budget."""

    def __init__(self, requested: str, remaining: str) -> None:
        self.requested = requested
        self.remaining = remaining
        super().__init__(f"privacy budget exceeded: requested {requested}, remaining {remaining}")


class QueryFailedError(DPError):
    """A paid query could not be computed. The spend stands (the data may already have been
    touched), and the message is the same whatever went wrong: it names no data value, file path
    or engine message, because an error after the debit is itself something the analyst sees.
    The details go to the curator's log (the ``dpkit.curator`` logger)."""

    MESSAGE = "the query could not be computed; the spend stands"

    def __init__(self, spend_id: int | None = None) -> None:
        self.spend_id = spend_id
        super().__init__(self.MESSAGE)


class LedgerError(DPError):
    """The persistent budget ledger could not record or read a spend."""


class AuthError(DPError):
    """An analyst could not be authenticated or is not allowed the request."""
