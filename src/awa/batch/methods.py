"""Durable batch operations on the clients: ``AsyncBatchMethods`` is mixed into
``AsyncClient``, ``BatchMethods`` into the blocking ``Client`` (see
``awa.batch.operations`` for what the operations do and the errors they raise)."""

from __future__ import annotations

import contextlib
import datetime as dt
import uuid
from collections.abc import Mapping
from typing import Any

import psycopg

from awa.batch import operations as ops
from awa.batch.operations import (
    BatchOperation,
    BatchOperationFilter,
    BatchOperationKind,
    BatchOperationPreview,
    BatchOperationState,
)

Filter = BatchOperationFilter | Mapping[str, Any] | None
OperationId = str | uuid.UUID


def _move_spec(queue: str, priority: int | None) -> dict[str, Any]:
    spec: dict[str, Any] = {"queue": queue}
    if priority is not None:
        spec["priority"] = priority
    return spec


class AsyncBatchMethods:
    """Mixin of AsyncClient: durable batch operations."""

    def connection(self) -> contextlib.AbstractAsyncContextManager[psycopg.AsyncConnection[Any]]:
        raise NotImplementedError  # provided by AsyncClient

    async def preview_batch_operation(
        self, op_kind: BatchOperationKind, *, spec: Mapping[str, Any], filter: Filter = None
    ) -> BatchOperationPreview:
        """How many queued jobs the operation would touch now, and a sample; no change."""
        async with self.connection() as conn:
            return await ops.preview_batch_operation(conn, op_kind, spec=spec, filter=filter)

    async def submit_batch_operation(
        self,
        op_kind: BatchOperationKind,
        *,
        spec: Mapping[str, Any],
        filter: Filter = None,
        submitted_by: str | None = None,
        allow_all: bool = False,
    ) -> BatchOperation:
        """Record an operation for the maintenance leader to carry out (state pending)."""
        async with self.connection() as conn:
            return await ops.submit_batch_operation(
                conn,
                op_kind,
                spec=spec,
                filter=filter,
                submitted_by=submitted_by,
                allow_all=allow_all,
            )

    async def preview_set_priority(
        self, priority: int, *, filter: Filter = None
    ) -> BatchOperationPreview:
        """Preview giving the queued jobs the filter matches ``priority``."""
        return await self.preview_batch_operation(
            "set_priority", spec={"priority": priority}, filter=filter
        )

    async def set_priority(
        self,
        priority: int,
        *,
        filter: Filter = None,
        submitted_by: str | None = None,
        allow_all: bool = False,
    ) -> BatchOperation:
        """Submit an operation giving the queued jobs the filter matches ``priority``."""
        return await self.submit_batch_operation(
            "set_priority",
            spec={"priority": priority},
            filter=filter,
            submitted_by=submitted_by,
            allow_all=allow_all,
        )

    async def preview_move_queue(
        self, queue: str, *, priority: int | None = None, filter: Filter = None
    ) -> BatchOperationPreview:
        """Preview moving the queued jobs the filter matches to ``queue``."""
        return await self.preview_batch_operation(
            "move_queue", spec=_move_spec(queue, priority), filter=filter
        )

    async def move_queue(
        self,
        queue: str,
        *,
        priority: int | None = None,
        filter: Filter = None,
        submitted_by: str | None = None,
        allow_all: bool = False,
    ) -> BatchOperation:
        """Submit an operation moving the queued jobs the filter matches to ``queue`` (and
        giving them ``priority``, if set)."""
        return await self.submit_batch_operation(
            "move_queue",
            spec=_move_spec(queue, priority),
            filter=filter,
            submitted_by=submitted_by,
            allow_all=allow_all,
        )

    async def list_batch_operations(
        self, *, state: BatchOperationState | None = None, limit: int = 100
    ) -> list[BatchOperation]:
        """Operations, newest first."""
        async with self.connection() as conn:
            return await ops.list_batch_operations(conn, state=state, limit=limit)

    async def get_batch_operation(self, operation_id: OperationId) -> BatchOperation:
        """One operation's record (ValidationError when unknown)."""
        async with self.connection() as conn:
            return await ops.get_batch_operation(conn, operation_id)

    async def cancel_batch_operation(self, operation_id: OperationId) -> BatchOperation:
        """Stop an unfinished operation at its next step (state cancelling, then
        cancelled)."""
        async with self.connection() as conn:
            return await ops.cancel_batch_operation(conn, operation_id)

    async def purge_batch_operations(self, before: dt.datetime, *, limit: int = 1000) -> int:
        """Delete finished operations finalized before ``before``; returns how many."""
        async with self.connection() as conn:
            return await ops.purge_batch_operations(conn, before, limit=limit)


class BatchMethods:
    """Mixin of the blocking Client: durable batch operations."""

    def connection(self) -> contextlib.AbstractContextManager[psycopg.Connection[Any]]:
        raise NotImplementedError  # provided by Client

    def preview_batch_operation(
        self, op_kind: BatchOperationKind, *, spec: Mapping[str, Any], filter: Filter = None
    ) -> BatchOperationPreview:
        """How many queued jobs the operation would touch now, and a sample; no change."""
        with self.connection() as conn:
            return ops.preview_batch_operation(conn, op_kind, spec=spec, filter=filter)

    def submit_batch_operation(
        self,
        op_kind: BatchOperationKind,
        *,
        spec: Mapping[str, Any],
        filter: Filter = None,
        submitted_by: str | None = None,
        allow_all: bool = False,
    ) -> BatchOperation:
        """Record an operation for the maintenance leader to carry out (state pending)."""
        with self.connection() as conn:
            return ops.submit_batch_operation(
                conn,
                op_kind,
                spec=spec,
                filter=filter,
                submitted_by=submitted_by,
                allow_all=allow_all,
            )

    def preview_set_priority(
        self, priority: int, *, filter: Filter = None
    ) -> BatchOperationPreview:
        """Preview giving the queued jobs the filter matches ``priority``."""
        return self.preview_batch_operation(
            "set_priority", spec={"priority": priority}, filter=filter
        )

    def set_priority(
        self,
        priority: int,
        *,
        filter: Filter = None,
        submitted_by: str | None = None,
        allow_all: bool = False,
    ) -> BatchOperation:
        """Submit an operation giving the queued jobs the filter matches ``priority``."""
        return self.submit_batch_operation(
            "set_priority",
            spec={"priority": priority},
            filter=filter,
            submitted_by=submitted_by,
            allow_all=allow_all,
        )

    def preview_move_queue(
        self, queue: str, *, priority: int | None = None, filter: Filter = None
    ) -> BatchOperationPreview:
        """Preview moving the queued jobs the filter matches to ``queue``."""
        return self.preview_batch_operation(
            "move_queue", spec=_move_spec(queue, priority), filter=filter
        )

    def move_queue(
        self,
        queue: str,
        *,
        priority: int | None = None,
        filter: Filter = None,
        submitted_by: str | None = None,
        allow_all: bool = False,
    ) -> BatchOperation:
        """Submit an operation moving the queued jobs the filter matches to ``queue``."""
        return self.submit_batch_operation(
            "move_queue",
            spec=_move_spec(queue, priority),
            filter=filter,
            submitted_by=submitted_by,
            allow_all=allow_all,
        )

    def list_batch_operations(
        self, *, state: BatchOperationState | None = None, limit: int = 100
    ) -> list[BatchOperation]:
        """Operations, newest first."""
        with self.connection() as conn:
            return ops.list_batch_operations(conn, state=state, limit=limit)

    def get_batch_operation(self, operation_id: OperationId) -> BatchOperation:
        """One operation's record (ValidationError when unknown)."""
        with self.connection() as conn:
            return ops.get_batch_operation(conn, operation_id)

    def cancel_batch_operation(self, operation_id: OperationId) -> BatchOperation:
        """Stop an unfinished operation at its next step."""
        with self.connection() as conn:
            return ops.cancel_batch_operation(conn, operation_id)

    def purge_batch_operations(self, before: dt.datetime, *, limit: int = 1000) -> int:
        """Delete finished operations finalized before ``before``; returns how many."""
        with self.connection() as conn:
            return ops.purge_batch_operations(conn, before, limit=limit)
