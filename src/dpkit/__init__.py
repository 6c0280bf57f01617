"""dpkit: differential privacy you can audit.

>>> import dpkit as dp
>>> dp.Laplace(epsilon=1.0, sensitivity=1.0).scale
1.0

``import dpkit`` loads no subpackage: every public name is resolved on first use (PEP 562 module
``__getattr__``, https://peps.python.org/pep-0562/), so a script that only draws noise does not pay
for pandas, DuckDB or scikit-learn, and the core installs without them. ``from dpkit import X`` and
``dp.X`` give the same objects as an eager import would; each is cached in this module's namespace
after its first lookup.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
from typing import TYPE_CHECKING

__version__ = "0.1.0"

# The library convention: dpkit's loggers (``dpkit.curator`` above all, whose records can quote a
# value of the data in an engine's error text) print nothing unless the program asked for them.
# Without a handler in the hierarchy, Python's last-resort handler would print their warnings on
# the stderr of whoever runs a query — an analyst's script, ``dpkit query``. The curator's own
# commands (``dpkit serve``, ``dpkit admin``) add a handler: dpkit.server.curator_log.
logging.getLogger("dpkit").addHandler(logging.NullHandler())

# Public name -> the module that defines it. Subpackages are listed as themselves; ``sensitivity`` is
# the ``dpkit.mechanisms.sensitivity`` module, re-exported here under its short name.
_EXPORTS: dict[str, str] = {
    # subpackages
    "accounting": "dpkit.accounting",
    "analytics": "dpkit.analytics",
    "anonymity": "dpkit.anonymity",
    "attacks": "dpkit.attacks",
    "audit": "dpkit.audit",
    "client": "dpkit.client",
    "errors": "dpkit.errors",
    "ledger": "dpkit.ledger",
    "mechanisms": "dpkit.mechanisms",
    "ml": "dpkit.ml",
    "noise": "dpkit.noise",
    # analytics, budget and ledger
    "Session": "dpkit.analytics",
    "Budget": "dpkit.budget",
    "open_ledger": "dpkit.ledger",
    # accountants
    "BasicAccountant": "dpkit.accounting",
    "RDPAccountant": "dpkit.accounting",
    "ZCDPAccountant": "dpkit.accounting",
    "PLDAccountant": "dpkit.accounting",
    # mechanisms
    "sensitivity": "dpkit.mechanisms",
    "Laplace": "dpkit.mechanisms",
    "Geometric": "dpkit.mechanisms",
    "Gaussian": "dpkit.mechanisms",
    "RandomizedResponse": "dpkit.mechanisms",
    "ForcedResponse": "dpkit.mechanisms",
    "Exponential": "dpkit.mechanisms",
    "ReportNoisyMax": "dpkit.mechanisms",
    "BoundedMean": "dpkit.mechanisms",
    "AboveThreshold": "dpkit.mechanisms",
    "Sparse": "dpkit.mechanisms",
    "NumericSparse": "dpkit.mechanisms",
    "PTRMean": "dpkit.mechanisms",
    "PTRMedian": "dpkit.mechanisms",
    "Quantile": "dpkit.mechanisms",
    "Quantiles": "dpkit.mechanisms",
    "Median": "dpkit.mechanisms",
    "CandidateQuantile": "dpkit.mechanisms",
    "SampleAndAggregate": "dpkit.mechanisms",
    "SmoothSensitivityMedian": "dpkit.mechanisms",
    # errors
    "DPError": "dpkit.errors",
    "InvalidParameterError": "dpkit.errors",
    "LimitExceededError": "dpkit.errors",
    "InvalidDataError": "dpkit.errors",
    "QueryFailedError": "dpkit.errors",
    "BudgetExceededError": "dpkit.errors",
    "LedgerError": "dpkit.errors",
    "AuthError": "dpkit.errors",
}

__all__ = [
    "accounting",
    "analytics",
    "anonymity",
    "attacks",
    "ml",
    "Session",
    "audit",
    "client",
    "ledger",
    "Budget",
    "open_ledger",
    "BasicAccountant",
    "RDPAccountant",
    "ZCDPAccountant",
    "PLDAccountant",
    "errors",
    "mechanisms",
    "noise",
    "sensitivity",
    "Laplace",
    "Geometric",
    "Gaussian",
    "RandomizedResponse",
    "ForcedResponse",
    "Exponential",
    "ReportNoisyMax",
    "BoundedMean",
    "AboveThreshold",
    "Sparse",
    "NumericSparse",
    "PTRMean",
    "PTRMedian",
    "Quantile",
    "Quantiles",
    "Median",
    "CandidateQuantile",
    "SampleAndAggregate",
    "SmoothSensitivityMedian",
    "DPError",
    "InvalidParameterError",
    "LimitExceededError",
    "InvalidDataError",
    "QueryFailedError",
    "BudgetExceededError",
    "LedgerError",
    "AuthError",
]


#: Top-level package of an optional dependency -> the extra that installs it, for the hint given
#: when a lazily imported name needs a package this installation lacks.
_EXTRA_OF: dict[str, str] = {
    "pandas": "analytics",
    "duckdb": "analytics",
    "sqlglot": "analytics",
    "sklearn": "ml",
    "torch": "torch",
    "pyspark": "spark",
    "psycopg": "postgres",
    "fastapi": "server",
    "uvicorn": "server",
    "typer": "cli",
    "rich": "cli",
    "matplotlib": "cli",
}


def _import(module: str, name: str, attribute: str | None = None) -> object:
    """``module`` (or its ``attribute``: a lazy subpackage imports what defines it only then), with
    the extra to install when an optional dependency is missing."""
    try:
        loaded = importlib.import_module(module)
        return loaded if attribute is None else getattr(loaded, attribute)
    except ModuleNotFoundError as exc:
        extra = _EXTRA_OF.get((exc.name or "").partition(".")[0])
        if extra is None:
            raise
        raise ModuleNotFoundError(
            f"dpkit.{name} needs {exc.name!r}, which is not installed: pip install 'dpkit[{extra}]'", name=exc.name
        ) from exc


def __getattr__(name: str) -> object:
    """Resolve a public name, or any ``dpkit.<submodule>`` (e.g. ``dp.torch``, ``dp.budget``), on
    first access. Names that are neither raise the usual ``AttributeError``."""
    target = _EXPORTS.get(name)
    if target is not None:
        value = _import(target, name, None if target == f"{__name__}.{name}" else name)
        globals()[name] = value
        return value
    # Before this module became lazy, importing it imported every subpackage, so ``dp.budget`` and
    # the like worked as attributes; a submodule that exists is still reachable that way. Dunder
    # lookups (``__path__``, ``__wrapped__``, ...) made by tools must not trigger imports.
    if not name.startswith("__") and importlib.util.find_spec(f"{__name__}.{name}") is not None:
        return _import(f"{__name__}.{name}", name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


if TYPE_CHECKING:  # static checkers and IDEs see the eager imports; the runtime does not run them
    from dpkit import accounting, analytics, anonymity, attacks, audit, client, errors, ledger, mechanisms, ml, noise
    from dpkit.accounting import BasicAccountant, PLDAccountant, RDPAccountant, ZCDPAccountant
    from dpkit.analytics import Session
    from dpkit.budget import Budget
    from dpkit.errors import (
        AuthError,
        BudgetExceededError,
        DPError,
        InvalidDataError,
        InvalidParameterError,
        LedgerError,
        LimitExceededError,
        QueryFailedError,
    )
    from dpkit.ledger import open_ledger
    from dpkit.mechanisms import (
        AboveThreshold,
        BoundedMean,
        CandidateQuantile,
        Exponential,
        ForcedResponse,
        Gaussian,
        Geometric,
        Laplace,
        Median,
        NumericSparse,
        PTRMean,
        PTRMedian,
        Quantile,
        Quantiles,
        RandomizedResponse,
        ReportNoisyMax,
        SampleAndAggregate,
        SmoothSensitivityMedian,
        Sparse,
        sensitivity,
    )
