"""LISTEN for new jobs and for cancellations, on one dedicated connection.

Channel ``awa_ready`` carries where newly inserted available jobs sit in their lane
(``"priority position_us id queue"``, see worker/lanes.py); ``awa_jobs`` carries the queue
name of jobs that became available otherwise; ``awa_cancel`` carries ``{"job_id",
"run_lease"}`` of a running attempt an operator cancelled; ``awa_overrides`` the queue whose
live overrides changed. When the connection drops,
workers fall back to polling until it is back, and every queue is woken (its lanes read
from their heads) on reconnect in case a notification was missed.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from typing import Any

import psycopg

from awa.core.outage import FailureLog
from awa.core.tasks import cancel_and_wait
from awa.sql import query
from awa.storage.db import connection_kwargs
from awa.worker.lanes import parse_ready

log = logging.getLogger("awa.worker")

JOBS_CHANNEL = "awa_jobs"
READY_CHANNEL = "awa_ready"
CANCEL_CHANNEL = "awa_cancel"
CALLBACKS_CHANNEL = "awa_callbacks"
OVERRIDES_CHANNEL = "awa_overrides"


class Listener:
    def __init__(
        self,
        url: str,
        *,
        application_name: str,
        on_jobs: Callable[[str], None],
        on_ready: Callable[[str, int, int, int], None],
        on_cancel: Callable[[int, int | None], None],
        on_callback: Callable[[int], None],
        on_overrides: Callable[[str], None],
        on_reconnect: Callable[[], None],
    ) -> None:
        self._url, self._application_name = url, application_name  # its own connection
        self._on_jobs = on_jobs
        self._on_ready = on_ready
        self._on_cancel = on_cancel
        self._on_callback = on_callback
        self._on_overrides = on_overrides
        self._on_reconnect = on_reconnect
        self._task: asyncio.Task[None] | None = None
        self._ready = asyncio.Event()
        self._failures = FailureLog(log, "notification listener")
        self.connected = False

    async def start(self) -> None:
        """Start listening; returns once LISTEN is in place (or the first attempt failed)."""
        self._task = asyncio.create_task(self._run(), name="awa-listener")
        await self._ready.wait()

    async def stop(self) -> None:
        await cancel_and_wait(self._task)

    async def _run(self) -> None:
        delay = 0.2
        first = True
        while True:
            try:
                conn = await psycopg.AsyncConnection.connect(
                    self._url, connect_timeout=10, **connection_kwargs(self._application_name)
                )
            except psycopg.Error as error:
                self._failures.failed(error, then="polling until it reconnects")
                self._ready.set()
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
                continue
            try:
                async with conn:
                    await conn.execute(query("listen_channels"))
                    self.connected = True
                    delay = 0.2
                    self._failures.succeeded()
                    if not first:
                        # A notification may have gone out while nobody listened.
                        self._on_reconnect()
                    first = False
                    self._ready.set()
                    async for notify in conn.notifies():
                        self._dispatch(notify.channel, notify.payload)
            except psycopg.Error as error:
                self._failures.failed(error, then="polling until it reconnects")
            finally:
                self.connected = False
            self._ready.set()
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)

    def _dispatch(self, channel: str, payload: str) -> None:
        if channel == READY_CHANNEL:
            ready = parse_ready(payload)
            if ready is None:
                log.warning("ignoring a malformed ready notification: %r", payload[:200])
            else:
                self._on_ready(*ready)
            return
        if channel == JOBS_CHANNEL:
            self._on_jobs(payload)
            return
        if channel == OVERRIDES_CHANNEL:
            self._on_overrides(payload)
            return
        if channel == CALLBACKS_CHANNEL:
            if payload.isdigit():
                self._on_callback(int(payload))
            return
        try:
            message: Any = json.loads(payload)
            job_id = int(message["job_id"])
            lease = message.get("run_lease")
            self._on_cancel(job_id, int(lease) if lease is not None else None)
        except (ValueError, KeyError, TypeError):
            log.warning("ignoring a malformed cancel notification: %r", payload)
