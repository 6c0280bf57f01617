"""A canary audit: an empirical lower bound on the ε of a whole training algorithm.

The training algorithm is the mechanism and the two neighbouring inputs are a dataset ``D`` and
``D ∪ {canary}`` (add/remove neighbours). The audit trains ``trials`` models on each, from
independent randomness, scores each model on the canary (its loss, its margin, the weight it
gives to a direction only the canary uses, …), and hands the two samples of scores to
:func:`dpkit.audit.estimate_epsilon`: the threshold event and its direction are chosen on one
half, and the other half bounds that event's two probabilities with Clopper–Pearson intervals.
This is the many-run audit of Jagielski, Ullman & Oprea (2020, "Auditing differentially private
machine learning: how private is private SGD?", NeurIPS) and Nasr, Song, Thakurta, Papernot &
Carlini (2021, "Adversary instantiation: lower bounds for differentially private machine
learning", IEEE S&P).

Guarantee: if the training algorithm is (ε, δ)-DP for add/remove neighbours, the returned
``epsilon_lower`` exceeds ε with probability at most ``1 − confidence`` (each training run is an
independent trial; the score is post-processing of the trained model). A large bound is a proof
that the training does not keep its claim; a small one proves nothing (the canary, the score or
the number of trials may be too weak). The strongest canaries are those whose gradient the rest
of the data never cancels, such as an example with a feature no other example uses.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from dpkit import _validate
from dpkit._validate import short_repr
from dpkit.audit.epsilon import EVENT_FAMILIES, AuditResult, EventFamily, estimate_epsilon
from dpkit.audit.membership import _auc
from dpkit.errors import InvalidDataError, InvalidParameterError

__all__ = ["CanaryAuditResult", "canary_audit", "insert_canary"]


@dataclass(frozen=True)
class CanaryAuditResult:
    """The outcome of :func:`canary_audit`.

    Attributes:
        epsilon_lower: the empirical lower bound on the training algorithm's ε (>= 0).
        audit: the :class:`~dpkit.audit.AuditResult` behind it (witness event, held-out
            frequencies; ``input0`` is the dataset without the canary, ``input1`` with it).
        scores_without, scores_with: every canary score, in training order (read-only).
        trials, confidence, delta: as passed.
    """

    epsilon_lower: float
    audit: AuditResult
    scores_without: NDArray[np.float64] = field(repr=False, compare=False)
    scores_with: NDArray[np.float64] = field(repr=False, compare=False)
    trials: int
    confidence: float
    delta: float

    @property
    def auc(self) -> float:
        """How well the score separates runs with the canary from runs without it, over all
        trials, in whichever direction: max(a, 1 − a) with a = P[score_with < score_without] +
        ½ P[tie]; 0.5 means not at all, 1 perfectly."""
        a = _auc(self.scores_with, self.scores_without)
        return max(a, 1.0 - a)

    def __str__(self) -> str:
        return (
            f"canary audit: ε ≥ {self.epsilon_lower:.4f} with {self.confidence:.6g} confidence"
            f"{f', δ = {self.delta:g}' if self.delta else ''}\n"
            f"  {self.trials:,} trainings with and {self.trials:,} without the canary; "
            f"score AUC {self.auc:.4f}; witness {{{self.audit.event}}} "
            f"(held-out frequency {self.audit.p1:.4g} with, {self.audit.p0:.4g} without)"
        )


def insert_canary(dataset: Any, canary: Any) -> Any:
    """``dataset`` with ``canary`` appended as one more example (the default of
    :func:`canary_audit`).

    * a tuple of arrays or tensors ``(X, y, …)`` and a canary ``(x, y, …)`` of the same length:
      each component gets one more row;
    * a numpy array or torch tensor: one more row;
    * a Python list (of records of any kind): one more record.
    """
    if isinstance(dataset, tuple):
        if not isinstance(canary, (tuple, list)) or len(canary) != len(dataset):
            raise InvalidDataError(
                "canary",
                f"is {short_repr(canary, 80)}",
                f"a tuple of {len(dataset)} components, one per dataset component",
            )
        return type(dataset)(
            _append_row(part, row, f"dataset[{i}]") for i, (part, row) in enumerate(zip(dataset, canary, strict=True))
        )
    if _is_arraylike(dataset):
        return _append_row(dataset, canary, "dataset")
    if isinstance(dataset, list):
        return dataset + [canary]
    raise InvalidDataError(
        "dataset",
        f"has type {type(dataset).__name__}",
        "a tuple of arrays/tensors, an array, a tensor or a list of records (or pass insert=)",
    )


def _is_arraylike(x: Any) -> bool:
    return isinstance(x, np.ndarray) or type(x).__module__.startswith("torch")


def _append_row(part: Any, row: Any, name: str) -> Any:
    if isinstance(part, np.ndarray):
        r = np.asarray(row, dtype=part.dtype).reshape((1,) + part.shape[1:])
        return np.concatenate([part, r], axis=0)
    if type(part).__module__.startswith("torch"):
        import torch

        t = torch.as_tensor(row, dtype=part.dtype).reshape((1,) + tuple(part.shape[1:]))
        return torch.cat([part, t], dim=0)
    raise InvalidDataError(name, f"has type {type(part).__name__}", "a numpy array or a torch tensor")


def canary_audit(
    train_fn: Callable[[Any, np.random.Generator], Any],
    dataset: Any,
    canary: Any,
    *,
    score_fn: Callable[[Any, Any], float],
    trials: int,
    rng: np.random.Generator,
    confidence: float = 0.95,
    delta: float = 0.0,
    insert: Callable[[Any, Any], Any] | None = None,
    events: EventFamily = "thresholds",
    progress: bool = False,
) -> CanaryAuditResult:
    """A lower bound on the ε of ``train_fn`` from ``trials`` trainings with and without a canary.

    Args:
        train_fn: ``train_fn(dataset, rng) -> model``; must draw all its randomness from ``rng``
            (so the audit is reproducible) and treat its dataset as a set.
        dataset: the training set without the canary.
        canary: one example to add.
        score_fn: ``score_fn(model, canary) -> float``, e.g. the canary's loss. Any statistic
            of the model is allowed (post-processing); the audit looks at both tails.
        trials: trainings per dataset, an integer >= 100 (``2 · trials`` trainings in all).
        rng: an explicit ``numpy.random.Generator``: audits are reproducible experiments.
        confidence: the probability that the bound does not exceed the true ε.
        delta: the δ of the guarantee being audited.
        insert: ``insert(dataset, canary) -> dataset ∪ {canary}``; default :func:`insert_canary`.
        events: candidate events for :func:`~dpkit.audit.estimate_epsilon` (default
            ``"thresholds"``: {score > c} and {score < c}).
        progress: show a ``rich`` progress bar.

    Returns:
        A :class:`CanaryAuditResult`.

    Raises:
        InvalidParameterError: a bad argument; InvalidDataError: a score that is not a finite
        number, or a canary that cannot be inserted.

    Example (noisy sum of clipped values, ε = 1 by the Laplace mechanism; the claim holds):

    >>> import numpy as np
    >>> def train(data, rng):
    ...     return np.clip(data, 0, 1).sum() + rng.laplace(0.0, 1.0)
    >>> r = canary_audit(train, np.zeros(10), 1.0, score_fn=lambda model, c: model,
    ...                  trials=2000, rng=np.random.default_rng(0))
    >>> 0.3 < r.epsilon_lower <= 1.0
    True
    """
    if not callable(train_fn):
        raise InvalidParameterError("train_fn", short_repr(train_fn, 80), "a callable train_fn(dataset, rng) -> model")
    if not callable(score_fn):
        raise InvalidParameterError("score_fn", short_repr(score_fn, 80), "a callable score_fn(model, canary) -> float")
    if insert is not None and not callable(insert):
        raise InvalidParameterError(
            "insert", short_repr(insert, 80), "None or a callable insert(dataset, canary) -> dataset"
        )
    trials = _validate.positive_int(trials, "trials", minimum=100)
    confidence = _validate.probability(confidence, "confidence")
    delta = _validate.delta(delta)
    if not isinstance(events, str) or events not in EVENT_FAMILIES:
        raise InvalidParameterError("events", events, "one of 'auto', 'values', 'thresholds', 'bins'")
    if not isinstance(rng, np.random.Generator):
        raise InvalidParameterError(
            "rng",
            short_repr(rng, 80),
            "a numpy.random.Generator, e.g. np.random.default_rng(seed)",
            "Audits are reproducible experiments, so the generator is always explicit.",
        )
    with_canary = (insert or insert_canary)(dataset, canary)
    inputs = (dataset, with_canary)
    scores: tuple[list[float], list[float]] = ([], [])

    def sampler(which: int, n: int, gen: np.random.Generator) -> NDArray[np.float64]:
        out = np.empty(n, dtype=np.float64)
        for i in range(n):
            s = score_fn(train_fn(inputs[which], gen), canary)
            try:
                out[i] = float(s)
            except (TypeError, ValueError) as exc:
                raise InvalidDataError("score_fn", f"returned {short_repr(s, 80)}", "a finite number") from exc
            if not np.isfinite(out[i]):
                raise InvalidDataError("score_fn", f"returned {out[i]}", "a finite number")
        scores[which].extend(out.tolist())
        return out

    audit = estimate_epsilon(
        sampler, 0, 1, trials=trials, delta=delta, confidence=confidence, events=events, rng=rng, progress=progress
    )
    ro = []
    for s in scores:
        a = np.asarray(s, dtype=np.float64)
        a.setflags(write=False)
        ro.append(a)
    return CanaryAuditResult(
        epsilon_lower=audit.epsilon_lower,
        audit=audit,
        scores_without=ro[0],
        scores_with=ro[1],
        trials=trials,
        confidence=confidence,
        delta=delta,
    )
