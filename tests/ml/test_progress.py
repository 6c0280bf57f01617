"""Progress bars on dpkit.ml fits (``progress=`` of LogisticRegression, LinearRegression, KMeans;
the shared helper dpkit._progress).

Checked: ``progress=True`` draws a rich bar that reaches the planned total and shows the total
(ε, δ) of the plan; ``False`` draws nothing; the default draws nothing when stderr is not an
interactive terminal (tests, pipes, notebooks) and a bar on one for a long fit; what the bar
shows depends on the plan only, never on the data; a bar draws no randomness (the fitted model
is bit-identical with and without it); bad values are refused in ``fit`` before anything is
spent or drawn. Bars are captured by replacing the helper's console factory
(``dpkit._progress._console``) with an in-memory terminal console. Deterministic: fixed seeds.
"""

from __future__ import annotations

import io
import re
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from rich.console import Console
from rich.text import Text
from sklearn.base import clone

import dpkit as dp
import dpkit._progress as progress_module
from _stats import CountingSource
from dpkit.accounting import RDPAccountant, ZCDPAccountant
from dpkit.errors import InvalidParameterError
from dpkit.ml import KMeans, LinearRegression, LogisticRegression

SEED = 20240815
DELTA = 1e-5
ERASED = "\x1b[1A\x1b[2K"  # cursor up, erase the line: how a transient rich bar ends


class _Terminal(io.StringIO):
    """A stand-in for an interactive stderr."""

    def isatty(self) -> bool:
        return True


@pytest.fixture
def screen(monkeypatch: pytest.MonkeyPatch) -> io.StringIO:
    """What bars draw, on an in-memory console that renders as a terminal would."""
    buffer = io.StringIO()
    monkeypatch.setattr(progress_module, "_console", lambda: Console(file=buffer, force_terminal=True, width=160))
    return buffer


def plain(buffer: io.StringIO) -> str:
    return Text.from_ansi(buffer.getvalue()).plain


def data(n: int = 400, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 3)) / 2.0
    labels = (X[:, 0] - X[:, 1] > 0).astype(int)
    targets = X @ np.array([1.0, -0.5, 0.25])
    return X, labels, targets


# name → (make(**overrides), fit(estimator, data), the bar's label, unit and total)
def _logistic(**kw: Any) -> LogisticRegression:
    params: dict[str, Any] = dict(epsilon=1.0, delta=DELTA, data_norm=2.0, classes=[0, 1], steps=120)
    return LogisticRegression(**{**params, **kw})


def _linear(**kw: Any) -> LinearRegression:
    params: dict[str, Any] = dict(epsilon=1.0, delta=DELTA, data_norm=2.0, bounds=(-3.0, 3.0), steps=120)
    return LinearRegression(**{**params, **kw})


def _kmeans(**kw: Any) -> KMeans:
    return KMeans(**{**dict(n_clusters=2, epsilon=1.0, delta=1e-6, bounds=(-3.0, 3.0), n_iter=4), **kw})


def _textbook(**kw: Any) -> KMeans:
    params: dict[str, Any] = dict(method="textbook", delta=0.0, neighbours="replace", epsilon=4.0)
    return _kmeans(**{**params, **kw})


def _fit(est: Any, X: np.ndarray, labels: np.ndarray, targets: np.ndarray) -> Any:
    if isinstance(est, LogisticRegression):
        return est.fit(X, labels)
    if isinstance(est, LinearRegression):
        return est.fit(X, targets)
    return est.fit(X)


CASES: dict[str, tuple[Callable[..., Any], str, str, int]] = {
    "logistic": (_logistic, "LogisticRegression", "steps", 120),
    "logistic-sampled": (
        lambda **kw: _logistic(steps=None, sample_rate=0.25, epochs=40, **kw),
        "LogisticRegression",
        "steps",
        160,
    ),
    "linear": (_linear, "LinearRegression", "steps", 120),
    "kmeans": (_kmeans, "KMeans", "iterations", 4),
    "kmeans-public-init": (
        lambda **kw: _kmeans(init=np.array([[-1.0, 0.0, 0.0], [1.0, 0.0, 0.0]]), **kw),
        "KMeans",
        "iterations",
        4,
    ),
    "kmeans-textbook": (_textbook, "KMeans", "iterations", 4),
}


def _budget_for(est: Any) -> dp.Budget:
    accountant = ZCDPAccountant if isinstance(est, KMeans) else RDPAccountant
    return dp.Budget(epsilon=50.0, delta=1e-3, accountant=accountant)


def _fitted_arrays(est: Any) -> list[np.ndarray]:
    if isinstance(est, KMeans):
        return [est.cluster_centers_]
    return [np.asarray(est.coef_), np.asarray(est.intercept_)]


# --- what is drawn ---------------------------------------------------------------------------------


@pytest.mark.parametrize("case", list(CASES))
def test_progress_true_draws_a_bar_that_reaches_the_planned_total(case: str, screen: io.StringIO) -> None:
    make, label, unit, total = CASES[case]
    est = _fit(make(progress=True, rng=np.random.default_rng(SEED)), *data())
    text = plain(screen)
    final = [line for line in text.splitlines() if f"{total}/{total} {unit}" in line]
    assert final, text[-500:]
    line = final[-1]
    assert line.startswith(label)
    # the plan's total, rounded up: never a running or data-dependent figure
    assert progress_module.epsilon_text(est.epsilon_, est.delta_) in line
    n_done = getattr(est, "n_steps_", None) or est.n_iter_
    assert n_done == total
    assert not screen.getvalue().endswith(ERASED)  # an asked-for bar stays, with its final count


def test_progress_false_draws_nothing(
    screen: io.StringIO, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("sys.stderr", _Terminal())  # where the default would draw
    for make, *_ in CASES.values():
        _fit(make(progress=False, rng=np.random.default_rng(SEED)), *data())
    assert screen.getvalue() == ""
    assert capsys.readouterr().out == ""


def test_default_draws_nothing_when_stderr_is_not_a_terminal(
    screen: io.StringIO, capsys: pytest.CaptureFixture[str]
) -> None:
    for make, *_ in CASES.values():
        _fit(make(steps=400) if make is _logistic else make(), *data())  # rng=None: the CSPRNG
    assert screen.getvalue() == ""
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == ""


def test_default_on_a_terminal_draws_a_passing_bar_for_long_fits_only(
    screen: io.StringIO, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("sys.stderr", _Terminal())
    X, labels, targets = data()
    _fit(_logistic(steps=99, rng=np.random.default_rng(SEED)), X, labels, targets)  # short: no bar
    assert screen.getvalue() == ""
    _fit(_logistic(steps=100, rng=np.random.default_rng(SEED)), X, labels, targets)
    assert "100/100 steps" in plain(screen)
    assert screen.getvalue().endswith(ERASED)  # transient: the default's bar erases itself at the end
    screen.truncate(0)
    screen.seek(0)
    _fit(_kmeans(rng=np.random.default_rng(SEED)), X, labels, targets)  # every KMeans fit
    assert "4/4 iterations" in plain(screen)


def test_the_bar_reads_the_plan_not_the_data(screen: io.StringIO) -> None:
    """Two different data sets (values and row count) under one plan draw the same bar."""
    frames = []
    for n, seed in ((300, 1), (700, 2)):
        screen.truncate(0)
        screen.seek(0)
        _fit(_logistic(progress=True, rng=np.random.default_rng(SEED)), *data(n, seed))
        last = [line for line in plain(screen).splitlines() if "120/120" in line][-1]
        frames.append(re.sub(r"\d+:\d\d:\d\d|-:--:--", "T", last).rstrip())
    assert frames[0] == frames[1]


# --- no randomness, no cost --------------------------------------------------------------------


@pytest.mark.parametrize("case", list(CASES))
def test_the_fit_is_bit_identical_with_and_without_a_bar(case: str, screen: io.StringIO) -> None:
    make = CASES[case][0]
    fitted, draws = [], []
    for progress in (True, False, None):
        source = CountingSource(SEED)
        est = _fit(make(progress=progress, rng=source), *data())
        fitted.append(_fitted_arrays(est))
        draws.append(source.calls)
    assert screen.getvalue() != ""  # the first fit did draw a bar
    for other in fitted[1:]:
        assert all(np.array_equal(a, b) for a, b in zip(fitted[0], other, strict=True))
    assert draws[0] == draws[1] == draws[2] > 0


BAD = ["yes", 2, 1, 0, 1.0, np.True_, "auto", [True]]


@pytest.mark.parametrize("case", ["logistic", "linear", "kmeans", "kmeans-textbook"])
@pytest.mark.parametrize("bad", BAD, ids=repr)
def test_bad_progress_is_refused_in_fit_before_anything_is_spent(case: str, bad: object, screen: io.StringIO) -> None:
    make = CASES[case][0]
    source = CountingSource(SEED)
    est = make(progress=bad, rng=source)  # __init__ stores it as given (sklearn)
    est.budget = budget = _budget_for(est)
    assert est.get_params()["progress"] is bad
    with pytest.raises(InvalidParameterError) as info:
        _fit(est, *data())
    err = info.value
    assert err.name == "progress" and err.value is bad
    assert repr(bad) in str(err) and "True" in str(err) and "False" in str(err) and "None" in str(err)
    assert budget.spent == (0.0, 0.0) and budget.events == ()
    assert source.calls == 0 and screen.getvalue() == ""


@pytest.mark.parametrize("case", ["logistic", "kmeans"])
def test_progress_true_without_rich_is_refused_before_anything_is_spent(
    case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(progress_module, "_rich_installed", lambda: False)
    make = CASES[case][0]
    source = CountingSource(SEED)
    est = make(progress=True, rng=source)
    est.budget = budget = _budget_for(est)
    with pytest.raises(InvalidParameterError, match="rich") as info:
        _fit(est, *data())
    assert info.value.name == "progress"
    assert budget.events == () and source.calls == 0
    # the default, without rich, is quiet rather than an error
    monkeypatch.setattr("sys.stderr", _Terminal())
    _fit(make(rng=CountingSource(SEED)), *data())


# --- scikit-learn conventions ------------------------------------------------------------------


@pytest.mark.parametrize("case", ["logistic", "linear", "kmeans"])
def test_progress_is_a_parameter_that_clone_and_set_params_keep(case: str) -> None:
    est = CASES[case][0]()
    assert est.get_params()["progress"] is None
    assert est.set_params(progress=True) is est and est.progress is True
    twin = clone(est)
    assert twin.progress is True and twin.get_params()["progress"] is True


def test_epsilon_text_rounds_up() -> None:
    assert progress_module.epsilon_text(1.0, 1e-5) == "ε=1 (δ=1e-05)"
    assert progress_module.epsilon_text(0.123449, 0.0) == "ε=0.1235"
    assert progress_module.epsilon_text(2.5, 0.0) == "ε=2.5"
    assert progress_module.epsilon_text(12345.6, 1e-6) == "ε=1.235e+04 (δ=1e-06)"
