"""What contribution bounding did to a query: the words every result carries, and an optional,
paid estimate of what it left out.

**What an interval covers.** Before aggregating, each privacy unit keeps at most ``max_rows``
rows in each of at most ``max_groups`` groups, and every value of a bounded aggregate (sum, mean,
variance, std, quantile) is clipped to its column's declared bounds. The released intervals are
intervals for *that* statistic — the bounded one — not for the statistic of the raw table. A
person with 40 rows under ``max_rows=2`` adds 2 to a count, and an income of 10⁷ under declared
bounds [0, 500,000] adds 500,000 to a sum. :class:`Bounding` says so, in words and as fields,
from the request and the declared metadata alone (no data): every :class:`~dpkit.analytics.
results.QueryResult` carries one, shown next to its table.

**The estimate (opt-in, paid).** How much bounding removed depends on the data, so it can only
be released with noise and paid for. With ``bounding_epsilon=ε_b`` a query releases, besides its
aggregates, one or two noisy counts (:class:`BoundingEstimate`) and pays ε_b more, in the same
debit, before any row is read:

* ``units_capped`` — the number of privacy units that lost at least one row to ``max_rows`` /
  ``max_groups`` (tables with a privacy unit);
* ``rows_clipped`` — the number of *kept* rows with at least one bounded-aggregate value outside
  its declared bounds (queries with a bounded aggregate).

Each takes an equal share of ε_b. Without the option nothing more is paid, computed or shown.

Theorem (the estimate is ε_b-DP, so the query with it costs ε + ε_b by basic composition).
Fix the bounding salt (drawn from the randomness, independently of the data, so the guarantee for
every salt is the guarantee for their mixture). Bounding is per unit: which rows unit u keeps,
B_u, depends only on u's own rows and the salt (:mod:`dpkit.analytics.plan`). Then

    U(D) = Σ_u 1[u has a row that passes the filter and the key filter but is not in B_u]
    C(D) = Σ_u #{r ∈ B_u : some bounded value of r lies outside its declared bounds}

are sums over units of a term that depends on that unit's rows only, in {0, 1} for U and in
{0, …, G·R} for C (B_u has at most G·R rows; G = max_groups with a group-by, else 1; R =
max_rows; G = R = 1 on a row-level table). Under ``add_remove`` one unit's term appears or
disappears; under ``replace`` one unit's term is exchanged for another in the same range. Either
way the ℓ1 sensitivity is 1 for U and G·R for C — not doubled under ``replace``: each is one total,
not a histogram in which a unit that changes moves between two cells. Discrete Laplace noise of
scale Δ/ε' makes each count ε'-DP (Ghosh, Roughgarden & Sundararajan 2009; Canonne, Kamath &
Steinke 2020), and the shares add up to ε_b. The number of *rows* a unit loses is not released:
it is unbounded (one person can hold any number of rows), so no finite noise would hide it.

Neither count is a correction: a unit's lost rows and a clipped value's distance to its bound are
not in them. They say whether bounding mattered, and roughly how much.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import Any, Protocol, runtime_checkable

import numpy as np

from dpkit._validate import decimal_fraction
from dpkit.accounting.events import DPEvent
from dpkit.accounting.rounding import to_decimal_down, to_decimal_up
from dpkit.analytics.limits import json_text_bound
from dpkit.analytics.plan import AggregationPlan
from dpkit.errors import InvalidParameterError
from dpkit.mechanisms.laplace import Geometric
from dpkit.noise.source import RandomSource

__all__ = [
    "Bounding",
    "BoundingEstimate",
    "BoundingCounter",
    "BoundingReport",
    "NoisyCount",
    "bounding_report",
    "check_bounding_engine",
    "total_epsilon",
]

#: What an estimate's counts are, in words (text output and the JSON ``what`` field).
_WHAT = {
    "units_capped": "privacy units that lost rows to max_rows/max_groups",
    "rows_clipped": "kept rows with a value outside the declared bounds",
}


@dataclass(frozen=True)
class NoisyCount:
    """One released count of a :class:`BoundingEstimate`: the noisy ``value`` (an integer, which
    may be negative: the noise is not clamped, so the value is unbiased), its interval [``low``,
    ``high``] at the result's confidence, the ε it was given, the discrete Laplace ``scale`` and
    the ℓ1 ``sensitivity`` it was calibrated to."""

    value: int
    low: int
    high: int
    epsilon: float
    scale: float
    sensitivity: int

    @classmethod
    def from_dict(cls, obj: Mapping[str, Any]) -> NoisyCount:
        """The count back from :meth:`to_dict` (a service answer)."""
        return cls(
            int(obj["value"]),
            int(obj["low"]),
            int(obj["high"]),
            float(obj["epsilon"]),
            float(obj["scale"]),
            int(obj["sensitivity"]),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "value": self.value,
            "low": self.low,
            "high": self.high,
            "epsilon": self.epsilon,
            "mechanism": "laplace",
            "scale": self.scale,
            "sensitivity": self.sensitivity,
        }


@dataclass(frozen=True)
class BoundingEstimate:
    """The paid estimate of what bounding left out (see the module docstring): ``epsilon`` is
    what it cost in all; ``units_capped`` and ``rows_clipped`` are None where they do not apply
    (no privacy unit; no bounded aggregate)."""

    epsilon: float
    confidence: float
    units_capped: NoisyCount | None
    rows_clipped: NoisyCount | None

    def counts(self) -> list[tuple[str, NoisyCount]]:
        """The released counts, by name."""
        pairs = (("units_capped", self.units_capped), ("rows_clipped", self.rows_clipped))
        return [(name, c) for name, c in pairs if c is not None]

    @classmethod
    def from_dict(cls, obj: Mapping[str, Any]) -> BoundingEstimate:
        """The estimate back from :meth:`to_dict` (a service answer)."""
        units, rows = obj.get("units_capped"), obj.get("rows_clipped")
        return cls(
            float(obj["epsilon"]),
            float(obj["confidence"]),
            None if units is None else NoisyCount.from_dict(units),
            None if rows is None else NoisyCount.from_dict(rows),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"epsilon": self.epsilon, "confidence": self.confidence}
        for name, c in self.counts():
            out[name] = {"what": _WHAT[name], **c.to_dict()}
        return out

    def lines(self) -> list[str]:
        """One line per released count, in words."""
        pct = f"{self.confidence * 100:.4g}%"
        return [
            f"bounding estimate (paid, ε={c.epsilon:.4g}): {_WHAT[name]}: {c.value:,} "
            f"({pct} interval [{c.low:,}, {c.high:,}], laplace, sensitivity {c.sensitivity})"
            for name, c in self.counts()
        ]


@dataclass(frozen=True)
class Bounding:
    """What a result's intervals cover: the statistic after contribution bounding and clipping.

    ``privacy_unit``: the unit column (None: row-level). ``max_rows``: each unit's cap per group
    (None on a row-level table, where nothing is capped); ``max_groups``: its cap on groups (None
    without a group-by or on a row-level table). ``clipped``: (column, lower, upper) of every
    column a bounded aggregate clips to its declared bounds. ``estimate``: the paid estimate, when
    it was asked for. ``truncated``: on a joined table, (table, what a row is counted per, at
    most how many kept) for every table truncated before the join (:mod:`dpkit.analytics.joins`).
    All but ``estimate`` come from the request and the metadata (no data)."""

    privacy_unit: str | None
    max_groups: int | None
    max_rows: int | None
    clipped: tuple[tuple[str, float, float], ...]
    estimate: BoundingEstimate | None = None
    truncated: tuple[tuple[str, str, int], ...] = ()

    @property
    def clipped_columns(self) -> tuple[str, ...]:
        return tuple(c for c, _, _ in self.clipped)

    @property
    def covers(self) -> str:
        """``"bounded statistic"`` when a cap or clipping applies, else ``"exact statistic"``."""
        capped = self.max_rows is not None or self.clipped or self.truncated
        return "bounded statistic" if capped else "exact statistic"

    @property
    def text(self) -> str:
        """The sentence shown next to every result's table (only what applies is named)."""
        if self.covers == "exact statistic":
            return "intervals cover the exact statistic: no contribution bound or clipping applies to this query"
        parts = []
        if self.max_rows is not None:
            cap = f"each {self.privacy_unit}'s rows capped at max_rows={self.max_rows}"
            if self.max_groups is not None:
                cap += f" per group in at most max_groups={self.max_groups} group(s)"
            parts.append(cap)
        if self.truncated:
            kept = ", ".join(f"{t} at most {k} row(s) per {per}" for t, per, k in self.truncated)
            parts.insert(0, f"before joining, {kept}")
        if self.clipped:
            ranges = ", ".join(f"{c} to [{lo:g}, {hi:g}]" for c, lo, hi in self.clipped)
            parts.append(f"values clipped to the declared bounds ({ranges})")
        gone = []
        if self.max_rows is not None or self.truncated:
            gone.append("rows left out by the caps are not in it")
        if self.clipped:
            gone.append("a value beyond its bounds counts as the nearest bound")
        return f"intervals cover the statistic after bounding: {'; '.join(parts)}; {', and '.join(gone)}"

    def lines(self) -> list[str]:
        """:attr:`text`, then the estimate's lines when there is one."""
        return [self.text, *(self.estimate.lines() if self.estimate is not None else [])]

    @classmethod
    def from_dict(cls, obj: Mapping[str, Any], privacy_unit: str | None) -> Bounding:
        """The bounding back from :meth:`to_dict` (a service answer; the unit is the answer's)."""
        bounds = obj.get("declared_bounds") or {}
        estimate = obj.get("estimate")
        return cls(
            privacy_unit=privacy_unit,
            max_groups=obj.get("max_groups"),
            max_rows=obj.get("max_rows"),
            clipped=tuple((c, float(bounds[c][0]), float(bounds[c][1])) for c in obj.get("clipped_columns", ())),
            estimate=None if estimate is None else BoundingEstimate.from_dict(estimate),
            truncated=tuple((str(x["table"]), str(x["per"]), int(x["keep"])) for x in obj.get("truncated", ())),
        )

    def to_dict(self) -> dict[str, Any]:
        """The JSON form; ``estimate`` only when one was paid for."""
        out: dict[str, Any] = {
            "covers": self.covers,
            "max_rows": self.max_rows,
            "max_groups": self.max_groups,
            "clipped_columns": list(self.clipped_columns),
            "declared_bounds": {c: [lo, hi] for c, lo, hi in self.clipped},
            "text": self.text,
        }
        if self.truncated:
            out["truncated"] = [{"table": t, "per": per, "keep": k} for t, per, k in self.truncated]
        if self.estimate is not None:
            out["estimate"] = self.estimate.to_dict()
        return out


@runtime_checkable
class BoundingCounter(Protocol):
    """An engine that can count what bounding removed (the DuckDB engine)."""

    def bounding_counts(self, plan: AggregationPlan) -> tuple[int, int]:
        """(units that lost at least one row to the caps, kept rows with a value of a bounded
        column outside its bounds), from the same bounding as ``compute(plan)`` (same salt)."""
        ...


@dataclass(frozen=True)
class BoundingReport:
    """A query's :class:`Bounding` and, when ``bounding_epsilon`` was given, the priced
    mechanisms of its estimate — built before paying, from the request and the metadata."""

    bounding: Bounding
    epsilon: float | None = None
    units: Geometric | None = None
    rows: Geometric | None = None

    @property
    def events(self) -> tuple[DPEvent, ...]:
        """The estimate's events, composed into the query's (none without the option)."""
        return tuple(m.event for m in (self.units, self.rows) if m is not None)

    def json_bytes(self) -> int:
        """An upper bound on the bytes ``Bounding.to_dict`` adds to an answer's JSON."""
        names = sum(2 * json_text_bound(c) + 64 for c in self.bounding.clipped_columns)
        estimate = 1024 if self.epsilon is not None else 0
        return 768 + 2 * json_text_bound(self.bounding.privacy_unit or "") + 2 * names + estimate

    def release(self, engine: Any, plan: AggregationPlan, confidence: float, src: RandomSource) -> Bounding:
        """The bounding, with its estimate drawn when one was paid for (after the debit: the
        engine counts on ``plan``, the plan its aggregates ran on)."""
        if self.epsilon is None:
            return self.bounding
        units, rows = engine.bounding_counts(plan)
        estimate = BoundingEstimate(
            epsilon=self.epsilon,
            confidence=confidence,
            units_capped=_noisy(self.units, units, confidence, src),
            rows_clipped=_noisy(self.rows, rows, confidence, src),
        )
        return replace(self.bounding, estimate=estimate)


def _noisy(mech: Geometric | None, count: int, confidence: float, src: RandomSource) -> NoisyCount | None:
    if mech is None:
        return None
    value = int(mech.release(np.array([count], dtype=np.int64), rng=src)[0])
    half = mech.error_bound(1.0 - confidence) - 1  # |noise| <= half with the stated confidence
    return NoisyCount(value, value - half, value + half, mech.epsilon, mech.scale, mech.sensitivity)


def bounding_report(
    plan: AggregationPlan,
    grouped: bool,
    G: int,
    R: int,
    epsilon: float | None,
    neighbours: Any,
    rows: int | None = None,
) -> BoundingReport:
    """The query's :class:`Bounding` (from the plan: its unit, caps and bounded columns) and, with
    ``epsilon``, its estimate's mechanisms. Refuses, before anything is paid, an estimate of a
    query that bounding cannot change (a row-level table without a bounded aggregate) and an ε_b
    too small or too large for the noise. ``rows`` is the most rows of one unit in all (default
    G·R; less on a joined table, :func:`dpkit.analytics.pricing.unit_bounds`)."""
    clipped: dict[str, tuple[str, float, float]] = {}
    for s in plan.sums:
        clipped.setdefault(s.column, (s.column, s.lower, s.upper))
    for x in plan.values:
        clipped.setdefault(x.column, (x.column, x.lower, x.upper))
    unit = plan.unit
    truncated: list[tuple[str, str, int]] = []
    if plan.join is not None:
        for src in plan.join.sources:
            if src.keep is not None:
                per = "join key" if src.public else src.partition[0]
                truncated.append((src.table, per, src.keep))
    bounding = Bounding(
        privacy_unit=unit,
        max_groups=plan.max_groups if unit is not None and grouped else None,
        max_rows=plan.max_rows if unit is not None else None,
        clipped=tuple(clipped.values()),
        truncated=tuple(truncated),
    )
    if epsilon is None:
        return BoundingReport(bounding)
    parts = (["units_capped"] if unit is not None else []) + (["rows_clipped"] if clipped else [])
    if not parts:
        raise InvalidParameterError(
            "bounding_epsilon",
            epsilon,
            "None for this query",
            "on a row-level table a query without a bounded aggregate (sum, mean, variance, std, quantile) "
            "loses nothing to bounding, so there is nothing to estimate",
        )
    share = to_decimal_down(decimal_fraction(epsilon) / len(parts))
    mechs: dict[str, Geometric] = {}
    for name in parts:
        sensitivity = 1 if name == "units_capped" else (G * R if rows is None else rows)
        try:
            mechs[name] = Geometric(epsilon=share, sensitivity=sensitivity, neighbours=neighbours)
        except InvalidParameterError:
            lo, hi = Fraction(sensitivity, 2**52), Fraction(sensitivity) * 2**20
            raise InvalidParameterError(
                "bounding_epsilon",
                epsilon,
                f"a number whose share ({len(parts)} equal shares) lies in [{float(lo):.3g}, {float(hi):.3g}]",
                f"the noise scale of the {name} count (sensitivity {sensitivity}) must lie in [2**-20, 2**52]",
            ) from None
    return BoundingReport(bounding, epsilon, mechs.get("units_capped"), mechs.get("rows_clipped"))


def check_bounding_engine(report: BoundingReport, engine: object) -> None:
    """Refuse, before paying, an estimate the engine cannot count (Spark, for now)."""
    if report.epsilon is not None and not isinstance(engine, BoundingCounter):
        name = getattr(engine, "name", type(engine).__name__)
        raise InvalidParameterError(
            "bounding_epsilon",
            report.epsilon,
            "None on this engine",
            f"the {name} engine does not count what bounding left out; the estimate runs on DuckDB",
        )


def total_epsilon(epsilon: float, bounding_epsilon: float | None) -> float:
    """The ε a query with its estimate debits: the two decimal values added exactly, as the
    smallest double whose decimal value is at least their sum (0.1 + 0.05 is 0.15)."""
    if bounding_epsilon is None:
        return epsilon
    return to_decimal_up(decimal_fraction(epsilon) + decimal_fraction(bounding_epsilon))
