"""Marginal counts computed inside DuckDB, and their noisy release.

:class:`TableCounts` opens the data the way a query does (CSV by dpkit's fixed reading rules,
Parquet, a DataFrame or a DuckDB relation), binds the declared types — reading only the schema —
and, once the release has been paid for, writes each row's cells to a temporary table of small
integers from which every marginal is one ``GROUP BY``. With a privacy unit, each unit keeps one
row (chosen by a keyed hash), so that every marginal has ℓ2 sensitivity 1 under add/remove of a
person. Nothing here fails on a row's value: every cell expression is total.

:func:`noisy` adds exact discrete Gaussian noise (Canonne, Kamath & Steinke 2020) to integer
counts: ρ = 1/(2σ²) zCDP per marginal of sensitivity 1.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from dpkit.analytics.engines.base import ReadType, quote_identifier
from dpkit.analytics.engines.bins import Search, duckdb_stages
from dpkit.analytics.metadata import Metadata
from dpkit.errors import InvalidParameterError
from dpkit.noise.discrete import discrete_gaussian
from dpkit.noise.source import RNG
from dpkit.synth.domain import Domain

__all__ = ["TableCounts", "bind_declared", "noisy"]


class TableCounts:
    """The cells of ``source`` over ``domain``, counted in DuckDB.

    Construction reads the schema only: a declared column the source lacks is refused with
    InvalidParameterError naming it (before anything is paid). :meth:`prepare` (after paying)
    encodes the rows; :meth:`counts` returns a marginal's dense count array."""

    def __init__(self, source: Any, metadata: Metadata, domain: Domain, *, table: str | None = None) -> None:
        from dpkit.analytics.check import _engine

        self.domain = domain
        self._unit = metadata.privacy_unit
        engine, _, self._opened = _engine(source, table)
        try:
            bind_declared(engine, metadata, domain)
        except BaseException:
            self.close()
            raise
        self._engine = engine
        self._con = engine._con
        self._codes = quote_identifier(f"__dpkit_synth_{os.getpid()}_{id(self)}")
        self._prepared = False

    def prepare(self, salt: int) -> None:
        """Encode every row (one per privacy unit) into the temporary table of cells."""
        # A numeric column's bin comes from a binary search over its edges (engines.bins, run as
        # successive projections over the values read), then NULL goes to the missing cell.
        columns = self.domain.columns
        read: list[str] = []
        searches: list[Search] = []
        params: list[Any] = []
        for i, c in enumerate(columns):
            if c.categories is not None:
                read.append(f"{c.code_sql()} AS c{i}")
            else:
                read.append(f"{quote_identifier(c.name)} AS c{i}")
                searches.append(c.search(f"c{i}"))

        def add(value: Any) -> str:
            params.append(value)
            return f"${len(params)}"

        stages, last = duckdb_stages("__read", searches, add) if searches else ([], "__read")
        cells = ", ".join(
            f"{c.code_sql(f'c{i}') if c.categories is None else f'c{i}'}::SMALLINT AS c{i}"
            for i, c in enumerate(columns)
        )
        names = ", ".join(f"c{i}" for i in range(len(columns)))
        source = self._engine._from
        if self._unit is None:
            read_sql = f"SELECT {', '.join(read)} FROM {source}"
            tail = f"SELECT {cells} FROM {last}"
        else:
            u = quote_identifier(self._unit)
            read_sql = f"SELECT {u} AS __u, {', '.join(read)} FROM {source} WHERE {u} IS NOT NULL"
            # One row per unit, chosen by a keyed hash of its cells (ties among identical rows are
            # harmless: they have the same cells).
            tail = (
                f"SELECT {names} FROM (SELECT __u, {cells} FROM {last}) "
                f"QUALIFY row_number() OVER (PARTITION BY __u ORDER BY hash(__u, {names}, {int(salt)}::UBIGINT)) = 1"
            )
        body = f"WITH {', '.join([f'__read AS ({read_sql})', *stages])} {tail}"
        self._con.execute(f"CREATE OR REPLACE TEMP TABLE {self._codes} AS {body}", params)
        self._prepared = True

    def counts(self, clique: Sequence[int]) -> NDArray[np.int64]:
        """The exact counts of the marginal over the columns ``clique`` (indices into the
        domain), as a dense array of the domain's shape on those columns."""
        assert self._prepared
        shape = [self.domain.columns[i].size for i in clique]
        key = "0"
        for i, size in zip(clique, shape, strict=True):
            key = f"({key}) * {size} + c{i}"
        rows = self._con.execute(
            f"SELECT ({key})::BIGINT AS k, count(*) AS n FROM {self._codes} GROUP BY k"
        ).fetchnumpy()
        flat = np.zeros(int(np.prod(shape)), dtype=np.int64)
        flat[np.asarray(rows["k"], dtype=np.int64)] = np.asarray(rows["n"], dtype=np.int64)
        return flat.reshape(shape)

    def close(self) -> None:
        if getattr(self, "_prepared", False):
            with contextlib.suppress(Exception):  # the connection may already be gone
                self._con.execute(f"DROP TABLE IF EXISTS {self._codes}")
            self._prepared = False
        opened = getattr(self, "_opened", None)
        if opened is not None:
            opened.close()
            self._opened = None


def bind_declared(engine: Any, metadata: Metadata, domain: Domain) -> None:
    """Check that ``engine``'s table has every column of ``domain`` (and the privacy unit), from
    its schema alone, and bind their declared types: InvalidParameterError naming the first
    missing column, before anything is paid."""
    unit = metadata.privacy_unit
    schema = engine.schema()
    wanted = [*domain.names, *([unit] if unit is not None else [])]
    missing = [c for c in wanted if c not in schema]
    if missing:
        first = missing[0]
        raise InvalidParameterError(
            f"metadata.columns.{first}" if first != unit else "privacy_unit",
            first,
            "a column of the data",
            f"the declared column(s) {', '.join(map(repr, missing))} are not in the data "
            f"({len(schema) - len(set(wanted) - set(missing))} other column(s), not named here)",
        )
    types: dict[str, ReadType] = {name: metadata.read_type(name) for name in domain.names}
    if unit is not None and unit not in types:  # (a synthesised unit keeps its type)
        types[unit] = "unit"
    engine.bind(types, strip_strings=metadata.strip_strings)


def noisy(counts: NDArray[np.int64], sigma: float, rng: RNG) -> NDArray[np.int64]:
    """``counts`` plus i.i.d. discrete Gaussian noise of scale ``sigma`` in every cell."""
    return counts + discrete_gaussian(sigma, counts.size, rng=rng).reshape(counts.shape)
