"""Differentially private synthetic tables: select, measure, generate.

:class:`Synthesizer` releases a whole table once. It measures noisy marginals of the data — every
one-way marginal, then column pairs chosen one at a time with the exponential mechanism — fits a
graphical model that agrees with all of them, and samples rows from the model. Everything done
with those rows afterwards is post-processing: it costs no more budget.

Two algorithms, both with the Private-PGM estimator (:mod:`dpkit.synth.graphical`):

* ``method="aim"`` (default): AIM (McKenna, Mullins, Sheldon & Miklau, "AIM: an adaptive and
  iterative mechanism for differentially private synthetic data", VLDB 2022) with a fixed
  schedule of T = 3d rounds (:mod:`dpkit.synth.split`): 5 % of ρ to the T selections (one ε);
  of the rest, 20 % to the d one-way measurements, shared in proportion to the columns' cells,
  and 80 % to the T pair measurements (one σ). Each round picks the pair the current model gets
  most wrong, net of part of the noise its measurement would carry, among the pairs that keep
  the model small enough.
* ``method="mst"``: MST (McKenna, Miklau & Sheldon, "Winning the NIST Contest", JPC 2021): a third
  of ρ each for the one-way marginals, the d − 1 selections of a spanning tree (Kruskal), and the
  d − 1 pair measurements.

dpkit's guarantees:

* **Pay first.** The whole release is priced and paid (one composed event, ρ-zCDP) before a row is
  read; afterwards nothing fails on the data.
* **Exact noise.** Counts get discrete Gaussian noise (Canonne, Kamath & Steinke 2020), exactly
  ρ = 1/(2σ²) zCDP for a marginal of sensitivity 1; the selection is the exponential mechanism
  sampled exactly (ε-bounded range, ρ = ε²/8: Cesar & Rogers 2021).
* **A public domain.** Columns, categories and bins come from the metadata (and ``bins``), never
  from the data; the number of rows is measured (from the noisy one-way marginals), not assumed.
* **Neighbours.** Add or remove one person. With a privacy unit each person keeps one row
  (chosen by a keyed hash); with ``row_level`` every row is a person.

Guarantee: (ε, δ)-DP for the declared (ε, δ), via the total ρ and the conversion of Canonne,
Kamath & Steinke (2020) (:func:`dpkit.accounting.zcdp.zcdp_to_approx_dp`).

One-way cells whose noisy count is below 3σ are merged into one cell per column before selection
(they are too noisy to model apart; rows sampled into the merged cell get one of its categories
in proportion to their noisy one-way counts), and every pair is then measured on the merged
cells: one noisy count per merged cell (:mod:`dpkit.synth.cells`). A column the metadata declares never missing (``nullable=False``) has
no missing cell, so its synthetic values are never missing. The report
(:mod:`dpkit.synth.report`) warns when ε is too small for the table's measured size.

>>> import numpy as np, pandas as pd
>>> from dpkit.analytics import Categorical, Metadata, Numeric
>>> rng = np.random.default_rng(0)
>>> n = 5_000
>>> sex = rng.choice(["F", "M"], n)
>>> frame = pd.DataFrame({"sex": sex, "age": np.where(sex == "F", 30, 50) + rng.normal(0, 5, n)})
>>> meta = Metadata(columns={"sex": Categorical(("F", "M")), "age": Numeric(0, 100)}, row_level=True)
>>> syn = Synthesizer(epsilon=1.0, delta=1e-9, metadata=meta, bins={"age": 10}, rng=rng).fit(frame)
>>> rows = syn.sample(1_000)
>>> sorted(rows.columns), len(rows)
(['age', 'sex'], 1000)
>>> bool(rows.groupby("sex")["age"].mean().diff().iloc[-1] > 10)   # the correlation survives
True
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from itertools import combinations
from typing import Any

import numpy as np
import pandas as pd
from numpy.typing import NDArray

from dpkit import _validate as v
from dpkit._cancel import checkpoint
from dpkit._progress import ProgressBar, check_progress, shows_bar
from dpkit._validate import short_repr
from dpkit.accounting.events import ComposedEvent, DPEvent, ExponentialEvent, GaussianEvent, SelfComposedEvent
from dpkit.analytics.engines.base import is_spark_frame
from dpkit.analytics.metadata import MAX_INTEGER, Metadata
from dpkit.analytics.session_setup import load_metadata
from dpkit.budget import Budget
from dpkit.errors import BudgetExceededError, DPError, InvalidParameterError
from dpkit.mechanisms.selection import Exponential
from dpkit.noise.source import RNG, resolve_rng
from dpkit.synth.cells import Decoder, compress, measure_merged, merge_rare, merged_sigma
from dpkit.synth.domain import Domain
from dpkit.synth.graphical import GraphicalModel, JunctionTree, tree_size
from dpkit.synth.measure import TableCounts, noisy
from dpkit.synth.report import Measurement, SynthReport, noise_warnings
from dpkit.synth.spark_counts import SparkTableCounts
from dpkit.synth.split import split

__all__ = ["Synthesizer", "SynthReport", "Measurement"]

#: The most cells a two-way marginal may have, and all two-way marginals together: every pair's
#: true counts are held in memory during the fit (8 bytes a cell: 400 MB at the cap).
MAX_PAIR_CELLS = 4_000_000
MAX_TOTAL_PAIR_CELLS = 50_000_000
Pair = tuple[int, int]
#: A measurement: its columns, its noisy counts (on the merged cells), its noise σ (per cell for a
#: one-way marginal whose merged cell sums several noisy counts).
Found = tuple[tuple[int, ...], NDArray[np.float64], float | NDArray[np.float64]]

#: The most selection rounds of method="aim".
MAX_ROUNDS = 1_000
#: The most cells the junction tree of method="aim" may reach (the belief propagation's work).
MAX_MODEL_CELLS = 250_000
#: Mirror-descent iterations: after each round, and at the end.
_ROUND_ITERATIONS = 30
_FINAL_ITERATIONS = 400
#: One-way cells whose noisy count is below this many σ are merged (:mod:`dpkit.synth.cells`).
_MERGE_BELOW = 3.0
#: AIM scores a pair by the model's L1 error on it less this share of the L1 error its measurement's
#: noise would carry (√(2/π)·σ per cell). The original counts all of it; but the fitted model's
#: error on a measured marginal is well below the raw noise (the counts it fits are non-negative
#: and agree with every other measurement), so counting it all passes over large pairs the model
#: gets most wrong. Half, measured on UCI Adult (benchmarks/bench_synth.py).
_NOISE_PENALTY = 0.5


@dataclass(frozen=True)
class _Plan:
    method: str
    domain: Domain
    rho: float
    sigma_ones: tuple[float, ...]
    sigma_two: float
    selection_epsilon: float
    rounds: int
    event: DPEvent


class Synthesizer:
    """A differentially private synthetic-data generator (AIM or MST: see the module docstring).

    Parameters
    ----------
    epsilon, delta:
        The privacy of the whole release (δ > 0: the Gaussian mechanism needs it).
    metadata:
        The curator's :class:`~dpkit.analytics.Metadata` (or its dict or JSON file): every
        synthesised column with its categories or numeric bounds, and the privacy unit
        (``privacy_unit`` or ``row_level``).
    bins:
        Per numeric column, bin edges or a number of equal-width bins over its declared bounds
        (default :data:`~dpkit.synth.domain.DEFAULT_BINS`).
    columns:
        The columns to synthesise (default: every declared column).
    integers:
        Numeric columns whose synthetic values are whole numbers (counts, ages, amounts in whole
        units): each row gets an integer drawn uniformly from those inside its bin, so a bin
        [0, 1) gives 0, not a fraction. Post-processing: the same release, nothing more spent.
    budget:
        The :class:`~dpkit.Budget` paying for the release (default: a fresh one of (ε, δ) with the
        zCDP accountant). A budget that cannot pay is refused before the data is read.
    rng:
        None (secure noise) or a numpy Generator for reproducible examples and tests: the noise
        and the sampling are then replayable — never publish from a seeded fit.
    progress:
        A progress bar over the measurement rounds: True, False, or None (on a terminal).

    After :meth:`fit`: :attr:`report` (a :class:`SynthReport`), :attr:`event_`, and
    :meth:`sample`.
    """

    def __init__(
        self,
        *,
        epsilon: float,
        delta: float,
        metadata: Metadata | dict[str, Any] | str | os.PathLike[str],
        bins: Mapping[str, Sequence[float] | int] | None = None,
        columns: Sequence[str] | None = None,
        integers: Sequence[str] | None = None,
        budget: Budget | None = None,
        method: str = "aim",
        rounds: int | None = None,
        rng: RNG = None,
        progress: bool | None = None,
    ) -> None:
        v.positive(epsilon, "epsilon")
        if method not in ("aim", "mst"):
            raise InvalidParameterError(
                "method", method if isinstance(method, str) else short_repr(method), "'aim' (the default) or 'mst'"
            )
        if rounds is not None and (method != "aim" or v.positive_int(rounds, "rounds") > MAX_ROUNDS):
            raise InvalidParameterError(
                "rounds", short_repr(rounds), f"None, or with method='aim' a number of rounds in [1, {MAX_ROUNDS}]"
            )
        self.method = method
        self.rounds = rounds
        if not isinstance(delta, (int, float)) or isinstance(delta, bool) or not 0 < delta < 1:
            raise InvalidParameterError(
                "delta", short_repr(delta), "a number in (0, 1): the Gaussian mechanism needs δ > 0"
            )

        self.metadata = load_metadata(metadata)
        if not isinstance(self.metadata, Metadata):
            raise InvalidParameterError(
                "metadata",
                "a dataset of several tables",
                "the Metadata of one table",
                "a synthetic table is one table's",
            )
        if self.metadata.privacy_unit is None and not self.metadata.row_level:
            raise InvalidParameterError(
                "metadata.privacy_unit",
                None,
                'the column naming the person ({"privacy_unit": "person_id"}), or {"row_level": true}',
                "a synthetic table protects people: the metadata must say who they are",
            )
        if budget is not None and not isinstance(budget, Budget):
            raise InvalidParameterError("budget", short_repr(budget), "a dpkit.Budget, or None")
        self.epsilon = float(epsilon)
        self.delta = float(delta)
        self.progress = check_progress(progress)
        resolve_rng(rng)  # refused here, not after fit has paid
        self._rng = rng
        self._budget = budget
        self._plan = self._make_plan(Domain.from_metadata(self.metadata, bins=bins, columns=columns))
        numeric = {c.name for c in self._plan.domain.columns if c.edges is not None}
        if integers is not None and (isinstance(integers, str) or not isinstance(integers, Sequence)):
            raise InvalidParameterError("integers", short_repr(integers), "a list of numeric column names, or None")
        for name in integers or ():
            if name not in numeric:
                raise InvalidParameterError(
                    "integers", short_repr(name), "a synthesised numeric column"
                    + (f" ({', '.join(sorted(numeric))})" if numeric else " (there is none)"),
                )  # fmt: skip
            edges = self._plan.domain.columns[self._plan.domain.index(name)].edges or ()
            if max(abs(edges[0]), abs(edges[-1])) > MAX_INTEGER:  # whole numbers drawn as exact int64
                raise InvalidParameterError(
                    f"bins.{name}", f"[{edges[0]:g}, …, {edges[-1]:g}]", "edges within ±2**53 for a column of integers",
                )  # fmt: skip
        self.integers = tuple(integers or ())
        self.report: SynthReport | None = None
        self.event_: DPEvent | None = None
        self._model: GraphicalModel | None = None
        self._decode: list[Decoder] = []

    # -- the plan: public facts only --------------------------------------------------------------

    def _make_plan(self, domain: Domain) -> _Plan:
        d = len(domain.columns)
        for i in range(d):
            for j in range(i + 1, d):
                cells = domain.columns[i].size * domain.columns[j].size
                if cells > MAX_PAIR_CELLS:
                    a, b = domain.columns[i].name, domain.columns[j].name
                    raise InvalidParameterError(
                        "bins", f"{a} × {b}: {cells:,} cells", f"two-way marginals of at most {MAX_PAIR_CELLS:,} cells",
                        "use fewer bins or categories",
                    )  # fmt: skip
        sizes = [c.size for c in domain.columns]
        total = (sum(sizes) ** 2 - sum(k * k for k in sizes)) // 2
        if total > MAX_TOTAL_PAIR_CELLS:
            raise InvalidParameterError(
                "columns", f"{d} columns whose two-way marginals hold {total:,} cells",
                f"at most {MAX_TOTAL_PAIR_CELLS:,} cells over all two-way marginals (held in memory during the fit)",
                "synthesise fewer columns, or use fewer bins or categories",
            )  # fmt: skip
        # MST: d − 1 selections; AIM: a fixed schedule of T (the event is then known in advance,
        # for any accountant). σ and the selection ε inside the samplers' range, or refused here.
        rounds = d - 1 if self.method == "mst" else self.rounds if self.rounds is not None else 3 * d
        s = split(self.method, d, rounds, self.epsilon, self.delta, cells=[c.size for c in domain.columns])
        ones: DPEvent = (
            SelfComposedEvent(GaussianEvent(s.sigma_ones[0]), d)
            if len(set(s.sigma_ones)) == 1
            else ComposedEvent(tuple(GaussianEvent(x) for x in s.sigma_ones))
        )
        event = ComposedEvent(
            (
                ones,
                SelfComposedEvent(ExponentialEvent(s.selection_epsilon), rounds),
                SelfComposedEvent(GaussianEvent(s.sigma_two), rounds),
            )
        )
        return _Plan(self.method, domain, s.rho, s.sigma_ones, s.sigma_two, s.selection_epsilon, rounds, event)

    @property
    def planned_rounds(self) -> int:
        """The selection rounds :meth:`fit` runs: columns − 1 with MST; with AIM ``rounds``, or
        three times the columns."""
        return self._plan.rounds

    @property
    def domain(self) -> Domain:
        """The cells of every synthesised column (from the metadata and ``bins``)."""
        return self._plan.domain

    @property
    def event(self) -> DPEvent:
        """The event :meth:`fit` spends (known before any data is read)."""
        return self._plan.event

    # -- fit ---------------------------------------------------------------------------------------

    def fit(self, data: Any, *, table: str | None = None, _pay: Callable[[DPEvent], None] | None = None) -> Synthesizer:
        """Measure ``data`` and fit the model: a pandas DataFrame, a CSV or Parquet path (a Parquet
        directory or glob too), a DuckDB relation, a (DuckDB connection, table) pair, or a
        ``pyspark.sql.DataFrame`` (counted on its cluster: only the marginals reach the driver).

        Order: the data's schema is checked against the metadata (a missing column is refused,
        nothing paid); the budget pays the whole :attr:`event`; then the marginals are computed
        in the engine (DuckDB or Spark) and noised. A fit spends once; fitting again spends again."""
        plan = self._plan
        counts: TableCounts | SparkTableCounts
        if is_spark_frame(data):
            if table is not None:
                raise InvalidParameterError("table", table, "None with a Spark DataFrame (it is the table)")
            counts = SparkTableCounts(data, self.metadata, plan.domain)
        else:
            counts = TableCounts(data, self.metadata, plan.domain, table=table)
        try:
            if _pay is not None:  # the curator service debits its ledger (with its audit entry) instead
                _pay(plan.event)
            else:
                self._spend(plan.event)
            # Paid: from here on nothing may fail on the data.
            src = resolve_rng(self._rng)
            total = len(plan.domain.columns) + plan.rounds
            bar = ProgressBar(
                shows_bar(self.progress, total, 0), total=total, label="Synthesizer", unit="measurements",
                epsilon=self.epsilon, delta=self.delta, transient=self.progress is None,
            )  # fmt: skip
            with bar as advance:
                counts.prepare(salt=int(src.words(1)[0] >> np.uint64(1)))
                self._measure(counts, src, advance)
        finally:
            counts.close()
        self.event_ = plan.event
        return self

    def _spend(self, event: DPEvent) -> None:
        budget = (
            self._budget
            if self._budget is not None
            else Budget(epsilon=self.epsilon, delta=self.delta, accountant="zcdp")
        )
        try:
            budget.spend(event)
        except BudgetExceededError:
            raise
        except DPError as exc:
            raise InvalidParameterError(
                "budget", short_repr(budget), "a Budget whose accountant prices Gaussian and exponential-mechanism events",
                "e.g. dp.Budget(epsilon=..., delta=..., accountant='zcdp')",
            ) from exc  # fmt: skip

    def _measure(self, counts: TableCounts | SparkTableCounts, src: Any, advance: Any) -> None:
        plan = self._plan
        domain = plan.domain
        d = len(domain.columns)
        names = domain.names
        measurements: list[Measurement] = []
        # 1. Every one-way marginal.
        ones = []
        for i, column in enumerate(domain.columns):
            sig = plan.sigma_ones[i]
            ones.append(noisy(counts.counts((i,)), sig, src).astype(float))
            measurements.append(Measurement((column.name,), sig, column.size, _rho(sig), "one-way"))
            advance()
        # 2. Merge the cells too rare to model apart (post-processing of the one-way counts). A
        # merged one-way cell sums its members' noisy counts: its σ is σ·√members.
        merges = [merge_rare(y, _MERGE_BELOW * sig) for y, sig in zip(ones, plan.sigma_ones, strict=True)]
        sizes = [int(m.max()) + 1 for m in merges]
        one_way = [
            np.bincount(m, weights=y, minlength=k).astype(float) for m, y, k in zip(merges, ones, sizes, strict=True)
        ]
        rows = max(float(np.median([y.sum() for y in ones])), 1.0)
        # The true counts of every candidate pair, on the merged cells (read once, in the engine).
        pairs = [(i, j) for i in range(d) for j in range(i + 1, d)]
        true = {p: compress(counts.counts(p), merges[p[0]], merges[p[1]], sizes[p[0]], sizes[p[1]]) for p in pairs}

        def measure(pair: tuple[int, int], sigma: float) -> NDArray[np.float64]:
            # One noisy count per merged cell (sensitivity 1: the merged cells partition the rows).
            i, j = pair
            measurements.append(Measurement((names[i], names[j]), sigma, true[pair].size, _rho(sigma), "selected"))
            advance()
            return measure_merged(true[pair], sigma, src)

        chooser = Exponential(epsilon=plan.selection_epsilon, sensitivity=1.0)
        found: list[Found] = [
            (
                (i,),
                one_way[i],
                merged_sigma(merges[i], plan.sigma_ones[i]) if sizes[i] < merges[i].size else plan.sigma_ones[i],
            )
            for i in range(d)
        ]
        select = self._mst if plan.method == "mst" else self._aim
        chosen, model = select(pairs, true, found, sizes, rows, chooser, measure, src)
        self._model = model
        self._decode = [
            Decoder(column, m, column.name in self.integers, y)
            for column, m, y in zip(domain.columns, merges, ones, strict=True)
        ]
        self.report = SynthReport(
            measurements=tuple(measurements),
            rows=model.total,
            warnings=noise_warnings(measurements, model.total, self.epsilon),
            selected=tuple((names[i], names[j]) for i, j in chosen),
            merged={c.name: int(c.size - k) for c, k in zip(domain.columns, sizes, strict=True)},
            event=plan.event,
            epsilon=self.epsilon,
            delta=self.delta,
            rho=plan.rho,
            selection_epsilon=plan.selection_epsilon,
            method=plan.method,
        )

    def _mst(
        self,
        pairs: list[Pair],
        true: dict[Pair, NDArray[np.float64]],
        found: list[Found],
        sizes: list[int],
        rows: float,
        chooser: Exponential,
        measure: Callable[[Pair, float], NDArray[np.float64]],
        src: Any,
    ) -> tuple[list[Pair], GraphicalModel]:
        """A spanning tree, pair by pair (Kruskal with the exponential mechanism): a pair's score
        is the L1 distance between its true counts and the independent model's; then the
        graphical model fitted to every measurement (on a tree, the junction tree is the tree)."""
        d = len(sizes)
        independent = [np.maximum(y, 0) / max(np.maximum(y, 0).sum(), 1e-12) for _, y, _ in found]
        score = {p: float(np.abs(true[p] - rows * np.outer(independent[p[0]], independent[p[1]])).sum()) for p in pairs}
        component = list(range(d))

        def find(x: int) -> int:
            while component[x] != x:
                component[x] = component[component[x]]
                x = component[x]
            return x

        chosen: list[tuple[int, int]] = []
        for _ in range(d - 1):
            candidates = [p for p in pairs if find(p[0]) != find(p[1])]
            pick = candidates[int(chooser.release([score[p] for p in candidates], rng=src))]
            component[find(pick[0])] = find(pick[1])
            chosen.append(pick)
        sigma = self._plan.sigma_two
        found = [*found, *((p, measure(p, sigma), sigma) for p in chosen)]
        model = GraphicalModel(JunctionTree.build(sizes, [c for c, _, _ in found]), rows)
        model.fit(found, _FINAL_ITERATIONS)
        return chosen, model

    def _aim(
        self,
        pairs: list[Pair],
        true: dict[Pair, NDArray[np.float64]],
        found: list[Found],
        sizes: list[int],
        rows: float,
        chooser: Exponential,
        measure: Callable[[Pair, float], NDArray[np.float64]],
        src: Any,
    ) -> tuple[list[Pair], GraphicalModel]:
        """AIM's select–measure loop (McKenna, Mullins, Sheldon & Miklau, "AIM: an adaptive and
        iterative mechanism for differentially private synthetic data", VLDB 2022) with a fixed
        schedule: each round picks the pair whose model marginal is furthest from the truth, less
        the error its measurement would carry (√(2/π)·σ per cell), among the pairs that keep the
        model within a size that grows with the rounds; measures it; refits the graphical model
        (:class:`~dpkit.synth.graphical.GraphicalModel`) from all measurements so far."""
        plan = self._plan
        sigma = plan.sigma_two
        found = list(found)
        model = GraphicalModel(JunctionTree.build(sizes, [c for c, _, _ in found]), rows)
        model.fit(found, _ROUND_ITERATIONS)
        chosen: list[tuple[int, int]] = []
        expected = {p: _NOISE_PENALTY * math.sqrt(2 / math.pi) * sigma * true[p].size for p in pairs}
        for t in range(plan.rounds):
            checkpoint()  # a fit the curator service cancelled stops here (dpkit._cancel)
            limit = MAX_MODEL_CELLS * (t + 1) / plan.rounds
            measured = [c for c, _, _ in found]
            fits = [p for p in pairs if p in measured or tree_size(sizes, [*measured, p]) <= limit]
            if not fits:
                fits = [p for p in pairs if p in measured] or pairs
            scores = []
            mu = model.marginals()
            inside = {c for clique in model.tree.cliques for c in combinations(clique, 2)}
            for p in fits:
                if p in inside:
                    estimate = model.project(mu, p)
                else:  # the model's marginal on a pair no clique holds: on a tree that adds it
                    wide = model.extended([*measured, p])
                    estimate = wide.project(wide.marginals(), p)
                scores.append(float(np.abs(true[p] - estimate).sum()) - expected[p])
            pick = fits[int(chooser.release(scores, rng=src))]
            found.append((pick, measure(pick, sigma), sigma))
            chosen.append(pick)
            model = model.rebuilt([c for c, _, _ in found])
            model.fit(found, _ROUND_ITERATIONS)
        model.fit(found, _FINAL_ITERATIONS)
        return chosen, model

    # -- sample ------------------------------------------------------------------------------------

    def sample(self, n: int | None = None, *, rng: np.random.Generator | None = None) -> pd.DataFrame:
        """``n`` synthetic rows (default: the estimated number of rows) as a DataFrame with the
        synthesised columns: categories as declared (None for the missing cell), numeric values
        drawn uniformly inside their bin (NaN for the missing cell; a column declared never
        missing has no missing cell). Post-processing: free."""
        if self._model is None:
            raise InvalidParameterError("fit", "not yet called", "Synthesizer.fit(data) before sample()")
        rows = int(round(self._model.total)) if n is None else v.positive_int(n, "n", minimum=0)
        gen = rng if isinstance(rng, np.random.Generator) else _generator(self._rng)
        cells = self._model.sample(rows, gen)
        return pd.DataFrame({dec.column.name: dec.values(cells[:, k], gen) for k, dec in enumerate(self._decode)})


def _rho(sigma: float) -> float:
    return 1 / (2 * sigma * sigma)


def _generator(rng: RNG) -> np.random.Generator:
    """Sampling randomness: the fit's Generator if it was given one (reproducible), else fresh
    OS entropy (sampling is post-processing: it needs no secure source)."""
    return rng if isinstance(rng, np.random.Generator) else np.random.default_rng()
