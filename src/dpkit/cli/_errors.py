"""How the command line words dpkit's errors.

The library's messages are written for the Python API: ``epsilon=0.0 is not accepted``, ``pass
exist_ok=True to reuse it``, ``Numeric(lower, upper) in the metadata``. A command prints them
through :func:`cli_message`, which rewords them from the errors' fields, in one place:

* :data:`OPTIONS` maps a Python parameter to what sets it on the command line (``max_groups`` →
  ``--max-groups``, ``row_level`` → the flag ``--row-level``); a command adds or overrides
  entries (``dpkit budget create`` takes the dataset as its DATASET argument). An
  :class:`~dpkit.errors.InvalidParameterError` about a mapped parameter is rendered from its
  ``name``, ``value``, ``accepted`` and ``why``; mentions of mapped keyword arguments in any
  message (``privacy_unit='user_id'``, ``row_level=True``, ``set privacy_unit=``) become the
  options (quoted values, such as a column's name, are never rewritten).
* :data:`FIXES` words each remedy an error carries as data (:class:`~dpkit.errors.Fix`) for the
  command line: its Python text in the message is swapped for the command line's (the JSON form
  of a metadata file's column, ``--exist-ok``, the ``dpkit budget create`` command to run).

The Python API's messages are not changed by any of this.
"""

from __future__ import annotations

import functools
import json
import re
import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from dpkit.errors import Fix, InvalidParameterError

__all__ = ["Arg", "CliContext", "FIXES", "Flag", "OPTIONS", "Opt", "cli_message"]


@dataclass(frozen=True)
class Opt:
    """An option that takes a value: ``--epsilon 0.5``."""

    flag: str

    def mention(self, value: str | None) -> str:
        return self.flag if value is None else f"{self.flag} {value}"


@dataclass(frozen=True)
class Flag:
    """An option without a value that sets the parameter to ``sets`` (``--row-level`` sets
    ``row_level=True``; ``--no-header`` sets ``header=False``)."""

    flag: str
    sets: bool = True

    def mention(self, value: str | None) -> str:
        if value is None or value == repr(self.sets):
            return self.flag
        return f"without {self.flag}"


@dataclass(frozen=True)
class Arg:
    """A positional argument (``DATASET``)."""

    metavar: str

    def mention(self, value: str | None) -> str:
        return self.metavar if value is None else f"{self.metavar} {value}"


Spelling = Opt | Flag | Arg

#: Python parameter → how the ``dpkit`` commands set it. The same name means the same option in
#: every command; a command whose spelling differs passes its own entries to :class:`CliContext`.
OPTIONS: dict[str, Spelling] = {
    "epsilon": Opt("--epsilon"),
    "delta": Opt("--delta"),
    "noise": Opt("--noise"),
    "confidence": Opt("--confidence"),
    "max_groups": Opt("--max-groups"),
    "max_rows": Opt("--max-rows"),
    "privacy_unit": Opt("--unit"),
    "row_level": Flag("--row-level"),
    "analyst": Opt("--analyst"),
    "dataset": Opt("--dataset"),
    "table": Opt("--table"),
    "metadata": Opt("--metadata"),
    "ledger": Opt("--ledger"),
    "exist_ok": Flag("--exist-ok"),
    "header": Flag("--no-header", sets=False),
    "columns": Opt("--columns"),
    "delimiter": Opt("--delimiter"),
    "null": Opt("--null"),
    "skip_rows": Opt("--skip-rows"),
    "data": Arg("DATA"),
}


@dataclass(frozen=True)
class CliContext:
    """What a command knows that a rewording may need.

    ``options``: entries added to or overriding :data:`OPTIONS` for this command; ``data``: the
    data file as the user typed it, when the budget's dataset is that file's identity;
    ``ledger``: the ledger's absolute location; ``datasets``: the datasets of that ledger's
    budgets (for the command that found none of its own)."""

    options: Mapping[str, Spelling] = field(default_factory=dict)
    data: str | None = None
    ledger: str | None = None
    datasets: tuple[str, ...] = ()

    def spelling(self, name: str) -> Spelling | None:
        return self.options.get(name, OPTIONS.get(name))


def _value(value: object) -> str:
    """A value as it is typed on a command line."""
    if isinstance(value, bool) or value is None:
        return repr(value)
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return shlex.quote(",".join(str(v) for v in value))
    return shlex.quote(str(value))


# -- the remedies -------------------------------------------------------------------------------


def _column_json(column: object, rest: str) -> str:
    return f"{json.dumps(str(column), ensure_ascii=False)}: {{{rest}}}"


def _declare_bounds(fix: Fix, ctx: CliContext) -> str:
    entry = _column_json(fix.facts.get("column", "COLUMN"), '"type": "numeric", "lower": ..., "upper": ...')
    return f"{entry} in the metadata file"


def _declare_categories(fix: Fix, ctx: CliContext) -> str:
    entry = _column_json(fix.facts.get("column", "COLUMN"), '"type": "categorical", "categories": [...]')
    return f"{entry} in the metadata file"


def _declare_column(fix: Fix, ctx: CliContext) -> str:
    entry = _column_json(fix.facts.get("column", "COLUMN"), '"type": "numeric" or "categorical", ...')
    return f"{entry} in the metadata file"


def _public_keys(fix: Fix, ctx: CliContext) -> str:
    columns = fix.facts.get("columns") or ("COLUMN",)
    entries = ", ".join(_column_json(c, '"type": "categorical", "categories": [...]') for c in columns)
    delta = ctx.spelling("delta") or Opt("--delta")
    return f"declare the categories in the metadata file ({entries}), or give {delta.mention('D')} (0 < D < 1) for private key selection"


def _reuse_budget(fix: Fix, ctx: CliContext) -> str:
    flag = ctx.spelling("exist_ok") or Flag("--exist-ok")
    return f"add {flag.mention(None)} to reuse it"


def _create_budget(fix: Fix, ctx: CliContext) -> str:
    dataset = str(fix.facts.get("dataset", "DATASET"))
    target = ctx.data if ctx.data is not None else dataset
    command = (
        f"dpkit budget create {shlex.quote(target)} {shlex.quote(str(fix.facts.get('analyst', 'ANALYST')))} --epsilon E"
    )
    if ctx.ledger is not None:
        command += f" --ledger {shlex.quote(ctx.ledger)}"
    text = f"create it first with: {command}"
    others = [d for d in ctx.datasets if d != dataset]
    if others and ctx.data is not None and dataset not in ctx.datasets:  # a dataset new to this ledger
        shown = ", ".join(repr(d) for d in others)
        text += (
            f"; or, if {ctx.data} holds the data of a dataset that has a budget here ({shown}), "
            "pay from that budget with --dataset NAME"
        )
    return text


#: Fix kind → its command-line wording (the Python wording, ``Fix.text``, is swapped for it).
FIXES: dict[str, Callable[[Fix, CliContext], str]] = {
    "declare_bounds": _declare_bounds,
    "declare_categories": _declare_categories,
    "declare_column": _declare_column,
    "public_keys": _public_keys,
    "reuse_budget": _reuse_budget,
    "create_budget": _create_budget,
}


def _fix_of(exc: BaseException) -> Fix | None:
    fix = getattr(exc, "fix", None)
    return fix if isinstance(fix, Fix) else None


# -- keyword arguments in the text --------------------------------------------------------------

_LITERAL = r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\""
_VALUE = rf"{_LITERAL}|True|False|None|\.\.\.|-?[0-9][0-9.e+-]*"


@functools.lru_cache(maxsize=16)
def _mentions(names: frozenset[str]) -> re.Pattern[str]:
    """A quoted text, or a mention of one of ``names`` (not inside a word, a dotted key or a path)."""
    alternatives = "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True))
    return re.compile(
        rf"(?P<quoted>{_LITERAL})|(?<![\w.=/\\-])(?P<name>{alternatives})(?P<eq>=(?P<value>{_VALUE})?)?(?![\w(/\\])"
    )


def _keywords(text: str, ctx: CliContext) -> str:
    """Mentions of mapped keyword arguments (``name=value``, ``name=``, and the bare ``name`` of
    an underscored parameter) as their options; quoted text is left as it is."""
    pattern = _mentions(frozenset({*OPTIONS, *ctx.options}))

    def replace(m: re.Match[str]) -> str:
        if m.group("quoted") is not None:
            return m.group(0)
        name, value = m.group("name"), m.group("value")
        spelling = ctx.spelling(name)
        if spelling is None or (m.group("eq") is None and "_" not in name):
            return m.group(0)  # a plain word ("delta", "columns") is prose unless it is name=
        if value is not None and value[:1] in "'\"":
            value = shlex.quote(value[1:-1])
        return spelling.mention(value)

    return pattern.sub(replace, text)


_PYTHON_ALTERNATIVES = re.compile(r"^(?:True|False|None)(?:(?:,| or) (?:True|False|None))*(?::\s*|\s+|$)")


def _reword(text: str, fix: Fix | None, ctx: CliContext) -> str:
    wording = FIXES.get(fix.kind) if fix is not None else None
    if fix is None or wording is None or fix.text not in text:
        return _keywords(text, ctx)
    before, _, after = text.partition(fix.text)
    return _keywords(before, ctx) + wording(fix, ctx) + _keywords(after, ctx)


def cli_message(exc: BaseException, ctx: CliContext | None = None) -> str:
    """``exc``'s message in the command line's terms (see the module's docstring)."""
    ctx = ctx or CliContext()
    fix = _fix_of(exc)
    if not isinstance(exc, InvalidParameterError):
        return _reword(str(exc), fix, ctx)
    accepted = _reword(exc.accepted, fix, ctx)
    why = _reword(exc.why, fix, ctx) if exc.why else ""
    tail = f". {why}" if why else ""
    spelling = ctx.spelling(exc.name)
    if spelling is None:  # not set by an option (a column named in the SQL, a key of the metadata file)
        return f"{exc.name} {exc.value!r} is not accepted: {exc.name} must be {accepted}{tail}"
    if isinstance(spelling, Flag):
        # a flag has no value to correct: what is said is when it may be given
        rest = _PYTHON_ALTERNATIVES.sub("", accepted, count=1)
        sep = "" if not rest else " " if rest.startswith("with ") else ": "
        return f"{spelling.flag} is not accepted{sep}{rest}{tail}"
    if exc.value is None:
        return f"{spelling.mention(None)} is missing: it must be {accepted}{tail}"
    return f"{spelling.mention(_value(exc.value))} is not accepted: {spelling.mention(None)} must be {accepted}{tail}"
