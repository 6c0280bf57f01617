"""The data check's row norms: how many rows a given ``data_norm`` would scale (curator only).

The estimators of :mod:`dpkit.ml` bound each row's ℓ2 norm by the declared ``data_norm`` and
scale a row with a larger norm down to it, silently — saying which rows were scaled would say
something about them. The curator, who sees the data anyway, can ask the check instead:
:func:`norm_check` counts the rows whose feature vector has a larger norm, in one DuckDB scan of
the features read as declared (the values a query reads, unscaled and unclipped). It is part of
the curator's report (:class:`~dpkit.analytics.check_report.DataCheck`), never a private release.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from dpkit import _validate as v
from dpkit._validate import short_repr as _short
from dpkit.analytics.check_report import NormCheck
from dpkit.analytics.metadata import Metadata, Numeric
from dpkit.errors import InvalidParameterError

__all__ = ["checked_features", "norm_check"]


def checked_features(
    meta: Metadata, features: Sequence[str] | None, data_norm: object
) -> tuple[tuple[str, ...], float] | None:
    """``features`` and ``data_norm`` checked against the metadata before anything is read: both
    or neither, the features distinct columns declared Numeric, ``data_norm`` a finite number > 0."""
    if features is None and data_norm is None:
        return None
    if features is None or data_norm is None:
        missing = "features" if features is None else "data_norm"
        other = "data_norm" if features is None else "features"
        raise InvalidParameterError(missing, None, f"given together with {other}")
    if isinstance(features, str) or not isinstance(features, Sequence) or not features:
        raise InvalidParameterError("features", _short(features), "a non-empty list of declared numeric columns")
    if len(set(features)) != len(features):
        raise InvalidParameterError("features", _short(features), "distinct column names")
    numeric = [c for c, spec in meta.columns.items() if isinstance(spec, Numeric)]
    for name in features:
        if name not in numeric:
            declared = ", ".join(map(repr, numeric)) or "none"
            raise InvalidParameterError(
                "features",
                name if isinstance(name, str) else _short(name),
                f"a column declared Numeric in the metadata ({declared})",
            )
    norm = v.positive(data_norm, "data_norm")
    if not math.isfinite(norm):
        raise InvalidParameterError("data_norm", data_norm, "a finite number > 0")
    return tuple(features), norm


def norm_check(
    con: Any, raw: str, typed: Mapping[str, str], meta: Metadata, features: tuple[str, ...], data_norm: float
) -> NormCheck:
    """Count, in one scan of ``raw`` over the typed feature expressions, the rows whose ℓ2 norm
    exceeds ``data_norm`` (rows with a missing or unreadable feature are counted apart)."""
    present = " AND ".join(f"{typed[c]} IS NOT NULL" for c in features)
    norm = "sqrt(" + " + ".join(f"{typed[c]} * {typed[c]}" for c in features) + ")"
    row = con.execute(
        f"WITH r AS (SELECT ({present}) AS __ok, CASE WHEN {present} THEN {norm} END AS __norm FROM {raw}) "
        "SELECT count(*) FILTER (WHERE __ok), count(*) FILTER (WHERE NOT __ok), count(*) FILTER (WHERE __norm > $1), "
        "quantile_disc(__norm, 0.5), quantile_disc(__norm, 0.99), max(__norm) FROM r",
        [data_norm],
    ).fetchone()
    bounded = all(isinstance(s := meta.columns[c], Numeric) and s.bounded for c in features)
    return NormCheck(
        features=features,
        data_norm=data_norm,
        rows=int(row[0]),
        rows_missing=int(row[1]),
        scaled=int(row[2]),
        norm_median=None if row[3] is None else float(row[3]),
        norm_p99=None if row[4] is None else float(row[4]),
        norm_max=None if row[5] is None else float(row[5]),
        bounded_norm=math.sqrt(len(features)) if bounded else None,
    )
