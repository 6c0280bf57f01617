"""Shared edges and values for the bin-search tests (not a test module): the doubles at which a
bin search can go wrong, and the table that carries them with NaN and NULL kept apart."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

#: Edges that make the comparisons hard: zero (−0.0 must fall in the bin starting at 0.0), the
#: smallest subnormal, values with no exact decimal form, and a large one.
HARD_EDGES = (0.0, 5e-324, 0.1, 1 / 3, -2.5, 1e15)


def edges(n: int) -> np.ndarray:
    """n + 1 increasing finite edges, 0.0 among them, the others drawn (seeded by n) from the
    hard ones and a wide uniform range."""
    rng = np.random.default_rng(n)
    pool = np.setdiff1d(np.concatenate([HARD_EDGES, rng.uniform(-1e6, 1e6, 2 * n + 10)]), [0.0])
    return np.unique(np.r_[0.0, rng.choice(pool, n, replace=False)])


def values(e: np.ndarray) -> np.ndarray:
    """Every edge, the doubles just below and just above each, values outside every bin, both
    zeros, the largest finite doubles, infinities, NaN, and 1,000 values inside."""
    rng = np.random.default_rng(len(e))
    return np.concatenate(
        [
            e,
            np.nextafter(e, -np.inf),
            np.nextafter(e, np.inf),
            [-0.0, 0.0, e[0] - 1.0, e[-1] + 1.0, -1e308, 1e308, -np.inf, np.inf, np.nan],
            rng.uniform(e[0], e[-1], 1000),
        ]
    )


def table(x: np.ndarray, nulls: int = 3, **more: list[object]) -> pa.Table:
    """The values as a DOUBLE column ``x`` — NaN kept as NaN, not NULL — and ``nulls`` NULLs,
    beside the columns ``more`` (each as long as the result)."""
    return pa.table({"x": pa.array([*x.tolist(), *[None] * nulls], pa.float64()), **more})
