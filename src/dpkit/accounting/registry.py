"""Accountants by name: the one map from ``"basic"``, ``"rdp"``, ``"zcdp"`` and ``"pld"`` to the
accountant classes, and :func:`resolve_accountant`, which turns what a caller passes as
``accountant=`` (a name, a class or a factory) into a factory of *fresh* accountants.

Everything that lets a user pick an accountant (the in-memory budget, noise calibration, the
``dpkit account`` report, private machine learning) goes through this module, so a name means the
same accountant everywhere and an unknown name is refused with the same message everywhere.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from types import MappingProxyType

from dpkit import _validate as v
from dpkit._validate import Neighbours
from dpkit.accounting.accountant import Accountant
from dpkit.accounting.composition import BasicAccountant
from dpkit.accounting.pld import PLDAccountant
from dpkit.accounting.rdp import RDPAccountant
from dpkit.accounting.zcdp import ZCDPAccountant
from dpkit.errors import InvalidParameterError

__all__ = ["ACCOUNTANTS", "ACCEPTED", "resolve_accountant"]

#: Registry name → accountant class (read-only).
ACCOUNTANTS: Mapping[str, type[Accountant]] = MappingProxyType(
    {
        "basic": BasicAccountant,
        "rdp": RDPAccountant,
        "zcdp": ZCDPAccountant,
        "pld": PLDAccountant,
    }
)

#: What ``accountant=`` accepts, as an :class:`~dpkit.errors.InvalidParameterError` states it.
ACCEPTED = "'basic', 'rdp', 'zcdp' or 'pld', an Accountant subclass, or a factory"


def _takes_neighbours(cls: type) -> bool:
    try:
        return "neighbours" in inspect.signature(cls).parameters
    except (TypeError, ValueError):  # pragma: no cover - builtins without a signature
        return False


def resolve_accountant(
    spec: object, *, parameter: str = "accountant", neighbours: Neighbours | None = None
) -> Callable[[], Accountant]:
    """A zero-argument factory of fresh accountants for ``spec``.

    ``spec`` is a registry name (a key of :data:`ACCOUNTANTS`), an :class:`Accountant` subclass,
    or a zero-argument factory (e.g. a ``functools.partial``), returned unchanged. For a name or a
    class, ``neighbours`` (when given) is bound if the class takes it, so every accountant the
    factory builds uses that neighbouring relation. Nothing is constructed here: a factory's
    errors surface when the caller first calls it.

    Raises :class:`~dpkit.errors.InvalidParameterError` naming ``parameter`` for an unknown name,
    an accountant *instance* (it carries its events with it) or anything else not callable.

    >>> resolve_accountant("rdp")().get_epsilon(1e-5)
    0.0
    >>> try:
    ...     resolve_accountant("laplace")
    ... except InvalidParameterError as exc:
    ...     print(exc.accepted)
    'basic', 'rdp', 'zcdp' or 'pld', an Accountant subclass, or a factory
    """
    if neighbours is not None:
        neighbours = v.neighbours(neighbours)
    cls: type | None = None
    if isinstance(spec, str):
        cls = ACCOUNTANTS.get(spec)
        if cls is None:
            raise InvalidParameterError(parameter, spec, ACCEPTED)
    elif isinstance(spec, type):
        if not issubclass(spec, Accountant):
            raise InvalidParameterError(parameter, spec, ACCEPTED)
        cls = spec
    elif isinstance(spec, Accountant) or not callable(spec):
        raise InvalidParameterError(parameter, spec, ACCEPTED)
    else:
        return spec  # a factory: the caller's own zero-argument callable
    if neighbours is not None and _takes_neighbours(cls):
        return functools.partial(cls, neighbours=neighbours)  # type: ignore[call-arg]
    return cls
