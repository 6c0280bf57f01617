"""What the curator service accepts from the network, checked before anything else reads it.

Every request body, query parameter and path parameter an analyst sends is checked here (or
against the patterns named here) before it reaches the service, the audit log or the ledger:

* a body is valid UTF-8, valid JSON, nested at most :data:`MAX_JSON_DEPTH` levels, and holds no
  lone surrogate (``"\\ud800"`` parses to one in Python and cannot be encoded again) and no NUL
  character (PostgreSQL text cannot store it) in any string or key;
* integers in query parameters lie in a stated range (the database's 64-bit integers);
* names in paths match the patterns of the service (dataset, principal, key id).

A failure raises :class:`~dpkit.errors.InvalidParameterError` naming the parameter, the value
(shortened and escaped) and what is accepted; the HTTP layer answers it 400 ``invalid_request``.
Nothing an analyst sends can then break another request's audit entry or transaction.

>>> check_json_body(b'{"epsilon": 0.5, "sql": "SELECT COUNT(*) FROM people"}')
>>> check_json_body(b'{"sql": "\\\\ud800"}')
Traceback (most recent call last):
...
dpkit.errors.InvalidParameterError: body='\\\\ud800' is not accepted: body must be JSON whose strings are valid Unicode (no lone surrogate, no NUL character)
>>> json_depth('[[1], {"a": "[[["}]')
2
>>> check_int("after", "12", 0, 2**63 - 1)
12
"""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np

from dpkit.errors import InvalidParameterError
from dpkit.server.keys import KEY_ID

__all__ = [
    "MAX_JSON_DEPTH",
    "MAX_INT",
    "check_json_body",
    "json_depth",
    "check_int",
    "check_key_id",
    "printable",
]

#: Nesting of arrays and objects accepted in a request body. The deepest legitimate body (a
#: query's ``keys``: a list of lists) is 4 levels; the parsers of the stack recurse per level.
MAX_JSON_DEPTH = 32
#: The largest integer a query parameter may hold (the databases' signed 64-bit integers).
MAX_INT = 2**63 - 1

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.S)
_BAD_CHAR = re.compile("[\x00\ud800-\udfff]")
_OPEN, _CLOSE = ord("["), ord("]")
_OPEN_OBJ, _CLOSE_OBJ = ord("{"), ord("}")
_UNPRINTABLE = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\ud800-\udfff]")


def json_depth(text: str) -> int:
    """How deeply arrays and objects nest in the JSON ``text`` (without parsing it, so that no
    depth of input can exhaust a recursive parser's stack); brackets inside strings do not count."""
    skeleton = _STRING.sub("", text).encode("utf-8", "surrogatepass")
    codes = np.frombuffer(skeleton, dtype=np.uint8)
    steps = ((codes == _OPEN) | (codes == _OPEN_OBJ)).astype(np.int64) - ((codes == _CLOSE) | (codes == _CLOSE_OBJ))
    return int(np.cumsum(steps).max(initial=0))


def _bad_string(value: Any) -> str | None:
    """The first string (value or key) in a parsed JSON document that holds a lone surrogate or
    a NUL character, else None (iterative: the document's depth is already bounded)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if _BAD_CHAR.search(item):
                return item
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return None


def check_json_body(raw: bytes, *, max_depth: int = MAX_JSON_DEPTH) -> None:
    """Refuse a request body that is not UTF-8, not JSON, nested deeper than ``max_depth``, or
    that holds a lone surrogate or NUL character in any string or key (InvalidParameterError
    naming ``body``). An empty body passes (the endpoint decides whether it needs one)."""
    if not raw:
        return
    try:
        text = raw.decode("utf-8")  # strict: also refuses UTF-8-encoded surrogates
    except UnicodeDecodeError as exc:
        raise InvalidParameterError("body", f"<invalid byte at offset {exc.start}>", "UTF-8 encoded JSON") from None
    depth = json_depth(text)
    if depth > max_depth:
        raise InvalidParameterError("body", f"<JSON nested {depth} levels>", f"JSON nested at most {max_depth} levels")
    try:
        document = json.loads(text)
    except RecursionError:  # (the depth check above makes this unreachable; kept as the backstop)
        raise InvalidParameterError("body", "<deeply nested JSON>", f"JSON nested at most {max_depth} levels") from None
    except ValueError as exc:
        raise InvalidParameterError(
            "body", printable(text, 40), f"valid JSON (the body is not valid JSON: {exc})"
        ) from None
    bad = _bad_string(document)
    if bad is not None:
        raise InvalidParameterError(
            "body", printable(bad, 40), "JSON whose strings are valid Unicode (no lone surrogate, no NUL character)"
        )


def check_int(name: str, raw: str | None, low: int, high: int, default: int | None = None) -> int:
    """The query parameter ``name`` as an integer in [low, high] (``default`` when absent)."""
    if raw is None:
        if default is None:
            raise InvalidParameterError(name, None, f"an integer from {low} to {high}")
        return default
    text = raw.strip()
    if not re.fullmatch(r"[+-]?[0-9]{1,30}", text) or not low <= int(text) <= high:
        raise InvalidParameterError(name, printable(raw, 40), f"an integer from {low} to {high}")
    return int(text)


def check_key_id(value: object) -> str:
    """A key id (16 lower-case hex digits), or InvalidParameterError naming ``key_id``."""
    if not isinstance(value, str) or not KEY_ID.fullmatch(value):
        raise InvalidParameterError(
            "key_id",
            printable(value, 40) if isinstance(value, str) else value,
            "a key id: 16 lower-case hex digits (see the key listing)",
        )
    return value


def printable(text: str, limit: int = 200) -> str:
    """``text`` cut to ``limit`` characters with control characters and lone surrogates escaped
    (``\\x00``, ``\\ud800``): safe to store in the audit log, to print and to encode as UTF-8."""
    cut = text[:limit]
    return _UNPRINTABLE.sub(lambda m: m.group().encode("unicode_escape", "backslashreplace").decode("ascii"), cut) + (
        "…" if len(text) > limit else ""
    )
