"""``dpkit attack``: attacks that show why privacy is needed (Dinur–Nissim reconstruction)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, cast

import typer
from rich.console import Console

import dpkit
from dpkit.cli._common import JsonOption, SeedOption, _emit_json, _fail
from dpkit.errors import DPError

__all__ = ["attack_app", "attack_reconstruction"]

attack_app = typer.Typer(help="Attacks that show why privacy is needed.", no_args_is_help=True)


@attack_app.command("reconstruction")
def attack_reconstruction(
    n: Annotated[int, typer.Option("--n", help="Number of secret bits (people).")] = 500,
    noise: Annotated[float, typer.Option("--noise", help="Bound on the naive curator's noise per answer.")] = 5.0,
    queries: Annotated[int | None, typer.Option("--queries", help="Random subset queries (default 4n).")] = None,
    method: Annotated[str, typer.Option("--method", help="lstsq, lp or lp_max.")] = "lstsq",
    epsilon: Annotated[
        float, typer.Option("--epsilon", help="Total ε of the dpkit curator, split over the queries.")
    ] = 1.0,
    plot: Annotated[
        Path | None, typer.Option("--plot", help="Save recovered fraction against noise/√n here (PNG).")
    ] = None,
    seed: SeedOption = None,
    json_output: JsonOption = False,
) -> None:
    """Dinur–Nissim reconstruction against a naive noisy curator and against dpkit's Laplace curator.

    dpkit's curator answers under a budget: ε is split over the same queries."""
    import math

    import numpy as np

    from dpkit.attacks import DPCurator, NaiveCurator, dinur_nissim_attack, split_epsilon
    from dpkit.attacks.reconstruction import Method

    # The option is a plain string; dinur_nissim_attack refuses any name but its methods.
    attack_method = cast(Method, method)
    rng = np.random.default_rng(seed)
    try:
        if n < 1:
            raise dpkit.InvalidParameterError("n", n, "an integer >= 1")
        q = 4 * n if queries is None else queries
        secret = rng.integers(0, 2, n)
        naive = dinur_nissim_attack(
            NaiveCurator(secret, noise_bound=noise, rng=rng), n, queries=q, method=attack_method, rng=rng
        )
        budget = dpkit.Budget(epsilon=epsilon)
        dp_curator = DPCurator(
            secret, budget=budget, epsilon_per_query=split_epsilon(epsilon, q), rng=None if seed is None else rng
        )
        private = dinur_nissim_attack(dp_curator, n, queries=q, method=attack_method, rng=rng)
        curve = None
        if plot is not None:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt

            ratios = [0.0625, 0.125, 0.25, 0.5, 1, 2, 4, 8]
            fracs = [
                dinur_nissim_attack(
                    NaiveCurator(secret, noise_bound=r * math.sqrt(n), rng=rng),
                    n,
                    queries=q,
                    method=attack_method,
                    rng=rng,
                ).recovered_fraction
                for r in ratios
            ]
            fig, ax = plt.subplots(figsize=(6, 4))
            ax.semilogx(ratios, fracs, "o-", label="naive curator")
            ax.axhline(
                private.recovered_fraction, color="C1", ls="--", label=f"dpkit, ε = {epsilon:g} over {q} queries"
            )
            ax.axhline(0.5, color="grey", lw=0.8)
            ax.set_xlabel("noise / √n")
            ax.set_ylabel("fraction of bits recovered")
            ax.set_title(f"Dinur–Nissim, n = {n}, {q} queries")
            ax.legend()
            fig.tight_layout()
            plot.parent.mkdir(parents=True, exist_ok=True)
            fig.savefig(plot, dpi=120)
            plt.close(fig)
            curve = {"noise_over_sqrt_n": ratios, "recovered": fracs, "path": str(plot)}
    except DPError as exc:
        _fail(str(exc))
    out = {
        "n": n,
        "queries": q,
        "method": method,
        "naive": {
            "noise": noise,
            "recovered_fraction": naive.recovered_fraction,
            "blatantly_non_private": naive.blatantly_non_private,
            "seconds": naive.seconds,
        },
        "dpkit": {
            "epsilon": epsilon,
            "epsilon_per_query": split_epsilon(epsilon, q),
            "recovered_fraction": private.recovered_fraction,
            "blatantly_non_private": private.blatantly_non_private,
            "spent": budget.spent[0],
        },
        "plot": curve,
    }
    if json_output:
        _emit_json(out)
        return
    console = Console()
    console.print(
        f"naive curator (noise ≤ {noise:g}, √n = {math.sqrt(n):.3g}): recovered {naive.recovered_fraction:.1%} of {n} bits "
        f"with {q} queries — {'blatantly non-private' if naive.blatantly_non_private else 'not blatantly non-private'}"
    )
    console.print(
        f"dpkit curator (ε = {epsilon:g} split over {q} queries): recovered {private.recovered_fraction:.1%} "
        f"— {'blatantly non-private' if private.blatantly_non_private else 'about guessing'}"
    )
    if curve:
        console.print(f"plot: {curve['path']}")
