"""Empirical audits: statistical evidence that a mechanism does (not) keep its privacy promise.

:func:`estimate_epsilon` turns samples of a black-box mechanism on two neighbouring inputs into a
lower bound on its ε that holds with a stated confidence. It can prove a violation, never privacy.
:func:`loss_threshold_attack` measures membership inference against a trained model;
:func:`canary_audit` bounds the ε of a training procedure from many runs with and without a canary.
"""

from dpkit.audit.canary import CanaryAuditResult, canary_audit, insert_canary
from dpkit.audit.epsilon import AuditResult, estimate_epsilon
from dpkit.audit.membership import (
    MembershipAttackResult,
    epsilon_from_tpr_fpr,
    loss_threshold_attack,
    per_example_losses,
)

__all__ = [
    "AuditResult",
    "estimate_epsilon",
    "MembershipAttackResult",
    "loss_threshold_attack",
    "epsilon_from_tpr_fpr",
    "per_example_losses",
    "CanaryAuditResult",
    "canary_audit",
    "insert_canary",
]
