"""Reconstruction attacks on subset-sum query interfaces (Dwork & Roth 2014, §8.1).

A curator holds a secret bit vector x ∈ {0,1}^n (one sensitive bit per person) and answers
*subset-sum* queries q_S(x) = Σ_{i∈S} x_i with some error. The attacks here show why "a little
noise" does not protect x, and why dpkit's Laplace noise does:

* The exhaustive attack (Dinur & Nissim 2003; Dwork & Roth 2014, Thm 8.1): an analyst who may ask
  all 2^n subset queries of a curator whose every answer is within E of the truth finds a candidate
  c with Hamming distance ≤ 4E from x — any c consistent with every answer to within E. Proof: on
  I_0 = {i : x_i = 0} both c and x are within E of r(I_0), so c has at most 2E ones there; same for
  the zeros of c on I_1.
* The LP attack (Dinur & Nissim 2003; Dwork & Roth 2014, Thm 8.2): with O(n) *random* subset queries
  and error E = o(√n), an LP (or least squares) followed by rounding recovers all but o(n) bits: the
  curator is *blatantly non-private* (BNP, Dinur & Nissim 2003: the reconstruction differs from x in
  o(n) positions; we call a run BNP when it recovers at least :data:`BNP_THRESHOLD` of the bits).
* Diffix (Cohen & Nissim 2018): "sticky" noise — a deterministic pseudo-random
  function of the query's conditions — makes repeating a query useless, but logically equivalent
  queries with different (dummy) conditions get independent noise, and averaging them removes it.

Against :class:`DPCurator` — each answer is a dpkit ε-DP Laplace release and every query is
debited from a :class:`dpkit.Budget` before it is answered — the attack either runs out of budget
after a few queries (:class:`~dpkit.errors.BudgetExceededError`) or, with a total ε split over
its 4n queries, sees noise of scale 4n/ε ≫ √n and recovers about half the bits (guessing).

Attack model: these are *demonstrations* that run the attacker and the curator in one process.
The attacks only call ``curator.query``/``query_many``; the score (recovered fraction, Hamming
errors) is computed afterwards from ``curator.secret``, which an attacker would not have.
The naive and sticky curators draw their noise from numpy generators: they model broken systems
and are not meant to be secure.

>>> import numpy as np
>>> x = np.random.default_rng(0).integers(0, 2, 40)
>>> cur = NaiveCurator(x, noise_bound=1.0, rng=np.random.default_rng(1))
>>> res = dinur_nissim_attack(cur, 40, rng=np.random.default_rng(2))
>>> res.recovered_fraction > 0.9 and res.blatantly_non_private
True
"""

from __future__ import annotations

import hashlib
import math
import struct
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from numbers import Integral, Real
from typing import Any, Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy.optimize import linprog

from dpkit._validate import decimal_fraction
from dpkit.accounting.rounding import to_decimal_down
from dpkit.budget import Budget
from dpkit.errors import InvalidDataError, InvalidParameterError
from dpkit.mechanisms.laplace import Laplace
from dpkit.noise.source import RNG, resolve_rng

__all__ = [
    "BNP_THRESHOLD",
    "MAX_EXHAUSTIVE_N",
    "Curator",
    "NaiveCurator",
    "StickyCurator",
    "DPCurator",
    "IdentifierCondition",
    "ReconstructionResult",
    "split_epsilon",
    "exhaustive_attack",
    "dinur_nissim_attack",
    "diffix_attack",
]

BNP_THRESHOLD = 0.9
"""A run is reported blatantly non-private when it recovers at least this fraction of the bits."""

MAX_EXHAUSTIVE_N = 16
"""The exhaustive attack asks 2^n queries and scans 2^n candidates; refused above this n."""


# ------------------------------------------------------------------------------------------------
# validation helpers
# ------------------------------------------------------------------------------------------------


def _check_n(n: object, name: str = "n") -> int:
    if not isinstance(n, Integral) or isinstance(n, bool) or int(n) < 1:
        raise InvalidParameterError(name, n, "an integer >= 1")
    return int(n)


def _check_bound(value: object, name: str) -> float:
    """A bound E on each answer's error (``noise_bound``, ``error_bound``; docs/glossary.md:
    ``noise`` names a kind of noise, never an amount)."""
    if not isinstance(value, Real) or isinstance(value, bool) or not math.isfinite(float(value)) or float(value) < 0:
        raise InvalidParameterError(name, value, "a finite number >= 0 (the bound on each answer's error)")
    return float(value)


def _check_bits(x: ArrayLike) -> NDArray[np.int64]:
    try:
        arr = np.asarray(x)
    except Exception as exc:
        raise InvalidDataError("x", f"cannot be read as an array ({exc})", "a 1-d array of 0/1 bits") from exc
    if arr.ndim != 1 or arr.size == 0:
        raise InvalidDataError("x", f"has shape {arr.shape}", "a non-empty 1-d array of 0/1 bits")
    if arr.dtype.kind not in "biuf" or not np.all((arr == 0) | (arr == 1)):
        bad = arr[~((arr == 0) | (arr == 1))][:3] if arr.dtype.kind in "biuf" else arr.dtype
        raise InvalidDataError("x", f"is not binary (e.g. {bad!r})", "a 1-d array of 0/1 bits")
    return arr.astype(np.int64)


def _generator(rng: object) -> np.random.Generator:
    """A numpy generator for attack randomness and the naive curators (not a privacy mechanism)."""
    if rng is None:
        return np.random.default_rng()
    if isinstance(rng, np.random.Generator):
        return rng
    if isinstance(rng, Integral) and not isinstance(rng, bool):
        return np.random.default_rng(int(rng))
    raise InvalidParameterError("rng", rng, "None, an int seed or a numpy.random.Generator")


def _as_mask(subset: ArrayLike, n: int) -> NDArray[np.bool_]:
    s = np.asarray(subset)
    if s.dtype == bool:
        if s.shape != (n,):
            raise InvalidDataError(
                "subset", f"boolean mask of shape {s.shape}", f"a mask of shape ({n},) or indices in [0, {n})"
            )
        return s
    if s.dtype.kind not in "iu" or s.ndim > 1 or (s.size and (s.min() < 0 or s.max() >= n)):
        raise InvalidDataError(
            "subset",
            f"dtype {s.dtype}, shape {s.shape}",
            f"a boolean mask of shape ({n},) or integer indices in [0, {n})",
        )
    mask = np.zeros(n, dtype=bool)
    mask[s] = True
    return mask


def _as_masks(subsets: ArrayLike, n: int) -> NDArray[np.bool_]:
    q = np.asarray(subsets)
    if q.ndim != 2 or q.shape[1] != n or q.dtype.kind not in "biu" or not np.all((q == 0) | (q == 1)):
        raise InvalidDataError(
            "subsets", f"dtype {q.dtype}, shape {q.shape}", f"a 0/1 matrix with {n} columns, one query per row"
        )
    return q.astype(bool)


# ------------------------------------------------------------------------------------------------
# curators
# ------------------------------------------------------------------------------------------------


class Curator:
    """A subset-sum interface to attack: the secret bits (for scoring only) and the queries
    answered. Subclass it and implement :meth:`query_many` to point the attacks at another
    interface — e.g. an HTTP service, as dpkit's own server tests do."""

    noise_bound: float  # the promised bound E on |answer − truth| (inf for DP noise)

    def __init__(self, x: ArrayLike) -> None:
        self._x = _check_bits(x)
        self.queries_answered = 0

    @property
    def n(self) -> int:
        return int(self._x.size)

    @property
    def secret(self) -> NDArray[np.int64]:
        """The secret bits — for *scoring* an attack only; the attacks never read it."""
        return self._x.copy()

    def query(self, subset: ArrayLike) -> float:
        """The noisy count Σ_{i∈S} x_i for one subset (boolean mask or indices)."""
        return float(self.query_many(_as_mask(subset, self.n)[None, :])[0])

    def query_many(self, subsets: ArrayLike) -> NDArray[np.float64]:
        raise NotImplementedError


class NaiveCurator(Curator):
    """Answers each subset-sum query with fresh uniform noise in [−E, E], E = ``noise_bound``.

    Repeating a query gives a fresh answer, so averaging repeats alone defeats it; the attacks
    here use distinct queries and do not rely on that.
    """

    def __init__(
        self,
        x: ArrayLike,
        *,
        noise_bound: float,
        rng: np.random.Generator | int | None = None,
    ) -> None:
        super().__init__(x)
        self.noise_bound = _check_bound(noise_bound, "noise_bound")
        self._rng = _generator(rng)

    def query_many(self, subsets: ArrayLike) -> NDArray[np.float64]:
        q = _as_masks(subsets, self.n)
        truth = q.astype(np.int64) @ self._x
        self.queries_answered += len(q)
        return truth + self._rng.uniform(-self.noise_bound, self.noise_bound, size=len(q))


@dataclass(frozen=True)
class IdentifierCondition:
    """A WHERE-clause condition on the row identifier: keep rows with (mult·id + offset) mod modulus ≠ 0.

    The Cohen–Nissim attack on Diffix used conditions of this kind (arithmetic on clientId) to
    build many syntactically different queries selecting the rows the analyst wants.
    """

    mult: int
    offset: int
    modulus: int

    def __post_init__(self) -> None:
        for name in ("mult", "offset", "modulus"):
            value = getattr(self, name)
            if not isinstance(value, Integral) or isinstance(value, bool):
                raise InvalidParameterError(name, value, "an integer")
        if self.modulus < 2:
            raise InvalidParameterError("modulus", self.modulus, "an integer >= 2")

    def holds(self, ids: NDArray[np.int64]) -> NDArray[np.bool_]:
        return (self.mult * ids + self.offset) % self.modulus != 0


class StickyCurator(Curator):
    """Diffix-style "sticky" noise: bounded noise that is a deterministic function of the query.

    The noise of a query is uniform in [−E, E] (E = ``noise_bound``), derived with keyed BLAKE2b from the
    query's *conditions* (the subset named in the query and any :class:`IdentifierCondition`),
    so asking the same query again returns the same answer and averaging repeats gains nothing.
    The rows counted are those in the subset for which every condition holds.

    Simplification: real Diffix adds further noise layers (seeded by the rows selected) and
    suppresses low counts; Cohen & Nissim's attack on the deployed system shows
    those do not stop equivalent-query averaging either.
    """

    def __init__(
        self,
        x: ArrayLike,
        *,
        noise_bound: float,
        rng: np.random.Generator | int | None = None,
    ) -> None:
        super().__init__(x)
        self.noise_bound = _check_bound(noise_bound, "noise_bound")
        self._key = _generator(rng).bytes(32)  # the curator's secret salt
        self._ids = np.arange(self.n, dtype=np.int64)

    def _noise(self, mask: NDArray[np.bool_], conditions: Sequence[IdentifierCondition]) -> float:
        h = hashlib.blake2b(key=self._key, digest_size=8)
        h.update(np.packbits(mask).tobytes())
        for c in conditions:
            h.update(struct.pack("<3q", c.mult, c.offset, c.modulus))
        u = int.from_bytes(h.digest(), "little") / 2.0**64  # in [0, 1)
        return (2.0 * u - 1.0) * self.noise_bound

    def query(self, subset: ArrayLike, conditions: Sequence[IdentifierCondition] = ()) -> float:
        mask = _as_mask(subset, self.n)
        for c in conditions:
            if not isinstance(c, IdentifierCondition):
                raise InvalidParameterError("conditions", c, "a sequence of IdentifierCondition")
        rows = mask.copy()
        for c in conditions:
            rows &= c.holds(self._ids)
        self.queries_answered += 1
        return float(self._x[rows].sum()) + self._noise(mask, tuple(conditions))

    def query_many(self, subsets: ArrayLike) -> NDArray[np.float64]:
        q = _as_masks(subsets, self.n)
        return np.array([self.query(row) for row in q], dtype=np.float64)


def split_epsilon(total_epsilon: float, queries: int) -> float:
    """The largest double ε such that ``queries`` Laplace releases at ε fit in ``total_epsilon``.

    The budget adds the ε's at their decimal values (docs/architecture.md, "Privacy arithmetic"):
    this is total/k rounded so that k times the decimal value of the result is at most the
    decimal value of the total, exactly.

    >>> split_epsilon(1.0, 400)
    0.0025
    >>> eps = split_epsilon(1.0, 3)
    >>> from fractions import Fraction
    >>> 3 * Fraction(repr(eps)) <= 1
    True
    """
    if not isinstance(total_epsilon, Real) or not math.isfinite(float(total_epsilon)) or float(total_epsilon) <= 0:
        raise InvalidParameterError("total_epsilon", total_epsilon, "a finite number > 0")
    k = _check_n(queries, "queries")
    return to_decimal_down(decimal_fraction(float(total_epsilon)) / k)


class DPCurator(Curator):
    """Answers through dpkit's Laplace mechanism (sensitivity 1, ε per query) under a budget.

    A subset-sum query changes by at most 1 when one person is added or removed, so each answer
    ``Laplace(epsilon=epsilon_per_query, sensitivity=1).release(count)`` is ε-DP (Dwork & Roth 2014,
    Thm 3.6). Before answering, the mechanism's ``LaplaceEvent`` is spent on ``budget``; when the
    budget cannot pay, :class:`~dpkit.errors.BudgetExceededError` is raised and nothing is released.
    For many queries use :func:`split_epsilon` to choose ``epsilon_per_query``.
    """

    noise_bound = math.inf

    def __init__(self, x: ArrayLike, *, budget: Budget, epsilon_per_query: float, rng: RNG = None) -> None:
        super().__init__(x)
        if not isinstance(budget, Budget):
            raise InvalidParameterError("budget", budget, "a dpkit.Budget")
        self._budget = budget
        self._mech = Laplace(epsilon=epsilon_per_query, sensitivity=1.0)
        self._source = resolve_rng(rng)

    @property
    def budget(self) -> Budget:
        return self._budget

    @property
    def mechanism(self) -> Laplace:
        return self._mech

    def query_many(self, subsets: ArrayLike) -> NDArray[np.float64]:
        q = _as_masks(subsets, self.n)
        truth = q.astype(np.int64) @ self._x
        out = np.empty(len(q), dtype=np.float64)
        for j, t in enumerate(truth):
            self._budget.spend(self._mech.event)  # debit first; raises and releases nothing when spent
            out[j] = self._mech.release(float(t), rng=self._source)
            self.queries_answered += 1
        return out


# ------------------------------------------------------------------------------------------------
# results
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReconstructionResult:
    """What an attack achieved: the reconstruction and how close it is to the secret."""

    attack: str
    n: int
    reconstruction: NDArray[np.int64] = field(repr=False, compare=False)
    recovered_fraction: float
    hamming_errors: int
    queries_used: int
    seconds: float
    blatantly_non_private: bool
    guarantee: float | None = None  # a proven bound on hamming_errors, where the theorem gives one

    @property
    def within_guarantee(self) -> bool | None:
        return None if self.guarantee is None else self.hamming_errors <= self.guarantee


def _score(
    attack: str, curator: Curator, c: NDArray[Any], queries: int, t0: float, guarantee: float | None = None
) -> ReconstructionResult:
    c = np.asarray(c, dtype=np.int64)
    errors = int(np.sum(c != curator.secret))
    frac = (curator.n - errors) / curator.n
    return ReconstructionResult(
        attack=attack,
        n=curator.n,
        reconstruction=c,
        recovered_fraction=frac,
        hamming_errors=errors,
        queries_used=queries,
        seconds=time.perf_counter() - t0,
        blatantly_non_private=frac >= BNP_THRESHOLD,
        guarantee=guarantee,
    )


def _check_curator(curator: object, n: int) -> Curator:
    if not isinstance(curator, Curator):
        raise InvalidParameterError("curator", curator, "a NaiveCurator, StickyCurator or DPCurator")
    if curator.n != n:
        raise InvalidParameterError("n", n, f"the curator's n = {curator.n}")
    return curator


def _all_subsets(n: int) -> NDArray[np.int8]:
    codes = np.arange(2**n, dtype=np.int64)
    return ((codes[:, None] >> np.arange(n)) & 1).astype(np.int8)


# ------------------------------------------------------------------------------------------------
# attacks
# ------------------------------------------------------------------------------------------------


def exhaustive_attack(
    curator: Curator, n: int, *, error_bound: float | None = None, block: int = 256
) -> ReconstructionResult:
    """The exhaustive attack: ask all 2^n subset sums, return a candidate consistent with all within E.

    ``error_bound`` is E, by default the curator's promised ``noise_bound``. Any consistent
    candidate is within Hamming distance 4E of the secret (``result.guarantee``). Candidates are
    filtered against the queries block by block so most are rejected after the first block;
    n is limited to :data:`MAX_EXHAUSTIVE_N`.
    """
    n = _check_n(n)
    if n > MAX_EXHAUSTIVE_N:
        raise InvalidParameterError("n", n, f"an integer in [1, {MAX_EXHAUSTIVE_N}] (the attack asks 2^n queries)")
    curator = _check_curator(curator, n)
    E = curator.noise_bound if error_bound is None else _check_bound(error_bound, "error_bound")
    if not math.isfinite(E):
        raise InvalidParameterError("error_bound", E, "a finite bound E on each answer's error (DP noise is unbounded)")
    t0 = time.perf_counter()
    subsets = _all_subsets(n)
    answers = curator.query_many(subsets)
    order = np.random.default_rng(0).permutation(len(subsets))  # mix small and large sets early
    candidates = subsets.astype(np.int32)  # the candidates are the same 2^n bit vectors
    alive = np.arange(len(candidates))
    tol = E + 1e-9
    for start in range(0, len(order), block):
        rows = order[start : start + block]
        sums = candidates[alive] @ subsets[rows].T.astype(np.int32)
        ok = np.all(np.abs(sums - answers[rows]) <= tol, axis=1)
        alive = alive[ok]
        if len(alive) <= 1:
            break
    if len(alive) == 0:  # only when the curator broke its promise |error| <= E
        raise InvalidDataError(
            "answers", f"no candidate is consistent within E={E}", "a curator whose errors are at most E"
        )
    if len(alive) > 1:  # verify the first survivor against every query
        alive = alive[:1]
    c = candidates[alive[0]]
    if not np.all(np.abs(subsets.astype(np.int32) @ c - answers) <= tol):
        raise InvalidDataError(
            "answers", f"no candidate is consistent within E={E}", "a curator whose errors are at most E"
        )
    return _score("exhaustive", curator, c, len(subsets), t0, guarantee=4 * E)


Method = Literal["lp", "lp_max", "lstsq"]


def _solve(Q: NDArray[np.float64], r: NDArray[np.float64], method: str) -> NDArray[np.float64]:
    m, n = Q.shape
    if method == "lstsq":
        return np.asarray(np.linalg.lstsq(Q, r, rcond=None)[0], dtype=np.float64)
    if method == "lp":  # min Σ_j e_j  s.t. −e ≤ Qc − r ≤ e, 0 ≤ c ≤ 1
        cost = np.concatenate([np.zeros(n), np.ones(m)])
        eye = np.eye(m)
        A = np.block([[Q, -eye], [-Q, -eye]])
        bounds = [(0, 1)] * n + [(0, None)] * m
    elif method == "lp_max":  # min t  s.t. −t ≤ Qc − r ≤ t, 0 ≤ c ≤ 1
        cost = np.concatenate([np.zeros(n), [1.0]])
        ones = np.ones((m, 1))
        A = np.block([[Q, -ones], [-Q, -ones]])
        bounds = [(0, 1)] * n + [(0, None)]
    else:
        raise InvalidParameterError("method", method, "'lp', 'lp_max' or 'lstsq'")
    b = np.concatenate([r, -r])
    res = linprog(cost, A_ub=A, b_ub=b, bounds=bounds, method="highs")
    if res.status != 0:
        raise InvalidDataError("answers", f"the linear program failed: {res.message}", "answers the LP can fit")
    return res.x[:n]


def dinur_nissim_attack(
    curator: Curator,
    n: int,
    *,
    queries: int | None = None,
    method: Method = "lp",
    rng: np.random.Generator | int | None = None,
) -> ReconstructionResult:
    """The LP attack (Dinur–Nissim): ``queries`` (default 4n) uniformly random subsets, then fit and round.

    ``method``: ``"lp"`` minimises the total (L1) error Σ|Qc − r| over c ∈ [0,1]^n (scipy
    ``linprog``/HiGHS); ``"lp_max"`` minimises the largest error (the "consistent within E" form of
    the exhaustive attack); ``"lstsq"`` is ordinary least squares (fast at n = 1000). Each
    coordinate is then rounded at 1/2. Raises :class:`~dpkit.errors.BudgetExceededError` from a
    :class:`DPCurator` whose budget cannot pay for the queries.
    """
    n = _check_n(n)
    curator = _check_curator(curator, n)
    m = 4 * n if queries is None else _check_n(queries, "queries")
    if method not in ("lp", "lp_max", "lstsq"):
        raise InvalidParameterError("method", method, "'lp', 'lp_max' or 'lstsq'")
    gen = _generator(rng)
    t0 = time.perf_counter()
    Q = gen.integers(0, 2, size=(m, n), dtype=np.int8)
    r = curator.query_many(Q)
    c = _solve(Q.astype(np.float64), r, method)
    return _score(f"dinur_nissim[{method}]", curator, (c >= 0.5).astype(np.int64), m, t0)


def diffix_attack(
    curator: StickyCurator,
    n: int,
    *,
    repeats: int = 32,
    targets: ArrayLike | None = None,
    modulus: int = 1_000_003,
    rng: np.random.Generator | int | None = None,
) -> ReconstructionResult:
    """Defeat sticky noise by averaging logically equivalent queries (Cohen & Nissim 2018).

    For each target i the attacker asks ``repeats`` queries "id = i AND (mult·id + offset) mod p ≠ 0"
    with pseudo-random (mult, offset) chosen so the dummy condition holds for i. Every query
    counts exactly the row i, but each has different conditions, hence independent sticky noise;
    the mean of ``repeats`` answers has error about noise/√(3·repeats), and rounding it recovers x_i.
    ``targets`` (default all of 0..n−1) limits the bits attacked; the others are scored as 0.
    """
    n = _check_n(n)
    if not isinstance(curator, StickyCurator):
        raise InvalidParameterError("curator", curator, "a StickyCurator")
    curator = _check_curator(curator, n)  # type: ignore[assignment]
    k = _check_n(repeats, "repeats")
    p = _check_n(modulus, "modulus")
    idx = np.arange(n) if targets is None else np.unique(np.asarray(targets, dtype=np.int64))
    if idx.size and (idx.min() < 0 or idx.max() >= n):
        raise InvalidDataError("targets", "has indices outside [0, n)", f"indices in [0, {n})")
    gen = _generator(rng)
    t0 = time.perf_counter()
    c = np.zeros(n, dtype=np.int64)
    used = 0
    for i in idx:
        total = 0.0
        seen: set[tuple[int, int]] = set()
        while len(seen) < k:
            mult, offset = (int(v) for v in gen.integers(1, p, size=2))
            if (mult * int(i) + offset) % p == 0 or (mult, offset) in seen:
                continue  # the dummy condition must hold for the target and be new
            seen.add((mult, offset))
            total += curator.query(np.array([i]), conditions=(IdentifierCondition(mult, offset, p),))
            used += 1
        c[i] = int(total / k >= 0.5)
    return _score("diffix", curator, c, used, t0)
