"""Fleet-wide flow control on the worker side: the claim of a queue, through its limits when
it has any, the limits stored for operators at start, and the leader's priority aging.

A queue with a rate limit, a cap on running jobs or a per-key limit claims through
``awa.claim_limited`` (migration 0004), which locks the queue's row of ``awa.queue_limits``
before it counts and grants, so the limits hold across every worker in one round trip per
claim. When a limit held jobs back, the claim says how long to wait before asking again.
A queue without limits claims with the plain statement and pays nothing.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
from collections.abc import Iterable
from typing import Any

import psycopg
from psycopg.rows import tuple_row

from awa.core.duty import Duty
from awa.dlq.operations import store_settings_statement
from awa.sql import query
from awa.storage.db import run_async
from awa.worker.config import QueueConfig
from awa.worker.lanes import LanePositions, claim_statement

log = logging.getLogger("awa.worker")

# Rows of claim_limited: the 27 columns of claim_jobs, then retry_after.
_RETRY_AFTER = 27

# Claim parameters that read every lane of a queue from its head.
HEADS: dict[str, list[int | None]] = {"after_us": [None] * 4, "after_id": [None] * 4}

# The shortest wait a limited claim asks for, so that a drained bucket is not polled hot.
MIN_RETRY_AFTER = 0.005

# Available jobs whose priority one aging pass raises, at most.
AGING_BATCH = 1000


@dataclasses.dataclass(frozen=True, slots=True)
class Claimed:
    """A claim's rows, and how long to wait before claiming again when a limit held jobs
    back (None: nothing was held back)."""

    rows: list[tuple[Any, ...]]
    retry_after: float | None = None


def limit_params(queue: QueueConfig) -> dict[str, Any]:
    rate, burst = queue.rate_limit if queue.rate_limit is not None else (None, None)
    return {
        "queue": queue.name,
        "rate": rate,
        "burst": burst,
        "max_running": queue.global_max_running,
        "key_concurrency": queue.key_concurrency,
    }


async def claim(
    conn: psycopg.AsyncConnection[Any],
    queue: QueueConfig,
    limit: int,
    lanes: LanePositions,
    kinds: list[str],
) -> Claimed:
    """Claim up to ``limit`` jobs of ``queue`` and of ``kinds`` (those this worker has
    handlers for), within its limits, reading its lanes from where ``lanes`` says (and moving
    them past what was claimed)."""
    deadline = dt.timedelta(seconds=queue.deadline_duration)
    # A claim under a per-key limit skips the jobs whose key is full: no position past
    # them is safe, so such a queue reads its lanes from their heads.
    keyed = queue.key_concurrency is not None
    priorities = lanes.start_claim()
    if not priorities and not queue.limited:
        lanes.claimed([], emptied=False)  # every lane was found empty, none announced since
        return Claimed([])
    try:
        async with conn.cursor(row_factory=tuple_row, binary=True) as cursor:
            if not queue.limited:
                params = {
                    "queue": queue.name,
                    "limit": limit,
                    "deadline": deadline,
                    "kinds": kinds,
                    **lanes.params(priorities),
                }
                statement = claim_statement(priorities, max(queue.claim_batch_size, limit))
                await cursor.execute(statement, params)
                claimed = Claimed(await cursor.fetchall())
                lanes.claimed(claimed.rows, emptied=len(claimed.rows) < limit)
                return claimed
            positions = HEADS if keyed else lanes.arrays()
            params = {
                **limit_params(queue),
                "limit": limit,
                "deadline": deadline,
                "kinds": kinds,
                **positions,
            }
            await cursor.execute(query("claim_limited"), params)
            rows = await cursor.fetchall()
    except BaseException:
        lanes.failed()
        raise
    retry_after = None
    jobs = []
    for row in rows:
        if row[0] is None:
            retry_after = max(float(row[_RETRY_AFTER]), MIN_RETRY_AFTER)
        else:
            jobs.append(row[:_RETRY_AFTER])
    # A limit may have held jobs back: the lanes are not known to be empty.
    lanes.claimed([] if keyed else jobs, emptied=False)
    return Claimed(jobs, retry_after)


async def store_dlq_settings(
    conn: psycopg.AsyncConnection[Any], queues: Iterable[QueueConfig], default: bool
) -> None:
    """Record whether each queue moves jobs that fail for good to the dead-letter queue: the
    trigger that moves them reads it, whichever process fails the job (a rescue by the
    leader, a callback answered elsewhere)."""
    enabled = {
        queue.name: default if queue.dlq_enabled is None else queue.dlq_enabled for queue in queues
    }
    for name, was in await run_async(conn, store_settings_statement(enabled)):
        log.info(
            "queue %s: dead-letter queue turned %s (was %s)",
            name,
            "on" if enabled[name] else "off",
            "on" if was else "off",
        )


async def store_retention(
    conn: psycopg.AsyncConnection[Any], queues: Iterable[QueueConfig]
) -> None:
    """Record the queues' own retention for the leader (any worker's leader deletes)."""
    for queue in queues:
        if queue.completed_retention is None and queue.failed_retention is None:
            await conn.execute(query("queue_retention_clear"), {"queue": queue.name})
        else:
            params = {
                "queue": queue.name,
                "completed": queue.completed_retention,
                "failed": queue.failed_retention,
            }
            await conn.execute(query("queue_retention_store"), params)


async def store_limits(
    conn: psycopg.AsyncConnection[Any], queues: Iterable[QueueConfig], *, warn: bool = True
) -> None:
    """Record the limits this worker runs its queues with (the last worker to start, or to
    apply a live override, is what operators see; each worker claims by its own). A change
    at start is logged (``warn``), since workers that disagree each apply their own limits;
    one that a live override made is the same for every worker."""
    for queue in queues:
        if not queue.limited:
            await conn.execute(query("limits_clear"), {"queue": queue.name})
            continue
        params = limit_params(queue)
        cursor = await conn.execute(query("limits_store"), params)
        row = await cursor.fetchone()
        if row is None:
            continue
        previous = _limits(*row)
        current = _limits(*(params[key] for key in _LIMIT_KEYS))
        if warn and previous != current:
            log.warning(
                "queue %s: flow limits changed from %s to %s (rate, burst, global_max_running, "
                "key_concurrency); workers still running the old ones keep them until restarted",
                queue.name,
                _shown(previous),
                _shown(current),
            )


_LIMIT_KEYS = ("rate", "burst", "max_running", "key_concurrency")


def _limits(
    rate: float | None, burst: int | None, max_running: int | None, key_concurrency: int | None
) -> tuple[float | None, int | None, int | None, int | None]:
    """Limits in one form for comparing: ``(20, 5)`` and ``(20.0, 5)`` are the same limits
    (the rate column is a double, the others integers)."""
    return (
        None if rate is None else float(rate),
        None if burst is None else int(burst),
        None if max_running is None else int(max_running),
        None if key_concurrency is None else int(key_concurrency),
    )


def _shown(limits: tuple[float | None, int | None, int | None, int | None]) -> str:
    return "({})".format(",".join("" if value is None else f"{value:g}" for value in limits))


def aging_duty(interval: float) -> Duty:
    """Raise by one level the priority of available jobs that waited ``interval`` or more."""
    waited = dt.timedelta(seconds=interval)

    async def age(conn: psycopg.AsyncConnection[Any]) -> None:
        await conn.execute(query("age_priorities"), {"interval": waited, "limit": AGING_BATCH})

    return Duty("priority aging", interval, age)
