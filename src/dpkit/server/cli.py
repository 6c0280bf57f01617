"""``dpkit admin``: manage the curator service from the shell (``dpkit serve`` is
:mod:`dpkit.server.serve_command`).

The admin commands open the ledger database directly — whoever can run them on the curator's
machine *is* the curator — and write one audit entry per action (actor ``admin-cli``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.table import Table

from dpkit.errors import DPError
from dpkit.server import curator_log

if TYPE_CHECKING:
    from dpkit.server.service import Service

__all__ = ["admin_app"]

_DEFAULT = "sqlite:///.dpkit/ledger.sqlite"
LedgerOption = Annotated[
    str,
    typer.Option(
        "--ledger",
        envvar="DPKIT_LEDGER",
        help="Where budgets, keys, datasets and the audit log live: sqlite:///PATH (default .dpkit/ledger.sqlite) or postgresql://USER@HOST/DB.",
    ),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON on stdout instead of tables.")]
SparkMasterOption = Annotated[
    str | None,
    typer.Option(
        "--spark-master",
        help="The Spark master that reads Spark datasets: local[N], spark://HOST:PORT, yarn, k8s://URL or "
        "sc://HOST:PORT (Spark Connect); default a local session.",
    ),
]
SparkConfOption = Annotated[
    list[str] | None,
    typer.Option("--spark-conf", help="A Spark setting KEY=VALUE for that session (repeatable)."),
]
_ACTOR = "admin-cli"

admin_app = typer.Typer(
    help="Manage the curator service: principals and keys, datasets, grants, the audit log.", no_args_is_help=True
)


# The command line's own failure helpers (dpkit.cli imports this module, so they are imported
# when called, not at the top): text never read as markup, never wrapped, errors worded for the
# shell (options, not keywords).
def _fail(message: str, code: int = 1) -> NoReturn:
    from dpkit.cli._common import _fail as fail

    fail(message, code)


def _fail_error(exc: BaseException) -> NoReturn:
    from dpkit.cli._common import _fail_error as fail_error

    fail_error(exc)


def _open(ledger: str, *, max_grant_epsilon: float | None = None, **spark: Any) -> Service:
    # The service (the engines, pandas, the accountants) is imported by the command that runs, so
    # that ``dpkit --help`` does not load it.
    from dpkit.server.grants import DEFAULT_MAX_GRANT_EPSILON
    from dpkit.server.service import Service

    curator_log.log_to_stderr(os.environ.get("DPKIT_LOG_LEVEL", "warning"))  # the curator runs this
    try:
        return Service(
            ledger,
            max_grant_epsilon=DEFAULT_MAX_GRANT_EPSILON if max_grant_epsilon is None else max_grant_epsilon,
            **spark,
        )
    except DPError as exc:
        _fail_error(exc)


def _run(
    ledger: str,
    action: str,
    fn: Any,
    *,
    recorded: bool = False,
    max_grant_epsilon: float | None = None,
    spark: dict[str, Any] | None = None,
    **facts: Any,
) -> Any:
    """Run one administrative action and audit it (also when it fails). ``recorded``: the action
    writes its own entry with its change, in one transaction (a grant). ``spark``: the service's
    Spark settings (``spark_master``, ``spark_conf``)."""
    service = _open(ledger, max_grant_epsilon=max_grant_epsilon, **(spark or {}))
    try:
        try:
            result = fn(service)
        except DPError as exc:
            service.audit(actor=_ACTOR, action=action, status=400, outcome=f"error: {exc}"[:1000], detail=facts)
            _fail_error(exc)
        if not recorded:
            service.audit(actor=_ACTOR, action=action, status=200, outcome="ok", detail=facts)
        return result
    finally:
        service.close()


def _spark_options(master: str | None, conf: list[str] | None) -> dict[str, Any]:
    """--spark-master and --spark-conf KEY=VALUE as the service's keywords (refused when an item
    has no '=' or no key; the master is checked by the service)."""
    from dpkit.cli._common import _spark_settings

    return {"spark_master": master, "spark_conf": _spark_settings(conf, "--spark-conf") or None}


def _show_key(name: str, role: str, key: str, as_json: bool) -> None:
    if as_json:
        typer.echo(json.dumps({"name": name, "role": role, "key": key}))
        return
    console = Console()
    console.print(f"{role} [bold]{name}[/] — API key (shown once; only its hash is stored):")
    console.print(key, markup=False, highlight=False)


@admin_app.command("create-curator")
def create_curator(name: str, ledger: LedgerOption = _DEFAULT, as_json: JsonOption = False) -> None:
    """Create a curator and print their API key (once)."""
    _, key = _run(ledger, "create_curator", lambda s: s.create_principal(name, "curator"), name=name)
    _show_key(name, "curator", key, as_json)


@admin_app.command("create-analyst")
def create_analyst(name: str, ledger: LedgerOption = _DEFAULT, as_json: JsonOption = False) -> None:
    """Create an analyst and print their API key (once)."""
    _, key = _run(ledger, "create_analyst", lambda s: s.create_principal(name, "analyst"), name=name)
    _show_key(name, "analyst", key, as_json)


@admin_app.command("issue-key")
def issue_key(name: str, ledger: LedgerOption = _DEFAULT, as_json: JsonOption = False) -> None:
    """Issue another key for an existing principal (e.g. after revoking a leaked one)."""
    key = _run(ledger, "issue_key", lambda s: s.issue_key(name), name=name)
    _show_key(name, "key for", key, as_json)


@admin_app.command("revoke-key")
def revoke_key(
    key: Annotated[
        str, typer.Argument(metavar="KEY_ID", help="The key's id (16 hex digits, as `dpkit admin list` shows it).")
    ],
    ledger: LedgerOption = _DEFAULT,
) -> None:
    """Revoke one key, by its id; effective at the next request."""
    ids = _run(ledger, "revoke_key", lambda s: s.revoke_key(key), key=key)
    typer.echo(f"revoked key {key}" if ids else f"key {key} was already revoked")


@admin_app.command("revoke-principal")
def revoke_principal(
    name: Annotated[str, typer.Argument(help="The principal whose keys to revoke.")], ledger: LedgerOption = _DEFAULT
) -> None:
    """Revoke every key of a principal (curator or analyst); effective at the next request."""
    ids = _run(ledger, "revoke_principal", lambda s: s.revoke_principal(name), name=name)
    typer.echo(f"revoked {len(ids)} key(s) of {name!r}: {', '.join(ids) or '(all were already revoked)'}")


@admin_app.command("register-dataset")
def register_dataset(
    name: str,
    source: Annotated[
        list[str],
        typer.Argument(
            metavar="SOURCE",
            help="A CSV, Parquet or DuckDB database (.duckdb) file; with --engine spark, Parquet data: "
            "a file, a directory or a glob (or a URI Spark reads). For a dataset of several tables (metadata "
            'with "tables"): one TABLE=PATH per declared table.',
        ),
    ],
    metadata: Annotated[
        Path,
        typer.Option(
            "--metadata",
            help="The curator's metadata JSON: privacy_unit, max_groups, max_rows, columns with bounds/categories "
            '(several tables: their metadata under "tables").',
        ),
    ],
    neighbours: Annotated[str, typer.Option("--neighbours", help="add_remove or replace.")] = "add_remove",
    table: Annotated[
        list[str] | None,
        typer.Option(
            "--table",
            help="The table to serve, with a .duckdb source (several tables: TABLE=NAME for each .duckdb source).",
        ),
    ] = None,
    engine: Annotated[
        str,
        typer.Option(
            "--engine",
            help="duckdb (the source is copied into a shared read-only DuckDB file) or spark "
            "(Parquet data read in place by the service's Spark; serve with --spark-master).",
        ),
    ] = "duckdb",
    size_class: Annotated[
        str,
        typer.Option(
            "--size-class",
            help="small, medium, large or huge (at most 1e5 ... 1e8 rows): public; scales every paid answer's time.",
        ),
    ] = "medium",
    fingerprint: Annotated[
        str | None,
        typer.Option(
            "--fingerprint",
            help="With --engine spark: sha256 pins each file's content too, hashed at every query "
            "(about a second per GB); default: size and modification time.",
        ),
    ] = None,
    spark_master: SparkMasterOption = None,
    spark_conf: SparkConfOption = None,
    ledger: LedgerOption = _DEFAULT,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the registered dataset and its data check as JSON.")
    ] = False,
) -> None:
    """Register a dataset analysts can be granted budgets on, and print its data check.

    The check says how well the rows conform to the metadata (for the curator only — it is not a
    private release, and no analyst ever sees it). The metadata must declare privacy_unit or
    row_level (for several tables: each private table's, and the public tables as public)."""
    sources, tables = _sources(source, table, metadata)
    info = _run(
        ledger,
        "register_dataset",
        lambda s: s.register_dataset(
            name,
            sources,
            metadata,
            neighbours=neighbours,
            table=tables,
            engine=engine,
            size_class=size_class,
            fingerprint=fingerprint,
        ),  # fmt: skip
        spark=_spark_options(spark_master, spark_conf),
        dataset=name,
        source=sources if isinstance(sources, dict) else str(sources),
        table=tables,
        engine=engine,
    )
    if as_json:
        typer.echo(json.dumps({**info.curator(), "check": None if info.check is None else info.check.to_dict()}))
        return
    typer.echo(f"registered dataset {info.name!r} ({_declared(info)}, neighbours={info.neighbours})")
    typer.echo("")
    if info.check is None:
        typer.echo("warning: the data check could not be made (the dpkit.curator log says why)")
    else:
        typer.echo(info.check.to_text())


def _sources(
    source: list[str], table: list[str] | None, metadata: Path
) -> tuple[str | dict[str, str], str | dict[str, str] | None]:
    """SOURCE... and --table as the service takes them: one file (and table) as ever, or with
    metadata declaring several tables, TABLE=PATH (and TABLE=NAME) mappings."""
    from dpkit.analytics.dataset_metadata import declares_tables
    from dpkit.cli._tables import table_pairs

    if not declares_tables(metadata):
        if len(source) != 1 or len(table or ()) > 1:
            _fail(
                f"{'SOURCE' if len(source) != 1 else '--table'}: one for a dataset of one table (several only with "
                'metadata declaring "tables": one TABLE=PATH per table)'
            )
        return source[0], table[0] if table else None
    pairs = table_pairs(source, "SOURCE")
    named = table_pairs(table or [], "--table", "TABLE=NAME")
    for found in (pairs, named):
        if isinstance(found, str):
            _fail(found)
    assert isinstance(pairs, dict) and isinstance(named, dict)
    return pairs, named or None


def _declared(info: Any) -> str:
    """What a registered dataset declares, in words: its columns and unit, or its tables."""
    meta = info.metadata
    if info.several:
        return f"{len(meta.tables)} tables: " + ", ".join(
            f"{n} (public)" if m.public else f"{n} ({_unit(m)})" for n, m in meta.tables.items()
        )
    return f"{len(meta.columns)} declared columns, {_unit(meta)}"


def _unit(meta: Any) -> str:
    if meta.privacy_unit is not None:
        return f"privacy unit {meta.privacy_unit!r}"
    return "row-level (every row a different person)"


@admin_app.command("grant")
def grant(
    analyst: str,
    dataset: str,
    epsilon: Annotated[float, typer.Option("--epsilon", help="The analyst's total ε on this dataset.")],
    delta: Annotated[float, typer.Option("--delta", help="The analyst's total δ on this dataset.")] = 0.0,
    max_grant_epsilon: Annotated[
        float, typer.Option("--max-grant-epsilon", help="Refuse a larger ε (a guard against typos).")
    ] = 10.0,
    ledger: LedgerOption = _DEFAULT,
) -> None:
    """Give an analyst a budget on a dataset (a budget is never changed afterwards).

    The budget and its grant entry in the audit chain are written in one transaction."""
    b = _run(
        ledger,
        "grant",
        lambda s: s.grant(analyst, dataset, epsilon=epsilon, delta=delta, actor=_ACTOR),
        recorded=True,
        max_grant_epsilon=max_grant_epsilon,
        analyst=analyst,
        dataset=dataset,
        epsilon=epsilon,
        delta=delta,
    )
    typer.echo(f"granted {analyst!r} ε={b.epsilon:g}, δ={b.delta:g} on {dataset!r}")


@admin_app.command("allow-publish")
def allow_publish(
    name: str,
    revoke: Annotated[bool, typer.Option("--revoke", help="Take the right back (their releases stay).")] = False,
    ledger: LedgerOption = _DEFAULT,
) -> None:
    """Name an analyst a publisher, who may store synthetic tables as releases (--revoke: no longer).

    The change and its audit entry are written in one transaction."""
    action = "revoke_publish" if revoke else "allow_publish"
    changed = _run(
        ledger, action, lambda s: s.allow_publish(name, actor=_ACTOR, revoke=revoke), recorded=True, publisher=name
    )
    state = "is no longer" if revoke else "is now"
    typer.echo(f"{name!r} {state} a publisher" + ("" if changed else " (unchanged)"))


@admin_app.command("list")
def list_all(ledger: LedgerOption = _DEFAULT, as_json: JsonOption = False) -> None:
    """Principals (with key ids), datasets, budgets and published releases."""
    from dpkit.server.grants import budget_dict

    service = _open(ledger)
    try:
        people, datasets, budgets = service.principals(), service.datasets(), service.budgets()
        releases = service.releases()
    finally:
        service.close()
    if as_json:
        typer.echo(
            json.dumps(
                {
                    "principals": people,
                    "datasets": [{k: x for k, x in d.curator().items() if k != "created_at"} for d in datasets],
                    "budgets": [budget_dict(b) for b in budgets],
                    "releases": [{**r.public(), "spend_id": r.spend_id} for r in releases],
                },
                indent=2,
            )
        )
        return
    console = Console()
    t = Table(title="principals")
    for c in ("name", "role", "active keys", "revoked keys"):
        t.add_column(c)
    for p in people:
        active = [k["id"] for k in p["keys"] if k["revoked_at"] is None]
        t.add_row(p["name"], p["role"], ", ".join(active), str(len(p["keys"]) - len(active)))
    console.print(t)
    t = Table(title="datasets")
    for c in ("name", "source", "engine", "privacy unit", "neighbours"):
        t.add_column(c)
    for d in datasets:
        source = ", ".join(f"{n}={p}" for n, p in d.sources.items()) if d.several else d.source
        meta = d.metadata
        tables = getattr(meta, "tables", {})  # several tables: each private table's unit
        units = ", ".join(f"{n}.{m.privacy_unit or '(row)'}" for n, m in tables.items() if not m.public)
        unit: str | None = units if tables else getattr(meta, "privacy_unit", None)
        t.add_row(d.name, source, d.engine, unit or "(row)", d.neighbours)
    console.print(t)
    t = Table(title="budgets")
    for c in ("dataset", "analyst", "ε", "ε spent", "δ", "δ spent"):
        t.add_column(c)
    for b in budgets:
        t.add_row(
            b.dataset, b.analyst, f"{b.epsilon:g}", f"{b.spent_epsilon:.6g}", f"{b.delta:g}", f"{b.spent_delta:.3g}"
        )
    console.print(t)
    if releases:
        t = Table(title="releases (published synthetic tables)")
        for c in ("name", "dataset", "published by", "ε", "δ", "rows", "spend", "created"):
            t.add_column(c)
        for r in releases:
            t.add_row(
                r.name,
                r.dataset,
                r.analyst,
                f"{r.epsilon:g}",
                f"{r.delta:g}",
                f"{r.rows:,}",
                str(r.spend_id),
                r.created_at,
            )
        console.print(t)


@admin_app.command("verify-log")
def verify_log(
    ledger: LedgerOption = _DEFAULT,
    head: Annotated[
        str | None,
        typer.Option(
            "--head", help="A head hash printed by an earlier verify-log: also detect entries cut from the end."
        ),
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Verify the ledger, the audit log's keyed hash chain, and each against the other.

    Every spend has exactly one entry, every budget its grant, the totals their chained spends;
    the head hash to keep is printed. The chain's key is read from DPKIT_AUDIT_KEY, else beside
    the ledger."""
    service = _open(ledger)
    try:
        try:
            report = service.verify_log(head=head)
        except DPError as exc:
            if as_json:
                typer.echo(json.dumps({"ok": False, "error": str(exc)}))
                raise typer.Exit(1) from None
            _fail(f"verification FAILED: {exc}")
    finally:
        service.close()
    if as_json:
        typer.echo(json.dumps({"ok": True, "entries": report.entries, "head": report.head, "unlogged_spends": []}))
        return
    typer.echo(
        f"audit log OK: {report.entries} entries, keyed chain intact; the ledger and the log agree "
        "(every spend has its entry, every budget its grant, the totals their chained spends)"
    )
    typer.echo(f"head: {report.head}  (keep it elsewhere; pass --head to detect entries cut from the end)")
