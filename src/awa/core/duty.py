"""A leader duty's shape: capabilities build their duties with it, and the worker's
maintenance leader runs them (the seam that keeps capabilities below the worker)."""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from typing import Any, LiteralString

import psycopg
from psycopg.rows import dict_row

from awa.core.outage import FailureLog


@dataclasses.dataclass(slots=True)
class Duty:
    """A periodic task of the leader, run on the leader's connection."""

    name: str
    interval: float
    run: Callable[[psycopg.AsyncConnection[Any]], Awaitable[None]]
    next_at: float = 0.0
    failures: FailureLog | None = None


async def delete_in_batches(
    conn: psycopg.AsyncConnection[Any],
    statement: LiteralString,
    params: dict[str, Any],
    *,
    batch_size: int,
    max_batches: int,
) -> int:
    """Run a deleting ``statement`` (its one row: ``deleted``, how many it deleted, at most
    ``batch_size``) until a batch comes back short or ``max_batches`` ran; how many in all."""
    total = 0
    for _ in range(max_batches):
        async with conn.cursor(row_factory=dict_row) as cursor:
            await cursor.execute(statement, params)
            row = await cursor.fetchone()
        deleted = int(row["deleted"]) if row else 0
        total += deleted
        if deleted < batch_size:
            break
    return total
