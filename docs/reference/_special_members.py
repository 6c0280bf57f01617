"""Griffe extension for the API reference: leave Python's special methods out of it.

The reference lists the names of each module's ``__all__`` (``filters: public`` in mkdocs.yml) and
their members. Griffe counts a class's special methods (``__post_init__``, ``__repr__``,
``__enter__``, scikit-learn's ``__sklearn_tags__``) as public, but a reader never calls them by name:
what they do (a frozen dataclass's checks, ``with`` support, cloning) is the class's documented
behaviour. ``__init__`` stays: ``merge_init_into_class`` shows its parameters as the class's
signature. Loaded by mkdocs.yml; not part of dpkit.
"""

from __future__ import annotations

from typing import Any

import griffe

#: Kept: the constructor, whose signature and docstring the class shows.
KEPT = frozenset({"__init__"})


class HideSpecialMembers(griffe.Extension):
    # Removed rather than marked private: a class shown under another module (``dpkit.Laplace``) is
    # an alias whose members are new aliases, which would not inherit a ``public = False``.
    def on_class_members(self, *, cls: griffe.Class, **kwargs: Any) -> None:
        special = [n for n in cls.members if n.startswith("__") and n.endswith("__") and n not in KEPT]
        for name in special:
            cls.del_member(name)
