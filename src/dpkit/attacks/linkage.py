"""Linkage attack on two k-anonymous releases (Ganta, Kasiviswanathan & Smith 2008,
"Composition attacks and auxiliary information in data privacy", KDD: the intersection attack).

Hospital A publishes a k-anonymous table; hospital B publishes its own.  Someone in both tables
lies in one equivalence class of each, so their sensitive value is in the *intersection* of the
two classes' sensitive values.  When that intersection holds a single value, the value is pinned
down although each release, alone, is k-anonymous: k-anonymity does not compose.

Matching of generalised quasi-identifier cells (``match``):

* ``"equality"``: the two strings are equal (both releases use the same generalisation scheme);
* ``"overlap"`` (default): the cells could describe the same person: closed numeric ranges
  ``"[lo-hi]"`` or ``"lo-hi"`` (and plain numbers) intersect; sets ``"{a,b}"`` share a value;
  masks such as ``"1901**"`` agree on every non-``*`` character; ``"*"`` matches everything;
  anything else must be equal.  Ranges are taken as closed, so ``"50-60"`` meets ``"60-70"``.

The targets are either the equivalence classes of ``released_a`` (the inference "anyone of this
class who is also in B has value v"), or, with ``known``, identified external records (a name
and the person's raw or generalised QI values, e.g. "Zhao Lina, 56, female, was at both").

>>> import pandas as pd
>>> a = pd.DataFrame({"age": ["50-60"] * 2, "dx": ["HIV", "gastritis"]})
>>> b = pd.DataFrame({"age": ["50-60"] * 2, "dx": ["HIV", "lupus"]})
>>> linkage_attack(a, b, ["age"], "dx").matches["value"].tolist()
['HIV']
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from dpkit.anonymity.kanonymity import _check_table
from dpkit.errors import InvalidParameterError

__all__ = ["LinkageResult", "linkage_attack"]

_NUM = r"-?\d+(?:\.\d+)?"
_RANGE = re.compile(rf"^\[?\s*({_NUM})\s*-\s*({_NUM})\s*\]?$")


def _parse(cell: object):
    """A cell as ("range", lo, hi), ("set", frozenset), ("mask", str), ("any",) or ("eq", str)."""
    if isinstance(cell, (int, float, np.integer, np.floating)) and not isinstance(cell, bool):
        return ("range", float(cell), float(cell))
    s = str(cell).strip()
    if s == "*":
        return ("any",)
    m = _RANGE.match(s)
    if m:
        return ("range", float(m.group(1)), float(m.group(2)))
    if re.fullmatch(_NUM, s):
        return ("range", float(s), float(s))
    if s.startswith("{") and s.endswith("}"):
        return ("set", frozenset(x.strip() for x in s[1:-1].split(",")))
    if "*" in s:
        return ("mask", s)
    return ("eq", s)


def _compatible(x, y) -> bool:
    if x[0] == "any" or y[0] == "any":
        return True
    if x[0] == "range" and y[0] == "range":
        return x[1] <= y[2] and y[1] <= x[2]
    if x[0] == "set" or y[0] == "set":
        sx = x[1] if x[0] == "set" else {x[1] if x[0] != "range" else None}
        sy = y[1] if y[0] == "set" else {y[1] if y[0] != "range" else None}
        if x[0] == "mask" or y[0] == "mask":
            mask, other = (x[1], sy) if x[0] == "mask" else (y[1], sx)
            return any(_mask_ok(mask, str(o)) for o in other if o is not None)
        return bool(set(sx) & set(sy) - {None})
    if x[0] == "mask" or y[0] == "mask":
        if x[0] == "range" or y[0] == "range":
            r, mk = (x, y[1]) if x[0] == "range" else (y, x[1])
            return r[1] == r[2] and _mask_ok(mk, _fmt(r[1]))
        return _mask_ok(x[1], y[1])
    if x[0] == "eq" and y[0] == "eq":
        return x[1] == y[1]
    return False


def _fmt(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else str(v)


def _mask_ok(a: str, b: str) -> bool:
    return len(a) == len(b) and all(p == q or p == "*" or q == "*" for p, q in zip(a, b, strict=True))


def _match_matrix(cells_x: pd.DataFrame, cells_y: pd.DataFrame, qi: list[str], mode: str):
    """Boolean (len(x), len(y)) matrix: rows of x compatible with rows of y on every QI."""
    out = np.ones((len(cells_x), len(cells_y)), dtype=bool)
    for q in qi:
        ux, cx = np.unique(cells_x[q].astype(str).to_numpy(), return_inverse=True)
        uy, cy = np.unique(cells_y[q].astype(str).to_numpy(), return_inverse=True)
        if mode == "equality":
            c = ux[:, None] == uy[None, :]
        else:
            px = [_parse(v) for v in ux]
            py = [_parse(v) for v in uy]
            c = np.array([[_compatible(a, b) for b in py] for a in px], dtype=bool).reshape(len(ux), len(uy))
        out &= c[cx][:, cy]
    return out


@dataclass(frozen=True)
class LinkageResult:
    """Outcome of :func:`linkage_attack`.

    ``matches``: one row per target (class of A, or known record) with its QI values (and
    identifier), ``candidates`` (sorted tuple of sensitive values consistent with both releases),
    ``value`` (the single candidate, or ``None``), ``rows_a`` and ``rows_b`` (rows of each
    release it could be).  ``fraction_reidentified``: share of targets whose value is pinned
    (weighted by ``rows_a`` when the targets are A's classes).
    """

    matches: pd.DataFrame
    fraction_reidentified: float

    @property
    def pinned(self) -> pd.DataFrame:
        """The targets whose sensitive value is pinned down to one value."""
        return self.matches[self.matches["value"].notna()]


def linkage_attack(
    released_a: pd.DataFrame,
    released_b: pd.DataFrame,
    quasi_identifiers: Sequence[str],
    sensitive: str,
    *,
    known: pd.DataFrame | None = None,
    identifier: str | None = None,
    match: str = "overlap",
) -> LinkageResult:
    """Join two releases on their (generalised) QIs and find pinned-down sensitive values.

    Assumes each target is in both releases (the attacker's side knowledge).
    """
    qi = _check_table(released_a, quasi_identifiers, extra=[sensitive])
    _check_table(released_b, qi, extra=[sensitive])
    if match not in ("overlap", "equality"):
        raise InvalidParameterError("match", match, "'overlap' or 'equality'")
    if sensitive in qi:
        raise InvalidParameterError("sensitive", sensitive, "a column that is not a QI")
    ga = released_a.groupby(qi, dropna=False, sort=True)[sensitive].agg([lambda s: frozenset(s.astype(str)), "size"])
    ga.columns = ["values", "rows"]
    gb = released_b.groupby(qi, dropna=False, sort=True)[sensitive].agg([lambda s: frozenset(s.astype(str)), "size"])
    gb.columns = ["values", "rows"]
    ca, cb = ga.index.to_frame(index=False), gb.index.to_frame(index=False)

    if known is None:
        targets = ca
        in_a = np.eye(len(ca), dtype=bool)
    else:
        extra = [identifier] if identifier is not None else []
        _check_table(known, qi, extra=extra)
        targets = known[extra + qi].reset_index(drop=True)
        in_a = _match_matrix(targets, ca, qi, match)
    in_b = _match_matrix(targets if known is not None else ca, cb, qi, match)

    vals_a, vals_b = ga["values"].to_numpy(), gb["values"].to_numpy()
    rows_a, rows_b = ga["rows"].to_numpy(), gb["rows"].to_numpy()
    cands, value, na, nb = [], [], [], []
    for t in range(len(targets)):
        ia, ib = np.flatnonzero(in_a[t]), np.flatnonzero(in_b[t])
        sa = frozenset().union(*vals_a[ia]) if len(ia) else frozenset()
        sb = frozenset().union(*vals_b[ib]) if len(ib) else frozenset()
        c = tuple(sorted(sa & sb))
        cands.append(c)
        value.append(c[0] if len(c) == 1 else None)
        na.append(int(rows_a[ia].sum()))
        nb.append(int(rows_b[ib].sum()))
    matches = targets.copy()
    matches["candidates"] = cands
    matches["value"] = pd.Series(value, dtype=object)
    matches["rows_a"] = na
    matches["rows_b"] = nb
    pinned = matches["value"].notna().to_numpy()
    if len(matches) == 0:
        frac = 0.0
    elif known is None:
        frac = float(rows_a[pinned].sum() / rows_a.sum())
    else:
        frac = float(pinned.mean())
    return LinkageResult(matches=matches, fraction_reidentified=frac)
