"""Syntactic anonymity (k-anonymity, l-diversity, Mondrian) — not differential privacy."""

from dpkit.anonymity.kanonymity import (
    AnonymityReport,
    anonymity_report,
    equivalence_classes,
    k_anonymity,
    l_diversity,
)
from dpkit.anonymity.mondrian import MondrianReport, generalise

__all__ = [
    "AnonymityReport",
    "MondrianReport",
    "anonymity_report",
    "equivalence_classes",
    "generalise",
    "k_anonymity",
    "l_diversity",
]
