"""Membership inference by loss threshold, and the ε lower bound a successful attack implies.

The attack (Yeom, Giacomelli, Fredrikson & Jha 2018, "Privacy risk in machine learning:
analyzing the connection to overfitting", CSF) guesses that an example was in the training set
when the model's loss on it is at most a threshold τ: training examples tend to have lower loss.
Sweeping τ gives the ROC curve; the summary numbers follow Carlini et al. (2022, "Membership
inference attacks from first principles"): the AUC and the true-positive rate at a low false
positive rate (1 %, and 0.1 % when there are at least 1,000 non-members to measure it).

From attack to ε (Kairouz, Oh & Viswanath 2015; Jagielski, Ullman & Oprea 2020; Nasr et al.
2021): if training is (ε, δ)-DP, every test that decides "member" from the trained model obeys

    TPR ≤ e^ε · FPR + δ      and      1 − FPR ≤ e^ε · (1 − TPR) + δ,

so ε ≥ ln((TPR − δ) / FPR). With finitely many trials both rates are estimates: the threshold and
the direction are chosen on one random half of each group, and the other half bounds them with
one-sided Clopper–Pearson intervals (each at level (1 − confidence)/2), giving

    ε_lower = max(0, ln((lower(TPR) − δ) / upper(FPR)))

(or the same with the complements), as in :func:`dpkit.audit.estimate_epsilon`.

What the bound means — read this before quoting it. The inequality is about *one* target example
and the randomness of *training*. ``epsilon_lower`` is a statistically valid lower bound on the
training algorithm's ε only when every member loss comes from an independent training run that
included the target, and every non-member loss from an independent run that did not (the canary
setting of :func:`dpkit.audit.canary.canary_audit`). For the losses of *many different examples*
under *one* model — the usual membership-inference experiment — the samples share a model and
are not a worst-case pair of neighbours: the number is then the "implied ε" often quoted in the
literature, an indication of leakage, not a proof.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from dpkit import _validate
from dpkit._validate import short_repr
from dpkit.audit.epsilon import _cp_lower, _cp_upper
from dpkit.errors import InvalidDataError, InvalidParameterError

__all__ = [
    "MembershipAttackResult",
    "loss_threshold_attack",
    "epsilon_from_tpr_fpr",
    "per_example_losses",
]

#: Candidate thresholds considered when choosing the witness on the selection half.
MAX_CANDIDATES = 2000


def _readonly(a: NDArray[Any]) -> NDArray[Any]:
    a = np.array(a, copy=True)
    a.setflags(write=False)
    return a


@dataclass(frozen=True)
class MembershipAttackResult:
    """The outcome of :func:`loss_threshold_attack`.

    Attributes:
        auc: area under the ROC curve, P[loss(member) < loss(non-member)] + ½ P[equal].
        tpr_at_1pct_fpr: the largest TPR at FPR <= 1 %.
        tpr_at_01pct_fpr: the largest TPR at FPR <= 0.1 %, or ``None`` with fewer than 1,000
            non-members (the rate could not be resolved).
        fpr, tpr, thresholds: the ROC curve (read-only arrays): guessing "member" when
            loss <= thresholds[i] gives (fpr[i], tpr[i]); the first point is (0, 0) at −inf.
        n_members, n_nonmembers: the sample sizes.
        epsilon_lower: the ε lower bound implied on held-out halves (see the module docstring
            for when it is a proof and when only an indication).
        witness: the held-out test, e.g. ``"loss <= 0.0132"``.
        confidence, delta: the level and δ of ``epsilon_lower``.
    """

    auc: float
    tpr_at_1pct_fpr: float
    tpr_at_01pct_fpr: float | None
    fpr: NDArray[np.float64] = field(repr=False, compare=False)
    tpr: NDArray[np.float64] = field(repr=False, compare=False)
    thresholds: NDArray[np.float64] = field(repr=False, compare=False)
    n_members: int
    n_nonmembers: int
    epsilon_lower: float
    witness: str
    confidence: float
    delta: float

    def tpr_at_fpr(self, fpr: float) -> float:
        """The largest TPR on the ROC curve at a false-positive rate <= ``fpr``."""
        f = _validate.probability(fpr, "fpr", low_open=False, high_open=False)
        return float(self.tpr[self.fpr <= f].max())

    @property
    def advantage(self) -> float:
        """Yeom et al.'s membership advantage: max over thresholds of TPR − FPR."""
        return float(np.max(self.tpr - self.fpr))

    def __str__(self) -> str:
        low = "n/a (< 1000 non-members)" if self.tpr_at_01pct_fpr is None else f"{self.tpr_at_01pct_fpr:.4f}"
        delta = f", δ = {self.delta:g}" if self.delta else ""
        return (
            f"loss-threshold membership attack on {self.n_members:,} members / {self.n_nonmembers:,} non-members\n"
            f"  AUC {self.auc:.4f}, advantage {self.advantage:.4f}, "
            f"TPR@1%FPR {self.tpr_at_1pct_fpr:.4f}, TPR@0.1%FPR {low}\n"
            f"  implied ε ≥ {self.epsilon_lower:.4f} with {self.confidence:.6g} confidence{delta} "
            f"(held-out witness {{{self.witness}}})"
        )


def _losses(values: ArrayLike, name: str) -> NDArray[np.float64]:
    arr = _validate.finite_array(values, name)
    if arr.ndim != 1:
        raise InvalidDataError(name, f"has shape {arr.shape}", "a 1-D array of per-example losses")
    if arr.size < 2:
        raise InvalidDataError(name, f"holds {arr.size} value", "at least 2 losses")
    return arr.astype(np.float64)


def _check_rng(rng: object) -> np.random.Generator:
    if rng is None:
        return np.random.default_rng()  # fresh OS entropy: a valid, non-reproducible split
    if not isinstance(rng, np.random.Generator):
        raise InvalidParameterError(
            "rng", short_repr(rng, 80), "None (a fresh split) or a numpy.random.Generator (reproducible)"
        )
    return rng


def epsilon_from_tpr_fpr(
    true_positives: int,
    members: int,
    false_positives: int,
    nonmembers: int,
    *,
    delta: float = 0.0,
    confidence: float = 0.95,
) -> float:
    """The ε lower bound from one membership test fixed *before* these counts were observed.

    (ε, δ)-DP gives TPR <= e^ε·FPR + δ, so with one-sided Clopper–Pearson bounds at level
    (1 − confidence)/2 each (so both hold together with probability >= ``confidence``)::

        ε >= max(0, ln((lower(TPR) − δ) / upper(FPR)))

    The counts must come from independent trials (see the module docstring); choosing the test
    after looking at these same counts invalidates the bound.

    >>> round(epsilon_from_tpr_fpr(95, 100, 5, 100, confidence=0.95), 3)
    2.062
    """
    tp = _validate.positive_int(true_positives, "true_positives", minimum=0)
    n1 = _validate.positive_int(members, "members")
    fp = _validate.positive_int(false_positives, "false_positives", minimum=0)
    n0 = _validate.positive_int(nonmembers, "nonmembers")
    if tp > n1:
        raise InvalidParameterError("true_positives", tp, f"an integer in [0, members={n1}]")
    if fp > n0:
        raise InvalidParameterError("false_positives", fp, f"an integer in [0, nonmembers={n0}]")
    delta = _validate.delta(delta)
    alpha = (1.0 - _validate.probability(confidence, "confidence")) / 2.0
    return _bound(tp, n1, fp, n0, alpha, delta)


def _bound(k_a: int, n_a: int, k_b: int, n_b: int, alpha: float, delta: float) -> float:
    num = float(_cp_lower(np.array([k_a]), n_a, alpha)[0]) - delta
    den = float(_cp_upper(np.array([k_b]), n_b, alpha)[0])
    if num <= 0:
        return 0.0
    return max(0.0, math.log(num / den))


def _roc(members: NDArray[np.float64], nonmembers: NDArray[np.float64]) -> tuple[NDArray[np.float64], ...]:
    """The ROC of "member iff loss <= τ" over every distinct τ, from (0, 0) to (1, 1)."""
    m_sorted, n_sorted = np.sort(members), np.sort(nonmembers)
    taus = np.unique(np.concatenate([m_sorted, n_sorted]))
    tpr = np.searchsorted(m_sorted, taus, side="right") / m_sorted.size
    fpr = np.searchsorted(n_sorted, taus, side="right") / n_sorted.size
    return np.concatenate([[0.0], fpr]), np.concatenate([[0.0], tpr]), np.concatenate([[-np.inf], taus])


def _auc(members: NDArray[np.float64], nonmembers: NDArray[np.float64]) -> float:
    """Mann–Whitney: P[member loss < non-member loss] + ½ P[tie]."""
    from scipy.stats import rankdata  # imported on first use (scipy.stats is slow to import)

    ranks = rankdata(np.concatenate([-members, -nonmembers]))  # high score = low loss = "member"
    m, n = members.size, nonmembers.size
    return float((ranks[:m].sum() - m * (m + 1) / 2) / (m * n))


def _held_out_bound(
    members: NDArray[np.float64], nonmembers: NDArray[np.float64], alpha: float, delta: float, rng: np.random.Generator
) -> tuple[float, str]:
    """Choose (τ, direction) on a random half of each group, bound it on the other half."""
    pm, pn = rng.permutation(members), rng.permutation(nonmembers)
    sel_m, eval_m = np.sort(pm[: pm.size // 2]), pm[pm.size // 2 :]
    sel_n, eval_n = np.sort(pn[: pn.size // 2]), pn[pn.size // 2 :]
    if sel_m.size == 0 or sel_n.size == 0:
        return 0.0, "none"
    pooled = np.concatenate([sel_m, sel_n])
    taus = np.unique(pooled)
    if taus.size > MAX_CANDIDATES:
        taus = np.unique(np.quantile(pooled, np.linspace(0, 1, MAX_CANDIDATES), method="inverted_cdf"))
    km = np.searchsorted(sel_m, taus, side="right")  # members with loss <= τ
    kn = np.searchsorted(sel_n, taus, side="right")
    with np.errstate(divide="ignore", invalid="ignore"):
        lo_tpr = _cp_lower(km, sel_m.size, alpha) - delta
        lo_tnr = _cp_lower(sel_n.size - kn, sel_n.size, alpha) - delta
        below = np.where(lo_tpr > 0, np.log(lo_tpr / _cp_upper(kn, sel_n.size, alpha)), -np.inf)  # {loss <= τ}
        above = np.where(
            lo_tnr > 0, np.log(lo_tnr / _cp_upper(sel_m.size - km, sel_m.size, alpha)), -np.inf
        )  # {loss > τ}
    scores = np.concatenate([below, above])
    best = int(np.argmax(scores))
    tau = float(taus[best % taus.size])
    km_e, kn_e = int(np.count_nonzero(eval_m <= tau)), int(np.count_nonzero(eval_n <= tau))
    if best < taus.size:
        return _bound(km_e, eval_m.size, kn_e, eval_n.size, alpha, delta), f"loss <= {tau:.6g}"
    return _bound(eval_n.size - kn_e, eval_n.size, eval_m.size - km_e, eval_m.size, alpha, delta), f"loss > {tau:.6g}"


def loss_threshold_attack(
    member_losses: ArrayLike,
    nonmember_losses: ArrayLike,
    *,
    delta: float = 0.0,
    confidence: float = 0.95,
    rng: np.random.Generator | None = None,
) -> MembershipAttackResult:
    """Yeom et al.'s loss-threshold membership-inference attack, summarised.

    Args:
        member_losses: per-example losses of examples that were in the training set (1-D).
        nonmember_losses: the same for examples that were not.
        delta: δ of the guarantee the implied ε is computed against.
        confidence: level of the Clopper–Pearson bounds behind ``epsilon_lower``.
        rng: randomises the selection / evaluation split behind ``epsilon_lower``: ``None`` (a
            fresh split from OS entropy) or a seeded ``numpy.random.Generator`` (reproducible).
            AUC, ROC and TPR@FPR use no randomness.

    Returns:
        A :class:`MembershipAttackResult`.

    >>> import numpy as np
    >>> r = loss_threshold_attack([0.01, 0.02, 0.03, 0.5], [0.4, 0.9, 1.2, 2.0])
    >>> r.auc, r.tpr_at_1pct_fpr
    (0.9375, 0.75)
    """
    members = _losses(member_losses, "member_losses")
    nonmembers = _losses(nonmember_losses, "nonmember_losses")
    delta = _validate.delta(delta)
    confidence = _validate.probability(confidence, "confidence")
    gen = _check_rng(rng)
    fpr, tpr, thresholds = _roc(members, nonmembers)
    eps, witness = _held_out_bound(members, nonmembers, (1.0 - confidence) / 2.0, delta, gen)
    at = lambda f: float(tpr[fpr <= f].max())  # noqa: E731
    return MembershipAttackResult(
        auc=_auc(members, nonmembers),
        tpr_at_1pct_fpr=at(0.01),
        tpr_at_01pct_fpr=at(0.001) if nonmembers.size >= 1000 else None,
        fpr=_readonly(fpr),
        tpr=_readonly(tpr),
        thresholds=_readonly(thresholds),
        n_members=int(members.size),
        n_nonmembers=int(nonmembers.size),
        epsilon_lower=eps,
        witness=witness,
        confidence=confidence,
        delta=delta,
    )


def per_example_losses(model: Any, X: Any, y: Any, *, batch_size: int = 4096) -> NDArray[np.float64]:
    """The loss of ``model`` on each example: the attack's input.

    * A ``torch.nn.Module`` is evaluated in ``eval()`` mode without gradients (its mode is
      restored). Outputs of shape (n, k >= 2) are taken as logits: cross-entropy with integer
      labels. Outputs of shape (n,) or (n, 1) are one logit: binary cross-entropy with 0/1 labels.
    * An sklearn-style classifier with ``predict_proba``: −ln p(y | x), where the column of label
      y is found in ``classes_`` (or is y itself when there is no ``classes_``); probabilities are
      floored at the smallest positive double, so a loss is at most about 708.

    Returns a float64 array of n losses.

    >>> from sklearn.linear_model import LogisticRegression
    >>> import numpy as np
    >>> X = np.array([[0.0], [1.0], [2.0], [3.0]]); y = np.array([0, 0, 1, 1])
    >>> per_example_losses(LogisticRegression().fit(X, y), X, y).shape
    (4,)
    """
    batch_size = _validate.positive_int(batch_size, "batch_size")
    if hasattr(model, "predict_proba") and callable(model.predict_proba):
        return _sklearn_losses(model, X, y)
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is an optional extra
        is_torch = False
    else:
        is_torch = isinstance(model, torch.nn.Module)
    if is_torch:
        return _torch_losses(model, X, y, batch_size)
    raise InvalidParameterError("model", short_repr(model, 80), "a torch.nn.Module or a classifier with predict_proba")


def _sklearn_losses(model: Any, X: Any, y: Any) -> NDArray[np.float64]:
    labels = np.asarray(y)
    if labels.ndim != 1:
        raise InvalidDataError("y", f"has shape {labels.shape}", "a 1-D array of labels")
    proba = np.asarray(model.predict_proba(X), dtype=np.float64)
    if proba.ndim != 2 or proba.shape[0] != labels.shape[0]:
        raise InvalidDataError(
            "X", f"gave predict_proba of shape {proba.shape} for {labels.shape[0]} labels", "one row per label"
        )
    classes = np.asarray(getattr(model, "classes_", np.arange(proba.shape[1])))
    order = np.argsort(classes, kind="stable")
    pos = np.searchsorted(classes[order], labels)
    pos = np.clip(pos, 0, classes.size - 1)
    found = classes[order][pos] == labels
    if not np.all(found):
        bad = labels[~found][0]
        raise InvalidDataError(
            "y", f"holds the label {bad!r}, not among the model's classes", f"one of {classes.tolist()}"
        )
    p = proba[np.arange(labels.size), order[pos]]
    return -np.log(np.clip(p, np.finfo(np.float64).tiny, 1.0))


def _torch_losses(model: Any, X: Any, y: Any, batch_size: int) -> NDArray[np.float64]:
    import torch
    import torch.nn.functional as F

    dtype = next((p.dtype for p in model.parameters()), torch.get_default_dtype())
    Xt = X.detach() if isinstance(X, torch.Tensor) else torch.as_tensor(np.asarray(X))
    if Xt.dtype.is_floating_point:
        Xt = Xt.to(dtype)  # integer inputs (e.g. token ids) are passed unchanged
    yt = y.detach() if isinstance(y, torch.Tensor) else torch.as_tensor(np.asarray(y))
    if yt.ndim != 1 or yt.shape[0] != Xt.shape[0]:
        raise InvalidDataError(
            "y", f"has shape {tuple(yt.shape)} for {Xt.shape[0]} examples", "a 1-D tensor with one label per example"
        )
    out: list[torch.Tensor] = []
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for s in range(0, Xt.shape[0], batch_size):
                logits = model(Xt[s : s + batch_size])
                target = yt[s : s + batch_size]
                if logits.ndim == 2 and logits.shape[1] >= 2:
                    out.append(F.cross_entropy(logits.to(torch.float64), target.long(), reduction="none"))
                elif logits.ndim == 1 or (logits.ndim == 2 and logits.shape[1] == 1):
                    out.append(
                        F.binary_cross_entropy_with_logits(
                            logits.reshape(-1).to(torch.float64), target.to(torch.float64), reduction="none"
                        )
                    )
                else:
                    raise InvalidDataError(
                        "model",
                        f"returned outputs of shape {tuple(logits.shape)}",
                        "(n, k) logits or (n,) / (n, 1) binary logits",
                    )
    finally:
        model.train(was_training)
    return torch.cat(out).numpy() if out else np.zeros(0)
