"""Black-box empirical lower bounds on the ε of a mechanism.

An audit runs a mechanism many times on two neighbouring inputs and looks for an output event
``E`` whose probability differs more than ε allows. (ε, δ)-DP promises, for every event ``E``,

    P[M(x0) ∈ E] ≤ e^ε · P[M(x1) ∈ E] + δ     (and the same with x0 and x1 swapped),

so any pair of probability bounds for one fixed event gives ε ≥ ln((P_a − δ) / P_b). The estimator
here follows the hypothesis-testing audits of Ding et al. (2018) and Jagielski et al. (2020):

1. draw ``trials`` outputs from each input;
2. on the *first half* of each sample, choose the candidate event (and direction) that looks most
   damning;
3. on the *second half* only, bound that one event's probabilities with one-sided Clopper–Pearson
   intervals (Bonferroni: each at level (1 − confidence) / 2) and report
   ``ln((lower_a − δ) / upper_b)``, clipped at 0.

Because the event is fixed before the second half is looked at, the reported number exceeds the
mechanism's true ε (for this pair of inputs) with probability at most ``1 − confidence``, however
many candidate events were tried.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from numbers import Integral
from typing import Any, Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

from dpkit import _validate
from dpkit.errors import InvalidDataError, InvalidParameterError


def _beta() -> Any:
    """scipy's beta distribution, imported on first use: scipy.stats takes about half a second to
    import (it loads scipy.optimize), which `import dpkit.audit` should not pay."""
    from scipy.stats import beta

    return beta


__all__ = ["AuditResult", "estimate_epsilon"]

EventFamily = Literal["auto", "values", "thresholds", "bins"]
EVENT_FAMILIES: tuple[str, ...] = ("auto", "values", "thresholds", "bins")

#: Largest number of outputs requested from the sampler in one call (bounds its memory use).
MAX_CHUNK = 1_000_000
#: In ``events="auto"``, integer outputs with at most this many distinct values use ``"values"``.
MAX_DISTINCT_VALUES = 1000

Sampler = Callable[[Any, int, np.random.Generator], ArrayLike]

# Kinds of interval endpoint.
_UNBOUNDED, _CLOSED, _OPEN = 0, 1, 2


@dataclass(frozen=True)
class AuditResult:
    """The outcome of :func:`estimate_epsilon`.

    Attributes:
        epsilon_lower: the empirical lower bound on ε (≥ 0; 0 means no evidence of privacy loss).
        event: the witness event, human readable (``Y`` is the mechanism's output).
        p0: the event's frequency under ``input0`` on the held-out half.
        p1: the event's frequency under ``input1`` on the held-out half.
        trials: samples drawn per input (half chose the event, half bounded it).
        confidence: the probability with which ``epsilon_lower`` does not exceed the true ε.
        delta: the δ the bound was computed for.
    """

    epsilon_lower: float
    event: str
    p0: float
    p1: float
    trials: int
    confidence: float
    delta: float = 0.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.epsilon_lower) and self.epsilon_lower >= 0):
            raise InvalidParameterError("epsilon_lower", self.epsilon_lower, "a finite number >= 0")
        _validate.probability(self.p0, "p0", low_open=False, high_open=False)
        _validate.probability(self.p1, "p1", low_open=False, high_open=False)
        _validate.positive_int(self.trials, "trials")
        _validate.probability(self.confidence, "confidence")
        _validate.delta(self.delta)

    def __str__(self) -> str:
        held_out = self.trials - self.trials // 2
        delta = f", δ = {self.delta:g}" if self.delta else ""
        return (
            f"ε ≥ {self.epsilon_lower:.4f} with {self.confidence:.6g} confidence{delta}\n"
            f"  witness event {{{self.event}}}: frequency {self.p0:.6g} under input0, "
            f"{self.p1:.6g} under input1\n"
            f"  {self.trials:,} trials per input ({self.trials // 2:,} chose the event, "
            f"{held_out:,} bounded it)"
        )


@dataclass(frozen=True)
class _Events:
    """A vector of interval events ``lo (<|<=) Y (<|<=) hi``; each endpoint is open, closed or absent."""

    lo: NDArray[Any]
    lo_kind: NDArray[np.int8]
    hi: NDArray[Any]
    hi_kind: NDArray[np.int8]

    def __len__(self) -> int:
        return int(self.lo.shape[0])


def _interval_events(lo: NDArray[Any], lo_kind: int, hi: NDArray[Any], hi_kind: int) -> _Events:
    n = max(lo.shape[0], hi.shape[0])
    lo = np.broadcast_to(lo, (n,))
    hi = np.broadcast_to(hi, (n,))
    return _Events(lo, np.full(n, lo_kind, np.int8), hi, np.full(n, hi_kind, np.int8))


def _concat(parts: list[_Events]) -> _Events:
    return _Events(
        np.concatenate([p.lo for p in parts]),
        np.concatenate([p.lo_kind for p in parts]),
        np.concatenate([p.hi for p in parts]),
        np.concatenate([p.hi_kind for p in parts]),
    )


def _count_sorted(x: NDArray[Any], ev: _Events) -> NDArray[np.int64]:
    """How many entries of the sorted array ``x`` fall in each event (vectorised)."""
    n = x.shape[0]
    lo_left = np.searchsorted(x, ev.lo, side="left")
    lo_right = np.searchsorted(x, ev.lo, side="right")
    hi_left = np.searchsorted(x, ev.hi, side="left")
    hi_right = np.searchsorted(x, ev.hi, side="right")
    start = np.where(ev.lo_kind == _UNBOUNDED, 0, np.where(ev.lo_kind == _CLOSED, lo_left, lo_right))
    stop = np.where(ev.hi_kind == _UNBOUNDED, n, np.where(ev.hi_kind == _CLOSED, hi_right, hi_left))
    return np.maximum(stop - start, 0).astype(np.int64)


def _count_one(x: NDArray[Any], lo: Any, lo_kind: int, hi: Any, hi_kind: int) -> int:
    """How many entries of the (unsorted) array ``x`` fall in one interval event."""
    mask = np.ones(x.shape[0], dtype=bool)
    if lo_kind == _CLOSED:
        mask &= x >= lo
    elif lo_kind == _OPEN:
        mask &= x > lo
    if hi_kind == _CLOSED:
        mask &= x <= hi
    elif hi_kind == _OPEN:
        mask &= x < hi
    return int(np.count_nonzero(mask))


def _cp_lower(k: NDArray[Any], n: int, alpha: float) -> NDArray[np.float64]:
    """One-sided Clopper–Pearson lower bound at level ``alpha`` (P[p < bound] ≤ alpha)."""
    k = np.asarray(k, dtype=np.float64)
    with np.errstate(all="ignore"):
        b = _beta().ppf(alpha, np.maximum(k, 1.0), n - k + 1.0)
    return np.where(k <= 0, 0.0, b)


def _cp_upper(k: NDArray[Any], n: int, alpha: float) -> NDArray[np.float64]:
    """One-sided Clopper–Pearson upper bound at level ``alpha`` (P[p > bound] ≤ alpha)."""
    k = np.asarray(k, dtype=np.float64)
    with np.errstate(all="ignore"):
        b = _beta().ppf(1.0 - alpha, k + 1.0, np.maximum(n - k, 1.0))
    return np.where(k >= n, 1.0, b)


def _log_ratio_bound(k_a: NDArray[Any], k_b: NDArray[Any], n: int, alpha: float, delta: float) -> NDArray[np.float64]:
    """ln((lower_CP(k_a) − δ) / upper_CP(k_b)); −inf where the numerator is not positive."""
    num = _cp_lower(k_a, n, alpha) - delta
    den = _cp_upper(k_b, n, alpha)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.log(num / den)
    return np.where(num > 0, out, -np.inf)


def _check_output(out: object, n: int) -> NDArray[Any]:
    """The sampler's answer as a 1-D numeric array of length ``n``, or an InvalidDataError."""
    accepted = "a 1-D numpy array of n finite numbers (bool, int or float) for sampler(input, n, rng)"
    try:
        arr = np.asarray(out)
    except Exception as exc:  # ragged lists and the like
        raise InvalidDataError("sampler", f"returned something that is not an array ({exc})", accepted) from exc
    if arr.shape != (n,):
        raise InvalidDataError("sampler", f"returned shape {arr.shape} when asked for n={n} outputs", accepted)
    if arr.dtype.kind not in "biuf":
        raise InvalidDataError("sampler", f"returned dtype {arr.dtype}", accepted)
    if arr.dtype.kind == "f" and not np.all(np.isfinite(arr)):
        bad = arr[~np.isfinite(arr)][0]
        raise InvalidDataError("sampler", f"returned a non-finite value ({bad})", accepted)
    return arr


def _draw(
    sampler: Sampler, x: Any, n: int, rng: np.random.Generator, advance: Callable[[int], None]
) -> Iterator[NDArray[Any]]:
    """``n`` outputs for input ``x``, in chunks of at most MAX_CHUNK."""
    done = 0
    while done < n:
        m = min(MAX_CHUNK, n - done)
        yield _check_output(sampler(x, m, rng), m)
        done += m
        advance(m)


def _candidate_events(pooled: NDArray[Any], family: str, bins: int, n_per_input: int) -> tuple[_Events, str]:
    """Candidate events built from the pooled selection half only; returns (events, family)."""
    integer = pooled.dtype.kind in "biu"
    distinct = np.unique(pooled)
    if family == "auto":
        family = "values" if integer and distinct.shape[0] <= MAX_DISTINCT_VALUES else "thresholds"
    parts: list[_Events] = []
    if family == "values":
        parts.append(_interval_events(distinct, _CLOSED, distinct, _CLOSED))  # {Y = v}
        if integer and pooled.dtype.kind != "b":
            parts.append(_interval_events(distinct, _CLOSED, distinct, _UNBOUNDED))  # {Y >= v}
            parts.append(_interval_events(distinct, _UNBOUNDED, distinct, _CLOSED))  # {Y <= v}
    elif family == "thresholds":
        # Quantile levels: a uniform grid in the bulk plus geometric grids into both tails, down to
        # about 10 expected observations, where tail events are still measurable.
        tail = max(10.0 / n_per_input, 1e-9)
        levels = np.linspace(0.01, 0.99, 99)
        if tail < 0.01:
            geo = np.geomspace(tail, 0.01, 30)
            levels = np.concatenate([geo, levels, 1.0 - geo])
        cuts = np.unique(np.quantile(pooled, np.unique(levels), method="inverted_cdf"))
        parts.append(_interval_events(cuts, _OPEN, cuts, _UNBOUNDED))  # {Y > c}
        parts.append(_interval_events(cuts, _UNBOUNDED, cuts, _OPEN))  # {Y < c}
    else:  # "bins": equal-mass histogram bins of the pooled sample, outer bins open-ended
        inner = np.unique(np.quantile(pooled, np.linspace(0.0, 1.0, bins + 1)[1:-1], method="inverted_cdf"))
        if inner.shape[0] == 0:
            inner = distinct[:1]
        parts.append(_interval_events(inner[:1], _UNBOUNDED, inner[:1], _CLOSED))
        parts.append(_interval_events(inner[:-1], _OPEN, inner[1:], _CLOSED))
        parts.append(_interval_events(inner[-1:], _OPEN, inner[-1:], _UNBOUNDED))
    return _concat(parts), family


def _format_value(v: Any, is_bool: bool) -> str:
    if is_bool:
        return str(bool(v))
    if isinstance(v, (np.integer, Integral)):
        return str(int(v))
    return f"{float(v):.6g}"


def _describe(lo: Any, lo_kind: int, hi: Any, hi_kind: int, is_bool: bool) -> str:
    lo_s, hi_s = _format_value(lo, is_bool), _format_value(hi, is_bool)
    if lo_kind == _CLOSED and hi_kind == _CLOSED and lo == hi:
        return f"Y = {lo_s}"
    if lo_kind == _UNBOUNDED and hi_kind == _UNBOUNDED:
        return "any Y"
    if lo_kind == _UNBOUNDED:
        return f"Y {'<=' if hi_kind == _CLOSED else '<'} {hi_s}"
    if hi_kind == _UNBOUNDED:
        return f"Y {'>=' if lo_kind == _CLOSED else '>'} {lo_s}"
    return f"{lo_s} {'<=' if lo_kind == _CLOSED else '<'} Y {'<=' if hi_kind == _CLOSED else '<'} {hi_s}"


@contextlib.contextmanager
def _progress_bar(enabled: bool, total: int) -> Iterator[Callable[[int], None]]:
    if not enabled:
        yield lambda _m: None
        return
    from rich.progress import Progress  # imported only when asked for

    with Progress(transient=True) as bar:
        task = bar.add_task("auditing ε", total=total)
        yield lambda m: bar.advance(task, m)


def estimate_epsilon(
    sampler: Sampler,
    input0: Any,
    input1: Any,
    *,
    trials: int = 200_000,
    delta: float = 0.0,
    confidence: float = 0.99,
    events: EventFamily = "auto",
    bins: int = 64,
    rng: np.random.Generator,
    progress: bool = False,
) -> AuditResult:
    """An empirical *lower* bound on the ε of a black-box mechanism, from two neighbouring inputs.

    A valid audit can only show that a mechanism is **not** private: if the mechanism is
    (ε, δ)-DP on the pair ``(input0, input1)``, then ``epsilon_lower <= ε`` except with probability
    at most ``1 − confidence``. A small ``epsilon_lower`` is *not* evidence of privacy (the
    neighbours may not be the worst case, the candidate events may miss the leak, or ``trials``
    may be too few); a large one is a statistically sound proof of a violation.

    Method (Ding, Wang, Wang, Zhang & Kifer 2018, "Detecting violations of differential
    privacy", CCS; Jagielski, Ullman & Oprea 2020, "Auditing differentially private machine
    learning: how private is private SGD?", NeurIPS): ``trials`` outputs are drawn from each input,
    in chunks of at most 1,000,000 per sampler call. The first half of each sample is used only to
    choose one event ``E`` and a direction (a, b) ∈ {(0, 1), (1, 0)}: among the candidates, the one
    whose bound ``ln((lower(P_a[E]) − δ) / upper(P_b[E]))`` computed on that half is largest (the
    Clopper–Pearson bound is used as the selection score rather than the raw ratio of frequencies,
    which is maximised by rare events seen once and never again, and so wastes the test on events
    too rare to measure). The second half then measures that single event, and the result is

        ε_lower = max(0, ln((lower_CP(P_a[E]) − δ) / upper_CP(P_b[E])))

    with exact one-sided Clopper–Pearson (1934) bounds from the beta distribution, each at level
    (1 − confidence) / 2, so both hold together with probability ≥ ``confidence`` (Bonferroni).
    Selecting on one half and testing on the other removes the bias of picking the best of many
    events on the same data.

    Candidate events (``Y`` is the output; all built from the pooled first halves):

    * ``"values"``: ``{Y = v}`` for every observed value ``v``; for integer outputs also
      ``{Y >= v}`` and ``{Y <= v}``.
    * ``"thresholds"``: ``{Y > c}`` and ``{Y < c}`` for ``c`` at about 160 quantiles of the pooled
      sample (uniform in the bulk, geometric into both tails down to ~10 expected observations).
    * ``"bins"``: the ``bins`` equal-mass histogram bins of the pooled sample (outer bins open).
    * ``"auto"``: ``"values"`` for bool/integer outputs with at most 1000 distinct values,
      ``"thresholds"`` otherwise.

    Args:
        sampler: ``sampler(input, n, rng)`` returns ``n`` outputs of the mechanism run on
            ``input`` as a 1-D array (ints or bools for discrete outputs, floats for continuous),
            using only ``rng`` for randomness.
        input0, input1: two neighbouring inputs, passed to ``sampler`` unchanged.
        trials: samples per input, an integer >= 100.
        delta: the δ of the guarantee being audited, in [0, 1).
        confidence: probability, in (0, 1), that the bound does not exceed the true ε.
        events: the candidate-event family: ``"auto"``, ``"values"``, ``"thresholds"``, ``"bins"``.
        bins: number of histogram bins for ``events="bins"``, an integer >= 2.
        rng: an explicit :class:`numpy.random.Generator`; audits are reproducible experiments, so
            there is no default.
        progress: show a ``rich`` progress bar while sampling.

    Returns:
        An :class:`AuditResult` with the bound, the witness event and its held-out frequencies.

    Raises:
        InvalidParameterError: an argument is outside what is accepted.
        InvalidDataError: the sampler returned something other than ``n`` finite numbers.

    Example:
        A Laplace mechanism with scale 1 on inputs 0 and 1 is exactly 1-DP:

        >>> import numpy as np
        >>> def laplace(x, n, rng):
        ...     return x + rng.laplace(0.0, 1.0, size=n)
        >>> result = estimate_epsilon(laplace, 0.0, 1.0, trials=400_000,
        ...                           rng=np.random.default_rng(7))
        >>> 0.9 < result.epsilon_lower <= 1.0
        True
    """
    if not callable(sampler):
        raise InvalidParameterError("sampler", sampler, "a callable sampler(input, n, rng) -> array of n outputs")
    trials = _validate.positive_int(trials, "trials", minimum=100)
    delta = _validate.delta(delta)
    confidence = _validate.probability(confidence, "confidence")
    if not isinstance(events, str) or events not in EVENT_FAMILIES:
        raise InvalidParameterError("events", events, "one of 'auto', 'values', 'thresholds', 'bins'")
    bins = _validate.positive_int(bins, "bins", minimum=2)
    if not isinstance(rng, np.random.Generator):
        raise InvalidParameterError(
            "rng",
            rng,
            "a numpy.random.Generator, e.g. np.random.default_rng(seed)",
            "Audits are reproducible experiments, so the generator is always explicit.",
        )
    if not isinstance(progress, bool):
        raise InvalidParameterError("progress", progress, "True or False")

    alpha = (1.0 - confidence) / 2.0
    n_sel = trials // 2
    n_eval = trials - n_sel

    with _progress_bar(progress, 2 * trials) as advance:
        # 1. Selection half: stored, sorted, and used only to choose the event.
        sel = [np.concatenate(list(_draw(sampler, x, n_sel, rng, advance))) for x in (input0, input1)]
        dtype = np.result_type(sel[0].dtype, sel[1].dtype)
        is_bool = dtype.kind == "b"
        if is_bool:
            dtype = np.dtype(np.int8)
        s0, s1 = (np.sort(s.astype(dtype, copy=False)) for s in sel)
        del sel
        cand, _family = _candidate_events(np.concatenate([s0, s1]), events, bins, n_sel)
        c0, c1 = _count_sorted(s0, cand), _count_sorted(s1, cand)
        del s0, s1
        score = np.concatenate(
            [_log_ratio_bound(c0, c1, n_sel, alpha, delta), _log_ratio_bound(c1, c0, n_sel, alpha, delta)]
        )
        best = int(np.argmax(score))
        first = best < len(cand)  # True: event more likely under input0
        i = best % len(cand)
        lo, lo_kind, hi, hi_kind = cand.lo[i], int(cand.lo_kind[i]), cand.hi[i], int(cand.hi_kind[i])

        # 2. Held-out half: streamed in chunks, only the chosen event is counted.
        k = [
            sum(_count_one(chunk, lo, lo_kind, hi, hi_kind) for chunk in _draw(sampler, x, n_eval, rng, advance))
            for x in (input0, input1)
        ]

    k_a, k_b = (k[0], k[1]) if first else (k[1], k[0])
    bound = float(_log_ratio_bound(np.array([k_a]), np.array([k_b]), n_eval, alpha, delta)[0])
    epsilon_lower = max(0.0, bound)
    return AuditResult(
        epsilon_lower=epsilon_lower,
        event=_describe(lo, lo_kind, hi, hi_kind, is_bool),
        p0=k[0] / n_eval,
        p1=k[1] / n_eval,
        trials=trials,
        confidence=confidence,
        delta=delta,
    )
