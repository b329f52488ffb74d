"""The leader's duty that carries out durable batch operations (``awa.batch.operations``).

Each run takes one step of the oldest unfinished operation (a cancelled one first): start
it, scan the next page of job ids into its snapshot, change the next chunk of its jobs, or
end a cancelled one. Every step is one statement, so a step is all or nothing,
and the operation's record says where the next leader picks it up after failover. While an
operation runs the duty comes back quickly; when none does, once a second.
"""

from __future__ import annotations

import datetime as dt
import logging
import uuid
from typing import Any

import psycopg
from psycopg.rows import dict_row

from awa.batch.operations import filter_params, spec_params
from awa.core.duty import Duty
from awa.core.outage import one_line
from awa.sql import query

log = logging.getLogger("awa.maintenance")

# Identifies this process in the records of the operations its leader stepped through.
RUNNER_ID = uuid.uuid4()
ACTIVE_INTERVAL = 0.05
IDLE_INTERVAL = 1.0
SCAN_PAGE = 10_000
"""Job rows one scan step reads (by id), matching or not."""
CHUNK = 1_000
"""Jobs one step changes."""
RETENTION = dt.timedelta(days=90).total_seconds()
"""How long a finished operation's record is kept."""
EXPIRE_BATCH = 100


async def _one(
    conn: psycopg.AsyncConnection[Any], name: str, params: dict[str, Any] | None = None
) -> dict[str, Any] | None:
    async with conn.cursor(row_factory=dict_row) as cursor:
        await cursor.execute(query(name), params)
        return await cursor.fetchone()


async def step(conn: psycopg.AsyncConnection[Any]) -> bool:
    """Take one step of the next unfinished operation; False when there was none."""
    op = await _one(conn, "batch_next")
    if op is None:
        # Housekeeping while idle: items a cancelled or failed operation never reached, and
        # records past their retention.
        dropped = await conn.execute(query("batch_drop_leftovers"), {"limit": SCAN_PAGE})
        await conn.execute(query("batch_expire"), {"limit": EXPIRE_BATCH})
        return dropped.rowcount >= SCAN_PAGE
    try:
        await _advance(conn, op)
    except psycopg.errors.TransactionRollback as error:
        log.info("batch operation %s: a step was rolled back (%s); retrying", op["id"], error)
    except psycopg.OperationalError:
        raise  # the connection: the leader's term ends, the next leader goes on
    except psycopg.Error as error:
        # Refused by the database for a reason a retry would not cure: stop here, visibly.
        params = {"id": op["id"], "error": one_line(error), "retention": RETENTION}
        await conn.execute(query("batch_fail"), params)
        log.error("batch operation %s failed: %s", op["id"], one_line(error))
    return True


async def _advance(conn: psycopg.AsyncConnection[Any], op: dict[str, Any]) -> None:
    op_id = op["id"]
    if op["state"] == "cancelling":
        done = await _one(conn, "batch_cancel_step", {"id": op_id, "retention": RETENTION})
        if done is not None:
            log.info("batch operation %s cancelled (%d jobs changed)", op_id, done["processed"])
        return
    if op["state"] == "pending":
        op = await _one(conn, "batch_start", {"id": op_id, "runner": RUNNER_ID}) or op
        log.info("batch operation %s (%s) started", op_id, op["op_kind"])
    if op["state"] == "scanning":
        cursor = op["cursor"] or {}
        params = {
            **filter_params(op["filter"]),
            "id": op_id,
            "after": int(cursor.get("after_job_id", 0)),
            "max_id": int(cursor.get("max_job_id", 0)),
            "page": SCAN_PAGE,
        }
        await conn.execute(query("batch_scan_page"), params)
        return
    if op["state"] == "running":
        params = {**spec_params(op["spec"]), "id": op_id, "limit": CHUNK}
        applied = await _one(conn, "batch_apply_chunk", params)
        if applied is not None and applied["taken"] == 0:
            done = await _one(conn, "batch_complete", {"id": op_id, "retention": RETENTION})
            if done is not None:
                log.info(
                    "batch operation %s completed: %d jobs changed, %d skipped",
                    op_id,
                    done["processed"],
                    done["skipped"],
                )


def batch_operation_duty() -> Duty:
    """Carry out durable batch operations, a bounded step per run."""

    async def run(conn: psycopg.AsyncConnection[Any]) -> None:
        busy = await step(conn)
        duty.interval = ACTIVE_INTERVAL if busy else IDLE_INTERVAL

    duty = Duty("batch operations", IDLE_INTERVAL, run)
    return duty
