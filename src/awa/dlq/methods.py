"""The dead-letter queue operations as client methods: ``AsyncDlqMethods`` is mixed into
``AsyncClient`` (coroutines), ``DlqMethods`` into the blocking ``Client``. Each borrows a
pooled connection and runs the operation of ``awa.dlq.operations`` (also in ``awa.admin``) on it."""

from __future__ import annotations

import contextlib
import datetime as dt
from typing import Any

import psycopg

from awa.dlq import operations as dlq
from awa.dlq.operations import DlqEntry
from awa.model import JobRow


class AsyncDlqMethods:
    """Mixin of AsyncClient: the dead-letter queue (see ``awa.dlq.operations``)."""

    def connection(self) -> contextlib.AbstractAsyncContextManager[psycopg.AsyncConnection[Any]]:
        raise NotImplementedError  # provided by AsyncClient

    async def list_dlq(
        self,
        *,
        kind: str | None = None,
        queue: str | None = None,
        tag: str | None = None,
        before_id: int | None = None,
        before_dlq_at: dt.datetime | None = None,
        limit: int = 100,
    ) -> list[DlqEntry]:
        """Entries newest first; the last one's ``dlq_at`` and ``job.id`` are the cursor
        (``before_dlq_at``, ``before_id``) of the next page."""
        async with self.connection() as conn:
            return await dlq.list_dlq(
                conn,
                kind=kind,
                queue=queue,
                tag=tag,
                before_id=before_id,
                before_dlq_at=before_dlq_at,
                limit=limit,
            )

    async def get_dlq_job(self, job_id: int) -> DlqEntry | None:
        """The job's entry, or None when it is not in the DLQ."""
        async with self.connection() as conn:
            return await dlq.get_dlq_job(conn, job_id)

    async def dlq_depth(self, *, queue: str | None = None) -> int:
        """How many entries the DLQ holds (of one queue, when given)."""
        async with self.connection() as conn:
            return await dlq.dlq_depth(conn, queue=queue)

    async def dlq_depth_by_queue(self) -> list[tuple[str, int]]:
        """``(queue, entries)`` for every queue with entries, the deepest first."""
        async with self.connection() as conn:
            return await dlq.dlq_depth_by_queue(conn)

    async def retry_from_dlq(
        self,
        job_id: int,
        *,
        run_at: dt.datetime | None = None,
        priority: int | None = None,
        queue: str | None = None,
    ) -> JobRow | None:
        """Back into the queue under the same id with attempt 0 (None: not in the DLQ);
        UniqueConflict when another job holds its unique key."""
        async with self.connection() as conn:
            return await dlq.retry_from_dlq(
                conn, job_id, run_at=run_at, priority=priority, queue=queue
            )

    async def bulk_retry_from_dlq(
        self,
        *,
        kind: str | None = None,
        queue: str | None = None,
        tag: str | None = None,
        allow_all: bool = False,
    ) -> int:
        """Every matching entry back into its queue; returns how many."""
        async with self.connection() as conn:
            return await dlq.bulk_retry_from_dlq(
                conn, kind=kind, queue=queue, tag=tag, allow_all=allow_all
            )

    async def move_failed_to_dlq(self, job_id: int, reason: str) -> DlqEntry | None:
        """Move a failed job into the DLQ (None: it is not a failed job)."""
        async with self.connection() as conn:
            return await dlq.move_failed_to_dlq(conn, job_id, reason)

    async def bulk_move_failed_to_dlq(
        self,
        *,
        kind: str | None = None,
        queue: str | None = None,
        reason: str = "manual",
        allow_all: bool = False,
    ) -> int:
        """Move every failed job of a kind and/or queue into the DLQ; returns how many."""
        async with self.connection() as conn:
            return await dlq.bulk_move_failed_to_dlq(
                conn, kind=kind, queue=queue, reason=reason, allow_all=allow_all
            )

    async def purge_dlq_job(self, job_id: int) -> bool:
        """Delete the job's entry for good; False when it is not in the DLQ."""
        async with self.connection() as conn:
            return await dlq.purge_dlq_job(conn, job_id)

    async def purge_dlq(
        self,
        *,
        kind: str | None = None,
        queue: str | None = None,
        tag: str | None = None,
        before_id: int | None = None,
        before_dlq_at: dt.datetime | None = None,
        allow_all: bool = False,
    ) -> int:
        """Delete every matching entry for good; returns how many."""
        async with self.connection() as conn:
            return await dlq.purge_dlq(
                conn,
                kind=kind,
                queue=queue,
                tag=tag,
                before_id=before_id,
                before_dlq_at=before_dlq_at,
                allow_all=allow_all,
            )


class DlqMethods:
    """Mixin of the blocking Client: the dead-letter queue (see ``awa.dlq.operations``)."""

    def connection(self) -> contextlib.AbstractContextManager[psycopg.Connection[Any]]:
        raise NotImplementedError  # provided by Client

    def list_dlq(
        self,
        *,
        kind: str | None = None,
        queue: str | None = None,
        tag: str | None = None,
        before_id: int | None = None,
        before_dlq_at: dt.datetime | None = None,
        limit: int = 100,
    ) -> list[DlqEntry]:
        """Entries newest first; the last one's ``dlq_at`` and ``job.id`` are the cursor
        (``before_dlq_at``, ``before_id``) of the next page."""
        with self.connection() as conn:
            return dlq.list_dlq(
                conn,
                kind=kind,
                queue=queue,
                tag=tag,
                before_id=before_id,
                before_dlq_at=before_dlq_at,
                limit=limit,
            )

    def get_dlq_job(self, job_id: int) -> DlqEntry | None:
        """The job's entry, or None when it is not in the DLQ."""
        with self.connection() as conn:
            return dlq.get_dlq_job(conn, job_id)

    def dlq_depth(self, *, queue: str | None = None) -> int:
        """How many entries the DLQ holds (of one queue, when given)."""
        with self.connection() as conn:
            return dlq.dlq_depth(conn, queue=queue)

    def dlq_depth_by_queue(self) -> list[tuple[str, int]]:
        """``(queue, entries)`` for every queue with entries, the deepest first."""
        with self.connection() as conn:
            return dlq.dlq_depth_by_queue(conn)

    def retry_from_dlq(
        self,
        job_id: int,
        *,
        run_at: dt.datetime | None = None,
        priority: int | None = None,
        queue: str | None = None,
    ) -> JobRow | None:
        """Back into the queue under the same id with attempt 0 (None: not in the DLQ);
        UniqueConflict when another job holds its unique key."""
        with self.connection() as conn:
            return dlq.retry_from_dlq(conn, job_id, run_at=run_at, priority=priority, queue=queue)

    def bulk_retry_from_dlq(
        self,
        *,
        kind: str | None = None,
        queue: str | None = None,
        tag: str | None = None,
        allow_all: bool = False,
    ) -> int:
        """Every matching entry back into its queue; returns how many."""
        with self.connection() as conn:
            return dlq.bulk_retry_from_dlq(
                conn, kind=kind, queue=queue, tag=tag, allow_all=allow_all
            )

    def move_failed_to_dlq(self, job_id: int, reason: str) -> DlqEntry | None:
        """Move a failed job into the DLQ (None: it is not a failed job)."""
        with self.connection() as conn:
            return dlq.move_failed_to_dlq(conn, job_id, reason)

    def bulk_move_failed_to_dlq(
        self,
        *,
        kind: str | None = None,
        queue: str | None = None,
        reason: str = "manual",
        allow_all: bool = False,
    ) -> int:
        """Move every failed job of a kind and/or queue into the DLQ; returns how many."""
        with self.connection() as conn:
            return dlq.bulk_move_failed_to_dlq(
                conn, kind=kind, queue=queue, reason=reason, allow_all=allow_all
            )

    def purge_dlq_job(self, job_id: int) -> bool:
        """Delete the job's entry for good; False when it is not in the DLQ."""
        with self.connection() as conn:
            return dlq.purge_dlq_job(conn, job_id)

    def purge_dlq(
        self,
        *,
        kind: str | None = None,
        queue: str | None = None,
        tag: str | None = None,
        before_id: int | None = None,
        before_dlq_at: dt.datetime | None = None,
        allow_all: bool = False,
    ) -> int:
        """Delete every matching entry for good; returns how many."""
        with self.connection() as conn:
            return dlq.purge_dlq(
                conn,
                kind=kind,
                queue=queue,
                tag=tag,
                before_id=before_id,
                before_dlq_at=before_dlq_at,
                allow_all=allow_all,
            )
