"""Behaviour, validation and event tests of the sparse vector technique."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dpkit.accounting.events import ComposedEvent, PureDPEvent, SelfComposedEvent
from dpkit.errors import InvalidDataError, InvalidParameterError
from dpkit.mechanisms.sparse_vector import AboveThreshold, NumericSparse, Sparse
from dpkit.mechanisms.svt_applications import (
    choose_clipping_bound,
    clipping_queries,
    range_queries_above_threshold,
    range_queries_event,
    svt_private_mean,
)


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def test_first_positive_found_for_clear_gap():
    at = AboveThreshold(epsilon=2.0, threshold=100.0)
    q = [0.0] * 50 + [10_000.0] + [0.0] * 10 + [10_000.0]
    assert all(at.release(q, rng=rng(s)) == 50 for s in range(20))
    assert all(at.release(np.array(q), rng=rng(s)) == 50 for s in range(5))


def test_none_vs_random_ending():
    q = [-1e4] * 7
    assert AboveThreshold(epsilon=1.0, threshold=0.0).release(q, rng=rng()) is None
    picks = {AboveThreshold(epsilon=1.0, threshold=0.0, on_fail="random").release(q, rng=rng(s)) for s in range(200)}
    assert picks == set(range(7))


def test_stream_stops_consuming_after_positive():
    pulled = []

    def gen():
        for i in range(1000):
            pulled.append(i)
            yield 1e5 if i == 30 else 0.0

    assert AboveThreshold(epsilon=1.0, threshold=100.0).release(gen(), rng=rng()) == 30
    assert len(pulled) == 31


def test_stream_of_callables_with_data():
    data = np.arange(100)
    queries = (lambda d, k=k: float((d < k).sum()) for k in range(0, 100, 10))
    assert AboveThreshold(epsilon=5.0, threshold=55.0).release(queries, data, rng=rng()) in (5, 6, 7)


def test_sparse_returns_at_most_c_and_stops_stream():
    sp = Sparse(epsilon=3.0, threshold=50.0, max_positives=3)
    q = [1e4] * 10
    assert sp.release(q, rng=rng()) == [0, 1, 2]
    pulled = []

    def gen():
        for i in range(100):
            pulled.append(i)
            yield 1e4 if i % 10 == 9 else 0.0

    assert sp.release(gen(), rng=rng()) == [9, 19, 29]
    assert len(pulled) == 30
    assert sp.release([0.0] * 5, rng=rng()) == []


def test_numeric_sparse_values_close_for_large_epsilon():
    ns = NumericSparse(epsilon=90.0, threshold=50.0, max_positives=2)
    out = ns.release([0, 1000, 0, 2000, 3000], rng=rng())
    assert [i for i, _ in out] == [1, 3]
    assert all(abs(x - t) < 5 for (_, x), t in zip(out, [1000, 2000], strict=True))
    assert math.isclose(ns.value_scale, 2 / 10.0, rel_tol=1e-9)  # cΔ/ε_val = 2/(90/9)


def test_release_batch_matches_release_in_distribution():
    at = AboveThreshold(epsilon=1.0, threshold=2.0)
    q = [0.0, 1.0, 2.0, 3.0]
    batch = at.release_batch(q, 20_000, rng=rng(1))
    g = rng(2)
    single = np.array([-1 if (r := at.release(q, rng=g)) is None else r for _ in range(4000)])
    for k in (-1, 0, 1, 2, 3):
        assert abs(np.mean(batch == k) - np.mean(single == k)) < 0.04


def test_events():
    assert AboveThreshold(epsilon=0.7, threshold=1.0).event == PureDPEvent(epsilon=0.7)
    assert Sparse(epsilon=0.7, threshold=1.0, max_positives=3).event == PureDPEvent(epsilon=0.7)
    ev = NumericSparse(epsilon=0.9, threshold=1.0, max_positives=3).event
    assert isinstance(ev, ComposedEvent) and isinstance(ev.events[1], SelfComposedEvent)
    sel, vals = ev.events
    assert sel.epsilon + vals.count * vals.event.epsilon <= 0.9 + 1e-12
    assert math.isclose(sel.epsilon, 0.8) and math.isclose(vals.event.epsilon, 0.1 / 3)
    assert range_queries_event(1.0, 4).events[0].epsilon == 0.5


def test_event_matches_noise_drawn():
    at = AboveThreshold(epsilon=0.5, threshold=0.0, sensitivity=2.0)
    plan = at.noise_plan()
    g = plan.granularity
    assert plan.steps == math.floor(2.0 / g) + 1
    assert math.isclose(float(plan.threshold_scale) * g, 2 * 2.0 / 0.5, rel_tol=1e-5)
    assert math.isclose(float(plan.query_scale) * g, 4 * 2.0 / 0.5, rel_tol=1e-5)
    # the privacy implied by the lattice noise is exactly the event's ε
    assert 2 * plan.steps / plan.threshold_scale == at.event.epsilon
    sp = Sparse(epsilon=0.5, threshold=0.0, max_positives=4).noise_plan()
    assert 2 * sp.steps / sp.threshold_scale * 4 == 0.5


def test_rng_reproducible():
    q = np.linspace(-5, 5, 200)
    a = [Sparse(epsilon=1.0, threshold=0.0, max_positives=3).release(q, rng=rng(9)) for _ in range(2)]
    assert a[0] == a[1]


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(epsilon=0.0, threshold=1.0),
        dict(epsilon=-1.0, threshold=1.0),
        dict(epsilon=float("nan"), threshold=1.0),
        dict(epsilon=1.0, threshold=float("inf")),
        dict(epsilon=1.0, threshold="1"),
        dict(epsilon=1.0, threshold=1.0, on_fail="raise"),
        dict(epsilon=1.0, threshold=1.0, sensitivity=0.0),
        dict(epsilon=1.0, threshold=1.0, monotonic=1),
    ],
)
def test_bad_parameters(kwargs):
    with pytest.raises(InvalidParameterError):
        AboveThreshold(**kwargs)


@pytest.mark.parametrize("c", [0, -1, 1.5, True])
def test_bad_max_positives(c):
    with pytest.raises(InvalidParameterError, match="max_positives"):
        Sparse(epsilon=1.0, threshold=0.0, max_positives=c)


@pytest.mark.parametrize("split", [(0.9, 0.2), (0.0, 1.0), (1.0,), "ab"])
def test_bad_split(split):
    with pytest.raises(InvalidParameterError):
        NumericSparse(epsilon=1.0, threshold=0.0, max_positives=1, split=split)


@pytest.mark.parametrize("queries", [[], np.zeros((2, 2)), ["a"], 5, iter([]), iter([1.0, "secret"])])
def test_bad_queries(queries):
    with pytest.raises(InvalidDataError) as info:
        AboveThreshold(epsilon=1.0, threshold=1e9).release(queries, rng=rng())
    assert "secret" not in str(info.value)


@pytest.mark.parametrize("stream", [False, True])
def test_non_finite_queries_are_clamped_not_refused(stream):
    # Used to raise. NaN counts as 0 and ±inf compare as ±M; same randomness, same answer.
    at = AboveThreshold(epsilon=1.0, threshold=5.0)
    m = at.noise_plan().value_limit
    q1 = [1.0, float("nan"), -float("inf"), float("inf"), 2.0]
    q2 = [1.0, 0.0, -m, m, 2.0]
    wrap = iter if stream else list
    assert at.release(wrap(q1), rng=rng(1)) == at.release(wrap(q2), rng=rng(1)) == 3


def test_callable_without_data_rejected():
    with pytest.raises(InvalidDataError):
        AboveThreshold(epsilon=1.0, threshold=1e9).release(iter([lambda d: 1.0]), rng=rng())


def test_clipping_queries_and_bound():
    assert clipping_queries([0.5, 2.0, 7.0], [1, 2, 8]).tolist() == [-2.0, -1.0, -0.0]
    ages = rng(0).integers(18, 90, size=20_000)
    b = choose_clipping_bound(ages, epsilon=1.0, max_bound=500, step=5, rng=rng(1))
    assert 80 <= b <= 120
    with pytest.raises(InvalidParameterError):
        choose_clipping_bound(ages, epsilon=1.0, max_bound=0)


def test_svt_private_mean():
    x = rng(0).uniform(0, 50, size=50_000)
    r = svt_private_mean(x, epsilon=1.0, max_bound=1000, rng=rng(3))
    assert abs(r.mean - x.mean()) < 1.0 and 45 <= r.bound <= 70
    assert sum(e.epsilon for e in r.event.events) <= 1.0


def test_range_queries():
    ages = rng(0).integers(18, 90, size=10_000)
    out = range_queries_above_threshold(
        ages, [(20, 22), (30, 60), (85, 86), (18, 90)], epsilon=1.0, threshold=1000, max_answers=2, rng=rng(3)
    )
    assert [r for r, _ in out] == [(30.0, 60.0), (18.0, 90.0)]
    truth = ((ages > 30) & (ages < 60)).sum()
    assert abs(out[0][1] - truth) < 60
    with pytest.raises(InvalidDataError):
        range_queries_above_threshold(ages, [(5, 1)], epsilon=1.0, threshold=1, max_answers=1)
