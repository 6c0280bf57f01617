"""``dpkit serve`` and ``dpkit admin``: run the curator service and manage it from the shell.

The admin commands open the ledger database directly — whoever can run them on the curator's
machine *is* the curator — and write one audit entry per action (actor ``admin-cli``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.table import Table

from dpkit.errors import DPError
from dpkit.server.service import Service, budget_dict
from dpkit.server.store import masked_url

__all__ = ["admin_app", "serve"]

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
_ACTOR = "admin-cli"

admin_app = typer.Typer(help="Manage the curator service: principals and keys, datasets, grants, the audit log.", no_args_is_help=True)


def _fail(message: str, code: int = 1) -> NoReturn:
    Console(stderr=True).print(f"[bold red]error:[/] {message}")
    raise typer.Exit(code)


def _open(ledger: str) -> Service:
    try:
        return Service(ledger)
    except DPError as exc:
        _fail(str(exc))


def _run(ledger: str, action: str, fn: Any, **facts: Any) -> Any:
    """Run one administrative action and audit it (also when it fails)."""
    service = _open(ledger)
    try:
        try:
            result = fn(service)
        except DPError as exc:
            service.audit(actor=_ACTOR, action=action, status=400, outcome=f"error: {exc}"[:1000], detail=facts)
            _fail(str(exc))
        service.audit(actor=_ACTOR, action=action, status=200, outcome="ok", detail=facts)
        return result
    finally:
        service.close()


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


@admin_app.command("revoke")
def revoke(target: Annotated[str, typer.Argument(help="A key id, or a principal's name to revoke all their keys.")], ledger: LedgerOption = _DEFAULT) -> None:
    """Revoke a key (by id) or every key of a principal (by name); effective at the next request."""
    ids = _run(ledger, "revoke", lambda s: s.revoke(target), target=target)
    typer.echo(f"revoked {len(ids)} key(s): {', '.join(ids) or '(all were already revoked)'}")


@admin_app.command("register-dataset")
def register_dataset(
    name: str,
    source: Annotated[Path, typer.Argument(help="A CSV, Parquet or DuckDB database (.duckdb) file.")],
    metadata: Annotated[Path, typer.Option("--metadata", help="The curator's metadata JSON: privacy_unit, max_groups, max_rows, columns with bounds/categories.")],
    neighbours: Annotated[str, typer.Option("--neighbours", help="add_remove or replace.")] = "add_remove",
    table: Annotated[str | None, typer.Option("--table", help="The table to serve, with a .duckdb source.")] = None,
    ledger: LedgerOption = _DEFAULT,
    as_json: Annotated[bool, typer.Option("--json", help="Print the registered dataset and its data check as JSON.")] = False,
) -> None:
    """Register a dataset analysts can be granted budgets on, and print the data check: how well
    the rows conform to the metadata (for the curator only — it is not a private release, and no
    analyst ever sees it). The metadata must declare privacy_unit or row_level."""
    info = _run(
        ledger, "register_dataset", lambda s: s.register_dataset(name, source, metadata, neighbours=neighbours, table=table),
        dataset=name, source=str(source), table=table,
    )
    if as_json:
        typer.echo(json.dumps({**info.public(), "source": info.source, "check": None if info.check is None else info.check.to_dict()}, default=str))
        return
    unit = f"privacy unit {info.metadata.privacy_unit!r}" if info.metadata.privacy_unit is not None else "row-level (every row a different person)"
    typer.echo(f"registered dataset {info.name!r} ({len(info.metadata.columns)} declared columns, {unit}, neighbours={info.neighbours})")
    typer.echo("")
    if info.check is None:
        typer.echo("warning: the data check could not be made (the dpkit.curator log says why)")
    else:
        typer.echo(info.check.to_text())


@admin_app.command("grant")
def grant(
    analyst: str,
    dataset: str,
    epsilon: Annotated[float, typer.Option("--epsilon", help="The analyst's total ε on this dataset.")],
    delta: Annotated[float, typer.Option("--delta", help="The analyst's total δ on this dataset.")] = 0.0,
    ledger: LedgerOption = _DEFAULT,
) -> None:
    """Give an analyst a budget on a dataset (a budget is never changed afterwards)."""
    b = _run(ledger, "grant", lambda s: s.grant(analyst, dataset, epsilon=epsilon, delta=delta), analyst=analyst, dataset=dataset, epsilon=epsilon, delta=delta)
    typer.echo(f"granted {analyst!r} ε={b.epsilon:g}, δ={b.delta:g} on {dataset!r}")


@admin_app.command("list")
def list_all(ledger: LedgerOption = _DEFAULT, as_json: JsonOption = False) -> None:
    """Principals (with key ids), datasets and budgets."""
    service = _open(ledger)
    try:
        people, datasets, budgets = service.principals(), service.datasets(), service.budgets()
    finally:
        service.close()
    if as_json:
        typer.echo(json.dumps({
            "principals": people,
            "datasets": [{**d.public(), "source": d.source} for d in datasets],
            "budgets": [budget_dict(b) for b in budgets],
        }, indent=2))
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
    for c in ("name", "source", "privacy unit", "neighbours"):
        t.add_column(c)
    for d in datasets:
        t.add_row(d.name, d.source, d.metadata.privacy_unit or "(row)", d.neighbours)
    console.print(t)
    t = Table(title="budgets")
    for c in ("dataset", "analyst", "ε", "ε spent", "δ", "δ spent"):
        t.add_column(c)
    for b in budgets:
        t.add_row(b.dataset, b.analyst, f"{b.epsilon:g}", f"{b.spent_epsilon:.6g}", f"{b.delta:g}", f"{b.spent_delta:.3g}")
    console.print(t)


@admin_app.command("verify-log")
def verify_log(
    ledger: LedgerOption = _DEFAULT,
    head: Annotated[str | None, typer.Option("--head", help="A head hash printed by an earlier verify-log: also detect entries cut from the end.")] = None,
    as_json: JsonOption = False,
) -> None:
    """Verify the audit log's hash chain and the ledger's totals; print the head hash to keep."""
    service = _open(ledger)
    try:
        try:
            report = service.verify_log(head=head)
            unlogged = service.unlogged_spends()
        except DPError as exc:
            if as_json:
                typer.echo(json.dumps({"ok": False, "error": str(exc)}))
                raise typer.Exit(1) from None
            _fail(f"verification FAILED: {exc}")
    finally:
        service.close()
    if as_json:
        typer.echo(json.dumps({"ok": True, "entries": report.entries, "head": report.head, "unlogged_spends": unlogged}))
        return
    typer.echo(f"audit log OK: {report.entries} entries, hash chain intact; ledger totals match their spends")
    typer.echo(f"head: {report.head}  (keep it elsewhere; pass --head to detect entries cut from the end)")
    if unlogged:
        typer.echo(f"note: {len(unlogged)} debit(s) without an audit entry (the server stopped after paying and before answering; no answer was sent): spends {unlogged[:10]}")


def serve(
    ledger: LedgerOption = _DEFAULT,
    host: Annotated[str, typer.Option("--host", help="Interface to listen on (loopback by default; put TLS in front for anything else).")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", min=1, max=65535)] = 8000,
    rate: Annotated[float, typer.Option("--rate", help="Requests per second allowed per principal (average), per worker.")] = 20.0,
    burst: Annotated[int, typer.Option("--burst", min=1, help="Requests a principal may make at once, per worker.")] = 100,
    max_body: Annotated[int, typer.Option("--max-body", min=1024, help="Largest request body accepted, in bytes.")] = 64 * 1024,
    workers: Annotated[int, typer.Option("--workers", min=1, max=64, help="Server processes (each holds its own copy of the datasets and its own rate limits).")] = 1,
) -> None:
    """Run the curator service: the /v1 API and the dashboard at http://HOST:PORT/."""
    try:
        import uvicorn

        from dpkit.server.app import ServerConfig, create_app
    except ImportError:
        _fail("dpkit serve needs the server extra: pip install 'dpkit[server]'")
    try:
        config = ServerConfig(ledger=ledger, rate=rate, burst=burst, max_body_bytes=max_body)
        # One worker serves this app; with several, this one only checks the ledger opens (each
        # worker builds its own), so a bad --ledger fails here with a clear message.
        app = create_app(config)
    except DPError as exc:
        _fail(str(exc))
    if host not in ("127.0.0.1", "localhost", "::1"):
        Console(stderr=True).print(f"[yellow]warning:[/] listening on {host}: API keys travel in headers, so serve this only behind TLS")
    Console(stderr=True).print(f"dpkit curator on http://{host}:{port}/ (ledger {masked_url(ledger)}, {workers} worker(s)); Ctrl-C to stop")
    log_level = os.environ.get("DPKIT_LOG_LEVEL", "warning")
    if workers == 1:
        uvicorn.run(app, host=host, port=port, log_level=log_level, server_header=False)
        return
    app.state.service.close()
    # Several processes: uvicorn imports the app factory in each, which reads the configuration
    # from the environment. The ledger and the audit chain are safe across processes.
    os.environ[_CONFIG_ENV] = json.dumps(config.__dict__)
    uvicorn.run("dpkit.server.cli:app_from_environment", factory=True, workers=workers, host=host, port=port, log_level=log_level, server_header=False)


_CONFIG_ENV = "DPKIT_SERVER_CONFIG"


def app_from_environment() -> Any:
    """The app of one worker of ``dpkit serve --workers N`` (configuration in the environment)."""
    from dpkit.server.app import ServerConfig, create_app

    return create_app(ServerConfig(**json.loads(os.environ[_CONFIG_ENV])))
