"""The maintenance leader: one runtime per database runs the periodic duties.

Leadership is a session-level advisory lock on a dedicated connection. When the leader's
process dies its connection closes, Postgres frees the lock, and another runtime takes over
at its next election attempt (``leader_election_interval``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import dict_row

from awa.core.duty import Duty
from awa.core.outage import FailureLog, one_line
from awa.core.tasks import cancel_and_wait
from awa.sql import query
from awa.storage.db import connection_kwargs

log = logging.getLogger("awa.maintenance")


class Maintenance:
    def __init__(
        self,
        url: str,
        *,
        application_name: str,
        election_interval: float,
        check_interval: float,
        duties: list[Duty],
    ) -> None:
        self._url, self._application_name = url, application_name  # its own connection
        self._election_interval = election_interval
        self._check_interval = check_interval
        self._duties = duties
        self._task: asyncio.Task[None] | None = None
        self._failures = FailureLog(log, "maintenance connection")
        self.is_leader = False

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="awa-maintenance")

    async def stop(self) -> None:
        await cancel_and_wait(self._task)

    async def _run(self) -> None:
        """Connect, then try for the lock every election interval on that connection (it
        stays open between attempts); lead while it is held. Any failure (a lost
        connection, anything unexpected) ends the term and starts over."""
        interval = self._election_interval
        while True:
            try:
                conn = await psycopg.AsyncConnection.connect(
                    self._url, connect_timeout=10, **connection_kwargs(self._application_name)
                )
            except psycopg.Error as error:
                self._failures.failed(error, then=f"retrying every {interval:g}s")
                await asyncio.sleep(interval)
                continue
            self._failures.succeeded()
            try:
                async with conn:
                    while True:
                        if await self._try_lock(conn):
                            await self._lead(conn)
                        await asyncio.sleep(interval)
            except psycopg.Error as error:
                if self.is_leader:
                    log.warning(
                        "maintenance leader lost its connection (%s); leadership passes on",
                        one_line(error),
                    )
                else:
                    self._failures.failed(error, then=f"reconnecting in {interval:g}s")
            except Exception:
                log.exception("maintenance failed unexpectedly; it starts over")
            finally:
                self.is_leader = False
            await asyncio.sleep(interval)

    async def _try_lock(self, conn: psycopg.AsyncConnection[Any]) -> bool:
        async with conn.cursor(row_factory=dict_row) as cursor:
            await cursor.execute(query("leader_try_lock"))
            row = await cursor.fetchone()
        return bool(row and row["acquired"])

    async def _lead(self, conn: psycopg.AsyncConnection[Any]) -> None:
        self.is_leader = True
        log.info("this runtime is now the maintenance leader")
        now = time.monotonic()
        for duty in self._duties:
            duty.next_at = now
        last_check = now
        try:
            while True:
                now = time.monotonic()
                for duty in self._duties:
                    if duty.next_at <= now:
                        await self._run_duty(duty, conn)
                        duty.next_at = time.monotonic() + duty.interval
                if now - last_check >= self._check_interval:
                    await conn.execute(query("leader_check"))
                    last_check = now
                wake = min((duty.next_at for duty in self._duties), default=now + 1.0)
                await asyncio.sleep(max(0.0, wake - time.monotonic()))
        except asyncio.CancelledError:
            # Hand the role over promptly instead of waiting for the connection to close.
            with contextlib.suppress(psycopg.Error):
                await asyncio.shield(conn.execute(query("leader_unlock")))
            raise

    async def _run_duty(self, duty: Duty, conn: psycopg.AsyncConnection[Any]) -> None:
        """Run one duty; a failing duty is logged (once per episode) and tried again at its
        next tick, while a lost connection ends this term as leader."""
        if duty.failures is None:
            duty.failures = FailureLog(log, f"maintenance duty {duty.name}")
        try:
            await duty.run(conn)
        except psycopg.OperationalError:
            raise
        except Exception as error:
            if conn.closed:
                raise
            duty.failures.failed(error, then="it runs again next tick", traceback=True)
        else:
            duty.failures.succeeded()


def promotion_duty(interval: float, batch_size: int) -> Duty:
    """Make due scheduled and retryable jobs available (and wake their queues)."""

    async def promote(conn: psycopg.AsyncConnection[Any]) -> None:
        while True:
            try:
                async with conn.cursor(row_factory=dict_row) as cursor:
                    await cursor.execute(query("promote_due"), {"limit": batch_size})
                    row = await cursor.fetchone()
            except psycopg.errors.UniqueViolation:
                await _promote_one_by_one(conn, batch_size)
                return
            if row is None or row["promoted"] < batch_size:
                return

    return Duty("promote", interval, promote)


async def _promote_one_by_one(conn: psycopg.AsyncConnection[Any], batch_size: int) -> None:
    # A due job may collide with a newer job holding its unique key (only possible with a
    # mask that covers available but not its pending state). Promote row by row and cancel
    # the colliding ones, so one such job cannot block every other promotion.
    async with conn.cursor(row_factory=dict_row) as cursor:
        await cursor.execute(query("promote_due_ids"), {"limit": batch_size})
        ids = [row["id"] for row in await cursor.fetchall()]
    for job_id in ids:
        try:
            await conn.execute(query("promote_one"), {"id": job_id})
        except psycopg.errors.UniqueViolation:
            log.warning("job %s collides with a unique key at promotion; cancelling it", job_id)
            await conn.execute(query("cancel_colliding_pending"), {"id": job_id})


def vacuum_duty(interval: float, threshold: int) -> Duty:
    """VACUUM a job table (a slot of the active ring, or held_jobs) once it holds more than
    ``threshold`` dead rows: a busy queue makes dead rows faster than autovacuum (which
    visits a database once a minute by default) reclaims them. Rotation truncates the
    active ring's slots anyway; vacuum keeps them small between truncations while no
    snapshot stops it."""

    skipped: list[str] = []

    def on_notice(notice: psycopg.errors.Diagnostic) -> None:
        # A role that neither owns the tables nor may maintain them gets a warning.
        if notice.message_primary and "skipping" in notice.message_primary:
            skipped.append(notice.message_primary)

    async def vacuum(conn: psycopg.AsyncConnection[Any]) -> None:
        if skipped:
            return  # not this role's to vacuum: autovacuum does it
        async with conn.cursor(row_factory=dict_row) as cursor:
            await cursor.execute(query("jobs_dead_tuples"))
            rows = await cursor.fetchall()
        for row in rows:
            if row["dead"] is None or row["dead"] <= threshold:
                continue
            statement = sql.SQL(query("vacuum_jobs")).format(
                relation=sql.Identifier(row["relation"])
            )
            conn.add_notice_handler(on_notice)
            try:
                await conn.execute(statement)
            finally:
                conn.remove_notice_handler(on_notice)
            if skipped:
                log.info(
                    "not vacuuming awa.%s (%s); autovacuum reclaims its dead rows",
                    row["relation"],
                    skipped[0],
                )
                return
            log.debug("vacuumed awa.%s (%s dead rows)", row["relation"], row["dead"])

    return Duty("vacuum", interval, vacuum)


def runtime_expiry_duty(interval: float) -> Duty:
    """Delete the ``awa.runtimes`` rows of processes that stopped heartbeating (a crashed
    worker cannot remove its own)."""

    async def expire(conn: psycopg.AsyncConnection[Any]) -> None:
        cursor = await conn.execute(query("runtimes_expire"))
        if cursor.rowcount:
            log.info("removed %d stale worker runtime(s) from awa.runtimes", cursor.rowcount)

    return Duty("runtime expiry", interval, expire)
