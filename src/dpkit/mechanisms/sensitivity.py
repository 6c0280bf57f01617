"""Global sensitivities of the common queries, under each neighbour relation.

Sensitivity always comes from declared bounds, never from the data (Dwork & Roth 2014, Def. 3.1
and §3.3). ``add_remove``: one record is added or removed; ``replace``: one record changes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dpkit import _validate as v
from dpkit._validate import Neighbours

__all__ = ["Sensitivity", "count", "bounded_sum", "histogram", "counting_queries"]


@dataclass(frozen=True)
class Sensitivity:
    """ℓ1 and ℓ2 sensitivity of a query under one neighbour relation."""

    l1: float
    l2: float
    neighbours: Neighbours


def count(neighbours: Neighbours = "add_remove") -> Sensitivity:
    """A count of records (matching a predicate): changes by at most 1 under both relations."""
    return Sensitivity(1.0, 1.0, v.neighbours(neighbours))


def bounded_sum(lower: float, upper: float, neighbours: Neighbours = "add_remove") -> Sensitivity:
    """A sum of values clipped to [lower, upper].

    add/remove: one value in [lower, upper] appears or vanishes → max(|lower|, |upper|);
    replace: one value changes within the range → upper − lower.
    """
    lo, hi = v.bounds(lower, upper)
    s = max(abs(lo), abs(hi)) if v.neighbours(neighbours) == "add_remove" else hi - lo
    return Sensitivity(s, s, neighbours)


def histogram(neighbours: Neighbours = "add_remove") -> Sensitivity:
    """Counts over disjoint bins: one record touches one bin (add/remove: ℓ1 = 1) or moves
    between two bins (replace: ℓ1 = 2, ℓ2 = √2). Dwork & Roth 2014, §3.3, histogram queries."""
    if v.neighbours(neighbours) == "add_remove":
        return Sensitivity(1.0, 1.0, neighbours)
    return Sensitivity(2.0, math.sqrt(2.0), neighbours)


def counting_queries(k: int, neighbours: Neighbours = "add_remove") -> Sensitivity:
    """k arbitrary counting queries: one record can change each by 1 → ℓ1 = k, ℓ2 = √k
    (Dwork & Roth 2014, §3.3, counting queries)."""
    k = v.positive_int(k, "k")
    return Sensitivity(float(k), math.sqrt(k), v.neighbours(neighbours))
