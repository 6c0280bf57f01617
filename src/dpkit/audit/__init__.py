"""Empirical audits: statistical evidence that a mechanism does (not) keep its privacy promise.

:func:`estimate_epsilon` turns samples of a black-box mechanism on two neighbouring inputs into a
lower bound on its ε that holds with a stated confidence. It can prove a violation, never privacy.
"""

from dpkit.audit.epsilon import AuditResult, estimate_epsilon

__all__ = ["AuditResult", "estimate_epsilon"]
