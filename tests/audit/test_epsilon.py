"""Statistical tests of :func:`dpkit.audit.estimate_epsilon`.

The samplers below are tiny numpy-only mechanisms written here on purpose, so that these tests do
not depend on ``dpkit.mechanisms``. Every "correct" mechanism is paired with a broken twin that
the audit must catch.

False-failure rates. Each test uses a fixed seed, so it passes or fails deterministically; the
rates below are over the choice of seed.

* Guarantee checks (``epsilon_lower <= true ε``) run at ``confidence = 1 − 1e-6``: by the
  Clopper–Pearson theorem and the split between selection and evaluation halves, a correct
  mechanism fails one with probability at most 1e-6.
* Power checks (a bound close to the true ε, a broken mechanism caught) were measured over 30
  seeds during development; each threshold sits more than 30 standard deviations from the mean,
  so the false-failure rate is far below 1e-6. The figures are in each test's comment.

The whole file runs in about a second.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from dpkit.audit import AuditResult, estimate_epsilon
from dpkit.audit import epsilon as epsilon_module
from dpkit.errors import InvalidDataError, InvalidParameterError

SEED = 20240531
STRICT = 1 - 1e-6  # confidence for every guarantee check
LN3 = math.log(3.0)


# --- tiny samplers: sampler(input, n, rng) -> n outputs ----------------------------------------


def laplace(scale: float):
    """Laplace mechanism on a scalar of sensitivity 1: ε = 1 / scale."""

    def sample(x: float, n: int, rng: np.random.Generator) -> np.ndarray:
        return x + rng.laplace(0.0, scale, size=n)

    return sample


def randomized_response(p_truth: float):
    """Report the input bit with probability p_truth, else flip it: ε = ln(p / (1 − p))."""

    def sample(bit: int, n: int, rng: np.random.Generator) -> np.ndarray:
        keep = rng.random(n) < p_truth
        return np.where(keep, bit, 1 - bit).astype(np.int64)

    return sample


def noisy_max(release: str, epsilon: float = 1.0):
    """Report-noisy-max over counting queries with Laplace(1/ε) noise (Dwork & Roth, Claim 3.9).

    ``release="argmax"`` is the real mechanism (ε-DP). ``release="value"`` is the classic bug of
    also publishing the noisy maximum itself: when one record moves k counts, the left tail of the
    maximum's density leaks k·ε.
    """

    def sample(counts: Any, n: int, rng: np.random.Generator) -> np.ndarray:
        c = np.asarray(counts, dtype=np.float64)
        noisy = c[None, :] + rng.laplace(0.0, 1.0 / epsilon, size=(n, c.shape[0]))
        return np.argmax(noisy, axis=1) if release == "argmax" else np.max(noisy, axis=1)

    return sample


def gaussian(sigma: float):
    def sample(x: float, n: int, rng: np.random.Generator) -> np.ndarray:
        return x + rng.normal(0.0, sigma, size=n)

    return sample


def ignores_input_continuous(x: Any, n: int, rng: np.random.Generator) -> np.ndarray:
    return rng.laplace(0.0, 1.0, size=n)


def ignores_input_many_values(x: Any, n: int, rng: np.random.Generator) -> np.ndarray:
    return rng.integers(0, 1000, size=n)


def audit(sampler, x0, x1, *, seed: int = SEED, **kwargs: Any) -> AuditResult:
    kwargs.setdefault("confidence", STRICT)
    return estimate_epsilon(sampler, x0, x1, rng=np.random.default_rng(seed), **kwargs)


# --- Laplace -----------------------------------------------------------------------------------


def test_correct_laplace_bound_is_valid_and_tight() -> None:
    result = audit(laplace(1.0), 0.0, 1.0, trials=400_000)
    # Guarantee: false failure <= 1e-6.
    assert result.epsilon_lower <= 1.0
    # Power: over 30 seeds the bound was 0.965 ± 0.006 (min 0.951); 0.7 is ~40 sd below.
    assert result.epsilon_lower >= 0.7


def test_broken_laplace_half_scale_is_caught() -> None:
    # Claims ε = 1 but uses scale 1/2 (true ε = 2). Over 30 seeds: 1.945 ± 0.009 (min 1.917).
    result = audit(laplace(0.5), 0.0, 1.0, trials=400_000)
    assert result.epsilon_lower > 1.0


def test_broken_laplace_is_caught_with_histogram_bins() -> None:
    # Same bug, "bins" events (64 equal-mass bins); the bound is weaker than with thresholds but
    # still far above 1 (true ε = 2). Over 30 seeds: 1.770 ± 0.039 (min 1.687): ~20 sd.
    result = audit(laplace(0.5), 0.0, 1.0, trials=400_000, events="bins", bins=64)
    assert result.epsilon_lower > 1.0


# --- randomized response -----------------------------------------------------------------------


def test_correct_randomized_response_bound_is_valid_and_tight() -> None:
    result = audit(randomized_response(0.75), 0, 1, trials=200_000)
    assert result.epsilon_lower <= LN3  # guarantee: false failure <= 1e-6
    # Power: over 30 seeds 1.063 ± 0.006 (min 1.048) against a threshold of 0.77: ~49 sd.
    assert result.epsilon_lower >= 0.7 * LN3
    assert result.event in {"Y = 0", "Y = 1", "Y >= 1", "Y <= 0"}


def test_broken_randomized_response_is_caught() -> None:
    # Reports the truth with probability 0.9 (true ε = ln 9 = 2.20) while claiming ln 3 = 1.10.
    # Over 30 seeds: 2.143 ± 0.010 (min 2.127).
    result = audit(randomized_response(0.9), 0, 1, trials=200_000)
    assert result.epsilon_lower > LN3


def test_boolean_outputs_are_audited() -> None:
    def rr_bool(bit: int, n: int, rng: np.random.Generator) -> np.ndarray:
        return (rng.random(n) < 0.9) == bool(bit)

    result = audit(rr_bool, 0, 1, trials=100_000)
    # True ε = ln 9. Over 30 seeds: 2.124 ± 0.010 (min 2.103) against ln 3 = 1.10.
    assert result.epsilon_lower > LN3
    assert result.event in {"Y = True", "Y = False"}


# --- report noisy max --------------------------------------------------------------------------

# One record moves the first two counts: neighbouring count vectors (0, 0, 0) and (1, 1, 0).
COUNTS0, COUNTS1 = [0, 0, 0], [1, 1, 0]


def test_report_noisy_max_argmax_is_valid() -> None:
    result = audit(noisy_max("argmax"), COUNTS0, COUNTS1, trials=200_000)
    assert result.epsilon_lower <= 1.0  # guarantee: false failure <= 1e-6
    assert result.event.startswith("Y ")


def test_report_noisy_max_leaking_the_max_value_is_caught() -> None:
    # Publishing the noisy maximum leaks 2ε here (left tail). Over 30 seeds: 1.849 ± 0.026
    # (min 1.808) against the claimed 1.0: ~33 sd.
    result = audit(noisy_max("value"), COUNTS0, COUNTS1, trials=200_000)
    assert result.epsilon_lower > 1.0


# --- mechanisms with no leak -------------------------------------------------------------------


@pytest.mark.parametrize("sampler", [ignores_input_continuous, ignores_input_many_values])
def test_mechanism_ignoring_its_input_gets_zero(sampler) -> None:
    # True ε = 0, so any positive bound is a guarantee failure: rate <= 1e-6 at STRICT.
    result = audit(sampler, 0, 1, trials=200_000)
    assert result.epsilon_lower < 0.05


def test_selection_bias_is_removed_by_the_split() -> None:
    # 1000 equally likely values and only 2,000 trials: choosing the best of ~3000 events on the
    # same data would "find" a large ε; selecting on one half and testing on the other does not.
    # Even at the default confidence 0.99 the bound exceeds 0 with probability <= 1%.
    result = estimate_epsilon(
        ignores_input_many_values, 0, 1, trials=2_000, events="values", rng=np.random.default_rng(SEED)
    )
    assert result.epsilon_lower == 0.0


def test_gaussian_with_delta_is_valid() -> None:
    # Classical calibration (Dwork & Roth, Thm A.1): σ = sqrt(2 ln(1.25/δ)) / ε is (1, 1e-5)-DP.
    delta = 1e-5
    sigma = math.sqrt(2.0 * math.log(1.25 / delta)) / 1.0
    result = audit(gaussian(sigma), 0.0, 1.0, trials=400_000, delta=delta)
    assert result.epsilon_lower <= 1.0  # guarantee: false failure <= 1e-6
    assert result.delta == delta


# --- mechanics of the estimator ----------------------------------------------------------------


def test_same_seed_same_result() -> None:
    a = audit(laplace(1.0), 0.0, 1.0, trials=10_000)
    b = audit(laplace(1.0), 0.0, 1.0, trials=10_000)
    assert a == b


def test_sampler_is_called_in_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(epsilon_module, "MAX_CHUNK", 300)
    sizes: list[int] = []

    def recording(x: float, n: int, rng: np.random.Generator) -> np.ndarray:
        sizes.append(n)
        return x + rng.laplace(0.0, 1.0, size=n)

    audit(recording, 0.0, 1.0, trials=1_001)
    assert max(sizes) <= 300
    assert sum(sizes) == 2 * 1_001  # trials per input, nothing drawn twice


def test_result_is_frozen_and_prints() -> None:
    result = audit(randomized_response(0.75), 0, 1, trials=1_000, progress=True)
    assert isinstance(result, AuditResult)
    assert result.trials == 1_000 and result.confidence == STRICT
    assert 0.0 <= result.p0 <= 1.0 and 0.0 <= result.p1 <= 1.0
    text = str(result)
    assert "ε ≥" in text and result.event in text and "1,000 trials" in text
    with pytest.raises(AttributeError):
        result.epsilon_lower = 5.0  # type: ignore[misc]


@pytest.mark.parametrize("events", ["auto", "values", "thresholds", "bins"])
def test_every_event_family_catches_broken_randomized_response(events: str) -> None:
    # True ε = ln 9. Over 30 seeds, for every family: 2.092 ± 0.014 (min 2.063) against ln 3.
    result = audit(randomized_response(0.9), 0, 1, trials=50_000, events=events)
    assert result.epsilon_lower > LN3


# --- invalid arguments: one test each ----------------------------------------------------------


def _ok(x: float, n: int, rng: np.random.Generator) -> np.ndarray:
    return x + rng.laplace(0.0, 1.0, size=n)


def _call(**overrides: Any) -> AuditResult:
    kwargs: dict[str, Any] = {"trials": 200, "rng": np.random.default_rng(SEED)}
    sampler = overrides.pop("sampler", _ok)
    kwargs.update(overrides)
    return estimate_epsilon(sampler, 0.0, 1.0, **kwargs)


def test_sampler_not_callable() -> None:
    with pytest.raises(InvalidParameterError) as err:
        _call(sampler="laplace")
    assert err.value.name == "sampler"


@pytest.mark.parametrize("trials", [99, 0, -5, 1000.0, True, "1000"])
def test_invalid_trials(trials: object) -> None:
    with pytest.raises(InvalidParameterError) as err:
        _call(trials=trials)
    assert err.value.name == "trials" and "100" in str(err.value)


@pytest.mark.parametrize("confidence", [0.0, 1.0, -0.5, 1.5, float("nan"), "0.99"])
def test_invalid_confidence(confidence: object) -> None:
    with pytest.raises(InvalidParameterError) as err:
        _call(confidence=confidence)
    assert err.value.name == "confidence"


@pytest.mark.parametrize("delta", [-1e-9, 1.0, 2.0, float("nan"), float("inf")])
def test_invalid_delta(delta: object) -> None:
    with pytest.raises(InvalidParameterError) as err:
        _call(delta=delta)
    assert err.value.name == "delta"


@pytest.mark.parametrize("events", ["histogram", "", None, 3])
def test_invalid_events(events: object) -> None:
    with pytest.raises(InvalidParameterError) as err:
        _call(events=events)
    assert err.value.name == "events" and "'thresholds'" in str(err.value)


@pytest.mark.parametrize("bins", [1, 0, 2.5])
def test_invalid_bins(bins: object) -> None:
    with pytest.raises(InvalidParameterError) as err:
        _call(bins=bins)
    assert err.value.name == "bins"


@pytest.mark.parametrize("rng", [None, 42, np.random.RandomState(0)])
def test_invalid_rng(rng: object) -> None:
    with pytest.raises(InvalidParameterError) as err:
        _call(rng=rng)
    assert err.value.name == "rng" and "default_rng" in str(err.value)


def test_rng_is_required() -> None:
    with pytest.raises(TypeError):
        estimate_epsilon(_ok, 0.0, 1.0, trials=200)  # type: ignore[call-arg]


def test_invalid_progress() -> None:
    with pytest.raises(InvalidParameterError) as err:
        _call(progress="yes")
    assert err.value.name == "progress"


@pytest.mark.parametrize(
    "bad",
    [
        lambda x, n, rng: np.zeros(n + 1),  # wrong length
        lambda x, n, rng: np.zeros((n, 2)),  # 2-D
        lambda x, n, rng: 0.0,  # a scalar
    ],
    ids=["length", "2d", "scalar"],
)
def test_sampler_wrong_shape(bad) -> None:
    with pytest.raises(InvalidDataError) as err:
        _call(sampler=bad)
    assert err.value.name == "sampler" and "shape" in str(err.value)


def test_sampler_non_finite_output() -> None:
    with pytest.raises(InvalidDataError) as err:
        _call(sampler=lambda x, n, rng: np.full(n, np.nan))
    assert err.value.name == "sampler" and "non-finite" in str(err.value)


def test_sampler_non_numeric_output() -> None:
    with pytest.raises(InvalidDataError) as err:
        _call(sampler=lambda x, n, rng: np.array(["a"] * n))
    assert err.value.name == "sampler" and "dtype" in str(err.value)
