"""The leader's rotation of the active ring: the storage side of a flat claim under a pinned
MVCC horizon (migration 12, docs/architecture.md).

Every claim and completion leaves dead row versions in the active ring's current slot. A
slot that has taken enough writes is sealed and another one, emptied of its few live jobs
and truncated, becomes current: truncation frees dead versions even while a long
transaction holds an old snapshot, which vacuum cannot. The done ring rotates with
retention (worker/rescue.py's retention duty).
"""

from __future__ import annotations

import logging
from typing import Any

import psycopg
from psycopg.rows import dict_row

from awa.core.duty import Duty
from awa.sql import query

log = logging.getLogger("awa.maintenance")

MIN_SLOT_AGE = 2.0
"""Seconds a slot stays current at least."""

MAX_SLOT_AGE = 60.0
"""Seconds after which a slot that took any write is sealed anyway."""

MIN_SLOT_WRITES = 2_000
"""Writes (inserts, updates, deletes) that make a slot old enough to seal after
MIN_SLOT_AGE: about 700 jobs inserted, claimed and completed."""

MAX_MOVE = 10_000
"""A slot holding more live jobs than this (a backlog) is not freed until they drain."""

LOCK_TIMEOUT = "100ms"
"""How long a rotation waits for a slot's lock (claims queue behind its request meanwhile)."""


def active_ring_duty(interval: float) -> Duty:
    """Rotate the active ring when its current slot has taken enough writes."""
    # The current slot's write counter when it became current (per slot: it only grows).
    baseline: dict[int, int] = {}

    async def run(conn: psycopg.AsyncConnection[Any]) -> None:
        async with conn.cursor(row_factory=dict_row) as cursor:
            await cursor.execute(query("active_slot_writes"))
            row = await cursor.fetchone()
        if row is None:
            return
        slot, writes = int(row["slot"]), int(row["writes"])
        written = writes - baseline.setdefault(slot, writes)
        if written <= 0:
            return
        min_age = MIN_SLOT_AGE if written >= MIN_SLOT_WRITES else MAX_SLOT_AGE
        # One statement on the leader's autocommit connection: the slot's lock ends with
        # it, whatever this process does next.
        params = {"min_age": min_age, "max_move": MAX_MOVE, "lock_timeout": LOCK_TIMEOUT}
        async with conn.cursor(row_factory=dict_row) as cursor:
            await cursor.execute(query("rotate_active_ring"), params)
            done = await cursor.fetchone()
        if done is not None and done["done"] is not None:
            log.debug("%s", done["done"])
            baseline.pop(slot, None)

    return Duty("rotate_active_ring", interval, run)


async def rotate_done_ring(conn: psycopg.AsyncConnection[Any], retention: float) -> None:
    """Seal the done ring's current slot once it has been current for a sixth of the
    retention, truncating the next slot (whose jobs are all past it)."""
    params = {"width": retention / 6, "retention": retention, "lock_timeout": LOCK_TIMEOUT}
    async with conn.cursor(row_factory=dict_row) as cursor:
        await cursor.execute(query("rotate_done_ring"), params)
        done = await cursor.fetchone()
    if done is not None and done["done"] is not None:
        log.info("%s", done["done"])
