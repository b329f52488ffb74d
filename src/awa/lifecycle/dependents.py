"""The Cancelled hooks of dependents that a failed or cancelled job took down with it.

The database cancels them in the transaction of the parent's outcome (migration 11's
triggers); the worker (or the client resolving a callback) that committed that outcome reads
them back afterwards (their finalized_at is that transaction's now()) and fires their hooks,
as for its own outcomes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

import psycopg

from awa.errors import AwaError
from awa.lifecycle.events import Cancelled
from awa.lifecycle.hooks import HookDispatcher
from awa.model import JobRow, JobState
from awa.sql import query
from awa.storage.db import Statement, run_async

log = logging.getLogger("awa.hooks")


def may_have_cancelled_dependents(row: JobRow) -> bool:
    return row.has_dependents and row.state in (JobState.FAILED, JobState.CANCELLED)


async def fire_cancelled_dependents(
    connection: Callable[[], AbstractAsyncContextManager[psycopg.AsyncConnection[Any]]],
    hooks: HookDispatcher,
    parent: JobRow,
) -> None:
    """Fire Cancelled for the dependents the parent's outcome cancelled with it."""
    params = {"id": parent.id, "finalized_at": parent.finalized_at}
    statement = Statement(query("dependents_cancelled_with"), params, JobRow.from_records)
    try:
        async with connection() as conn:
            rows = await run_async(conn, statement)
    except AwaError as error:
        log.warning("job %s: its cancelled dependents' hooks are lost: %s", parent.id, error)
        return
    for row in rows:
        reason = row.errors[-1].get("error", "") if row.errors else ""
        hooks.dispatch(Cancelled(row, row.args, str(reason)))
