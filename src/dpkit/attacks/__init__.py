"""Attacks that show what syntactic anonymisation fails to protect."""

from dpkit.attacks.linkage import LinkageResult, linkage_attack

__all__ = ["LinkageResult", "linkage_attack"]
