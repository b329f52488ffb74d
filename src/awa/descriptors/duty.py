"""Descriptors on the worker side: storing a client's at start, and the leader's duty that
keeps the rows of running queues fresh and deletes those nothing has seen for
``descriptor_retention`` (see ``awa.descriptors.operations``)."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import psycopg
from psycopg.rows import dict_row

from awa.core.duty import Duty
from awa.core.kinds import dump_json
from awa.descriptors.operations import DescriptorCatalog
from awa.sql import query

log = logging.getLogger("awa.maintenance")


async def store_descriptors(
    conn: psycopg.AsyncConnection[Any],
    catalog: DescriptorCatalog,
    queues: Sequence[str],
    routes: Mapping[str, str],
) -> None:
    """Store a row for every queue this worker runs (``queues``, by name) and every kind it
    registers or describes: the declared descriptor, else a blank row (which keeps another
    deployment's descriptor). ValidationError, before anything is written, for a descriptor
    of a queue nothing here declares or runs."""
    queue_rows = catalog.queue_rows(queues, routes.values())
    kind_rows = catalog.kind_rows(routes)
    async with conn.transaction():
        if queue_rows:
            rows = dump_json(queue_rows, "queue descriptors")
            await conn.execute(query("descriptors_store_queues"), {"rows": rows})
        if kind_rows:
            rows = dump_json(kind_rows, "job kind descriptors")
            await conn.execute(query("descriptors_store_kinds"), {"rows": rows})


def descriptor_duty(retention: float, interval: float) -> Duty:
    """Every ``interval`` seconds, refresh the rows of the queues live workers run (and of
    the kinds registered on them), then delete the rows unseen for ``retention`` seconds
    (0: keep them for ever)."""

    async def sweep(conn: psycopg.AsyncConnection[Any]) -> None:
        async with conn.cursor(row_factory=dict_row) as cursor:
            await cursor.execute(query("descriptors_refresh"))
            if retention <= 0:
                return
            await cursor.execute(query("descriptors_prune"), {"retention": retention})
            row = await cursor.fetchone()
        if row is not None and (row["queues"] or row["kinds"]):
            log.info(
                "deleted the descriptors of %d queue(s) and %d job kind(s) unseen for %gs",
                row["queues"],
                row["kinds"],
                retention,
            )

    return Duty("descriptors", interval, sweep)
