"""The aggregates a private query can ask for (one spec per output column).

>>> Mean("age").alias, Quantile("age", 0.9).alias, Count().alias
('mean_age', 'q90_age', 'count')
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dpkit import _validate as v
from dpkit.errors import InvalidParameterError

__all__ = ["Aggregate", "Count", "CountUnits", "Sum", "Mean", "Variance", "Std", "Quantile"]


def _check_alias(alias: object) -> None:
    if alias is not None and (not isinstance(alias, str) or not alias):
        raise InvalidParameterError("alias", alias, "a non-empty string or None")


@dataclass(frozen=True)
class Count:
    """The number of rows (after contribution bounding)."""

    name: str | None = None
    kind = "count"

    def __post_init__(self) -> None:
        _check_alias(self.name)

    @property
    def alias(self) -> str:
        return self.name or "count"

    column = None


@dataclass(frozen=True)
class CountUnits:
    """The number of distinct privacy units (``COUNT(DISTINCT unit)``); sensitivity 1 per group."""

    name: str | None = None
    kind = "count_units"
    column = None

    def __post_init__(self) -> None:
        _check_alias(self.name)

    @property
    def alias(self) -> str:
        return self.name or "count_units"


@dataclass(frozen=True)
class _OnColumn:
    column: str
    name: str | None = field(default=None, kw_only=True)

    def __post_init__(self) -> None:
        if not isinstance(self.column, str) or not self.column:
            raise InvalidParameterError("column", self.column, "a column name")
        _check_alias(self.name)

    @property
    def alias(self) -> str:
        return self.name or f"{self.kind}_{self.column}"  # type: ignore[attr-defined]


@dataclass(frozen=True)
class Sum(_OnColumn):
    """The sum of values clipped to the column's declared bounds."""

    kind = "sum"


@dataclass(frozen=True)
class Mean(_OnColumn):
    """The mean of clipped values: (noisy centred sum) / (noisy count) + centre."""

    kind = "mean"


@dataclass(frozen=True)
class Variance(_OnColumn):
    """The (population) variance of clipped values, from noisy count, sum and sum of squares."""

    kind = "var"


@dataclass(frozen=True)
class Std(_OnColumn):
    """The square root of :class:`Variance`."""

    kind = "std"


@dataclass(frozen=True)
class Quantile(_OnColumn):
    """The q-quantile of clipped values (exponential mechanism)."""

    q: float = field(default=0.5)
    kind = "quantile"

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "q", v.probability(self.q, "q", low_open=False, high_open=False))

    @property
    def alias(self) -> str:
        if self.name:
            return self.name
        return f"median_{self.column}" if self.q == 0.5 else f"q{round(self.q * 100):02d}_{self.column}"


Aggregate = Count | CountUnits | Sum | Mean | Variance | Std | Quantile
