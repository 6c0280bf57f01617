"""What a private query returns: noisy values with their accuracy and their privacy cost."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from dpkit._validate import Neighbours
from dpkit.accounting.events import DPEvent, event_from_dict, event_to_dict
from dpkit.analytics.bounding import Bounding
from dpkit.analytics.result_display import plot_result, result_html, result_text

if TYPE_CHECKING:
    from matplotlib.axes import Axes

__all__ = ["AggregateInfo", "QueryCost", "QueryResult"]


#: What a ratio aggregate's :attr:`AggregateInfo.scale` is the standard deviation of, in words.
_RATIOS = {"mean": "the mean", "var": "the variance", "std": "the standard deviation"}


@dataclass(frozen=True)
class AggregateInfo:
    """One released aggregate: its name, the mechanism, the (ε, δ) it was given and its noise.

    ``scale`` is in the released value's units:

    * counts and sums: the noise scale of the released value (Laplace b or Gaussian σ);
    * means, variances and standard deviations (ratios of noisy sums and a noisy count): the
      approximate standard deviation of the released value's noise, by the delta method from the
      released noisy parts alone (post-processing; see ``dpkit.analytics.execute._mean_sd``).
      It depends on each group's noisy count, so with several groups ``scale`` is the largest
      over the released groups and ``scales`` holds each row's, in the order of the table;
    * quantiles (exponential mechanism): NaN; their accuracy is ``rank_error``.

    ``rank_error`` (quantiles only, else NaN) is k in rows: in each group, with probability at
    least the result's ``confidence``, the released value's rank error (the distance from q·n to
    its rank among the group's n bounded values) is at most k, beyond the resolution of the
    candidate grid at the quantile (:meth:`dpkit.mechanisms.candidate_quantile.CandidateQuantile.rank_error`).
    It comes from ε, q and the grid alone, so it costs nothing; there is no value interval
    (``<name>_low``/``_high`` are NaN): its ends would be data values.

    ``noise_scales`` names the noise scale (b or σ, value units) of each noisy part: ``count``,
    ``count_units``, ``sum``, ``sum_of_squares``; :attr:`sum_scale` is the sum's (for a mean,
    the number ``scale`` held before it became the mean's own). ``sensitivity`` is the ℓ1
    (Laplace) or ℓ2 (Gaussian) sensitivity of the noisy count or sum — for a mean the noisy
    (centred) sum inside it, for a variance or std its sum of squares — from the declared bounds
    and the contribution bounds.
    """

    name: str
    kind: str
    column: str | None
    epsilon: float
    delta: float
    mechanism: str
    scale: float
    sensitivity: float
    event: DPEvent
    noise_scales: tuple[tuple[str, float], ...] = ()
    scales: tuple[float, ...] = field(default=(), repr=False)
    rank_error: float = math.nan

    @property
    def is_ratio(self) -> bool:
        """Whether the value is a ratio of noisy parts (mean, variance, std), whose :attr:`scale`
        is an approximate standard deviation rather than a noise scale."""
        return self.kind in _RATIOS

    @property
    def scale_label(self) -> str:
        """What :attr:`scale` is, in words: ``noise scale`` for counts and sums, ``approx. std.
        dev. of the mean`` (of the variance, of the standard deviation) for ratios."""
        return f"approx. std. dev. of {_RATIOS[self.kind]}" if self.is_ratio else "noise scale"

    @property
    def sum_scale(self) -> float:
        """The noise scale (b or σ, value units) of the noisy sum: a sum's own, or the centred
        sum inside a mean, variance or std; NaN for counts and quantiles."""
        return dict(self.noise_scales).get("sum", math.nan)

    def scale_range(self) -> tuple[float, float]:
        """(smallest, largest) of :attr:`scales` over the released rows; (scale, scale) when
        the scale is the same for every row (counts, sums, quantiles)."""
        finite = [x for x in self.scales if not math.isnan(x)]
        return (min(finite), max(finite)) if finite else (self.scale, self.scale)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "column": self.column,
            "epsilon": self.epsilon,
            "delta": self.delta,
            "mechanism": self.mechanism,
            "scale": None if math.isnan(self.scale) else self.scale,
            "scale_label": self.scale_label,
            "noise_scales": {k: None if math.isnan(x) else x for k, x in self.noise_scales},
            "sensitivity": None if math.isnan(self.sensitivity) else self.sensitivity,
            "rank_error": None if math.isnan(self.rank_error) else self.rank_error,
            # Each row's own scale (ratios; [] otherwise) and this aggregate's part of the query's
            # event: with them the dict is the whole aggregate (dpkit.client rebuilds it).
            "scales": [None if math.isnan(x) else x for x in self.scales],
            "event": event_to_dict(self.event),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> AggregateInfo:
        """The aggregate back from :meth:`to_dict` (a service's answer; null numbers are NaN)."""
        return cls(
            name=d["name"],
            kind=d["kind"],
            column=d["column"],
            epsilon=float(d["epsilon"]),
            delta=float(d["delta"]),
            mechanism=d["mechanism"],
            scale=_nan(d["scale"]),
            sensitivity=_nan(d["sensitivity"]),
            event=event_from_dict(d["event"]),
            noise_scales=tuple((k, _nan(x)) for k, x in d["noise_scales"].items()),
            scales=tuple(_nan(x) for x in d["scales"]),
            rank_error=_nan(d.get("rank_error")),
        )


def _nan(x: Any) -> float:
    """A number of a ``to_dict`` (null: NaN, as it was written)."""
    return math.nan if x is None else float(x)


@dataclass(frozen=True)
class QueryCost:
    """What a query would debit: its (ε, δ) and the composed event, priced before any data is read."""

    epsilon: float
    delta: float
    event: DPEvent
    text: str

    def to_dict(self) -> dict[str, Any]:
        return {"epsilon": self.epsilon, "delta": self.delta, "event": event_to_dict(self.event), "query": self.text}


@dataclass(frozen=True)
class QueryResult:
    """The released table and everything needed to read it honestly.

    ``table`` holds one row per released group (one row in all without a group-by): the group
    columns, then for each aggregate ``<name>``, ``<name>_low`` and ``<name>_high`` — a
    ``confidence`` interval around the *bounded* statistic (after clipping and contribution
    bounding), from the noise distribution; quantiles have no value interval (NaN) but a rank
    error bound (:attr:`AggregateInfo.rank_error`).

    Who is protected is part of the answer: ``privacy_unit`` (None: every row is a different
    person, as the curator declared), the contribution bounds ``max_groups`` / ``max_rows`` each
    unit was held to, and the ``neighbours`` relation. ``seeded`` is True when the noise came from
    a seeded generator (reproducible, not private: tests and teaching only).

    ``truncated`` is True when keys selected privately were more than the session's limits allow
    (``max_result_rows``, ``max_response_bytes``) and only the first rows in key order are in
    ``table`` — a cut made on the released keys alone (post-processing); ``notes`` say how many
    were released. With public keys an answer over the limits is refused before paying instead.

    ``bounding`` says what the intervals cover — the statistic after each unit's rows were capped
    (``max_rows``, ``max_groups``) and values clipped to the declared bounds — shown next to the
    table in every display, and carries the paid estimate of what bounding left out when the
    query asked for one (``bounding_epsilon``; :mod:`dpkit.analytics.bounding`). ``epsilon`` is
    everything the query debited, that estimate included.
    """

    table: pd.DataFrame
    aggregates: tuple[AggregateInfo, ...]
    groups: tuple[str, ...]
    epsilon: float
    delta: float
    event: DPEvent
    confidence: float
    keys: str  # "none" (no group-by), "public" or the private key-selection strategy
    remaining_epsilon: float | None = None
    notes: tuple[str, ...] = field(default=())
    spend_id: int | None = None  # the ledger spend that paid for this result (None: in-memory budget)
    privacy_unit: str | None = None
    max_groups: int = 1
    max_rows: int = 1
    neighbours: Neighbours = "add_remove"
    seeded: bool = False
    truncated: bool = False
    bounding: Bounding | None = None

    def _only(self) -> AggregateInfo:
        if len(self.aggregates) != 1:
            raise AttributeError("this result holds several aggregates: read result.table (or result[name])")
        return self.aggregates[0]

    def _index(self) -> pd.Index:
        """The keys of the rows (a group-by only)."""
        if len(self.groups) > 1:
            return pd.MultiIndex.from_frame(self.table[list(self.groups)])
        return pd.Index(self.table[self.groups[0]])

    def _column(self, name: str) -> Any:
        col = self.table[name]
        if not self.groups:
            return float(col.iloc[0]) if len(col) else math.nan
        return pd.Series(col.to_numpy(), index=self._index(), name=name)

    @property
    def value(self) -> Any:
        """The released value: a float without a group-by, else a Series indexed by the keys."""
        return self._column(self._only().name)

    @property
    def ci(self) -> tuple[Any, Any]:
        """(low, high) of the confidence interval, shaped like :attr:`value`."""
        name = self._only().name
        return self._column(f"{name}_low"), self._column(f"{name}_high")

    @property
    def scale(self) -> Any:
        """The single aggregate's :attr:`AggregateInfo.scale`, in its value's units: the noise
        scale of a count or sum; for a mean (variance, std) the approximate standard deviation of
        its noise — with a group-by a Series indexed by the keys like :attr:`value` (each group's
        own, from its noisy count), else a float."""
        a = self._only()
        if not (self.groups and a.scales):
            return a.scale
        return pd.Series(np.asarray(a.scales, dtype=np.float64), index=self._index(), name=f"{a.name}_scale")

    def __getitem__(self, name: str) -> Any:
        """The released values of the aggregate ``name``."""
        if name not in {a.name for a in self.aggregates}:
            raise KeyError(f"no aggregate named {name!r}; have {[a.name for a in self.aggregates]}")
        return self._column(name)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready description (NaN becomes None)."""
        # Column by column (numpy's tolist gives plain Python values), then row by row: a few
        # times cheaper than DataFrame.to_dict for the small tables answers usually are.
        names = [str(c) for c in self.table.columns]
        columns = [self.table[c].to_numpy().tolist() for c in self.table.columns]
        records = [
            {
                k: (None if isinstance(x, float) and math.isnan(x) else (x.item() if isinstance(x, np.generic) else x))
                for k, x in zip(names, row, strict=True)
            }
            for row in zip(*columns, strict=True)
        ]
        return {
            "rows": records,
            "groups": list(self.groups),
            "aggregates": [a.to_dict() for a in self.aggregates],
            "epsilon": self.epsilon,
            "delta": self.delta,
            "confidence": self.confidence,
            "keys": self.keys,
            "remaining_epsilon": self.remaining_epsilon,
            "event": event_to_dict(self.event),
            "notes": list(self.notes),
            "spend_id": self.spend_id,
            "privacy_unit": {
                "column": self.privacy_unit,
                "row_level": self.privacy_unit is None,
                "max_groups": self.max_groups,
                "max_rows": self.max_rows,
                "neighbours": self.neighbours,
            },
            "seeded": self.seeded,
            "truncated": self.truncated,
            "bounding": None if self.bounding is None else self.bounding.to_dict(),
        }

    @property
    def unit_description(self) -> str:
        """Who is protected, in words (printed with every result)."""
        if self.privacy_unit is None:
            who = "privacy unit: a row (declared: every row is a different person)"
        else:
            who = f"privacy unit: {self.privacy_unit} (at most {self.max_groups} group(s) and {self.max_rows} row(s) per group each)"
        return (
            f"{who}; neighbours: {self.neighbours}"
            + ("; SEEDED noise, not private" if self.seeded else "")
            + ("; TRUNCATED to the session's limits" if self.truncated else "")
        )

    def __repr__(self) -> str:
        covers = "".join(f"\n{line}" for line in self.bounding.lines()) if self.bounding is not None else ""
        return (
            f"QueryResult(ε={self.epsilon:.6g}, δ={self.delta:.3g}, keys={self.keys!r}, "
            f"confidence={self.confidence})\n{self.unit_description}\n{self.table.to_string(index=False)}{covers}"
        )

    def __str__(self) -> str:
        """The whole table (every row and column, whatever pandas' display options), then who is
        protected, each aggregate's mechanism and cost, the budget left and the notes.

        Post-processing of the released result only: reads no data and touches no budget."""
        return result_text(self)

    def _repr_html_(self) -> str:
        """Notebook display: the whole table as escaped HTML and the facts of ``str(result)``;
        no JavaScript. Post-processing only: reads no data and touches no budget."""
        return result_html(self)

    def plot(self, ax: Axes | None = None, aggregate: str | None = None) -> Axes:
        """A matplotlib bar chart of one aggregate (default: the first) per group, or a single
        bar without a group-by, with the released interval (``<name>_low``, ``<name>_high``) as
        error bars; rows whose interval is NaN (quantiles) get none. Draws on ``ax`` (default: a
        new figure) and returns it. Raises :class:`~dpkit.errors.InvalidParameterError` for an
        unknown ``aggregate``. matplotlib is imported here only (an optional extra).

        Post-processing of the released result only: reads no data and touches no budget."""
        return plot_result(self, ax=ax, aggregate=aggregate)
