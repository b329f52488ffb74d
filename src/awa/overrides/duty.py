"""The overrides' leader duty: the change log keeps ``override_log_retention`` seconds."""

from __future__ import annotations

import logging
from typing import Any

import psycopg

from awa.core.duty import Duty, delete_in_batches
from awa.sql import query

log = logging.getLogger("awa.maintenance")


def override_log_duty(*, interval: float, retention: float, batch_size: int) -> Duty | None:
    """Delete override log entries older than ``retention`` seconds, oldest first, in
    batches of ``batch_size``; None when the log is kept for ever (``retention`` 0)."""
    if retention == 0:
        return None

    async def run(conn: psycopg.AsyncConnection[Any]) -> None:
        params = {"retention": retention, "limit": batch_size}
        statement = query("override_log_delete_expired")
        total = await delete_in_batches(
            conn, statement, params, batch_size=batch_size, max_batches=50
        )
        if total:
            log.info("retention deleted %d queue override log entries", total)

    return Duty("override log retention", interval, run)
