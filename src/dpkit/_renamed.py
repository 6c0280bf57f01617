"""Keyword arguments renamed to the project's vocabulary (``docs/glossary.md``), still accepted
under their old names with a :class:`DeprecationWarning`.

A deprecated name never appears in a public signature (the vocabulary test reads signatures):
callers collect it with ``**renamed`` and hand it to :func:`take_renamed`, which returns the value
under the new name and the name the caller actually used, so that an error about the value still
names the argument the caller wrote.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

__all__ = ["take_renamed", "MISSING"]


class _Missing:
    def __repr__(self) -> str:
        return "MISSING"


#: The default of a parameter that has an old name: tells "not given" from an explicit None.
MISSING: Any = _Missing()


def take_renamed(
    owner: str,
    renamed: dict[str, Any],
    aliases: Mapping[str, str],
    values: dict[str, Any],
    *,
    stacklevel: int = 3,
) -> dict[str, str]:
    """Move each old keyword in ``renamed`` to its new name in ``values``; return new → name used.

    ``aliases`` maps old → new names. An old name given together with its new name is refused,
    as Python refuses a keyword given twice; an unknown keyword is refused as Python refuses it
    (a ``TypeError`` naming ``owner``). ``values`` holds the new names' values (``MISSING`` when
    not given) and is updated in place.
    """
    used = {new: new for new in aliases.values()}
    for old, value in renamed.items():
        new = aliases.get(old)
        if new is None:
            raise TypeError(f"{owner}() got an unexpected keyword argument {old!r}")
        if values.get(new, MISSING) is not MISSING:
            raise TypeError(f"{owner}() got both {new!r} and its deprecated name {old!r}")
        warnings.warn(f"{owner}(): {old}= is deprecated; use {new}=", DeprecationWarning, stacklevel=stacklevel)
        values[new] = value
        used[new] = old
    return used
