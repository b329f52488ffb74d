"""Periodic jobs on the worker side: storing the declared schedules, and the leader's duty
that enqueues their fires.

Every ``cron_interval`` (1 s) the maintenance leader reads the schedules that are not
paused, with the database clock, computes the fires due since each one's last fire (or its
registration) by its missed-fire policy (``awa.schedules``), and enqueues each fire with
one statement that moves ``last_enqueued_at`` from the value it read (a compare-and-swap)
and inserts the job. A fire another leader enqueued meanwhile matches nothing, so a fire is
enqueued once across failover, restarts and several deployments.
"""

from __future__ import annotations

import datetime as dt
import functools
import logging
from collections.abc import Iterable
from typing import Any

import psycopg
from psycopg.rows import dict_row

from awa.errors import ValidationError
from awa.insert import InsertRules
from awa.schedules import CronTimes, PeriodicJob, due_fires
from awa.sql import query
from awa.worker.maintenance import Duty

log = logging.getLogger("awa.maintenance")


async def store_schedules(
    conn: psycopg.AsyncConnection[Any], schedules: Iterable[PeriodicJob], rules: InsertRules
) -> None:
    """Insert the declared schedules, or update their definitions (never deleting others)."""
    for schedule in schedules:
        await conn.execute(query("cron_upsert"), schedule.upsert_params(rules))


@functools.lru_cache(maxsize=256)
def _times(expression: str, timezone: str) -> CronTimes | None:
    try:
        return CronTimes.of(expression, timezone)
    except ValidationError as error:
        log.error("a stored cron schedule cannot be evaluated: %s", error)
        return None


def cron_duty(interval: float) -> Duty:
    """Enqueue the due fires of every schedule that is not paused."""

    async def evaluate(conn: psycopg.AsyncConnection[Any]) -> None:
        async with conn.cursor(row_factory=dict_row) as cursor:
            await cursor.execute(query("cron_due"))
            schedules = await cursor.fetchall()
        for schedule in schedules:
            await _fire_due(conn, schedule)

    return Duty("cron", interval, evaluate)


async def _fire_due(conn: psycopg.AsyncConnection[Any], schedule: dict[str, Any]) -> None:
    times = _times(schedule["cron_expr"], schedule["timezone"])
    if times is None:
        return
    previous: dt.datetime | None = schedule["last_enqueued_at"]
    after = previous if previous is not None else schedule["created_at"]
    fires = due_fires(times, schedule["missed_fire_policy"], after, schedule["now"])
    for fire in fires:
        params = {
            "name": schedule["name"],
            "fire": fire,
            "previous": previous,
            "fire_text": fire.astimezone(dt.UTC).isoformat(),
        }
        cursor = await conn.execute(query("cron_fire"), params)
        if cursor.rowcount == 0:
            return  # fired (or paused, or removed) elsewhere meanwhile: read it again next time
        previous = fire
    if fires:
        log.debug("cron %s: enqueued %d fire(s)", schedule["name"], len(fires))
