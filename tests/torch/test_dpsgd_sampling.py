"""The DP-SGD batch samplers draw with exactly the parameters the accountant prices.

Statistical checks (fixed seeds, so deterministic; the false-failure rates are those of a
correct sampler under a fresh seed):
- Poisson total count over 400 steps of N = 2,000 at q = 0.05: |z| < 5.3 (rate 1.2e-7);
- the variance of the batch sizes against Nq(1−q): χ² with 399 degrees of freedom inside its
  1e-7 / 1 − 1e-7 quantiles (rate 2e-7);
- per-record inclusion counts against Binomial(400, q): χ² over the 2,000 records (rate 1e-6);
- fixed-size batches: each record's inclusion count against Binomial(steps, b/N) by χ² (rate
  1e-6), and no duplicates inside a batch.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from scipy import stats  # noqa: E402

from _stats import ALPHA, binomial_z  # noqa: E402
from dpkit.accounting import GaussianEvent, PoissonSampledEvent  # noqa: E402
from dpkit.errors import InvalidParameterError  # noqa: E402
from dpkit.noise.integers import bernoulli  # noqa: E402
from dpkit.torch import PoissonBatchSampler, UniformBatchSampler  # noqa: E402
from dpkit.torch.sampling import poisson_rate  # noqa: E402

SEED = 424242


def test_poisson_rate_is_one_number_for_sampler_and_accountant() -> None:
    for b, n in [(256, 60000), (1, 3), (64, 1797), (1, 10**7), (3, 2**40 + 1)]:
        q = poisson_rate(b, n)
        assert q.denominator <= 2**64
        assert Fraction(float(q)) == q  # exactly a double: the accountant's q is the sampler's
        assert q >= Fraction(b, n) or Fraction(float(Fraction(b, n))) == q
    s = PoissonBatchSampler(population=60000, batch_size=256, steps_per_epoch=1)
    assert s.step_event(1.1) == PoissonSampledEvent(s.sample_rate, GaussianEvent(1.1))
    assert s.expected_batch_size == pytest.approx(256)


def test_poisson_sampler_draws_exactly_bernoulli_q() -> None:
    """Same seeded source, same draws: the sampler is bernoulli(q) per record, nothing else."""
    s = PoissonBatchSampler(population=500, batch_size=30, steps_per_epoch=3, rng=np.random.default_rng(SEED))
    got = list(s)
    gen = np.random.default_rng(SEED)
    want = [np.flatnonzero(bernoulli(Fraction(s.sample_rate), 500, rng=gen)).tolist() for _ in range(3)]
    assert got == want
    assert s.batches_drawn == 3 and s.last_batch_size == len(got[-1])


def test_poisson_sampler_rate_and_independence() -> None:
    n, q_b, steps = 2000, 100, 400
    s = PoissonBatchSampler(population=n, batch_size=q_b, steps_per_epoch=steps, rng=np.random.default_rng(SEED))
    q = s.sample_rate
    assert q == 0.05
    batches = list(s)
    sizes = np.array([len(b) for b in batches])
    assert abs(binomial_z(int(sizes.sum()), n * steps, q)) < 5.3
    var_stat = (steps - 1) * sizes.var(ddof=1) / (n * q * (1 - q))
    assert stats.chi2.ppf(1e-7, steps - 1) < var_stat < stats.chi2.ppf(1 - 1e-7, steps - 1)
    counts = np.bincount(np.concatenate(batches), minlength=n)
    pmf = stats.binom.pmf(np.arange(steps + 1), steps, q)
    support = np.arange(steps + 1)
    from _stats import chi2_pvalue

    assert chi2_pvalue(counts, support, pmf) > ALPHA
    assert all(len(set(b)) == len(b) for b in batches)


def test_uniform_sampler_is_uniform_without_replacement() -> None:
    n, b, steps = 60, 12, 3000
    s = UniformBatchSampler(population=n, batch_size=b, steps_per_epoch=steps, rng=np.random.default_rng(SEED))
    batches = list(s)
    assert all(len(x) == b and len(set(x)) == b and min(x) >= 0 and max(x) < n for x in batches)
    counts = np.bincount(np.concatenate(batches), minlength=n)
    expected = steps * b / n
    chi2 = ((counts - expected) ** 2 / (expected * (1 - b / n))).sum()
    assert chi2 < stats.chi2.ppf(1 - ALPHA, n - 1)
    # pairs: P(i and j together) = b(b−1)/(n(n−1)); check the pair (0, 1) at 5.3 σ
    together = sum(1 for x in batches if 0 in x and 1 in x)
    assert abs(binomial_z(together, steps, b * (b - 1) / (n * (n - 1)))) < 5.3


def test_sampler_validation() -> None:
    with pytest.raises(InvalidParameterError, match="batch_size"):
        PoissonBatchSampler(population=10, batch_size=11, steps_per_epoch=1)
    with pytest.raises(InvalidParameterError, match="batch_size"):
        UniformBatchSampler(population=10, batch_size=0, steps_per_epoch=1)
    with pytest.raises(InvalidParameterError, match="population"):
        PoissonBatchSampler(population=0, batch_size=1, steps_per_epoch=1)
