"""Executing a priced query: debit first, then the engine, the noise and the release.

:func:`execute` takes a :class:`~dpkit.analytics.pricing.Priced` query and

1. draws the salt of the bounding priorities (randomness, not data, so drawing it first is free);
2. debits the query's event through the payer — a refusal raises here, before the engine has
   touched a row, so neither its content nor its timing depends on the data;
3. runs the engine (filter, contribution bounding, exact integer sums), selects keys privately
   when they are not public, adds the noise and builds the
   :class:`~dpkit.analytics.results.QueryResult`.

Every step after the debit is total: if anything still fails, the debit stands and the analyst
gets one :class:`~dpkit.errors.QueryFailedError` whose message names nothing (the details go to
the ``dpkit.curator`` log). Noise is added on the integer grid (discrete Laplace / discrete
Gaussian, Canonne, Kamath & Steinke 2020), so the floating-point attack of Mironov 2012 does not
apply.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, replace
from typing import Any, Protocol

import numpy as np
import pandas as pd

from dpkit.accounting.events import ComposedEvent, DPEvent
from dpkit.analytics import aggregates as A
from dpkit.analytics.bounding import check_bounding_engine
from dpkit.analytics.engines.base import EXACT_INTEGER_LIMIT, Engine
from dpkit.analytics.limits import json_text_bounds
from dpkit.analytics.plan import AggregationPlan, SumSpec
from dpkit.analytics.pricing import Priced, Sizes
from dpkit.analytics.results import AggregateInfo, QueryResult
from dpkit.errors import LedgerError, QueryFailedError
from dpkit.mechanisms.candidate_quantile import CandidateQuantile
from dpkit.mechanisms.laplace import Geometric
from dpkit.noise.integers import uniform_below
from dpkit.noise.source import RNG, RandomSource, is_seeded, resolve_rng

__all__ = ["Payer", "execute"]

#: Where the details of a query that failed after its debit go: the curator's log, never the analyst.
_curator_log = logging.getLogger("dpkit.curator")


class Payer(Protocol):
    """Where a query pays: an in-memory budget or a ledger entry."""

    def pay(self, event: DPEvent, epsilon: float, delta: float, text: str) -> int | None:
        """Debit ``event`` atomically (BudgetExceededError, recording nothing, if refused); the
        ledger's spend id, or None for an in-memory budget."""

    @property
    def remaining(self) -> float:
        """ε left after the debit (may raise LedgerError)."""


@dataclass(frozen=True)
class _Noisy:
    """One noisy integer quantity: the noisy values (integer units), its half-width at the
    requested confidence share, its scale and sensitivity (integer units), the variance of its
    noise (integer units squared) and its event."""

    values: np.ndarray
    halfwidth: float
    scale: float
    sensitivity: float
    event: DPEvent
    variance: float


@dataclass(frozen=True)
class _Finished:
    """One aggregate in value units: values and interval ends per row, the scale reported for it
    (see :class:`~dpkit.analytics.results.AggregateInfo`), the sensitivity, the approximate
    standard deviation of each row's noise (ratios only, else None) and each noisy part's scale."""

    value: Any
    low: Any
    high: Any
    scale: float
    sensitivity: float
    sd: np.ndarray | None
    noise_scales: tuple[tuple[str, float], ...]


#: The public name of each noisy part (``AggregateInfo.noise_scales``).
_PART_NAMES = {"count": "count", "units": "count_units", "n": "count", "sum": "sum", "sq": "sum_of_squares"}


def execute(priced: Priced, engine: Engine, payer: Payer, rng: RNG) -> QueryResult:
    """Pay for ``priced``, then compute and release it (see the module docstring)."""
    src = resolve_rng(rng)
    # The salt keys the bounding priorities: randomness, not data, so drawing it first is free.
    plan = replace(priced.plan, salt=int(uniform_below(2**62, 1, rng=src)[0]))
    check_bounding_engine(priced.bounding, engine)  # an estimate this engine cannot count: refused unpaid
    # ---- pay: a refusal raises here, before the engine has touched a row ----
    spend_id = payer.pay(priced.event, priced.epsilon, priced.delta, priced.text)
    # ---- compute and release: total functions; any failure keeps the debit, says nothing ----
    try:
        return _release_all(priced, plan, engine, payer, src, rng, spend_id)
    except Exception:
        _curator_log.exception("query %r failed after its debit (spend %s)", priced.text, spend_id)
        raise QueryFailedError(spend_id) from None


def _release_all(
    p: Priced, plan: AggregationPlan, engine: Engine, payer: Payer, src: RandomSource, rng: RNG, spend_id: int | None
) -> QueryResult:
    t, built, opts = p.table, p.built, p.options
    computed, cells = engine.compute(plan)  # one bounding pass: aggregates and quantile cell counts
    frame = _keyed(p, computed)
    beta = 1.0 - opts.confidence
    keys_mode = "none"
    truncated = False
    released = 0
    if p.selector is not None:
        keep = p.selector.select(frame["units"].to_numpy(), rng=src)
        frame = frame.loc[keep].reset_index(drop=True)
        released = len(frame)
        # Cut before the values are noised (each row's noise is calibrated to the same
        # sensitivity whatever the number of rows); which rows stay depends on the released
        # keys only, so the cut is post-processing of the selection.
        frame, truncated = _cut(p, frame, p.sizes)
        keys_mode = opts.key_selection
    elif built.groups:
        keys_mode = "public"
    # The answer's columns are gathered first and framed once (a column set on a DataFrame
    # one at a time costs more than the whole release of a small answer).
    out: dict[str, Any] = {g.column: frame[f"g{j}"].reset_index(drop=True) for j, g in enumerate(built.groups)}
    for j, g in enumerate(built.groups):
        if g.edges is not None:
            labels = [
                f"[{g.edges[k]:g}, {g.edges[k + 1]:g}{']' if k == len(g.edges) - 2 else ')'}"
                for k in range(len(g.edges) - 1)
            ]
            out[g.column] = [labels[int(k)] for k in frame[f"g{j}"]]
    infos = []
    for i, what, payload in p.pending:
        spec = p.aggregates[i]
        name: str = spec.name  # type: ignore[assignment]
        eps_i = opts.epsilon * p.split[i]
        if what == "quantile":
            mech_q, ev_q = payload
            est = _quantiles(p, mech_q, frame, cells, p.uses[i]["values"], src)
            out[name], out[f"{name}_low"], out[f"{name}_high"] = est, np.nan, np.nan
            # Its accuracy: a rank error bound from ε, q and the grid alone (free, data-independent).
            rank = mech_q.rank_error(opts.confidence)
            infos.append(
                AggregateInfo(
                    name, spec.kind, spec.column, eps_i, 0.0, "exponential", math.nan, math.nan, ev_q, rank_error=rank
                )
            )
            continue
        noisy = {}
        beta_each = beta / len(payload)
        for label, col, mech, _l1, _l2 in payload:
            noisy[label] = _release(mech, frame[col].to_numpy(), beta_each, src)
        done = _finish(p, spec, p.uses[i], noisy)
        out[name], out[f"{name}_low"], out[f"{name}_high"] = done.value, done.low, done.high
        mech_name = "gaussian" if opts.noise == "gaussian" else "laplace"
        infos.append(
            AggregateInfo(
                name,
                spec.kind,
                spec.column,
                eps_i,
                p.deltas.get(i, 0.0),
                mech_name,
                done.scale,
                done.sensitivity,
                ComposedEvent(tuple(m[2].event for m in payload)) if len(payload) > 1 else payload[0][2].event,
                noise_scales=done.noise_scales,
                scales=() if done.sd is None else tuple(done.sd.tolist()),
            )
        )
    table = pd.DataFrame(out, index=pd.RangeIndex(len(frame)))
    notes = []
    if p.selector is not None:
        notes.append(
            f"keys selected privately ({opts.key_selection}, ε={p.sel_eps:.6g}, δ={p.sel_delta:.3g}); {released} of the groups released"
        )
    if truncated:
        limits = t.limits
        notes.append(
            f"TRUNCATED: the first {len(table)} of the {released} released groups in key order are shown "
            f"(max_result_rows={limits.max_result_rows}, max_response_bytes={limits.max_response_bytes})"
        )
    notes.extend(_quantile_notes(p.aggregates, infos, table, opts.confidence))
    groups_bound = p.G if built.groups else 1
    if t.unit is not None:
        notes.append(
            f"privacy unit: {t.unit}; each contributes at most {groups_bound} group(s) and {p.R} row(s) per group"
        )
    else:
        notes.append("privacy unit: a row (declared: every row is a different person)")
    seeded = is_seeded(rng)
    if seeded:
        notes.append("SEEDED randomness: reproducible and NOT private (tests and teaching only)")
    # What bounding did: always said; estimated, with its own noise, only when paid for.
    bounding = p.bounding.release(engine, plan, opts.confidence, src)
    try:
        remaining = payer.remaining
    except LedgerError:
        remaining = None
    return QueryResult(
        table=table,
        aggregates=tuple(infos),
        groups=tuple(g.column for g in built.groups),
        epsilon=p.epsilon,
        delta=p.delta,
        event=p.event,
        confidence=opts.confidence,
        keys=keys_mode,
        remaining_epsilon=remaining,
        spend_id=spend_id,
        notes=tuple(notes),
        privacy_unit=t.unit,
        max_groups=groups_bound,  # G = R = 1 without a unit column (see pricing)
        max_rows=p.R,
        neighbours=t.neighbours,
        seeded=seeded,
        truncated=truncated,
        bounding=bounding,
    )


def _cut(p: Priced, frame: pd.DataFrame, sizes: Sizes) -> tuple[pd.DataFrame, bool]:
    """Privately selected rows cut to the limits: the first rows in key order (the frame is
    sorted by key) whose encoded size fits. Post-processing: which rows stay depends on the
    released keys only."""
    limits = p.table.limits
    n = min(len(frame), sizes.max_rows)
    if sizes.texts and n:
        per_row = np.full(n, sizes.row, dtype=np.int64)
        for j in sizes.texts:
            per_row += json_text_bounds(frame[f"g{j}"].iloc[:n])
        n = int(np.searchsorted(np.cumsum(per_row), limits.max_response_bytes - sizes.overhead, side="right"))
    if n == len(frame):
        return frame, False
    return frame.iloc[:n].reset_index(drop=True), True


def _release(mech: Any, ints: np.ndarray, beta: float, src: RandomSource) -> _Noisy:
    ints = np.asarray(ints, dtype=np.int64)
    if isinstance(mech, Geometric):
        noisy = mech.release(ints, rng=src) if ints.size else np.zeros(0, dtype=np.int64)
        half = float(mech.error_bound(beta) - 1)
        t = mech.scale
        return _Noisy(
            np.asarray(noisy, dtype=np.float64),
            half,
            t,
            float(mech.sensitivity),
            mech.event,
            _discrete_laplace_variance(t),
        )
    # exact doubles only: clamping is 1-Lipschitz, so the sensitivity is unchanged
    ints = np.clip(ints, -EXACT_INTEGER_LIMIT, EXACT_INTEGER_LIMIT)
    noisy = mech.release(ints.astype(np.float64), rng=src) if ints.size else np.zeros(0)
    half = mech.error_bound(beta, size=max(ints.size, 1))
    sigma = mech.noise_plan(max(ints.size, 1)).sigma
    # A discrete Gaussian with parameter σ has variance below σ² (CKS 2020, Prop. 19).
    return _Noisy(np.asarray(noisy, dtype=np.float64), half, sigma, mech.sensitivity, mech.event, sigma * sigma)


def _discrete_laplace_variance(t: float) -> float:
    """The variance of the discrete Laplace noise P(Y = y) ∝ e^{−|y|/t}: 2p/(1 − p)² with
    p = e^{−1/t} (about 2t², the continuous Laplace's, for t ≫ 1)."""
    q = -math.expm1(-1.0 / t)  # 1 − p, without cancellation for large t
    return 2.0 * (1.0 - q) / (q * q)


def _finish(p: Priced, spec: A.Aggregate, u: dict[str, Any], noisy: dict[str, _Noisy]) -> _Finished:
    """Values and interval ends (value units) from the noisy integer parts.

    A ratio's (mean, variance, std) interval combines its parts' intervals, each at confidence
    1 − β/k for its k parts (a union bound, see ``_release_all``): the extreme ratios over the
    parts' intervals, or the whole declared range when the count's interval reaches below 1. Its
    scale is the approximate standard deviation of its noise (``_mean_sd``, ``_variance_sd``),
    from the noisy parts alone: post-processing."""
    if spec.kind in ("count", "count_units"):
        label = "count" if spec.kind == "count" else "units"
        part = noisy[label]
        val = part.values
        return _Finished(
            val,
            val - part.halfwidth,
            val + part.halfwidth,
            part.scale,
            part.sensitivity,
            None,
            ((_PART_NAMES[label], part.scale),),
        )
    s_spec: SumSpec = u["sum"]
    unit = s_spec.unit
    s = noisy["sum"]
    if spec.kind == "sum":
        val = s.values * unit
        return _Finished(
            val,
            val - s.halfwidth * unit,
            val + s.halfwidth * unit,
            s.scale * unit,
            s.sensitivity * unit,
            None,
            (("sum", s.scale * unit),),
        )
    lo, hi = p.bounds(s_spec.column)
    m = s_spec.center
    half_range = (hi - lo) / 2
    n = noisy["n"]
    n_hat = np.maximum(n.values, 1.0)
    n_lo, n_hi = n.values - n.halfwidth, n.values + n.halfwidth
    ok = n_lo >= 1.0
    n_lo_c = np.where(ok, n_lo, 1.0)
    n_hi = np.maximum(n_hi, 1.0)  # only read where ok (then n_hi >= n_lo >= 1)
    s_hat, s_lo, s_hi = s.values * unit, (s.values - s.halfwidth) * unit, (s.values + s.halfwidth) * unit
    e1 = s_hat / n_hat
    e1_lo = np.minimum(s_lo / n_lo_c, s_lo / n_hi)
    e1_hi = np.maximum(s_hi / n_lo_c, s_hi / n_hi)
    mean = np.clip(m + e1, lo, hi)
    d1 = mean - m  # the released mean minus the centre
    var_s = s.variance * unit * unit
    scales = [("count", n.scale), ("sum", s.scale * unit)]
    if spec.kind == "mean":
        val = mean
        low = np.where(ok, np.clip(m + e1_lo, lo, hi), lo)
        high = np.where(ok, np.clip(m + e1_hi, lo, hi), hi)
        sd = _mean_sd(d1, n_hat, var_s, n.variance, half_range)
        return _Finished(val, low, high, _largest(sd), s.sensitivity * unit, sd, tuple(scales))
    sq_spec: SumSpec = u["sq"]
    sq = noisy["sq"]
    usq = sq_spec.unit
    scales.append(("sum_of_squares", sq.scale * usq))
    # Σ (x − m)² ≈ Σ q·usq: the engine's q is in [0, qmax]
    e2 = sq.values * usq / n_hat
    e2_lo = np.minimum((sq.values - sq.halfwidth) * usq / n_lo_c, (sq.values - sq.halfwidth) * usq / n_hi)
    e2_hi = np.maximum((sq.values + sq.halfwidth) * usq / n_lo_c, (sq.values + sq.halfwidth) * usq / n_hi)
    top = half_range**2
    var = np.clip(e2 - e1**2, 0.0, top)
    sq1_lo = np.where((e1_lo <= 0) & (e1_hi >= 0), 0.0, np.minimum(e1_lo**2, e1_hi**2))
    sq1_hi = np.maximum(e1_lo**2, e1_hi**2)
    v_lo = np.where(ok, np.clip(e2_lo - sq1_hi, 0.0, top), 0.0)
    v_hi = np.where(ok, np.clip(e2_hi - sq1_lo, 0.0, top), top)
    sd_var = _variance_sd(d1, np.clip(e2, 0.0, top), n_hat, sq.variance * usq * usq, var_s, n.variance, top)
    if spec.kind == "std":
        # d√v/dv = 1/(2√v), with v floored at sd_var: near v = 0 the std's noise is about √sd_var / 2
        sd = np.minimum(sd_var / (2.0 * np.sqrt(np.maximum(np.maximum(var, sd_var), 1e-300))), half_range / 2)
        return _Finished(
            np.sqrt(var), np.sqrt(v_lo), np.sqrt(v_hi), _largest(sd), sq.sensitivity * usq, sd, tuple(scales)
        )
    return _Finished(var, v_lo, v_hi, _largest(sd_var), sq.sensitivity * usq, sd_var, tuple(scales))


def _mean_sd(d: np.ndarray, n_hat: np.ndarray, var_sum: float, var_count: float, half_range: float) -> np.ndarray:
    """The approximate standard deviation of the noise of a released mean m + Ŝ/ĉ, by the delta
    method on the independent noises of the sum (variance ``var_sum``) and of the count
    (``var_count``): √(var_sum + d²·var_count) / ĉ, with ĉ the noisy count floored at 1 and d
    the released mean minus the centre m. At most half the declared range: the released mean
    lies within the bounds. Reads the noisy values only (post-processing)."""
    return np.minimum(np.sqrt(var_sum + d * d * var_count) / n_hat, half_range)


def _variance_sd(
    d: np.ndarray,
    e2: np.ndarray,
    n_hat: np.ndarray,
    var_sq: float,
    var_sum: float,
    var_count: float,
    top: float,
) -> np.ndarray:
    """The approximate standard deviation of the noise of a released variance Q̂/ĉ − (Ŝ/ĉ)², by
    the delta method (gradient (1, −2d, 2d² − e2)/ĉ in (Q, S, c)), with d = Ŝ/ĉ and e2 = Q̂/ĉ as
    released (clipped to their ranges); at most ``top``/2, the variance lying in [0, top]."""
    g_count = 2.0 * d * d - e2
    return np.minimum(np.sqrt(var_sq + 4.0 * d * d * var_sum + g_count * g_count * var_count) / n_hat, top / 2)


def _largest(sd: np.ndarray) -> float:
    """The scale an aggregate reports for all its rows: the largest row's (NaN without rows)."""
    return float(np.max(sd)) if sd.size else math.nan


def _quantiles(
    p: Priced, mech: CandidateQuantile, frame: pd.DataFrame, cells: pd.DataFrame | None, k: int, src: RandomSource
) -> np.ndarray:
    """One draw per released group (an empty group too: all its counts are 0), from the engine's
    cell counts of value spec k: #{x < c_j} is the count in cells below 2j, #{x > c_j} above it."""
    assert cells is not None
    spec = p.plan.values[k]
    size = 2 * spec.cells + 1
    gcols = [f"g{j}" for j in range(len(p.built.groups))]
    mine = cells[cells["__k"].to_numpy() == k]
    empty = np.zeros(size, dtype=np.int64)

    def dense(part: pd.DataFrame) -> np.ndarray:
        counts = np.zeros(size, dtype=np.int64)
        np.add.at(counts, part["__cell"].to_numpy(dtype=np.int64), part["rows"].to_numpy(dtype=np.int64))
        return counts

    if not gcols:
        return np.array([_quantile_one(mech, dense(mine), src)])
    groups = {
        key if isinstance(key, tuple) else (key,): dense(g) for key, g in mine.groupby(gcols, dropna=False, sort=False)
    }
    out = np.empty(len(frame))
    for r, key in enumerate(frame[gcols].itertuples(index=False, name=None)):  # one draw per released group
        out[r] = _quantile_one(mech, groups.get(tuple(key), empty), src)
    return out


def _quantile_notes(
    specs: tuple[A.Aggregate, ...], infos: list[AggregateInfo], table: pd.DataFrame, confidence: float
) -> list[str]:
    """One note per quantile: its rank error bound k (rows) and what it means for the groups.

    With a COUNT(*) in the same result, each group's noisy count n̂ (at least 1) turns k into a
    quantile level q ± k/n̂, and a WARNING says in how many groups k >= n̂/2: there the bound allows
    any value between the declared bounds. Without one, the note gives the group size below which
    the bound says little. Post-processing of released values only: no data, no budget."""
    counts = next((table[a.name].to_numpy(dtype=np.float64) for a in infos if a.kind == "count"), None)
    levels = {s.name: s.q for s in specs if isinstance(s, A.QuantileAgg)}
    notes = []
    for a in infos:
        if a.name not in levels:
            continue
        k = a.rank_error
        head = (
            f"{a.name}: rank error at most {k:.1f} rows with {confidence:.4g} confidence in each group "
            "(beyond the grid step holding the quantile)"
        )
        if counts is None or counts.size == 0:
            notes.append(f"{head}; it says little about a group of fewer than {2 * k:.0f} rows (COUNT(*) tells)")
            continue
        band = k / np.maximum(counts, 1.0)
        wide = band >= 0.5
        parts = [head]
        if wide.any():
            parts.append(
                f"in {int(wide.sum())} of {counts.size} group(s) k is at least half the noisy count: "
                "there the released value may lie anywhere between the declared bounds"
            )
        if not wide.all():
            lo, hi = float(band[~wide].min()), float(band[~wide].max())
            span = f"±{hi:.2g}" if f"{lo:.2g}" == f"{hi:.2g}" else f"±{lo:.2g} to ±{hi:.2g}"
            where = "in the other groups" if wide.any() else "in each group"
            parts.append(f"{where} a quantile level of {levels[a.name]:g} {span} by the noisy counts")
        notes.append(("WARNING: " if wide.any() else "") + "; ".join(parts))
    return notes


def _quantile_one(mech: CandidateQuantile, counts: np.ndarray, src: RandomSource) -> float:
    cum = np.cumsum(counts)
    total = int(cum[-1])
    below = np.concatenate([[0], cum[1::2]])  # cells 0 … 2j − 1
    above = total - cum[0::2]  # cells 2j + 1 …
    return mech.release_counts(below, above, rng=src)


def _keyed(p: Priced, frame: pd.DataFrame) -> pd.DataFrame:
    """With public keys: exactly one row per key, in the declared order (zeros where the data
    has none). Without: the observed groups, sorted."""
    gcols = [f"g{j}" for j in range(len(p.built.groups))]
    if not gcols:
        return frame.reset_index(drop=True)
    if p.private:
        return frame.sort_values(gcols, na_position="last", kind="stable").reset_index(drop=True)
    keys = pd.DataFrame(list(p.public_keys()), columns=gcols)
    for c in gcols:  # align dtypes so the merge matches values, not representations
        if frame[c].dtype.kind in "iuf" and keys[c].dtype.kind in "iuf":
            keys[c] = (
                keys[c].astype(frame[c].dtype) if frame[c].dtype.kind == "f" or keys[c].dtype.kind != "f" else keys[c]
            )
        elif frame[c].dtype != keys[c].dtype:
            frame = frame.astype({c: object})
            keys[c] = keys[c].astype(object)
    merged = keys.merge(frame, on=gcols, how="left", sort=False)
    value_cols = [c for c in merged.columns if c not in gcols]
    merged[value_cols] = merged[value_cols].fillna(0).astype("int64")
    return merged
