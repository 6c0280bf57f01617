"""``dpkit serve``: run the curator service (one worker process, or a supervisor of several).

The command's flags are the fields of :class:`dpkit.server.app.ServerConfig`; the admin commands
are in :mod:`dpkit.server.cli`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from dpkit.analytics.limits import QueryLimits
from dpkit.errors import DPError
from dpkit.server import curator_log
from dpkit.server.cli import (
    _DEFAULT,
    LedgerOption,
    SparkConfOption,
    SparkMasterOption,
    _fail,
    _fail_error,
    _spark_options,
)

__all__ = ["serve", "app_from_environment"]


def serve(
    ledger: LedgerOption = _DEFAULT,
    host: Annotated[
        str,
        typer.Option(
            "--host", help="Interface to listen on (loopback by default; put TLS in front for anything else)."
        ),
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", min=1, max=65535)] = 8000,
    rate: Annotated[
        float, typer.Option("--rate", help="Requests per second allowed per principal (average), per worker.")
    ] = 20.0,
    burst: Annotated[
        int, typer.Option("--burst", min=1, help="Requests a principal may make at once, per worker.")
    ] = 100,
    max_body: Annotated[int, typer.Option("--max-body", min=1024, help="Largest request body accepted, in bytes.")] = 64
    * 1024,
    workers: Annotated[
        int,
        typer.Option(
            "--workers", min=1, max=64, help="Server processes (each with its own rate limits and connection cap)."
        ),
    ] = 1,
    address_rate: Annotated[
        float,
        typer.Option(
            "--address-rate",
            help="Refused (401) requests per second allowed per client address before it gets 429, per worker.",
        ),
    ] = 1.0,
    address_burst: Annotated[
        int,
        typer.Option("--address-burst", min=1, help="Refused requests a client address may make at once, per worker."),
    ] = 30,
    header_timeout: Annotated[
        float, typer.Option("--header-timeout", help="Seconds a client has to send a request's headers.")
    ] = 10.0,
    body_timeout: Annotated[
        float, typer.Option("--body-timeout", help="Seconds a client has to send a request's body (else 408).")
    ] = 30.0,
    max_connections: Annotated[
        int,
        typer.Option(
            "--max-connections", min=1, help="Open connections accepted per worker (more are closed at once)."
        ),
    ] = 1000,
    max_connections_per_address: Annotated[
        int,
        typer.Option(
            "--max-connections-per-address",
            min=1,
            help="Open connections accepted per client address, per worker (more are closed at once).",
        ),
    ] = 64,
    write_timeout: Annotated[
        float,
        typer.Option(
            "--write-timeout",
            help="Seconds a client has to take the answer waiting for it (else the connection is closed).",
        ),
    ] = 30.0,
    data_root: Annotated[
        Path | None,
        typer.Option(
            "--data-root",
            help="Datasets may be registered only from under this directory (default: the current directory).",
        ),
    ] = None,
    max_grant_epsilon: Annotated[
        float,
        typer.Option("--max-grant-epsilon", help="The largest ε the curator may grant one analyst on one dataset."),
    ] = 10.0,
    audit_key: Annotated[
        Path | None,
        typer.Option("--audit-key", help="The file holding the audit chain's key (keep it outside the database)."),
    ] = None,
    dataset_dir: Annotated[
        Path | None,
        typer.Option(
            "--dataset-dir",
            help="Where registered datasets are kept for the workers to share (default: beside the ledger).",
        ),
    ] = None,
    engine_threads: Annotated[
        int | None,
        typer.Option(
            "--engine-threads", min=1, help="DuckDB threads per query (default: the cores divided among the workers)."
        ),
    ] = None,
    spark_master: SparkMasterOption = None,
    spark_conf: SparkConfOption = None,
    max_keys: Annotated[
        int, typer.Option("--max-keys", min=1, help="Largest product of public group-by keys one query may have.")
    ] = QueryLimits.max_keys,  # the class's defaults: an instance's checks load numpy
    max_result_rows: Annotated[
        int, typer.Option("--max-result-rows", min=1, help="Most rows one answer may hold.")
    ] = QueryLimits.max_result_rows,
    max_response_bytes: Annotated[
        int, typer.Option("--max-response-bytes", min=1, help="Largest answer, in bytes (estimated before paying).")
    ] = QueryLimits.max_response_bytes,
    max_query_depth: Annotated[
        int,
        typer.Option(
            "--max-query-depth", min=1, help="Deepest nesting of parentheses and boolean operators in a query."
        ),
    ] = QueryLimits.max_query_depth,
    answer_seconds: Annotated[
        float,
        typer.Option(
            "--answer-seconds",
            help="Time budget of one simple aggregate on a 'medium' dataset: every paid answer leaves at its budget.",
        ),
    ] = 0.5,
    synth_seconds: Annotated[
        float,
        typer.Option(
            "--synth-seconds", help="Time budget of a synthetic table on a 'medium' dataset (up to 10 rounds)."
        ),
    ] = 60.0,
    heavy_threads: Annotated[
        int,
        typer.Option(
            "--heavy-threads",
            min=1,
            help="Threads computing paid answers (each holds its answer until its time), per worker.",
        ),
    ] = 64,
    max_concurrent: Annotated[
        int,
        typer.Option("--max-concurrent", min=1, help="Paid requests one principal may have in progress, per worker."),
    ] = 8,
    cpu_seconds_per_hour: Annotated[
        float,
        typer.Option(
            "--cpu-seconds-per-hour", help="Seconds of answer time (budgets) per principal and hour, per worker."
        ),
    ] = 3600.0,
    max_release_bytes: Annotated[
        int, typer.Option("--max-release-bytes", min=1, help="Bytes of releases one publisher may store in all.")
    ] = 64 * 1024 * 1024,
    downloads_per_hour: Annotated[
        int, typer.Option("--downloads-per-hour", min=1, help="Release downloads per principal and hour, per worker.")
    ] = 600,
    max_synth_rounds: Annotated[
        int, typer.Option("--max-synth-rounds", min=1, help="Most measurement rounds of one synthetic table.")
    ] = 100,
    max_synth_cells: Annotated[
        int,
        typer.Option(
            "--max-synth-cells", min=1, help="Most cells over a synthetic table's one- and two-way marginals."
        ),
    ] = 1_000_000,
    idempotency_seconds: Annotated[
        float,
        typer.Option(
            "--idempotency-seconds", help="How long a paid request's Idempotency-Key and its answer are kept."
        ),
    ] = 86_400.0,
    max_idempotency_keys: Annotated[
        int,
        typer.Option(
            "--max-idempotency-keys", min=1, help="Idempotency keys kept per principal (the oldest answered dropped)."
        ),
    ] = 1000,
) -> None:
    """Run the curator service: the /v1 API and the dashboard at http://HOST:PORT/."""
    # The service's log: the curator's details beside uvicorn's, from the app's creation on.
    curator_log.log_to_stderr(os.environ.get("DPKIT_LOG_LEVEL", "warning"))
    spark = _spark_options(spark_master, spark_conf)
    try:
        from dpkit.server.app import ServerConfig, create_app
        from dpkit.server.processes import PortInUseError
        from dpkit.server.serving import serve as run_server
    except ImportError:
        _fail("dpkit serve needs the server extra: pip install 'dpkit[server]'")
    try:
        config = ServerConfig(
            ledger=ledger,
            rate=rate,
            burst=burst,
            max_body_bytes=max_body,
            address_rate=address_rate,
            address_burst=address_burst,
            header_timeout=header_timeout,
            body_timeout=body_timeout,
            max_connections=max_connections,
            max_connections_per_address=max_connections_per_address,
            write_timeout=write_timeout,
            # Resolved now, so that every worker uses the same directories whatever its own.
            data_root=str((data_root or Path.cwd()).expanduser().resolve()),
            max_grant_epsilon=max_grant_epsilon,
            audit_key=None if audit_key is None else str(audit_key.expanduser().resolve()),
            dataset_dir=None if dataset_dir is None else str(dataset_dir.expanduser().resolve()),
            max_keys=max_keys,
            max_result_rows=max_result_rows,
            max_response_bytes=max_response_bytes,
            max_query_depth=max_query_depth,
            answer_seconds=answer_seconds,
            synth_seconds=synth_seconds,
            heavy_threads=heavy_threads,
            max_concurrent=max_concurrent,
            cpu_seconds_per_hour=cpu_seconds_per_hour,
            max_release_bytes=max_release_bytes,
            downloads_per_hour=downloads_per_hour,
            max_synth_rounds=max_synth_rounds,
            max_synth_cells=max_synth_cells,
            idempotency_seconds=idempotency_seconds,
            max_idempotency_keys=max_idempotency_keys,
            **spark,
            # Workers share the cores: more engine threads than a worker's share only contend.
            engine_threads=engine_threads
            if engine_threads is not None or workers == 1
            else max(1, (os.cpu_count() or 1) // workers),
        )
        # One worker serves this app; with several, this one only checks the ledger opens (each
        # worker builds its own), so a bad --ledger fails here with a clear message.
        app = create_app(config)
    except DPError as exc:
        _fail_error(exc)
    if host not in ("127.0.0.1", "localhost", "::1"):
        Console(stderr=True).print(
            f"[yellow]warning:[/] listening on {host}: API keys travel in headers, so serve this only behind TLS"
        )
    from dpkit.server.store import masked_url

    Console(stderr=True).print(
        f"dpkit curator on http://{host}:{port}/ (ledger {masked_url(ledger)}, {workers} worker(s)); Ctrl-C to stop"
    )
    log_level = os.environ.get("DPKIT_LOG_LEVEL", "warning")
    limits = config.serving_limits()
    try:
        if workers == 1:
            run_server(app, host=host, port=port, log_level=log_level, **limits)
            return
        app.state.service.close()
        # Several processes: uvicorn imports the app factory in each, which reads the configuration
        # from the environment. The ledger and the audit chain are safe across processes.
        os.environ[_CONFIG_ENV] = json.dumps(config.__dict__)
        run_server(
            "dpkit.server.serve_command:app_from_environment",
            factory=True,
            workers=workers,
            host=host,
            port=port,
            log_level=log_level,
            **limits,
        )
    except PortInUseError as exc:  # (another server, or workers of a killed one, hold the port)
        _fail(str(exc))


_CONFIG_ENV = "DPKIT_SERVER_CONFIG"


def app_from_environment() -> Any:
    """The app of one worker of ``dpkit serve --workers N`` (configuration in the environment)."""
    from dpkit.server.app import ServerConfig, create_app

    curator_log.log_to_stderr(os.environ.get("DPKIT_LOG_LEVEL", "warning"))  # each worker's own log
    return create_app(ServerConfig(**json.loads(os.environ[_CONFIG_ENV])))
