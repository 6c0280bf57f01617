"""Attacks that show why privacy is needed: linkage of anonymised releases, and reconstruction of
a secret column from noisy subset-sum answers (exhaustive, Dinur–Nissim, Diffix-style) — and
their failure against dpkit's Laplace curator under a budget."""

from dpkit.attacks.linkage import LinkageResult, linkage_attack
from dpkit.attacks.reconstruction import (
    Curator,
    DPCurator,
    IdentifierCondition,
    NaiveCurator,
    ReconstructionResult,
    StickyCurator,
    diffix_attack,
    dinur_nissim_attack,
    exhaustive_attack,
    split_epsilon,
)

__all__ = [
    "LinkageResult",
    "linkage_attack",
    "Curator",
    "NaiveCurator",
    "StickyCurator",
    "DPCurator",
    "IdentifierCondition",
    "ReconstructionResult",
    "split_epsilon",
    "exhaustive_attack",
    "dinur_nissim_attack",
    "diffix_attack",
]
