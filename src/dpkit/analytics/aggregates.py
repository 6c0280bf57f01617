"""The aggregates a private query can ask for (one spec per output column).

Each aggregate has one output ``name``: the one given, else a default built from its kind and
column (``mean_age``, ``median_age``, ``q90_age``, ``count``). Each also writes
``<name>_low`` and ``<name>_high`` (the ends of its confidence interval).

>>> Mean("age").name, QuantileAgg("age", 0.9).name, Count().name, Sum("x", name="total").name
('mean_age', 'q90_age', 'count', 'total')

``QuantileAgg`` is the aggregate; :class:`dpkit.Quantile` is the exponential mechanism it runs
per group (Smith 2011, "Privacy-preserving statistical estimation with optimal convergence
rates").
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dpkit import _validate as v
from dpkit.errors import InvalidParameterError

__all__ = ["Aggregate", "Count", "CountUnits", "Sum", "Mean", "Variance", "Std", "QuantileAgg"]


def _check_name(name: object) -> None:
    if name is not None and (not isinstance(name, str) or not name):
        raise InvalidParameterError("name", name, "a non-empty string or None")


class _Named:
    """The output name: the one given (``name=``), else the kind's default. ``named`` says
    whether it was given (a JSON spec writes it back only then)."""

    name: str | None
    named: bool

    def _resolve_name(self) -> None:
        _check_name(self.name)
        object.__setattr__(self, "named", self.name is not None)
        if self.name is None:
            object.__setattr__(self, "name", self._default_name())

    def _default_name(self) -> str:  # pragma: no cover - every aggregate overrides it
        raise NotImplementedError


@dataclass(frozen=True)
class Count(_Named):
    """The number of rows (after contribution bounding)."""

    name: str | None = None
    named: bool = field(default=False, init=False, repr=False, compare=False)
    kind = "count"
    column = None

    def __post_init__(self) -> None:
        self._resolve_name()

    def _default_name(self) -> str:
        return "count"


@dataclass(frozen=True)
class CountUnits(_Named):
    """The number of distinct privacy units (``COUNT(DISTINCT unit)``); sensitivity 1 per group."""

    name: str | None = None
    named: bool = field(default=False, init=False, repr=False, compare=False)
    kind = "count_units"
    column = None

    def __post_init__(self) -> None:
        self._resolve_name()

    def _default_name(self) -> str:
        return "count_units"


@dataclass(frozen=True)
class _OnColumn(_Named):
    column: str
    name: str | None = field(default=None, kw_only=True)
    named: bool = field(default=False, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.column, str) or not self.column:
            raise InvalidParameterError("column", self.column, "a column name")
        self._resolve_name()

    def _default_name(self) -> str:
        return f"{self.kind}_{self.column}"  # type: ignore[attr-defined]


@dataclass(frozen=True)
class Sum(_OnColumn):
    """The sum of values clipped to the column's declared bounds."""

    kind = "sum"


@dataclass(frozen=True)
class Mean(_OnColumn):
    """The mean of clipped values: (noisy centred sum) / (noisy count) + centre, clamped to the
    declared bounds. Its result's ``scale`` is the approximate standard deviation of the released
    mean's noise, in the mean's units; its interval combines the sum's and the count's intervals
    (see :class:`~dpkit.analytics.results.AggregateInfo`)."""

    kind = "mean"


@dataclass(frozen=True)
class Variance(_OnColumn):
    """The (population) variance of clipped values, from noisy count, sum and sum of squares
    (``scale``: the approximate standard deviation of the released variance's noise)."""

    kind = "var"


@dataclass(frozen=True)
class Std(_OnColumn):
    """The square root of :class:`Variance` (``scale``: the approximate standard deviation of the
    released value's noise)."""

    kind = "std"


@dataclass(frozen=True)
class QuantileAgg(_OnColumn):
    """The q-quantile of clipped values, per group, by the exponential mechanism
    (:class:`dpkit.Quantile`)."""

    q: float = field(default=0.5)
    kind = "quantile"

    def __post_init__(self) -> None:
        if not isinstance(self.column, str) or not self.column:
            raise InvalidParameterError("column", self.column, "a column name")
        _check_name(self.name)
        object.__setattr__(self, "q", v.probability(self.q, "q", low_open=False, high_open=False))
        self._resolve_name()

    def _default_name(self) -> str:
        return f"median_{self.column}" if self.q == 0.5 else f"q{round(self.q * 100):02d}_{self.column}"


Aggregate = Count | CountUnits | Sum | Mean | Variance | Std | QuantileAgg

#: Every aggregate class (for isinstance checks).
AGGREGATE_TYPES = (Count, CountUnits, Sum, Mean, Variance, Std, QuantileAgg)
