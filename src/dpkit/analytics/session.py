"""Private analytics over a table: :class:`Session` and its query builder :class:`Query`.

A session holds the table (through an engine), the privacy unit, the neighbour relation, the
budget (an in-memory :class:`dpkit.Budget` or a ledger entry for (dataset, analyst)) and the
curator's declared schema (:class:`~dpkit.analytics.Metadata`). Every query runs the same steps
(pay before the data is touched):

1. validate the request against the *declared* schema and metadata only (no row is read),
   including the session's size limits (:class:`~dpkit.analytics.limits.QueryLimits`: public
   keys and result rows are counted as integers, never listed; the answer's size is bounded
   from the metadata);
2. price it: build every mechanism and the composed event (no data);
3. debit the budget atomically — a refusal never touches the data, so neither its content nor
   its timing depends on it;
4. run the engine (filter, contribution bounding, exact integer sums) and add the noise (and,
   without public keys, select the keys privately). Every step here is total: values that break
   a declared rule are NULL or clamped by rules written down in advance, the output's shape
   (columns, rows, public key set) does not depend on the data, and if anything still fails the
   debit stands and the analyst gets one :class:`~dpkit.errors.QueryFailedError` whose message
   names nothing (the details go to the ``dpkit.curator`` log);
5. return a :class:`~dpkit.analytics.results.QueryResult` with values, confidence intervals,
   noise scales, the cost, the privacy unit and the contribution bounds used.

What a session checks and opens when it is made (the unit, the budget, the engine, the declared
columns bound to the source) is :mod:`~dpkit.analytics.session_setup`. The steps of a query live
in their own modules: :mod:`~dpkit.analytics.spec` (the request as values),
:mod:`~dpkit.analytics.building` (step 1), :mod:`~dpkit.analytics.pricing` (step 2) and
:mod:`~dpkit.analytics.execute` (steps 3 to 5); :class:`~dpkit.analytics.query.Query` is the
builder. The sensitivities and how ε is shared are written down in
:mod:`~dpkit.analytics.pricing`.

>>> import pandas as pd, numpy as np
>>> from dpkit.analytics import Session, Metadata, Numeric, Categorical
>>> from dpkit.budget import Budget
>>> df = pd.DataFrame({"age": [30, 40, 50, 60] * 50, "sex": ["F", "M"] * 100})
>>> meta = Metadata(columns={"age": Numeric(0, 100), "sex": Categorical(("F", "M"))}, row_level=True)
>>> s = Session(df, budget=Budget(epsilon=1.0), metadata=meta, rng=np.random.default_rng(0))
>>> r = s.group_by("sex").count(epsilon=0.5)
>>> r.value.round(-1).tolist(), r.epsilon
([100.0, 100.0], 0.5)
>>> s.remaining
0.5
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Concatenate, ParamSpec, TypeVar

from dpkit import _validate as v
from dpkit._validate import Neighbours, decimal_fraction
from dpkit._validate import short_repr as _short
from dpkit.accounting.composition import basic_cost
from dpkit.accounting.events import DPEvent
from dpkit.analytics.dataset_metadata import DatasetMetadata
from dpkit.analytics.declared import ColumnKind, DeclaredTable, check_bound
from dpkit.analytics.engines.base import Engine, default_table
from dpkit.analytics.execute import Payer
from dpkit.analytics.limits import QueryLimits
from dpkit.analytics.metadata import Metadata
from dpkit.analytics.plan import Predicate
from dpkit.analytics.query import _CONFIDENCE, _DELTA, _KEY_SELECTION, _NOISE, Query
from dpkit.analytics.results import QueryCost, QueryResult
from dpkit.analytics.session_setup import (
    bind_columns,
    check_budget,
    check_rng,
    check_unit,
    duckdb_only,
    load_metadata,
    make_engine,
)
from dpkit.analytics.session_tables import TableSet, check_tables_arguments, open_tables
from dpkit.analytics.spec import Noise
from dpkit.analytics.sql import compile_sql
from dpkit.budget import Budget
from dpkit.errors import DPError, InvalidParameterError
from dpkit.ledger.base import LedgerBackend
from dpkit.noise.source import RNG

__all__ = ["Session"]


_P = ParamSpec("_P")
_R = TypeVar("_R")


def _over_whole_table(method: Callable[Concatenate[Query, _P], _R]) -> Callable[Concatenate[Session, _P], _R]:
    """``Session.<name>``: :class:`Query`'s method of that name run on ``session.query()``."""

    @functools.wraps(method)
    def over_whole_table(self: Session, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        return method(self.query(), *args, **kwargs)

    over_whole_table.__qualname__ = f"Session.{method.__name__}"
    over_whole_table.__doc__ = f":meth:`Query.{method.__name__}` over the whole table.\n\n{method.__doc__ or ''}"
    return over_whole_table


class Session:
    """A private view of one table for one analyst.

    Parameters (keyword-only after ``data``)
    ----------------------------------------
    data:
        A pandas DataFrame, a CSV or Parquet path, a DuckDB relation, or a pyspark DataFrame — or,
        for a dataset of several tables, a dict from each table's name to its data, with a
        :class:`~dpkit.analytics.DatasetMetadata` (then ``query(table)`` names the table a query
        reads and :meth:`Query.join` joins others: :mod:`dpkit.analytics.joins`).
    privacy_unit, row_level:
        Who is protected — exactly one of them: ``privacy_unit`` names the column identifying
        the person (``"user_id"``); ``row_level=True`` says every row is a different person.
        Default: the metadata's. A session with neither is refused.
    budget, ledger:
        Exactly one: an in-memory :class:`dpkit.Budget`, or a ledger (a
        :class:`~dpkit.ledger.LedgerBackend` or the path of a SQLite ledger) with ``dataset``
        (default: ``table``) and ``analyst`` naming an existing budget.
    metadata:
        The curator's :class:`~dpkit.analytics.Metadata` (or its dict / JSON path): every column
        an analyst may use, with its type, bounds and public categories. Columns that are not
        declared cannot be used; nothing is ever inferred from the data.
    max_groups, max_rows:
        Contribution bounds per privacy unit (defaults: the metadata's, else 1). Only with a
        ``privacy_unit``.
    neighbours:
        ``"add_remove"`` (a unit's rows added or removed; default) or ``"replace"``.
    engine:
        ``"duckdb"`` (default for everything but Spark DataFrames), ``"spark"``, or an engine.
    table:
        The table's name in SQL (``FROM table``).
    portable:
        Compute row priorities with md5 so that DuckDB and Spark keep exactly the same rows
        (slower; for moving a seeded pipeline between engines).
    rng:
        Randomness for noise, key selection and row sampling. Default: the OS CSPRNG. A seeded
        ``numpy.random.Generator`` is for tests and teaching only: it is refused with a ledger
        (seeded noise can be replayed and subtracted, so the ledger's charge would be a lie), and
        results drawn with it say so.
    limits:
        How large one query may be (:class:`~dpkit.analytics.limits.QueryLimits`; default
        ``QueryLimits()``): public group keys, result rows, the answer's size and the nesting of
        SQL text. Checked on the request and the metadata before paying; a query over a limit
        raises :class:`~dpkit.errors.LimitExceededError` and spends nothing.
    memory_limit, temp_directory:
        For more data than memory on DuckDB: the most memory the session's DuckDB connection may
        use (a size with its unit: ``"4GB"``, ``"512MiB"``; at least 32 MiB per DuckDB thread) and
        the directory it spills to past that (created when needed; DuckDB's default is ``.tmp``
        in the working directory). DuckDB then spills the bounding's window sort and the group-by
        to disk. Only with a DuckDB engine the session opens itself (a DataFrame, a CSV or
        Parquet path); a bad value raises :class:`~dpkit.errors.InvalidParameterError` before
        anything is read.
    """

    def __init__(
        self,
        data: Any,
        *,
        privacy_unit: str | None = None,
        budget: Budget | None = None,
        ledger: LedgerBackend | str | os.PathLike[str] | None = None,
        dataset: str | None = None,
        analyst: str | None = None,
        metadata: Metadata | DatasetMetadata | dict[str, Any] | str | os.PathLike[str] | None = None,
        max_groups: int | None = None,
        max_rows: int | None = None,
        neighbours: Neighbours = "add_remove",
        engine: Any = None,
        table: str = "data",
        portable: bool = False,
        rng: RNG = None,
        row_level: bool | None = None,
        limits: QueryLimits | None = None,
        memory_limit: str | None = None,
        temp_directory: str | os.PathLike[str] | None = None,
    ) -> None:
        if limits is not None and not isinstance(limits, QueryLimits):
            raise InvalidParameterError(
                "limits", _short(limits), "a dpkit.analytics.QueryLimits or None (the defaults)"
            )
        self._limits = limits if limits is not None else QueryLimits()
        self._metadata = load_metadata(metadata)
        self._neighbours = v.neighbours(neighbours)
        if not isinstance(table, str) or not table:
            raise InvalidParameterError("table", table, "a non-empty table name")
        self._table = table
        if not isinstance(portable, bool):
            raise InvalidParameterError("portable", portable, "True or False")
        self._portable = portable
        self._tables: TableSet | None = None
        several = isinstance(self._metadata, DatasetMetadata) or isinstance(data, Mapping)
        if several:
            check_tables_arguments(self._metadata, privacy_unit, row_level, table, engine)
            self._unit = self._metadata.tables[self._metadata.private_tables[0]].privacy_unit
        else:
            self._unit = check_unit(self._metadata, privacy_unit, row_level)
        check_rng(rng, ledger)
        self._rng = rng
        self._budget, self._ledger, self._dataset, self._analyst = check_budget(budget, ledger, dataset, analyst, table)
        if not several:
            self._engine = make_engine(data, engine, memory_limit, temp_directory)
            self._schema = bind_columns(self._engine, self._metadata, self._unit)
        self._max_groups = self._check_bound("max_groups", max_groups, self._metadata.max_groups)
        self._max_rows = self._check_bound("max_rows", max_rows, self._metadata.max_rows)
        # What queries are checked and priced against: declared facts only, fixed from here on.
        if several:
            self._tables = open_tables(
                data,
                self._metadata,
                engine=engine,
                memory_limit=memory_limit,
                temp_directory=temp_directory,
                neighbours=self._neighbours,
                limits=self._limits,
                portable=self._portable,
                max_groups=self._max_groups,
                max_rows=self._max_rows,
            )
            self._table = self._tables.default or self._metadata.private_tables[0]
            self._engine = self._tables.engines[self._table]
            self._declared = self._tables.facts[self._table]
            self._schema = dict(self._declared.columns)
        else:
            self._declared = DeclaredTable(
                table=self._table,
                columns=self._schema,
                metadata=self._metadata,
                unit=self._unit,
                neighbours=self._neighbours,
                max_groups=self._max_groups,
                max_rows=self._max_rows,
                limits=self._limits,
                portable=self._portable,
            )
        self._payer: Payer = _SessionPayer(self)

    # -- construction helpers -----------------------------------------------------------------

    @classmethod
    def from_csv(
        cls,
        path: str | os.PathLike[str],
        *,
        header: bool = True,
        columns: Sequence[str] | None = None,
        delimiter: str = ",",
        null: str | Sequence[str] | None = None,
        skip_rows: int = 0,
        **kwargs: Any,
    ) -> Session:
        """A session over a CSV file, read by dpkit's CSV reader: one line a record, every column
        as text, nothing sniffed from the rows (the declared types apply), a malformed line dropped
        alone — the same rows on both engines (:mod:`dpkit.analytics.engines.csv_source`, and the
        guide's "How dpkit reads your data"). The table is named after the file's stem unless
        ``table=`` is given. The other keywords are :class:`Session`'s.

        ``header``: whether the first line names the columns (default True). ``columns``: the
        columns' names in the file's order — required with ``header=False``; with a header line
        they replace its names. ``delimiter``: the text between fields (default ``","``; ``";"``,
        ``"\\t"``, ``"|"``, or several characters, such as UCI Adult's ``", "``). ``null``: a text
        or list of texts read as NULL besides the empty field (``"NA"``, ``["NA", "?"]``), compared
        with the field's surrounding spaces trimmed (``"?"`` matches ``" ?"``). ``skip_rows``: the
        number of lines before the header line (or before the first data line without one), such
        as a title; each later line equal to one of them is skipped too, as a repeated header
        line is. ``engine``: ``"duckdb"`` (default) or ``"spark"``
        (the file read by Spark's text source on ``spark``, a SparkSession, default a local one).
        A bad value raises :class:`~dpkit.errors.InvalidParameterError` naming the option, before
        anything is read.

        >>> import tempfile, pathlib, dpkit as dp
        >>> from dpkit.analytics import Metadata, Numeric
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "ages.csv"
        >>> _ = p.write_text("31;F\\n45;M\\nNA;F\\n")
        >>> s = dp.Session.from_csv(p, header=False, columns=["age", "sex"], delimiter=";", null="NA",
        ...                         metadata=Metadata(columns={"age": Numeric(0, 100)}, row_level=True),
        ...                         budget=dp.Budget(epsilon=1.0))
        >>> s.table, sorted(s.columns)
        ('ages', ['age'])
        """
        from dpkit.analytics.engines.csv_source import CsvFile, CsvOptions

        if not isinstance(path, (str, os.PathLike)):
            raise InvalidParameterError("path", _short(path), "the path of a CSV file (a str or os.PathLike)")
        engine = kwargs.pop("engine", None)
        spark = kwargs.pop("spark", None)
        if engine is not None and (not isinstance(engine, str) or engine not in ("duckdb", "spark")):
            raise InvalidParameterError("engine", _short(engine), "'duckdb' (default) or 'spark'")
        options = CsvOptions(
            header=header,
            columns=columns,  # type: ignore[arg-type]  # checked and made a tuple by CsvOptions
            delimiter=delimiter,
            null=() if null is None else null,  # type: ignore[arg-type]
            skip_rows=skip_rows,
        )
        kwargs.setdefault("table", Path(path).stem)
        source = CsvFile(Path(path), options)
        if engine != "spark":
            if spark is not None:
                raise InvalidParameterError("spark", _short(spark), "None unless engine='spark'")
            return cls(source, **kwargs)
        duckdb_only(kwargs.pop("memory_limit", None), kwargs.pop("temp_directory", None), "engine='spark'")
        if spark is not None and not hasattr(getattr(spark, "read", None), "text"):
            raise InvalidParameterError("spark", _short(spark), "a SparkSession, or None (a local one)")
        if not source.path.is_file():
            raise InvalidParameterError("data", source.path.name, "an existing CSV file")
        from dpkit.analytics.engines.csv_source import csv_names, read_csv_spark
        from dpkit.analytics.engines.spark import SparkEngine, spark_session

        csv_names(source.path, options)  # a header that names no columns is refused before Spark starts
        frame = read_csv_spark(spark if spark is not None else spark_session(), source)
        return cls(None, engine=SparkEngine(frame), **kwargs)

    @classmethod
    def from_parquet(
        cls,
        path: str | os.PathLike[str],
        *,
        engine: str | None = None,
        spark: Any = None,
        memory_limit: str | None = None,
        temp_directory: str | os.PathLike[str] | None = None,
        **kwargs: Any,
    ) -> Session:
        """A session over Parquet data: a file, a directory (every ``.parquet`` file under it) or a
        glob such as ``data/*.parquet`` or ``data/**/*.parquet`` (``**``: any depth). In a
        Hive-partitioned directory (``data/year=2021/part-0.parquet``) the ``key=value``
        directories are columns too. Names starting with ``.`` or ``_`` (``_SUCCESS``) are skipped.
        The columns and their types come from the files' metadata, never from their rows, and
        every row is read by its own file's types: files that disagree on a column's type are cast
        value by value, partition values are text, and text that is not UTF-8 is repaired
        (the guide's "How dpkit reads your data"). A path that matches no file is refused
        (:class:`~dpkit.errors.InvalidParameterError`) before anything is spent. The table is
        named after the file or the directory, up to the first dot (``events/`` and
        ``events.parquet`` are ``events``; a glob's last directory before its wildcard:
        ``events/**/*.parquet``), else ``data``; ``table=`` names it otherwise.

        ``engine="duckdb"`` (default) reads the files with DuckDB's ``read_parquet``;
        ``memory_limit`` (``"4GB"``) and ``temp_directory`` make it spill the bounding's sort and
        the group-by to disk past that much memory (see :class:`Session`). ``engine="spark"`` reads
        them with ``spark.read.parquet`` on ``spark`` (a SparkSession: local, a cluster or Spark
        Connect; default :func:`dpkit.analytics.engines.spark.spark_session`, a local one): the
        same files, with the same partition columns. On Spark the path may also be a URI Spark
        reads (``hdfs://…``, ``s3a://…``, ``file:///…``), listed and globbed by Spark itself. The
        other keywords are :class:`Session`'s.

        >>> import tempfile, pathlib, pandas as pd, dpkit as dp
        >>> from dpkit.analytics import Categorical, Metadata
        >>> root = pathlib.Path(tempfile.mkdtemp()) / "visits"
        >>> for year in (2020, 2021):
        ...     (root / f"year={year}").mkdir(parents=True)
        ...     pd.DataFrame({"pid": [1, 2, 3]}).to_parquet(root / f"year={year}" / "part-0.parquet")
        >>> s = dp.Session.from_parquet(root / "**" / "*.parquet", privacy_unit="pid",
        ...                             metadata=Metadata(columns={"year": Categorical((2020, 2021))}),
        ...                             budget=dp.Budget(epsilon=1.0), memory_limit="1GB")
        >>> s.table, sorted(s.columns)
        ('visits', ['pid', 'year'])
        """

        if not isinstance(path, (str, os.PathLike)):
            raise InvalidParameterError(
                "path", _short(path), "the path of a Parquet file, a directory of Parquet files or a glob"
            )
        if engine is not None and (not isinstance(engine, str) or engine not in ("duckdb", "spark")):
            raise InvalidParameterError("engine", _short(engine), "'duckdb' (default) or 'spark'")
        text = os.fspath(path)
        p = Path(text)
        if p.is_file() and p.suffix.lower() not in (".parquet", ".pq"):
            raise InvalidParameterError(
                "data", p.name, "a Parquet file (.parquet or .pq), a directory of Parquet files or a glob"
            )
        kwargs.setdefault("table", default_table(text))
        if engine != "spark":
            if spark is not None:
                raise InvalidParameterError("spark", _short(spark), "None unless engine='spark'")
            return cls(p, memory_limit=memory_limit, temp_directory=temp_directory, **kwargs)
        duckdb_only(memory_limit, temp_directory, "engine='spark'")
        from dpkit.analytics.engines.spark import SparkEngine, spark_session
        from dpkit.analytics.engines.spark_parquet import parquet_listing, read_parquet

        if spark is not None and not hasattr(getattr(spark, "read", None), "parquet"):
            raise InvalidParameterError("spark", _short(spark), "a SparkSession, or None (a local one)")
        listing = parquet_listing(text)  # refused before Spark starts
        frame = read_parquet(spark if spark is not None else spark_session(), text, listing)
        source = SparkEngine(frame)
        return cls(None, engine=source, **kwargs)

    @classmethod
    def from_duckdb(cls, connection: Any, table: str, **kwargs: Any) -> Session:
        """A session over a table or view of an open DuckDB connection."""
        from dpkit.analytics.engines.duckdb import DuckDBEngine

        kwargs.setdefault("table", table)
        return cls(None, engine=DuckDBEngine(None, connection=connection, table=table), **kwargs)

    def _check_bound(self, name: str, value: object, default: int | None) -> int:
        return check_bound(name, value, default, self._unit)

    # -- state -----------------------------------------------------------------------------------

    @property
    def engine(self) -> Engine:
        return self._engine

    @property
    def privacy_unit(self) -> str | None:
        return self._unit

    @property
    def metadata(self) -> Metadata:
        return self._metadata

    @property
    def neighbours(self) -> Neighbours:
        return self._neighbours

    @property
    def table(self) -> str:
        return self._table

    @property
    def tables(self) -> tuple[str, ...]:
        """The tables a query can name (one for a session over one table)."""
        return (self._table,) if self._tables is None else tuple(self._tables.dataset.tables)

    @property
    def limits(self) -> QueryLimits:
        """How large one query may be (see :class:`~dpkit.analytics.limits.QueryLimits`)."""
        return self._limits

    @property
    def columns(self) -> dict[str, ColumnKind]:
        """The declared columns and their kinds (from the metadata, never from the data)."""
        return dict(self._schema)

    @property
    def remaining(self) -> float:
        """ε left in the session's budget (or ledger entry)."""
        if self._budget is not None:
            return self._budget.remaining
        return self._ledger.get_budget(self._dataset, self._analyst).remaining_epsilon

    @property
    def spent(self) -> tuple[float, float]:
        """(ε, δ) spent so far."""
        if self._budget is not None:
            return self._budget.spent
        rec = self._ledger.get_budget(self._dataset, self._analyst)
        return rec.spent_epsilon, rec.spent_delta

    def _pay(self, event: DPEvent, epsilon: float, delta: float, text: str) -> int | None:
        """Debit the query's event (raises BudgetExceededError and records nothing if refused);
        the ledger's spend id, or None for an in-memory budget."""
        if self._budget is not None:
            self._budget.spend(event)
            return None
        try:
            basic_cost(event)
            costs: dict[str, object] = {}
        except DPError:
            # No basic-composition price (Gaussian noise): the query was calibrated to (ε, δ).
            costs = {"epsilon_cost": decimal_fraction(epsilon), "delta_cost": delta}
        return self._ledger.debit(self._dataset, self._analyst, event, text, **costs).id

    def _check_query_rng(self, rng: object) -> None:
        check_rng(rng, self._ledger)

    # -- queries -----------------------------------------------------------------------------------

    def query(self, table: str | None = None) -> Query:
        """A query over the whole table, to refine with ``join`` / ``where`` / ``group_by``. With
        several tables, ``table`` names the private table it reads (default: the only one)."""
        if self._tables is None:
            if table is not None and table != self._table:
                raise InvalidParameterError("table", _short(table), f"None or {self._table!r}, this session's table")
            return Query(self, None, (), None, self._max_groups, self._max_rows)
        if table is None:
            table = self._tables.default
            if table is None:
                raise InvalidParameterError(
                    "table",
                    None,
                    "the private table to read: " + ", ".join(map(repr, self._tables.dataset.private_tables)),
                    "this dataset has several private tables",
                )
        name = self._tables.table(table)
        declared = self._tables.declared(name)
        return Query(self, None, (), None, self._max_groups, self._max_rows, table=name, declared=declared)

    def where(self, predicate: str | Predicate) -> Query:
        return self.query().where(predicate)

    def group_by(
        self, *columns: str, keys: Sequence[Any] | None = None, bins: dict[str, Sequence[float] | int] | None = None
    ) -> Query:
        return self.query().group_by(*columns, keys=keys, bins=bins)

    # The aggregate methods over the whole table: Query's, with Query's signatures and docs (so
    # the options are written once, in query.py, and inspect/IDEs/mypy see them here too).
    count = _over_whole_table(Query.count)
    count_units = _over_whole_table(Query.count_units)
    sum = _over_whole_table(Query.sum)
    mean = _over_whole_table(Query.mean)
    variance = _over_whole_table(Query.variance)
    std = _over_whole_table(Query.std)
    quantile = _over_whole_table(Query.quantile)
    median = _over_whole_table(Query.median)
    histogram = _over_whole_table(Query.histogram)
    aggregate = _over_whole_table(Query.aggregate)

    def sql(
        self,
        text: str,
        *,
        epsilon: float,
        delta: float = _DELTA,
        noise: Noise = _NOISE,
        confidence: float = _CONFIDENCE,
        key_selection: str = _KEY_SELECTION,
        split: Sequence[float] | None = None,
        bounding_epsilon: float | None = None,
        rng: RNG = None,
    ) -> QueryResult:
        """Run a SQL query of the documented subset (see :mod:`dpkit.analytics.sql`); the budget
        ``epsilon`` (and ``delta``) is split across its aggregates, as stated in the result;
        ``bounding_epsilon`` pays for an estimate of what contribution bounding left out
        (:mod:`dpkit.analytics.bounding`)."""
        query, aggs = compile_sql(self, text)
        return query.aggregate(
            aggs,
            epsilon=epsilon,
            delta=delta,
            noise=noise,
            confidence=confidence,
            key_selection=key_selection,
            split=split,
            bounding_epsilon=bounding_epsilon,
            rng=rng,
            _text=text,
        )

    def sql_cost(
        self,
        text: str,
        *,
        epsilon: float,
        delta: float = _DELTA,
        noise: Noise = _NOISE,
        confidence: float = _CONFIDENCE,
        key_selection: str = _KEY_SELECTION,
        split: Sequence[float] | None = None,
        bounding_epsilon: float | None = None,
    ) -> QueryCost:
        """What :meth:`sql` with the same arguments would debit, without reading the data or
        spending anything (the query is parsed and validated just the same)."""
        query, aggs = compile_sql(self, text)
        return query.cost(
            aggs,
            epsilon=epsilon,
            delta=delta,
            noise=noise,
            confidence=confidence,
            key_selection=key_selection,
            split=split,
            bounding_epsilon=bounding_epsilon,
            _text=text,
        )

    def __repr__(self) -> str:
        unit = self._unit or "each row"
        return (
            f"Session(table={self._table!r}, engine={self._engine.name!r}, privacy_unit={unit!r}, "
            f"max_groups={self._max_groups}, max_rows={self._max_rows}, neighbours={self._neighbours!r}, "
            f"remaining ε={self.remaining:.6g})"
        )


class _SessionPayer:
    """A session as the payer of :func:`~dpkit.analytics.execute.execute`."""

    def __init__(self, session: Session) -> None:
        self._session = session

    def pay(self, event: DPEvent, epsilon: float, delta: float, text: str) -> int | None:
        return self._session._pay(event, epsilon, delta, text)

    @property
    def remaining(self) -> float:
        return self._session.remaining
