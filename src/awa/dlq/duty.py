"""The dead-letter queue's leader duty: entries leave after the retention."""

from __future__ import annotations

import logging
from typing import Any

import psycopg

from awa.core.duty import Duty, delete_in_batches
from awa.sql import query

log = logging.getLogger("awa.maintenance")


def dlq_retention_duty(
    *, interval: float, retention: float, batch_size: int, max_batches: int = 50
) -> Duty:
    """Delete dead-letter queue entries moved more than ``retention`` seconds ago, oldest
    first, in batches of ``batch_size`` (at most ``max_batches`` per tick)."""

    async def run(conn: psycopg.AsyncConnection[Any]) -> None:
        params = {"retention": retention, "limit": batch_size}
        statement = query("dlq_delete_expired")
        total = await delete_in_batches(
            conn, statement, params, batch_size=batch_size, max_batches=max_batches
        )
        if total:
            log.info("retention deleted %d dead-letter queue entries", total)

    return Duty("dlq retention", interval, run)
