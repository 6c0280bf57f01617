"""How a :class:`~dpkit.analytics.results.QueryResult` is shown: text, notebook HTML and a chart.

All of it is post-processing of a result that has already been released: nothing here reads the
data, draws noise or touches a budget. The whole table is always shown (pandas' display limits
never cut it); matplotlib is imported only when a chart is asked for (it is an optional extra).
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeAlias

import numpy as np

from dpkit.errors import InvalidParameterError

if TYPE_CHECKING:
    from matplotlib.axes import Axes

#: A :class:`~dpkit.analytics.results.QueryResult`. Not imported, even for type checking:
#: ``results`` imports this module, and the analytics package has no import cycle (tested).
QueryResult: TypeAlias = Any

__all__ = ["bounding_lines", "plot_result", "rank_phrase", "result_html", "result_lines", "result_text", "scale_phrase"]


def _header(r: QueryResult) -> str:
    return f"QueryResult(ε={r.epsilon:.6g}, δ={r.delta:.3g}, keys={r.keys!r}, confidence={r.confidence})"


def _table_text(r: QueryResult) -> str:
    # Explicit "no limit" for rows, columns, width and cell width: the display options of the
    # caller's session must not drop released groups from what they read.
    return r.table.to_string(index=False, max_rows=None, max_cols=None, max_colwidth=None, line_width=None)


def bounding_lines(r: QueryResult) -> list[str]:
    """What the intervals cover (the statistic after contribution bounding and clipping), then
    the paid estimate of what bounding left out when there is one: shown right under the table."""
    return [] if r.bounding is None else r.bounding.lines()


def result_lines(r: QueryResult) -> list[str]:
    """The facts printed under the table: who is protected, what the intervals cover, each
    aggregate, budget left, notes."""
    lines = [r.unit_description]
    lines.extend(bounding_lines(r))
    if r.aggregates:
        lines.append(
            f"intervals: <name>_low, <name>_high: {r.confidence:.4g} confidence interval from the noise "
            "distribution (NaN: none; a quantile has a rank error bound instead)"
        )
    for a in r.aggregates:
        what = a.kind if a.column is None else f"{a.kind}({a.column})"
        scale = scale_phrase(a) or rank_phrase(a)
        lines.append(
            f"{a.name}: {what}, {a.mechanism}, ε={a.epsilon:.4g}, δ={a.delta:.3g}{', ' + scale if scale else ''}"
        )
    if r.remaining_epsilon is not None:
        lines.append(f"remaining ε: {r.remaining_epsilon:.6g}")
    lines.extend(f"note: {n}" for n in r.notes)
    return lines


def scale_phrase(a: Any, number: Callable[[float], str] = "{:.4g}".format) -> str:
    """What an aggregate's scale is, in words and the value's units (``number`` formats it):
    ``noise scale 2`` for a count or sum, ``approx. std. dev. of the mean 212`` for a mean, and
    for a mean over groups of different sizes ``approx. std. dev. of the mean 180 to 260 across
    the groups`` (each group's own comes from its noisy count). Empty when there is none
    (quantiles). ``a`` is an :class:`~dpkit.analytics.results.AggregateInfo`."""
    low, high = a.scale_range()
    if math.isnan(high):
        return ""
    if low == high:
        return f"{a.scale_label} {number(high)}"
    return f"{a.scale_label} {number(low)} to {number(high)} across the groups"


def rank_phrase(a: Any, number: Callable[[float], str] = "{:.4g}".format) -> str:
    """A quantile's accuracy in words: ``rank error ≤ 39.41 rows per group`` (at the result's
    confidence; :attr:`~dpkit.analytics.results.AggregateInfo.rank_error`). Empty for the other
    aggregates."""
    k = getattr(a, "rank_error", math.nan)
    return "" if math.isnan(k) else f"rank error ≤ {number(k)} rows per group"


def result_text(r: QueryResult) -> str:
    """The header, the whole table (never truncated) and the facts of :func:`result_lines`."""
    lines = result_lines(r)
    return "\n".join([_header(r), lines[0], _table_text(r), *lines[1:]])


def result_html(r: QueryResult) -> str:
    """Notebook HTML: the whole table (escaped), what its intervals cover right under it, and
    the same facts as text; no JavaScript."""
    table = r.table.to_html(index=False, escape=True, max_rows=None, max_cols=None, na_rep="NaN", border=0)
    covers = bounding_lines(r)
    shown = "".join(f'<p class="dpkit-bounding">{html.escape(line)}</p>' for line in covers)
    facts = "".join(f"<li>{html.escape(line)}</li>" for line in result_lines(r) if line not in covers)
    head = f"<p><b>{html.escape(_header(r))}</b></p>"
    return f'<div class="dpkit-query-result">{head}{table}{shown}<ul>{facts}</ul></div>'


def _group_labels(r: QueryResult) -> list[str]:
    if not r.groups:
        return [""] * len(r.table)
    cols = [r.table[g].tolist() for g in r.groups]
    return [", ".join(str(v) for v in row) for row in zip(*cols, strict=True)]


def plot_result(r: QueryResult, ax: Axes | None = None, aggregate: str | None = None) -> Axes:
    """A bar per group (one bar without a group-by) of one aggregate, with the released interval
    as its error bar (none where the interval is NaN). Returns the Axes drawn on: ``ax``, else one
    on a new figure with a constrained layout, so that ``ax.figure.savefig(...)`` keeps the
    labels whole."""
    names = [a.name for a in r.aggregates]
    if aggregate is None:
        if not names:
            raise InvalidParameterError("aggregate", aggregate, "the name of an aggregate, but this result has none")
        aggregate = names[0]
    if aggregate not in names:
        raise InvalidParameterError("aggregate", aggregate, f"one of {names}")
    try:
        import matplotlib.pyplot as plt
    except ModuleNotFoundError as exc:  # pragma: no cover - depends on the installation
        raise ModuleNotFoundError(
            "QueryResult.plot needs matplotlib, which is not installed: pip install 'dpkit[cli]'", name=exc.name
        ) from exc
    if ax is None:
        # Laid out at every draw, so a saved figure holds its rotated bin labels and its title
        # whole (the default layout cuts what does not fit its fixed margins).
        _, ax = plt.subplots(layout="constrained")
    value = r.table[aggregate].to_numpy(dtype=float)
    low = r.table[f"{aggregate}_low"].to_numpy(dtype=float)
    high = r.table[f"{aggregate}_high"].to_numpy(dtype=float)
    x = np.arange(len(value), dtype=float)
    ax.bar(x, value, color="C0", alpha=0.7, label=aggregate)
    has = np.isfinite(low) & np.isfinite(high)
    if has.any():
        # Centred on the interval, not on the value: the bar spans exactly [low, high] whatever
        # the value's position inside it.
        mid = (low[has] + high[has]) / 2
        half = (high[has] - low[has]) / 2
        ax.errorbar(x[has], mid, yerr=half, fmt="none", ecolor="black", capsize=3, label=f"{r.confidence:.4g} interval")
    labels: list[Any] = _group_labels(r) if r.groups else [aggregate]
    ax.set_xticks(x)
    ax.set_xticklabels(labels, rotation=90 if len(labels) > 8 else 0)
    if r.groups:
        ax.set_xlabel(", ".join(r.groups))
    ax.set_ylabel(aggregate)
    ax.set_title(f"{aggregate} (ε={r.epsilon:.4g}, {r.confidence:.4g} confidence intervals)")
    return ax
