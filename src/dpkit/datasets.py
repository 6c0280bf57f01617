"""Small synthetic example data for the demo, the examples and the docs — generated, never downloaded.

The generators are deterministic: each takes an explicit integer ``seed`` (with a fixed default)
and uses its own ``numpy.random.default_rng(seed)``. That randomness only *makes up data*; it is
never used to protect anything. Privacy noise always comes from the mechanisms' own ``rng``
(the CSPRNG unless a seeded generator is passed explicitly).

* :func:`cheating_survey` — the exam-cheating survey of seed 000 §5.3.1: ``n`` students with a
  sensitive yes/no answer, exactly ``round(n · true_rate)`` of them "yes", so the true rate is
  known exactly and estimates can be checked against it.
* :func:`people` — a table of ages and yearly incomes for counting and histogram queries
  (seed 004 §3.3).

>>> s = cheating_survey(n=1000, true_rate=0.3)
>>> s.n, int(s.answers.sum()), s.true_rate
(1000, 300, 0.3)
>>> t = people(n=500)
>>> t.n, bool(t.age.min() >= 18), bool(t.age.max() <= 90)
(500, True, True)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from dpkit import _validate as v
from dpkit.errors import InvalidParameterError

__all__ = ["Survey", "People", "cheating_survey", "people", "AGE_MIN", "AGE_MAX", "DEFAULT_SEED"]

#: The seed the demo and the examples use for their example data.
DEFAULT_SEED = 20240607
AGE_MIN = 18
AGE_MAX = 90


def _frozen(a: NDArray) -> NDArray:  # type: ignore[type-arg]
    a.setflags(write=False)
    return a


def _seed(seed: object) -> int:
    if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool) or seed < 0:
        raise InvalidParameterError("seed", seed, "an integer >= 0")
    return int(seed)


@dataclass(frozen=True, eq=False)
class Survey:
    """Answers to one sensitive yes/no question ("have you ever cheated in an exam?").

    Attributes:
        answers: int64 array of 0 (no) / 1 (yes), one per student — the private data.
        true_rate: the exact fraction of "yes" answers in ``answers``.
    """

    answers: NDArray[np.int64]
    true_rate: float

    @property
    def n(self) -> int:
        return int(self.answers.size)


@dataclass(frozen=True, eq=False)
class People:
    """A table of people: integer ``age`` in [18, 90] and yearly ``income`` (a float, > 0)."""

    age: NDArray[np.int64]
    income: NDArray[np.float64]

    @property
    def n(self) -> int:
        return int(self.age.size)


def cheating_survey(n: int = 10_000, true_rate: float = 0.3, *, seed: int = DEFAULT_SEED) -> Survey:
    """``n`` students of whom exactly ``round(n · true_rate)`` answer "yes", in random order."""
    n = v.positive_int(n, "n")
    rate = v.probability(true_rate, "true_rate", low_open=False, high_open=False)
    yes = round(n * rate)
    answers = np.zeros(n, dtype=np.int64)
    answers[:yes] = 1
    answers = np.random.default_rng(_seed(seed)).permutation(answers)
    return Survey(answers=_frozen(answers), true_rate=yes / n)


def people(n: int = 5_000, *, seed: int = DEFAULT_SEED) -> People:
    """``n`` adults: ages from a smooth, working-age-heavy distribution on [18, 90] and incomes
    from a log-normal whose median rises with age until about 50 (values in currency units)."""
    n = v.positive_int(n, "n")
    rng = np.random.default_rng(_seed(seed))
    ages = np.arange(AGE_MIN, AGE_MAX + 1)
    weight = np.exp(-(((ages - 42.0) / 22.0) ** 2))  # a broad hump around 40
    age = rng.choice(ages, size=n, p=weight / weight.sum()).astype(np.int64)
    median = 28_000.0 + 900.0 * np.minimum(age - AGE_MIN, 32)
    income = median * np.exp(rng.normal(0.0, 0.55, size=n))
    return People(age=_frozen(age), income=_frozen(np.round(income, 2)))
