"""Periodic jobs on the worker side: storing the declared schedules, and the leader's duty
that enqueues their fires.

Every ``cron_interval`` (1 s) the maintenance leader reads the schedules that are not
paused, with the database clock, computes the fires due since each one's last fire (or its
registration) by its missed-fire policy (``awa.periodic.jobs``), and enqueues each fire with
one statement that moves ``last_enqueued_at`` from the value it read (a compare-and-swap)
and inserts the job. A fire another leader enqueued meanwhile matches nothing, so a fire is
enqueued once across failover, restarts and several deployments.

A schedule that cannot fire (an expression or zone stored by another version or by hand,
an expression that never fires, a fire the database refuses) is skipped, logged once and
counted, and the others fire as usual; ``list_cron_jobs()`` shows why it cannot.
"""

from __future__ import annotations

import datetime as dt
import functools
import logging
from collections.abc import Iterable
from typing import Any

import psycopg
from psycopg.rows import dict_row

from awa.core.duty import Duty
from awa.core.outage import one_line
from awa.observability import metrics
from awa.periodic.jobs import CronTimes, PeriodicJob, due_fires, failure_text
from awa.producer.insert import InsertRules
from awa.sql import query

log = logging.getLogger("awa.maintenance")


async def store_periodic_jobs(
    conn: psycopg.AsyncConnection[Any], schedules: Iterable[PeriodicJob], rules: InsertRules
) -> None:
    """Insert the declared schedules, or update their definitions (never deleting others)."""
    for schedule in schedules:
        await conn.execute(query("periodic_upsert"), schedule.upsert_params(rules))


# Parsed schedules by (expression, zone); only those that parse are kept.
_times = functools.lru_cache(maxsize=256)(CronTimes.of)


class FireFailures:
    """The schedules the leader could not fire, with their error: each failure is counted
    (``awa.cron.schedule_errors``), logged when a schedule starts failing or fails
    differently, and once more when it fires again; nothing at the ticks in between."""

    def __init__(self) -> None:
        self.errors: dict[str, str] = {}

    def failed(self, name: str, error: str) -> None:
        metrics.cron_schedule_errors.add(1, {metrics.CRON_SCHEDULE: name})
        if self.errors.get(name) == error:
            return
        self.errors[name] = error
        log.error(
            "periodic job %r cannot fire: %s (the other schedules fire; logged again only if "
            "this error changes)",
            name,
            error,
        )

    def succeeded(self, name: str) -> None:
        if self.errors.pop(name, None) is not None:
            log.info("periodic job %r fires again", name)

    def keep_only(self, names: set[str]) -> None:
        """Forget schedules no longer evaluated (deleted or paused)."""
        for name in set(self.errors) - names:
            del self.errors[name]


def periodic_duty(interval: float) -> Duty:
    """Enqueue the due fires of every schedule that is not paused. Each schedule is
    evaluated and fired on its own: one that fails (``FireFailures``) never keeps the
    others from firing."""
    failures = FireFailures()

    async def evaluate(conn: psycopg.AsyncConnection[Any]) -> None:
        async with conn.cursor(row_factory=dict_row) as cursor:
            await cursor.execute(query("periodic_due"))
            schedules = await cursor.fetchall()
        failures.keep_only({schedule["name"] for schedule in schedules})
        for schedule in schedules:
            try:
                await _fire_due(conn, schedule)
            except psycopg.OperationalError:
                raise  # the connection is gone: this term as leader ends
            except Exception as error:  # anything stored: this schedule only
                if conn.closed:
                    raise
                failures.failed(schedule["name"], _describe(error))
            else:
                failures.succeeded(schedule["name"])

    return Duty("periodic", interval, evaluate)


def _describe(error: Exception) -> str:
    """The failure on one line, the same at every tick while the cause stays."""
    if isinstance(error, psycopg.Error) and error.diag.message_primary:
        # Without its detail, which names the refused row (a new job id at every tick).
        return f"{type(error).__name__}: {error.diag.message_primary}"
    return one_line(failure_text(error))


async def _fire_due(conn: psycopg.AsyncConnection[Any], schedule: dict[str, Any]) -> None:
    times = _times(schedule["cron_expr"], schedule["timezone"])
    previous: dt.datetime | None = schedule["last_enqueued_at"]
    after = previous if previous is not None else schedule["created_at"]
    fires = due_fires(times, schedule["missed_fire_policy"], after, schedule["now"])
    if not fires:
        return
    # One transaction (a savepoint inside a caller's) per schedule: a failing fire rolls
    # back this schedule's fires only, and they are computed again at the next tick.
    async with conn.transaction():
        for fire in fires:
            params = {
                "name": schedule["name"],
                "fire": fire,
                "previous": previous,
                "fire_text": fire.astimezone(dt.UTC).isoformat(),
            }
            cursor = await conn.execute(query("periodic_fire"), params)
            if cursor.rowcount == 0:
                return  # fired (or paused, or removed) elsewhere meanwhile: read it next time
            previous = fire
    log.debug("cron %s: enqueued %d fire(s)", schedule["name"], len(fires))
