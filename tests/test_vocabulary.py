"""One public vocabulary (docs/glossary.md): every exported signature spells a concept one way.

Walks ``dpkit.__all__`` and the ``__all__`` of every public subpackage (and of the public modules
they export), reads ``inspect.signature`` of each class, its public methods and each function, and
fails on a spelling the glossary rules out, on a ``**`` catch-all (it would hide, or quietly
accept, an old spelling), on a mechanism without a neighbouring relation, on a mechanism method
named ``run``, and on two public classes with the same ``__name__``.

dpkit keeps no deprecated spellings: an old keyword is a ``TypeError`` as Python raises for any
unknown keyword. Offenders in code another part of the project owns are listed in ``ALLOWED`` with
their owner, one entry each, to be removed as they are fixed.
"""

from __future__ import annotations

import importlib
import inspect
import types
import warnings
from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Any

import pytest

#: Parameter names the glossary replaces, with the spelling to use instead.
BANNED = {
    "eps": "epsilon",
    "target_epsilon": "epsilon",
    "target_delta": "delta",
    "y_bounds": "bounds",
    "clip": "max_grad_norm",
    "clip_norm": "max_grad_norm",
    "client_rate": "sample_rate",
    "sampling_rate": "sample_rate",
    "neighbors": "neighbours",
    "random_state": "rng",
}

#: Remaining offenders in code owned elsewhere: (kind, where, detail) → owner. Remove an entry
#: when its owner fixes it (an entry that no longer matches anything is reported as a warning).
ALLOWED: dict[tuple[str, str, str], str] = {
    # Neighbours typed ``str``: type them ``Neighbours``.
    # **kwargs hides the parameters (and so the vocabulary) from inspection. Not offenders
    # either: these constructors forward every keyword to Session(...), whose signature is read.
    ("kwargs", "dpkit.analytics.session.Session.from_csv", "kwargs"): "analytics",
    ("kwargs", "dpkit.analytics.session.Session.from_parquet", "kwargs"): "analytics",
    ("kwargs", "dpkit.analytics.session.Session.from_duckdb", "kwargs"): "analytics",
    # Not offenders: the keywords are the fields of a class whose own signature is inspected
    # (ServerConfig for create_app's overrides, AuditEntry for its constructor helper).
    ("kwargs", "dpkit.server.app.create_app", "settings"): "server",
    ("kwargs", "dpkit.server.audit.AuditEntry.new", "fields"): "server",
}

PACKAGES = [
    "dpkit",
    "dpkit.accounting",
    "dpkit.analytics",
    "dpkit.anonymity",
    "dpkit.attacks",
    "dpkit.audit",
    "dpkit.client",
    "dpkit.ledger",
    "dpkit.mechanisms",
    "dpkit.ml",
    "dpkit.noise",
    "dpkit.server",
    "dpkit.torch",
]


def _modules() -> list[types.ModuleType]:
    out: list[types.ModuleType] = []
    seen: set[str] = set()
    todo = list(PACKAGES)
    while todo:
        name = todo.pop(0)
        if name in seen:
            continue
        seen.add(name)
        try:
            mod = importlib.import_module(name)
        except ImportError:  # an optional extra (torch) that is not installed
            continue
        out.append(mod)
        for attr in getattr(mod, "__all__", ()):
            value = getattr(mod, attr, None)
            if isinstance(value, types.ModuleType) and value.__name__.startswith("dpkit."):
                todo.append(value.__name__)
    return out


def _exported() -> Iterator[tuple[str, Any]]:
    """(namespace.name, object) for every name in every public ``__all__``."""
    for mod in _modules():
        for attr in getattr(mod, "__all__", ()):
            value = getattr(mod, attr, None)
            if value is not None and not isinstance(value, types.ModuleType):
                yield f"{mod.__name__}.{attr}", value


def _qualname(obj: Any) -> str:
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', repr(obj))}"


def _signatures() -> Iterator[tuple[str, inspect.Signature, Any]]:
    """(qualified name, signature, owner class or None) of every public callable, once each."""
    seen: set[int] = set()
    for _, obj in _exported():
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if inspect.isclass(obj):
            if issubclass(obj, BaseException):
                continue
            # A Protocol or abstract base has no constructor of its own to read; its methods are.
            if not getattr(obj, "_is_protocol", False) and not inspect.isabstract(obj):
                signature = _signature(obj)
                if signature is not None:
                    yield _qualname(obj), signature, obj
            for attr, member in vars(obj).items():
                if attr.startswith("_"):
                    continue
                func = member.__func__ if isinstance(member, (classmethod, staticmethod)) else member
                if inspect.isfunction(func):
                    yield f"{_qualname(obj)}.{attr}", inspect.signature(func), obj
        elif inspect.isfunction(obj) or inspect.isbuiltin(obj):
            signature = _signature(obj)
            if signature is not None:
                yield _qualname(obj), signature, None


def _signature(obj: Any) -> inspect.Signature | None:
    """The signature, or None for a callable whose signature Python cannot read (some builtins)."""
    try:
        return inspect.signature(obj)
    except (TypeError, ValueError):
        return None


def _is_estimator(cls: Any) -> bool:
    try:
        from sklearn.base import BaseEstimator
    except ImportError:  # pragma: no cover - scikit-learn is a dependency
        return False
    return inspect.isclass(cls) and issubclass(cls, BaseEstimator)


def _mechanism_classes() -> list[type]:
    """Classes exported from dpkit.mechanisms that release values (not results or plans)."""
    mech = importlib.import_module("dpkit.mechanisms")
    out = []
    for attr in mech.__all__:
        value = getattr(mech, attr)
        if inspect.isclass(value) and callable(getattr(value, "release", None)):
            out.append(value)
    return out


def _problems() -> set[tuple[str, str, str]]:
    found: set[tuple[str, str, str]] = set()
    for where, sig, owner in _signatures():
        params = sig.parameters
        for name, p in params.items():
            if name in BANNED:
                found.add(("banned", where, name))
            if p.kind is inspect.Parameter.VAR_KEYWORD:
                found.add(("kwargs", where, name))
            if name == "noise" and p.annotation in (float, int, "float", "int"):
                found.add(("noise amount", where, name))
            if name == "neighbours" and p.annotation in (str, "str"):
                found.add(("untyped neighbours", where, name))
        if ("lower" in params) != ("upper" in params):
            found.add(("lone bound", where, "lower" if "lower" in params else "upper"))
        if owner is not None and where == _qualname(owner):
            if _is_estimator(owner) and ("lower" in params or "upper" in params):
                found.add(("estimator bounds", where, "lower/upper"))
            if owner in _mechanism_classes() and "bounds" in params:
                found.add(("mechanism bounds", where, "bounds"))
    for cls in _mechanism_classes():
        if "neighbours" not in inspect.signature(cls).parameters and not hasattr(cls, "neighbours"):
            found.add(("no neighbours", _qualname(cls), "neighbours"))
        for attr in ("run", "run_batch"):
            if hasattr(cls, attr):
                found.add(("run", _qualname(cls), attr))
    by_name: dict[str, set[int]] = defaultdict(set)
    objects: dict[int, Any] = {}
    for _, obj in _exported():
        if inspect.isclass(obj):
            by_name[obj.__name__].add(id(obj))
            objects[id(obj)] = obj
    for name, ids in by_name.items():
        if len(ids) > 1:
            for i in ids:
                qual = _qualname(objects[i])
                if not qual.startswith("dpkit.mechanisms."):
                    found.add(("duplicate", name, qual))
    return found


def test_public_signatures_use_the_glossary() -> None:
    problems = _problems()
    unexpected = sorted(p for p in problems if p not in ALLOWED)
    assert not unexpected, "spellings the glossary (docs/glossary.md) rules out:\n" + "\n".join(
        f"  {kind}: {where} ({detail})" for kind, where, detail in unexpected
    )


def test_allow_list_has_no_stale_entries() -> None:
    # An entry whose offender is gone should be removed, so that the list only shrinks. A warning,
    # not a failure: owners fix their entries independently of this file.
    stale = sorted(set(ALLOWED) - _problems())
    if stale:
        warnings.warn("fixed, remove from ALLOWED: " + ", ".join(map(str, stale)), UserWarning, stacklevel=1)


def test_gaussian_from_noise_multiplier_draws_exactly_that_multiplier() -> None:
    from dpkit.accounting.analytic_gaussian import gaussian_delta
    from dpkit.mechanisms import Gaussian
    from dpkit.mechanisms.gaussian import gaussian_noise_plan
    from dpkit.noise.lattice import DELTA_MARGIN

    mech = Gaussian.from_noise_multiplier(1.5, delta=1e-6, sensitivity=2.0, neighbours="replace")
    assert mech.event.noise_multiplier == 1.5 and mech.event.neighbours == "replace"
    assert mech.sigma == 3.0
    assert mech.noise_plan(4) == gaussian_noise_plan(1.5, 2.0, 4)
    # ε is the smallest on the exact curve at δ·DELTA_MARGIN: valid there, and tight to 1e-9.
    assert gaussian_delta(mech.epsilon, 1.5) <= 1e-6 * DELTA_MARGIN
    assert gaussian_delta(mech.epsilon * (1 - 1e-9), 1.5) > 1e-6 * DELTA_MARGIN
    # A mechanism calibrated to that ε draws (nearly) the same multiplier.
    assert Gaussian(epsilon=mech.epsilon, delta=1e-6).event.noise_multiplier == pytest.approx(1.5, rel=1e-9)


@pytest.mark.parametrize(
    "build, refused",
    [
        (lambda nb: __import__("dpkit").BoundedMean(epsilon=1.0, lower=0.0, upper=1.0, neighbours=nb), "replace"),
        (lambda nb: __import__("dpkit").RandomizedResponse(epsilon=1.0, neighbours=nb), "add_remove"),
        (lambda nb: __import__("dpkit").ForcedResponse(neighbours=nb), "add_remove"),
        (
            lambda nb: __import__("dpkit").SmoothSensitivityMedian(
                epsilon=1.0, lower=0.0, upper=1.0, noise="cauchy", neighbours=nb
            ),
            "add_remove",
        ),
    ],
)
def test_single_relation_mechanisms_record_it_and_refuse_the_other(build: Callable[[str], Any], refused: str) -> None:
    from dpkit.errors import InvalidParameterError

    supported = "add_remove" if refused == "replace" else "replace"
    event = build(supported).event
    parts = getattr(event, "events", (event,))
    assert all(e.neighbours == supported for e in parts)
    with pytest.raises(InvalidParameterError, match="neighbours"):
        build(refused)
    with pytest.raises(InvalidParameterError, match="neighbours"):
        build("both")
