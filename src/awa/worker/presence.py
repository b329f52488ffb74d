"""This runtime's row in ``awa.runtimes``: which queues and kinds it runs, kept fresh by its
heartbeat.

Health uses the live rows to find queues nobody runs and kinds that no worker of their queue
has a handler for; the operator UI lists them as workers.
The row is written at start, refreshed by every heartbeat (from the heartbeat thread, so a
busy event loop does not make the process look dead), deleted on a clean shutdown, and
expired by the maintenance leader when the process stops heartbeating.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Callable
from typing import Any

import orjson
import psycopg

from awa.sql import query
from awa.storage.db import Statement
from awa.version import __version__
from awa.worker.config import QueueConfig


class Presence:
    """The runtime row of one started runtime."""

    def __init__(
        self,
        queues: list[QueueConfig],
        kinds: list[str],
        *,
        application_name: str,
        stale_after: float,
        is_leader: Callable[[], bool],
    ) -> None:
        self.id = uuid.uuid4()
        self._is_leader = is_leader
        self._row: dict[str, Any] = {
            "id": self.id,
            "hostname": socket.gethostname(),
            "pid": os.getpid(),
            "application_name": application_name,
            "version": __version__,
            "queues": [queue.name for queue in queues],
            "kinds": kinds,
            "concurrency": orjson.dumps({q.name: q.max_workers for q in queues}).decode(),
            "stale_after": stale_after,
        }

    def upsert(self) -> Statement[None]:
        """Register, or refresh the heartbeat of, this runtime's row."""
        return Statement(
            query("runtime_upsert"), {**self._row, "is_leader": self._is_leader()}, _nothing
        )

    def beat(self, conn: psycopg.Connection[Any]) -> None:
        """Refresh the row on the heartbeat thread's blocking connection."""
        statement = self.upsert()
        conn.execute(statement.sql, statement.params)

    def delete(self) -> Statement[None]:
        return Statement(query("runtime_delete"), {"id": self.id}, _nothing)


def _nothing(rows: list[dict[str, Any]]) -> None:
    return None
