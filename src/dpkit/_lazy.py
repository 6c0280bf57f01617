"""Lazy re-exports for a package's ``__init__`` (PEP 562): a public name is imported from the
module that defines it on first access, so importing the package costs nothing heavy (the command
line's ``--help`` and ``import dpkit`` load no engine, pandas or FastAPI)."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping, Sequence

__all__ = ["lazy_exports"]


def lazy_exports(
    package: str, exports: Mapping[str, str], public: Sequence[str]
) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package``, whose public names are ``public`` and
    whose ``exports`` map each name to the module that defines it. A name resolved once is stored
    in the package, so later lookups do not come back here."""

    def __getattr__(name: str) -> object:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(public))

    return __getattr__, __dir__
