"""Live queue overrides on the worker side: each runtime reads the overrides of the queues
it runs (one primary-key lookup per queue in ``awa.queue_overrides``) when the listener
hears ``awa_overrides`` and every ``override_refresh_interval`` seconds anyway, and gives a
queue's dispatcher its effective settings (the configured ones with the stored overrides
over them) when they change. The claim reads the settings its dispatcher holds: no query
is added to the claim path. ``paused`` is not applied here: an override pauses the queue
in ``awa.queues``, which every claim already checks.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Callable, Iterable, Mapping
from contextlib import AbstractAsyncContextManager
from typing import Any

import psycopg

from awa.core.outage import FailureLog
from awa.errors import ValidationError
from awa.observability import metrics
from awa.overrides.operations import applicable
from awa.sql import query
from awa.storage.db import translate_errors
from awa.worker.config import QueueConfig
from awa.worker.limits import store_limits

log = logging.getLogger("awa.worker")

Connect = Callable[[], AbstractAsyncContextManager[psycopg.AsyncConnection[Any]]]


def effective(configured: QueueConfig, settings: Mapping[str, Any]) -> QueueConfig:
    """The settings a queue runs with: the configured ones, with ``settings`` over them."""
    changes = dict(settings)
    if changes.get("global_max_running") is not None and configured.prefetch:
        # Prefetched jobs count as running while they wait: under a cap they would hold
        # places that other workers could use (as when the cap is configured).
        changes["prefetch"] = 0
    return dataclasses.replace(configured, **changes) if changes else configured


class OverrideWatcher:
    """Keeps each queue's dispatcher on its effective settings (``apply`` receives them)."""

    def __init__(
        self,
        connect: Connect,
        configured: Iterable[QueueConfig],
        apply: Callable[[QueueConfig], None],
        interval: float,
    ) -> None:
        self._connect = connect
        self._configured = {queue.name: queue for queue in configured}
        self._apply = apply
        self._interval = interval
        self._applied: dict[str, dict[str, Any]] = {}
        self._wake = asyncio.Event()
        self._failures = FailureLog(log, "reading queue overrides")

    @property
    def overridden(self) -> dict[str, dict[str, Any]]:
        """The overridden settings applied now, by queue."""
        return self._applied

    def notify(self, queue: str) -> None:
        """An operator changed ``queue``'s overrides (or the listener reconnected: ``""``)."""
        if not queue or queue in self._configured:
            self._wake.set()

    async def refresh(self) -> None:
        """Read the queues' overrides and apply those that changed."""
        names = list(self._configured)
        with translate_errors():
            async with self._connect() as conn:
                cursor = await conn.execute(query("overrides_for_worker"), {"queues": names})
                stored = {row[0]: row[1] for row in await cursor.fetchall()}
                changed = self._changed(stored)
                # The limits operators see (awa queue stats) follow the override.
                await store_limits(conn, [config for config, _ in changed], warn=False)
        for config, raw in changed:
            name = config.name
            self._apply(config)
            if raw:
                self._applied[name] = raw
                log.info("queue %s: running with overrides %s", name, _shown(raw))
            else:
                self._applied.pop(name, None)
                log.info("queue %s: overrides cleared, back to its configured settings", name)
            metrics.overrides_applied.add(1, {metrics.QUEUE: name})

    def _changed(self, stored: Mapping[str, Any]) -> list[tuple[QueueConfig, dict[str, Any]]]:
        """The queues whose stored overrides differ from those applied: their effective
        settings, and the stored overrides."""
        changed = []
        for name, configured in self._configured.items():
            raw = stored.get(name, {})
            if raw == self._applied.get(name, {}):
                continue
            try:
                changed.append((effective(configured, applicable(raw)), raw))
            except ValidationError as error:
                log.warning("queue %s: ignoring its stored overrides %r: %s", name, raw, error)
        return changed

    async def run(self) -> None:
        """Refresh on each notification and every interval (after a first ``refresh()``),
        until cancelled."""
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._interval):
                    await self._wake.wait()
            self._wake.clear()
            try:
                await self.refresh()
                self._failures.succeeded()
            except Exception as error:
                self._failures.failed(error, then="keeping the settings applied so far")


def _shown(settings: Mapping[str, Any]) -> str:
    return ", ".join(f"{name}={value}" for name, value in sorted(settings.items()))


def observed(config: QueueConfig, overridden: Mapping[str, Any]) -> list[tuple[str, float, bool]]:
    """A queue's effective settings for the ``awa.queue.setting`` gauge: (name, value,
    whether an override set it), leaving out limits it does not have."""
    rate, burst = config.rate_limit if config.rate_limit is not None else (None, None)
    values: dict[str, tuple[str, float | None]] = {
        "rate": ("rate_limit", rate),
        "burst": ("rate_limit", burst),
        "global_max_running": ("global_max_running", config.global_max_running),
        "key_concurrency": ("key_concurrency", config.key_concurrency),
        "claim_batch_size": ("claim_batch_size", config.claim_batch_size),
        "poll_interval": ("poll_interval", config.poll_interval),
        "deadline_duration": ("deadline_duration", config.deadline_duration),
    }
    return [
        (name, float(value), setting in overridden)
        for name, (setting, value) in values.items()
        if value is not None
    ]
