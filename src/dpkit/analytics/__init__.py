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

from __future__ import annotations

from typing import TYPE_CHECKING

from dpkit._lazy import lazy_exports

# Public name -> the module that defines it, imported on first use (PEP 562): a submodule such as
# dpkit.analytics.limits (whose defaults `dpkit serve --help` shows) loads without the session,
# pandas and sqlglot.
_EXPORTS: dict[str, str] = {
    "Aggregate": "dpkit.analytics.aggregates",
    "Count": "dpkit.analytics.aggregates",
    "CountUnits": "dpkit.analytics.aggregates",
    "Mean": "dpkit.analytics.aggregates",
    "QuantileAgg": "dpkit.analytics.aggregates",
    "Std": "dpkit.analytics.aggregates",
    "Sum": "dpkit.analytics.aggregates",
    "Variance": "dpkit.analytics.aggregates",
    "DataCheck": "dpkit.analytics.check_report",
    "check_data": "dpkit.analytics.check",
    "DatasetCheck": "dpkit.analytics.check_tables",
    "check_dataset": "dpkit.analytics.check_tables",
    "QueryLimits": "dpkit.analytics.limits",
    "Categorical": "dpkit.analytics.metadata",
    "Metadata": "dpkit.analytics.metadata",
    "Numeric": "dpkit.analytics.metadata",
    "DatasetMetadata": "dpkit.analytics.dataset_metadata",
    "Bounding": "dpkit.analytics.bounding",
    "BoundingEstimate": "dpkit.analytics.bounding",
    "NoisyCount": "dpkit.analytics.bounding",
    "AggregateInfo": "dpkit.analytics.results",
    "QueryCost": "dpkit.analytics.results",
    "QueryResult": "dpkit.analytics.results",
    "Query": "dpkit.analytics.query",
    "Session": "dpkit.analytics.session",
    "QueryOptions": "dpkit.analytics.spec",
    "QuerySpec": "dpkit.analytics.spec",
    "Join": "dpkit.analytics.spec",
}

__all__ = [
    "Session",
    "Query",
    "QueryCost",
    "QueryResult",
    "QueryLimits",
    "AggregateInfo",
    "Bounding",
    "BoundingEstimate",
    "NoisyCount",
    "Metadata",
    "Numeric",
    "Categorical",
    "DatasetMetadata",
    "Join",
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
    "check_dataset",
    "DatasetCheck",
]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, __all__)


if TYPE_CHECKING:  # static checkers see the eager imports; the runtime does not run them
    from dpkit.analytics.aggregates import Aggregate, Count, CountUnits, Mean, QuantileAgg, Std, Sum, Variance
    from dpkit.analytics.bounding import Bounding, BoundingEstimate, NoisyCount
    from dpkit.analytics.check import check_data
    from dpkit.analytics.check_report import DataCheck
    from dpkit.analytics.check_tables import DatasetCheck, check_dataset
    from dpkit.analytics.dataset_metadata import DatasetMetadata
    from dpkit.analytics.limits import QueryLimits
    from dpkit.analytics.metadata import Categorical, Metadata, Numeric
    from dpkit.analytics.query import Query
    from dpkit.analytics.results import AggregateInfo, QueryCost, QueryResult
    from dpkit.analytics.session import Session
    from dpkit.analytics.spec import Join, QueryOptions, QuerySpec
