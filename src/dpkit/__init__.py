"""dpkit: differential privacy you can audit.

>>> import dpkit as dp
>>> dp.Laplace(epsilon=1.0, sensitivity=1.0).scale
1.0
"""

from dpkit import accounting, analytics, anonymity, attacks, audit, errors, ledger, mechanisms, ml, noise
from dpkit.analytics import Session
from dpkit.accounting import BasicAccountant, PLDAccountant, RDPAccountant, ZCDPAccountant
from dpkit.budget import Budget
from dpkit.ledger import open_ledger
from dpkit.errors import (
    AuthError,
    BudgetExceededError,
    DPError,
    InvalidDataError,
    QueryFailedError,
    InvalidParameterError,
    LimitExceededError,
    LedgerError,
)
from dpkit.mechanisms import (
    AboveThreshold,
    BoundedMean,
    CandidateQuantile,
    Median,
    NumericSparse,
    PTRMean,
    PTRMedian,
    Quantile,
    Quantiles,
    SampleAndAggregate,
    SmoothSensitivityMedian,
    Sparse,
    Exponential,
    ForcedResponse,
    Gaussian,
    Geometric,
    Laplace,
    RandomizedResponse,
    ReportNoisyMax,
    sensitivity,
)

__version__ = "0.1.0"


def __getattr__(name: str) -> object:
    # dpkit.torch needs the optional torch extra: import it only when asked for (dp.torch.make_private).
    if name == "torch":
        import importlib

        return importlib.import_module("dpkit.torch")
    raise AttributeError(f"module 'dpkit' has no attribute {name!r}")


__all__ = [
    "accounting",
    "analytics",
    "anonymity",
    "attacks",
    "ml",
    "Session",
    "audit",
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
