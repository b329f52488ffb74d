"""The leader's queue samples (``awa.queue_samples``): taking one, and reading them into the
queue gauges."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

import psycopg
from psycopg.rows import dict_row

from awa.observability.metrics import QueueSample, set_queue_samples
from awa.sql import query


async def store_queue_samples(conn: psycopg.AsyncConnection[Any]) -> None:
    """Count every queue's jobs now and store the sample (the leader's duty; the UI's too
    when no leader has sampled for a while)."""
    await conn.execute(query("fold_done_counts"))
    await conn.execute(query("queue_samples_store"))


async def refresh_queue_samples(conn: psycopg.AsyncConnection[Any]) -> list[QueueSample]:
    """Read the last samples and publish them to the gauges; returns them."""
    async with conn.cursor(row_factory=dict_row) as cursor:
        await cursor.execute(query("queue_samples"))
        rows = await cursor.fetchall()
    samples = [
        QueueSample(
            row["queue"],
            {state: int(n) for state, n in row["counts"].items()},
            max(row["lag"] or 0.0, 0.0),
            max(row["sample_age"], 0.0),
            {kind: int(n) for kind, n in row["unserved_kinds"].items()},
        )
        for row in rows
    ]
    set_queue_samples(samples)
    return samples


async def keep_queue_samples(
    connection: Callable[[], AbstractAsyncContextManager[psycopg.AsyncConnection[Any]]],
    interval: float,
) -> None:
    """Refresh the queue gauges every ``interval`` seconds, for as long as it runs (a
    worker's background task); a failed read is retried at the next tick."""
    while True:
        with contextlib.suppress(Exception):
            async with connection() as conn:
                await refresh_queue_samples(conn)
        await asyncio.sleep(interval)
