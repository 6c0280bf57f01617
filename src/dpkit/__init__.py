"""dpkit: differential privacy you can audit."""

from dpkit import errors, noise
from dpkit.errors import (
    AuthError,
    BudgetExceededError,
    DPError,
    InvalidDataError,
    InvalidParameterError,
    LedgerError,
)

__version__ = "0.1.0"

__all__ = [
    "errors",
    "noise",
    "DPError",
    "InvalidParameterError",
    "InvalidDataError",
    "BudgetExceededError",
    "LedgerError",
    "AuthError",
]
