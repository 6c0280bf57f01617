"""The output of ``dpkit demo``: the Laplace-vs-Gaussian figure (:func:`plot_laplace_vs_gaussian`)
and the rich tables of the results (:func:`render`).

Both take the JSON-ready results computed by :mod:`dpkit.demo` and draw no noise; matplotlib is
imported only when the figure is drawn.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray
from rich.console import Console
from rich.table import Table
from rich.text import Text

__all__ = ["plot_laplace_vs_gaussian", "render"]


# ------------------------------------------------------------------------------------------------
# the figure
# ------------------------------------------------------------------------------------------------


def plot_laplace_vs_gaussian(result: dict[str, Any], samples: dict[str, NDArray[np.float64]], path: Path) -> Path:
    """Save the comparison figure (Agg, no display): noise densities, then errors against ε."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import NullLocator

    rows = result["rows"]
    eps = np.array([r["epsilon"] for r in rows])
    fig = Figure(figsize=(16, 4.8), layout="constrained")
    FigureCanvasAgg(fig)
    ax1, ax2, ax3 = fig.subplots(1, 3)

    row = next(r for r in rows if r["epsilon"] == result["plot_epsilon"])
    b, sigma = row["laplace_scale"], row["gaussian_sigma"]
    lim = 4 * sigma
    x = np.linspace(-lim, lim, 801)
    bins = np.linspace(-lim, lim, 121)
    ax1.hist(samples["laplace"], bins=bins, density=True, alpha=0.45, color="C0", label="Laplace: dpkit samples")
    ax1.hist(samples["gaussian"], bins=bins, density=True, alpha=0.45, color="C1", label="Gaussian: dpkit samples")
    ax1.plot(x, np.exp(-np.abs(x) / b) / (2 * b), color="C0", lw=2, label=f"Laplace density, b = {b:.3g}")
    ax1.plot(
        x,
        np.exp(-(x**2) / (2 * sigma**2)) / (sigma * math.sqrt(2 * math.pi)),
        color="C1",
        lw=2,
        label=f"Gaussian density, σ = {sigma:.3g}",
    )
    ax1.set_title(f"Noise on one count (Δ = 1), ε = {result['plot_epsilon']:g}")
    ax1.set_xlabel("noise")
    ax1.set_ylabel("density")
    ax1.legend(fontsize=8)

    def series(key: str, which: str) -> NDArray[np.float64]:
        return np.array([r[key][which] for r in rows])

    ax2.loglog(eps, series("count_abs", "laplace_formula"), "-", color="C0", label="Laplace  b")
    ax2.loglog(eps, series("count_abs", "laplace_measured"), "o", color="C0", label="Laplace, measured")
    ax2.loglog(eps, series("count_abs", "gaussian_formula"), "--", color="C1", label="Gaussian  σ√(2/π)")
    ax2.loglog(eps, series("count_abs", "gaussian_measured"), "s", color="C1", label="Gaussian, measured")
    ax2.set_title("One count: expected |error|")
    ax2.set_xlabel("ε")
    ax2.set_ylabel("E|error|")
    ax2.legend(fontsize=8, title="lines: formula, marks: measured", title_fontsize=8)

    d, k = result["histogram_bins"], result["k"]
    for key, name, color in (
        ("histogram_sq", f"histogram, d = {d}", "C2"),
        ("k_queries_sq", f"{k} counting queries", "C3"),
    ):
        ax3.loglog(eps, series(key, "laplace_formula"), "-", color=color, label=f"Laplace, {name}")
        ax3.loglog(eps, series(key, "laplace_measured"), "o", color=color)
        ax3.loglog(eps, series(key, "gaussian_formula"), "--", color=color, label=f"Gaussian, {name}")
        ax3.loglog(eps, series(key, "gaussian_measured"), "s", color=color)
    ax3.set_title(r"Vector queries: expected $\|\mathrm{error}\|_2^2$")
    ax3.set_xlabel("ε")
    ax3.set_ylabel(r"E$\|\mathrm{error}\|_2^2$")
    ax3.legend(fontsize=8, title="lines: formula, marks: measured", title_fontsize=8)
    for ax in (ax2, ax3):
        ax.set_xticks(eps, labels=[f"{e:g}" for e in eps])
        ax.xaxis.set_minor_locator(NullLocator())
        ax.grid(True, which="major", alpha=0.3)

    fig.suptitle(f"Laplace (ε-DP) vs Gaussian ((ε, δ = {result['delta']:g})-DP, analytic σ): noise drawn by dpkit")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return path


# ------------------------------------------------------------------------------------------------
# rich output
# ------------------------------------------------------------------------------------------------


_MIN_WIDTH = 72


def _g(x: float) -> str:
    """Four significant digits, compact exponent (1.285e8)."""
    return f"{x:.4g}".replace("e+0", "e").replace("e+", "e").replace("e-0", "e-")


def _ci(pair: Sequence[float], digits: int = 1) -> str:
    return f"[{pair[0]:.{digits}f}, {pair[1]:.{digits}f}]"


def render(result: dict[str, Any], console: Console) -> None:
    """Print the results of :func:`dpkit.demo.run_demo` as rich tables."""
    rnd = result["randomness"]
    note = (
        "[green]secure (CSPRNG)[/]"
        if rnd["secure"]
        else f"[yellow]seeded with {rnd['seed']}: reproducible, NOT secure[/]"
    )
    console.print(
        f"[bold]dpkit {result['dpkit_version']} demo[/] — noise: {note}; example data: generated (seed {result['data_seed']})"
    )

    # a. randomized response
    rr = result["randomized_response"]
    w, c = rr["warner"], rr["two_coin"]
    console.rule("[bold]a. Randomized response (随机应答): the exam-cheating survey")
    console.print(
        f"{rr['n']:,} students; each one randomises their own answer before reporting it. True cheating rate: {rr['true_rate']:.4f}"
    )
    t = Table()
    for col, just in (
        ("design and estimator", "left"),
        ("ε per student", "right"),
        ("'yes' reports", "right"),
        ("estimate", "right"),
        ("95% CI", "right"),
    ):
        t.add_column(col, justify=just)  # type: ignore[arg-type]
    t.add_row(
        "Warner: truth w.p. 2/3\np̂ = 3·mean(Y) − 1",
        f"ln 2 = {w['epsilon']:.4f}",
        f"{w['yes_reports']:,}\nmean(Y) = {w['mean_report']:.4f}",
        f"{w['estimate']:.4f}",
        _ci(w["ci95"], 4),
    )
    t.add_row(
        "two fair coins\nP̂_A = 2·P_B − 1/2",
        f"ln 3 = {c['epsilon']:.4f}",
        f"{c['yes_reports']:,}\nP_B = {c['p_b']:.4f}",
        f"{c['estimate']:.4f}",
        _ci(c["ci95"], 4),
    )
    console.print(t)
    console.print(
        "The raw share of 'yes' reports is biased towards 1/2; the estimators undo the coins (post-processing, no extra ε)."
    )

    # b. Laplace queries
    lq = result["laplace_queries"]
    cnt, h, kq = lq["count"], lq["histogram"], lq["k_queries"]
    console.rule("[bold]b. Laplace mechanism (拉普拉斯机制): counting queries on a table of people")
    console.print(
        f"{lq['n']:,} people; each query ε = {lq['epsilon_each']:g} "
        f"(together ε = {lq['epsilon_total']:g} by sequential composition)."
    )
    t = Table(
        title=f"One count: {cnt['query']} (sensitivity 敏感度 Δ = {cnt['sensitivity']:g}, b = Δ/ε = {cnt['scale']:g})"
    )
    for col in ("true", "released", "95% bound b·ln 20", "dpkit error_bound(0.05)", "95% CI"):
        t.add_column(col, justify="right")
    t.add_row(
        str(cnt["true"]),
        f"{cnt['released']:.2f}",
        f"{cnt['bound95_formula']:.3f}",
        f"{cnt['bound95']:.3f}",
        _ci(cnt["ci95"], 2),
    )
    console.print(t)
    t = Table(
        title=f"Tail check P[|Y| ≥ t·b] = e^-t on {cnt['tail_draws']:,} draws of dpkit's Laplace noise",
        min_width=_MIN_WIDTH,
    )
    for col in ("t", "e^-t", "observed"):
        t.add_column(col, justify="right")
    for row in cnt["tail_check"]:
        label = "ln 20" if abs(row["t"] - math.log(20)) < 1e-12 else f"{row['t']:g}"
        t.add_row(label, f"{row['theory']:.4f}", f"{row['observed']:.4f}")
    console.print(t)

    t = Table(
        title=(
            f"Histogram of ages ({h['neighbours']} neighbours: Δ = {h['sensitivity']:g}, b = {h['scale']:g}; "
            f"under add/remove Δ = {h['sensitivity_add_remove']:g}, b = {h['scale_add_remove']:g})"
        ),
        min_width=_MIN_WIDTH,
    )
    for col in ("age band", "true", "released", "95% CI (per bin)"):
        t.add_column(col, justify="right")
    for i, label in enumerate(h["bins"]):
        t.add_row(label, str(h["true"][i]), f"{h['released'][i]:.1f}", _ci((h["ci95_low"][i], h["ci95_high"][i])))
    console.print(t)
    console.print(
        f"All {len(h['bins'])} bins at once: |error| < {h['all_bins_bound']:.2f} with probability ≥ {1 - h['all_bins_beta']:.2f} "
        f"(b·ln(k/β) = {h['all_bins_bound_formula']:.2f}: grows with log k, not k)."
    )
    t = Table(
        title=f"k = {kq['k']} counting queries: {kq['query']} (ℓ1 sensitivity k = {kq['sensitivity']:g}, b = {kq['scale']:g})",
        min_width=_MIN_WIDTH,
    )
    for col in ("threshold", "true", "released", "95% CI"):
        t.add_column(col, justify="right")
    for i, thr in enumerate(kq["thresholds"]):
        t.add_row(
            f"{thr:,}", f"{kq['true'][i]:.0f}", f"{kq['released'][i]:.1f}", _ci((kq["ci95_low"][i], kq["ci95_high"][i]))
        )
    console.print(t)

    # c. Laplace vs Gaussian
    lg = result["laplace_vs_gaussian"]
    console.rule("[bold]c. Laplace vs Gaussian (高斯机制) noise")
    console.print(
        f"Gaussian: δ = {lg['delta']:g}, analytic calibration (valid for every ε). Measured = mean over dpkit releases "
        f"({lg['count_draws']:,} counts, {lg['histogram_releases']:,} histograms, {lg['k_query_releases']:,} × {lg['k']} queries)."
    )
    t = Table(title="Noise scales (Δ = 1)")
    for col in ("ε", "Laplace b = 1/ε", "Gaussian σ (analytic)", "σ classic (ε < 1)", "k* = ε²σ²/2"):
        t.add_column(col, justify="right")
    for r in lg["rows"]:
        classic = "—" if r["gaussian_sigma_classic"] is None else f"{r['gaussian_sigma_classic']:.3f}"
        t.add_row(
            f"{r['epsilon']:g}",
            f"{r['laplace_scale']:.3g}",
            f"{r['gaussian_sigma']:.3f}",
            classic,
            f"{r['crossover_k']:.1f}",
        )
    console.print(t)

    t = Table(title="Expected error: formula / measured on dpkit releases")
    for col in ("query, metric", "ε", "Laplace", "Gaussian", "smaller"):
        t.add_column(col, justify="left" if col == "query, metric" else "right")
    queries = (
        ("count_abs", "one count\nE|error|"),
        ("histogram_sq", f"histogram, d = {lg['histogram_bins']}\nℓ1 = ℓ2 = 1, E‖error‖²"),
        ("k_queries_sq", f"{lg['k']} counting queries\nℓ1 = k, ℓ2 = √k, E‖error‖²"),
    )
    for key, label in queries:
        t.add_section()
        for i, r in enumerate(lg["rows"]):
            x = r[key]
            winner = "Laplace" if x["laplace_formula"] < x["gaussian_formula"] else "Gaussian"
            t.add_row(
                label if i == 0 else "",
                f"{r['epsilon']:g}",
                f"{_g(x['laplace_formula'])} / {_g(x['laplace_measured'])}",
                f"{_g(x['gaussian_formula'])} / {_g(x['gaussian_measured'])}",
                winner,
            )
    console.print(t)
    console.print(
        "Laplace wins for one count and for the histogram (ℓ1 = ℓ2 = 1). For k counting queries ℓ1 = k but ℓ2 = √k, "
        "and the Gaussian wins once k > k* (σ for Δ₂ = 1). 'σ classic' = √(2 ln(1.25/δ))/ε is a theorem only for ε < 1."
    )

    console.rule("[bold]Files written")
    for p in result["files"]:
        console.print(Text("  " + p), soft_wrap=True)  # unwrapped and without markup: copyable paths
    console.print(f"done in {result['seconds']:.1f} s")
