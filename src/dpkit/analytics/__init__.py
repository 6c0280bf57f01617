"""Private analytics over tables: sessions, queries, engines and SQL.

>>> import dpkit as dp
>>> from dpkit.analytics import Metadata, Numeric
>>> import pandas as pd, numpy as np
>>> df = pd.DataFrame({"user": [1, 1, 2, 3], "amount": [5.0, 7.0, 1.0, 3.0]})
>>> s = dp.Session(df, privacy_unit="user", budget=dp.Budget(epsilon=1.0),
...                metadata=Metadata(columns={"amount": Numeric(0, 10)}), rng=np.random.default_rng(1))
>>> r = s.sum("amount", epsilon=1.0)
>>> r.epsilon, r.aggregates[0].sensitivity
(1.0, 10.0)
"""

from dpkit.analytics.aggregates import Aggregate, Count, CountUnits, Mean, QuantileAgg, Std, Sum, Variance
from dpkit.analytics.check import DataCheck, check_data
from dpkit.analytics.limits import QueryLimits
from dpkit.analytics.metadata import Categorical, Metadata, Numeric
from dpkit.analytics.results import AggregateInfo, QueryCost, QueryResult
from dpkit.analytics.session import Query, Session
from dpkit.analytics.spec import QueryOptions, QuerySpec

__all__ = [
    "Session",
    "Query",
    "QueryCost",
    "QueryResult",
    "QueryLimits",
    "AggregateInfo",
    "Metadata",
    "Numeric",
    "Categorical",
    "Aggregate",
    "Count",
    "CountUnits",
    "Sum",
    "Mean",
    "Variance",
    "Std",
    "QuantileAgg",
    "QuerySpec",
    "QueryOptions",
    "check_data",
    "DataCheck",
]


def __getattr__(name: str) -> object:
    """Deprecated names, still importable (they warn): ``Quantile`` is now ``QuantileAgg``."""
    if name == "Quantile":
        from dpkit.analytics import aggregates

        return aggregates.__getattr__(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
