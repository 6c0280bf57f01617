"""Options and helpers shared by the ``dpkit`` commands: ``--json``, ``--seed`` and ``--ledger``,
JSON output (:func:`_emit_json`), errors (:func:`_fail`; a dpkit error in the command line's terms
with :func:`_fail_error`, see :mod:`dpkit.cli._errors`), opening an existing ledger, and saying
which ledger and which dataset a budget is (:func:`_ledger_location`, :class:`DatasetChoice`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from shlex import quote
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape

from dpkit.cli._errors import CliContext, cli_message
from dpkit.errors import DPError

JsonOption = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON on stdout instead of tables.")]
SeedOption = Annotated[
    int | None,
    typer.Option(
        "--seed",
        min=0,
        help="Seed the noise with numpy.random.default_rng(SEED): reproducible, NOT secure (teaching and tests only). "
        "Without it all noise comes from the OS CSPRNG.",
    ),
]


def _emit_json(obj: Any) -> None:
    typer.echo(json.dumps(obj, indent=2, ensure_ascii=False))


def _fail(message: str, code: int = 1) -> NoReturn:
    # soft_wrap: a message is never broken with newlines, so the paths and commands in it copy whole
    Console(stderr=True, soft_wrap=True).print(f"[bold red]error:[/] {escape(message)}")  # text, never markup
    raise typer.Exit(code)


def _fail_error(exc: BaseException, ctx: CliContext | None = None, code: int = 1) -> NoReturn:
    """Fail with a dpkit error's message in the command line's terms (options for parameters,
    the command-line remedy for the Python one: :func:`dpkit.cli._errors.cli_message`)."""
    _fail(cli_message(exc, ctx), code)


LedgerOption = Annotated[
    str,
    typer.Option(
        "--ledger",
        envvar="DPKIT_LEDGER",
        help="The ledger: a SQLite file path, sqlite:///PATH or postgresql://USER@HOST/DB.",
    ),
]


def _spark_settings(items: list[str] | None, option: str) -> dict[str, str]:
    """Spark settings given as ``option KEY=VALUE`` (repeatable), refused when one has no '=' or
    no key."""
    out: dict[str, str] = {}
    for item in items or []:
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            _fail(
                f"{option} {item!r} is not accepted: {option} must be KEY=VALUE, e.g. {option} spark.executor.memory=2g"
            )
        out[key.strip()] = value
    return out


EngineOption = Annotated[
    str,
    typer.Option(
        "--engine",
        metavar="duckdb|spark",
        help="Where the data is read: duckdb (in this process, the default) or spark (CSV and Parquet data).",
    ),
]
MasterOption = Annotated[
    str | None,
    typer.Option(
        "--master",
        metavar="URL",
        help="With --engine spark: the Spark master, e.g. local[4], spark://host:7077, yarn, k8s://https://host:6443, "
        "or sc://host:15002 for Spark Connect (default: local[2]).",
    ),
]
ConfOption = Annotated[
    list[str] | None,
    typer.Option(
        "--conf",
        metavar="KEY=VALUE",
        help="With --engine spark: a Spark setting, e.g. spark.executor.memory=4g (repeatable).",
    ),
]


def _engine_settings(engine: str, master: str | None, conf: list[str] | None, data: str) -> tuple[dict[str, str], bool]:
    """--engine, --master and --conf checked together (before anything is read or paid): the
    Spark settings, and whether ``data`` is a URI (which only Spark reads)."""
    from dpkit.analytics.engines.base import is_uri
    from dpkit.analytics.engines.spark import MASTERS, SPARK_MASTER

    if engine not in ("duckdb", "spark"):
        _fail(f"--engine {quote(engine)} is not accepted: --engine must be duckdb or spark")
    if engine == "duckdb" and (master is not None or conf):
        given = f"--master {quote(master)}" if master is not None else f"--conf {quote((conf or [''])[0])}"
        _fail(f"{given} is not accepted without --engine spark: --master and --conf set up Spark")
    if master is not None and not SPARK_MASTER.fullmatch(master):
        _fail(f"--master {quote(master)} is not accepted: --master must be {MASTERS}")
    settings = _spark_settings(conf, "--conf")
    uri = is_uri(data)
    if uri and engine != "spark":
        _fail(f"{data!r} is a URI: DuckDB reads local files; run it on Spark with --engine spark")
    return settings, uri


def _spark_session(master: str | None, settings: dict[str, str], app_name: str) -> Any:
    """The SparkSession for --engine spark: dpkit's local one, or one for --master and --conf.
    Spark failing to start (no Java, a master that cannot be reached) fails the command before
    anything is paid."""
    from dpkit.analytics.engines.spark import spark_session

    try:
        import pyspark  # noqa: F401
    except ImportError:
        _fail("--engine spark needs pyspark: pip install 'dpkit[spark]'")
    try:
        return spark_session(master, settings, app_name=app_name)
    except DPError:
        raise
    except Exception as exc:  # Py4J, Spark Connect and JVM errors alike: none is dpkit's
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        _fail(f"Spark did not start (--master {quote(master or 'local[2]')}): {first}")


def _ledger_missing(ledger: str) -> bool:
    """True for a SQLite ledger whose file does not exist (a server ledger always 'exists')."""
    if ledger.lower().startswith(("postgresql://", "postgres://")):
        return False
    return not Path(ledger.removeprefix("sqlite:///")).exists()


def _ledger_where(store: Any) -> str:
    """Where an open ledger is, as a reader can find it again: a SQLite file's absolute path (the
    default is relative to the working directory, so the same command elsewhere uses another
    ledger), or a server URL without its password."""
    path = getattr(store, "path", None)
    return str(path) if path is not None else str(store.url)


def _ledger_location(ledger: str) -> str:
    """Where ``--ledger`` points, before it is opened, as :func:`_ledger_where` says it after: a
    SQLite file's absolute path, or a server URL without its password."""
    if ledger.lower().startswith(("postgresql://", "postgres://")):
        from dpkit.ledger._postgres_driver import mask_url

        return mask_url(ledger)
    return str(Path(ledger.removeprefix("sqlite:///")).expanduser().absolute())


@dataclass(frozen=True)
class DatasetChoice:
    """The dataset a command's budget is kept under, and where that name came from.

    ``name``: the ledger's dataset name; ``given_as``: what gave it (``"DATA"``, ``"--dataset"``,
    ``"DATASET"``); ``file``: the data file whose content identity (``sha256:…``, see
    :mod:`dpkit.ledger.identity`) the name is, or None for a plain name."""

    name: str
    given_as: str
    file: str | None = None

    @classmethod
    def of(cls, given: str | Path, given_as: str) -> DatasetChoice:
        """A data file's content identity, or ``given`` itself as a name."""
        from dpkit.ledger.identity import dataset_identity

        if Path(given).is_file():
            return cls(dataset_identity(given), given_as, str(given))
        return cls(str(given), given_as)

    @property
    def origin(self) -> str:
        """Where the name came from, in words."""
        if self.file is None:
            return f"named by {self.given_as}"
        return f"the content of {self.file}" + (f", from {self.given_as}" if self.given_as.startswith("-") else "")

    def to_dict(self) -> dict[str, Any]:
        return {"dataset": self.name, "dataset_from": self.given_as, "file": self.file}


def _say_identity(dataset: DatasetChoice | None, ledger: str) -> None:
    """The budget's dataset (when there is one) and ledger, on stderr, one line each (human
    output; --json carries them as fields)."""
    err = Console(stderr=True, soft_wrap=True)  # a path or identity is never wrapped
    if dataset is not None:
        err.print(f"dataset: {escape(dataset.name)} ({escape(dataset.origin)})", highlight=False)
    err.print(f"ledger: {escape(ledger)}", highlight=False)


def _budget_datasets(store: Any) -> tuple[str, ...]:
    """The datasets that have a budget in an open ledger (its metadata, not data); () if it
    cannot be read."""
    from dpkit.errors import DPError

    try:
        return tuple(dict.fromkeys(b.dataset for b in store.list_budgets()))
    except DPError:
        return ()


def _open_existing(ledger: str):
    from dpkit.ledger import open_ledger

    if _ledger_missing(ledger):
        _fail(f"no ledger at {_ledger_location(ledger)} (create a budget first: dpkit budget create ...)")
    return open_ledger(ledger)


# -- how a CSV file is read (dpkit query, dpkit check): the options of Session.from_csv -----------

NoHeaderOption = Annotated[
    bool, typer.Option("--no-header", help="A CSV without a header line (name its columns with --columns).")
]
ColumnsOption = Annotated[
    str | None, typer.Option("--columns", help="A CSV's column names, comma-separated (replacing its header's).")
]
DelimiterOption = Annotated[
    str,
    typer.Option(
        "--delimiter", help="A CSV's field delimiter: one character (';', '|', 'tab') or several (', ' in UCI Adult)."
    ),
]
NullOption = Annotated[
    list[str] | None,
    typer.Option(
        "--null",
        help="A text read as NULL in a CSV, besides the empty field, compared with surrounding spaces trimmed "
        "('?' matches ' ?'; repeatable).",
    ),
]
SkipRowsOption = Annotated[
    int,
    typer.Option(
        "--skip-rows", help="Lines before a CSV's header line (a title, say); a later line equal to one is skipped too."
    ),
]


def _csv_options(
    data: Path, no_header: bool, columns: str | None, delimiter: str, null: list[str] | None, skip_rows: int = 0
) -> dict[str, Any]:
    """The CSV options given (keywords of Session.from_csv), or {} for none."""
    given: dict[str, Any] = {}
    if no_header:
        given["header"] = False
    if columns is not None:
        given["columns"] = [c.strip() for c in columns.split(",")]
    if delimiter != ",":
        given["delimiter"] = "\t" if delimiter.lower() in ("tab", "\\t") else delimiter
    if null:
        given["null"] = list(null)
    if skip_rows:
        given["skip_rows"] = skip_rows  # checked by CsvOptions, as the keyword is
    if given and data.suffix.lower() in (".parquet", ".pq"):
        _fail(f"--no-header, --columns, --delimiter, --null and --skip-rows are for CSV files, not {data.name}")
    return given
