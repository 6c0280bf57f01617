"""The worked examples of the source texts, run end to end on generated data (``dpkit demo``).

Three parts, each a function returning a JSON-ready ``dict``:

* :func:`randomized_response_survey` — the exam-cheating survey: Warner's
  randomized response with p = 2/3 (ε = ln 2) and the estimate p̂ = 3·mean(Y) − 1; then the
  two-coin design of Dwork & Roth (2014) §2.3 (ε = ln 3) with the estimate 2·P_B − 1/2.
* :func:`laplace_queries` — the Laplace mechanism on counting queries (Dwork & Roth 2014, §3.3): one count
  with its error bound P[|Y| >= t·b] = e^{-t}, a histogram of ages (sensitivity 1 under
  add/remove, 2 under replace) with per-bin and simultaneous bounds, and k counting queries
  (ℓ1 sensitivity k).
* :func:`laplace_vs_gaussian` — expected errors of the two mechanisms over a range of ε
  (seeds 003, 004 ch. 4), measured on dpkit's own releases and compared with the formulas; the
  figure is drawn by :func:`~dpkit.demo_report.plot_laplace_vs_gaussian`.

These are the demo's computations; the figure and the rich tables
(:func:`~dpkit.demo_report.plot_laplace_vs_gaussian`, :func:`~dpkit.demo_report.render`) are in
:mod:`dpkit.demo_report`.

:func:`run_demo` runs all three, writes the files and returns the combined results;
:func:`~dpkit.demo_report.render` prints them as rich tables. Noise comes from the mechanisms'
secure default unless a seed is given, in which case one ``numpy.random.default_rng(seed)`` is
passed explicitly to every release: reproducible, **not secure** — for teaching and tests only. The example data itself is
always generated from the fixed seed :data:`dpkit.datasets.DEFAULT_SEED`.
"""

from __future__ import annotations

import csv
import json
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray
from rich.progress import Progress, TaskID

import dpkit as dp
from dpkit import datasets
from dpkit.demo_report import plot_laplace_vs_gaussian
from dpkit.mechanisms import sensitivity
from dpkit.noise.source import RNG

__all__ = [
    "EPSILONS",
    "DELTA",
    "randomized_response_survey",
    "laplace_queries",
    "laplace_vs_gaussian",
    "run_demo",
]

#: ε values of the Laplace-vs-Gaussian comparison, and the Gaussian's δ.
EPSILONS: tuple[float, ...] = (0.125, 0.25, 0.5, 1.0, 2.0, 4.0)
DELTA = 1e-5
#: The ε shown in the noise-distribution panel.
PLOT_EPSILON = 1.0

# Sizes of the comparison (independent releases simulated per ε and mechanism).
_COUNT_DRAWS = 100_000  # one count: 100,000 releases
_HIST_BINS = 7  # the age histogram's bins
_HIST_REPS = 20_000
_K = 100  # k counting queries in the comparison
_K_REPS = 2_000

_AGE_EDGES = (18, 25, 35, 45, 55, 65, 75, 91)
_INCOME_THRESHOLDS = tuple(range(10_000, 100_001, 10_000))  # k = 10 counting queries


def _f(x: Any) -> float:
    return float(x)


def _fl(a: Any) -> list[float]:
    return [float(x) for x in np.asarray(a, dtype=np.float64).ravel()]


# ------------------------------------------------------------------------------------------------
# a. randomized response (随机应答)
# ------------------------------------------------------------------------------------------------


def randomized_response_survey(
    survey: datasets.Survey, *, rng: RNG = None
) -> tuple[dict[str, Any], tuple[NDArray[np.int64], NDArray[np.int64]]]:
    """Both randomized-response designs on one survey: the summary and estimates, then the two
    arrays of released reports (Warner, two-coin).

    Warner (1965): each student reports the truth with probability 2/3 and the opposite with
    1/3, so E[Y] = 1/3 + p/3 and p̂ = 3·mean(Y) − 1; ln 2-DP per student (``replace``).
    Two coins (Dwork & Roth 2014, §2.3): truth on tails, else a second fair coin; P_B = 1/4 + P_A/2, so
    P̂_A = 2·P_B − 1/2; ln 3-DP per student.
    """
    warner = dp.RandomizedResponse(p_truth=2 / 3)
    reports = warner.release(survey.answers, rng=rng)
    est = warner.estimate_frequency(reports)
    low, high = est.confidence_interval(0.95)
    mean_y = float(reports.mean())

    coins = dp.ForcedResponse()
    reports2 = coins.release(survey.answers, rng=rng)
    est2 = coins.estimate_frequency(reports2)
    low2, high2 = est2.confidence_interval(0.95)
    p_b = float(reports2.mean())

    summary = {
        "n": survey.n,
        "true_rate": survey.true_rate,
        "warner": {
            "p_truth": warner.p_truth,
            "epsilon": warner.epsilon,
            "yes_reports": int(reports.sum()),
            "mean_report": mean_y,
            "formula": "3*mean(Y) - 1",
            "formula_value": 3 * mean_y - 1,
            "estimate": est.proportion,
            "std_error": _f(est.std_error[1]),
            "ci95": [_f(low[1]), _f(high[1])],
        },
        "two_coin": {
            "p_truth_coin": coins.p_truth_coin,
            "p_yes": coins.p_yes,
            "epsilon": coins.epsilon,
            "yes_reports": int(reports2.sum()),
            "p_b": p_b,
            "formula": "2*P_B - 1/2",
            "formula_value": 2 * p_b - 0.5,
            "estimate": est2.proportion,
            "std_error": _f(est2.std_error[1]),
            "ci95": [_f(low2[1]), _f(high2[1])],
        },
    }
    return summary, (reports, reports2)


# ------------------------------------------------------------------------------------------------
# b. Laplace mechanism (拉普拉斯机制) on counts, a histogram and k counting queries
# ------------------------------------------------------------------------------------------------


def laplace_queries(table: datasets.People, *, epsilon: float = 0.5, rng: RNG = None) -> dict[str, Any]:
    """Three Laplace releases on ``table``, each ε-DP (together 3ε by sequential composition)."""
    # One count: "how many people are 65 or older?" (ℓ1 sensitivity 1, b = 1/ε).
    true_count = int((table.age >= 65).sum())
    count_mech = dp.Laplace(epsilon=epsilon, sensitivity=sensitivity.count().l1)
    b = count_mech.scale
    noisy = count_mech.release(float(true_count), rng=rng)
    ci = count_mech.confidence_interval(noisy, 0.95)
    # P[|Y| >= t·b] = e^{-t} (Dwork & Roth 2014, Fact 3.7), checked on 100,000 draws of the same noise:
    # a vector release with ℓ1 sensitivity 1 adds i.i.d. noise of the same scale per coordinate.
    draws = count_mech.release(np.zeros(_COUNT_DRAWS), rng=rng)
    tails = [
        {"t": t, "theory": math.exp(-t), "observed": float(np.mean(np.abs(draws) >= t * b))}
        for t in (1.0, 2.0, math.log(20.0), 4.0)
    ]

    # A histogram of ages: disjoint bins, so ℓ1 sensitivity 1 (add/remove) or 2 (replace).
    hist_true = np.histogram(table.age, bins=_AGE_EDGES)[0]
    labels = [f"{lo}-{hi - 1}" for lo, hi in zip(_AGE_EDGES[:-1], _AGE_EDGES[1:], strict=True)]
    k_bins = len(labels)
    hist_mech = dp.Laplace(epsilon=epsilon, sensitivity=sensitivity.histogram("replace").l1, neighbours="replace")
    hist_noisy = hist_mech.release(hist_true.astype(np.float64), rng=rng)
    h_low, h_high = hist_mech.confidence_interval(hist_noisy, 0.95)
    beta = 0.05
    all_bins_bound = hist_mech.error_bound(beta / k_bins, size=k_bins)  # union bound over the bins

    # k counting queries "income >= threshold": one person can move all k → ℓ1 sensitivity k.
    k = len(_INCOME_THRESHOLDS)
    kq_true = np.array([(table.income >= t).sum() for t in _INCOME_THRESHOLDS], dtype=np.float64)
    kq_mech = dp.Laplace(epsilon=epsilon, sensitivity=sensitivity.counting_queries(k).l1)
    kq_noisy = kq_mech.release(kq_true, rng=rng)
    kq_low, kq_high = kq_mech.confidence_interval(kq_noisy, 0.95)

    mechs = (count_mech, hist_mech, kq_mech)
    return {
        "n": table.n,
        "epsilon_each": epsilon,
        "epsilon_total": sum(m.event.epsilon for m in mechs),
        "count": {
            "query": "number of people aged 65 or older",
            "true": true_count,
            "released": noisy,
            "sensitivity": count_mech.sensitivity,
            "scale": b,
            "bound95_formula": b * math.log(20.0),
            "bound95": count_mech.error_bound(0.05),
            "ci95": [_f(ci[0]), _f(ci[1])],
            "tail_check": tails,
            "tail_draws": _COUNT_DRAWS,
        },
        "histogram": {
            "query": "people per age band",
            "bins": labels,
            "true": [int(c) for c in hist_true],
            "released": _fl(hist_noisy),
            "ci95_low": _fl(h_low),
            "ci95_high": _fl(h_high),
            "neighbours": hist_mech.neighbours,
            "sensitivity": hist_mech.sensitivity,
            "sensitivity_add_remove": sensitivity.histogram("add_remove").l1,
            "scale": hist_mech.scale,
            "scale_add_remove": sensitivity.histogram("add_remove").l1 / epsilon,
            "all_bins_beta": beta,
            "all_bins_bound": all_bins_bound,
            "all_bins_bound_formula": hist_mech.scale * math.log(k_bins / beta),
        },
        "k_queries": {
            "query": "number of people with income >= threshold",
            "thresholds": list(_INCOME_THRESHOLDS),
            "k": k,
            "true": _fl(kq_true),
            "released": _fl(kq_noisy),
            "ci95_low": _fl(kq_low),
            "ci95_high": _fl(kq_high),
            "sensitivity": kq_mech.sensitivity,
            "scale": kq_mech.scale,
            "bound95": kq_mech.error_bound(0.05, size=k),
        },
    }


# ------------------------------------------------------------------------------------------------
# c. Laplace vs Gaussian (高斯机制)
# ------------------------------------------------------------------------------------------------


def _classic_sigma(epsilon: float, delta: float) -> float | None:
    if epsilon >= 1:
        return None  # the classic theorem needs ε < 1 (dpkit refuses it)
    return dp.Gaussian(epsilon=epsilon, delta=delta, calibration="classic").sigma


def laplace_vs_gaussian(
    *,
    epsilons: Sequence[float] = EPSILONS,
    delta: float = DELTA,
    rng: RNG = None,
    progress: Progress | None = None,
    task: TaskID | None = None,
) -> tuple[dict[str, Any], dict[str, NDArray[np.float64]]]:
    """Expected errors of Laplace (ε-DP) and Gaussian ((ε, δ)-DP, analytic σ) for three queries.

    * one count — ℓ1 = ℓ2 = 1; metric E|error|: Laplace b = 1/ε, Gaussian σ·√(2/π);
    * a histogram of d = 7 bins (add/remove) — ℓ1 = ℓ2 = 1; metric E‖error‖²₂: 2d·b² vs d·σ²;
    * k = 100 counting queries — ℓ1 = k, ℓ2 = √k; metric E‖error‖²₂: 2k·(k/ε)² vs k·(√k·σ₁)²,
      where σ₁ is the Gaussian σ for unit ℓ2 sensitivity. Gaussian wins iff k > k* = ε²σ₁²/2.

    Each "measured" number averages many independent dpkit releases (a batch of rows released
    with the query's sensitivity draws one independent noise vector per row). Returns the
    results and, for the figure, the count noise drawn at ``PLOT_EPSILON``.
    """
    rows = []
    samples: dict[str, NDArray[np.float64]] = {}
    for eps in epsilons:
        lap1 = dp.Laplace(epsilon=eps, sensitivity=1.0)
        gau1 = dp.Gaussian(epsilon=eps, delta=delta, sensitivity=1.0)
        b, sigma = lap1.scale, gau1.sigma
        lap_count = lap1.release(np.zeros(_COUNT_DRAWS), rng=rng)
        gau_count = gau1.release(np.zeros(_COUNT_DRAWS), rng=rng)
        if eps == PLOT_EPSILON:
            samples = {"laplace": lap_count, "gaussian": gau_count}

        d = _HIST_BINS
        lap_hist = lap1.release(np.zeros((_HIST_REPS, d)), rng=rng)
        gau_hist = gau1.release(np.zeros((_HIST_REPS, d)), rng=rng)

        k = _K
        sens_k = sensitivity.counting_queries(k)
        lap_k_mech = dp.Laplace(epsilon=eps, sensitivity=sens_k.l1)
        gau_k_mech = dp.Gaussian(epsilon=eps, delta=delta, sensitivity=sens_k.l2)
        lap_k = lap_k_mech.release(np.zeros((_K_REPS, k)), rng=rng)
        gau_k = gau_k_mech.release(np.zeros((_K_REPS, k)), rng=rng)

        rows.append(
            {
                "epsilon": eps,
                "laplace_scale": b,
                "gaussian_sigma": sigma,
                "gaussian_sigma_classic": _classic_sigma(eps, delta),
                "count_abs": {
                    "laplace_formula": b,
                    "laplace_measured": float(np.mean(np.abs(lap_count))),
                    "gaussian_formula": sigma * math.sqrt(2 / math.pi),
                    "gaussian_measured": float(np.mean(np.abs(gau_count))),
                },
                "histogram_sq": {
                    "laplace_formula": 2 * d * b**2,
                    "laplace_measured": float(np.mean(np.sum(lap_hist**2, axis=1))),
                    "gaussian_formula": d * sigma**2,
                    "gaussian_measured": float(np.mean(np.sum(gau_hist**2, axis=1))),
                },
                "k_queries_sq": {
                    "laplace_formula": 2 * k * lap_k_mech.scale**2,
                    "laplace_measured": float(np.mean(np.sum(lap_k**2, axis=1))),
                    "gaussian_formula": k * gau_k_mech.sigma**2,
                    "gaussian_measured": float(np.mean(np.sum(gau_k**2, axis=1))),
                },
                "crossover_k": eps**2 * sigma**2 / 2,
            }
        )
        if progress is not None and task is not None:
            progress.advance(task)
    result = {
        "delta": delta,
        "calibration": "analytic",
        "histogram_bins": _HIST_BINS,
        "k": _K,
        "count_draws": _COUNT_DRAWS,
        "histogram_releases": _HIST_REPS,
        "k_query_releases": _K_REPS,
        "plot_epsilon": PLOT_EPSILON,
        "rows": rows,
    }
    return result, samples


# ------------------------------------------------------------------------------------------------
# the whole demo
# ------------------------------------------------------------------------------------------------


def _write_csv(path: Path, header: Sequence[str], rows: Any) -> Path:
    with path.open("w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(header)
        w.writerows(rows)
    return path


def run_demo(
    out_dir: str | Path = "out/demo", *, seed: int | None = None, progress: Progress | None = None
) -> dict[str, Any]:
    """Run the three worked examples, write the files under ``out_dir`` and return the results.

    ``seed=None`` (default) draws all noise from the CSPRNG; an integer seed passes
    ``numpy.random.default_rng(seed)`` to every release — reproducible, not secure.
    Files: ``laplace_vs_gaussian.png``, ``survey_reports.csv`` (the released reports),
    ``age_histogram.csv`` (the released histogram with 95% intervals), ``results.json``.
    """
    start = time.perf_counter()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rng = None if seed is None else np.random.default_rng(seed)
    task = progress.add_task("dpkit demo", total=3 + len(EPSILONS)) if progress is not None else None

    def step(description: str) -> None:
        if progress is not None and task is not None:
            progress.update(task, description=description)

    def done() -> None:
        if progress is not None and task is not None:
            progress.advance(task)

    step("randomized response survey")
    rr, (warner_reports, coin_reports) = randomized_response_survey(datasets.cheating_survey(), rng=rng)
    done()

    step("Laplace counting queries")
    lq = laplace_queries(datasets.people(), rng=rng)
    done()

    step("Laplace vs Gaussian")
    lg, samples = laplace_vs_gaussian(rng=rng, progress=progress, task=task)

    step("plot and files")
    files = [
        plot_laplace_vs_gaussian(lg, samples, out / "laplace_vs_gaussian.png"),
        _write_csv(
            out / "survey_reports.csv",
            ("student", "warner_report", "two_coin_report"),
            zip(range(1, warner_reports.size + 1), warner_reports.tolist(), coin_reports.tolist(), strict=True),
        ),
        _write_csv(
            out / "age_histogram.csv",
            ("age_band", "released_count", "ci95_low", "ci95_high"),
            zip(
                lq["histogram"]["bins"],
                lq["histogram"]["released"],
                lq["histogram"]["ci95_low"],
                lq["histogram"]["ci95_high"],
                strict=True,
            ),
        ),
    ]
    results_path = out / "results.json"
    result: dict[str, Any] = {
        "dpkit_version": dp.__version__,
        "randomness": {
            "seed": seed,
            "secure": seed is None,
            "note": "CSPRNG (OS entropy)" if seed is None else f"numpy seed {seed}: reproducible, not secure",
        },
        "data_seed": datasets.DEFAULT_SEED,
        "randomized_response": rr,
        "laplace_queries": lq,
        "laplace_vs_gaussian": lg,
        "files": [str(p) for p in [*files, results_path]],
    }
    result["seconds"] = round(time.perf_counter() - start, 3)
    results_path.write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    done()
    return result
