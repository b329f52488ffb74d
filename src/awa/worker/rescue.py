"""Maintenance duties of the leader: rescue of dead or stuck attempts, and retention (of
finished jobs and of dead-letter queue entries).

Three sweeps find attempts that will not finish by themselves: a stale heartbeat (the worker
died), a passed deadline (the handler hangs) and an expired callback (nobody answered). Each
rescue records the reason in the job's errors and counts the attempt: the job retries with
backoff, or fails when it was the last attempt. After a rescue commits, the ``Rescued``
follow-ups run in a transaction of their own (best-effort: a failure is logged, the rescue
stands) and then the ``Rescued`` hooks; rescue itself never waits on user code.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any, LiteralString

import psycopg
from psycopg import sql
from psycopg.rows import dict_row

from awa.core.duty import Duty, delete_in_batches
from awa.lifecycle import events
from awa.lifecycle.events import RescueReason
from awa.lifecycle.followups import FollowUpRegistry, Trigger, TriggerContext, insert_follow_ups
from awa.lifecycle.hooks import HookDispatcher
from awa.model import JobRow
from awa.observability import metrics, tracing
from awa.sql import query
from awa.worker.storage_ring import rotate_done_ring

log = logging.getLogger("awa.maintenance")


@dataclasses.dataclass(frozen=True, slots=True)
class Sweep:
    reason: RescueReason
    condition: LiteralString  # the query holding the sweep's condition on its home AS j
    home: LiteralString  # the table its candidates live in: running or parked jobs
    error: str
    metric_kind: str
    # Whether the rescued attempts are announced on awa_cancel, so that a handler still
    # running one (in any process) sees is_cancelled(). Not for expired callbacks: the job
    # was parked, and a handler waiting in wait_for_callback learns it from its row.
    announce: bool


SWEEPS = {
    RescueReason.STALE_HEARTBEAT: Sweep(
        RescueReason.STALE_HEARTBEAT,
        "rescue_condition_stale_heartbeat",
        "active_jobs",
        "heartbeat stale: worker presumed dead",
        "heartbeat",
        announce=True,
    ),
    RescueReason.DEADLINE_EXCEEDED: Sweep(
        RescueReason.DEADLINE_EXCEEDED,
        "rescue_condition_deadline_exceeded",
        "active_jobs",
        "hard deadline exceeded",
        "deadline",
        announce=True,
    ),
    RescueReason.EXPIRED_CALLBACK: Sweep(
        RescueReason.EXPIRED_CALLBACK,
        "rescue_condition_expired_callback",
        "held_jobs",
        "callback timed out",
        "callback_timeout",
        announce=False,
    ),
}


@dataclasses.dataclass(frozen=True, slots=True)
class Rescue:
    """One rescued job: its row after the rescue; ``duplicate`` when it was cancelled
    because a newer job holds its unique key."""

    row: JobRow
    reason: RescueReason
    duplicate: bool = False


def _composed(
    name: LiteralString, sweep: Sweep, condition: sql.Composable | None = None
) -> sql.Composed:
    return sql.SQL(query(name)).format(
        condition=condition if condition is not None else sql.SQL(query(sweep.condition)),
        home=sql.Identifier(sweep.home),
    )


async def rescue(
    conn: psycopg.AsyncConnection[Any], sweep: Sweep, *, staleness: float, limit: int
) -> list[Rescue]:
    """Rescue up to ``limit`` jobs in one statement. If one of them collides with a newer
    job's unique key the batch falls back to one row at a time, cancelling the colliding
    ones, so a single such job cannot block every rescue."""
    params = {
        "staleness": staleness,
        "limit": limit,
        "error": sweep.error,
        "reason": sweep.reason.value,
        "announce": sweep.announce,
    }
    try:
        async with conn.cursor(row_factory=dict_row) as cursor:
            await cursor.execute(_composed("rescue_jobs", sweep), params)
            rows = await cursor.fetchall()
        return [Rescue(JobRow.from_record(row), sweep.reason) for row in rows]
    except psycopg.errors.UniqueViolation:
        return await _rescue_one_by_one(conn, sweep, params)


async def _rescue_one_by_one(
    conn: psycopg.AsyncConnection[Any], sweep: Sweep, params: dict[str, Any]
) -> list[Rescue]:
    async with conn.cursor(row_factory=dict_row) as cursor:
        await cursor.execute(_composed("rescue_candidate_ids", sweep), params)
        ids = [row["id"] for row in await cursor.fetchall()]
    # The same rescue, for one candidate (still checked against the sweep's condition).
    one_candidate = sql.SQL("{} AND j.id = {}").format(
        sql.SQL(query(sweep.condition)), sql.Placeholder("id")
    )
    single = _composed("rescue_jobs", sweep, one_candidate)
    cancel = _composed("cancel_rescued_duplicate", sweep)
    rescued: list[Rescue] = []
    for job_id in ids:
        try:
            async with conn.cursor(row_factory=dict_row) as cursor:
                await cursor.execute(single, {**params, "id": job_id, "limit": 1})
                rows = await cursor.fetchall()
            rescued.extend(Rescue(JobRow.from_record(row), sweep.reason) for row in rows)
        except psycopg.errors.UniqueViolation:
            async with conn.cursor(row_factory=dict_row) as cursor:
                await cursor.execute(cancel, {**params, "id": job_id})
                rows = await cursor.fetchall()
            log.warning("job %s: rescued as a duplicate of a newer unique job; cancelled", job_id)
            rescued.extend(
                Rescue(JobRow.from_record(row), sweep.reason, duplicate=True) for row in rows
            )
    return rescued


def rescue_duty(
    sweep: Sweep,
    *,
    interval: float,
    staleness: float,
    limit: int,
    on_rescued: Callable[[list[Rescue]], Awaitable[None]],
) -> Duty:
    async def run(conn: psycopg.AsyncConnection[Any]) -> None:
        rescued = await rescue(conn, sweep, staleness=staleness, limit=limit)
        if not rescued:
            return
        for item in rescued:
            kind = sweep.metric_kind + ("_duplicate_cancelled" if item.duplicate else "")
            metrics.rescues.add(1, {"awa.rescue.kind": kind, metrics.KIND: item.row.kind})
        log.warning(
            "rescued %d job(s): %s (ids %s)",
            len(rescued),
            sweep.error,
            ", ".join(str(item.row.id) for item in rescued[:20]),
        )
        await on_rescued(rescued)

    return Duty(f"rescue_{sweep.reason.value}", interval, run)


def retention_duty(
    *, interval: float, completed: float, failed: float, batch_size: int, max_batches: int = 50
) -> Duty:
    """Retention: completed jobs leave with their slot of the done ring (truncated whole
    once past ``completed``); failed and cancelled ones, and the completed ones of queues
    with a shorter retention of their own, are deleted in batches until none are left (at
    most ``max_batches`` per tick, so other duties keep their rhythm)."""

    async def run(conn: psycopg.AsyncConnection[Any]) -> None:
        await rotate_done_ring(conn, completed)
        params = {"completed": completed, "failed": failed, "limit": batch_size}
        statement = query("delete_finished")
        total = await delete_in_batches(
            conn, statement, params, batch_size=batch_size, max_batches=max_batches
        )
        if total:
            log.info("retention deleted %d finished jobs", total)
        # Dependency edges of deleted children (no foreign key: see migration 11).
        await conn.execute(query("prune_dependency_edges"), {"limit": batch_size})

    return Duty("retention", interval, run)


RESCUE_FOLLOW_UP_TIMEOUT = 30.0
"""Seconds the Rescued follow-ups of one job may take (they are best-effort)."""

Connect = Callable[[], AbstractAsyncContextManager[psycopg.AsyncConnection[Any]]]


async def after_rescue(
    rescued: list[Rescue], follow_ups: FollowUpRegistry, hooks: HookDispatcher, connect: Connect
) -> None:
    """The Rescued follow-ups (each job in its own transaction, best-effort and bounded in
    time) and hooks of committed rescues. A rescue that cancelled a duplicate fires
    Cancelled instead."""
    for item in rescued:
        row = item.row
        if item.duplicate:
            reason = str(row.errors[-1]["error"]) if row.errors else "rescued as duplicate"
            hooks.dispatch(events.Cancelled(row, row.args, reason))
            continue
        specs = follow_ups.specs(Trigger.RESCUED, row.kind)
        if specs:
            context = TriggerContext(Trigger.RESCUED, reason=item.reason)
            try:
                parent = row.metadata.get(tracing.TRACEPARENT) if row.metadata else None
                async with asyncio.timeout(RESCUE_FOLLOW_UP_TIMEOUT):
                    async with connect() as conn, conn.transaction():
                        with tracing.continuing(parent):  # in the rescued job's trace
                            rules = follow_ups.insert_rules
                            await insert_follow_ups(conn, specs, row, context, rules)
            except Exception as error:
                metrics.follow_up_failures.add(1, {metrics.KIND: row.kind})
                if isinstance(error, TimeoutError):
                    error = TimeoutError(f"not done within {RESCUE_FOLLOW_UP_TIMEOUT:g}s")
                log.error(
                    "job %s (kind %s) was rescued, but its Rescued follow-ups failed "
                    "(the rescue stands): %s",
                    row.id,
                    row.kind,
                    error,
                )
        hooks.dispatch(events.Rescued(row, row.args, item.reason))
