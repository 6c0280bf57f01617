"""The ``dpkit`` command line (Typer).

Commands stay thin: they parse options, call library code and print either rich tables or, with
``--json``, one JSON document on stdout (progress bars and errors go to stderr).

Extending: a new command is a function decorated with ``@app.command()``; a command group
(``budget``, ``account``, ...) is its own ``typer.Typer()`` mounted with ``app.add_typer(group,
name=...)``. Reuse the shared options below (``JsonOption``, ``SeedOption``) and
:func:`_emit_json` / :func:`_fail` so every command behaves alike. The curator service's
``serve`` and ``admin`` live in :mod:`dpkit.server.cli`.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Annotated, Any, NoReturn, cast

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

import dpkit
from dpkit.accounting.events import event_to_dict
from dpkit.errors import DPError, LedgerError

app = typer.Typer(
    name="dpkit",
    help="dpkit: differential privacy you can audit — secure noise, calibrated mechanisms, accuracy with every release.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

# ---- options shared by commands ------------------------------------------------------------------

JsonOption = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON on stdout instead of tables.")]
SeedOption = Annotated[
    int | None,
    typer.Option(
        "--seed",
        min=0,
        help="Seed the noise with numpy.random.default_rng(SEED): reproducible, NOT secure (teaching and tests only). "
        "Without it all noise comes from the OS CSPRNG.",
    ),
]


def _emit_json(obj: Any) -> None:
    typer.echo(json.dumps(obj, indent=2, ensure_ascii=False))


def _fail(message: str, code: int = 1) -> NoReturn:
    Console(stderr=True).print(f"[bold red]error:[/] {message}")
    raise typer.Exit(code)


# ---- commands ------------------------------------------------------------------------------------


@app.callback()
def main() -> None:
    """dpkit: differential privacy you can audit.

    Run `dpkit demo` to see the worked examples of the source texts (randomized response,
    the Laplace mechanism on counts and histograms, Laplace vs Gaussian noise).
    """


@app.command()
def demo(
    out: Annotated[Path, typer.Option("--out", help="Directory for the figure, CSV files and results.json.")] = Path(
        "out/demo"
    ),
    seed: SeedOption = None,
    json_output: JsonOption = False,
) -> None:
    """Run the source texts' worked examples on generated data.

    a. randomized-response survey (Warner p = 2/3, and two coins) with unbiased estimates and 95% CIs;
    b. Laplace counts, an age histogram and k counting queries with error bounds;
    c. Laplace vs Gaussian expected errors, saved as laplace_vs_gaussian.png.
    """
    from dpkit import demo as demo_mod  # matplotlib and friends load only for this command

    try:
        if json_output:
            result = demo_mod.run_demo(out, seed=seed)
        else:
            progress = Progress(
                SpinnerColumn(),
                TextColumn("{task.description}"),
                BarColumn(),
                TimeElapsedColumn(),
                console=Console(stderr=True),
                transient=True,
            )
            with progress:
                result = demo_mod.run_demo(out, seed=seed, progress=progress)
    except OSError as exc:
        _fail(f"could not write the demo's files under {str(out)!r}: {exc}")
    except DPError as exc:
        _fail(str(exc))
    if json_output:
        _emit_json(result)
    else:
        demo_mod.render(result, Console())


@app.command()
def account(
    mechanism: Annotated[str, typer.Option("--mechanism", help="gaussian or laplace.")] = "gaussian",
    noise_multiplier: Annotated[
        float, typer.Option("--noise-multiplier", help="σ/Δ₂ (Gaussian) or b/Δ₁ (Laplace).")
    ] = 1.0,
    sample_rate: Annotated[
        float, typer.Option("--sample-rate", help="Poisson sampling rate q in (0, 1]; 1 = no sampling.")
    ] = 1.0,
    steps: Annotated[int, typer.Option("--steps", help="Number of repetitions (e.g. DP-SGD steps).")] = 1,
    delta: Annotated[float, typer.Option("--delta", help="Target δ.")] = 1e-5,
    plot: Annotated[
        Path | None, typer.Option("--plot", help="Save ε against steps (RDP vs PLD) as a PNG here.")
    ] = None,
    accountants: Annotated[
        list[str] | None,
        typer.Option("--accountant", help="Only this accountant: basic, rdp, zcdp or pld (repeatable; default: all)."),
    ] = None,
    json_output: JsonOption = False,
) -> None:
    """ε of a repeated (optionally subsampled) mechanism by every accountant, with timings.

    Example: dpkit account --mechanism gaussian --noise-multiplier 1.1 --sample-rate 0.004 --steps 2350 --delta 1e-5
    """
    from dpkit import account_report as rep

    try:
        event = rep.build_event(mechanism, noise_multiplier, sample_rate, steps)  # type: ignore[arg-type]
        rows = rep.account(event, delta, rep.check_names(accountants))
        curve_path = None
        if plot is not None:
            curves = rep.epsilon_curve(mechanism, noise_multiplier, sample_rate, steps, delta)  # type: ignore[arg-type]
            title = f"{mechanism}, noise multiplier {noise_multiplier}, q = {sample_rate}, δ = {delta}"
            curve_path = str(rep.plot_epsilon_curve(curves, plot, title))
    except DPError as exc:
        _fail(str(exc))
    if json_output:
        _emit_json(
            {"event": event_to_dict(event), "delta": delta, "results": [r.as_dict() for r in rows], "plot": curve_path}
        )
        return
    table = Table(
        title=f"ε at δ = {delta:g} — {mechanism}, noise multiplier {noise_multiplier}, q = {sample_rate}, {steps} steps"
    )
    for col in ("accountant", "ε", "time (ms)", "note"):
        table.add_column(col, justify="right" if col in ("ε", "time (ms)") else "left")
    for r in rows:
        table.add_row(r.accountant, "—" if r.epsilon is None else f"{r.epsilon:.6g}", f"{r.milliseconds:.2f}", r.note)
    console = Console()
    console.print(table)
    sound = [r for r in rows if r.epsilon is not None and r.accountant in ("pld", "rdp")]
    if sound:
        best = min(sound, key=lambda r: r.epsilon)  # type: ignore[arg-type, return-value]
        console.print(f"tightest sound bound: ε = {best.epsilon:.6g} ({best.accountant.upper()})")
    if curve_path:
        console.print(f"plot: {curve_path}")


budget_app = typer.Typer(help="Show or create privacy budgets in a ledger.", no_args_is_help=False)
app.add_typer(budget_app, name="budget")

LedgerOption = Annotated[
    str,
    typer.Option(
        "--ledger",
        envvar="DPKIT_LEDGER",
        help="The ledger: a SQLite file path, sqlite:///PATH or postgresql://USER@HOST/DB.",
    ),
]


def _ledger_missing(ledger: str) -> bool:
    """True for a SQLite ledger whose file does not exist (a server ledger always 'exists')."""
    if ledger.lower().startswith(("postgresql://", "postgres://")):
        return False
    return not Path(ledger.removeprefix("sqlite:///")).exists()


def _open_existing(ledger: str):
    from dpkit.ledger import open_ledger

    if _ledger_missing(ledger):
        _fail(f"no ledger at {ledger!r} (create a budget first: dpkit budget create ...)")
    return open_ledger(ledger)


@budget_app.callback(invoke_without_command=True)
def budget_show(
    ctx: typer.Context,
    ledger: LedgerOption = ".dpkit/ledger.sqlite",
    dataset: Annotated[
        str | None,
        typer.Option(
            "--dataset", help="Show the spends of this dataset's budget (a name, or a data file: its content identity)."
        ),
    ] = None,
    analyst: Annotated[str | None, typer.Option("--analyst", help="… for this analyst.")] = None,
    json_output: JsonOption = False,
) -> None:
    """Show every budget (ε, δ, spent, remaining), or one budget's spends with --dataset/--analyst."""
    if ctx.invoked_subcommand is not None:
        return
    if dataset is not None and Path(dataset).is_file():
        from dpkit.ledger.identity import dataset_identity

        dataset = dataset_identity(dataset)
    try:
        with _open_existing(ledger) as store:
            budgets = [
                b for b in store.list_budgets() if (dataset in (None, b.dataset)) and (analyst in (None, b.analyst))
            ]
            spends = store.list_spends(dataset, analyst) if dataset and analyst else []
    except DPError as exc:
        _fail(str(exc))
    if json_output:
        _emit_json(
            {
                "ledger": str(ledger),
                "budgets": [
                    {
                        "dataset": b.dataset,
                        "analyst": b.analyst,
                        "epsilon": b.epsilon,
                        "delta": b.delta,
                        "spent_epsilon": b.spent_epsilon,
                        "spent_delta": b.spent_delta,
                        "remaining_epsilon": b.remaining_epsilon,
                        "remaining_delta": b.remaining_delta,
                        "neighbours": b.neighbours,
                        "created_at": b.created_at.isoformat(),
                    }
                    for b in budgets
                ],
                "spends": [
                    {
                        "id": sp.id,
                        "time": sp.created_at.isoformat(),
                        "query": sp.query_text,
                        "epsilon": sp.epsilon_cost,
                        "delta": sp.delta_cost,
                        "event": event_to_dict(sp.event),
                    }
                    for sp in spends
                ],
            }
        )
        return
    console = Console()
    table = Table(title=f"budgets in {ledger}")
    for col in ("dataset", "analyst", "ε", "δ", "spent ε", "spent δ", "remaining ε", "neighbours"):
        table.add_column(col)
    for b in budgets:
        table.add_row(
            b.dataset,
            b.analyst,
            f"{b.epsilon:g}",
            f"{b.delta:g}",
            f"{b.spent_epsilon:.6g}",
            f"{b.spent_delta:.3g}",
            f"{b.remaining_epsilon:.6g}",
            b.neighbours or "—",
        )
    console.print(table)
    if dataset and analyst:
        spend_table = Table(title=f"spends of {dataset} / {analyst}")
        for col in ("id", "time", "query", "event", "ε", "δ"):
            spend_table.add_column(col)
        for sp in spends:
            spend_table.add_row(
                str(sp.id),
                sp.created_at.isoformat(timespec="seconds"),
                sp.query_text,
                type(sp.event).__name__,
                f"{sp.epsilon_cost:.6g}",
                f"{sp.delta_cost:.3g}",
            )
        console.print(spend_table)


@budget_app.command("create")
def budget_create(
    dataset: Annotated[
        str,
        typer.Argument(
            help="A data file (its budget is kept under the file's content identity, as dpkit query pays it) or a dataset name (the service's, a library session's)."
        ),
    ],
    analyst: Annotated[str, typer.Argument(help="Analyst name.")],
    epsilon: Annotated[float, typer.Option("--epsilon", help="The budget's ε.")],
    delta: Annotated[float, typer.Option("--delta", help="The budget's δ.")] = 0.0,
    ledger: LedgerOption = ".dpkit/ledger.sqlite",
) -> None:
    """Create a budget for (dataset, analyst); the ledger file is created on first use."""
    from dpkit.ledger import open_ledger
    from dpkit.ledger.identity import dataset_identity

    shown = dataset
    if Path(dataset).is_file():
        dataset = dataset_identity(dataset)
        shown = f"{Path(shown).name} ({dataset})"
    try:
        with open_ledger(ledger) as store:
            record = store.create_budget(dataset, analyst, epsilon=epsilon, delta=delta)
    except DPError as exc:
        _fail(str(exc))
    typer.echo(f"created budget ε={record.epsilon:g}, δ={record.delta:g} for {shown}/{analyst} in {ledger}")


@app.command()
def query(
    data: Annotated[Path, typer.Argument(help="A CSV or Parquet file.")],
    sql: Annotated[
        str,
        typer.Argument(
            help='SQL of the private subset, e.g. "SELECT sex, COUNT(*), AVG(age) FROM adult GROUP BY sex".'
        ),
    ],
    epsilon: Annotated[
        float, typer.Option("--epsilon", help="ε for the whole query, split equally across its aggregates.")
    ],
    metadata: Annotated[
        Path,
        typer.Option(
            "--metadata",
            help="The curator's declared schema (JSON): every usable column's type, bounds and categories, and the privacy unit (see docs/guide.md, 'The metadata file').",
        ),
    ],
    delta: Annotated[float, typer.Option("--delta", help="δ (private key selection, Gaussian noise).")] = 0.0,
    unit: Annotated[
        str | None, typer.Option("--unit", help="The privacy-unit column (default: the metadata's).")
    ] = None,
    row_level: Annotated[
        bool,
        typer.Option("--row-level", help="Every row is a different person (only when the metadata declares no unit)."),
    ] = False,
    ledger: LedgerOption = ".dpkit/ledger.sqlite",
    analyst: Annotated[
        str, typer.Option("--analyst", help="Whose budget pays (created with dpkit budget create DATA ANALYST ...).")
    ] = "analyst",
    table: Annotated[
        str | None,
        typer.Option(
            "--table", help="The table's name in SQL (default: the file's stem). It does not choose the budget."
        ),
    ] = None,
    max_groups: Annotated[
        int | None, typer.Option("--max-groups", help="Groups per privacy unit (default: metadata's, else 1).")
    ] = None,
    max_rows: Annotated[
        int | None, typer.Option("--max-rows", help="Rows per privacy unit per group (default: metadata's, else 1).")
    ] = None,
    noise: Annotated[str, typer.Option("--noise", help="laplace or gaussian.")] = "laplace",
    confidence: Annotated[float, typer.Option("--confidence", help="Confidence level of the intervals.")] = 0.95,
    seed: Annotated[
        int | None,
        typer.Option(
            "--seed", help="Refused: seeded noise can be replayed, and this command always pays from a ledger."
        ),
    ] = None,
    json_output: JsonOption = False,
) -> None:
    """Run one private SQL query on a file and pay for it from the ledger.

    The budget is the one created for this file's content (dpkit budget create DATA ANALYST),
    whatever --table says. Example:

    dpkit generate census census.csv --metadata census.json && \
    dpkit budget create census.csv alice --epsilon 3 && \
    dpkit query census.csv "SELECT sex, COUNT(*), AVG(age) FROM census WHERE age > 30 GROUP BY sex" --epsilon 1 --metadata census.json --analyst alice
    """
    import numpy as np

    from dpkit.analytics import Session
    from dpkit.ledger.identity import dataset_identity

    if not data.is_file():
        _fail(f"no such file: {str(data)!r}")
    if not metadata.is_file():
        _fail(
            f"no such metadata file: {str(metadata)!r} (write one by hand, or dpkit generate census ... --metadata FILE for the example)"
        )
    name = table or data.stem
    dataset = dataset_identity(data)
    if _ledger_missing(ledger):
        _fail(
            f"no ledger at {ledger!r}: create a budget first (dpkit budget create {data} {analyst} --epsilon E --ledger {ledger})"
        )
    err = Console(stderr=True)
    try:
        with err.status(f"scanning {data.name} …", spinner="dots") if not json_output else contextlib.nullcontext():
            session = Session(
                data,
                privacy_unit=unit,
                row_level=True if row_level else None,
                ledger=ledger,
                dataset=dataset,
                analyst=analyst,
                metadata=metadata,
                max_groups=max_groups,
                max_rows=max_rows,
                table=name,
                rng=None if seed is None else np.random.default_rng(seed),
            )
            result = session.sql(sql, epsilon=epsilon, delta=delta, noise=noise, confidence=confidence)  # type: ignore[arg-type]
            record = session._ledger.get_budget(dataset, analyst)
    except LedgerError as exc:
        _fail(
            f"{exc} (budgets for a file are created with: dpkit budget create {data} {analyst} --epsilon E --ledger {ledger})"
        )
    except DPError as exc:
        _fail(str(exc))
    if json_output:
        out = result.to_dict()
        out["budget"] = {
            "dataset": dataset,
            "analyst": analyst,
            "epsilon": record.epsilon,
            "delta": record.delta,
            "spent_epsilon": record.spent_epsilon,
            "spent_delta": record.spent_delta,
            "remaining_epsilon": record.remaining_epsilon,
            "remaining_delta": record.remaining_delta,
        }
        _emit_json(out)
        return
    console = Console()
    pct = f"{confidence * 100:g}%"
    tbl = Table(
        title=f"{sql}", caption=f"ε={result.epsilon:g}, δ={result.delta:g} · {pct} intervals · keys: {result.keys}"
    )
    for g in result.groups:
        tbl.add_column(g)
    for a in result.aggregates:
        tbl.add_column(a.name, justify="right")
        tbl.add_column(f"{pct} CI", justify="right")
    for _, row in result.table.iterrows():
        cells = [str(row[g]) for g in result.groups]
        for a in result.aggregates:
            lo, hi = row[f"{a.name}_low"], row[f"{a.name}_high"]
            cells += [_fmt(row[a.name]), "—" if lo != lo else f"[{_fmt(lo)}, {_fmt(hi)}]"]
        tbl.add_row(*cells)
    console.print(tbl)
    for a in result.aggregates:
        scale = "" if a.scale != a.scale else f", noise scale {_fmt(a.scale)}"
        console.print(f"  {a.name}: {a.mechanism}, ε={a.epsilon:.4g}{f', δ={a.delta:.3g}' if a.delta else ''}{scale}")
    for note in result.notes:
        console.print(f"  {note}")
    console.print(
        f"budget {dataset}/{analyst}: spent ε={record.spent_epsilon:.6g} of {record.epsilon:g}, "
        f"remaining ε={record.remaining_epsilon:.6g}, δ={record.remaining_delta:.3g}"
    )


def _fmt(x: float) -> str:
    return f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.4g}"


@app.command("generate")
def generate(
    kind: Annotated[str, typer.Argument(help="census: the census-like example table.")],
    out: Annotated[Path, typer.Argument(help="Where to write the CSV.")],
    people: Annotated[int, typer.Option("--people", help="Number of people (each has 1–3 rows).")] = 20_000,
    metadata: Annotated[
        Path | None, typer.Option("--metadata", help="Also write the curator's metadata JSON here.")
    ] = None,
) -> None:
    """Write bundled example data (generated, not real people) and, optionally, its metadata."""
    from dpkit import datasets

    if kind != "census":
        _fail(f"unknown data set {kind!r}: accepted: census")
    try:
        frame = datasets.census(people=people)
    except DPError as exc:
        _fail(str(exc))
    out.parent.mkdir(parents=True, exist_ok=True)
    frame.to_csv(out, index=False)
    if metadata is not None:
        metadata.parent.mkdir(parents=True, exist_ok=True)
        metadata.write_text(json.dumps(datasets.CENSUS_METADATA, indent=2) + "\n", encoding="utf-8")
    typer.echo(
        f"wrote {len(frame)} rows ({people} people) to {out}" + (f" and metadata to {metadata}" if metadata else "")
    )


anonymity_app = typer.Typer(
    help="k-anonymity of a table, and Mondrian generalisation (syntactic, not DP).", no_args_is_help=True
)
app.add_typer(anonymity_app, name="anonymity")


@anonymity_app.command("check")
def anonymity_check(
    data: Annotated[Path, typer.Argument(help="A CSV file (header line first).")],
    quasi: Annotated[
        str, typer.Option("--quasi", help="Quasi-identifier columns, comma-separated (e.g. age,sex,zip).")
    ],
    k: Annotated[
        int | None, typer.Option("--k", help="Target k: report the rows below it, and with --generalise reach it.")
    ] = None,
    sensitive: Annotated[
        str | None, typer.Option("--sensitive", help="A sensitive column: also report its ℓ-diversity.")
    ] = None,
    generalise_to: Annotated[
        Path | None, typer.Option("--generalise", help="Write a Mondrian generalisation reaching --k here (CSV).")
    ] = None,
    suppress: Annotated[
        float, typer.Option("--suppress", help="With --generalise: fraction of rows that may be suppressed.")
    ] = 0.0,
    json_output: JsonOption = False,
) -> None:
    """Measure k (and ℓ) of a table for a set of quasi-identifiers; optionally generalise it to k."""
    import pandas as pd

    from dpkit.anonymity import anonymity_report, generalise

    if not data.exists():
        _fail(f"no such file: {str(data)!r}")
    qi = [c.strip() for c in quasi.split(",") if c.strip()]
    try:
        frame = pd.read_csv(data, skipinitialspace=True)
        report = anonymity_report(frame, qi, sensitive=sensitive, target_k=k)
        out: dict[str, Any] = {
            "file": str(data),
            "quasi_identifiers": qi,
            "k": report.k,
            "l": report.l,
            "classes": report.n_classes,
            "rows": report.n_rows,
            "target_k": k,
            "rows_below_target": report.rows_below_target,
        }
        if generalise_to is not None:
            if k is None:
                _fail("--generalise needs --k")
            released, g = generalise(frame, qi, k, suppress=suppress)
            released.to_csv(generalise_to, index=False)
            out["generalised"] = {
                "path": str(generalise_to),
                "k_achieved": g.k_achieved,
                "classes": g.n_classes,
                "suppressed": g.n_suppressed,
                "ncp": g.ncp,
                "discernibility": g.discernibility,
            }
    except DPError as exc:
        _fail(str(exc))
    if json_output:
        _emit_json(out)
        return
    console = Console()
    console.print(
        f"{data.name}: k = {report.k} on ({', '.join(qi)}), {report.n_classes} classes, {report.n_rows} rows"
        + (f"; ℓ = {report.l} for {sensitive}" if sensitive else "")
    )
    if k is not None:
        console.print(f"rows in classes smaller than k = {k}: {report.rows_below_target}")
    if "generalised" in out:
        gd = out["generalised"]
        console.print(
            f"Mondrian: k = {gd['k_achieved']}, {gd['classes']} classes, {gd['suppressed']} rows suppressed, "
            f"information loss NCP = {gd['ncp']:.4f}; written to {gd['path']}"
        )


attack_app = typer.Typer(help="Attacks that show why privacy is needed.", no_args_is_help=True)
app.add_typer(attack_app, name="attack")


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
    """Dinur–Nissim reconstruction against a naive noisy curator and against dpkit's Laplace curator
    under a budget (ε split over the same queries)."""
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


@app.command("check")
def check(
    data: Annotated[Path, typer.Argument(help="A CSV (header line first), Parquet or DuckDB database file.")],
    metadata: Annotated[
        Path,
        typer.Option(
            "--metadata", help="The curator's declared schema (JSON): column types, bounds, categories, privacy unit."
        ),
    ],
    table: Annotated[
        str | None,
        typer.Option(
            "--table",
            help="The table to check in a DuckDB database file; otherwise the name shown (default: the file's stem).",
        ),
    ] = None,
    json_output: JsonOption = False,
) -> None:
    """Check how well a private file conforms to its declared metadata (curator only).

    Per declared column: conforming values, NULLs, values that are not of the declared type,
    values out of the bounds or outside the categories, with near misses (' Male' → 'Male');
    for the privacy unit, rows per unit. The report holds exact counts and values of the private
    data: it is for the curator, not a private release, and spends no budget.

    Exit code: 0 when everything conforms, 1 when something does not, 2 on bad input.
    """
    from dpkit.analytics.check import check_data

    if not data.is_file():
        _fail(f"no such data file: {str(data)!r}", 2)
    if not metadata.is_file():
        _fail(f"no such metadata file: {str(metadata)!r} (the curator's JSON declaring the columns)", 2)
    try:
        report = check_data(data, metadata, table=table)
    except DPError as exc:
        _fail(str(exc), 2)
    if json_output:
        _emit_json(report.to_dict())
    else:  # plain fixed-width text: a rich table would cut declared types and values to the terminal's width
        typer.echo(report.to_text())
    raise typer.Exit(0 if report.ok else 1)


# ---- the curator service ---------------------------------------------------------------------------

from dpkit.server.cli import admin_app, serve  # noqa: E402  (kept beside the service's code)

app.command("serve")(serve)
app.add_typer(admin_app, name="admin")


@app.command()
def version() -> None:
    """Print the installed dpkit version."""
    typer.echo(f"dpkit {dpkit.__version__}")


if __name__ == "__main__":  # pragma: no cover
    app()
