"""How close a synthetic table is to the real one: marginal distances and train-on-synthetic accuracy.

These helpers read the *real* data and release nothing: they are for the curator and for
benchmarks, to judge a synthesizer before its rows are published, never a way to publish a score.

* :func:`marginal_tvd` — the average total variation distance between the real and the synthetic
  ``way``-way marginals (½ · L1 between the normalised counts; 0 for identical distributions, 1
  for disjoint ones).
* :func:`tstr_accuracy` — train on synthetic, test on real: the accuracy on the real rows of a
  logistic regression fitted to the synthetic rows (needs scikit-learn, ``pip install 'dpkit[ml]'``).

Both encode every column once into integer cells shared by the two tables: the distinct values of
both tables (missing values — None, NaN — one cell of their own), or, for a column given bin
edges, its bin (values below the first edge fall in the first bin, values above the last edge in
the last, as :class:`~dpkit.synth.Synthesizer` clips them; missing values and non-numbers one cell
more).

>>> import pandas as pd
>>> real = pd.DataFrame({"sex": ["F", "F", "M", "M"], "age": [20, 30, 40, 50]})
>>> synthetic = pd.DataFrame({"sex": ["F", "M", "M", "M"], "age": [25, 35, 45, 55]})
>>> marginal_tvd(real, synthetic, way=1, bins={"age": [0, 40, 100]})  # sex: 0.25, age: 0
0.125
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from itertools import combinations
from typing import Any

import numpy as np
import pandas as pd
from numpy.typing import NDArray

from dpkit._validate import short_repr
from dpkit.errors import InvalidParameterError

__all__ = ["marginal_tvd", "tstr_accuracy"]

#: A marginal of at most this many cells is counted into a dense array; a larger one is first
#: compacted to the cells that occur (its rows' distinct joint codes).
_DENSE_CELLS = 1 << 22


def marginal_tvd(
    real: pd.DataFrame,
    synthetic: pd.DataFrame,
    *,
    way: int = 2,
    columns: Sequence[str] | None = None,
    bins: Mapping[str, Sequence[float]] | None = None,
    max_marginals: int | None = None,
    rng: np.random.Generator | int | None = None,
) -> float:
    """The average total variation distance between the ``way``-way marginals of two tables.

    For each set of ``way`` columns, the distance is ½ · Σ |p − q| over the cells, with ``p`` and
    ``q`` the real and synthetic counts divided by each table's number of rows; the result is the
    mean over the column sets. 0: the same marginals; 1: no cell in common.

    Parameters
    ----------
    real, synthetic:
        pandas DataFrames with at least one row each (their row counts may differ).
    way:
        The number of columns per marginal, from 1 to the number of ``columns``.
    columns:
        The columns to compare (default: those of ``real`` that ``synthetic`` also has, in
        ``real``'s order).
    bins:
        Per numeric column, increasing bin edges: values below the first edge count in the first
        bin, values above the last in the last; missing values and non-numbers in a cell of their
        own. Columns without edges compare their exact values.
    max_marginals:
        Average over this many column sets drawn without replacement with ``rng`` (all of them
        when None or when there are no more).
    rng:
        The sampling of the column sets: a numpy Generator or an integer seed (reproducible), or
        None (fresh entropy). Not privacy noise: this function releases nothing.

    >>> import pandas as pd
    >>> a = pd.DataFrame({"x": ["u", "u", "v", "v"], "y": [0, 1, 0, 1]})
    >>> marginal_tvd(a, a)
    0.0
    >>> marginal_tvd(a, pd.DataFrame({"x": ["u", "v"], "y": [0, 0]}), way=2)
    0.5
    """
    _check_frame(real, "real")
    _check_frame(synthetic, "synthetic")
    names = _columns(real, synthetic, columns)
    if not isinstance(way, (int, np.integer)) or isinstance(way, bool) or not 1 <= way <= len(names):
        raise InvalidParameterError(
            "way", short_repr(way), f"an integer from 1 to the number of columns compared ({len(names)})"
        )
    edges = _bins(real, synthetic, bins)
    sets = list(combinations(range(len(names)), int(way)))
    if max_marginals is not None:
        if not isinstance(max_marginals, (int, np.integer)) or isinstance(max_marginals, bool) or max_marginals < 1:
            raise InvalidParameterError("max_marginals", short_repr(max_marginals), "None, or an integer >= 1")
        if max_marginals < len(sets):
            gen = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
            chosen = np.sort(gen.choice(len(sets), size=int(max_marginals), replace=False))
            sets = [sets[i] for i in chosen]
    n_real = len(real)
    codes = [_encode(real[c], synthetic[c], edges.get(c)) for c in names]
    total = 0.0
    for group in sets:
        joint, cells = _joint([codes[i] for i in group])
        p = np.bincount(joint[:n_real], minlength=cells) / n_real
        q = np.bincount(joint[n_real:], minlength=cells) / (joint.size - n_real)
        total += 0.5 * float(np.abs(p - q).sum())
    return total / len(sets)


def tstr_accuracy(
    synthetic: pd.DataFrame,
    real_test: pd.DataFrame,
    *,
    target: str,
    features: Sequence[str] | None = None,
    bins: Mapping[str, Sequence[float]] | None = None,
) -> float:
    """Train on synthetic, test on real: the accuracy on ``real_test`` of a logistic regression
    (scikit-learn, ``max_iter=1000``) fitted to ``synthetic`` to predict ``target``.

    Every feature is one-hot encoded over the values of both tables (so the two design matrices
    have the same columns), a numeric feature with ``bins`` over its bins (as in
    :func:`marginal_tvd`). The labels are the values of ``target`` (a missing value is a label of
    its own). A synthetic table whose rows all carry one label predicts that label.

    ``features``: the columns to learn from (default: those of ``synthetic`` that ``real_test``
    also has, except ``target``). Needs scikit-learn (``pip install 'dpkit[ml]'``).

    >>> import pandas as pd
    >>> train = pd.DataFrame({"colour": ["red", "blue"] * 50, "label": ["stop", "go"] * 50})
    >>> test = pd.DataFrame({"colour": ["red", "blue", "red"], "label": ["stop", "go", "go"]})
    >>> round(tstr_accuracy(train, test, target="label"), 3)
    0.667
    """
    try:
        from scipy import sparse
        from sklearn.linear_model import LogisticRegression
    except ImportError as exc:  # pragma: no cover - exercised only without the ml extra
        raise ImportError(
            f"tstr_accuracy needs scikit-learn, which is not installed ({exc}): pip install 'dpkit[ml]'"
        ) from exc

    _check_frame(synthetic, "synthetic")
    _check_frame(real_test, "real_test")
    common = [c for c in synthetic.columns if c in set(real_test.columns)]
    if not isinstance(target, str) or target not in common:
        raise InvalidParameterError("target", short_repr(target), f"a column of both tables: {_listing(common)}")
    if features is None:
        names = [c for c in common if c != target]
    else:
        names = _columns(synthetic, real_test, features, parameter="features")
        if target in names:
            raise InvalidParameterError(
                "features", short_repr(list(names)), f"columns other than the target {target!r}"
            )
    if not names:
        raise InvalidParameterError(
            "features", short_repr(features), "at least one column of both tables besides the target"
        )
    edges = _bins(synthetic, real_test, bins)
    n_train = len(synthetic)
    blocks = []
    for name in names:
        codes, cells = _encode(synthetic[name], real_test[name], edges.get(name))
        rows = np.arange(codes.size)
        blocks.append(sparse.csr_matrix((np.ones(codes.size), (rows, codes)), shape=(codes.size, cells)))
    x = sparse.hstack(blocks, format="csr")
    labels, _ = _encode(synthetic[target], real_test[target], None)
    y_train, y_test = labels[:n_train], labels[n_train:]
    if np.unique(y_train).size == 1:
        return float(np.mean(y_test == y_train[0]))
    model = LogisticRegression(max_iter=1000)
    model.fit(x[:n_train], y_train)
    return float(np.mean(model.predict(x[n_train:]) == y_test))


# -- helpers --------------------------------------------------------------------------------------


def _check_frame(frame: Any, parameter: str) -> None:
    if not isinstance(frame, pd.DataFrame):
        raise InvalidParameterError(parameter, short_repr(frame), "a pandas DataFrame")
    if len(frame) == 0:
        raise InvalidParameterError(parameter, "an empty table", "a table with at least one row")


def _listing(names: Iterable[Any]) -> str:
    names = list(names)
    return ", ".join(map(repr, names)) if names else "(none: the tables share no column)"


def _columns(
    a: pd.DataFrame, b: pd.DataFrame, columns: Sequence[str] | None, *, parameter: str = "columns"
) -> list[str]:
    common = [c for c in a.columns if c in set(b.columns)]
    if columns is None:
        if not common:
            raise InvalidParameterError(parameter, None, "columns of both tables, but the tables share none")
        return common
    if isinstance(columns, str) or not isinstance(columns, Sequence):
        raise InvalidParameterError(parameter, short_repr(columns), "a list of column names")
    names = list(columns)
    for name in names:
        if name not in common:
            raise InvalidParameterError(parameter, short_repr(name), f"a column of both tables: {_listing(common)}")
    if len(set(names)) != len(names):
        raise InvalidParameterError(parameter, short_repr(names), "distinct column names")
    if not names:
        raise InvalidParameterError(parameter, "[]", "at least one column of both tables")
    return names


def _bins(
    a: pd.DataFrame, b: pd.DataFrame, bins: Mapping[str, Sequence[float]] | None
) -> dict[str, NDArray[np.float64]]:
    if bins is None:
        return {}
    if not isinstance(bins, Mapping):
        raise InvalidParameterError("bins", short_repr(bins), "a mapping of column name to increasing bin edges")
    out = {}
    for name, given in bins.items():
        if name not in a.columns or name not in b.columns:
            raise InvalidParameterError(f"bins.{name}", short_repr(given), "edges only for columns of both tables")
        try:
            e = np.asarray([float(x) for x in given], dtype=np.float64)
        except (TypeError, ValueError):
            e = np.empty(0)
        if e.size < 2 or not np.all(np.isfinite(e)) or np.any(np.diff(e) <= 0):
            raise InvalidParameterError(f"bins.{name}", short_repr(given), "at least two increasing finite edges")
        out[name] = e
    return out


def _encode(a: pd.Series, b: pd.Series, edges: NDArray[np.float64] | None) -> tuple[NDArray[np.int64], int]:
    """One integer cell per row of ``a`` then ``b`` (concatenated), and the number of cells."""
    both = pd.concat([a, b], ignore_index=True)
    if edges is None:
        codes, uniques = pd.factorize(both, use_na_sentinel=False)
        return codes.astype(np.int64, copy=False), max(len(uniques), 1)
    x = pd.to_numeric(both, errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
    k = edges.size - 1  # bins; cell k holds the missing values
    codes = np.searchsorted(edges[1:-1], x, side="right").astype(np.int64)
    codes[np.isnan(x)] = k
    return codes, k + 1


def _joint(columns: list[tuple[NDArray[np.int64], int]]) -> tuple[NDArray[np.int64], int]:
    """The mixed-radix cell of each row over several encoded columns, and the number of cells
    (compacted to the cells that occur whenever a dense count would be too large)."""
    index, cells = columns[0]
    for codes, k in columns[1:]:
        if cells * k > _DENSE_CELLS:
            uniques, index = np.unique(index, return_inverse=True)
            cells = uniques.size
        index = index * k + codes
        cells *= k
    if cells > _DENSE_CELLS:
        uniques, index = np.unique(index, return_inverse=True)
        cells = uniques.size
    return index, cells
