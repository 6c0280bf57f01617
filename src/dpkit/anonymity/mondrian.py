"""Mondrian multidimensional k-anonymisation (LeFevre, DeWitt and Ramakrishnan, ICDE 2006).

Strict top-down partitioning: a partition is split on the quasi-identifier (QI) with the widest
*normalised* range, at its median, and only when both halves keep at least ``k`` rows; QIs are
tried from widest to narrowest and a partition that admits no allowable cut becomes an
equivalence class.  Each class is then generalised:

* numeric QIs to the closed range ``"[lo-hi]"`` of the values in the class;
* categorical QIs, with a hierarchy (``dict`` value -> parent, climbed level by level), to the
  lowest ancestor common to every value in the class (``"*"`` when none is common); without a
  hierarchy to the set ``"{a,b}"`` of the values present (a single value stays itself, the whole
  domain becomes ``"*"``).  Categories are ordered so that every subtree of the hierarchy is a
  contiguous run, and the median cut is taken in that order.

With ``suppress = s > 0`` a cut whose smaller side has fewer than ``k`` rows is also accepted
when that side can be removed (suppressed) without removing more than ``floor(s * n)`` rows in
all; cuts are tried depth first, so the budget goes to the first outliers met.

The recursion runs on numpy index arrays with an explicit stack: work per level is vectorised and
there are O(n / k) partitions, so the whole pass is O(n log n) numpy work.

Information loss: the normalised certainty penalty (NCP, Xu et al. 2006) of a cell is the
generalised width over the domain width (numeric), or (leaves covered - 1) / (domain size - 1)
(categorical); ``ncp`` is its mean over released rows and QIs, with suppressed rows counted as
fully generalised (1).  The discernibility metric (Bayardo and Agrawal 2005) is the sum of squared
class sizes plus ``n`` for every suppressed row.

k-anonymity is not differential privacy: see :mod:`dpkit.attacks.linkage`.

>>> import pandas as pd
>>> t = pd.DataFrame({"age": [21, 22, 35, 36], "zip": ["a", "a", "b", "b"]})
>>> out, rep = generalise(t, ["age", "zip"], k=2)
>>> out["age"].tolist(), rep.k_achieved
(['[21-22]', '[21-22]', '[35-36]', '[35-36]'], 2)
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

import numpy as np
import pandas as pd

from dpkit.anonymity.kanonymity import _check_table
from dpkit.errors import InvalidDataError, InvalidParameterError

__all__ = ["MondrianReport", "generalise"]


@dataclass(frozen=True)
class MondrianReport:
    """What :func:`generalise` did and what it cost in information."""

    k: int
    k_achieved: int
    n_rows: int
    n_released: int
    n_suppressed: int
    n_classes: int
    ncp: float
    ncp_per_qi: Mapping[str, float] = field(repr=False)
    discernibility: int


def _fmt(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else repr(float(x))


class _Categorical:
    """A categorical QI: ordered domain, optional hierarchy, and cell generalisation."""

    def __init__(self, name: str, values: pd.Series, hierarchy: Mapping | None) -> None:
        domain = pd.unique(values)
        self.hierarchy = hierarchy
        chains: dict[object, tuple[object, ...]]
        if hierarchy is None:
            chains = {v: (v,) for v in domain}
            order = sorted(domain, key=str)
        else:
            if not isinstance(hierarchy, Mapping):
                raise InvalidParameterError(
                    f"hierarchies[{name!r}]", hierarchy, "a dict mapping each value to its parent"
                )
            chains = {}
            for v in domain:
                chain = [v]
                while chain[-1] in hierarchy:
                    chain.append(hierarchy[chain[-1]])
                    if len(chain) > len(hierarchy) + 1:
                        raise InvalidParameterError(
                            f"hierarchies[{name!r}]",
                            "(cycle)",
                            "a dict without cycles",
                            f"Climbing from {v!r} never reaches a root.",
                        )
                chains[v] = tuple(chain)
            order = sorted(domain, key=lambda v: tuple(map(str, reversed(chains[v]))))
        self.order = list(order)
        self.chains = [chains[v] for v in self.order]
        self.size = len(self.order)
        # leaves below every node, for the NCP of a generalised cell
        self.leaves: dict = {}
        for path in self.chains:
            for node in path[1:]:
                self.leaves[node] = self.leaves.get(node, 0) + 1
        self.codes = pd.Categorical(values, categories=self.order).codes.astype(np.float64)

    def cell(self, present_codes: np.ndarray) -> tuple[str, float]:
        present = np.unique(present_codes.astype(np.int64))
        denom = max(self.size - 1, 1)
        if len(present) == 1:
            return str(self.order[present[0]]), 0.0
        if self.hierarchy is not None:
            common = set(self.chains[present[0]][1:])
            for c in present[1:]:
                common &= set(self.chains[c][1:])
            if common:
                lowest = min(common, key=lambda node: self.leaves[node])
                return str(lowest), (self.leaves[lowest] - 1) / denom
            return "*", 1.0
        if len(present) == self.size:
            return "*", 1.0
        return "{" + ",".join(str(self.order[c]) for c in present) + "}", (len(present) - 1) / denom


def _cut(values: np.ndarray, k: int, spare: int) -> np.ndarray | None:
    """Boolean mask of the left half of a median cut, or None when no allowable cut exists."""
    m = len(values)
    s = np.sort(values)
    med = s[(m - 1) // 2]
    best = None
    for left in (values <= med, values < med):
        n_left = int(left.sum())
        small = min(n_left, m - n_left)
        if small == 0:
            continue
        if small >= k:
            return left
        if small <= spare and m - small >= k and best is None:
            best = left
    return best


def generalise(
    df: pd.DataFrame,
    quasi_identifiers: Sequence[str],
    k: int,
    hierarchies: Mapping[str, Mapping] | None = None,
    suppress: float = 0.0,
) -> tuple[pd.DataFrame, MondrianReport]:
    """k-anonymise ``df`` on ``quasi_identifiers`` with strict Mondrian partitioning.

    Returns the released table (QI columns replaced by generalised strings, suppressed rows
    dropped, other columns and the index kept) and a :class:`MondrianReport`.
    """
    qi = _check_table(df, quasi_identifiers)
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise InvalidParameterError("k", k, "an integer >= 1")
    k = int(k)
    if isinstance(suppress, bool) or not isinstance(suppress, (int, float)) or not (0.0 <= suppress < 1.0):
        raise InvalidParameterError("suppress", suppress, "a fraction in [0, 1)")
    hierarchies = dict(hierarchies or {})
    for name in hierarchies:
        if name not in qi:
            raise InvalidParameterError("hierarchies", name, f"keys among the QIs {qi}")
    n = len(df)
    if n < k:
        raise InvalidDataError("df", f"{n} rows cannot be {k}-anonymous", f"at least k={k} rows")

    numeric: dict[str, bool] = {}
    cats: dict[str, _Categorical] = {}
    cols = []
    for name in qi:
        col = df[name]
        if col.isna().any():
            raise InvalidDataError(name, "contains missing values", "a column without NaN/None")
        is_num = pd.api.types.is_numeric_dtype(col) and not pd.api.types.is_bool_dtype(col)
        if is_num and name in hierarchies:
            raise InvalidParameterError(
                "hierarchies",
                name,
                "hierarchies for categorical QIs only",
                "Numeric QIs are generalised to ranges.",
            )
        numeric[name] = bool(is_num)
        if is_num:
            cols.append(col.to_numpy(dtype=np.float64))
        else:
            cats[name] = _Categorical(name, col, hierarchies.get(name))
            cols.append(cats[name].codes)
    X = np.column_stack(cols)
    span = X.max(axis=0) - X.min(axis=0)
    scale = np.where(span > 0, span, 1.0)

    spare = int(math.floor(suppress * n))
    finals: list[np.ndarray] = []
    suppressed: list[np.ndarray] = []
    stack = [np.arange(n)]
    while stack:
        idx = stack.pop()
        sub = X[idx]
        width = (sub.max(axis=0) - sub.min(axis=0)) / scale
        done = True
        for j in np.argsort(-width, kind="stable"):
            if width[j] <= 0:
                break
            left = _cut(sub[:, j], k, spare)
            if left is None:
                continue
            a, b = idx[left], idx[~left]
            for part in (a, b):
                if len(part) < k:
                    spare -= len(part)
                    suppressed.append(part)
                else:
                    stack.append(part)
            done = False
            break
        if done:
            finals.append(idx)

    # generalise each class; build per-class strings then scatter with one take per QI
    label = np.full(n, -1, dtype=np.int64)
    for c, idx in enumerate(finals):
        label[idx] = c
    keep = label >= 0
    out = df.loc[keep].copy()
    lab = label[keep]
    sizes = np.array([len(i) for i in finals], dtype=np.float64)
    n_supp = n - int(keep.sum())
    ncp_per_qi: dict[str, float] = {}
    for j, name in enumerate(qi):
        strings = np.empty(len(finals), dtype=object)
        loss = np.empty(len(finals))
        for c, idx in enumerate(finals):
            v = X[idx, j]
            if numeric[name]:
                lo, hi = v.min(), v.max()
                strings[c] = f"[{_fmt(lo)}-{_fmt(hi)}]"
                loss[c] = (hi - lo) / span[j] if span[j] > 0 else 0.0
            else:
                strings[c], loss[c] = cats[name].cell(v)
        out[name] = pd.Series(strings[lab], index=out.index, dtype=object)
        ncp_per_qi[name] = float((loss * sizes).sum() + n_supp) / n
    report = MondrianReport(
        k=k,
        k_achieved=int(sizes.min()) if len(sizes) else 0,
        n_rows=n,
        n_released=int(keep.sum()),
        n_suppressed=n_supp,
        n_classes=len(finals),
        ncp=float(np.mean(list(ncp_per_qi.values()))),
        ncp_per_qi=MappingProxyType(ncp_per_qi),
        discernibility=int((sizes**2).sum()) + n_supp * n,
    )
    return out, report
