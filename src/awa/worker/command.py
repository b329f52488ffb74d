"""``awa worker module:client``: run the worker of an AsyncClient defined in your code.

The first SIGTERM or SIGINT starts a graceful shutdown (no new claims; running handlers get
``--shutdown-timeout`` seconds); a second one interrupts what is still running, and those
jobs go back to their queue.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import os
import signal
import sys
from typing import Any

import click

import awa
from awa.cli import CliError, database_url_from_context, main

log = logging.getLogger("awa.worker")


def load_client(target: str) -> awa.AsyncClient:
    """Import ``module:attribute`` (the attribute an AsyncClient, or a function returning
    one) with the current directory on the import path."""
    module_name, _, attribute = target.partition(":")
    if not module_name or not attribute:
        raise CliError(f"expected module:attribute (e.g. myapp.jobs:client), got {target!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise CliError(f"cannot import {module_name!r}: {error}") from error
    value: Any = getattr(module, attribute, None)
    if value is None:
        raise CliError(f"module {module_name!r} has no attribute {attribute!r}")
    if callable(value) and not isinstance(value, awa.AsyncClient):
        value = value()
    if not isinstance(value, awa.AsyncClient):
        raise CliError(f"{target} is a {type(value).__name__}, not an awa.AsyncClient")
    return value


def parse_queue_option(values: tuple[str, ...]) -> dict[str, int] | None:
    if not values:
        return None
    queues: dict[str, int] = {}
    for value in values:
        name, _, workers = value.partition("=")
        try:
            queues[name] = int(workers) if workers else 10
        except ValueError:
            raise CliError(f"--queue takes NAME or NAME=MAX_WORKERS, got {value!r}") from None
    return queues


async def serve(
    client: awa.AsyncClient, queues: dict[str, int] | None, shutdown_timeout: float
) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    signals = 0
    main_task = asyncio.current_task()
    assert main_task is not None

    def on_signal(signum: int) -> None:
        nonlocal signals
        signals += 1
        if signals == 1:
            log.info("%s received: shutting down gracefully", signal.Signals(signum).name)
            stop.set()
        else:
            log.warning("second signal: interrupting running handlers")
            main_task.cancel()

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, on_signal, signum)
    try:
        await client.start(queues)
        await stop.wait()
        await client.shutdown(timeout=shutdown_timeout)
    except asyncio.CancelledError:
        await client.shutdown(timeout=0)
    finally:
        await client.close()


@main.command()
@click.argument("target", metavar="MODULE:CLIENT")
@click.option(
    "--queue",
    "queue_options",
    multiple=True,
    metavar="NAME[=N]",
    help="Queue to work, with its max concurrent handlers (repeatable). Default: every queue "
    "the client's tasks declare.",
)
@click.option(
    "--shutdown-timeout",
    default=30.0,
    show_default=True,
    help="Seconds running handlers get to finish after SIGTERM/SIGINT.",
)
@click.option("--log-level", default="INFO", show_default=True, help="Python logging level.")
@click.pass_context
def worker(
    ctx: click.Context,
    target: str,
    queue_options: tuple[str, ...],
    shutdown_timeout: float,
    log_level: str,
) -> None:
    """Run the worker of the AsyncClient at MODULE:CLIENT (e.g. myapp.jobs:client)."""
    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    url = database_url_from_context(ctx)
    if url:
        os.environ["DATABASE_URL"] = url  # a client built without a URL reads it
    client = load_client(target)
    asyncio.run(serve(client, parse_queue_option(queue_options), shutdown_timeout))
