"""k-anonymity and distinct l-diversity of a released table.

A table is *k-anonymous* on quasi-identifiers (QIs) when every combination of QI values that
occurs is shared by at least k rows (Sweeney 2002): each person is
indistinguishable from at least k-1 others.  *Distinct l-diversity* (Machanavajjhala et al. 2007)
further asks every such equivalence class to hold at least l distinct sensitive values.

Neither is differential privacy: both are syntactic properties of one release and say nothing
about what two releases reveal together (see :mod:`dpkit.attacks.linkage`).

>>> import pandas as pd
>>> t = pd.DataFrame({"age": ["50-60", "50-60", "60-70"], "sex": ["F", "F", "M"],
...                   "dx": ["HIV", "flu", "cancer"]})
>>> k_anonymity(t, ["age", "sex"]), l_diversity(t, ["age", "sex"], "dx")
(1, 1)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd

from dpkit.errors import InvalidDataError, InvalidParameterError

__all__ = ["AnonymityReport", "anonymity_report", "equivalence_classes", "k_anonymity", "l_diversity"]


def _check_table(df: object, quasi_identifiers: object, *, extra: Sequence[str] = ()) -> list[str]:
    """Validate a table and its QI list; return the QIs as a list of column names."""
    if not isinstance(df, pd.DataFrame):
        raise InvalidDataError("df", f"got {type(df).__name__}", "a pandas DataFrame")
    if isinstance(quasi_identifiers, str) or not isinstance(quasi_identifiers, Sequence):
        raise InvalidParameterError("quasi_identifiers", quasi_identifiers, "a non-empty list of column names")
    qi = list(quasi_identifiers)
    if not qi:
        raise InvalidParameterError(
            "quasi_identifiers",
            qi,
            "a non-empty list of column names",
            "With no quasi-identifier every row is in one class; name the linkable columns.",
        )
    if len(set(qi)) != len(qi):
        raise InvalidParameterError("quasi_identifiers", qi, "a list without repeated names")
    for col in [*qi, *extra]:
        if col not in df.columns:
            raise InvalidParameterError("column", col, f"one of the table's columns {list(map(str, df.columns))}")
    if len(df) == 0:
        raise InvalidDataError("df", "the table has no rows", "a table with at least one row")
    return qi


def equivalence_classes(df: pd.DataFrame, quasi_identifiers: Sequence[str]) -> pd.Series:
    """Size of every equivalence class (rows sharing all QI values), indexed by the QI values.

    Missing values form their own class value (``dropna=False``).

    >>> import pandas as pd
    >>> equivalence_classes(pd.DataFrame({"a": [1, 1, 2]}), ["a"]).tolist()
    [2, 1]
    """
    qi = _check_table(df, quasi_identifiers)
    return df.groupby(qi, dropna=False, observed=True, sort=True).size().rename("size")


def k_anonymity(df: pd.DataFrame, quasi_identifiers: Sequence[str]) -> int:
    """The largest k for which ``df`` is k-anonymous: the size of its smallest equivalence class."""
    return int(equivalence_classes(df, quasi_identifiers).min())


def l_diversity(df: pd.DataFrame, quasi_identifiers: Sequence[str], sensitive: str) -> int:
    """Distinct l: the fewest distinct sensitive values found in any equivalence class."""
    qi = _check_table(df, quasi_identifiers, extra=[sensitive])
    if sensitive in qi:
        raise InvalidParameterError("sensitive", sensitive, "a column that is not a quasi-identifier")
    counts = df.groupby(qi, dropna=False, observed=True)[sensitive].nunique(dropna=False)
    return int(counts.min())


@dataclass(frozen=True)
class AnonymityReport:
    """Syntactic anonymity of one table.

    ``k``: smallest class size; ``l``: distinct l-diversity (``None`` without a sensitive column);
    ``n_classes``: number of equivalence classes; ``target_k`` and ``rows_below_target``: how many
    rows sit in classes smaller than the target (0 when the table meets it).
    """

    k: int
    l: int | None  # noqa: E741 - the l of l-diversity, a public field name
    n_classes: int
    n_rows: int
    target_k: int | None
    rows_below_target: int

    @property
    def meets_target(self) -> bool:
        """True when no row is in a class smaller than ``target_k``."""
        return self.rows_below_target == 0


def anonymity_report(
    df: pd.DataFrame,
    quasi_identifiers: Sequence[str],
    *,
    sensitive: str | None = None,
    target_k: int | None = None,
) -> AnonymityReport:
    """Compute an :class:`AnonymityReport` for ``df``.

    >>> import pandas as pd
    >>> r = anonymity_report(pd.DataFrame({"a": [1, 1, 2], "s": [0, 1, 0]}), ["a"],
    ...                      sensitive="s", target_k=2)
    >>> (r.k, r.l, r.n_classes, r.rows_below_target)
    (1, 1, 2, 1)
    """
    sizes = equivalence_classes(df, quasi_identifiers)
    if target_k is not None and (isinstance(target_k, bool) or not isinstance(target_k, int) or target_k < 1):
        raise InvalidParameterError("target_k", target_k, "an integer >= 1")
    below = int(sizes[sizes < target_k].sum()) if target_k is not None else 0
    ell = l_diversity(df, quasi_identifiers, sensitive) if sensitive is not None else None
    return AnonymityReport(
        k=int(sizes.min()),
        l=ell,
        n_classes=int(len(sizes)),
        n_rows=int(len(df)),
        target_k=target_k,
        rows_below_target=below,
    )
