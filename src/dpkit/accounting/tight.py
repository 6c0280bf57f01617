"""The tightest sound ε for an event: the smaller of the PLD and RDP bounds, and which it was.

Both accountants report upper bounds on the true ε, so their minimum is one too. A coarse PLD
grid can exceed RDP at small ε; taking the minimum means the tight answer is never worse than
RDP's (issue: report the smaller of the two sound bounds, and say which).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dpkit import _validate as v
from dpkit._validate import Neighbours
from dpkit.accounting.events import DPEvent
from dpkit.accounting.pld import PLDAccountant
from dpkit.accounting.rdp import RDPAccountant
from dpkit.errors import DPError, InvalidParameterError

__all__ = ["TightEpsilon", "tight_epsilon"]


@dataclass(frozen=True)
class TightEpsilon:
    epsilon: float
    accountant: str  # "pld" or "rdp": the one that gave the smaller bound
    candidates: dict[str, float]  # every sound bound computed


def tight_epsilon(event: DPEvent, delta: float, *, neighbours: Neighbours = "add_remove") -> TightEpsilon:
    """min(PLD ε, RDP ε) at ``delta`` for ``event``, naming the accountant that achieved it.

    >>> from dpkit.accounting import dp_sgd_event
    >>> t = tight_epsilon(dp_sgd_event(1.1, 256 / 60000, 23_500), 1e-5)
    >>> t.accountant, round(t.epsilon, 3)
    ('pld', 3.164)
    """
    delta = v.delta(delta)
    candidates: dict[str, float] = {}
    for name, factory in (("pld", PLDAccountant), ("rdp", RDPAccountant)):
        acc = factory(neighbours=neighbours)
        if not acc.supports(event):
            continue
        try:
            eps = acc.compose(event).get_epsilon(delta)
        except DPError:
            continue  # e.g. δ below the PLD's numerical floor: the other bound still stands
        if math.isfinite(eps):
            candidates[name] = eps
    if not candidates:
        raise InvalidParameterError("event", event, "an event the PLD or RDP accountant can bound at this δ")
    best = min(candidates, key=candidates.__getitem__)
    return TightEpsilon(candidates[best], best, candidates)
