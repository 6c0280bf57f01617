"""Differentially private synthetic tables: select, measure, generate.

:class:`Synthesizer` releases a whole table once. It measures noisy marginals of the data — every
one-way marginal, then the two-way marginals of a spanning tree of the columns chosen with the
exponential mechanism — fits a model that agrees with them, and samples rows from the model.
Everything done with those rows afterwards is post-processing: it costs no more budget.

The algorithm is MST (McKenna, Miklau & Sheldon, "Winning the NIST Contest: A scalable and general
approach to differentially private synthetic data", JPC 2021), with dpkit's guarantees:

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

Budget split (as MST): a third of ρ for the one-way marginals, a third for the d − 1 selections,
a third for the d − 1 two-way marginals. One-way cells whose noisy count is below 3σ are merged
into one cell per column before selection (they are too noisy to model apart; rows sampled into
the merged cell get one of its categories uniformly).

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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
from numpy.typing import NDArray

from dpkit import _validate as v
from dpkit._progress import ProgressBar, check_progress, shows_bar
from dpkit._validate import short_repr
from dpkit.accounting.events import ComposedEvent, DPEvent, ExponentialEvent, GaussianEvent, SelfComposedEvent
from dpkit.accounting.zcdp import zcdp_to_approx_dp
from dpkit.analytics.metadata import Metadata
from dpkit.budget import Budget
from dpkit.errors import BudgetExceededError, DPError, InvalidParameterError
from dpkit.mechanisms.selection import Exponential
from dpkit.noise.source import RNG, resolve_rng
from dpkit.synth.domain import Domain
from dpkit.synth.measure import TableCounts, noisy
from dpkit.synth.model import TreeModel

__all__ = ["Synthesizer", "SynthReport", "Measurement", "rho_for"]

#: The most cells a two-way marginal may have: its noisy table is held in memory, and its
#: candidates' true counts too.
MAX_PAIR_CELLS = 4_000_000
#: Below this ρ the one-way noise alone exceeds any table worth publishing (σ > 10⁴ per cell
#: for one column); refused as "ε too small" before anything is paid.
MIN_RHO = 1e-9


@dataclass(frozen=True)
class Measurement:
    """One noisy marginal: its ``columns``, the noise ``sigma`` per cell (discrete Gaussian),
    its number of ``cells`` and its ρ. ``how``: ``"one-way"`` or ``"selected"``."""

    columns: tuple[str, ...]
    sigma: float
    cells: int
    rho: float
    how: str

    @property
    def error(self) -> float:
        """The half-width of a 95 % interval on one cell's count (1.96 σ)."""
        return 1.96 * self.sigma


@dataclass(frozen=True)
class SynthReport:
    """What a fit measured and spent: the ``measurements``, the estimated number of rows, the
    selected ``tree`` (column pairs), the cells merged per column, and the ``event`` paid."""

    measurements: tuple[Measurement, ...]
    rows: float
    tree: tuple[tuple[str, str], ...]
    merged: dict[str, int]
    event: DPEvent
    epsilon: float
    delta: float
    rho: float
    selection_epsilon: float = 0.0
    notes: tuple[str, ...] = field(default=())

    def to_text(self) -> str:
        """The report in words (for the curator's terminal)."""
        lines = [
            f"spent ε={self.epsilon:g}, δ={self.delta:g} (ρ={self.rho:.4g} zCDP), once, for the whole table",
            f"estimated rows: {self.rows:,.0f} (measured, with noise)",
            f"tree of {len(self.tree)} column pairs chosen by the exponential mechanism (ε={self.selection_epsilon:.3g} each):",
        ]
        lines += [f"  {a} — {b}" for a, b in self.tree]
        lines.append("measurements (discrete Gaussian noise; ± is a 95 % interval on each cell's count):")
        for m in self.measurements:
            lines.append(f"  {' × '.join(m.columns):40s} {m.cells:7d} cells  σ={m.sigma:8.2f}  ±{m.error:.1f} per cell")
        if any(self.merged.values()):
            merged = ", ".join(f"{c} ({k})" for c, k in self.merged.items() if k)
            lines.append(f"rare cells merged (noisy count below 3σ): {merged}")
        lines += list(self.notes)
        return "\n".join(lines)


def rho_for(epsilon: float, delta: float) -> float:
    """The largest ρ whose (ε, δ) conversion is at most ``epsilon`` at ``delta`` (bisection on
    :func:`~dpkit.accounting.zcdp.zcdp_to_approx_dp`), slightly reduced so rounding never
    overspends."""
    lo, hi = 0.0, max(epsilon, 1.0)
    while zcdp_to_approx_dp(hi, delta) <= epsilon:
        hi *= 2
    for _ in range(200):
        mid = (lo + hi) / 2
        if zcdp_to_approx_dp(mid, delta) <= epsilon:
            lo = mid
        else:
            hi = mid
    return lo * (1 - 1e-9)


@dataclass(frozen=True)
class _Plan:
    domain: Domain
    rho: float
    sigma_one: float
    sigma_two: float
    selection_epsilon: float
    event: DPEvent


class Synthesizer:
    """A differentially private synthetic-data generator (MST: see the module docstring).

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
        budget: Budget | None = None,
        rng: RNG = None,
        progress: bool | None = None,
    ) -> None:
        v.positive(epsilon, "epsilon")
        if not isinstance(delta, (int, float)) or isinstance(delta, bool) or not 0 < delta < 1:
            raise InvalidParameterError(
                "delta", short_repr(delta), "a number in (0, 1): the Gaussian mechanism needs δ > 0"
            )
        from dpkit.analytics.session import Session

        self.metadata = Session._check_metadata(metadata)
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
        self._rng = rng
        self._budget = budget
        self._plan = self._make_plan(Domain.from_metadata(self.metadata, bins=bins, columns=columns))
        self.report: SynthReport | None = None
        self.event_: DPEvent | None = None
        self._model: TreeModel | None = None
        self._decode: list[_Decoder] = []

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
        rho = rho_for(self.epsilon, self.delta)
        if rho < MIN_RHO:
            raise InvalidParameterError(
                "epsilon", self.epsilon, f"an ε large enough at δ={self.delta:g} for a table (ρ >= {MIN_RHO:g} zCDP)",
                "with so little budget every count would be buried in noise",
            )  # fmt: skip
        third = rho / 3
        sigma_one = math.sqrt(d / (2 * third))
        sigma_two = math.sqrt((d - 1) / (2 * third))
        selection_epsilon = math.sqrt(8 * third / (d - 1))
        event = ComposedEvent(
            (
                SelfComposedEvent(GaussianEvent(sigma_one), d),
                SelfComposedEvent(ExponentialEvent(selection_epsilon), d - 1),
                SelfComposedEvent(GaussianEvent(sigma_two), d - 1),
            )
        )
        return _Plan(domain, rho, sigma_one, sigma_two, selection_epsilon, event)

    @property
    def event(self) -> DPEvent:
        """The event :meth:`fit` spends (known before any data is read)."""
        return self._plan.event

    # -- fit ---------------------------------------------------------------------------------------

    def fit(self, data: Any, *, table: str | None = None) -> Synthesizer:
        """Measure ``data`` and fit the model: a pandas DataFrame, a CSV or Parquet path (a Parquet
        directory or glob too), a DuckDB relation, or a (DuckDB connection, table) pair.

        Order: the data's schema is checked against the metadata (a missing column is refused,
        nothing paid); the budget pays the whole :attr:`event`; then the marginals are computed
        in DuckDB and noised. A fit spends once; fitting again spends again."""
        plan = self._plan
        counts = TableCounts(data, self.metadata, plan.domain, table=table)
        try:
            budget = (
                self._budget
                if self._budget is not None
                else Budget(epsilon=self.epsilon, delta=self.delta, accountant="zcdp")
            )
            try:
                budget.spend(plan.event)
            except BudgetExceededError:
                raise
            except DPError as exc:
                raise InvalidParameterError(
                    "budget", short_repr(budget), "a Budget whose accountant prices Gaussian and exponential-mechanism events",
                    "e.g. dp.Budget(epsilon=..., delta=..., accountant='zcdp')",
                ) from exc  # fmt: skip
            # Paid: from here on nothing may fail on the data.
            src = resolve_rng(self._rng)
            total = 2 * len(plan.domain.columns) - 1
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

    def _measure(self, counts: TableCounts, src: Any, advance: Any) -> None:
        plan = self._plan
        domain = plan.domain
        d = len(domain.columns)
        names = domain.names
        measurements: list[Measurement] = []
        # 1. Every one-way marginal.
        ones = []
        for i, column in enumerate(domain.columns):
            ones.append(noisy(counts.counts((i,)), plan.sigma_one, src).astype(float))
            measurements.append(
                Measurement((column.name,), plan.sigma_one, column.size, 1 / (2 * plan.sigma_one**2), "one-way")
            )
            advance()
        # 2. Merge the cells too rare to model apart.
        merges = [_merge(y, 3 * plan.sigma_one) for y in ones]
        sizes = [int(m.max()) + 1 for m in merges]
        one_way = [
            np.bincount(m, weights=y, minlength=k).astype(float) for m, y, k in zip(merges, ones, sizes, strict=True)
        ]
        one_var = [
            np.bincount(m, minlength=k).astype(float) * plan.sigma_one**2 for m, k in zip(merges, sizes, strict=True)
        ]
        rows = max(float(np.median([y.sum() for y in ones])), 1.0)
        independent = [np.maximum(y, 0) / max(np.maximum(y, 0).sum(), 1e-12) for y in one_way]
        # 3. A spanning tree, pair by pair (Kruskal with the exponential mechanism): the score of a
        # pair is the L1 distance between its true counts and the independent model's.
        pairs = [(i, j) for i in range(d) for j in range(i + 1, d)]
        true = {p: _compress(counts.counts(p), merges[p[0]], merges[p[1]], sizes[p[0]], sizes[p[1]]) for p in pairs}
        score = {p: float(np.abs(true[p] - rows * np.outer(independent[p[0]], independent[p[1]])).sum()) for p in pairs}
        component = list(range(d))

        def find(x: int) -> int:
            while component[x] != x:
                component[x] = component[component[x]]
                x = component[x]
            return x

        chooser = Exponential(epsilon=plan.selection_epsilon, sensitivity=1.0)
        chosen: list[tuple[int, int]] = []
        for _ in range(d - 1):
            candidates = [p for p in pairs if find(p[0]) != find(p[1])]
            pick = candidates[int(chooser.release([score[p] for p in candidates], rng=src))]
            component[find(pick[0])] = find(pick[1])
            chosen.append(pick)
        # 4. Measure the tree's pairs.
        two_way: dict[tuple[int, int], NDArray[np.float64]] = {}
        for i, j in chosen:
            raw = noisy(counts.counts((i, j)), plan.sigma_two, src)
            # Merged cells sum their noisy counts (the variance of a merged cell is ignored in the
            # fit: cells merged are rare by construction).
            two_way[(i, j)] = _compress(raw, merges[i], merges[j], sizes[i], sizes[j]).astype(float)
            cells = domain.columns[i].size * domain.columns[j].size
            measurements.append(
                Measurement((names[i], names[j]), plan.sigma_two, cells, 1 / (2 * plan.sigma_two**2), "selected")
            )
            advance()
        self._model = TreeModel.fit(sizes, one_way, one_var, two_way, plan.sigma_two**2)
        self._decode = [_Decoder(column, m) for column, m in zip(domain.columns, merges, strict=True)]
        self.report = SynthReport(
            measurements=tuple(measurements),
            rows=self._model.rows,
            tree=tuple((names[i], names[j]) for i, j in chosen),
            merged={c.name: int(c.size - k) for c, k in zip(domain.columns, sizes, strict=True)},
            event=plan.event,
            epsilon=self.epsilon,
            delta=self.delta,
            rho=plan.rho,
            selection_epsilon=plan.selection_epsilon,
        )

    # -- sample ------------------------------------------------------------------------------------

    def sample(self, n: int | None = None, *, rng: np.random.Generator | None = None) -> pd.DataFrame:
        """``n`` synthetic rows (default: the estimated number of rows) as a DataFrame with the
        synthesised columns: categories as declared (None for the missing cell), numeric values
        drawn uniformly inside their bin (NaN for the missing cell). Post-processing: free."""
        if self._model is None:
            raise InvalidParameterError("fit", "not yet called", "Synthesizer.fit(data) before sample()")
        rows = int(round(self._model.rows)) if n is None else v.positive_int(n, "n", minimum=0)
        gen = rng if isinstance(rng, np.random.Generator) else _generator(self._rng)
        cells = self._model.sample(rows, gen)
        return pd.DataFrame({dec.column.name: dec.values(cells[:, k], gen) for k, dec in enumerate(self._decode)})


def _generator(rng: RNG) -> np.random.Generator:
    """Sampling randomness: the fit's Generator if it was given one (reproducible), else fresh
    OS entropy (sampling is post-processing: it needs no secure source)."""
    return rng if isinstance(rng, np.random.Generator) else np.random.default_rng()


def _merge(y: NDArray[np.float64], threshold: float) -> NDArray[np.int64]:
    """The new cell of each old cell: cells whose noisy count reaches ``threshold`` keep a cell of
    their own, the others share one (none merged when fewer than two fall short)."""
    keep = y >= threshold
    if keep.all() or (~keep).sum() < 2:
        return np.arange(y.size)
    new = np.cumsum(keep) - 1
    new[~keep] = int(keep.sum())
    return new.astype(np.int64)


def _compress(
    table: NDArray[Any], rows: NDArray[np.int64], cols: NDArray[np.int64], nr: int, nc: int
) -> NDArray[np.float64]:
    out = np.zeros((nr, nc))
    np.add.at(out, (rows[:, None], cols[None, :]), table)
    return out


@dataclass
class _Decoder:
    """Cells back to values: merged cells spread uniformly over their members, numeric bins to a
    uniform value inside the bin."""

    column: Any
    merge: NDArray[np.int64]

    def values(self, cells: NDArray[np.int64], rng: np.random.Generator) -> Any:
        col = self.column
        original = self._expand(cells, rng)
        missing = original == col.missing
        if col.categories is not None:
            labels = np.array([*col.categories, None], dtype=object)
            return labels[original]
        e = np.asarray(col.edges, dtype=float)
        k = np.minimum(original, e.size - 2)
        out = e[k] + rng.random(cells.size) * (e[k + 1] - e[k])
        out[missing] = np.nan
        return out

    def _expand(self, cells: NDArray[np.int64], rng: np.random.Generator) -> NDArray[np.int64]:
        members = [np.flatnonzero(self.merge == c) for c in range(int(self.merge.max()) + 1)]
        out = np.empty_like(cells)
        for c, m in enumerate(members):  # per merged cell, not per row
            where = np.flatnonzero(cells == c)
            out[where] = m[rng.integers(0, m.size, where.size)] if m.size > 1 else m[0]
        return out
