"""Randomized response: each respondent randomises their own answer before anyone sees it.

Two designs:

* :class:`RandomizedResponse` — Warner (1965), k-ary: report the true answer with probability
  ``p_truth``, otherwise one of the other ``k − 1`` answers uniformly at random. For k = 2 and
  ``p_truth = 2/3`` this is Warner's (1965) randomized response (ln 2-DP), whose
  unbiased estimate of the true proportion is p̂ = 3·mean(Y) − 1.
* :class:`ForcedResponse` — the two-coin design of Dwork & Roth (2014) §3.2: a first
  coin decides whether to answer truthfully; otherwise a second coin forces "yes" or "no". With
  fair coins P(yes) = 1/4 + π/2, the estimate is 2·P(yes) − 1/2, and the design is ln 3-DP.

Both are local mechanisms with the ``replace`` neighbour relation: the guarantee bounds how much
one respondent's reported answer can reveal when their true answer changes to any other value.
Both sample with exact rational probabilities (:func:`dpkit.noise.bernoulli`,
:func:`dpkit.noise.uniform_below`) fed by the CSPRNG unless a seeded generator is passed as
``rng=``. The estimators are post-processing: they cost no privacy budget.

Totality (docs/architecture.md, "Totality"): a release never raises on an answer's value. A true answer
outside the declared domain {0, …, k − 1} (out of range, non-integer, NaN, ±inf) is treated as
answer 0, so every input is randomised as a valid answer and the guarantee holds unchanged. Only
public facts raise: the dtype, an empty array, booleans for k > 2. The estimators take released
reports, which are public; invalid reports raise, with a message that quotes no value.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from fractions import Fraction
from numbers import Real
from statistics import NormalDist

import numpy as np
from numpy.typing import ArrayLike, NDArray

from dpkit import _validate
from dpkit._validate import Neighbours
from dpkit.accounting.events import PureDPEvent, RandomizedResponseEvent
from dpkit.accounting.rounding import to_decimal_up
from dpkit.errors import InvalidDataError, InvalidParameterError
from dpkit.noise.integers import bernoulli, uniform_below
from dpkit.noise.source import RNG, resolve_rng

__all__ = ["RandomizedResponse", "ForcedResponse", "FrequencyEstimate"]

# Upper bounds on ln(r) allow this many ulps for the error of the platform's ``math.log``
# (glibc's log is correctly rounded to within 1 ulp; two leave a margin).
_LOG_ULPS = 2


# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------


def _log_upper(r: Fraction) -> float:
    """A float that is >= ln(r) for the exact rational r > 0 (rounded against ourselves)."""
    f = float(r)
    if Fraction(f) < r:
        f = math.nextafter(f, math.inf)
    out = math.log(f)
    for _ in range(_LOG_ULPS):
        out = math.nextafter(out, math.inf)
    return out


def _answers(value: ArrayLike, k: int, name: str, *, total: bool) -> NDArray[np.int64]:
    """Categorical answers as int64 in {0, …, k − 1} (booleans too when k = 2); same shape.

    Public facts raise: input that is not an array, an empty array, a non-numeric dtype, booleans
    for k > 2. Values are handled by ``total``: for true answers (private data) every element that
    is not one of 0..k−1 — out of range, non-integer, NaN, ±inf — is treated as answer 0, so
    nothing raises on a value; for reports (released outputs) such an element raises. Messages
    never quote a value or its position.
    """
    accepted = f"integer answers in {{0, ..., {k - 1}}}" + (" or booleans" if k == 2 else "")
    arr = _validate.as_array(value, name, accepted)  # the dtype depends on types, not values
    if arr.size == 0:
        raise InvalidDataError(name, "is empty", f"at least one answer; {accepted}")
    if arr.dtype == bool:
        if k != 2:
            raise InvalidDataError(name, f"holds booleans but k={k}", accepted)
        return arr.astype(np.int64)
    if arr.dtype.kind not in "iuf":
        raise InvalidDataError(name, f"has dtype {arr.dtype}", accepted)
    with np.errstate(invalid="ignore"):
        valid = (arr >= 0) & (arr <= k - 1)  # False for NaN
        if arr.dtype.kind == "f":
            valid &= arr == np.round(arr)
    if total:
        # The declared domain is {0..k−1}; an answer outside it has no meaning, and refusing it
        # would reveal that it is there. It is answered as 0 (any fixed answer keeps ε-LDP: the
        # report's law is then that of a valid answer, whose ratios are bounded by p/q).
        return np.where(valid, arr, 0).astype(np.int64)
    if not valid.all():
        raise InvalidDataError(name, f"holds a value that is not one of the answers 0..{k - 1}", accepted)
    return arr.astype(np.int64)


def _frozen(a: NDArray[np.float64]) -> NDArray[np.float64]:
    a.setflags(write=False)
    return a


# --------------------------------------------------------------------------------------------
# the estimate
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class FrequencyEstimate:
    """Unbiased estimates of the true proportion of each answer, with standard errors.

    ``estimate[v]`` estimates the fraction of respondents whose *true* answer is ``v``. It is
    unbiased, so it may fall below 0 or above 1 by sampling noise; it is not clipped (clip it
    yourself for display — clipping introduces bias). The entries sum to 1.

    ``std_error[v]`` is the plug-in standard error: the exact variance of the estimator is
    λ_v (1 − λ_v) / (n (p − q)²), where λ_v is the probability that a report equals v and p − q
    the mechanism's signal strength; the observed proportion of reports equal to v stands in for
    λ_v. It is 0 when every report or no report equals v.

    Attributes:
        estimate: length-k array of estimated true proportions.
        std_error: length-k array of standard errors.
        observed: length-k array, the observed proportion of reports equal to each answer.
        n: the number of reports.
    """

    estimate: NDArray[np.float64]
    std_error: NDArray[np.float64]
    observed: NDArray[np.float64]
    n: int

    @property
    def k(self) -> int:
        """Number of possible answers."""
        return int(self.estimate.shape[0])

    @property
    def proportion(self) -> float:
        """For a yes/no question (k = 2): the estimated proportion of true "yes" (answer 1)."""
        if self.k != 2:
            raise InvalidParameterError(
                "k", self.k, "2 for .proportion", "Use .estimate for questions with more than two answers"
            )
        return float(self.estimate[1])

    def confidence_interval(self, confidence: float = 0.95) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """Normal-approximation (Wald) interval ``estimate ± z·std_error`` for each answer.

        Returns ``(low, high)`` arrays of length k. The interval is *not* clipped to [0, 1]; clip
        it yourself if you need a range of valid proportions (coverage does not drop by clipping).
        Its coverage is approximate: it relies on the central limit theorem over n reports and is
        poor when n is small or an observed proportion is near 0 or 1.
        """
        c = _validate.probability(confidence, "confidence")
        z = NormalDist().inv_cdf(0.5 + c / 2)
        half = z * self.std_error
        return self.estimate - half, self.estimate + half


def _estimate(counts: NDArray[np.int64], signal: Fraction, offset: Fraction) -> FrequencyEstimate:
    """Invert observed = offset + signal·true, per answer, with the plug-in standard error."""
    n = int(counts.sum())
    observed = counts / n
    s = float(signal)
    estimate = (observed - float(offset)) / s
    std_error = np.sqrt(observed * (1.0 - observed) / n) / s
    return FrequencyEstimate(estimate=_frozen(estimate), std_error=_frozen(std_error), observed=_frozen(observed), n=n)


# --------------------------------------------------------------------------------------------
# Warner's k-ary randomized response
# --------------------------------------------------------------------------------------------


def _check_local_neighbours(value: object) -> None:
    """Randomized response is a local mechanism: each respondent's report depends on their own
    answer only, and the guarantee compares two values of that answer (``replace``). Under
    add/remove the reports' number itself reveals who took part, so that relation is refused
    rather than given a guarantee it does not have (Kasiviswanathan et al. 2011, Def. 3.1)."""
    if _validate.neighbours(value) != "replace":
        raise InvalidParameterError(
            "neighbours", value, "'replace'", "randomized response is ε-local DP for one respondent's answer changing"
        )


@dataclass(frozen=True, kw_only=True)
class RandomizedResponse:
    """Warner's randomized response over k answers: ε-local DP under ``replace`` neighbours.

    Each respondent reports their true answer v ∈ {0, …, k − 1} with probability p = ``p_truth``
    and otherwise one of the other k − 1 answers, uniformly. For any report y and true answers
    v ≠ v', P(y | v) / P(y | v') ≤ p / q with q = (1 − p)/(k − 1), so the mechanism is ε-DP with

        ε = ln( p (k − 1) / (1 − p) ),    equivalently    p = e^ε / (e^ε + k − 1),

    where neighbouring inputs differ in one respondent's answer (``replace``); the bound is tight.
    Sources: Warner (1965) (k = 2, p = 2/3 gives ε = ln 2, and the
    unbiased estimate p̂ = 3·mean(Y) − 1); Kairouz, Oh & Viswanath (2014) for k > 2.

    Give exactly one of:

    * ``epsilon`` — p is the largest double not above e^ε/(e^ε + k − 1) whose realised ε
      (checked with an upward-rounded logarithm of the exact rational ratio, and with the event's
      own formula) does not exceed the requested ε. The realised ε lies within about
      2⁻⁵²·(e^ε + k − 1)/(k − 1) of the request (below 1e-12 for ε ≤ 8 with k = 2);
    * ``p_truth`` — a number in (1/k, 1), taken at its exact double value (a double equal to
      the double nearest 1/k, such as ``0.2`` for k = 5, counts as 1/k and is rejected).

    After construction ``.p_truth`` and ``.epsilon`` hold the realised values, which are those of
    the sampler (``.event`` records exactly that probability). Sampling uses the exact rational
    ``Fraction(p_truth)``.

    >>> import numpy as np
    >>> rr = RandomizedResponse(p_truth=2/3)
    >>> round(rr.epsilon, 12) == round(float(np.log(2)), 12)
    True
    >>> rr.release([0, 1, 1, 0, 1], rng=np.random.default_rng(0))
    array([0, 1, 0, 1, 1])
    >>> est = rr.estimate_frequency([1, 1, 0, 1, 0, 1])
    >>> round(est.proportion, 6)   # 3 * mean - 1
    1.0
    """

    epsilon: float | None = None
    p_truth: float | None = None
    k: int = 2
    neighbours: Neighbours = "replace"
    _p: Fraction = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        _check_local_neighbours(self.neighbours)
        k = _validate.positive_int(self.k, "k", minimum=2)
        given = (self.epsilon is not None, self.p_truth is not None)
        if given[0] == given[1]:
            raise InvalidParameterError(
                "epsilon, p_truth",
                {"epsilon": self.epsilon, "p_truth": self.p_truth},
                "exactly one of epsilon and p_truth (the other left as None)",
            )
        p = self._p_from_epsilon(self.epsilon, k) if self.epsilon is not None else self._p_checked(self.p_truth, k)
        object.__setattr__(self, "k", k)
        object.__setattr__(self, "_p", Fraction(p))
        object.__setattr__(self, "p_truth", p)
        object.__setattr__(self, "epsilon", RandomizedResponseEvent(p_truth=p, k=k).epsilon)

    @staticmethod
    def _p_checked(value: object, k: int) -> float:
        accepted = f"a number in (1/{k}, 1)"
        why = (
            f"p_truth <= 1/{k} makes the report carry no information about (or invert) the truth; "
            "p_truth = 1 releases the truth (no privacy)"
        )
        if not isinstance(value, Real) or isinstance(value, bool) or not math.isfinite(float(value)):
            raise InvalidParameterError("p_truth", value, accepted, why)
        p = float(value)
        # Both exactly and in double precision: ``0.2`` for k = 5 is 1/5 as typed (its double lies
        # 1e-17 above 1/5, a mechanism with ε ≈ 1e-16 that the caller did not mean).
        if not (Fraction(1, k) < Fraction(p) < 1 and p > 1.0 / k):
            raise InvalidParameterError("p_truth", value, accepted, why)
        return p

    @staticmethod
    def _p_from_epsilon(value: object, k: int) -> float:
        eps = _validate.epsilon(value)
        # 1 / (1 + (k − 1) e^{−ε}) = e^ε / (e^ε + k − 1), without overflow for large ε.
        p = 1.0 / (1.0 + (k - 1) * math.exp(-eps))
        p = min(p, math.nextafter(1.0, 0.0))
        for _ in range(10_000):  # a handful of steps in practice
            pf = Fraction(p)
            if pf <= Fraction(1, k) or p <= 1.0 / k:
                raise InvalidParameterError(
                    "epsilon",
                    value,
                    "a finite number > 0 large enough that p_truth > 1/k in double precision (about 1e-15 or more)",
                )
            ratio = pf * (k - 1) / (1 - pf)
            if _log_upper(ratio) <= eps and RandomizedResponseEvent(p_truth=p, k=k).epsilon <= eps:
                return p
            p = math.nextafter(p, 0.0)
        raise AssertionError("unreachable: p_truth calibration did not converge")  # pragma: no cover

    @property
    def p_truth_fraction(self) -> Fraction:
        """The exact probability of reporting the truth used by the sampler."""
        return self._p

    @property
    def p_other(self) -> float:
        """The probability q = (1 − p_truth)/(k − 1) of reporting each particular other answer."""
        return float((1 - self._p) / (self.k - 1))

    @property
    def event(self) -> RandomizedResponseEvent:
        """What one release costs per respondent: ``RandomizedResponseEvent(p_truth, k, "replace")``."""
        return RandomizedResponseEvent(p_truth=self.p_truth, k=self.k, neighbours=self.neighbours)  # type: ignore[arg-type]

    def release(self, true_answers: ArrayLike, *, rng: RNG = None) -> NDArray[np.int64]:
        """Randomise each answer independently; returns int64 reports of the same shape.

        ``true_answers`` holds integers in {0, …, k − 1} (booleans accepted when k = 2). Each
        report is the true answer with probability ``p_truth``; otherwise it is drawn exactly
        uniformly from the other k − 1 answers. ``rng=None`` uses the CSPRNG; pass a seeded
        ``numpy.random.Generator`` only for tests and teaching.

        Total on values: an element that is not one of 0..k−1 (out of range, non-integer, NaN,
        ±inf) is treated as answer 0 before randomising; the guarantee holds for every input, as
        the mechanism only ever sees valid answers. Only public facts raise (dtype, emptiness).
        """
        truth = _answers(true_answers, self.k, "true_answers", total=True)
        src = resolve_rng(rng)
        flat = truth.ravel()
        keep = bernoulli(self._p, flat.size, rng=src)
        lie = np.flatnonzero(~keep)
        other = uniform_below(self.k - 1, lie.size, rng=src)
        other += other >= flat[lie]  # skip the true answer: uniform over the other k − 1
        out = flat.copy()
        out[lie] = other
        return out.reshape(truth.shape)

    def estimate_frequency(self, reports: ArrayLike) -> FrequencyEstimate:
        """Unbiased estimate of the true proportion of each answer from released reports.

        With p = ``p_truth`` and q = (1 − p)/(k − 1), a report equals v with probability
        q + (p − q)·π_v, so f̂_v = (observed_v − q)/(p − q) is unbiased for π_v (for k = 2 and
        p = 2/3: f̂_1 = 3·mean − 1; Warner 1965). Post-processing: costs no budget.
        """
        r = _answers(reports, self.k, "reports", total=False)
        counts = np.bincount(r.ravel(), minlength=self.k)
        q = (1 - self._p) / (self.k - 1)
        return _estimate(counts, signal=self._p - q, offset=q)


# --------------------------------------------------------------------------------------------
# the two-coin (forced response) design
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class ForcedResponse:
    """Two-coin randomized response for yes/no questions: ε-local DP under ``replace`` neighbours.

    Each respondent flips a first coin: with probability a = ``p_truth_coin`` they answer
    truthfully; otherwise they flip a second coin and answer "yes" (1) with probability
    y = ``p_yes`` and "no" (0) otherwise. So P(yes | π) = a·π + (1 − a)·y, and

        ε = max( ln((a + (1 − a) y) / ((1 − a) y)),  ln((a + (1 − a)(1 − y)) / ((1 − a)(1 − y))) ),

    the larger likelihood ratio over the two reports when one respondent's true answer changes
    (``replace``); the bound is tight. With fair coins (the defaults) P(yes) = 1/4 + π/2, the
    estimate is π̂ = 2·P̂(yes) − 1/2, and ε = ln 3. Source: Dwork & Roth (2014) §3.2, Claim 3.5.
    With p_yes = 1/2 this is Warner's design with p_truth = (1 + a)/2.

    Both coins are sampled with the exact rationals ``Fraction(p_truth_coin)`` and
    ``Fraction(p_yes)`` (each taken at its exact double value). ``.epsilon`` is computed from
    those exact rationals and rounded up (never below the true ε); ``.event`` records it.

    >>> import numpy as np
    >>> fr = ForcedResponse()
    >>> round(fr.epsilon, 12) == round(float(np.log(3)), 12)
    True
    >>> fr.release([0, 1, 1, 0, 1], rng=np.random.default_rng(0))
    array([1, 0, 1, 0, 0])
    >>> fr.estimate_frequency([1, 1, 0, 1]).proportion   # 2 * 3/4 - 1/2
    1.0
    """

    p_truth_coin: float = 0.5
    p_yes: float = 0.5
    neighbours: Neighbours = "replace"
    _a: Fraction = field(init=False, repr=False, compare=False)
    _y: Fraction = field(init=False, repr=False, compare=False)
    _epsilon: float = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        _check_local_neighbours(self.neighbours)
        a = _validate.probability(self.p_truth_coin, "p_truth_coin")
        y = _validate.probability(self.p_yes, "p_yes")
        af, yf = Fraction(a), Fraction(y)
        ratio_yes = (af + (1 - af) * yf) / ((1 - af) * yf)
        ratio_no = (af + (1 - af) * (1 - yf)) / ((1 - af) * (1 - yf))
        object.__setattr__(self, "p_truth_coin", a)
        object.__setattr__(self, "p_yes", y)
        object.__setattr__(self, "_a", af)
        object.__setattr__(self, "_y", yf)
        # An upper bound on the log-ratio, then a double whose decimal value is still above it: the
        # event's ε is read at its decimal value (dpkit._validate.decimal_fraction).
        bound = max(_log_upper(ratio_yes), _log_upper(ratio_no))
        object.__setattr__(self, "_epsilon", to_decimal_up(Fraction(bound)))

    @property
    def k(self) -> int:
        """Number of possible answers (always 2: no = 0, yes = 1)."""
        return 2

    @property
    def epsilon(self) -> float:
        """The realised ε, from the exact coin probabilities, rounded up."""
        return self._epsilon

    @property
    def event(self) -> PureDPEvent:
        """What one release costs per respondent: ``PureDPEvent(epsilon, neighbours="replace")``."""
        return PureDPEvent(epsilon=self._epsilon, neighbours=self.neighbours)

    def release(self, true_answers: ArrayLike, *, rng: RNG = None) -> NDArray[np.int64]:
        """Randomise each yes/no answer (0/1 or booleans); returns int64 reports of the same shape.

        ``rng=None`` uses the CSPRNG; pass a seeded ``numpy.random.Generator`` only for tests.
        Total on values: an element that is not 0 or 1 (or a boolean) is treated as 0 ("no").
        """
        truth = _answers(true_answers, 2, "true_answers", total=True)
        src = resolve_rng(rng)
        flat = truth.ravel()
        honest = bernoulli(self._a, flat.size, rng=src)
        forced = np.flatnonzero(~honest)
        out = flat.copy()
        out[forced] = bernoulli(self._y, forced.size, rng=src)
        return out.reshape(truth.shape)

    def estimate_frequency(self, reports: ArrayLike) -> FrequencyEstimate:
        """Unbiased estimate of the true proportions of "no" and "yes" from released reports.

        π̂ = (P̂(yes) − (1 − a)·y) / a; with fair coins π̂ = 2·P̂(yes) − 1/2 (Dwork & Roth 2014, §3.2).
        Post-processing: costs no budget.
        """
        r = _answers(reports, 2, "reports", total=False)
        counts = np.bincount(r.ravel(), minlength=2)
        # Report v has probability offset_v + a·π_v: offset_1 = (1 − a)y, offset_0 = (1 − a)(1 − y).
        n = int(counts.sum())
        observed = counts / n
        a = float(self._a)
        offset = np.array([float((1 - self._a) * (1 - self._y)), float((1 - self._a) * self._y)])
        estimate = (observed - offset) / a
        std_error = np.sqrt(observed * (1.0 - observed) / n) / a
        return FrequencyEstimate(
            estimate=_frozen(estimate), std_error=_frozen(std_error), observed=_frozen(observed), n=n
        )
