"""Pricing a query: every mechanism, the composed event, the key-selection tables and the
answer's size bound — from the spec and the declared table only. No row is read and no noise
is drawn, so what pricing refuses (a limit, a missing δ, a bad split) says nothing about the
data; :func:`dpkit.analytics.execute.execute` then pays the event and only then runs the engine.

Sensitivities (privacy unit = a column; ``G = max_groups``, ``R = max_rows``; ``F = G`` groups a
unit can touch under ``add_remove``; every sensitivity doubles under ``replace``):

=================  ====================  ======================
noisy quantity      ℓ1 (Laplace)          ℓ2 (Gaussian)
=================  ====================  ======================
rows per group      G·R                   √G·R
units per group     G                     √G
clipped sum         G·R·max(|L|, |U|)     √G·R·max(|L|, |U|)
centred sum         G·R·(U − L)/2         √G·R·(U − L)/2
=================  ====================  ======================

on the quantisation grid of :mod:`dpkit.analytics.plan`, exactly. Quantiles use the exponential
mechanism per group with ε/(F·R), so that a unit's R rows in each of its F groups cost ε in all,
over a candidate grid from the declared bounds, scored from the engine's cell counts
(:class:`~dpkit.mechanisms.candidate_quantile.CandidateQuantile`; McSherry & Talwar 2007).

With ``bounding_epsilon`` the event also holds the estimate of what bounding left out (units
that lost rows: ℓ1 1; kept rows outside the bounds: ℓ1 G·R, under either relation), priced here
with the rest (:mod:`dpkit.analytics.bounding`); ``Priced.epsilon`` is then ε + ``bounding_epsilon``.
"""

from __future__ import annotations

import functools
import itertools
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, cast

import pandas as pd

from dpkit._validate import decimal_fraction
from dpkit.accounting.events import (
    ApproxDPEvent,
    ComposedEvent,
    DPEvent,
    ExponentialEvent,
    SelfComposedEvent,
    event_to_dict,
)
from dpkit.accounting.rounding import to_decimal_down, to_float_down
from dpkit.analytics import aggregates as A
from dpkit.analytics.bounding import BoundingReport, bounding_report, total_epsilon
from dpkit.analytics.building import Built, build, check_aggregates, public_counts, public_key_count_of
from dpkit.analytics.declared import DeclaredTable
from dpkit.analytics.key_selection import KeySelector, key_selector
from dpkit.analytics.limits import (
    JSON_BIN_LABEL_BYTES,
    JSON_BOOLEAN_BYTES,
    JSON_NULL_BYTES,
    JSON_NUMBER_BYTES,
    json_text_bound,
    json_text_bounds,
)
from dpkit.analytics.metadata import Categorical, Numeric
from dpkit.analytics.plan import AggregationPlan, SumSpec, ValueSpec, quantile_grid, quantize_spec
from dpkit.analytics.results import QueryCost
from dpkit.analytics.spec import QueryOptions, QuerySpec
from dpkit.errors import Fix, InvalidParameterError
from dpkit.mechanisms.candidate_quantile import CandidateQuantile
from dpkit.mechanisms.gaussian import Gaussian
from dpkit.mechanisms.laplace import Geometric

__all__ = ["Priced", "Sizes", "price", "price_built", "cost"]


@dataclass(frozen=True)
class Sizes:
    """The answer's size bound, from the request and the metadata: bytes per row (without the
    ``texts`` key columns, counted per released key), bytes around the rows, and the most rows."""

    row: int
    texts: tuple[int, ...]
    overhead: int
    max_rows: int


@dataclass(frozen=True)
class Priced:
    """A query ready to pay for: its checked shape and aggregates, the options, the engine plan
    (salt 0 until execution draws one), every mechanism, the composed event and the size bound.
    Built before any data is read or noise drawn."""

    table: DeclaredTable
    built: Built
    aggregates: tuple[A.Aggregate, ...]
    options: QueryOptions
    split: tuple[float, ...]
    private: bool
    text: str
    plan: AggregationPlan
    uses: dict[int, dict[str, Any]]
    event: DPEvent
    delta: float
    pending: list[tuple[int, str, Any]]
    deltas: dict[Any, float]
    sel_eps: float
    sel_delta: float
    fan_out: int
    G: int
    R: int
    selector: KeySelector | None
    sizes: Sizes
    bounding: BoundingReport

    @property
    def epsilon(self) -> float:
        """The ε this query debits: its own, plus ``bounding_epsilon`` when it asks for the
        estimate of what bounding left out (:mod:`dpkit.analytics.bounding`)."""
        return total_epsilon(self.options.epsilon, self.options.bounding_epsilon)

    def cost(self) -> QueryCost:
        """What paying for this query debits."""
        return QueryCost(epsilon=self.epsilon, delta=self.delta, event=self.event, text=self.text)

    def bounds(self, column: str) -> tuple[float, float]:
        """The declared [lower, upper] of a bounded numeric column."""
        return _bounds(self.table, column)

    def allowed(self) -> list[tuple[Any, ...] | None]:
        """Per group column: the public values (declared categories, bins), or None."""
        return _allowed(self.table, self.built)

    def public_keys(self) -> tuple[tuple[Any, ...], ...]:
        """Every public key, listed (only when releasing: their number is within max_keys)."""
        if self.built.keys is not None:
            return self.built.keys
        return tuple(itertools.product(*self.allowed()))  # type: ignore[arg-type]


def price(
    spec: QuerySpec, table: DeclaredTable, *, options: QueryOptions | None = None, text: str | None = None
) -> Priced:
    """Check ``spec`` against the declared ``table`` and price it (the options: ``options``, else
    the spec's own). Raises InvalidParameterError / LimitExceededError; reads no data."""
    built = build(spec, table)
    aggregates = check_aggregates(table, built.groups, spec.aggregates)
    opts = options if options is not None else spec.options
    if not isinstance(opts, QueryOptions):
        raise InvalidParameterError("options", opts, "a dpkit.analytics.QueryOptions (at least epsilon=...)")
    return price_built(built, aggregates, opts, table, text=text)


def cost(
    spec: QuerySpec, table: DeclaredTable, *, options: QueryOptions | None = None, text: str | None = None
) -> QueryCost:
    """What :func:`price`'s query would debit."""
    return price(spec, table, options=options, text=text).cost()


def price_built(
    built: Built,
    aggregates: tuple[A.Aggregate, ...],
    options: QueryOptions,
    table: DeclaredTable,
    *,
    text: str | None = None,
) -> Priced:
    """:func:`price` for a shape and aggregates that are already checked."""
    text = text or _describe(table, built, aggregates)
    private = bool(built.groups) and built.keys is None and None in public_counts(table.metadata, built.groups)
    _check_rows(table, built, private)
    if private and options.delta == 0:
        missing = [g.column for g, allowed in zip(built.groups, _allowed(table, built), strict=True) if allowed is None]
        fix = Fix(
            "public_keys",
            "declare categories in the metadata, pass keys=, or give δ > 0 for private key selection",
            {"columns": tuple(missing)},
        )
        raise InvalidParameterError(
            "delta",
            options.delta_given,
            "a number in (0, 1) for a group-by whose keys are not public",
            f"no public keys for {missing}: {fix.text}",
            fix=fix,
        )
    split = options.weights(len(aggregates) + (1 if private else 0), selection=private)
    plan, uses = _plan(table, built, aggregates, 0)
    return _price(table, built, aggregates, options, split, private, text, plan, uses)


# -- shape -------------------------------------------------------------------------------------------


def _allowed(t: DeclaredTable, built: Built) -> list[tuple[Any, ...] | None]:
    out: list[tuple[Any, ...] | None] = []
    for g in built.groups:
        if g.edges is not None:
            out.append(tuple(range(len(g.edges) - 1)))
            continue
        spec = t.metadata.columns.get(g.column)
        out.append(spec.categories if isinstance(spec, Categorical) and spec.categories is not None else None)
    return out


def _row_count(t: DeclaredTable, built: Built) -> int:
    """The rows of an answer with public keys (one per key; one without a group-by)."""
    if not built.groups:
        return 1
    if built.keys is not None:
        return len(built.keys)
    return public_key_count_of(t.metadata, built.groups)


def _check_rows(t: DeclaredTable, built: Built, private: bool) -> None:
    """Refuse, from the request and the metadata only, a group-by with more public keys
    than ``max_keys`` or an answer with more rows than ``max_result_rows`` (with public keys,
    the rows are the keys). Nothing is listed: the counts are integer products."""
    if not built.groups:
        return
    keys = _row_count(t, built)
    t.limits.check("group_by keys", keys, "max_keys")
    if not private:
        t.limits.check("result rows", keys, "max_result_rows")


def _describe(t: DeclaredTable, built: Built, aggregates: Sequence[A.Aggregate]) -> str:
    parts = [", ".join(f"{s.kind}({s.column or '*'})" for s in aggregates)]
    if built.predicate is not None:
        parts.append("where …")
    if built.groups:
        parts.append("by " + ", ".join(g.column for g in built.groups))
    return f"{t.table}: " + " ".join(parts)


def _bounds(t: DeclaredTable, column: str) -> tuple[float, float]:
    """The declared [lower, upper] of a numeric column (building has checked it is bounded)."""
    spec = t.metadata.columns[column]
    assert isinstance(spec, Numeric) and spec.lower is not None and spec.upper is not None
    return spec.lower, spec.upper


def _plan(
    t: DeclaredTable, built: Built, aggregates: Sequence[A.Aggregate], salt: int
) -> tuple[AggregationPlan, dict[int, dict[str, Any]]]:
    sums: list[SumSpec] = []
    values: list[ValueSpec] = []
    uses: dict[int, dict[str, Any]] = {}
    for i, spec in enumerate(aggregates):
        u: dict[str, Any] = {}
        if spec.column is not None:
            lower, upper = _bounds(t, spec.column)
            if spec.kind == "sum":
                u["sum"] = quantize_spec(f"s{len(sums)}", spec.column, lower, upper, centered=False)
                sums.append(u["sum"])
            elif spec.kind in ("mean", "var", "std"):
                u["sum"] = quantize_spec(f"s{len(sums)}", spec.column, lower, upper, centered=True)
                sums.append(u["sum"])
                if spec.kind != "mean":
                    u["sq"] = quantize_spec(f"s{len(sums)}", spec.column, lower, upper, centered=True, square=True)
                    sums.append(u["sq"])
            else:  # quantile: cell counts over a candidate grid from the bounds, inside the engine
                u["values"] = len(values)
                values.append(ValueSpec(spec.column, lower, upper, quantile_grid(lower, upper)))
        uses[i] = u
    allowed = _allowed(t, built)
    if built.keys is not None:
        allowed = [tuple(dict.fromkeys(k[j] for k in built.keys)) for j in range(len(built.groups))]
    plan = AggregationPlan(
        unit=t.unit,
        where=built.predicate,
        groups=built.groups,
        key_filter=tuple(allowed),
        max_groups=built.max_groups if built.groups else 1,
        max_rows=built.max_rows,
        sums=tuple(sums),
        values=tuple(values),
        salt=salt,
        portable=t.portable,
        join=t.join,
    )
    return plan, uses


# -- mechanisms ----------------------------------------------------------------------------------------


def unit_bounds(t: DeclaredTable, plan: AggregationPlan, grouped: bool) -> tuple[int, int, int, int]:
    """(G, R, ℓ1, ℓ2²): the most groups one privacy unit reaches, its most rows in one group, and
    the ℓ1 norm and squared ℓ2 norm of its row counts over the groups.

    With contribution bounds alone, G = max_groups and R = max_rows, so ℓ1 = G·R and ℓ2² = G·R².
    A joined table also bounds a unit's rows in all by T = ``max_unit_rows``
    (:mod:`dpkit.analytics.joins`); then G, R ≤ T, ℓ1 ≤ T and ℓ2² = Σ r_g² ≤ (max r_g)·Σ r_g ≤ R·T.
    On a row-level table nothing is capped: a row is one row (T = 1), or, joined to public
    tables, at most T rows, in as many groups."""
    T = t.max_unit_rows
    if t.unit is None:
        T = 1 if T is None else T
        G, R = (T if grouped else 1), T
    else:
        G, R = plan.max_groups, plan.max_rows
    if T is None:
        return G, R, G * R, G * R * R
    G, R = min(G, T), min(R, T)
    return G, R, min(G * R, T), min(G * R * R, T * R)


def _delta_shares(aggregates: Sequence[A.Aggregate], options: QueryOptions, private: bool) -> dict[Any, float]:
    users: list[Any] = []
    if private:
        users.append("selection")
    if options.noise == "gaussian":
        users += [i for i, s in enumerate(aggregates) if s.kind != "quantile"]
    if users and options.delta == 0:
        raise InvalidParameterError("delta", options.delta, "a number in (0, 1) with noise='gaussian'")
    each = (
        to_float_down(Fraction(options.delta) / len(users)) if users else 0.0
    )  # the shares never add up to more than δ
    return {u: each for u in users}


def _epsilon_shares(options: QueryOptions, split: tuple[float, ...]) -> tuple[Fraction, ...]:
    """Each part's exact share of the query's ε, read at its decimal value (as the user wrote it,
    ``decimal_fraction``): the shares add up to exactly ε, and each mechanism is then handed a
    double whose decimal value is at most its share (``to_decimal_down``), so the query never costs
    more than ε and ten queries of ε = 0.1 fit a budget of 1."""
    total = decimal_fraction(options.epsilon)
    if options.split is None:
        return tuple(total / len(split) for _ in split)
    weights = [decimal_fraction(w) for w in options.split]
    whole = sum(weights, Fraction(0))
    return tuple(total * w / whole for w in weights)


def _mechanism(t: DeclaredTable, options: QueryOptions, eps: float, delta: float, l1: int, l2: float) -> Any:
    if options.noise == "laplace":
        return Geometric(epsilon=eps, sensitivity=int(l1), neighbours=t.neighbours)
    return Gaussian(epsilon=eps, delta=delta, sensitivity=l2, neighbours=t.neighbours)


def _price(
    t: DeclaredTable,
    built: Built,
    aggregates: tuple[A.Aggregate, ...],
    options: QueryOptions,
    split: tuple[float, ...],
    private: bool,
    text: str,
    plan: AggregationPlan,
    uses: dict[int, dict[str, Any]],
) -> Priced:
    """Build every mechanism and the query's composed event — no data, no randomness."""
    G, R, rows_l1, rows_l2sq = unit_bounds(t, plan, bool(built.groups))
    twice = 2 if t.neighbours == "replace" else 1
    fan_out = G * twice if built.groups else 1
    deltas = _delta_shares(aggregates, options, private)
    pending: list[tuple[int, str, Any]] = []
    events: list[DPEvent] = []
    shares = _epsilon_shares(options, split)
    sel_eps = to_decimal_down(shares[-1]) if private else 0.0
    sel_delta = deltas.get("selection", 0.0)
    if private:
        events.append(ApproxDPEvent(epsilon=sel_eps, delta=sel_delta, neighbours=t.neighbours))
    for i, spec in enumerate(aggregates):
        eps_i = shares[i]
        dl = deltas.get(i, 0.0)
        kind = spec.kind
        u = uses[i]
        if kind == "quantile":
            eps_group = to_decimal_down(eps_i / fan_out)
            assert isinstance(spec, A.QuantileAgg) and spec.column is not None
            eps_row = to_decimal_down(decimal_fraction(eps_group) / R)  # R rows of a unit cost at most eps_group
            cells = plan.values[u["values"]]
            mech = CandidateQuantile(epsilon=eps_row, q=spec.q, candidates=cells.candidates, neighbours=t.neighbours)
            ev: DPEvent = ExponentialEvent(epsilon=eps_group, neighbours=t.neighbours)
            ev = SelfComposedEvent(ev, fan_out) if fan_out > 1 else ev
            events.append(ev)
            pending.append((i, "quantile", (mech, ev)))
            continue
        parts: list[tuple[str, str, int, int]] = []  # (label, frame column, ℓ1 per unit, ℓ2² per unit) in integer units
        if kind == "count":
            parts.append(("count", "rows", rows_l1, rows_l2sq))
        elif kind == "count_units":
            # (row-level data counts rows as units: a row joined to several public rows is several)
            parts.append(("units", "units", G, G) if t.unit is not None else ("units", "units", rows_l1, rows_l2sq))
        else:
            s_spec: SumSpec = u["sum"]
            smax = s_spec.max_summand
            if kind == "sum":
                parts.append(("sum", s_spec.name, rows_l1 * smax, rows_l2sq * smax**2))
            else:
                parts.append(("n", s_spec.name + "_n", rows_l1, rows_l2sq))
                parts.append(("sum", s_spec.name, rows_l1 * smax, rows_l2sq * smax**2))
                if "sq" in u:
                    qmax = u["sq"].max_summand
                    parts.append(("sq", u["sq"].name, rows_l1 * qmax, rows_l2sq * qmax**2))
        share = len(parts)
        mechs = []
        for label, col, l1, l2sq in parts:
            mech_p = _mechanism(
                t,
                options,
                to_decimal_down(eps_i / share),
                to_float_down(Fraction(dl) / share),
                l1 * twice,
                math.sqrt(l2sq) * twice,
            )
            events.append(mech_p.event)
            mechs.append((label, col, mech_p, l1 * twice, math.sqrt(l2sq) * twice))
        pending.append((i, "noisy", mechs))
    # The estimate of what bounding left out, when asked for: in the same event, paid in the same debit.
    report = bounding_report(plan, bool(built.groups), G, R, options.bounding_epsilon, t.neighbours, rows_l1)
    events.extend(report.events)
    event: DPEvent = events[0] if len(events) == 1 else ComposedEvent(tuple(events))
    total_delta = sel_delta + sum(d for k, d in deltas.items() if k != "selection")
    selector = None
    if private:  # its tables are built (and its parameters refused) before the debit
        selector = key_selector(
            epsilon=sel_eps, delta=sel_delta, fan_out=fan_out, strategy=options.key_selection, neighbours=t.neighbours
        )
    # refuses an answer over max_response_bytes, before paying
    sizes = _sizes(t, built, aggregates, private, event, report.json_bytes())
    return Priced(
        t,
        built,
        aggregates,
        options,
        split,
        private,
        text,
        plan,
        uses,
        event,
        total_delta,
        pending,
        deltas,
        sel_eps,
        sel_delta,
        fan_out,
        G,
        R,
        selector,
        sizes,
        report,
    )


# -- the answer's size -------------------------------------------------------------------------------


@functools.lru_cache(maxsize=256)
def _category_bytes(spec: Categorical) -> int:
    """The longest JSON text of one of a column's declared categories (metadata only)."""
    assert spec.categories is not None
    if spec.value_type == "boolean":
        return JSON_BOOLEAN_BYTES
    if spec.value_type == "integer":
        return JSON_NUMBER_BYTES  # within ±2**53, even when read back as a double
    return int(json_text_bounds(pd.Series(spec.categories, dtype=object)).max())


def _bin_label_bytes(edges: Sequence[float]) -> int:
    """The longest JSON text of a bin label ``"[a, b)"`` (the edges are the request's own and
    number at most max_keys + 1 by now)."""
    widest = max(len(f"{e:g}") for e in edges)
    return min(2 * widest + 6, JSON_BIN_LABEL_BYTES)


def _literal_bytes(values: Sequence[Any]) -> int:
    """The longest JSON text of explicit key values (the analyst's own request)."""
    texts = [x for x in values if isinstance(x, str)]
    out = JSON_NULL_BYTES
    if texts:
        out = max(out, int(json_text_bounds(pd.Series(texts, dtype=object)).max()))
    if any(isinstance(x, bool) for x in values):
        out = max(out, JSON_BOOLEAN_BYTES)
    for x in values:
        if isinstance(x, (int, float)) and not isinstance(x, bool):
            out = max(out, JSON_NUMBER_BYTES if isinstance(x, float) or abs(x) < 10**20 else len(str(x)))
    return out


def _sizes(
    t: DeclaredTable,
    built: Built,
    aggregates: Sequence[A.Aggregate],
    private: bool,
    event: DPEvent,
    bounding: int = 0,
) -> Sizes:
    """An upper bound on the answer's JSON size from the request and the metadata (see
    :mod:`dpkit.analytics.limits`); refuses, before paying, an answer that cannot fit
    ``max_response_bytes`` — with public keys, all of it; with private keys, one row."""
    limits = t.limits
    meta = t.metadata
    texts: list[int] = []  # released key columns whose text length is not declared
    row = 4  # braces, and the separator before the next record
    for j, g in enumerate(built.groups):
        spec = meta.columns.get(g.column)
        row += json_text_bound(g.column) + 4  # "name": and the separator
        if g.edges is not None:
            row += _bin_label_bytes(g.edges)
        elif built.keys is not None:
            row += _literal_bytes([k[j] for k in built.keys])
        elif isinstance(spec, Categorical) and spec.categories is not None:
            row += max(_category_bytes(spec), JSON_NULL_BYTES)
        elif isinstance(spec, Categorical) and spec.value_type == "string":
            texts.append(j)  # counted per released key, after the release (see execute's cut)
        elif isinstance(spec, Categorical) and spec.value_type == "boolean":
            row += JSON_BOOLEAN_BYTES
        else:
            row += JSON_NUMBER_BYTES
    names = [cast(str, agg.name) for agg in aggregates]  # set to the default when not given
    for name, agg in zip(names, aggregates, strict=True):
        for suffix in ("", "_low", "_high"):
            row += json_text_bound(name + suffix) + 4 + JSON_NUMBER_BYTES
        if agg.kind in ("mean", "var", "std"):  # the row's own scale, in the aggregate's "scales"
            row += JSON_NUMBER_BYTES + 2
    # Everything around the rows: the aggregates' descriptions, the event, the notes, the
    # privacy unit and the fixed fields, with room for a caller's envelope (a service adds
    # the dataset's name, the cost and the budget). The event counts twice: whole, and split
    # into each aggregate's part of it (their wrappers are within the aggregates' 512 bytes).
    overhead = 4096 + 2 * len(json.dumps(event_to_dict(event)))
    overhead += bounding  # what bounding did, said in words and fields (analytics.bounding)
    overhead += sum(
        512 + 2 * json_text_bound(name) + json_text_bound(agg.column or "")
        for name, agg in zip(names, aggregates, strict=True)
    )
    overhead += sum(json_text_bound(g.column) for g in built.groups) + 2 * json_text_bound(t.unit or "")
    if not private:
        rows = _row_count(t, built)
        limits.check("response bytes", overhead + rows * row, "max_response_bytes")
        return Sizes(row, tuple(texts), overhead, rows)
    smallest = row + JSON_NULL_BYTES * len(texts)  # one row, its text keys at their shortest
    limits.check("response bytes", overhead + smallest, "max_response_bytes")
    fits = (limits.max_response_bytes - overhead) // row
    return Sizes(row, tuple(texts), overhead, min(limits.max_result_rows, fits))
