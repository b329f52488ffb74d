"""Run a client's worker until SIGTERM or SIGINT, then shut it down gracefully.

The same contract as ``awa worker``: the first signal stops claiming and gives running
handlers ``shutdown_timeout`` seconds; a second one interrupts them, and their jobs go back
to their queue.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Callable
from typing import Any

from awa.client.asyncio_client import AsyncClient

log = logging.getLogger("awa.worker")


async def serve(
    client: AsyncClient,
    queues: Any,
    runtime: dict[str, Any],
    shutdown_timeout: float,
    on_started: Callable[[], None] | None = None,
) -> None:
    """Start ``client``'s worker on ``queues``, run until a signal, then shut down and
    close the client. ``on_started`` is called once the worker runs."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    main_task = asyncio.current_task()
    assert main_task is not None
    signals = 0

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
        await client.start(queues, **runtime)
        if on_started is not None:
            on_started()
        await stop.wait()
        await client.shutdown(timeout=shutdown_timeout)
    except asyncio.CancelledError:
        await client.shutdown(timeout=0)
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
        await client.close()
