"""``awa worker module:client``: run the worker of an AsyncClient defined in your code.

The first SIGTERM or SIGINT starts a graceful shutdown (no new claims; running handlers get
``--shutdown-timeout`` seconds); a second one interrupts what is still running, and those
jobs go back to their queue. Settings come from flags, ``AWA_*`` environment variables or a
TOML file (``awa.worker.settings``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from pathlib import Path
from typing import Any

import click

import awa
from awa.cli.group import CliError, database_url_from_context, load_client, main
from awa.core.extras import require_extra
from awa.observability.log_format import configure as configure_logging
from awa.worker import settings as worker_settings
from awa.worker.config import RuntimeConfig
from awa.worker.settings import RUNTIME_HELP, RUNTIME_KEYS, runtime_envvar, runtime_flag

log = logging.getLogger("awa.worker")

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


async def serve(
    client: awa.AsyncClient,
    queues: dict[str, Any] | None,
    runtime: dict[str, Any],
    timeout: float,
    metrics: tuple[str, int] | None = None,
) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    signals = 0
    stopping = False
    hurrying: list[asyncio.Task[None]] = []
    main_task = asyncio.current_task()
    assert main_task is not None

    def on_signal(signum: int) -> None:
        nonlocal signals
        signals += 1
        if signals == 1:
            log.info("%s received: shutting down gracefully", signal.Signals(signum).name)
            stop.set()
        elif stopping:
            # The graceful shutdown is under way: cut its wait short, let it finish the
            # rest (requeue what was running, remove this worker from awa.runtimes).
            log.warning("second signal: interrupting running handlers")
            hurrying.append(loop.create_task(client.shutdown(timeout=0)))
        else:
            log.warning("second signal: interrupting running handlers")
            main_task.cancel()

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, on_signal, signum)
    endpoint = None
    if metrics is not None:
        from awa.observability.endpoint import EndpointServer, install_prometheus

        if not install_prometheus():
            log.info("metrics: the application's MeterProvider is kept (give it a reader)")
        endpoint = EndpointServer(client, *metrics)
        endpoint.start()
        log.info("metrics on http://%s:%d/metrics (/healthz, /readyz)", metrics[0], endpoint.port)
    try:
        await client.start(queues, **runtime)
        await stop.wait()
        stopping = True
        await client.shutdown(timeout=timeout)
    except asyncio.CancelledError:
        await client.shutdown(timeout=0)
    finally:
        if endpoint is not None:
            await endpoint.stop()
        await client.close()


def _runtime_options(command: Any) -> Any:
    """One flag (and AWA_* environment variable) per runtime setting of ``start()``."""
    defaults = RuntimeConfig()
    for name in sorted(RUNTIME_KEYS, reverse=True):
        default = getattr(defaults, name)
        shown = "none" if default is None else f"{default:g}"
        command = click.option(
            runtime_flag(name),
            f"runtime_{name}",
            envvar=runtime_envvar(name),
            show_envvar=True,
            metavar="VALUE",
            help=f"{RUNTIME_HELP[name]}  [default: {shown}]",
        )(command)
    return command


@main.command(context_settings={"max_content_width": 100})
@click.argument("target", metavar="MODULE:CLIENT", required=False)
@click.option(
    "--queue",
    "queue_options",
    multiple=True,
    envvar="AWA_QUEUES",
    show_envvar=True,
    metavar="NAME[=N]",
    help="Queue to run, with its max concurrent handlers (repeatable). Default: every queue "
    "the client's tasks declare. Other processes may run the other queues.",
)
@click.option(
    "--queue-option",
    "queue_settings",
    multiple=True,
    envvar="AWA_QUEUE_OPTIONS",
    show_envvar=True,
    metavar="QUEUE.KEY=VALUE",
    help="A setting of one queue (repeatable): max_workers, poll_interval, deadline_duration "
    "(0: none), claim_batch_size, prefetch, retry.base, retry.jitter, retry.max_delay, and "
    "flow control: rate_limit (RATE or RATE/BURST), global_max_running, key_concurrency, "
    "min_workers, weight.",
)
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False, path_type=Path),
    envvar="AWA_CONFIG",
    show_envvar=True,
    help="A TOML settings file ([worker] and [queues.NAME] tables; see docs/operations.md).",
)
@click.option(
    "--shutdown-timeout",
    type=click.FloatRange(min=0),
    envvar="AWA_SHUTDOWN_TIMEOUT",
    show_envvar=True,
    help="Seconds running handlers get to finish after SIGTERM/SIGINT.  [default: 30]",
)
@click.option(
    "--log-level",
    type=click.Choice(LOG_LEVELS, case_sensitive=False),
    envvar="AWA_LOG_LEVEL",
    show_envvar=True,
    help="Python logging level.  [default: INFO]",
)
@click.option(
    "--log-format",
    type=click.Choice(["text", "json"]),
    envvar="AWA_LOG_FORMAT",
    show_envvar=True,
    help="text: human-readable lines; json: one JSON object per line (timestamp, level, "
    "logger, message, job_id, kind, queue, attempt).  [default: text]",
)
@click.option(
    "--metrics-port",
    type=click.IntRange(0, 65535),
    envvar="AWA_METRICS_PORT",
    show_envvar=True,
    help="Serve /metrics (Prometheus), /healthz and /readyz on this port (0: any free port; "
    "needs the metrics extra).",
)
@click.option(
    "--metrics-host",
    envvar="AWA_METRICS_HOST",
    show_envvar=True,
    help="The address the metrics endpoint listens on.  [default: 0.0.0.0]",
)
@_runtime_options
@click.pass_context
def worker(
    ctx: click.Context,
    /,
    target: str | None,
    queue_options: tuple[str, ...],
    queue_settings: tuple[str, ...],
    config_path: Path | None,
    shutdown_timeout: float | None,
    log_level: str | None,
    log_format: str | None,
    metrics_port: int | None,
    metrics_host: str | None,
    **runtime: str | None,
) -> None:
    """Run the worker of the AsyncClient at MODULE:CLIENT (e.g. myapp.jobs:client).

    Every setting of start() is a flag below, an AWA_* environment variable, or a key of
    the --config file; a flag or variable wins over the file.
    """
    settings = worker_settings.resolve(
        config=config_path,
        client=target,
        queues=queue_options,
        queue_options=queue_settings,
        runtime={name.removeprefix("runtime_"): text for name, text in runtime.items()},
        shutdown_timeout=shutdown_timeout,
        log_level=log_level,
        log_format=log_format,
        metrics_port=metrics_port,
        metrics_host=metrics_host,
    )
    if settings.log_level.upper() not in LOG_LEVELS:
        raise CliError(
            f"log_level must be one of {', '.join(LOG_LEVELS)}, got {settings.log_level!r}"
        )
    settings.check()
    if settings.client is None:
        raise click.UsageError("give MODULE:CLIENT (or client = ... in the --config file)")
    if settings.metrics_port is not None:
        require_extra("metrics", "awa worker --metrics-port")
    configure_logging(settings.log_level, settings.log_format)
    url = database_url_from_context(ctx)
    if url:
        os.environ["DATABASE_URL"] = url  # a client built without a URL reads it
    client = load_client(settings.client)
    queues = settings.start_queues(client._tasks.queues())
    metrics = None
    if settings.metrics_port is not None:
        metrics = (settings.metrics_host, settings.metrics_port)
    asyncio.run(serve(client, queues, settings.runtime, settings.shutdown_timeout, metrics))
